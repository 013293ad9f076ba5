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

log "a directory as a tar stream (nbdcopy) and as files on ext4 (nbdfuse + loop)"
python3 "$(dirname "$0")/make-tree.py" "$WORK/tree/v1" 32 3 >/dev/null
cp -a "$WORK/tree/v1" "$WORK/tree/v2"      # a second "release": all duplicates
"$DEDUP" bench --systems raw,inram --datasets tar,files --source "$WORK/tree" --size 256M \
    --dir "$WORK/bench" --out "$WORK/t.json" >"$WORK/ttable.txt" 2>"$WORK/tbench.err" \
    || { cat "$WORK/tbench.err"; fail "dedup bench on a directory failed"; }
python3 - "$WORK/t.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
runs = {(r["system"], r["dataset"]): r for r in d["runs"]}
assert set(runs) == {(s, ds) for s in ("raw", "inram") for ds in ("tar", "files")}, set(runs)
tar = runs[("raw", "tar")]["bytes"]
assert 64 << 20 < tar < 66 << 20, tar          # two 32 MiB copies plus tar headers
for (system, ds), r in runs.items():
    assert r["bytes"] == tar and r["mb_per_s"] > 0 and r["physical_bytes"] > 0, r
# Two identical copies as files on ext4 (4 KiB-aligned): the device stores
# one, the raw image both (bench makes ext4 with 4 KiB blocks; mke2fs
# alone would pick 1 KiB on a device this small). ext4's journal and
# metadata are unique, hence the margins. (In the tar stream, members are
# 512-byte aligned, so the copies rarely line up with 4 KiB chunks: no
# claim there.)
dev, raw = runs[("inram", "files")], runs[("raw", "files")]
print(f"files: dedup ratio {dev['dedup_ratio']:.2f}, stored {dev['physical_bytes']} vs raw {raw['physical_bytes']}")
assert dev["dedup_ratio"] > 1.8, dev["dedup_ratio"]
assert dev["physical_bytes"] < 0.6 * raw["physical_bytes"], (dev, raw)
assert runs[("inram", "tar")]["dedup_ratio"] >= 1.0
PY
grep -q "extracted onto ext4" "$WORK/ttable.txt" || fail "the table has no files section"
! mount | grep -q "$WORK" || fail "bench left a mount behind"
! losetup -a | grep -q "$WORK" || fail "bench left a loop device behind"
[ -z "$(ls -A "$WORK/bench" 2>/dev/null)" ] || fail "bench left files behind: $(ls "$WORK/bench")"
echo "PASS bench"
