#!/usr/bin/env bash
# `dedup bench` end to end on a tiny matrix: it runs fio against the raw
# baseline and two backends, saves JSON that holds every run and a summary
# with ratios to raw, draws the SVG, and `--from` reports the saved file
# again without running anything. (A smoke test of the tool; the numbers
# themselves are never asserted.)
source "$(dirname "$0")/lib.sh"

log "raw, inram and disktable on both datasets, 4 KiB random writes"
"$DEDUP" bench --systems raw,inram,disktable --size 64M --runtime 2 --patterns rand4k \
    --dir "$WORK/bench" --out "$WORK/b.json" --plot "$WORK/b.svg" >"$WORK/table.txt" 2>"$WORK/bench.err" \
    || { cat "$WORK/bench.err"; fail "dedup bench failed"; }
python3 - "$WORK/b.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["settings"]["size"] == 64 << 20, d["settings"]
systems = {s["system"] for s in d["summary"]}
assert systems == {"raw", "inram", "disktable c25%"}, systems
assert len(d["runs"]) == 6, len(d["runs"])
for s in d["summary"]:
    assert s["mb_per_s"] > 0, s
    if s["system"] == "raw":
        assert s["vs_raw"] == 1.0, s
    else:
        assert s["vs_raw"] > 0 and s["dedup_ratio"] >= 1.0, s
        if s["dataset"] == "alldup":
            assert s["dedup_ratio"] > 100, s
PY
grep -q "<svg" "$WORK/b.svg" || fail "no SVG chart"
grep -q "disktable c25%" "$WORK/b.svg" || fail "the chart names no systems"

log "--from reports the saved run again"
"$DEDUP" bench --from "$WORK/b.json" >"$WORK/again.txt"
diff "$WORK/table.txt" "$WORK/again.txt" || fail "--from printed a different table"
"$DEDUP" bench --from "$WORK/b.json" --json | python3 -c "import json,sys; assert len(json.load(sys.stdin)) == 6"
echo '{"runs": []}' >"$WORK/bad.json"
if "$DEDUP" bench --from "$WORK/bad.json" 2>"$WORK/bad.err"; then fail "a foreign file was accepted"; fi
grep -q "not a file written by" "$WORK/bad.err" || { cat "$WORK/bad.err"; fail "unclear error for a foreign file"; }
[ -z "$(ls -A "$WORK/bench" 2>/dev/null)" ] || fail "bench left devices behind: $(ls "$WORK/bench")"
echo "PASS bench"
