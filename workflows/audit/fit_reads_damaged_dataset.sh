#!/bin/sh
# DEFECT (lower severity: a gap between what make-data records and what fit checks):
# a make-data data set whose data chunk no longer matches the digest make-data recorded
# (one chunk's bytes copied over another's: both decode, the crc32c of each still holds) is
# reported damaged by `verify` (exit 1), yet `fit` on it exits 0 and writes a complete
# embedding of the damaged rows. Expected: fit refuses the data set (exit 2, naming the
# make-data command that repairs it), as it refuses one marked incomplete.
# Run with PYTHONPATH=<worktree>.
set -u
D=$(mktemp -d)
cd "$D"
ooc-spectral make-data blobs --n 2000 --chunk-rows 500 --out ds -q
cp ds/data/c/1/0 ds/data/c/0/0        # rows 0-499 now hold rows 500-999
ooc-spectral verify ds > /dev/null 2>&1; echo "verify: $? (1: damaged)"
ooc-spectral fit ds --out out -q; echo "fit on it: $? (expected 2; observed 0 = an embedding of the damaged data)"
ooc-spectral verify out > /dev/null 2>&1; echo "verify of the fit: $?"
