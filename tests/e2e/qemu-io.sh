#!/usr/bin/env bash
# qemu-io writes, zeroes and discards at odd offsets and lengths (every
# chunk-edge case of read-modify-write); the same commands run on a plain
# raw file, and qemu-img compare must find the two identical.
source "$(dirname "$0")/lib.sh"

"$DEDUP" create "$WORK/dev" --size 64M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
serve "$WORK/dev"
truncate -s 64M "$WORK/ref.img"

cmds=(
    -c "write -P 0x11 1000 5000"
    -c "write -P 0x22 4095 2"
    -c "write -P 0x33 1048575 8193"
    -c "write -P 0x44 0 1M"
    -c "write -P 0x44 2M 1M"
    -c "write -P 0x44 3M 1M"
    -c "write -P 0x55 12345 1"
    -c "write -z 2M 4096"
    -c "write -z 2101248 10000"
    -c "discard 3M 8192"
    -c "write -P 0x66 67104767 4097"
    -c "write -P 0x77 33554431 3"
    -c "aio_flush"
    -c "write -P 0x88 -f 20M 64k"
)
for target in "$WORK/ref.img" "$(uri "$WORK/dev")"; do
    out=$(qemu-io -f raw "${cmds[@]}" "$target" 2>&1) || { echo "$out"; fail "qemu-io failed on $target"; }
    if echo "$out" | grep -qiE "error|fail"; then echo "$out"; fail "qemu-io reported an error on $target"; fi
done

log "pattern reads at odd offsets"
out=$(qemu-io -f raw \
    -c "read -P 0x44 0 12345" -c "read -P 0x55 12345 1" -c "read -P 0x44 12346 1036230" \
    -c "read -P 0x33 1048576 8192" -c "read -P 0x0 3145728 8192" -c "read -P 0x44 3153920 1040384" \
    -c "read -P 0x66 67104767 4097" -c "read -P 0x77 33554431 3" -c "read -P 0x88 20M 64k" \
    "$(uri "$WORK/dev")" 2>&1)
if echo "$out" | grep -qiE "verification failed|error"; then echo "$out"; fail "pattern mismatch"; fi

log "qemu-img compare against the raw reference"
qemu-img compare -f raw -F raw "$WORK/ref.img" "$(uri "$WORK/dev")" || fail "device differs from the reference image"
[ "$(status "$WORK/dev" rmw_reads)" -gt 0 ] || fail "odd offsets should have needed read-modify-write"
stop "$WORK/dev"
check_clean "$WORK/dev"
echo "PASS qemu-io"
