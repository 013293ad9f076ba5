#!/usr/bin/env bash
# The backup store in an S3 bucket (issue 38), from the command line, on a
# real S3 service: SeaweedFS on loopback (scripts/s3-test-server; the one
# scripts/test started, or one started here). Every command takes
# s3://BUCKET/PREFIX: init, backup of files and of a stream, list,
# restore, delete, gc, store check (with a flipped byte in a container,
# named with the backups it costs), store stats, store serve. Many
# writers, no lock: four backups in separate processes beside a server,
# a delete and a gc; a backup and a gc killed with -9, after which every
# listed backup restores and the next collections clear what they left.
# --json reports the requests sent. An unknown scheme is refused and makes
# no directory. A repository in a bucket is encrypted by default: no
# object in the bucket holds a file name or contents backed up, the wrong
# passphrase or none is refused, and passphrases are added and removed.
source "$(dirname "$0")/lib.sh"

if [ -z "${DEDUP_TEST_S3:-}" ]; then
    on_exit "$ROOT/scripts/s3-test-server stop $WORK/s3"
    "$ROOT/scripts/s3-test-server" start "$WORK/s3"
    # shellcheck disable=SC1091
    . "$WORK/s3/env"
fi
R="$DEDUP_TEST_S3/e2e-$$-$RANDOM"
DEDUP_PASSWORD="e2e passphrase $RANDOM$RANDOM"
export DEDUP_PASSWORD
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }

log "init, a backup of files and one of a stream, in $R"
"$DEDUP" store init "$R" --json >"$WORK/init.json" || fail "store init"
[ "$(field "$WORK/init.json" repository)" = "$R" ] || fail "init names $R"
[ "$(field "$WORK/init.json" encrypted)" = True ] || fail "a repository in a bucket is encrypted by default"
python3 "$(dirname "$0")/make-tree.py" "$WORK/tree" 8 3 >/dev/null
for i in $(seq 2000); do echo "payroll e2e row $i: alice,engineering,123456.78"; done >"$WORK/tree/secret-payroll-e2e.csv"
"$DEDUP" backup "$R" files-1 "$WORK/tree" --json >"$WORK/b1.json" || fail "backup of files"
head -c 20000000 /dev/urandom >"$WORK/stream"
"$DEDUP" backup "$R" stream-1 --stdin --json <"$WORK/stream" >"$WORK/s1.json" || fail "backup of a stream"
python3 - "$WORK/b1.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
q = r["requests"]
assert q["put"] >= 3 and q["get"] >= 1, q
PY

log "the same files again: nothing new, a handful of requests"
"$DEDUP" backup "$R" files-2 "$WORK/tree" --json >"$WORK/b2.json" || fail "second backup"
python3 - "$WORK/b2.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["bytes_new"] == 0, r
q = r["requests"]
total = sum(q.values())
print(f"   unchanged backup: {total} requests {q}")
assert total <= 40, q
PY

log "list, restore (files and stream), stats, check"
"$DEDUP" list "$R" | grep -q files-2 || fail "list"
"$DEDUP" restore "$R" files-1 "$WORK/out" >/dev/null || fail "restore of files"
diff -r "$WORK/tree" "$WORK/out/${WORK#/}/tree" || fail "files restored differently"
"$DEDUP" restore "$R" stream-1 - | cmp - "$WORK/stream" || fail "stream restored differently"
# Into a file: containers read whole, in container order, written at offsets.
"$DEDUP" restore "$R" stream-1 "$WORK/stream.out" >/dev/null || fail "restore of a stream into a file"
cmp "$WORK/stream.out" "$WORK/stream" || fail "stream restored into a file differently"
"$DEDUP" store stats "$R" --json >"$WORK/stats.json" || fail "stats"
[ "$(field "$WORK/stats.json" backups)" = 3 ] || fail "stats counts 3 backups"
"$DEDUP" store check "$R" --data >/dev/null || fail "check of an intact repository"

if [ -n "${DEDUP_TEST_S3_FILER:-}" ]; then
    bucket_name=${R#s3://}
    bucket_name=${bucket_name%%/*}
    log "no object in the bucket holds a file name or contents backed up"
python3 - "$DEDUP_TEST_S3_FILER" "$bucket_name" "${R#s3://"$bucket_name"/}" <<'PY'
import json, sys, urllib.request
filer, bucket, prefix = sys.argv[1:4]
def walk(path):
    req = urllib.request.Request(f"{filer}{path}?limit=10000", headers={"Accept": "application/json"})
    for e in json.load(urllib.request.urlopen(req)).get("Entries") or []:
        if e.get("Mode", 0) & 0o20000000000:  # a directory
            yield from walk(e["FullPath"] + "/")
        else:
            yield e["FullPath"]
objects = list(walk(f"/buckets/{bucket}/{prefix}/"))
assert len(objects) >= 8, objects
for path in objects:
    data = urllib.request.urlopen(filer + path).read()
    for needle in (b"secret-payroll-e2e", b"alice,engineering", b"payroll e2e row"):
        assert needle not in data, f"{path} holds {needle!r}"
print(f"   {len(objects)} objects, none holds a file name or contents")
PY
fi

log "the passphrase: none, a wrong one, a second one added, the first removed"
if env -u DEDUP_PASSWORD "$DEDUP" list "$R" 2>"$WORK/nopass.err"; then fail "listed without a passphrase"; fi
grep -q "encrypted; give its passphrase in DEDUP_PASSWORD" "$WORK/nopass.err" || { cat "$WORK/nopass.err"; fail "no passphrase: say how to give one"; }
if DEDUP_PASSWORD=wrong "$DEDUP" list "$R" 2>"$WORK/wrong.err"; then fail "listed with a wrong passphrase"; fi
grep -q "the passphrase opens none of the repository's 1 key" "$WORK/wrong.err" || { cat "$WORK/wrong.err"; fail "wrong passphrase named"; }
first=$("$DEDUP" store key list "$R" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["name"])')
DEDUP_NEW_PASSWORD=second "$DEDUP" store key add "$R" --json >"$WORK/keyadd.json" || fail "key add"
echo second >"$WORK/second.pass"
env -u DEDUP_PASSWORD "$DEDUP" list "$R" --password-file "$WORK/second.pass" | grep -q stream-1 || fail "list with the second passphrase from a file"
if "$DEDUP" store key remove "$R" "$first" 2>"$WORK/keyrm.err"; then fail "removed the key in use"; fi
env -u DEDUP_PASSWORD "$DEDUP" store key remove "$R" "$first" --password-file "$WORK/second.pass" >/dev/null || fail "key remove"
if "$DEDUP" list "$R" 2>/dev/null; then fail "the removed passphrase still opens"; fi
export DEDUP_PASSWORD=second

log "many writers: four backups, a server, a delete and a gc at once"
"$DEDUP" store serve "$R" --socket "$WORK/serve.sock" >"$WORK/serve.log" 2>&1 &
spid=$!
on_exit "[ -z \"\${spid:-}\" ] || kill -9 \$spid"
for _ in $(seq 100); do [ -S "$WORK/serve.sock" ] && break; sleep 0.1; done
head -c 8000000 /dev/urandom >"$WORK/victim"
"$DEDUP" backup "$R" victim --stdin <"$WORK/victim" >/dev/null || fail "backup of the victim"
for i in 1 2 3 4; do
    mkdir -p "$WORK/many-$i"
    cp -r "$WORK/tree" "$WORK/many-$i/tree"
    head -c 3000000 /dev/urandom >"$WORK/many-$i/own"
done
pids=()
for i in 1 2 3 4; do
    "$DEDUP" backup "$R" "many-$i" "$WORK/many-$i" >"$WORK/many-$i.out" 2>&1 &
    pids+=($!)
done
"$DEDUP" backup --server "unix:$WORK/serve.sock" served "$WORK/tree" >/dev/null || fail "backup through the server beside them"
"$DEDUP" delete "$R" victim >/dev/null || fail "delete beside them"
"$DEDUP" gc "$R" --json >"$WORK/gc-beside.json" || fail "gc beside them"
# The collections waited for the backups to look at each epoch, never for
# the idle server (its pin holds only its id range once its backup ended).
python3 - "$WORK/gc-beside.json" <<'PY' || fail "gc waited for a writer that had nothing to look for"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["writers_not_caught_up"] == 0, r
PY
for i in 1 2 3 4; do
    wait "${pids[$((i - 1))]}" || { cat "$WORK/many-$i.out"; fail "backup many-$i beside the others"; }
done
"$DEDUP" list "$R" >"$WORK/list-many.txt"
for b in many-1 many-2 many-3 many-4 served; do grep -q "$b" "$WORK/list-many.txt" || fail "$b listed"; done
for i in 1 2 3 4; do
    "$DEDUP" restore "$R" "many-$i" "$WORK/out-many-$i" >/dev/null || fail "restore many-$i"
    diff -r "$WORK/many-$i" "$WORK/out-many-$i/${WORK#/}/many-$i" || fail "many-$i restored differently"
done

log "kill -9 of a backup and of a gc: every listed backup restores, the next gcs clear what they left"
head -c 200000000 /dev/urandom >"$WORK/big"
"$DEDUP" backup "$R" killed --stdin <"$WORK/big" >/dev/null 2>&1 &
kpid=$!
sleep 1.5
kill -9 "$kpid" 2>/dev/null || true
wait "$kpid" 2>/dev/null || true
"$DEDUP" delete "$R" many-4 >/dev/null || fail "delete many-4"
"$DEDUP" gc "$R" >/dev/null 2>&1 &
gpid=$!
sleep 0.3
kill -9 "$gpid" 2>/dev/null || true
wait "$gpid" 2>/dev/null || true
"$DEDUP" list "$R" --json >"$WORK/list-killed.json" || fail "list after the kills"
for b in $(python3 -c 'import json,sys; print(" ".join(b["name"] for b in json.load(open(sys.argv[1]))))' "$WORK/list-killed.json"); do
    "$DEDUP" restore "$R" "$b" "$WORK/out-after-$b" >/dev/null || fail "restore $b after the kills"
done
"$DEDUP" gc "$R" >/dev/null || fail "gc after the kills"
"$DEDUP" gc "$R" >/dev/null || fail "second gc after the kills"
"$DEDUP" store check "$R" --json >"$WORK/check-kills.json" || fail "check after the kills"
python3 - "$WORK/check-kills.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert not r["problems"], r["problems"]
left = [g for g in r["garbage"] if g["object"].startswith("containers/")]
assert not left, f"containers a killed writer left are still there: {left}"
PY
kill "$spid" 2>/dev/null || true
wait "$spid" 2>/dev/null || true
spid=

log "delete and gc"
for b in files-1 files-2 served many-1 many-2 many-3; do "$DEDUP" delete "$R" "$b" >/dev/null || fail "delete $b"; done
"$DEDUP" gc "$R" --json >"$WORK/gc.json" || fail "gc"
[ "$(field "$WORK/gc.json" backups)" = 1 ] || fail "gc sees one backup"
[ "$(field "$WORK/gc.json" containers_swept)" -ge 1 ] || fail "gc deleted nothing"
"$DEDUP" restore "$R" stream-1 - | cmp - "$WORK/stream" || fail "stream restored differently after gc"

log "credentials, region and endpoint from AWS_PROFILE in the shared files"
printf '[e2e]\naws_access_key_id = %s\naws_secret_access_key = %s\n' "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" >"$WORK/aws-credentials"
printf '[profile e2e]\nregion = %s\nendpoint_url = %s\n' "$AWS_REGION" "$AWS_ENDPOINT_URL" >"$WORK/aws-config"
(
    unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_ENDPOINT_URL AWS_REGION
    export AWS_SHARED_CREDENTIALS_FILE=$WORK/aws-credentials AWS_CONFIG_FILE=$WORK/aws-config AWS_PROFILE=e2e
    "$DEDUP" list "$R" | grep -q stream-1 || fail "list with credentials from a profile"
    if AWS_PROFILE=missing "$DEDUP" list "$R" 2>"$WORK/profile.err"; then fail "a missing profile accepted"; fi
    grep -q '"missing"' "$WORK/profile.err" || fail "the missing profile is named"
)

log "unknown schemes are refused and make nothing"
(
cd "$WORK"
if "$DEDUP" store init gs://bucket/x 2>"$WORK/gs.err"; then fail "gs:// accepted"; fi
grep -q "gs:// is not a kind of repository" "$WORK/gs.err" || fail "gs:// refusal names it"
[ ! -e "$WORK/gs:" ] || fail "a directory gs: was made"
if "$DEDUP" store init s3://Bad_Bucket 2>"$WORK/bad.err"; then fail "a bad bucket name accepted"; fi
grep -q "only a-z" "$WORK/bad.err" || fail "bad bucket refusal"
)

if [ -z "${DEDUP_TEST_S3_FILER:-}" ]; then
    echo "s3: the damage step needs SeaweedFS's filer (DEDUP_TEST_S3_FILER, set by scripts/s3-test-server); skipped"
    echo "s3: all passed"
    exit 0
fi
log "a flipped byte in a container in the bucket is named, with the backup it costs"
bucket=${R#s3://}
bucket=${bucket%%/*}
python3 - "$DEDUP_TEST_S3_FILER" "$bucket" "${R#s3://"$bucket"/}" <<'PY'
# Through SeaweedFS's filer, which holds the bucket's objects as files.
import json, sys, urllib.request
filer, bucket, prefix = sys.argv[1:4]
base = f"{filer}/buckets/{bucket}/{prefix}/containers/"
listing = urllib.request.Request(base, headers={"Accept": "application/json"})
path = json.load(urllib.request.urlopen(listing))["Entries"][0]["FullPath"]
data = bytearray(urllib.request.urlopen(filer + path).read())
data[200] ^= 0xFF
put = urllib.request.Request(filer + path, data=bytes(data), method="PUT")
assert urllib.request.urlopen(put).status in (200, 201)
PY
set +e
"$DEDUP" store check "$R" --data >"$WORK/check.out"
rc=$?
"$DEDUP" restore "$R" stream-1 "$WORK/damaged" 2>"$WORK/restore.err" >/dev/null
rrc=$?
set -e
[ "$rc" = 1 ] || fail "check of a damaged container exits 1 (got $rc)"
grep -q "containers/.*cannot be fully restored: stream-1\|cannot be fully restored: stream-1" "$WORK/check.out" || { cat "$WORK/check.out"; fail "check names the backup"; }
[ "$rrc" = 1 ] || fail "a restore past damage exits 1 (got $rrc)"
grep -q "containers/" "$WORK/restore.err" || { cat "$WORK/restore.err"; fail "restore names the container"; }

echo "s3: all passed"
