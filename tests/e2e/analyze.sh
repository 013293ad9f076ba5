#!/usr/bin/env bash
# `dedup analyze` from the command line: a tree with known duplication
# (three copies of one directory, plus a shifted copy of a file) gives the
# expected fold factors in JSON and CSV; bad algorithms and paths get
# clear messages; a special file is reported and skipped.
source "$(dirname "$0")/lib.sh"

log "a tree with three copies of one directory and a shifted file"
python3 "$(dirname "$0")/make-tree.py" "$WORK/data/a" 8 5 >/dev/null
cp -a "$WORK/data/a" "$WORK/data/b"
cp -a "$WORK/data/a" "$WORK/data/c"
head -c 4M /dev/urandom >"$WORK/data/big"
{ head -c 100 /dev/urandom; cat "$WORK/data/big"; } >"$WORK/data/big-shifted"
mkfifo "$WORK/data/fifo"
"$DEDUP" analyze "$WORK/data" --algorithms wfh,fbh:4k,fastcdc:8k --json >"$WORK/a.json" 2>"$WORK/a.err"
python3 - "$WORK/a.json" "$WORK/data" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
root = sys.argv[2]
tree = sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(os.path.join(root, "a")) for f in fs)
big = os.path.getsize(os.path.join(root, "big"))
a = {x["label"]: x for x in d["algorithms"]}
assert d["skipped"] == 1 and "fifo" in d["first_skipped"][0], d["first_skipped"]
logical = 3 * tree + 2 * big + 100
for x in a.values():
    assert x["logical_bytes"] == logical, (x["label"], x["logical_bytes"], logical)
# WFH: the three copies fold to one; both big files are distinct.
assert a["wfh"]["unique_bytes"] == tree + 2 * big + 100, a["wfh"]
# FastCDC also finds the shifted copy; fixed blocks do not.
assert a["fastcdc-8K"]["unique_bytes"] < tree + big * 1.05, a["fastcdc-8K"]
assert a["fbh-4K"]["unique_bytes"] > tree + big * 1.9, a["fbh-4K"]
PY
"$DEDUP" analyze "$WORK/data" --algorithms fbh:4k --csv >"$WORK/a.csv" 2>/dev/null
head -1 "$WORK/a.csv" | grep -q "^algorithm,kind,nominal_bytes" || fail "CSV header"
[ "$(wc -l <"$WORK/a.csv")" = 2 ] || fail "one CSV row per algorithm"
"$DEDUP" analyze "$WORK/data" --algorithms fbh:4k >"$WORK/a.txt" 2>/dev/null
grep -q "^Best: fbh-4K folds" "$WORK/a.txt" || { cat "$WORK/a.txt"; fail "the table does not lead with the answer"; }

log "a disk image and the same image as a block device give the same answer"
# 8 MiB: 1 MiB of zeros, two copies of a 2 MiB random region, the rest zero.
head -c 2M /dev/urandom >"$WORK/region"
{ head -c 1M /dev/zero; cat "$WORK/region" "$WORK/region"; head -c 3M /dev/zero; } >"$WORK/disk.img"
"$DEDUP" analyze "$WORK/disk.img" --algorithms fbh:4k --json >"$WORK/img.json" 2>/dev/null
loop=$(losetup -f --show -r "$WORK/disk.img")
on_exit "losetup -d $loop"
"$DEDUP" analyze "$loop" --algorithms fbh:4k --json >"$WORK/dev.json" 2>"$WORK/dev.err" || { cat "$WORK/dev.err"; fail "analyze of $loop"; }
losetup -d "$loop"
python3 - "$WORK/img.json" "$WORK/dev.json" <<'PY'
import json, sys
img, dev = (json.load(open(p)) for p in sys.argv[1:3])
assert dev["skipped"] == 0 and dev["files"] == 1, dev
a, b = img["algorithms"][0], dev["algorithms"][0]
for k in ["logical_bytes", "unique_bytes", "zero_chunks", "fold_factor"]:
    assert a[k] == b[k], (k, a[k], b[k])
assert b["logical_bytes"] == 8 << 20
# 4 MiB of zero chunks counted apart; distinct: the region and one zero chunk.
assert b["zero_chunks"] == 1024 and abs(b["zero_share"] - 0.5) < 1e-9, b
assert b["unique_bytes"] == (2 << 20) + 4096, b
PY

log "--sample, --delta, --compression, --plot"
"$DEDUP" analyze "$WORK/data" --algorithms fbh:4k,fastcdc:8k --sample 4 --json >"$WORK/s.json" 2>/dev/null
python3 - "$WORK/s.json" "$WORK/a.json" <<'PY'
import json, sys
s, exact = (json.load(open(p)) for p in sys.argv[1:3])
assert s["sample_rate"] == 4
e = {x["label"]: x for x in exact["algorithms"]}
for x in s["algorithms"]:
    lo, hi = x["fold_factor_range"]
    assert lo <= e[x["label"]]["fold_factor"] <= hi, (x["label"], lo, hi)
PY
"$DEDUP" analyze "$WORK/data" --algorithms fbh:4k --delta --compression lz4,zstd --plot "$WORK/fold.svg" >"$WORK/d.txt" 2>/dev/null
grep -q "delta-encoded" "$WORK/d.txt" || { cat "$WORK/d.txt"; fail "no delta section"; }
grep -q "lz4 .* stored, fold" "$WORK/d.txt" || { cat "$WORK/d.txt"; fail "no compression section"; }
grep -q "<svg" "$WORK/fold.svg" || fail "no plot"
if "$DEDUP" analyze "$WORK/data" --delta --sample 4 2>"$WORK/bad.err"; then fail "--delta with --sample accepted"; fi
grep -q "cannot be combined" "$WORK/bad.err" || { cat "$WORK/bad.err"; fail "unclear error for --delta --sample"; }

log "bad input"
if "$DEDUP" analyze "$WORK/data" --algorithms fastcdc:8k:16k 2>"$WORK/bad.err"; then fail "min > avg accepted"; fi
grep -q "min ≤ avg ≤ max" "$WORK/bad.err" || { cat "$WORK/bad.err"; fail "unclear error for min > avg"; }
if "$DEDUP" analyze "$WORK/nothing-here" --algorithms wfh --json >"$WORK/none.json" 2>"$WORK/none.err"; then fail "no data read, yet exit 0"; fi
grep -q "no data read" "$WORK/none.err" || { cat "$WORK/none.err"; fail "unclear message for empty input"; }
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['files']==0 and d['skipped']==1" "$WORK/none.json"
log "a link named on the command line is followed; links inside are counted"
ln -s "$WORK/data/a" "$WORK/link-to-a"
ln -s "$WORK/data/a" "$WORK/data/link-inside"
"$DEDUP" analyze "$WORK/link-to-a" --algorithms wfh --json >"$WORK/l.json" 2>/dev/null
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['files'] > 0, d" "$WORK/l.json"
"$DEDUP" analyze "$WORK/data" --algorithms wfh --json >"$WORK/l2.json" 2>/dev/null
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['symlinks_not_followed'] == 1, d['symlinks_not_followed']" "$WORK/l2.json"
log "a compressed tar stream gets a hint, Ctrl-C mid-file reports what was read"
tar -C "$WORK/data" -czf "$WORK/a.tar.gz" a
"$DEDUP" analyze --tar "$WORK/a.tar.gz" --algorithms wfh >"$WORK/gz.txt" 2>&1 || true
grep -q "gzip -dc FILE" "$WORK/gz.txt" || { cat "$WORK/gz.txt"; fail "no hint for a gzip stream"; }
truncate -s 3G "$WORK/big.img"
"$DEDUP" analyze "$WORK/big.img" --algorithms rabin:8k --threads 1 --json >"$WORK/int.json" 2>/dev/null &
pid=$!
sleep 2
kill -INT $pid
wait $pid || true
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['interrupted'] and 0 < d['algorithms'][0]['logical_bytes'] < 3<<30, d" "$WORK/int.json"
rm -f "$WORK/big.img"
echo "PASS analyze"
