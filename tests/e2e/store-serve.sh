#!/usr/bin/env bash
# `dedup store serve` (issue 17, §3.4): one server holds the repository;
# four `dedup backup --server` processes back up tar streams through it at
# once (sharing most of their content), and one a directory tree; every
# backup restores byte for byte beside the running server (the tree with
# its modes and times; a later backup of it reads no unchanged file) and
# through it (onto a loop device too), and past a damaged frame as a
# restore beside the repository does; SIGTERM stops it, removes the
# socket, and the repository reopens to write.
source "$(dirname "$0")/lib.sh"

R=$WORK/repo
S=$WORK/serve.sock
"$DEDUP" store init "$R" --segments fastcdc >/dev/null
python3 "$(dirname "$0")/make-tree.py" "$WORK/tree" 16 5 >/dev/null
tar -C "$WORK" --sort=name --mtime=@0 -cf "$WORK/base.tar" tree
for i in 1 2 3 4; do
    head -c $((i * 300000)) /dev/urandom >"$WORK/tree/extra"
    tar -C "$WORK" --sort=name --mtime=@0 -cf "$WORK/t$i.tar" tree
done

# store_serve REPO SOCKET LOG: start `dedup store serve` (its pid in $pid) and
# wait until it serves.
store_serve() {
    "$DEDUP" store serve "$1" --socket "$2" >"$3" 2>&1 &
    pid=$!
    # A test that fails while the server is stopped (SIGSTOP) must not
    # leave it stopped: TERM alone would wait for ever.
    on_exit "kill -CONT $pid; kill -TERM $pid; wait $pid"
    for _ in $(seq 200); do
        grep -qs "dedup: serving" "$3" && break
        kill -0 "$pid" 2>/dev/null || fail "dedup store serve exited early"
        sleep 0.1
    done
    [ -S "$2" ] || fail "no socket at $2"
}

log "through a server, a restore goes on past a damaged frame and names it"
R2=$WORK/repo2
S2=$WORK/serve2.sock
"$DEDUP" store init "$R2" --segments fixed >/dev/null
head -c 5000000 /dev/urandom >"$WORK/s.bin"
"$DEDUP" backup "$R2" s --stdin <"$WORK/s.bin" >/dev/null || fail "backup s"
# Random data in fixed segments is stored as is, in 1 MiB frames after the
# 32-byte header:
# this byte is in the stream's first frame.
python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(100000); b = f.read(1)[0]; f.seek(100000); f.write(bytes([b ^ 0x55]))' "$R2/containers/0000000000000000"
store_serve "$R2" "$S2" "$WORK/store2.serve.log"
rc=0
"$DEDUP" store remote --server "unix:$S2" --json restore s "$WORK/s.out" >"$WORK/s.json" 2>"$WORK/s.err" || rc=$?
[ "$rc" -eq 1 ] || { cat "$WORK/s.err"; fail "a damaged remote restore exited $rc, not 1"; }
grep -q "damaged: bytes 0\.\.1048576 " "$WORK/s.err" || { cat "$WORK/s.err"; fail "the damaged range is not named"; }
cmp <(tail -c +1048577 "$WORK/s.bin") <(tail -c +1048577 "$WORK/s.out") || fail "the stream past the damage differs"
[ "$(head -c 1048576 "$WORK/s.out" | tr -d '\0' | wc -c)" -eq 0 ] || fail "the damaged range is not zeros"
python3 - "$WORK/s.json" <<'PY' || fail "the damaged range in --json"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["bytes"] == 5000000, r
assert [(d["offset"], d["len"]) for d in r["damaged"]] == [(0, 1048576)], r
assert "containers/0000000000000000" in r["damaged"][0]["error"], r
PY
rc=0
"$DEDUP" store remote --server "unix:$S2" restore s - >"$WORK/s.stdout" 2>"$WORK/s.err" || rc=$?
[ "$rc" -eq 1 ] || { cat "$WORK/s.err"; fail "a damaged remote restore to stdout exited $rc, not 1"; }
cmp "$WORK/s.stdout" "$WORK/s.out" || fail "the remote restore to stdout differs"
grep -q "damaged: bytes 0\.\.1048576 " "$WORK/s.err" || { cat "$WORK/s.err"; fail "the damaged range is not named on stdout's restore"; }
kill -TERM "$pid"
wait "$pid" || fail "the second server exited $?"
rm -rf "$R2" "$WORK"/s.*

log "serve on a socket"
store_serve "$R" "$S" "$WORK/store.serve.log"
[ "$(stat -c %a "$S")" = 600 ] || fail "socket mode $(stat -c %a "$S")"

log "four tar streams backed up at once through the server"
for i in 1 2 3 4; do
    "$DEDUP" backup --server "unix:$S" "t$i" --stdin --json <"$WORK/t$i.tar" >"$WORK/t$i.json" &
    pids[i]=$!
done
for i in 1 2 3 4; do wait "${pids[i]}" || fail "backup t$i"; done
python3 - "$WORK" <<'PY'
import json, os, sys
for i in range(1, 5):
    r = json.load(open(f"{sys.argv[1]}/t{i}.json"))
    assert r["bytes_in"] == os.path.getsize(f"{sys.argv[1]}/t{i}.tar"), r
    print(f"   t{i}: {r['bytes_in']} bytes in, {r['bytes_new']} new, {r['mb_per_sec']:.0f} MB/s")
PY
log "a fifth, after them, sends only what is new"
"$DEDUP" backup --server "unix:$S" base --stdin --json <"$WORK/base.tar" >"$WORK/base.json" || fail "backup base"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['bytes_new'] < r['bytes_in'] / 20, r" "$WORK/base.json" \
    || fail "the fifth backup stored its shared content again"

log "a directory tree through the server"
"$DEDUP" backup --server "unix:$S" files "$WORK/tree" --json >"$WORK/files.json" || fail "backup of files through the server"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['files'] > 0 and r['bytes_in'] > 0, r" "$WORK/files.json" \
    || fail "the files backup report"
# Past the second the tree was made in, so its files count as unchanged.
sleep 1.1
"$DEDUP" backup --server "unix:$S" files2 "$WORK/tree" --json >"$WORK/files2.json" || fail "second backup of files"
"$DEDUP" backup --server "unix:$S" files3 "$WORK/tree" --json >"$WORK/files3.json" || fail "third backup of files"
python3 - "$WORK/files.json" "$WORK/files3.json" <<'PY' || fail "the third files backup read files it had no need to"
import json, sys
first, third = (json.load(open(p)) for p in sys.argv[1:])
assert third["parent"] == "files2", third
assert third["files_unchanged"] > 0 and third["bytes_unchanged"] == third["bytes_in"], third
assert third["bytes_new"] == 0 and third["bytes_in"] == first["bytes_in"], third
print(f"   files3: {third['files_unchanged']} unchanged files not read, {third['bytes_unchanged']} bytes")
PY

log "restores beside the running server"
"$DEDUP" restore "$R" files "$WORK/files.out" >/dev/null || fail "restore files"
diff -r "$WORK/tree" "$WORK/files.out$WORK/tree" || fail "the tree restored differently"
listing() { (cd "$1" && find . -printf '%p %y %m %s %T@ %l\n' | sort); }
diff <(listing "$WORK/tree") <(listing "$WORK/files.out$WORK/tree") \
    || fail "the tree restored with other modes, sizes, times or targets"
for n in t1 t2 t3 t4 base; do
    f=$WORK/$n.tar
    "$DEDUP" restore "$R" "$n" "$WORK/$n.out" >/dev/null || fail "restore $n"
    cmp "$WORK/$n.out" "$f" || fail "backup $n restored differently"
done
"$DEDUP" store remote --server "unix:$S" list >"$WORK/remote-list.txt"
[ "$(grep -c . "$WORK/remote-list.txt")" = 8 ] || fail "remote list"
# No lock: a backup straight into the repository runs beside the server.
echo beside | "$DEDUP" backup "$R" local --stdin >/dev/null || fail "a backup beside the server"
"$DEDUP" store remote --server "unix:$S" delete t1 >/dev/null || fail "remote delete"
"$DEDUP" store remote --server "unix:$S" gc --json >"$WORK/gc.json" || fail "remote gc"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['backups'] == 8, r" "$WORK/gc.json" \
    || fail "remote gc report"
for n in t2 t3 t4 base; do
    "$DEDUP" store remote --server "unix:$S" restore "$n" - 2>/dev/null | cmp - "$WORK/$n.tar" \
        || fail "backup $n after the collection"
done
log "a remote restore onto a loop device; one too small for the backup is left untouched"
truncate -s 32M "$WORK/disk"
loop=$(losetup -f --show "$WORK/disk")
on_exit "losetup -d $loop"
"$DEDUP" store remote --server "unix:$S" restore t2 "$loop" --force >/dev/null || fail "remote restore onto $loop"
cmp -n "$(stat -c %s "$WORK/t2.tar")" "$loop" "$WORK/t2.tar" || fail "the device holds other bytes than t2"
truncate -s 1M "$WORK/small"
small=$(losetup -f --show "$WORK/small")
on_exit "losetup -d $small"
expect_fail "nothing was written" "$DEDUP" store remote --server "unix:$S" restore t2 "$small" --force
cmp -n $((1 << 20)) "$small" /dev/zero || fail "a refused remote restore wrote to $small"

log "a stopped (wedged) server fails its clients after --timeout, then serves again"
kill -STOP "$pid"
start=$(date +%s)
if timeout 60 "$DEDUP" store remote --server "unix:$S" --timeout 1 list >"$WORK/wedged.out" 2>&1; then
    kill -CONT "$pid"
    fail "a list through a stopped server succeeded"
fi
if head -c 3000000 /dev/urandom | timeout 60 "$DEDUP" backup --server "unix:$S" --timeout 1 wedged --stdin >>"$WORK/wedged.out" 2>&1; then
    kill -CONT "$pid"
    fail "a backup through a stopped server succeeded"
fi
kill -CONT "$pid"
[ $(($(date +%s) - start)) -lt 30 ] || fail "the clients took $(($(date +%s) - start)) s to give up"
[ "$(grep -c "sent no answer in 1 s" "$WORK/wedged.out")" -ge 2 ] || { cat "$WORK/wedged.out" >&2; fail "no timeout message"; }
"$DEDUP" store remote --server "unix:$S" list --json >"$WORK/after-wedge.json" || fail "list after the server went on"
grep -q '"wedged"' "$WORK/after-wedge.json" && fail "the timed-out backup was committed"

log "through the server: a damaged backup object is named and the others listed; gc takes a percent"
echo d | "$DEDUP" backup --server "unix:$S" dmg --stdin >/dev/null || fail "backup dmg"
python3 -c "import sys; b=bytearray(open(sys.argv[1],'rb').read()); b[40]^=1; open(sys.argv[1],'wb').write(b)" "$R/backups/dmg"
rc=0
"$DEDUP" store remote --server "unix:$S" list >"$WORK/rlist.txt" 2>"$WORK/rlist.err" || rc=$?
[ "$rc" -eq 1 ] || fail "remote list beside a damaged backup exited $rc"
grep -q "^t2 " "$WORK/rlist.txt" || fail "t2 is not listed beside damaged dmg"
grep -q "backup dmg cannot be listed" "$WORK/rlist.err" || fail "damaged dmg is not named"
expect_fail "ambiguous" "$DEDUP" store remote --server "unix:$S" gc --compact-below 0.5
"$DEDUP" store remote --server "unix:$S" gc --compact-below 50 >"$WORK/rgc.txt" || fail "remote gc beside a damaged backup"
grep -q "damaged" "$WORK/rgc.txt" || fail "remote gc does not say what the damaged backup made it keep"
"$DEDUP" store remote --server "unix:$S" delete dmg >/dev/null || fail "remote delete of a damaged backup"
"$DEDUP" store remote --server "unix:$S" list >/dev/null || fail "remote list after the delete"

log "64 Unix-socket peers that never say Hello do not lock a client out"
python3 - "$S" <<'PY' &
import socket, sys, time
peers = []
for _ in range(64):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    peers.append(s)
time.sleep(20)
PY
squat=$!
sleep 1
start=$(date +%s)
timeout 30 "$DEDUP" store remote --server "unix:$S" list >/dev/null || fail "a client was locked out by silent peers"
[ $(($(date +%s) - start)) -lt 15 ] || fail "the client waited $(($(date +%s) - start)) s"
kill "$squat" 2>/dev/null || true
wait "$squat" 2>/dev/null || true

log "SIGTERM stops it cleanly"
kill -TERM "$pid"
wait "$pid" || fail "dedup store serve exited $?"
[ -e "$S" ] && fail "the socket is still there"
grep -q "stopped" "$WORK/store.serve.log" || fail "no stop message"
echo tail | "$DEDUP" backup "$R" after --stdin >/dev/null || fail "the repository does not reopen"
"$DEDUP" restore "$R" t3 - 2>/dev/null | cmp - "$WORK/t3.tar" || fail "t3 after the stop"
"$DEDUP" store check "$R" >/dev/null || fail "store check after the server"
echo "PASS store-serve"
