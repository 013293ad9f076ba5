#!/usr/bin/env bash
# nbdinfo sees the device as the plugin advertises it; nbdcopy of random
# data and of repeated data reads back identical, and the dedup ratio
# reported by `dedup status` is what the data implies.
source "$(dirname "$0")/lib.sh"

log "create and serve"
"$DEDUP" create "$WORK/rand" --size 256M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
"$DEDUP" create "$WORK/rep" --size 256M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
serve "$WORK/rand"
serve "$WORK/rep"

log "nbdinfo"
nbdinfo --json "$(uri "$WORK/rand")" >"$WORK/info.json"
python3 - "$WORK/info.json" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))["exports"][0]
assert e["export-size"] == 256 << 20, e["export-size"]
for flag in ["can_flush", "can_fua", "can_trim", "can_zero", "can_multi_conn", "can_fast_zero"]:
    assert e[flag], flag
assert not e["is_read_only"]
PY

log "nbdcopy random data"
head -c 64M /dev/urandom >"$WORK/random.bin"
nbdcopy --flush "$WORK/random.bin" "$(uri "$WORK/rand")"
rm -f "$WORK/out.bin"
nbdcopy "$(uri "$WORK/rand")" "$WORK/out.bin"
cmp -n $((64 << 20)) "$WORK/out.bin" "$WORK/random.bin" || fail "random data read back differs"
[ "$(status "$WORK/rand" chunks_stored)" = 16384 ] || fail "random data: expected 16384 stored chunks"
near "$(status "$WORK/rand" dedup_ratio)" 1.0 0.001

log "nbdcopy repeated data (1 MiB repeated 48 times)"
head -c 1M /dev/urandom >"$WORK/one.bin"
for _ in $(seq 48); do cat "$WORK/one.bin"; done >"$WORK/repeated.bin"
nbdcopy --flush "$WORK/repeated.bin" "$(uri "$WORK/rep")"
rm -f "$WORK/out.bin"
nbdcopy "$(uri "$WORK/rep")" "$WORK/out.bin"
cmp -n $((48 << 20)) "$WORK/out.bin" "$WORK/repeated.bin" || fail "repeated data read back differs"
[ "$(status "$WORK/rep" chunks_stored)" = 256 ] || fail "repeated data: expected 256 stored chunks"
[ "$(status "$WORK/rep" chunks_mapped)" = 12288 ] || fail "repeated data: expected 12288 mapped chunks"
near "$(status "$WORK/rep" dedup_ratio)" 48 0.001

log "the rest of the device reads as zeros; block status reports it as a hole"
cmp -i $((48 << 20)):0 "$WORK/out.bin" /dev/zero -n $((208 << 20)) || fail "unwritten space is not zero"
nbdinfo --map "$(uri "$WORK/rep")" | grep -q "hole,zero" || fail "no hole reported by block status"

log "stop cleanly, reopen, data intact"
stop "$WORK/rep"
serve "$WORK/rep"
rm "$WORK/out.bin"
nbdcopy "$(uri "$WORK/rep")" "$WORK/out.bin"
cmp -n $((48 << 20)) "$WORK/out.bin" "$WORK/repeated.bin" || fail "data lost across restart"
stop "$WORK/rep"
stop "$WORK/rand"
check_clean "$WORK/rep"
check_clean "$WORK/rand"
echo "PASS nbdcopy"
