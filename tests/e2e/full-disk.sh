#!/usr/bin/env bash
# The host's filesystem fills up under a served device, then space is
# freed: the server must serve on without a restart, lose nothing it
# acknowledged, and stop cleanly. The device lives on a small loop-mounted
# ext4 with a ballast file that leaves it too little room.
source "$(dirname "$0")/lib.sh"

truncate -s 96M "$WORK/host.img"
mkfs.ext4 -q -F -m 0 "$WORK/host.img"
mkdir -p "$WORK/host"
mount -o loop "$WORK/host.img" "$WORK/host"
on_exit "umount -l $WORK/host"
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
echo "PASS full-disk"
