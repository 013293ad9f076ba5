#!/usr/bin/env bash
# A real crash: `dedup serve` of a crash-safe backend under a fio write load
# with periodic flushes, while a checker writes patterns to its own region,
# each write followed by a flush and logged once the flush returned. nbdkit
# is killed with SIGKILL mid-run, twice. After each restart (no recovery
# flag needed) every logged write reads back intact (a write in flight at
# the kill may have landed or not, chunk by chunk), and `dedup check --data`
# is clean.
source "$(dirname "$0")/lib.sh"
[ "$BACKEND" != inram ] || fail "crash-kill needs a crash-safe backend (BACKEND=disktable|cowbtree|lsm)"

"$DEDUP" create "$WORK/dev" --size 256M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
U=$(uri "$WORK/dev")
region=$((128 << 20))
log="$WORK/checker.log"
: >"$log"

# checker N: write pattern writes to the second half, logging try/ok.
checker() {
    local i=$1 off pat
    while :; do
        off=$((region + (i % 384) * 65536))
        pat=$((i % 250 + 1))
        echo "try $off $pat" >>"$log"
        qemu-io -f raw -c "write -P $pat $off 64k" -c "flush" "$U" >/dev/null 2>&1 || return 0
        echo "ok $off $pat" >>"$log"
        i=$((i + 1))
    done
}

for round in 1 2; do
    log "round $round: load, checker, SIGKILL"
    serve "$WORK/dev"
    fio --name=load --ioengine=nbd --uri="$U" --rw=randwrite --bs=4k --size=128M --iodepth=8 \
        --numjobs=2 --time_based --runtime=60 --fsync=32 --dedupe_percentage=40 \
        --output="$WORK/fio.$round.txt" >/dev/null 2>&1 &
    fio_pid=$!
    checker $((round * 1000)) &
    checker_pid=$!
    sleep 4
    kill -KILL "$(cat "$WORK/dev/nbdkit.pid")"
    wait "$(cat "$WORK/dev.servepid")" || true
    wait "$checker_pid" || true
    kill "$fio_pid" 2>/dev/null || true
    wait "$fio_pid" || true
    grep -c "^ok" "$log" >/dev/null || fail "the checker wrote nothing before the kill"

    log "round $round: restart and verify $(grep -c '^ok' "$log") logged writes"
    serve "$WORK/dev"
    rm -f "$WORK/out.bin"
    nbdcopy "$U" "$WORK/out.bin"
    python3 - "$WORK/out.bin" "$log" "$region" <<'PY'
import sys
image, log, region = open(sys.argv[1], "rb").read(), sys.argv[2], int(sys.argv[3])
state = {}  # offset -> (last ok pattern, pattern in flight or None)
for line in open(log):
    kind, off, pat = line.split()
    off, pat = int(off), int(pat)
    ok, _ = state.get(off, (0, None))
    state[off] = (pat, None) if kind == "ok" else (ok, pat)
bad = 0
for off, (ok, trying) in state.items():
    for c in range(off, off + 65536, 4096):
        chunk = image[c:c + 4096]
        allowed = {bytes([ok]) * 4096}
        if trying is not None:
            allowed.add(bytes([trying]) * 4096)
        if chunk not in allowed:
            bad += 1
            print(f"chunk at {c}: expected pattern {ok}" + (f" or {trying}" if trying else "") + f", found byte {chunk[0]}")
sys.exit(1 if bad else 0)
PY
    stop "$WORK/dev"
    check_clean "$WORK/dev"
done
echo "PASS crash-kill ($BACKEND)"
