#!/bin/sh
# DEFECT: `run --allow read=URL` lets a workflow file read a URL *outside* the allowed prefix
# through `..` segments: read=http://H/pub allows http://H/pub/../in.zarr, which the HTTP
# client normalises to http://H/in.zarr. Expected: exit 2 before any request (the URL is not
# under the prefix once normalised). Observed: exit 0, GET /in.zarr/zarr.json ... served.
# Run with PYTHONPATH=<worktree>.
set -u
D=$(mktemp -d)
cd "$D"
python - <<'PY'
import numpy as np, zarr
zarr.create_array("in.zarr", shape=(500, 2), chunks=(250, 2), dtype="f8")[:] = np.random.default_rng(0).normal(size=(500, 2))
PY
mkdir pub root
python -m http.server 8766 --bind 127.0.0.1 --directory "$D" > http.log 2>&1 &
SRV=$!
sleep 1
cat > root/w.toml <<TOML
[[step]]
run = "inspect"
path = "http://127.0.0.1:8766/pub/../in.zarr"
TOML
ooc-spectral run root/w.toml --allow read=http://127.0.0.1:8766/pub -q > /dev/null 2>&1
echo "exit code: $? (expected 2)"
echo "requests outside /pub: $(grep -a -c 'GET /in.zarr' http.log) (expected 0)"
kill $SRV
