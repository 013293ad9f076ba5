#!/usr/bin/env bash
# The backup store from the command line (issue 17): a tar stream of a tree
# backed up twice (the second all duplicate), then again after a few files
# change; every backup restores byte for byte; a random 64 MiB stream round
# trips; --json parses; bad input is refused in plain words.
source "$(dirname "$0")/lib.sh"

R=$WORK/repo
# field FILE KEY: one field of a JSON report.
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
# backup NAME FILE [args...]: back FILE up as NAME with --json into $WORK/NAME.json.
backup() {
    local name=$1 file=$2
    shift 2
    "$DEDUP" backup "$R" "$name" --stdin --json "$@" <"$file" >"$WORK/$name.json" \
        || fail "backup $name"
    echo "   $name: $(field "$WORK/$name.json" bytes_in) bytes in, $(field "$WORK/$name.json" bytes_new) new," \
        "dedup ratio $(field "$WORK/$name.json" dedup_ratio), $(printf %.0f "$(field "$WORK/$name.json" mb_per_sec)") MB/s"
}
# restored NAME ORIGINAL: restore NAME to a file and compare.
restored() {
    "$DEDUP" restore "$R" "$1" "$WORK/$1.out" >/dev/null || fail "restore $1"
    cmp "$WORK/$1.out" "$2" || fail "backup $1 restored differently"
    rm -f "$WORK/$1.out"
}

log "a FastCDC repository; a tar stream of a tree backed up twice"
"$DEDUP" store init "$R" --segments fastcdc --json >"$WORK/init.json"
[ "$(field "$WORK/init.json" segments)" = "FastCDC 1.0 KiB-16.0 KiB avg 4.0 KiB" ] || fail "init segments"
python3 "$(dirname "$0")/make-tree.py" "$WORK/tree" 24 5 >/dev/null
tar -C "$WORK" --sort=name --mtime=@0 -cf "$WORK/t1.tar" tree
backup t1 "$WORK/t1.tar" --group tree
backup t2 "$WORK/t1.tar" --group tree
python3 - "$WORK/t1.json" "$WORK/t2.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["bytes_in"] > 24 << 20 and a["segments_new"] > 0 and a["containers_written"] >= 1, a
# Random file contents: the first backup finds (almost) nothing twice.
assert a["bytes_new"] > 0.95 * a["bytes_in"], a
assert b["bytes_in"] == a["bytes_in"], b
assert b["bytes_new"] == 0 and b["segments_new"] == 0 and b["containers_written"] == 0, b
assert b["dedup_ratio"] is None and b["segments_duplicate"] > 0, b
PY

log "a few files changed, one inserted into: only the changes are new"
mapfile -t files < <(find "$WORK/tree" -type f -size +100k | sort | head -3)
[ "${#files[@]}" = 3 ] || fail "the tree has too few large files"
printf 'changed' | dd of="${files[0]}" bs=1 seek=5000 conv=notrunc status=none
{ head -c 1000 "${files[1]}"; echo inserted; tail -c +1001 "${files[1]}"; } >"$WORK/ins" && cat "$WORK/ins" >"${files[1]}"
head -c 100000 /dev/urandom >>"${files[2]}"
tar -C "$WORK" --sort=name --mtime=@0 -cf "$WORK/t3.tar" tree
backup t3 "$WORK/t3.tar" --group tree
python3 - "$WORK/t3.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
# 100 KB appended plus a few segments around each edit (and tar headers).
assert 100_000 <= c["bytes_new"] < 400_000, c
assert c["dedup_ratio"] > 50, c
PY
restored t1 "$WORK/t1.tar"
restored t2 "$WORK/t1.tar"
restored t3 "$WORK/t3.tar"
"$DEDUP" restore "$R" t3 - 2>/dev/null | cmp - "$WORK/t3.tar" || fail "restore to stdout differs"

log "a random 64 MiB stream"
head -c 64M /dev/urandom >"$WORK/rand"
backup rand "$WORK/rand"
[ "$(field "$WORK/rand.json" bytes_in)" = $((64 << 20)) ] || fail "rand bytes_in"
restored rand "$WORK/rand"
"$DEDUP" backup "$R" empty --stdin </dev/null >"$WORK/empty.txt" || fail "an empty stream"
restored empty /dev/null

log "list, stats, delete as JSON"
"$DEDUP" list "$R" --json >"$WORK/list.json"
"$DEDUP" store stats "$R" --json >"$WORK/stats.json"
python3 - "$WORK/list.json" "$WORK/stats.json" <<'PY'
import json, sys
l, s = (json.load(open(p)) for p in sys.argv[1:3])
assert [b["name"] for b in l] == ["empty", "rand", "t1", "t2", "t3"], l
assert {b["group"] for b in l if b["name"].startswith("t")} == {"tree"}, l
assert s["backups"] == 5 and s["containers"] >= 2 and not s["damaged_containers"], s
assert s["logical_bytes"] == sum(b["bytes_in"] for b in l), s
t1 = next(b for b in l if b["name"] == "t1")
# Stored about once: random data does not compress, so ~t1 + 64 MiB.
assert s["bytes_stored"] < 1.1 * (t1["bytes_in"] + (64 << 20)), s
assert s["fold_factor"] > 1.5, s
PY
"$DEDUP" store stats "$R" | grep -q "5 backups" || fail "stats text"
"$DEDUP" delete "$R" t2 --json >"$WORK/del.json"
grep -q "not built yet" "$WORK/del.json" || fail "delete does not say gc is not built"
"$DEDUP" list "$R" | grep -q "^t2 " && fail "t2 still listed after delete"
restored t1 "$WORK/t1.tar"

log "bad input is refused in plain words"
expect_fail "no backup named nosuch" "$DEDUP" restore "$R" nosuch "$WORK/x"
[ -e "$WORK/x" ] && fail "a failed restore left its target"
expect_fail "no backup named t2" "$DEDUP" delete "$R" t2
touch "$WORK/exists"
expect_fail "already exists; refusing to overwrite" "$DEDUP" restore "$R" t1 "$WORK/exists"
[ -s "$WORK/exists" ] && fail "the existing file was written"
"$DEDUP" restore "$R" t1 "$WORK/exists" --force >/dev/null
cmp "$WORK/exists" "$WORK/t1.tar" || fail "restore --force"
expect_fail "files and directories .* not built yet" "$DEDUP" backup "$R" p "$WORK/tree" --stdin
expect_fail "give --stdin" "$DEDUP" backup "$R" p
expect_fail "backup t1 already exists" "$DEDUP" backup "$R" t1 --stdin </dev/null
expect_fail "invalid backup or group name" "$DEDUP" backup "$R" "a/b" --stdin </dev/null
expect_fail "not a dedup repository" "$DEDUP" list "$WORK/tree"
expect_fail "not empty" "$DEDUP" store init "$WORK/tree"
"$DEDUP" list "$R" | grep -q "^p " && fail "a refused backup was listed"
echo "PASS backup"
