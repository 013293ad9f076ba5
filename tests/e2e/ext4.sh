#!/usr/bin/env bash
# A real filesystem on the device without the kernel nbd module: nbdfuse
# exposes the device as a file, losetup makes it a block device, ext4 goes
# on top. The same tree is copied three times; after unmount fsck is clean,
# a remount reads every copy back intact, and the dedup ratio is near 3.
# Then two copies are deleted and fstrim + gc give the space back.
source "$(dirname "$0")/lib.sh"

"$DEDUP" create "$WORK/dev" --size 512M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
serve "$WORK/dev"

log "nbdfuse + losetup"
mkdir "$WORK/mnt"
attach_loop "$WORK/dev" "$WORK/fuse"

log "mkfs.ext4 + mount + three copies of a tree"
mkfs.ext4 -q -F "$loop"
mount "$loop" "$WORK/mnt"
on_exit "umount $WORK/mnt"
python3 "$(dirname "$0")/make-tree.py" "$WORK/tree" 48 7 >/dev/null
for i in 1 2 3; do cp -a "$WORK/tree" "$WORK/mnt/copy$i"; done
sync
umount "$WORK/mnt"

log "fsck.ext4 -fn"
fsck.ext4 -fn "$loop" >"$WORK/fsck.txt" 2>&1 || { cat "$WORK/fsck.txt"; fail "fsck found errors"; }

log "remount and compare"
mount "$loop" "$WORK/mnt"
for i in 1 2 3; do diff -r "$WORK/tree" "$WORK/mnt/copy$i" || fail "copy$i differs after remount"; done

ratio_before_gc=$(status "$WORK/dev" dedup_ratio)
"$DEDUP" gc "$WORK/dev" >/dev/null
ratio=$(status "$WORK/dev" dedup_ratio)
log "dedup ratio with three copies: $ratio ($ratio_before_gc before gc freed overwritten ext4 metadata)"
near "$ratio" 3.0 0.35
near "$ratio_before_gc" 3.0 0.5

log "delete two copies, fstrim, gc: space comes back"
used_before=$(status "$WORK/dev" physical_bytes_used)
rm -rf "$WORK/mnt/copy2" "$WORK/mnt/copy3"
sync
fstrim -v "$WORK/mnt" || fail "fstrim failed"
"$DEDUP" gc "$WORK/dev" >/dev/null
diff -r "$WORK/tree" "$WORK/mnt/copy1" || fail "copy1 damaged by trim"
ratio_after=$(status "$WORK/dev" dedup_ratio)
used_after=$(status "$WORK/dev" physical_bytes_used)
log "after deleting two copies: ratio $ratio_after, physical used $used_before -> $used_after"
near "$ratio_after" 1.0 0.2
rm -rf "$WORK/mnt/copy1"
sync
fstrim "$WORK/mnt"
"$DEDUP" gc "$WORK/dev" >/dev/null
used_empty=$(status "$WORK/dev" physical_bytes_used)
log "after deleting everything: physical used $used_empty"
python3 -c "import sys; sys.exit(0 if int(sys.argv[1]) < int(sys.argv[2]) // 4 else 1)" "$used_empty" "$used_after" \
    || fail "deleting the tree freed too little ($used_after -> $used_empty)"
umount "$WORK/mnt"
fsck.ext4 -fn "$loop" >"$WORK/fsck.txt" 2>&1 || { cat "$WORK/fsck.txt"; fail "fsck found errors after trim"; }
losetup -d "$loop"
fusermount3 -u "$WORK/fuse" || fusermount -u "$WORK/fuse"
wait "$fuse_pid" || true
stop "$WORK/dev"
check_clean "$WORK/dev"
echo "PASS ext4 (ratio $ratio with 3 copies)"
