"""Flip one byte of a table block in a sparse or disktable metadata file,
for the damage tests: `table_blocks.py META BLOCK OFFSET`.

The tables start at the root (block 0): the last 4 KiB block sealed as
block 0 (the journal, before the tables, may hold copies of it). A table
block's first 4 bytes are the crc32c of its number (8 bytes, little
endian) and its payload (bytes 8..4096); the block flipped must be written
and sealed as BLOCK, so a layout change fails the test instead of flipping
the wrong bytes."""
import struct
import sys

TABLE = []
for n in range(256):
    c = n
    for _ in range(8):
        c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    TABLE.append(c)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def sealed(data, off, n):
    b = data[off:off + 4096]
    return b[4:8] == bytes(4) and any(b[8:]) and \
        struct.unpack("<I", b[:4])[0] == crc32c(struct.pack("<Q", n) + b[8:])


def main(meta, block, offset):
    with open(meta, "r+b") as f:
        data = f.read()
        roots = [off for off in range(8192, len(data), 4096) if sealed(data, off, 0)]
        assert roots, "no root block found"
        at = roots[-1] + block * 4096
        assert sealed(data, at, block), f"table block {block} is not where expected"
        f.seek(at + offset)
        f.write(bytes([data[at + offset] ^ 0x5A]))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
