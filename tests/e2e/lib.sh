# Helpers for the end-to-end tests: start and stop `dedup serve` on devices
# in a scratch directory, read status JSON, and clean everything up on exit
# (servers, FUSE mounts, loop devices) even when a test fails.
# Sourced by each test; tests run as root (FUSE, loop devices, mount).

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEDUP=${DEDUP:-$ROOT/target/release/dedup}
# The metadata backend the device-level tests create devices with.
BACKEND=${BACKEND:-inram}
# How the device-level tests' devices compress (lz4 is dedup's default).
COMPRESSION=${COMPRESSION:-lz4}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dedup-e2e.XXXXXX")
CLEANUPS=()

cleanup() {
    local rc=$?
    set +e
    for ((i = ${#CLEANUPS[@]} - 1; i >= 0; i--)); do
        eval "${CLEANUPS[$i]}" >/dev/null 2>&1
    done
    if [ "$rc" -ne 0 ]; then
        for log in "$WORK"/*.serve.log; do
            [ -f "$log" ] && { echo "--- $log"; tail -n 30 "$log"; }
        done
    fi
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT

on_exit() { CLEANUPS+=("$1"); }
fail() { echo "FAIL: $*" >&2; exit 1; }
log() { echo "== $*"; }

[ -x "$DEDUP" ] || fail "$DEDUP is missing: build with cargo build --release"

uri() { echo "nbd+unix:///?socket=$1/nbd.sock"; }

# serve DIR [dedup serve args...]: start serving and wait until ready
# (with --writeback $WRITEBACK when that is set).
serve() {
    local dir=$1
    shift
    "$DEDUP" serve "$dir" ${WRITEBACK:+--writeback "$WRITEBACK"} "$@" >"$dir.serve.log" 2>&1 &
    local pid=$!
    echo "$pid" >"$dir.servepid"
    on_exit "kill -TERM $pid; wait $pid"
    local i
    for i in $(seq 300); do
        grep -q "dedup: serving" "$dir.serve.log" && return 0
        kill -0 "$pid" 2>/dev/null || { cat "$dir.serve.log"; fail "dedup serve $dir exited early"; }
        sleep 0.1
    done
    fail "dedup serve $dir did not become ready"
}

# stop DIR: SIGTERM the server, which must save metadata cleanly.
stop() {
    local dir=$1 pid
    pid=$(cat "$dir.servepid")
    kill -TERM "$pid"
    wait "$pid" || fail "dedup serve $dir exited with $?"
    grep -q "metadata saved cleanly" "$dir.serve.log" || { cat "$dir.serve.log"; fail "$dir did not stop cleanly"; }
}

# attach_loop DIR FUSE: the served device DIR as a block device without the
# kernel nbd module: nbdfuse exposes it as FUSE/nbd, losetup makes that a
# loop device. Sets $loop and $fuse_pid; both are undone at exit.
attach_loop() {
    local dir=$1 fuse=$2
    mkdir -p "$fuse"
    nbdfuse "$fuse/" "$(uri "$dir")" &
    fuse_pid=$!
    on_exit "fusermount3 -u $fuse || fusermount -u $fuse || umount -l $fuse; wait $fuse_pid"
    for _ in $(seq 100); do [ -e "$fuse/nbd" ] && break; sleep 0.1; done
    [ -e "$fuse/nbd" ] || fail "nbdfuse did not expose the device"
    loop=$(losetup -f --show "$fuse/nbd")
    on_exit "losetup -d $loop"
}

# status DIR KEY: one field of `dedup status --json`.
status() {
    "$DEDUP" status "$1" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])"
}

# check_clean DIR: `dedup check --data` must find nothing.
check_clean() {
    "$DEDUP" check "$1" --data >"$WORK/check.out" || { cat "$WORK/check.out"; fail "dedup check $1 found problems"; }
}

# near A B TOL: |A - B| <= TOL (floats).
near() {
    python3 -c "import sys; a,b,t=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b)<=t else 1)" "$1" "$2" "$3" \
        || fail "$1 is not within $3 of $2"
}

# expect_fail TEXT CMD...: CMD must fail and say TEXT (case-insensitive).
expect_fail() {
    local want=$1
    shift
    local out rc=0
    # Bounded: a command that should fail but runs on (a server that
    # starts after all) fails the test instead of hanging the suite.
    out=$(timeout -k 10 120 "$@" 2>&1) || rc=$?
    [ "$rc" -ne 0 ] || fail "expected failure: $*"
    [ "$rc" -ne 124 ] || fail "expected failure, but still running after 120 s: $*"
    echo "$out" | grep -qi -- "$want" || { echo "$out"; fail "message of '$*' lacks '$want'"; }
}
