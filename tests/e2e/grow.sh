#!/usr/bin/env bash
# Growing a device under a real filesystem, as a sysadmin does after
# `vdo growLogical`/`growPhysical`: ext4 on a 256M device with 64M of data
# space; grow refused while served; stopped, grown to 1G with 256M of data
# space; served again, resize2fs, and the files read back, fsck is clean,
# and the filesystem takes more unique data than the old data space held.
source "$(dirname "$0")/lib.sh"

"$DEDUP" create "$WORK/dev" --size 256M --physical-size 64M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
serve "$WORK/dev"
attach_loop "$WORK/dev" "$WORK/fuse1"
mkdir "$WORK/mnt"
mkfs.ext4 -q -F "$loop"
mount "$loop" "$WORK/mnt"
on_exit "umount $WORK/mnt"
python3 "$(dirname "$0")/make-tree.py" "$WORK/tree" 24 5 >/dev/null
cp -a "$WORK/tree" "$WORK/mnt/tree"
head -c 40M /dev/urandom >"$WORK/unique1"
cp "$WORK/unique1" "$WORK/mnt/unique1"
sync
blocks_before=$(df --output=size "$WORK/mnt" | tail -1)

log "grow is refused while the device is served"
expect_fail "stop it first" "$DEDUP" grow "$WORK/dev" --size 1G

log "unmount, detach, stop, grow"
umount "$WORK/mnt"
losetup -d "$loop"
fusermount3 -u "$WORK/fuse1" || fusermount -u "$WORK/fuse1"
wait "$fuse_pid" || true
stop "$WORK/dev"
"$DEDUP" grow "$WORK/dev" --size 1G --physical-size 256M --json >"$WORK/grow.json"
python3 - "$WORK/grow.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["logical_size"] == 1 << 30, r
assert r["physical_size"] >= 256 << 20, r
assert r["method"] in ("copied", "in place"), r
print("== grew:", r["method"], r["logical_size_before"], "->", r["logical_size"], "logical;",
      r["physical_size_before"], "->", r["physical_size"], "data space;", round(r["seconds"], 2), "s")
PY
[ "$(status "$WORK/dev" logical_size)" = $((1 << 30)) ] || fail "status does not show the new size"

log "serve again, resize2fs, read back"
serve "$WORK/dev"
size=$(nbdinfo --size "$(uri "$WORK/dev")")
[ "$size" = $((1 << 30)) ] || fail "the export is $size bytes, not 1G"
attach_loop "$WORK/dev" "$WORK/fuse2"
e2fsck -f -p "$loop" >"$WORK/fsck.txt" 2>&1 || { cat "$WORK/fsck.txt"; fail "fsck before resize found errors"; }
resize2fs "$loop" >"$WORK/resize.txt" 2>&1 || { cat "$WORK/resize.txt"; fail "resize2fs failed"; }
mount "$loop" "$WORK/mnt"
blocks_after=$(df --output=size "$WORK/mnt" | tail -1)
log "ext4 size: $blocks_before -> $blocks_after 1K-blocks"
[ "$blocks_after" -gt $((blocks_before * 3)) ] || fail "the filesystem did not grow"
diff -r "$WORK/tree" "$WORK/mnt/tree" || fail "the tree differs after growing"
cmp "$WORK/unique1" "$WORK/mnt/unique1" || fail "unique1 differs after growing"

log "more unique data than the old data space held"
head -c 120M /dev/urandom >"$WORK/unique2"
cp "$WORK/unique2" "$WORK/mnt/unique2" || fail "writing 120M after growing the data space failed"
sync
umount "$WORK/mnt"
fsck.ext4 -fn "$loop" >"$WORK/fsck.txt" 2>&1 || { cat "$WORK/fsck.txt"; fail "fsck found errors after growing"; }
mount "$loop" "$WORK/mnt"
cmp "$WORK/unique2" "$WORK/mnt/unique2" || fail "unique2 differs"
diff -r "$WORK/tree" "$WORK/mnt/tree" || fail "the tree differs"
umount "$WORK/mnt"
losetup -d "$loop"
fusermount3 -u "$WORK/fuse2" || fusermount -u "$WORK/fuse2"
wait "$fuse_pid" || true
stop "$WORK/dev"
check_clean "$WORK/dev"
echo "PASS grow ($BACKEND)"
