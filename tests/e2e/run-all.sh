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
    local backend=$1 t=$2 compression=${3:-lz4} start
    local what="$backend, $compression${WRITEBACK:+, writeback $WRITEBACK}"
    echo "=== e2e: $t ($what)"
    start=$(date +%s)
    BACKEND=$backend COMPRESSION=$compression bash "$here/$t.sh"
    echo "=== e2e: $t ($what) passed in $(($(date +%s) - start)) s"
}
# Access control (file and socket modes, other users, TLS, --bind,
# read-only) once, on the default backend.
run sparse security
# The backup store (issue 17) keeps no device: the backend is irrelevant.
run sparse backup
run sparse store-serve
run sparse s3
run sparse s3-faults
run sparse s3-volume-kill
# A device backed up by its fingerprints (the default store keeps one per
# chunk); uncompressed too, where a test can damage a chunk in place.
run sparse device-backup
run sparse device-backup none
for t in nbdcopy qemu-io fio lifecycle ext4 bench replay analyze; do
    run inram "$t"
done
for backend in sparse inram lsm; do
    run "$backend" safety
done
# A metadata copy taken while serving, put back after a crash, on the
# stores that record their commits on the data device.
for backend in sparse disktable; do
    run "$backend" live-copy
done
# A damaged table block, on the stores whose table blocks check --repair
# rebuilds.
for backend in sparse disktable; do
    run "$backend" damage
done
# The host's disk fills and frees under the server.
for backend in sparse inram disktable cowbtree lsm thin; do
    run "$backend" full-disk
done
run sparse full-disk none
# Grown while stopped, under ext4 (copied: sparse, inram, disktable; in
# place: cowbtree, lsm).
for backend in sparse inram disktable cowbtree lsm; do
    run "$backend" grow
done
for backend in sparse disktable cowbtree lsm thin; do
    for t in nbdcopy qemu-io fio ext4 crash-kill replay; do
        run "$backend" "$t"
    done
done
# The other codecs (lz4, the default, ran above): zstd packing, and
# chunks stored as they are.
for t in nbdcopy ext4 crash-kill; do
    run disktable "$t" zstd
done
for t in nbdcopy ext4; do
    run inram "$t" none
    run sparse "$t" none
done
run thin ext4 none
# Write-back off: every write applied before it is acknowledged.
for t in nbdcopy ext4; do
    WRITEBACK=0 run inram "$t"
done
WRITEBACK=0 run disktable crash-kill
# ordered runs thin's code with another write order: the data paths once.
for t in nbdcopy fio ext4; do
    run ordered "$t"
done
