#!/usr/bin/env bash
# What stands between a lab tool and a machine people trust, from the
# command line, each scenario one that used to lose or serve wrong data:
# - a stale metadata file put back (as from a backup) is refused naming
#   both generations; `check --repair --data` keeps it, verified;
# - one flipped byte in the newest superblock slot is damage, not an
#   unclean stop to roll back silently;
# - create never overwrites a served device or a mounted one, or the file
#   behind a mounted loop device (even with --force), one file for both
#   halves (also by way of a loop device reading it), or a file holding
#   data (without --force);
# - `serve --record DIR/meta` does not truncate the metadata;
# - a serve that fails to start (port in use, or no control socket once
#   the device is open) leaves the device clean;
# - status and check write nothing (an lsm device stays openable), and a
#   user who may not read the device is told so, not to create one;
# - a server whose log cannot be written (stderr on a full disk) serves on;
# - Ctrl-C with a filesystem mounted says what it waits for, and a second
#   Ctrl-C saves the metadata and stops (it used to hang silently);
# - freed chunks are punched out of the data file (it never shrank).
source "$(dirname "$0")/lib.sh"

# files_sum DIR: one checksum over every file of a device directory.
files_sum() {
    (cd "$1" && find . -type f ! -name '*.sock' -print0 | sort -z | xargs -0 md5sum | md5sum)
}

head -c $((8 << 20)) /dev/urandom >"$WORK/a.bin"
head -c $((8 << 20)) /dev/urandom >"$WORK/b.bin"

log "stale metadata put back is refused, then kept on request after verification"
"$DEDUP" create "$WORK/st" --size 64M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
serve "$WORK/st"
nbdcopy --flush "$WORK/a.bin" "$(uri "$WORK/st")"
stop "$WORK/st"
cp -a "$WORK/st/meta" "$WORK/meta.backup"
[ -d "$WORK/st/meta.lsm" ] && cp -a "$WORK/st/meta.lsm" "$WORK/meta.lsm.backup"
serve "$WORK/st"
nbdcopy --flush "$WORK/b.bin" "$(uri "$WORK/st")"
stop "$WORK/st"
cp -a "$WORK/meta.backup" "$WORK/st/meta"
if [ -d "$WORK/meta.lsm.backup" ]; then
    rm -rf "$WORK/st/meta.lsm"
    cp -a "$WORK/meta.lsm.backup" "$WORK/st/meta.lsm"
fi
expect_fail "generation" "$DEDUP" serve "$WORK/st"
expect_fail "check --repair --data" "$DEDUP" status "$WORK/st"
expect_fail "generation" "$DEDUP" check "$WORK/st"
expect_fail "generation" "$DEDUP" check "$WORK/st" --repair
"$DEDUP" check "$WORK/st" --repair --data >"$WORK/repair.out" || true
check_clean "$WORK/st"
serve "$WORK/st"
nbdcopy "$(uri "$WORK/st")" "$WORK/st.out"
python3 - "$WORK/st.out" "$WORK/a.bin" <<'PY'
import sys
out, a = (open(p, "rb").read() for p in sys.argv[1:])
zero = bytes(4096)
for i in range(0, len(a), 4096):
    c = out[i:i + 4096]
    assert c in (a[i:i + 4096], zero), f"block {i // 4096} is neither the kept metadata's content nor zeros"
PY
stop "$WORK/st"

log "a damaged newest superblock slot is refused as damage"
"$DEDUP" create "$WORK/sb" --size 64M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
serve "$WORK/sb"
nbdcopy --flush "$WORK/a.bin" "$(uri "$WORK/sb")"
stop "$WORK/sb"
python3 - "$WORK/sb/meta" <<'PY'
import struct, sys
with open(sys.argv[1], "r+b") as f:
    gens = []
    for slot in (0, 1):
        f.seek(slot * 4096 + 16)
        gens.append(struct.unpack("<Q", f.read(8))[0])
    newest = 0 if gens[0] > gens[1] else 1
    f.seek(newest * 4096 + 200)
    b = f.read(1)
    f.seek(newest * 4096 + 200)
    f.write(bytes([b[0] ^ 0x40]))
PY
expect_fail "slot is damaged" "$DEDUP" serve "$WORK/sb" --accept-unclean

log "create never overwrites a device in use, one file twice, or a file holding data"
serve "$WORK/st"
expect_fail "in use" "$DEDUP" create "$WORK/z2" --size 64M --data "$WORK/st/data" --meta "$WORK/st/meta" --force
[ ! -e "$WORK/z2/meta" ] || fail "create left files behind"
nbdcopy "$(uri "$WORK/st")" "$WORK/st2.out"
cmp "$WORK/st.out" "$WORK/st2.out" || fail "the served device changed under create --force"
stop "$WORK/st"
expect_fail "same file" "$DEDUP" create "$WORK/z3" --size 64M --data "$WORK/x.img" --meta "$WORK/x.img"
cp "$WORK/a.bin" "$WORK/victim.img"
expect_fail "--force" "$DEDUP" create "$WORK/z4" --size 64M --data "$WORK/victim.img"
cmp "$WORK/a.bin" "$WORK/victim.img" || fail "create wrote over a file holding data"

log "create --force never writes over a mounted filesystem, nor one file twice through a loop device"
truncate -s 64M "$WORK/fs.img"
mkfs.ext4 -q -F "$WORK/fs.img"
fsloop=$(losetup -f --show "$WORK/fs.img")
on_exit "losetup -d $fsloop"
mkdir "$WORK/fsmnt"
mount "$fsloop" "$WORK/fsmnt"
on_exit "umount -l $WORK/fsmnt"
echo kept >"$WORK/fsmnt/file"
sync
expect_fail "mounted at $WORK/fsmnt" "$DEDUP" create "$WORK/m1" --size 32M --data "$fsloop" --force
expect_fail "mounted at $WORK/fsmnt" "$DEDUP" create "$WORK/m2" --size 32M --meta "$fsloop" --force
expect_fail "backs the loop device $fsloop" "$DEDUP" create "$WORK/m3" --size 32M --data "$WORK/fs.img" --force
umount "$WORK/fsmnt"
e2fsck -fn "$fsloop" >/dev/null 2>&1 || fail "create --force damaged the mounted ext4"
mount "$fsloop" "$WORK/fsmnt"
[ "$(cat "$WORK/fsmnt/file")" = kept ] || fail "the mounted filesystem lost its file"
umount "$WORK/fsmnt"
truncate -s 64M "$WORK/x2.img"
xloop=$(losetup -f --show "$WORK/x2.img")
on_exit "losetup -d $xloop"
expect_fail "same file" "$DEDUP" create "$WORK/m4" --size 16M --data "$WORK/x2.img" --meta "$xloop"
expect_fail "same file" "$DEDUP" create "$WORK/m5" --size 16M --data "$xloop" --meta "$WORK/x2.img"
[ ! -e "$WORK/m4/meta" ] && [ ! -e "$WORK/m5/meta" ] || fail "a refused create left files behind"
losetup -d "$fsloop" "$xloop"

log "serve --record never truncates the device's own files"
before=$(md5sum <"$WORK/st/meta")
expect_fail "never overwrites" "$DEDUP" serve "$WORK/st" --record "$WORK/st/meta"
[ "$(md5sum <"$WORK/st/meta")" = "$before" ] || fail "--record changed the metadata"

log "a serve that fails to start leaves the device as it was"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -c 'import socket,sys,time; s=socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); time.sleep(30)' "$port" &
holder=$!
on_exit "kill $holder"
sleep 0.5
"$DEDUP" create "$WORK/fs" --size 64M --backend inram >/dev/null
expect_fail "stopped before serving" "$DEDUP" serve "$WORK/fs" --port "$port"
# INRAM refuses to serve a device left open: this one was not.
serve "$WORK/fs"
stop "$WORK/fs"
# Failing later, once the device is open (its control socket cannot be
# made: the path is too long for a socket), closes it again.
long=$WORK/$(printf 'd%.0s' $(seq $((100 - ${#WORK}))))
mv "$WORK/fs" "$long"
expect_fail "longer than 107 bytes" "$DEDUP" serve "$long" --port "$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
mv "$long" "$WORK/fs"
serve "$WORK/fs"
stop "$WORK/fs"

log "status and check write nothing, on a new device and a used one"
"$DEDUP" create "$WORK/ro" --size 64M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
for round in new used; do
    before=$(files_sum "$WORK/ro")
    "$DEDUP" status "$WORK/ro" >/dev/null
    "$DEDUP" status "$WORK/ro" --json >/dev/null
    "$DEDUP" check "$WORK/ro" --data >/dev/null
    [ "$(files_sum "$WORK/ro")" = "$before" ] || fail "inspecting the $round device changed its files"
    serve "$WORK/ro"
    nbdcopy --flush "$WORK/a.bin" "$(uri "$WORK/ro")"
    stop "$WORK/ro"
done

log "status as a user who may not read the device says so, naming the file"
expect_fail "permission denied looking up $WORK/ro/meta" setpriv --reuid=65534 --regid=65534 --clear-groups "$DEDUP" status "$WORK/ro"

log "a server whose log cannot be written serves on and stops cleanly"
# nbdkit itself, with the plugin, so that only the server's stderr is full.
"$DEDUP" create "$WORK/lg" --size 64M --backend inram >/dev/null
DEDUP_LOG=debug nbdkit --foreground --unix "$WORK/lg/nbd.sock" \
    "$(dirname "$DEDUP")/libdedup_nbd.so" dir="$WORK/lg" >"$WORK/lg.out" 2>/dev/full &
lpid=$!
on_exit "kill -TERM $lpid"
for _ in $(seq 100); do [ -S "$WORK/lg/control.sock" ] && break; sleep 0.1; done
nbdcopy --flush "$WORK/a.bin" "$(uri "$WORK/lg")"
"$DEDUP" gc "$WORK/lg" >/dev/null
nbdcopy "$(uri "$WORK/lg")" "$WORK/lg.bin"
cmp -n $((8 << 20)) "$WORK/lg.bin" "$WORK/a.bin" || fail "data differs with logging failing"
kill -TERM "$lpid"
wait "$lpid" || fail "the server with a failing log exited with $?"
# INRAM refuses to serve after a stop that did not save: this one did.
serve "$WORK/lg"
nbdcopy "$(uri "$WORK/lg")" "$WORK/lg2.bin"
cmp -n $((8 << 20)) "$WORK/lg2.bin" "$WORK/a.bin" || fail "data differs after the stop"
stop "$WORK/lg"
# INRAM punches nothing: after a crash it rolls back to its last clean
# stop, whose mappings may name blocks freed since.
if [ "$BACKEND" != inram ]; then
    log "freed space goes back to the host: the data file's allocation follows the space in use"
    "$DEDUP" create "$WORK/sp" --size 64M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
    serve "$WORK/sp"
    head -c $((32 << 20)) /dev/urandom >"$WORK/sp.bin"
    nbdcopy --flush "$WORK/sp.bin" "$(uri "$WORK/sp")"
    high=$(($(stat -c %b "$WORK/sp/data") * 512))
    qemu-io -f raw -c "discard 0 24M" -c flush "$(uri "$WORK/sp")" >/dev/null
    "$DEDUP" gc "$WORK/sp" >/dev/null
    used=$(status "$WORK/sp" physical_bytes_used)
    alloc=$(($(stat -c %b "$WORK/sp/data") * 512))
    echo "data file: ${high} bytes allocated after writing, ${alloc} after discarding 3/4 and gc; ${used} in use"
    [ "$alloc" -le $((used + (1 << 20))) ] || fail "the data file holds $alloc bytes for $used in use"
    [ "$alloc" -lt $((high / 2)) ] || fail "the data file did not shrink ($high -> $alloc)"
    nbdcopy "$(uri "$WORK/sp")" "$WORK/sp.out"
    cmp -i $((24 << 20)) -n $((8 << 20)) "$WORK/sp.out" "$WORK/sp.bin" || fail "data kept differs"
    stop "$WORK/sp"
fi

log "Ctrl-C with a filesystem mounted says what it waits for; a second one saves and stops"
"$DEDUP" create "$WORK/cc" --size 128M --backend inram >/dev/null
serve "$WORK/cc"
mkdir "$WORK/ccmnt"
attach_loop "$WORK/cc" "$WORK/ccfuse"
mkfs.ext4 -q -F "$loop"
mount "$loop" "$WORK/ccmnt"
on_exit "umount -l $WORK/ccmnt"
echo kept >"$WORK/ccmnt/file"
sync
ccpid=$(cat "$WORK/cc.servepid")
kill -INT "$ccpid"
for _ in $(seq 50); do grep -q "waits for its clients" "$WORK/cc.serve.log" && break; sleep 0.1; done
grep -q "waits for its clients" "$WORK/cc.serve.log" || { cat "$WORK/cc.serve.log"; fail "the first Ctrl-C did not say what it waits for"; }
kill -0 "$ccpid" || fail "the server stopped under a mounted filesystem"
kill -INT "$ccpid"
wait "$ccpid" || fail "the second Ctrl-C did not stop cleanly (exit $?)"
grep -q "metadata saved cleanly" "$WORK/cc.serve.log" || { cat "$WORK/cc.serve.log"; fail "not saved"; }
umount -l "$WORK/ccmnt"
losetup -d "$loop" || true
# INRAM serves again without --accept-unclean: the stop was clean.
serve "$WORK/cc"
stop "$WORK/cc"
echo "PASS safety"
