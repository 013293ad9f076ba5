#!/usr/bin/env bash
# Runs every end-to-end test script in this directory; stops at the first failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" -ne 0 ]; then
    echo "the end-to-end tests need root (FUSE, loop devices, mount)" >&2
    exit 1
fi
for t in nbdcopy qemu-io fio lifecycle ext4; do
    echo "=== e2e: $t"
    start=$(date +%s)
    bash "$here/$t.sh"
    echo "=== e2e: $t passed in $(($(date +%s) - start)) s"
done
