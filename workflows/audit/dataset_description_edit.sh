#!/bin/sh
# DEFECT (low): the description make-data records (seed, centres, n, params) carries no digest:
# edited, `verify` says intact (exit 0) and `inspect` shows the edited values; the same
# make-data command then exits 2 ("data already exist") instead of finding and repairing it.
# A model's description has its digest (attrs_sha256); a data set's does not.
# Run with PYTHONPATH=<worktree>.
set -u
D=$(mktemp -d)
cd "$D"
ooc-spectral make-data blobs --n 2000 --chunk-rows 500 --seed 1 --out ds -q
python - <<'PY'
import json
p = "ds/zarr.json"; z = json.load(open(p)); a = z["attributes"]["ooc_spectral_dataset"]
a["seed"] = 99; a["centers"][0] = [0.0, 0.0]; json.dump(z, open(p, "w"))
PY
ooc-spectral verify ds > /dev/null 2>&1; echo "verify: $? (expected 1: the description changed)"
ooc-spectral make-data blobs --n 2000 --chunk-rows 500 --seed 1 --out ds -q 2>/dev/null; echo "same make-data: $? (expected 0, repaired)"
