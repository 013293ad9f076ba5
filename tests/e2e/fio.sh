#!/usr/bin/env bash
# fio's nbd engine with several jobs in flight: random 4 KiB writes
# verified with crc32c (unique data), then pattern-verified writes (all
# duplicates), then a dedupe_percentage mix whose ratio status must show.
source "$(dirname "$0")/lib.sh"

"$DEDUP" create "$WORK/dev" --size 512M --backend "$BACKEND" --compression "$COMPRESSION" >/dev/null
serve "$WORK/dev"
U=$(uri "$WORK/dev")
common=(--ioengine=nbd --uri="$U" --bs=4k --iodepth=16 --numjobs=4 --group_reporting --verify_fatal=1 --verify_state_save=0)

log "random 4 KiB writes, verify=crc32c, 4 jobs"
fio --name=crc "${common[@]}" --rw=randwrite --size=32M --offset_increment=32M --verify=crc32c \
    --output="$WORK/crc.txt" || { cat "$WORK/crc.txt"; fail "fio crc32c verify failed"; }
grep -q "err= 0" "$WORK/crc.txt" || { cat "$WORK/crc.txt"; fail "fio reported errors"; }

log "all-duplicate writes with pattern verify, sequential and random"
fio --name=pat "${common[@]}" --rw=randwrite --size=32M --offset=128M --offset_increment=32M \
    --verify=pattern --verify_pattern=0xdeadbeef --output="$WORK/pat.txt" || { cat "$WORK/pat.txt"; fail "fio pattern verify failed"; }
grep -q "err= 0" "$WORK/pat.txt" || { cat "$WORK/pat.txt"; fail "fio reported errors"; }

log "half-duplicate mix with FUA writes"
fio --name=mix --ioengine=nbd --uri="$U" --bs=64k --iodepth=8 --numjobs=2 --rw=write --size=64M \
    --offset=256M --offset_increment=64M --dedupe_percentage=50 --fsync=16 --output="$WORK/mix.txt" \
    || { cat "$WORK/mix.txt"; fail "fio mix failed"; }
"$DEDUP" gc "$WORK/dev" >/dev/null
ratio=$(status "$WORK/dev" dedup_ratio)
python3 -c "import sys; r=float(sys.argv[1]); sys.exit(0 if r > 1.15 else 1)" "$ratio" || fail "dedup ratio $ratio too low for duplicate-heavy data"
stop "$WORK/dev"
check_clean "$WORK/dev"
echo "PASS fio (dedup ratio $ratio)"
