#!/usr/bin/env python3
"""Send one NBD write the way a client that ignores the read-only flag
would (libnbd, nbdcopy and qemu refuse before sending), and print the
server's error number: 0 if the write was taken, else e.g. 1 (EPERM).

Usage: raw-write.py SOCKET OFFSET LENGTH
"""
import socket
import struct
import sys

path, offset, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_UNIX)
s.connect(path)


def recv(n):
    buf = b""
    while len(buf) < n:
        part = s.recv(n - len(buf))
        if not part:
            sys.exit("the server closed the connection")
        buf += part
    return buf


# Fixed newstyle handshake, no zero padding, then NBD_OPT_EXPORT_NAME "".
magic, opt_magic, _flags = struct.unpack(">8s8sH", recv(18))
assert (magic, opt_magic) == (b"NBDMAGIC", b"IHAVEOPT"), (magic, opt_magic)
s.sendall(struct.pack(">I", 1 | 2))
s.sendall(b"IHAVEOPT" + struct.pack(">II", 1, 0))
_size, eflags = struct.unpack(">QH", recv(10))
read_only = bool(eflags & 2)
# NBD_CMD_WRITE (1), handle 7.
s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 1, 7, offset, length) + b"\x55" * length)
reply_magic, error, handle = struct.unpack(">IIQ", recv(16))
assert reply_magic == 0x67446698 and handle == 7, (hex(reply_magic), handle)
print(f"read_only={int(read_only)} error={error}")
