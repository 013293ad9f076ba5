#!/usr/bin/env bash
# `dedup trace` and `dedup replay` on inputs with known answers:
# - N writes of K distinct contents: the trace's dedup ratio and the
#   device's are N/K;
# - the replayed device holds exactly what the trace implies, checked over
#   NBD against an image this script computes itself (its own copy of the
#   content generator), and by `replay --verify`;
# - malformed lines are reported with their line numbers and skipped, or
#   refused with --strict; FIU lines work; a trace beyond the device is
#   refused unless --wrap;
# - `dedup serve --record` captures a real client's writes, and replaying
#   the recording on a fresh device gives the same dedup ratio;
# - `dedup trace gen` presets reach their dedup ratios.
source "$(dirname "$0")/lib.sh"

json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

log "a trace of N=240 writes of K=12 contents, with partial blocks, trims and flushes"
python3 - "$WORK/known.trace" "$WORK/expected.img" <<'PY'
import sys, hashlib
trace, image = sys.argv[1:]
SIZE = 4 << 20
M = (1 << 64) - 1
def fill(seed, n):
    # The replayer's generator (dedup-trace content.rs), written again here
    # so the check does not trust the code it checks.
    lo = int.from_bytes(seed[:8], "little"); hi = int.from_bytes(seed[8:], "little") ^ 0x6a09e667f3bcc908
    def mix(s):
        s = (s + 0x9e3779b97f4a7c15) & M
        z = s
        z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M
        z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M
        return s, z ^ (z >> 31)
    out = bytearray()
    while len(out) < n:
        lo, a = mix(lo); hi, b = mix(hi)
        rot = ((b << 17) | (b >> 47)) & M
        out += (a ^ rot).to_bytes(8, "little")
    return bytes(out[:n])
seeds = [hashlib.md5(b"content %d" % k).digest() for k in range(12)]
img = bytearray(SIZE)
lines = ["# dedup-trace 1"]
t = 0
for i in range(240):
    off = (i * 7919 % 1000) * 4096          # 240 distinct blocks
    s = seeds[i % 12]
    img[off:off + 4096] = fill(s, 4096)
    lines.append(f"{t} W {off} 4096 {s.hex()}"); t += 1000
    if i % 50 == 49:
        lines.append(f"{t} F 0 0"); t += 1000
# A partial-block write across two blocks (its own contents) and a trim.
p1, p2 = hashlib.md5(b"p1").digest(), hashlib.md5(b"p2").digest()
off = 1001 * 4096 + 1000
img[off:off + 3096] = fill(p1, 3096); img[off + 3096:off + 5096] = fill(p2, 2000)
lines.append(f"{t} W {off} 5096 {p1.hex()},{p2.hex()}"); t += 1000
img[1003 * 4096 + 512:1003 * 4096 + 1024] = bytes(512)
lines.append(f"{t} T {1003 * 4096 + 512} 512"); t += 1000
lines.append(f"{t} F 0 0")
open(trace, "w").write("\n".join(lines) + "\n")
open(image, "wb").write(img)
PY
"$DEDUP" trace stats "$WORK/known.trace" --json >"$WORK/stats.json"
[ "$(json "$WORK/stats.json" 'd["writes"]')" = 241 ] || fail "expected 241 writes"
# 240 blocks of 12 contents, plus two blocks of two more contents.
near "$(json "$WORK/stats.json" 'd["dedup_ratio"]')" "$(python3 -c 'print(242/14)')" 1e-9
[ "$(json "$WORK/stats.json" 'd["flushes"]')" = 5 ] || fail "expected 5 flushes"

log "replay it on a $BACKEND device and read the device back over NBD"
"$DEDUP" create "$WORK/dev" --size 4M --backend "$BACKEND" >/dev/null
"$DEDUP" replay "$WORK/known.trace" "$WORK/dev" --verify --json >"$WORK/replay.json"
[ "$(json "$WORK/replay.json" 'd["device"]["writes"]')" = 241 ] || fail "replay wrote the wrong number of requests"
[ "$(json "$WORK/replay.json" 'd["verified_blocks"]')" -ge 242 ] || fail "--verify checked too few blocks"
# Device: 240 full blocks of 12 contents + 2 partial blocks of own content.
near "$(json "$WORK/replay.json" 'd["dedup_ratio"]')" "$(python3 -c 'print(242/14)')" 1e-6
serve "$WORK/dev"
nbdcopy "$(uri "$WORK/dev")" "$WORK/got.img"
cmp "$WORK/got.img" "$WORK/expected.img" || fail "the replayed device differs from the image the trace implies"
stop "$WORK/dev"
check_clean "$WORK/dev"

log "malformed lines: skipped with their line numbers, or refused with --strict"
{ sed -n 1,3p "$WORK/known.trace"; echo "5 W 0 4096 nothex"; echo "6 Q 0 4096"; sed -n '4,$p' "$WORK/known.trace"; } >"$WORK/bad.trace"
"$DEDUP" create "$WORK/dev2" --size 4M --backend "$BACKEND" >/dev/null
"$DEDUP" replay "$WORK/bad.trace" "$WORK/dev2" --json >"$WORK/bad.json" 2>"$WORK/bad.err" || { cat "$WORK/bad.err"; fail "a lenient replay failed"; }
grep -q "skipped 2 malformed" "$WORK/bad.err" || { cat "$WORK/bad.err"; fail "skipped lines not reported"; }
grep -q "line 4: block \`nothex\`" "$WORK/bad.err" || { cat "$WORK/bad.err"; fail "line 4 not named"; }
grep -q "line 5: unknown operation" "$WORK/bad.err" || { cat "$WORK/bad.err"; fail "line 5 not named"; }
[ "$(json "$WORK/bad.json" 'd["skipped_lines"]')" = 2 ] || fail "skipped_lines not in the JSON"
if "$DEDUP" replay "$WORK/bad.trace" "$WORK/dev2" --strict 2>"$WORK/strict.err"; then fail "--strict accepted a bad trace"; fi
grep -q "line 4" "$WORK/strict.err" || { cat "$WORK/strict.err"; fail "--strict did not name line 4"; }

log "FIU lines; beyond the device: refused, or --wrap"
cat >"$WORK/fiu.trace" <<'T'
89966527788578 4893 syslogd 0 8 W 6 0 531e779ca0ab2d3be6d2f9fca2d2f5e1
89966527788600 4893 syslogd 8 8 W 6 0 531e779ca0ab2d3be6d2f9fca2d2f5e1
89966527788700 4893 syslogd 16 16 W 6 0 0f343b0931126a20f133d67c2b018a3b
89966527788800 4893 syslogd 0 8 R 6 0 531e779ca0ab2d3be6d2f9fca2d2f5e1
89966527788900 4893 syslogd 20480 8 W 6 0 0f343b0931126a20f133d67c2b018a3b
T
"$DEDUP" trace stats "$WORK/fiu.trace" --json >"$WORK/fiu.json"
near "$(json "$WORK/fiu.json" 'd["dedup_ratio"]')" "$(python3 -c 'print(5/4)')" 1e-9
[ "$(json "$WORK/fiu.json" 'd["span_bytes"]')" = $((20488 * 512)) ] || fail "FIU span"
"$DEDUP" create "$WORK/small" --size 4M --backend "$BACKEND" >/dev/null
if "$DEDUP" replay "$WORK/fiu.trace" "$WORK/small" 2>"$WORK/far.err"; then fail "a trace beyond the device was replayed"; fi
grep -q -- "--wrap" "$WORK/far.err" || { cat "$WORK/far.err"; fail "the refusal does not name --wrap"; }
"$DEDUP" replay "$WORK/fiu.trace" "$WORK/small" --wrap --verify --json >"$WORK/wrap.json"
[ "$(json "$WORK/wrap.json" 'd["device"]["wrapped"]')" = 1 ] || fail "expected one wrapped request"

log "serve --record captures a client's writes; replaying the recording dedups alike"
"$DEDUP" create "$WORK/rec" --size 64M --backend "$BACKEND" >/dev/null
serve "$WORK/rec" --record "$WORK/rec.trace"
head -c 2M /dev/urandom >"$WORK/one.bin"
for _ in 1 2 3 4; do cat "$WORK/one.bin"; done >"$WORK/four.bin"
nbdcopy --flush "$WORK/four.bin" "$(uri "$WORK/rec")"
orig_ratio=$(status "$WORK/rec" dedup_ratio)
stop "$WORK/rec"
"$DEDUP" trace stats "$WORK/rec.trace" --json >"$WORK/rec.json"
[ "$(json "$WORK/rec.json" 'd["written_bytes"]')" = $((8 << 20)) ] || fail "the recording lost writes"
[ "$(json "$WORK/rec.json" 'd["flushes"]')" -ge 1 ] || fail "the recording has no flush"
near "$(json "$WORK/rec.json" 'd["dedup_ratio"]')" 4 1e-9
"$DEDUP" create "$WORK/again" --size 64M --backend "$BACKEND" >/dev/null
"$DEDUP" replay "$WORK/rec.trace" "$WORK/again" --baseline --verify --json >"$WORK/again.json"
near "$(json "$WORK/again.json" 'd["dedup_ratio"]')" "$orig_ratio" 1e-9
python3 - "$WORK/again.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["baseline"]["bytes_written"] == d["device"]["bytes_written"] == 8 << 20, d
assert d["ratio_to_raw"] > 0 and d["device"]["lat_p99_us"] >= d["device"]["lat_p50_us"] > 0, d
PY
[ -z "$(ls "$WORK/again" | grep baseline)" ] || fail "the baseline file was left behind"

log "a pipe is refused (the trace is read more than once); a bad --record path leaves the device clean"
if "$DEDUP" replay <(cat "$WORK/known.trace") "$WORK/dev2" 2>"$WORK/pipe.err"; then fail "a pipe was replayed"; fi
grep -q "not a regular file" "$WORK/pipe.err" || { cat "$WORK/pipe.err"; fail "unclear error for a pipe"; }
if "$DEDUP" serve "$WORK/dev2" --record "$WORK/no/such/dir/t.trace" >"$WORK/badrec.log" 2>&1; then fail "serve accepted an impossible --record path"; fi
grep -q "cannot create the trace file" "$WORK/badrec.log" || { cat "$WORK/badrec.log"; fail "unclear error for --record"; }
serve "$WORK/dev2"
stop "$WORK/dev2"

log "trace gen presets reach their ratios"
for p in web:2.33 mail:10.29 homes:3.43; do
    "$DEDUP" trace gen "$WORK/${p%%:*}.trace" --preset "${p%%:*}" --size 32M --json >"$WORK/gen.json"
    near "$(json "$WORK/gen.json" 'd["dedup_ratio"]')" "${p##*:}" 0.05
done
echo "PASS replay"
