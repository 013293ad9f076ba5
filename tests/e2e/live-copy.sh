#!/usr/bin/env bash
# A copy of the metadata taken while the device is served, put back after
# a crash (kill -9), must be refused: it has the live file's generation, and
# only the commit number the data device records tells it from the
# metadata that belongs with the data. Then `check --repair --data` keeps it
# on purpose (every chunk verified), and the device serves and checks clean.
source "$(dirname "$0")/lib.sh"

"$DEDUP" create "$WORK/dev" --size 256M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
U=$(uri "$WORK/dev")
serve "$WORK/dev"
qemu-io -f raw -c "write -P 1 0 32M" -c "flush" "$U" >/dev/null
log "copy the metadata while serving, write and flush more, kill -9"
cp --sparse=always "$WORK/dev/meta" "$WORK/meta.live"
qemu-io -f raw -c "write -P 2 0 32M" -c "write -P 3 64M 32M" -c "flush" "$U" >/dev/null
kill -KILL "$(cat "$WORK/dev/nbdkit.pid")"
wait "$(cat "$WORK/dev.servepid")" || true
cp --sparse=always "$WORK/dev/meta" "$WORK/meta.crashed"
cp --sparse=always "$WORK/meta.live" "$WORK/dev/meta"

log "the copy put back is refused by check, status and serve"
expect_fail "older than its data" "$DEDUP" check "$WORK/dev"
expect_fail "older than its data" "$DEDUP" status "$WORK/dev"
expect_fail "older than its data" "$DEDUP" serve "$WORK/dev"

log "the metadata that belongs with the data serves every flushed write"
cp --sparse=always "$WORK/meta.crashed" "$WORK/dev/meta"
serve "$WORK/dev"
qemu-io -f raw -c "read -P 2 0 32M" -c "read -P 3 64M 32M" "$U" >/dev/null \
    || fail "a flushed write was lost after the crash"
stop "$WORK/dev"
check_clean "$WORK/dev"

log "kept on purpose: check --repair --data verifies it, then it serves"
serve "$WORK/dev"
qemu-io -f raw -c "write -P 4 0 32M" -c "flush" "$U" >/dev/null
cp --sparse=always "$WORK/dev/meta" "$WORK/meta.live"
qemu-io -f raw -c "write -P 5 0 32M" -c "flush" "$U" >/dev/null
kill -KILL "$(cat "$WORK/dev/nbdkit.pid")"
wait "$(cat "$WORK/dev.servepid")" || true
cp --sparse=always "$WORK/meta.live" "$WORK/dev/meta"
"$DEDUP" check "$WORK/dev" --repair --data >"$WORK/repair.out" || true
check_clean "$WORK/dev"
serve "$WORK/dev"
python3 - "$U" <<'PY' || fail "a block kept by the repair reads neither its content as of the copy nor zeros"
import subprocess, sys
out = subprocess.run(["nbdcopy", sys.argv[1], "-"], capture_output=True, check=True).stdout
bad = [i for i in range(0, 32 << 20, 4096) if out[i:i + 4096] not in (b"\4" * 4096, b"\0" * 4096)]
sys.exit(1 if bad else 0)
PY
stop "$WORK/dev"
echo "PASS live-copy ($BACKEND)"
