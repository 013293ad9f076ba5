#!/usr/bin/env python3
"""Write a deterministic directory tree (sizes and contents from a seed) for
filesystem tests: nested directories, files from a few bytes to 2 MiB."""
import os
import random
import sys

root, total_mb, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
budget = total_mb << 20
n = 0
while budget > 0:
    d = os.path.join(root, f"dir{rng.randrange(8)}", f"sub{rng.randrange(4)}")
    os.makedirs(d, exist_ok=True)
    size = min(budget, rng.choice([rng.randrange(1, 4096), rng.randrange(4096, 262144), rng.randrange(262144, 2 << 20)]))
    with open(os.path.join(d, f"file{n}.bin"), "wb") as f:
        f.write(rng.randbytes(size))
    budget -= size
    n += 1
print(n)
