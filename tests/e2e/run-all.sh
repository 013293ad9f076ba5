#!/usr/bin/env bash
# Runs every end-to-end test script, for every backend where it applies;
# stops at the first failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" -ne 0 ]; then
    echo "the end-to-end tests need root (FUSE, loop devices, mount)" >&2
    exit 1
fi
run() {
    local backend=$1 t=$2 start
    echo "=== e2e: $t ($backend)"
    start=$(date +%s)
    BACKEND=$backend bash "$here/$t.sh"
    echo "=== e2e: $t ($backend) passed in $(($(date +%s) - start)) s"
}
for t in nbdcopy qemu-io fio lifecycle ext4 bench replay analyze; do
    run inram "$t"
done
for backend in disktable cowbtree lsm thin; do
    for t in nbdcopy qemu-io fio ext4 crash-kill replay; do
        run "$backend" "$t"
    done
done
# ordered runs thin's code with another write order: the data paths once.
for t in nbdcopy fio ext4; do
    run ordered "$t"
done
