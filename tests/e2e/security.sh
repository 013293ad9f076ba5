#!/usr/bin/env bash
# Who can reach a device. Made under umask 000, its directory is 0700 and
# every file in it 0600 (data, meta, the store's own files, the pid file),
# its sockets 0600 while served, and a --record trace 0600. Another local
# user can neither read the data nor connect to either socket, even with
# the directory opened up (each mode holds by itself; a positive control
# shows the user could, were the modes wider). TLS with a key from
# `dedup tls-psk` carries data both ways and refuses plain clients and
# wrong keys; a non-loopback --bind is refused without TLS (the message
# names --tls), served with --tls require or --insecure; --read-only
# refuses writes (in the clients and, for one that writes anyway, in the
# server: EPERM) and leaves the data as it was.
source "$(dirname "$0")/lib.sh"

OTHER=dedup-e2e-other
SIZE=64M
# A client that sends a write whatever the export advertises.
RAW_WRITE=$ROOT/tests/e2e/raw-write.py

# perms PATH: the permission bits in octal, as stat prints them (600).
perms() { stat -c %a "$1"; }
expect_perms() {
    [ "$(perms "$2")" = "$1" ] || fail "$2 is $(perms "$2"), expected $1"
}
# as_other CMD...: run as the unprivileged user.
as_other() { runuser -u "$OTHER" -- "$@"; }
# free_port: a TCP port nothing listens on now.
free_port() {
    python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"
}
# every_file_private DIR: files 0600 and directories 0700 throughout
# (sockets are checked by name).
every_file_private() {
    local bad
    bad=$(find "$1" \( -type f ! -perm 600 \) -o \( -type d ! -perm 700 \))
    [ -z "$bad" ] || { ls -laR "$1"; fail "not owner-only under $1: $bad"; }
}

# The scratch directory is 0700; devices go under a 0755 directory (and
# WORK is opened to traversal) so that only their own modes keep the
# other user out. The control file proves the user gets that far.
chmod 0711 "$WORK"
PUB=$WORK/pub
mkdir -m 0755 "$PUB"
echo visible >"$PUB/control.txt"
chmod 0644 "$PUB/control.txt"
# The user runs its own copy of dedup: the build tree may be out of its reach.
install -m 0755 "$DEDUP" "$PUB/dedup"

if ! id -u "$OTHER" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$OTHER"
fi
on_exit "userdel $OTHER"
as_other cat "$PUB/control.txt" >/dev/null || fail "$OTHER cannot reach $PUB: the test would prove nothing"

log "create under umask 000: directory 0700, data and meta 0600"
DEV=$PUB/dev
(umask 000 && "$DEDUP" create "$DEV" --size $SIZE --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null)
expect_perms 700 "$DEV"
expect_perms 600 "$DEV/data"
expect_perms 600 "$DEV/meta"
every_file_private "$DEV"

log "serve under umask 000: sockets, pid file and trace 0600"
umask 000
serve "$DEV" --record "$PUB/trace.rec"
umask 022
expect_perms 600 "$DEV/nbd.sock"
expect_perms 600 "$DEV/control.sock"
expect_perms 600 "$DEV/nbdkit.pid"
expect_perms 600 "$PUB/trace.rec"
# The raw client used for --read-only below, on a writable export: it works.
[ "$(python3 "$RAW_WRITE" "$DEV/nbd.sock" 0 4096)" = "read_only=0 error=0" ] || fail "control: a raw write failed"
head -c 8M /dev/urandom >"$WORK/a.bin"
nbdcopy --flush "$WORK/a.bin" "$(uri "$DEV")"
[ "$(status "$DEV" chunks_mapped)" = 2048 ] || fail "the owner cannot use the device"
every_file_private "$DEV"

log "another user cannot read the data or connect, through the directory"
as_other cat "$DEV/data" >/dev/null 2>&1 && fail "$OTHER read $DEV/data"
as_other nbdinfo "$(uri "$DEV")" >/dev/null 2>&1 && fail "$OTHER connected to the NBD socket"
as_other "$PUB/dedup" status "$DEV" >/dev/null 2>&1 && fail "$OTHER reached the control socket"

log "... nor with the directory opened up: each file and socket keeps them out by itself"
chmod 0755 "$DEV"
as_other cat "$DEV/data" >/dev/null 2>&1 && fail "$OTHER read $DEV/data (0600 itself)"
as_other cat "$DEV/meta" >/dev/null 2>&1 && fail "$OTHER read $DEV/meta (0600 itself)"
as_other nbdinfo "$(uri "$DEV")" >/dev/null 2>&1 && fail "$OTHER connected to the NBD socket (0600 itself)"
out=$(as_other "$PUB/dedup" status "$DEV" 2>&1) && fail "$OTHER reached the control socket (0600 itself)"
echo "$out" | grep -qi "permission denied" || fail "dedup status as $OTHER failed otherwise: $out"
# Positive control: wider modes would let the user in, so the refusals
# above come from the modes and from nothing else.
chmod 0666 "$DEV/nbd.sock"
as_other nbdinfo "$(uri "$DEV")" >/dev/null || fail "control: $OTHER cannot connect even to a 0666 socket"
chmod 0600 "$DEV/nbd.sock"
chmod 0644 "$DEV/data"
as_other cat "$DEV/data" >/dev/null || fail "control: $OTHER cannot read even a 0644 data file"
chmod 0600 "$DEV/data"
chmod 0700 "$DEV"
stop "$DEV"
every_file_private "$DEV"
expect_perms 600 "$PUB/trace.rec"

log "dedup tls-psk: USER:64 hex digits, 0600, not overwritten without --force"
KEY=$PUB/dev.psk
(umask 000 && "$DEDUP" tls-psk "$KEY" --user e2e >/dev/null)
expect_perms 600 "$KEY"
grep -qxE 'e2e:[0-9a-f]{64}' "$KEY" || fail "unexpected PSK file: $(cat "$KEY")"
cp "$KEY" "$WORK/key.before"
out=$("$DEDUP" tls-psk "$KEY" --user e2e 2>&1) && fail "tls-psk overwrote $KEY without --force"
echo "$out" | grep -q -- "--force" || fail "the refusal does not name --force: $out"
cmp -s "$KEY" "$WORK/key.before" || fail "a refused tls-psk changed $KEY"
"$DEDUP" tls-psk "$KEY" --user e2e --force >/dev/null
cmp -s "$KEY" "$WORK/key.before" && fail "tls-psk --force wrote the same key again"
"$DEDUP" tls-psk "$PUB/wrong.psk" --user e2e >/dev/null

log "TLS over the Unix socket: data both ways with the key; plain and wrong-key clients refused"
serve "$DEV" --tls require --tls-psk "$KEY"
TLS_URI="nbds+unix://e2e@/?socket=$DEV/nbd.sock&tls-psk-file=$KEY"
grep -qF "at $TLS_URI" "$DEV.serve.log" || { cat "$DEV.serve.log"; fail "serve did not print the TLS URI $TLS_URI"; }
nbdinfo "$TLS_URI" >/dev/null || fail "nbdinfo with the key failed"
head -c 8M /dev/urandom >"$WORK/b.bin"
nbdcopy --flush "$WORK/b.bin" "$TLS_URI"
rm -f "$WORK/out.bin"
nbdcopy "$TLS_URI" "$WORK/out.bin"
cmp -n $((8 << 20)) "$WORK/out.bin" "$WORK/b.bin" || fail "data over TLS read back differs"
nbdinfo "$(uri "$DEV")" >/dev/null 2>&1 && fail "a plain (non-TLS) client connected to --tls require"
nbdinfo "nbds+unix://e2e@/?socket=$DEV/nbd.sock&tls-psk-file=$PUB/wrong.psk" >/dev/null 2>&1 \
    && fail "a client with the wrong key connected"
stop "$DEV"

log "--bind 0.0.0.0: refused without TLS (naming --tls), served with --tls require or --insecure"
PORT=$(free_port)
out=$(timeout 60 "$DEDUP" serve "$DEV" --port "$PORT" --bind 0.0.0.0 2>&1) && fail "--bind 0.0.0.0 without TLS was served"
echo "$out" | grep -q -- "--tls" || fail "the refusal does not name --tls: $out"
out=$(timeout 60 "$DEDUP" serve "$DEV" --port "$PORT" --bind 0.0.0.0 --tls allow 2>&1) && fail "--bind 0.0.0.0 with --tls allow was served"
echo "$out" | grep -q -- "--tls" || fail "the refusal does not name --tls: $out"
serve "$DEV" --port "$PORT" --bind 0.0.0.0 --insecure
grep -q "warning: serving 0.0.0.0:$PORT without required TLS" "$DEV.serve.log" || { cat "$DEV.serve.log"; fail "no warning for --insecure"; }
stop "$DEV"
PORT=$(free_port)
serve "$DEV" --port "$PORT" --bind 0.0.0.0 --tls require --tls-psk "$KEY"
# Reached over loopback only: 0.0.0.0 includes it.
rm -f "$WORK/out.bin"
nbdcopy "nbds://e2e@127.0.0.1:$PORT/?tls-psk-file=$KEY" "$WORK/out.bin"
cmp -n $((8 << 20)) "$WORK/out.bin" "$WORK/b.bin" || fail "data over TLS on TCP differs"
nbdinfo "nbd://127.0.0.1:$PORT" >/dev/null 2>&1 && fail "a plain TCP client connected to --tls require"
stop "$DEV"

log "--read-only: writes fail, the data is unchanged, the device stays online"
serve "$DEV" --read-only
grep -q "read-only" "$DEV.serve.log" || fail "serve did not say read-only"
nbdinfo --json "$(uri "$DEV")" | python3 -c "import json,sys; assert json.load(sys.stdin)['exports'][0]['is_read_only']" \
    || fail "the export is not advertised read-only"
head -c 1M /dev/urandom >"$WORK/c.bin"
nbdcopy "$WORK/c.bin" "$(uri "$DEV")" 2>/dev/null && fail "nbdcopy wrote to a read-only export"
# qemu-io may exit 0 after a failed command: its words count too.
if out=$(qemu-io -f raw -c "write -P 0x55 0 64k" "$(uri "$DEV")" 2>&1) \
    && ! echo "$out" | grep -qiE "fail|error|denied|not permitted|read-only"; then
    fail "qemu-io wrote to a read-only export: $out"
fi
# Those clients refuse by themselves; the server must refuse too.
out=$(python3 "$RAW_WRITE" "$DEV/nbd.sock" 0 4096)
[ "$out" = "read_only=1 error=1" ] || fail "a raw write to a read-only export was not refused with EPERM: $out"
rm -f "$WORK/out.bin"
nbdcopy "$(uri "$DEV")" "$WORK/out.bin"
cmp -n $((8 << 20)) "$WORK/out.bin" "$WORK/b.bin" || fail "a read-only export changed the data"
[ "$(status "$DEV" chunks_mapped)" = 2048 ] || fail "status does not reach a read-only export"
stop "$DEV"
every_file_private "$DEV"
check_clean "$DEV"
echo "PASS security"
