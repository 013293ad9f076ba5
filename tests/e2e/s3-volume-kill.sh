#!/usr/bin/env bash
# The backup store in an S3 bucket whose storage dies under it: SeaweedFS
# run as separate processes (scripts/s3-test-server start-cluster), the
# volume server that holds the objects killed with -9 in the middle of a
# backup and of a restore, and started again seconds later on the same
# data. The backup either commits whole or fails saying why; nothing
# listed is lost: every listed backup restores byte-exact, `store check
# --data` finds the repository whole, and a backup, a gc and a check after
# it work on the same bucket.
source "$(dirname "$0")/lib.sh"

S3=$WORK/cluster
on_exit "$ROOT/scripts/s3-test-server stop $S3"
"$ROOT/scripts/s3-test-server" start-cluster "$S3"
# shellcheck disable=SC1091
. "$S3/env"
R="$DEDUP_TEST_S3/volume-kill-$$"
DEDUP_PASSWORD="volume kill passphrase $RANDOM$RANDOM"
export DEDUP_PASSWORD

log "a first backup of files and of a stream"
"$DEDUP" store init "$R" >/dev/null || fail "store init"
python3 "$(dirname "$0")/make-tree.py" "$WORK/tree" 8 3 >/dev/null
head -c 20000000 /dev/urandom >"$WORK/small"
"$DEDUP" backup "$R" files-1 "$WORK/tree" >/dev/null || fail "backup of files"
"$DEDUP" backup "$R" small --stdin <"$WORK/small" >/dev/null || fail "backup of a stream"

# Kills the volume server once the bucket has grown by a few containers
# (so the kill lands mid-backup), keeps it down DOWN seconds, starts it;
# fails if the backup had ended (said its summary in OUT) before the
# kill, which would test nothing.
outage() {
    local down=$1 out=$2 before
    before=$(du -sb "$S3/volume" | cut -f1)
    for _ in $(seq 200); do
        [ "$(du -sb "$S3/volume" | cut -f1)" -gt $((before + 30000000)) ] && break
        sleep 0.05
    done
    "$ROOT/scripts/s3-test-server" volume-kill "$S3"
    [ ! -s "$out" ] || fail "the backup had ended before the volume server was killed"
    sleep "$down"
    "$ROOT/scripts/s3-test-server" volume-start "$S3"
}

log "the volume server killed with -9 mid-backup, back after 4 s"
head -c 200000000 /dev/urandom >"$WORK/big"
"$DEDUP" backup "$R" big --stdin <"$WORK/big" >"$WORK/big.out" 2>"$WORK/big.err" &
backup=$!
outage 4 "$WORK/big.out"
if wait "$backup"; then
    echo "   the backup rode out the outage: $(head -1 "$WORK/big.out")"
    committed=1
else
    echo "   the backup failed: $(cat "$WORK/big.err")"
    [ -s "$WORK/big.err" ] || fail "the backup failed without saying why"
    committed=0
fi

log "the volume server killed with -9 mid-restore, back after 3 s"
"$DEDUP" restore "$R" small "$WORK/small.out" >/dev/null 2>"$WORK/restore.err" &
restore=$!
"$ROOT/scripts/s3-test-server" volume-kill "$S3"
sleep 3
"$ROOT/scripts/s3-test-server" volume-start "$S3"
if wait "$restore"; then
    cmp "$WORK/small.out" "$WORK/small" || fail "a restore across the outage gave other bytes"
else
    [ -s "$WORK/restore.err" ] || fail "the restore failed without saying why"
    echo "   the restore failed: $(cat "$WORK/restore.err")"
fi

log "every listed backup restores, the repository checks whole"
"$DEDUP" list "$R" --json >"$WORK/list.json" || fail "list after the outages"
names=$(python3 -c 'import json,sys; print(" ".join(b["name"] for b in json.load(open(sys.argv[1]))))' "$WORK/list.json")
for n in files-1 small; do echo "$names" | grep -qw "$n" || fail "$n is no longer listed"; done
if [ "$committed" = 1 ]; then echo "$names" | grep -qw big || fail "big committed but is not listed"; fi
for n in $names; do
    case $n in
    big | small) "$DEDUP" restore "$R" "$n" - 2>/dev/null | cmp - "$WORK/$n" || fail "$n restored differently" ;;
    files-1)
        rm -rf "$WORK/out"
        "$DEDUP" restore "$R" files-1 "$WORK/out" >/dev/null || fail "restore of files-1"
        diff -r "$WORK/tree" "$WORK/out/${WORK#/}/tree" || fail "files-1 restored differently"
        ;;
    *) fail "unexpected backup $n listed" ;;
    esac
done
"$DEDUP" store check "$R" --data >"$WORK/check.out" 2>&1 || fail "store check --data: $(cat "$WORK/check.out")"

log "after the outages: a backup, a gc and a check"
"$DEDUP" backup "$R" big-again --stdin <"$WORK/big" >/dev/null || fail "backup after the outages"
"$DEDUP" restore "$R" big-again - 2>/dev/null | cmp - "$WORK/big" || fail "big-again restored differently"
"$DEDUP" delete "$R" small >/dev/null || fail "delete"
"$DEDUP" gc "$R" >/dev/null || fail "gc after the outages"
"$DEDUP" store check "$R" --data >"$WORK/check2.out" 2>&1 || fail "store check after gc: $(cat "$WORK/check2.out")"
echo "s3-volume-kill: all passed"
