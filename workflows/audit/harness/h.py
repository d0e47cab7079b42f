import os, sys, json, hashlib, subprocess, shutil, zarr, numpy as np, time, signal
os.environ["PYTHONPATH"] = "/work/wt/a52"
W = "/tmp/a52"
def run(*args, env=None, cwd=W, timeout=600):
    e = dict(os.environ); e.update(env or {})
    p = subprocess.run(["ooc-spectral", *map(str, args)], capture_output=True, text=True, env=e, cwd=cwd, timeout=timeout)
    return p.returncode, p.stdout, p.stderr
def popen(*args, env=None, cwd=W):
    e = dict(os.environ); e.update(env or {})
    return subprocess.Popen(["ooc-spectral", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e, cwd=cwd)
def make_input(path, n=4000, d=3, chunk=250, seed=0, dtype="float64", zarr_format=3, shift=0.0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) + shift
    X[: n // 2] += 4
    X = X.astype(dtype) if dtype != "bool" else (X > 0)
    if os.path.exists(path): shutil.rmtree(path)
    a = zarr.create_array(path, shape=X.shape, chunks=(chunk, d), dtype=X.dtype, zarr_format=zarr_format)
    a[:] = X
    return X
def digest(outdir):
    """values of every array under outdir (except checkpoint) -> sha256"""
    out = {}
    try: g = zarr.open_group(outdir, mode="r")
    except Exception as ex: return {"<root>": "ERR"}
    def walk(g, pre):
        for k, v in g.members():
            name = pre + k
            if name.startswith("checkpoint"): continue
            if isinstance(v, zarr.Array):
                try: out[name] = hashlib.sha256(np.ascontiguousarray(v[...]).tobytes()).hexdigest()[:16]
                except Exception as ex: out[name] = "ERR:" + type(ex).__name__
            else:
                walk(v, name + "/")
    walk(g, "")
    return out
def chunks(arrdir):
    r = []
    for root, ds, fs in os.walk(os.path.join(arrdir, "c")):
        for f in fs: r.append(os.path.join(root, f))
    return sorted(r)
def flip(path, pos=None):
    b = bytearray(open(path, "rb").read()); i = len(b)//2 if pos is None else pos
    b[i] ^= 0x01; open(path, "wb").write(bytes(b))
def trunc(path): 
    b = open(path, "rb").read(); open(path, "wb").write(b[: len(b)//2])
def cmp(a, b):
    da, db = digest(a), digest(b)
    diff = sorted(k for k in set(da) | set(db) if da.get(k) != db.get(k))
    return diff
