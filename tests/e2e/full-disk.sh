#!/usr/bin/env bash
# The host's filesystem fills up under a served device, then space is
# freed: the server must serve on without a restart, lose nothing it
# acknowledged, and stop cleanly. Then a stop while it is full: a save
# that fails is an error with the store's advice, and so is the next
# open. The device lives on a small loop-mounted ext4 with a ballast file that leaves it too little room.
source "$(dirname "$0")/lib.sh"

truncate -s 96M "$WORK/host.img"
mkfs.ext4 -q -F -m 0 "$WORK/host.img"
mkdir -p "$WORK/host"
mount -o loop "$WORK/host.img" "$WORK/host"
on_exit "umount -l $WORK/host"
# The server's log lives off the host filesystem (a symlink takes no
# block): on it, the messages written while it is full would be lost
# (nbdkit's "error: " prefix fits the log's last block, its text not).
ln -s "$WORK/dev.serve.log" "$WORK/host/dev.serve.log"
"$DEDUP" create "$WORK/host/dev" --size 64M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
# Leave about 6 MiB free: less than the 24 MiB written below.
free_kib=$(df --output=avail -k "$WORK/host" | tail -1)
fallocate -l $(((free_kib - 6 * 1024) * 1024)) "$WORK/host/ballast"
head -c $((24 << 20)) /dev/urandom >"$WORK/a.bin"

serve "$WORK/host/dev"
u=$(uri "$WORK/host/dev")
# Copies that may fail keep one request in flight: nbdcopy drops the
# connection at its first error, and nbdkit 1.32 can then abort on an
# assertion (raw_send_socket: sock >= 0) when another request's reply is
# sent on the closed socket; seen once in a full suite, on cowbtree.
one_at_a_time=(--connections=1 --requests=1)
log "writing more than the host has room for fails"
if nbdcopy "${one_at_a_time[@]}" --flush "$WORK/a.bin" "$u" 2>"$WORK/copy1.err"; then
    fail "24 MiB fit in 6 MiB of host space"
fi
log "the server is still up; space is freed; the same writes now succeed without a restart"
rm -f "$WORK/host/ballast"
ok=
for _ in $(seq 20); do
    if nbdcopy "${one_at_a_time[@]}" --flush "$WORK/a.bin" "$u" 2>"$WORK/copy2.err"; then
        ok=1
        break
    fi
    sleep 0.5
done
[ -n "$ok" ] || { cat "$WORK/copy2.err" "$WORK/host/dev.serve.log"; fail "writes still fail after space was freed"; }
nbdcopy "$u" "$WORK/out.bin"
cmp -n $((24 << 20)) "$WORK/out.bin" "$WORK/a.bin" || fail "data differs after the disk filled and freed"
stop "$WORK/host/dev"
check_clean "$WORK/host/dev"
serve "$WORK/host/dev"
rm -f "$WORK/out.bin"
nbdcopy "$u" "$WORK/out.bin"
cmp -n $((24 << 20)) "$WORK/out.bin" "$WORK/a.bin" || fail "data differs after a restart"
stop "$WORK/host/dev"

log "stopping with the host filesystem full: the failed save is an error, with the store's advice"
serve "$WORK/host/dev"
nbdcopy --flush "$WORK/a.bin" "$u"
# Every byte of the host taken, then writes the stop must save.
dd if=/dev/zero of="$WORK/host/ballast" bs=1M status=none 2>/dev/null || true
head -c $((4 << 20)) /dev/urandom >"$WORK/b.bin"
qemu-io -f raw -c "write -s $WORK/b.bin 24M 4M" "$u" >/dev/null 2>&1 || true
if [ "$BACKEND" = sparse ] || [ "$BACKEND" = disktable ]; then
    log "a flush while the write stalls says how much to free, and where"
    if qemu-io -f raw -c flush "$u" >"$WORK/flush.out" 2>&1; then
        log "(the write applied: nothing stalled)"
    else
        grep -q "free at least [0-9]* MB on the filesystem holding $WORK/host/dev" "$WORK/flush.out" "$WORK/host/dev.serve.log" ||
            { cat "$WORK/flush.out"; tail -5 "$WORK/host/dev.serve.log"; fail "the stall does not say how much to free"; }
    fi
    log "a trim while writes stall gives space back through the device"
    before=$(df --output=avail -k "$WORK/host" | tail -1)
    qemu-io -f raw -c "discard 0 16M" "$u" >"$WORK/trim.out" 2>&1 || { cat "$WORK/trim.out"; fail "trim failed while writes stall"; }
    after=$(df --output=avail -k "$WORK/host" | tail -1)
    [ "$after" -ge $((before + 8 * 1024)) ] || fail "a trim of 16 MiB gave back $((after - before)) KiB"
    head -c $((16 << 20)) /dev/zero | dd of="$WORK/a.bin" conv=notrunc status=none
    log "the stalled write applies in the room the trim gave back; then the host is filled again"
    ok=
    for _ in $(seq 20); do
        qemu-io -f raw -c flush "$u" >/dev/null 2>&1 && { ok=1; break; }
        sleep 0.5
    done
    [ -n "$ok" ] || { tail -5 "$WORK/dev.serve.log"; fail "the stalled write did not apply after the trim"; }
    qemu-io -f raw -c "write -s $WORK/b.bin 28M 4M" "$u" >/dev/null 2>&1 || fail "a write failed with room on the host"
    dd if=/dev/zero of="$WORK/host/ballast2" bs=1M status=none 2>/dev/null || true
fi
pid=$(cat "$WORK/host/dev.servepid")
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
if ! grep -q "metadata saved cleanly" "$WORK/host/dev.serve.log"; then
    [ "$rc" -ne 0 ] || { cat "$WORK/host/dev.serve.log"; fail "a stop that did not save exited 0"; }
    if [ "$BACKEND" = inram ]; then want="--accept-unclean"; else want="recovers from its journal"; fi
    grep -q -- "$want" "$WORK/host/dev.serve.log" || { cat "$WORK/host/dev.serve.log"; fail "no '$want' advice"; }
    [ "$BACKEND" = inram ] || ! grep -q "needs --accept-unclean" "$WORK/host/dev.serve.log" || fail "advised --accept-unclean for $BACKEND"
    log "serving again while it is still full says what to free"
    if grep -q "acknowledged writes could not be applied and are lost.*the metadata is saved and consistent" "$WORK/host/dev.serve.log"; then
        # The stop gave up the stalled write (named, exit non-zero) but
        # saved the metadata: nothing is left to free for it to serve.
        log "(the metadata was saved; only the stalled write was given up, and named)"
    elif [ "$BACKEND" = sparse ] || [ "$BACKEND" = disktable ]; then
        # Their open replays the journal in place: it needs room.
        expect_fail "is full" "$DEDUP" serve "$WORK/host/dev"
    fi
elif [ "$BACKEND" = sparse ] || [ "$BACKEND" = disktable ]; then
    log "the journal's reserve let the stop save on the full host"
    [ "$rc" -eq 0 ] || fail "a clean stop exited $rc"
fi
if [ "$BACKEND" = sparse ] || [ "$BACKEND" = disktable ]; then
    grep -q "metadata saved cleanly" "$WORK/host/dev.serve.log" || fail "$BACKEND did not save on a full host filesystem"
fi
rm -f "$WORK/host/ballast" "$WORK/host/ballast2"
flags=()
[ "$BACKEND" = inram ] && flags=(--accept-unclean)
serve "$WORK/host/dev" "${flags[@]}"
nbdcopy "$u" "$WORK/out.bin"
cmp -n $((24 << 20)) "$WORK/out.bin" "$WORK/a.bin" || fail "data differs after the full-disk stop"
if [ "$BACKEND" = sparse ] || [ "$BACKEND" = disktable ]; then
    for at in 24 28; do
        cmp -n $((4 << 20)) -i $((at << 20)):0 "$WORK/out.bin" "$WORK/b.bin" || fail "the write at ${at}M was lost"
    done
fi
stop "$WORK/host/dev"
echo "PASS full-disk"
