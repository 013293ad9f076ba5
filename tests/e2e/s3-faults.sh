#!/usr/bin/env bash
# The backup store in an S3 bucket behind a proxy that injects faults
# (scripts/s3-fault-proxy in front of SeaweedFS on loopback): a share of
# requests answered 503 SlowDown, dropped before they reach the service,
# or dropped after it applied them (a write that landed, its answer lost),
# and every request delayed a little. Under those faults: init, a backup of
# files and of a stream, restores byte-exact, three backups in separate
# processes at once beside a delete and a gc. Then, faults off: every
# listed backup restores, `store check` finds the repository whole, and a
# gc and a check after it too. The proxy's counts show every kind of fault
# was injected.
source "$(dirname "$0")/lib.sh"

if [ -z "${DEDUP_TEST_S3:-}" ]; then
    on_exit "$ROOT/scripts/s3-test-server stop $WORK/s3"
    "$ROOT/scripts/s3-test-server" start "$WORK/s3"
    # shellcheck disable=SC1091
    . "$WORK/s3/env"
fi
"$ROOT/scripts/s3-fault-proxy" --upstream "$AWS_ENDPOINT_URL" --port-file "$WORK/proxy-port" \
    --fail ${FAULT_FAIL:-0.06} --drop-before ${FAULT_DROP:-0.02} --drop-after ${FAULT_DROP_AFTER:-0.03} --delay-ms 5 --seed "$RANDOM" \
    2>"$WORK/proxy.log" &
proxy=$!
on_exit "kill $proxy"
for _ in $(seq 100); do [ -s "$WORK/proxy-port" ] && break; sleep 0.1; done
[ -s "$WORK/proxy-port" ] || fail "the fault proxy did not start: $(cat "$WORK/proxy.log")"
PROXY=http://127.0.0.1:$(cat "$WORK/proxy-port")
export AWS_ENDPOINT_URL=$PROXY
R="$DEDUP_TEST_S3/faults-$$-$RANDOM"
DEDUP_PASSWORD="faults passphrase $RANDOM$RANDOM"
export DEDUP_PASSWORD
faults() {
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1] + "/__proxy__/faults", data=sys.argv[2].encode()))' \
        "$PROXY" "$1" || fail "setting the proxy's faults"
}
stats() { python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1] + "/__proxy__/stats").read().decode())' "$PROXY"; }

log "under faults: init, a backup of files and one of a stream, restores"
"$DEDUP" store init "$R" >/dev/null || fail "store init under faults"
python3 "$(dirname "$0")/make-tree.py" "$WORK/tree" 8 3 >/dev/null
head -c 30000000 /dev/urandom >"$WORK/stream"
"$DEDUP" backup "$R" files-1 "$WORK/tree" >/dev/null || fail "backup of files under faults"
"$DEDUP" backup "$R" stream-1 --stdin <"$WORK/stream" >/dev/null || fail "backup of a stream under faults"
"$DEDUP" restore "$R" files-1 "$WORK/out" >/dev/null || fail "restore of files under faults"
diff -r "$WORK/tree" "$WORK/out/${WORK#/}/tree" || fail "files restored differently under faults"
"$DEDUP" restore "$R" stream-1 - 2>/dev/null | cmp - "$WORK/stream" || fail "stream restored differently under faults"
"$DEDUP" restore "$R" stream-1 "$WORK/stream.out" 2>/dev/null || fail "stream restore into a file under faults"
cmp "$WORK/stream.out" "$WORK/stream" || fail "stream restored into a file differently under faults"

log "under faults: three backups at once, a delete and a gc beside them"
for i in 1 2 3; do
    head -c 12000000 /dev/urandom >"$WORK/own-$i"
    cat "$WORK/stream" "$WORK/own-$i" >"$WORK/in-$i"
done
pids=()
for i in 1 2 3; do
    "$DEDUP" backup "$R" many-$i --stdin <"$WORK/in-$i" >/dev/null 2>"$WORK/many-$i.err" &
    pids+=($!)
done
"$DEDUP" delete "$R" stream-1 >/dev/null || fail "delete under faults"
"$DEDUP" gc "$R" --writer-wait 60 >/dev/null 2>"$WORK/gc.err" || fail "gc under faults: $(cat "$WORK/gc.err")"
for i in 1 2 3; do
    wait "${pids[$((i - 1))]}" || fail "backup many-$i under faults: $(cat "$WORK/many-$i.err")"
done

injected=$(stats)
echo "   proxy: $injected"
python3 - "$injected" <<'PY' || fail "not every kind of fault was injected"
import json, sys
s = json.loads(sys.argv[1])
assert all(n > 0 for n in s["injected"].values()), s
PY

log "faults off: every listed backup restores, the repository checks whole, and again after a gc"
faults '{"fail": 0, "drop_before": 0, "drop_after": 0, "delay_ms": 0}'
"$DEDUP" list "$R" --json >"$WORK/list.json" || fail "list"
names=$(python3 -c 'import json,sys; print(" ".join(b["name"] for b in json.load(open(sys.argv[1]))))' "$WORK/list.json")
[ "$names" ] || fail "no backup listed"
for n in $names; do
    case $n in
    many-*) "$DEDUP" restore "$R" "$n" - 2>/dev/null | cmp - "$WORK/in-${n#many-}" || fail "$n restored differently" ;;
    files-1) ;;
    *) fail "unexpected backup $n listed" ;;
    esac
done
for i in 1 2 3; do echo "$names" | grep -qw "many-$i" || fail "many-$i is not listed"; done
"$DEDUP" store check "$R" >"$WORK/check.out" 2>&1 || fail "store check: $(cat "$WORK/check.out")"
"$DEDUP" gc "$R" >/dev/null || fail "gc"
"$DEDUP" store check "$R" >"$WORK/check2.out" 2>&1 || fail "store check after gc: $(cat "$WORK/check2.out")"
rm -rf "$WORK/out"
"$DEDUP" restore "$R" files-1 "$WORK/out" >/dev/null || fail "restore of files after gc"
diff -r "$WORK/tree" "$WORK/out/${WORK#/}/tree" || fail "files restored differently after gc"
echo "s3-faults: all passed"
