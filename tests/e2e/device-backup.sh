#!/usr/bin/env bash
# A stopped device backed up by its fingerprints (issue 39): an ext4 image
# written onto a device, backed up with `dedup backup --device`, restores
# byte for byte and fscks clean; after a small change only the changed
# chunks are read; a served device whose mounted ext4 is being written
# is backed up through a snapshot, and its image mounts, compares and
# fscks clean (and, with nothing writing, equals the device); a chunk damaged on disk
# that the backup reads (the repository lacks it) stops the backup by name
# with nothing committed; a repository of
# content-defined segments is backed up by reading, and says so. The
# backups restore onto the same device by fingerprint (only the change
# written back), onto a new one, and from the content-defined repository
# whole; a served device, one holding data without --force and one too
# small are refused. Changed-block tracking: the second backup walks only
# the region changed; after a kill -9 the tracking is not trusted (the
# backups walk everything, and are exact) until a backup starts it again.
. "$(dirname "$0")/lib.sh"

json() { python3 -c "import json,sys; print(json.load(sys.stdin)[sys.argv[1]])" "$1"; }
# same_image DIR WANT: the stopped device in DIR, read through its server,
# holds the bytes of the file WANT (an ext4 image), and fscks clean.
same_image() {
    serve "$1"
    nbdcopy "$(uri "$1")" "$WORK/read.img"
    stop "$1"
    cmp "$WORK/read.img" "$2" || fail "device $1 differs from $2"
    e2fsck -fn "$WORK/read.img" >/dev/null || fail "device $1 does not fsck clean"
    rm -f "$WORK/read.img"
}

log "an ext4 image onto a device"
mkdir -p "$WORK/tree"
for i in $(seq 40); do
    head -c $((RANDOM * 8)) /dev/urandom >"$WORK/tree/f$i"
    cp "$WORK/tree/f$i" "$WORK/tree/copy$i"
done
truncate -s 96M "$WORK/v1.img"
mkfs.ext4 -q -F -d "$WORK/tree" "$WORK/v1.img"
"$DEDUP" create "$WORK/dev" --size 128M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
serve "$WORK/dev"
nbdcopy "$WORK/v1.img" "$(uri "$WORK/dev")"

log "a served device, its ext4 being written, backed up through a snapshot"
"$DEDUP" store init "$WORK/repo" --segments fixed:4K >/dev/null
attach_loop "$WORK/dev" "$WORK/fuse"
mkdir -p "$WORK/mnt"
mount "$loop" "$WORK/mnt"
on_exit "umount $WORK/mnt"
# A writer that goes on through the backup: files rewritten and synced.
(
    i=0
    while [ ! -e "$WORK/stop-writer" ]; do
        head -c $((32 * 1024 + i % 7 * 4096)) /dev/urandom >"$WORK/mnt/live$((i % 40))"
        i=$((i + 1))
        if [ $((i % 8)) = 0 ]; then sync; fi
    done
) &
writer=$!
on_exit "touch $WORK/stop-writer; wait $writer"
sleep 1
writes_before=$(status "$WORK/dev" write_requests)
"$DEDUP" backup "$WORK/repo" live --device "$WORK/dev" --json >"$WORK/live.json"
writes_after=$(status "$WORK/dev" write_requests)
touch "$WORK/stop-writer"
wait "$writer"
[ "$(json served <"$WORK/live.json")" = True ] || fail "not through the server: $(cat "$WORK/live.json")"
[ "$(json by_fingerprint <"$WORK/live.json")" = True ] || fail "not by fingerprint: $(cat "$WORK/live.json")"
log "writes while the backup ran: $((writes_after - writes_before)) requests"
[ $((writes_after - writes_before)) -gt 0 ] || fail "nothing was written while the backup ran"
umount "$WORK/mnt"
losetup -d "$loop"
fusermount3 -u "$WORK/fuse" || fusermount -u "$WORK/fuse"
wait "$fuse_pid" || true
# The image of one instant, taken while ext4 was writing: it mounts (its
# journal replayed, as after a power cut), then fscks clean, and every
# file of the image written before holds its bytes.
"$DEDUP" restore "$WORK/repo" live "$WORK/live.img"
mkdir -p "$WORK/mnt-live"
mount -o loop "$WORK/live.img" "$WORK/mnt-live"
on_exit "umount $WORK/mnt-live"
for i in 1 17 40; do
    cmp "$WORK/mnt-live/f$i" "$WORK/tree/f$i" || fail "f$i differs in the snapshot's image"
done
umount "$WORK/mnt-live"
e2fsck -fn "$WORK/live.img" >"$WORK/fsck.txt" 2>&1 || { cat "$WORK/fsck.txt"; fail "the snapshot's image does not fsck clean"; }
# With nothing writing, a served backup is the device byte for byte.
"$DEDUP" backup "$WORK/repo" quiet --device "$WORK/dev" --json >"$WORK/quiet.json"
"$DEDUP" restore "$WORK/repo" quiet "$WORK/quiet.img"
nbdcopy "$(uri "$WORK/dev")" "$WORK/quiet.dev"
cmp "$WORK/quiet.img" "$WORK/quiet.dev" || fail "a served backup of a quiet device differs from it"
log "through a backup server (store serve), encrypted: by fingerprint, then by the tracking"
spass="store e2e $RANDOM$RANDOM"
DEDUP_PASSWORD=$spass "$DEDUP" store init "$WORK/srepo" --encryption on --segments fixed:4K >/dev/null
DEDUP_PASSWORD=$spass "$DEDUP" store serve "$WORK/srepo" --socket "$WORK/store.sock" >"$WORK/store.log" 2>&1 &
spid=$!
on_exit "kill -TERM $spid; wait $spid"
for _ in $(seq 200); do grep -qs "dedup: serving" "$WORK/store.log" && break; sleep 0.1; done
"$DEDUP" backup --server "unix:$WORK/store.sock" viaserver --device "$WORK/dev" --json >"$WORK/via.json"
[ "$(json served <"$WORK/via.json")" = True ] || fail "not through a snapshot: $(cat "$WORK/via.json")"
[ "$(json by_fingerprint <"$WORK/via.json")" = True ] || fail "not by fingerprint: $(cat "$WORK/via.json")"
first_read=$(json blocks_read <"$WORK/via.json")
[ "$first_read" -lt 32768 ] || fail "every block read: $(cat "$WORK/via.json")"
"$DEDUP" backup --server "unix:$WORK/store.sock" viaserver2 --device "$WORK/dev" --json >"$WORK/via.json"
[ "$(json blocks_read <"$WORK/via.json")" = 0 ] || fail "the unchanged device was read again: $(cat "$WORK/via.json")"
[ "$(json blocks_unwalked <"$WORK/via.json")" = 32768 ] && [ "$(json parent <"$WORK/via.json")" = viaserver ] ||
    fail "the tracking did not spare the walk through the server: $(cat "$WORK/via.json")"
kill -TERM "$spid"
wait "$spid" || fail "dedup store serve exited $?"
for b in viaserver viaserver2; do
    DEDUP_PASSWORD=$spass "$DEDUP" restore "$WORK/srepo" $b "$WORK/via.img"
    cmp "$WORK/via.img" "$WORK/quiet.dev" || fail "backup $b through the server differs from the device"
    rm -f "$WORK/via.img"
done
DEDUP_PASSWORD=$spass "$DEDUP" store check "$WORK/srepo" --data >/dev/null || fail "the served repository does not check clean"
rm -f "$WORK/via.img"
rm -f "$WORK/live.img" "$WORK/quiet.img" "$WORK/quiet.dev"
"$DEDUP" delete "$WORK/repo" live >/dev/null
"$DEDUP" delete "$WORK/repo" quiet >/dev/null
stop "$WORK/dev"
# The image the stopped device now holds: v1 and what the writer left.
serve "$WORK/dev"
nbdcopy "$(uri "$WORK/dev")" "$WORK/v1.img"
stop "$WORK/dev"

log "first backup by fingerprint"
"$DEDUP" backup "$WORK/repo" v1 --device "$WORK/dev" --json >"$WORK/v1.json"
[ "$(json by_fingerprint <"$WORK/v1.json")" = True ] || fail "not by fingerprint: $(cat "$WORK/v1.json")"
[ "$(json blocks <"$WORK/v1.json")" = 32768 ] || fail "blocks walked: $(cat "$WORK/v1.json")"
"$DEDUP" restore "$WORK/repo" v1 "$WORK/v1.out"
cp "$WORK/v1.img" "$WORK/v1.want"
cmp "$WORK/v1.out" "$WORK/v1.want" || fail "v1 restored differs from the device"
e2fsck -fn "$WORK/v1.out" >/dev/null || fail "the restored image does not fsck clean"

log "a small change: only its chunks are read"
serve "$WORK/dev"
qemu-io -f raw -c "write -P 0x5a 80M 64K" "$(uri "$WORK/dev")" >/dev/null
stop "$WORK/dev"
tracked() { status "$WORK/dev" tracking | python3 -c "import ast,sys; print(ast.literal_eval(sys.stdin.read())[sys.argv[1]])" "$1"; }
changed=$(tracked regions_changed)
region=$(tracked region_chunks)
[ "$changed" = 1 ] || fail "dedup status shows $changed regions changed for one 64 KiB write"
"$DEDUP" backup "$WORK/repo" v2 --device "$WORK/dev" --json >"$WORK/v2.json"
read2=$(json blocks_read <"$WORK/v2.json")
[ "$read2" -le 16 ] || fail "the second backup read $read2 chunks for a 64 KiB change"
[ "$(json parent <"$WORK/v2.json")" = v1 ] || fail "v1 is not v2's parent: $(cat "$WORK/v2.json")"
[ "$(json blocks_from_parent <"$WORK/v2.json")" -gt 1000 ] || fail "nothing taken from v1"
[ "$(json tracking <"$WORK/v1.json")" = True ] || fail "v1 did not start the tracking: $(cat "$WORK/v1.json")"
[ "$(json blocks_unwalked <"$WORK/v2.json")" = $((32768 - region)) ] ||
    fail "v2 walked more than the one region changed: $(cat "$WORK/v2.json")"
"$DEDUP" restore "$WORK/repo" v2 "$WORK/v2.out"
cp "$WORK/v1.want" "$WORK/v2.want"
python3 - "$WORK/v2.want" <<'EOF'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(80 << 20)
    f.write(b"\x5a" * (64 << 10))
EOF
cmp "$WORK/v2.out" "$WORK/v2.want" || fail "v2 restored differs from the device"

log "restored onto the same device by fingerprint: the change put back, nothing else written"
serve "$WORK/dev"
if "$DEDUP" restore "$WORK/repo" v1 --device "$WORK/dev" 2>"$WORK/err"; then
    fail "a restore wrote onto a served device"
fi
grep -q "stop its server first" "$WORK/err" || { cat "$WORK/err"; fail "no hint to stop the server"; }
stop "$WORK/dev"
if "$DEDUP" restore "$WORK/repo" v1 --device "$WORK/dev" 2>"$WORK/err"; then
    fail "a device holding data was replaced without --force"
fi
grep -q "add --force" "$WORK/err" || { cat "$WORK/err"; fail "no hint to add --force"; }
"$DEDUP" restore "$WORK/repo" v1 --device "$WORK/dev" --force --json >"$WORK/r1.json"
[ "$(json by_fingerprint <"$WORK/r1.json")" = True ] || fail "not by fingerprint: $(cat "$WORK/r1.json")"
written=$(json bytes_written <"$WORK/r1.json")
[ "$written" -le $((128 << 10)) ] || fail "wrote $written bytes to put back 64 KiB: $(cat "$WORK/r1.json")"
[ "$(json blocks_unchanged <"$WORK/r1.json")" -ge $((32768 - 16)) ] || fail "$(cat "$WORK/r1.json")"
"$DEDUP" check "$WORK/dev" --data >/dev/null || fail "the device does not check clean after the restore"
same_image "$WORK/dev" "$WORK/v1.want"
"$DEDUP" restore "$WORK/repo" v2 --device "$WORK/dev" --force --json >"$WORK/r1.json"
[ "$(json bytes_written <"$WORK/r1.json")" -le $((128 << 10)) ] || fail "v2 put back: $(cat "$WORK/r1.json")"

log "restored onto a new device: every chunk written once; a device too small is refused"
"$DEDUP" create "$WORK/dev2" --size 128M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
"$DEDUP" restore "$WORK/repo" v2 --device "$WORK/dev2" --json >"$WORK/r2.json"
"$DEDUP" status "$WORK/dev2" --json >"$WORK/s2.json"
[ "$(json chunks_stored <"$WORK/s2.json")" -lt "$(json chunks_mapped <"$WORK/s2.json")" ] ||
    fail "the copies are not stored once: $(cat "$WORK/s2.json")"
"$DEDUP" check "$WORK/dev2" --data >/dev/null || fail "the new device does not check clean"
same_image "$WORK/dev2" "$WORK/v2.want"

log "from an encrypted repository: what the device holds elsewhere is mapped, not written"
pass="device e2e $RANDOM$RANDOM"
DEDUP_PASSWORD=$pass "$DEDUP" store init "$WORK/sealed" --segments fixed:4K --encryption on >/dev/null
DEDUP_PASSWORD=$pass "$DEDUP" backup "$WORK/sealed" v2 --device "$WORK/dev2" >/dev/null
# The change's 64 KiB moved: zeros where v2 has them, a copy 20 MiB on.
serve "$WORK/dev2"
qemu-io -f raw -c "write -P 0x5a 100M 64K" -c "write -z 80M 64K" "$(uri "$WORK/dev2")" >/dev/null
stop "$WORK/dev2"
DEDUP_PASSWORD=$pass "$DEDUP" restore "$WORK/sealed" v2 --device "$WORK/dev2" --force --json >"$WORK/r3.json"
[ "$(json by_fingerprint <"$WORK/r3.json")" = True ] || fail "encrypted, not by fingerprint: $(cat "$WORK/r3.json")"
[ "$(json blocks_mapped <"$WORK/r3.json")" -ge 16 ] ||
    fail "encrypted: the blocks held 20 MiB on were not mapped: $(cat "$WORK/r3.json")"
[ "$(json bytes_written <"$WORK/r3.json")" -le $((64 << 10)) ] ||
    fail "encrypted: wrote more than the 64 KiB overwritten: $(cat "$WORK/r3.json")"
"$DEDUP" check "$WORK/dev2" --data >/dev/null || fail "the device does not check clean after the encrypted restore"
same_image "$WORK/dev2" "$WORK/v2.want"
"$DEDUP" create "$WORK/small" --size 64M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
if "$DEDUP" restore "$WORK/repo" v2 --device "$WORK/small" 2>"$WORK/err"; then
    fail "a 128 MiB image was restored onto a 64 MiB device"
fi
grep -q "grow it first" "$WORK/err" || { cat "$WORK/err"; fail "no hint to grow"; }

log "a repository of content-defined segments: read, and says why"
"$DEDUP" store init "$WORK/cdc" >/dev/null
"$DEDUP" backup "$WORK/cdc" v2 --device "$WORK/dev" >"$WORK/cdc.out"
grep -q "read and hashed whole, because the repository cuts content-defined segments" "$WORK/cdc.out" ||
    { cat "$WORK/cdc.out"; fail "the fallback is not named"; }
"$DEDUP" restore "$WORK/cdc" v2 "$WORK/cdc.img"
cmp "$WORK/cdc.img" "$WORK/v2.want" || fail "the read backup differs from the device"
"$DEDUP" create "$WORK/dev3" --size 128M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
"$DEDUP" restore "$WORK/cdc" v2 --device "$WORK/dev3" >"$WORK/cdc-dev.out"
grep -q "written whole, because the repository cuts content-defined segments" "$WORK/cdc-dev.out" ||
    { cat "$WORK/cdc-dev.out"; fail "the restore's fallback is not named"; }
same_image "$WORK/dev3" "$WORK/v2.want"

if [ -n "${DEDUP_TEST_S3:-}" ]; then
    log "into a bucket: by fingerprint, in the clear and encrypted"
    B="$DEDUP_TEST_S3/device-$$-$RANDOM"
    "$DEDUP" store init "$B/clear" --segments fixed:4K --encryption off >/dev/null
    "$DEDUP" backup "$B/clear" v2 --device "$WORK/dev" --json >"$WORK/s3.json"
    [ "$(json by_fingerprint <"$WORK/s3.json")" = True ] || fail "not by fingerprint: $(cat "$WORK/s3.json")"
    "$DEDUP" restore "$B/clear" v2 "$WORK/s3.img"
    cmp "$WORK/s3.img" "$WORK/v2.want" || fail "the bucket's backup differs from the device"
    rm -f "$WORK/s3.img"
    "$DEDUP" restore "$B/clear" v2 --device "$WORK/dev" --force --json >"$WORK/s3r.json"
    [ "$(json bytes_written <"$WORK/s3r.json")" = 0 ] || fail "restored from the bucket: $(cat "$WORK/s3r.json")"
    # Encrypted, as an s3:// repository is by default: its fingerprints
    # key the plain digest, so the device's name them.
    pass="device e2e $RANDOM$RANDOM"
    DEDUP_PASSWORD=$pass "$DEDUP" store init "$B/sealed" --segments fixed:4K >/dev/null
    DEDUP_PASSWORD=$pass "$DEDUP" backup "$B/sealed" v2 --device "$WORK/dev" --json >"$WORK/sealed.json"
    [ "$(json by_fingerprint <"$WORK/sealed.json")" = True ] ||
        fail "encrypted, not by fingerprint: $(cat "$WORK/sealed.json")"
    DEDUP_PASSWORD=$pass "$DEDUP" backup "$B/sealed" v2again --device "$WORK/dev" --json >"$WORK/sealed.json"
    [ "$(json blocks_read <"$WORK/sealed.json")" = 0 ] ||
        fail "encrypted, the unchanged device was read: $(cat "$WORK/sealed.json")"
    DEDUP_PASSWORD=$pass "$DEDUP" restore "$B/sealed" v2 "$WORK/s3.img"
    cmp "$WORK/s3.img" "$WORK/v2.want" || fail "the encrypted backup differs from the device"
    rm -f "$WORK/s3.img"
    DEDUP_PASSWORD=$pass "$DEDUP" restore "$B/sealed" v2 --device "$WORK/dev" --force --json >"$WORK/sealed.json"
    [ "$(json by_fingerprint <"$WORK/sealed.json")" = True ] && [ "$(json bytes_written <"$WORK/sealed.json")" = 0 ] ||
        fail "the encrypted restore onto the device: $(cat "$WORK/sealed.json")"
    DEDUP_PASSWORD=$pass "$DEDUP" store check "$B/sealed" --data >/dev/null || fail "the encrypted bucket does not check clean"
    same_image "$WORK/dev" "$WORK/v2.want"
fi

log "a crash: the tracking is not trusted, the backups after it walk every block"
serve "$WORK/dev"
qemu-io -f raw -c "write -P 0x3c 88M 64K" -c flush "$(uri "$WORK/dev")" >/dev/null
kill -KILL "$(cat "$WORK/dev/nbdkit.pid")"
wait "$(cat "$WORK/dev.servepid")" || true
"$DEDUP" status "$WORK/dev" | grep -q "Tracking         none" || fail "dedup status trusts the tracking after a crash"
"$DEDUP" backup "$WORK/repo" v3 --device "$WORK/dev" --json >"$WORK/v3.json"
[ "$(json blocks_unwalked <"$WORK/v3.json")" = 0 ] || fail "trusted the tracking after a crash: $(cat "$WORK/v3.json")"
[ "$(json tracking <"$WORK/v3.json")" = False ] || fail "tracking started on an unclean device"
"$DEDUP" restore "$WORK/repo" v3 "$WORK/v3.out"
serve "$WORK/dev"
nbdcopy "$(uri "$WORK/dev")" "$WORK/v3.dev"
stop "$WORK/dev"
cmp "$WORK/v3.out" "$WORK/v3.dev" || fail "v3 differs from the device after its crash"
rm -f "$WORK/v3.out" "$WORK/v3.dev"
"$DEDUP" backup "$WORK/repo" v4 --device "$WORK/dev" --json >"$WORK/v4.json"
[ "$(json blocks_unwalked <"$WORK/v4.json")" = 0 ] || fail "v4 trusted a tracking begun before the crash"
[ "$(json tracking <"$WORK/v4.json")" = True ] || fail "v4 did not start the tracking again"
"$DEDUP" backup "$WORK/repo" v5 --device "$WORK/dev" --json >"$WORK/v5.json"
[ "$(json blocks_unwalked <"$WORK/v5.json")" = 32768 ] || fail "v5 walked an unchanged device: $(cat "$WORK/v5.json")"

if [ "$COMPRESSION" = none ]; then
    log "a chunk damaged on disk stops the backup by name"
    serve "$WORK/dev"
    printf 'DEDUP-MARKER-%04000d' 7 >"$WORK/marker"
    qemu-io -f raw -c "write -s $WORK/marker 100M 4K" "$(uri "$WORK/dev")" >/dev/null
    stop "$WORK/dev"
    at=$(grep -obUa "DEDUP-MARKER-" "$WORK/dev/data" | head -1 | cut -d: -f1)
    [ -n "$at" ] || fail "the marker is not in the data file"
    printf 'X' | dd of="$WORK/dev/data" bs=1 seek=$((at + 100)) conv=notrunc status=none
    if "$DEDUP" backup "$WORK/repo" v6 --device "$WORK/dev" 2>"$WORK/err"; then
        fail "a damaged chunk was backed up"
    fi
    grep -q "does not hold the bytes its recorded fingerprint names" "$WORK/err" ||
        { cat "$WORK/err"; fail "the damaged chunk is not named"; }
    grep -q "chunk 25600 " "$WORK/err" || { cat "$WORK/err"; fail "not the chunk at 100 MiB"; }
    "$DEDUP" list "$WORK/repo" --json | python3 -c '
import json, sys
names = sorted(b["name"] for b in json.load(sys.stdin))
assert names == ["v1", "v2", "v3", "v4", "v5"], names'
fi
log "device backup passed"
