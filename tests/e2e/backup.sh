#!/usr/bin/env bash
# The backup store from the command line (issue 17): a tar stream of a tree
# backed up twice (the second all duplicate), then again after a few files
# change; every backup restores byte for byte; a random 64 MiB stream round
# trips, and so does one whose recipe is written in parts (then deleted and
# collected to the last part); a stream restored onto a loop device is
# written in place, a device too small for it or mounted is refused
# untouched, and a fifo carries it; a directory tree backed up as files (a copy
# of /usr/share/doc plus special cases, a hard-linked symlink among them)
# restores with the same contents, types, modes, owners, times and hard
# links; a flipped byte costs only the file or stream range that needs it,
# which is named (exit 1), and --include of an intact file succeeds; a
# stream restored onto a symlink replaces the link; --json parses; bad
# input is refused in plain words.
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
[ "$(field "$WORK/init.json" segments)" = "FastCDC 2.0 KiB-32.0 KiB avg 8.0 KiB" ] || fail "init segments"
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

log "a stream restored onto a block device (a loop device), written in place"
# 9 MiB and 4,097 bytes: direct writes, then an unaligned tail.
head -c $((9 * 1048576 + 4097)) /dev/urandom >"$WORK/img"
RD=$WORK/repo-dev
"$DEDUP" store init "$RD" >/dev/null || fail "init $RD"
"$DEDUP" backup "$RD" img --stdin <"$WORK/img" >/dev/null || fail "backup img"
truncate -s 16M "$WORK/disk"
loop=$(losetup -f --show "$WORK/disk")
on_exit "losetup -d $loop"
expect_fail "already exists" "$DEDUP" restore "$RD" img "$loop"
"$DEDUP" restore "$RD" img "$loop" --force >/dev/null || fail "restore onto $loop"
cmp -n $((9 * 1048576 + 4097)) "$loop" "$WORK/img" || fail "the device holds other bytes than the backup"
# Past the backup's end the device is as it was (zeros) up to its own end.
tail_cmp=$(cmp -i $((9 * 1048576 + 4097)) "$loop" /dev/zero 2>&1 || true)
[[ $tail_cmp == *EOF* ]] || fail "the restore wrote past the backup's end: $tail_cmp"
# A device smaller than the backup: refused in plain words.
truncate -s 4M "$WORK/small"
small=$(losetup -f --show "$WORK/small")
on_exit "losetup -d $small"
expect_fail "nothing was written" "$DEDUP" restore "$RD" img "$small" --force
cmp -n $((4 << 20)) "$small" /dev/zero || fail "a refused restore wrote to $small"
# A mounted one: refused (opened exclusively), the file system untouched.
truncate -s 16M "$WORK/fs.img"
mkfs.ext4 -q -F "$WORK/fs.img"
mounted=$(losetup -f --show "$WORK/fs.img")
on_exit "losetup -d $mounted"
mkdir -p "$WORK/mnt"
mount "$mounted" "$WORK/mnt"
on_exit "umount $WORK/mnt 2>/dev/null"
expect_fail "mounted" "$DEDUP" restore "$RD" img "$mounted" --force
umount "$WORK/mnt"
e2fsck -fn "$mounted" >/dev/null || fail "a refused restore damaged the file system on $mounted"
# A fifo: written as it comes, with nothing to sync (fsync on it is EINVAL).
mkfifo "$WORK/fifo"
timeout 120 cat "$WORK/fifo" >"$WORK/fifo.out" &
reader=$!
on_exit "kill $reader 2>/dev/null"
"$DEDUP" restore "$RD" img "$WORK/fifo" --force >/dev/null || fail "restore into a fifo"
wait "$reader" || fail "the fifo's reader failed"
cmp "$WORK/fifo.out" "$WORK/img" || fail "the fifo carried other bytes than the backup"

log "a stream whose recipe is written in parts (65,536 segments a part; 512-byte segments)"
R2=$WORK/repo-parts
"$DEDUP" store init "$R2" --segments fixed:512 >/dev/null || fail "init fixed:512"
{ head -c 16M "$WORK/rand"; head -c 48M /dev/zero; tail -c 16M "$WORK/rand"; } >"$WORK/parts"
"$DEDUP" backup "$R2" parts --stdin <"$WORK/parts" >/dev/null || fail "backup of a recipe in parts"
parts=$(find "$R2/recipes" -name '*.p[0-9a-f]*' | wc -l)
[ "$parts" = 3 ] || fail "expected 3 recipe parts (163,840 segments), found $parts"
"$DEDUP" restore "$R2" parts - 2>/dev/null | cmp - "$WORK/parts" || fail "a recipe in parts restored differently"
"$DEDUP" store check "$R2" --data >/dev/null || fail "store check of a recipe in parts"
"$DEDUP" delete "$R2" parts >/dev/null || fail "delete of a recipe in parts"
"$DEDUP" gc "$R2" >/dev/null || fail "gc after deleting a recipe in parts"
[ -z "$(ls -A "$R2/recipes")" ] || fail "recipe parts left after delete and gc: $(ls -A "$R2/recipes")"
rm -f "$WORK/parts"

log "a directory tree as files: /usr/share/doc plus special cases"
F=$WORK/files
mkdir -p "$F"
cp -a /usr/share/doc "$F/doc"
S=$F/special
mkdir -p "$S/empty-dir" "$S/sticky" "$S/setgid-dir" "$S/read-only" "$S/deep/er/est"
: >"$S/empty-file"
head -c 3000000 /dev/urandom >"$S/deep/er/est/big"
cp "$S/deep/er/est/big" "$S/big-copy"
echo suid >"$S/suid" && chmod 4755 "$S/suid"
echo sgid >"$S/sgid" && chmod 2711 "$S/sgid"
echo none >"$S/mode-0000" && chmod 0000 "$S/mode-0000"
echo owned >"$S/owned" && chown 1234:5678 "$S/owned"
echo linked >"$S/hard-1" && ln "$S/hard-1" "$S/deep/hard-2" && ln "$S/hard-1" "$S/hard-3"
ln -s deep/er/est/big "$S/link"
# A hard link to a symlink (cp -al and rsnapshot make them).
ln -s hard-1 "$S/sym-linked" && ln -P "$S/sym-linked" "$S/sym-linked-2"
ln -s /no/such/target "$S/dangling"
ln -s nowhere "$S/owned-link" && chown -h 4321:8765 "$S/owned-link"
mkfifo -m 0620 "$S/fifo"
mknod -m 0640 "$S/null-dev" c 1 3
echo spaces >"$S/a name with spaces" && echo nl >"$S/new"$'\n'"line"
echo latin1 >"$S/$(printf 'caf\xe9')"
echo in-ro >"$S/read-only/file"
touch -h -d '2001-02-03 04:05:06.123456789' "$S/link" "$S/suid" "$S/deep/er/est/big"
touch -d '1999-12-31 23:59:59.999999999' "$S/empty-dir" "$S/deep/er/est"
chmod 1777 "$S/sticky" && chmod 2750 "$S/setgid-dir" && chmod 0555 "$S/read-only"
touch -d '2010-01-01 00:00:00.5' "$S/read-only" "$S"
# listing DIR: every entry's name, type, mode, owner, mtime (ns), link
# count, size (not of directories) and symlink target, then the groups
# of names that share an inode.
listing() {
    (cd "$1" && find . -printf '%p|%y|%#m|%U|%G|%T@|%n|%s|%l\n' | awk -F'|' -v OFS='|' '$2 == "d" { $8 = "-" } 1' | LC_ALL=C sort)
    python3 - "$1" <<'PY'
import os, sys
groups = {}
for d, dirs, files in os.walk(sys.argv[1]):
    for f in files:
        p = os.path.join(d, f)
        st = os.lstat(p)
        if st.st_nlink > 1:
            groups.setdefault(st.st_ino, []).append(os.path.relpath(p, sys.argv[1]))
print(sorted(sorted(g) for g in groups.values()))
PY
}
listing "$F" >"$WORK/files.before"
"$DEDUP" backup "$R" files1 "$F" --group files --json >"$WORK/files1.json" || fail "backup files1"
"$DEDUP" backup "$R" files2 "$F" --group files --json >"$WORK/files2.json" || fail "backup files2"
python3 - "$WORK/files1.json" "$WORK/files2.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["files"] > 1000 and a["dirs"] > 100 and a["symlinks"] >= 3, a
assert a["hard_links"] == 3 and a["specials"] == 2 and not a["warnings"], a
# big-copy is found in the same backup; everything in the second.
assert a["bytes_new"] < a["bytes_in"] - 2_900_000, a
assert b["bytes_in"] == a["bytes_in"] and b["bytes_new"] == 0, b
print(f'   files1: {a["files"]} files, {a["dirs"]} dirs, {a["bytes_in"]} bytes, {a["mb_per_sec"]:.0f} MB/s')
PY
listing "$F" | cmp - "$WORK/files.before" || fail "the backup changed what it read"
"$DEDUP" list "$R" >"$WORK/list.txt"
grep -q "^files1 .* files " "$WORK/list.txt" || fail "list does not show files1 as files"
"$DEDUP" restore "$R" files2 "$WORK/out" --json >"$WORK/out.json" || fail "restore files2"
# diff -r names fifos and devices it cannot compare; the listing does.
diff -r --no-dereference "$F" "$WORK/out$F" 2>&1 \
    | grep -Ev '^File .* is a (fifo|character special file) while file .* is a (fifo|character special file)$' \
    | head >"$WORK/diff.out" || true
[ -s "$WORK/diff.out" ] && { cat "$WORK/diff.out"; fail "restored contents differ"; }
listing "$WORK/out$F" >"$WORK/files.after"
diff "$WORK/files.before" "$WORK/files.after" || fail "restored metadata differs"
python3 - "$WORK/out.json" <<'PY' || fail "restore files2 report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["hard_links"] == 3 and not r["warnings"] and not r["damaged"], r
PY
[ -L "$WORK/out$S/sym-linked-2" ] || fail "a hard-linked symlink was not restored as a symlink"

log "files: restore only a part; refusals"
"$DEDUP" restore "$R" files1 "$WORK/part" --include "${F#/}/special/deep" --json >/dev/null || fail "restore --include"
[ -f "$WORK/part$F/special/deep/er/est/big" ] || fail "--include left out what it names"
[ -e "$WORK/part$F/special/suid" ] && fail "--include restored what it does not name"
[ -e "$WORK/part$F/doc" ] && fail "--include restored another directory"
cmp "$WORK/part$F/special/deep/hard-2" "$S/hard-1" || fail "a hard link restored alone lost its contents"
expect_fail "not empty" "$DEDUP" restore "$R" files1 "$WORK/out"
"$DEDUP" restore "$R" files1 "$WORK/out" --force >/dev/null || fail "restore --force"
listing "$WORK/out$F" | diff "$WORK/files.before" - || fail "restore --force metadata"
expect_fail "into a directory" "$DEDUP" restore "$R" files1 -
expect_fail "nothing in backup files1" "$DEDUP" restore "$R" files1 "$WORK/none" --include nope
expect_fail "overlap" "$DEDUP" backup "$R" x "$F" "$S"
expect_fail "'..'" "$DEDUP" backup "$R" x "$F/../files"

log "damage costs only what needs it: a flipped byte in one file's frame"
D3=$WORK/d3
R3=$WORK/r3
mkdir -p "$D3"
head -c 3000000 /dev/urandom >"$D3/a"
head -c 3000000 /dev/urandom >"$D3/b"
"$DEDUP" store init "$R3" --segments fixed >/dev/null
"$DEDUP" backup "$R3" f "$D3" >/dev/null || fail "backup f"
head -c 5000000 /dev/urandom >"$WORK/s.bin"
"$DEDUP" backup "$R3" s --stdin <"$WORK/s.bin" >/dev/null || fail "backup s"
# flip FILE OFFSET: xor one byte.
flip() { python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); b = f.read(1)[0]; f.seek(int(sys.argv[2])); f.write(bytes([b ^ 0x55]))' "$1" "$2"; }
# Random data in fixed segments is stored as is, in 1 MiB frames after the
# 32-byte header:
# this byte is in a's second frame, and the stream's in its first (the
# stream's backup, another process, takes its container ids from a range
# of its own: its container is the second listed).
flip "$R3/containers/0000000000000000" 1500032
flip "$R3/containers/$(ls "$R3/containers" | sort | sed -n 2p)" 100000
rc=0
"$DEDUP" restore "$R3" f "$WORK/d3out" --json >"$WORK/d3.json" 2>"$WORK/d3.err" || rc=$?
[ "$rc" -eq 1 ] || { cat "$WORK/d3.err"; fail "a damaged restore exited $rc, not 1"; }
grep -q "damaged: $WORK/d3out$D3/a: bytes " "$WORK/d3.err" || { cat "$WORK/d3.err"; fail "the damaged file is not named"; }
cmp "$D3/b" "$WORK/d3out$D3/b" || fail "an intact file was not restored whole"
python3 - "$WORK/d3.json" <<'PY' || fail "damaged report"
import json, sys
r = json.load(open(sys.argv[1]))
assert [d["path"].rsplit("/", 1)[1] for d in r["damaged"]] == ["a"], r
PY
"$DEDUP" restore "$R3" f "$WORK/d3b" --include "${D3#/}/b" >/dev/null || fail "--include of an intact file past damage"
cmp "$D3/b" "$WORK/d3b$D3/b" || fail "--include of an intact file"
rc=0
"$DEDUP" restore "$R3" s "$WORK/s.out" 2>"$WORK/s.err" >/dev/null || rc=$?
[ "$rc" -eq 1 ] || fail "a damaged stream restore exited $rc, not 1"
grep -q "damaged: bytes 0\.\.1048576 " "$WORK/s.err" || { cat "$WORK/s.err"; fail "the damaged range is not named"; }
cmp <(tail -c +1048577 "$WORK/s.bin") <(tail -c +1048577 "$WORK/s.out") || fail "the stream past the damage differs"
[ "$(head -c 1048576 "$WORK/s.out" | tr -d '\0' | wc -c)" -eq 0 ] || fail "the damaged range is not zeros"

log "a stream restored with --force onto a symlink replaces the link, not its target"
echo "pointed at" >"$WORK/pointed"
ln -s "$WORK/pointed" "$WORK/s-link"
expect_fail "a symbolic link" "$DEDUP" restore "$R3" s "$WORK/s-link"
rc=0
"$DEDUP" restore "$R3" s "$WORK/s-link" --force >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 1 ] || fail "restore onto a symlink exited $rc"
[ -L "$WORK/s-link" ] && fail "the symlink was written through, not replaced"
[ "$(cat "$WORK/pointed")" = "pointed at" ] || fail "the symlink's target was written"
cmp "$WORK/s.out" "$WORK/s-link" || fail "the restore onto a symlink differs"
rm -rf "$R3" "$D3" "$WORK"/d3* "$WORK"/s.* "$WORK/s-link" "$WORK/pointed"

log "list, stats, delete as JSON"
"$DEDUP" list "$R" --json >"$WORK/list.json"
"$DEDUP" store stats "$R" --json >"$WORK/stats.json"
python3 - "$WORK/list.json" "$WORK/stats.json" <<'PY'
import json, sys
l, s = (json.load(open(p)) for p in sys.argv[1:3])
assert [b["name"] for b in l] == ["empty", "files1", "files2", "rand", "t1", "t2", "t3"], l
assert {b["group"] for b in l if b["name"].startswith("t")} == {"tree"}, l
assert s["backups"] == 7 and s["containers"] >= 2 and not s["damaged_containers"], s
assert s["logical_bytes"] == sum(b["bytes_in"] for b in l), s
t1 = next(b for b in l if b["name"] == "t1")
# Stored about once: random data does not compress, so ~t1 + 64 MiB.
f1 = next(b for b in l if b["name"] == "files1")
assert s["bytes_stored"] < 1.1 * (t1["bytes_in"] + (64 << 20) + f1["bytes_in"]), s
assert s["fold_factor"] > 1.5, s
PY
"$DEDUP" store stats "$R" >"$WORK/stats.txt"
grep -q "7 backups" "$WORK/stats.txt" || fail "stats text"
"$DEDUP" delete "$R" t2 --json >"$WORK/del.json"
grep -q "dedup gc" "$WORK/del.json" || fail "delete does not say how the space comes back"
"$DEDUP" list "$R" >"$WORK/list.txt"
grep -q "^t2 " "$WORK/list.txt" && fail "t2 still listed after delete"
before=$(du -sb "$R/containers" | cut -f1)
"$DEDUP" gc "$R" --json >"$WORK/gc.json"
restored t1 "$WORK/t1.tar"
"$DEDUP" store check "$R" --data >/dev/null || fail "store check after gc"
after=$(du -sb "$R/containers" | cut -f1)
[ "$after" -le "$before" ] || fail "gc grew the containers ($before -> $after bytes)"

log "bad input is refused in plain words"
expect_fail "no backup named nosuch" "$DEDUP" restore "$R" nosuch "$WORK/x"
[ -e "$WORK/x" ] && fail "a failed restore left its target"
expect_fail "no backup named t2" "$DEDUP" delete "$R" t2
touch "$WORK/exists"
expect_fail "already exists; refusing to overwrite" "$DEDUP" restore "$R" t1 "$WORK/exists"
[ -s "$WORK/exists" ] && fail "the existing file was written"
"$DEDUP" restore "$R" t1 "$WORK/exists" --force >/dev/null
cmp "$WORK/exists" "$WORK/t1.tar" || fail "restore --force"
expect_fail "not both" "$DEDUP" backup "$R" p "$WORK/tree" --stdin
expect_fail "nothing to back up" "$DEDUP" backup "$R" p
expect_fail "backup t1 already exists" "$DEDUP" backup "$R" t1 --stdin </dev/null
expect_fail "invalid backup or group name" "$DEDUP" backup "$R" "a/b" --stdin </dev/null
expect_fail "not a dedup repository" "$DEDUP" list "$WORK/tree"
expect_fail "not empty" "$DEDUP" store init "$WORK/tree"
"$DEDUP" list "$R" >"$WORK/list.txt"
grep -q "^p " "$WORK/list.txt" && fail "a refused backup was listed"

# --- store objects (issue items 7, 10, 12c): kept apart from the
# restore checks above.
log "a damaged backup object: the others are listed, it is named and deleted, gc keeps what it may need"
D=$WORK/damaged
# flip FILE: change one byte of FILE in place.
flip() { python3 -c "import sys; b=bytearray(open(sys.argv[1],'rb').read()); b[40]^=1; open(sys.argv[1],'wb').write(b)" "$1"; }
"$DEDUP" store init "$D" >/dev/null
echo a | "$DEDUP" backup "$D" a --stdin >/dev/null || fail "backup a"
echo b | "$DEDUP" backup "$D" b --stdin >/dev/null || fail "backup b"
cp "$D/backups/a" "$WORK/a.good"
flip "$D/backups/a"
rc=0
"$DEDUP" list "$D" >"$WORK/dlist.txt" 2>"$WORK/dlist.err" || rc=$?
[ "$rc" -eq 1 ] || fail "list beside a damaged backup exited $rc"
grep -q "^b " "$WORK/dlist.txt" || fail "b is not listed beside damaged a"
grep -q "backup a cannot be listed" "$WORK/dlist.err" || fail "damaged a is not named"
"$DEDUP" list "$D" --json >"$WORK/dlist.json" 2>/dev/null || true
python3 -c "import json,sys; assert [e['name'] for e in json.load(open(sys.argv[1]))] == ['b']" "$WORK/dlist.json" \
    || fail "list --json beside a damaged backup"
"$DEDUP" delete "$D" b >/dev/null || fail "delete b"
"$DEDUP" gc "$D" >"$WORK/dgc.txt" || fail "gc beside a damaged backup"
grep -q "damaged" "$WORK/dgc.txt" || fail "gc does not say what the damaged backup made it keep"
cp "$WORK/a.good" "$D/backups/a"
[ "$("$DEDUP" restore "$D" a -)" = a ] || fail "a, repaired after the gc, does not restore"
flip "$D/backups/a"
"$DEDUP" delete "$D" a >/dev/null || fail "delete a damaged backup"
"$DEDUP" list "$D" >/dev/null || fail "list after deleting the damaged backup"
"$DEDUP" gc "$D" --json >"$WORK/dgc.json" || fail "gc after deleting the damaged backup"
[ "$(field "$WORK/dgc.json" orphans_removed)" -ge 1 ] || fail "a's recipe was not collected"
"$DEDUP" store check "$D" >/dev/null || fail "store check after the damaged backup went"

log "a killed writer's temporary files go at the next backup; a live one's stay"
# A backup killed with -9 while it writes a container leaves its
# temporary file (named after its process); tried until one is caught.
head -c 200M /dev/urandom >"$WORK/big.bin"
left=
for _ in 1 2 3 4 5 6 7 8; do
    "$DEDUP" backup "$D" "killed-$RANDOM" --stdin <"$WORK/big.bin" >/dev/null 2>&1 &
    kpid=$!
    for _ in $(seq 200); do
        compgen -G "$D/containers/.tmp-*-$kpid-*" >/dev/null && break
        sleep 0.01
    done
    kill -9 "$kpid" 2>/dev/null || true
    wait "$kpid" 2>/dev/null || true
    left=$(compgen -G "$D/containers/.tmp-*-$kpid-*" | head -1) || true
    [ -n "$left" ] && break
done
[ -n "$left" ] || fail "no killed backup left a temporary file in 8 tries"
# One of a process that runs (this shell's) stays.
live="$D/containers/.tmp-$(basename "$left" | cut -d- -f2)-$$-$(awk '{print $22}' /proc/$$/stat).abc"
head -c 1000 /dev/urandom >"$live"
echo c | "$DEDUP" backup "$D" c --stdin >/dev/null || fail "backup c"
[ -e "$left" ] && fail "a killed writer's temporary file is still there"
[ -e "$live" ] || fail "a live process's temporary file was removed"
rm -f "$live"

log "gc of a repository whose config is damaged names the config"
cp "$D/config" "$WORK/config.good"
flip "$D/config"
expect_fail "config object .* is damaged" "$DEDUP" gc "$D"
cp "$WORK/config.good" "$D/config"
echo "PASS backup"
