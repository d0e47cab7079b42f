import os, sys, time, shutil, subprocess
sys.path.insert(0, "/tmp/a52"); from h import *
from moto import server as ms
s = ms.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False); s.start()
host, port = s.get_host_and_port(); ep = f"http://{host}:{port}"
import s3fs
os.environ.update(AWS_ENDPOINT_URL=ep, AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s", AWS_DEFAULT_REGION="us-east-1")
fs = s3fs.S3FileSystem(); fs.mkdir("bkt")
fs.put("/tmp/a52/in.zarr", "bkt/in.zarr", recursive=True)
fs.put("/tmp/a52/in2.zarr", "bkt/in2.zarr", recursive=True)
print(fs.ls("bkt"))
base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
base.update(HOME="/tmp/a52/nohome", AWS_CONFIG_FILE="/tmp/a52/nonexist", AWS_SHARED_CREDENTIALS_FILE="/tmp/a52/nonexist", AWS_EC2_METADATA_DISABLED="true")
def r(env, *a):
    p = subprocess.run(["ooc-spectral", *map(str, a)], capture_output=True, text=True, env=env, timeout=300)
    return p.returncode, (p.stderr.strip().splitlines() or [""])[-1][:300]
nocred = dict(base, AWS_ENDPOINT_URL=ep, AWS_DEFAULT_REGION="us-east-1")
cred = dict(nocred, AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s")
so = '{"endpoint_url": "%s"}' % ep
print("fit s3 in, local out, no creds:", r(nocred, "fit", "s3://bkt/in.zarr", "--out", "/tmp/a52/s3o1", "-q"))
print("fit local in, s3 out, no creds:", r(nocred, "fit", "/tmp/a52/in.zarr", "--out", "s3://bkt/o2", "-q"))
print("verify s3, no creds:", r(nocred, "verify", "s3://bkt/in.zarr"))
print("inspect s3, no creds:", r(nocred, "inspect", "s3://bkt/in.zarr"))
print("transform s3 in, no creds:", r(nocred, "transform", "/tmp/a52/ref_fit", "s3://bkt/in2.zarr", "--out", "/tmp/a52/s3o3", "-q"))
print("make-data s3 out, no creds:", r(nocred, "make-data", "blobs", "--n", 1000, "--out", "s3://bkt/md", "-q"))
print("rep fit s3, no creds:", r(nocred, "fit", "s3://bkt/in.zarr", "--out", "/tmp/a52/s3o4", "--n-clusters", 3, "-q"))
print("with a profile that does not exist:", r(dict(nocred, AWS_PROFILE="nope"), "fit", "s3://bkt/in.zarr", "--out", "/tmp/a52/s3o5", "-q"))
print("wrong keys:", r(dict(nocred, AWS_ACCESS_KEY_ID="bad", AWS_SECRET_ACCESS_KEY="bad"), "fit", "s3://bkt/in.zarr", "--out", "/tmp/a52/s3o6", "-q"))
print("only key id:", r(dict(nocred, AWS_ACCESS_KEY_ID="k"), "fit", "s3://bkt/in.zarr", "--out", "/tmp/a52/s3o7", "-q"))
# with creds: fit on s3 then transform to s3, change input between
shutil.rmtree("/tmp/a52/s3f", ignore_errors=True)
print("fit s3 with creds:", r(cred, "fit", "s3://bkt/in.zarr", "--out", "s3://bkt/fo", "--chunk-rows", 500, "-q"))
print("verify:", r(cred, "verify", "s3://bkt/fo"))
print("transform s3:", r(cred, "transform", "s3://bkt/fo", "s3://bkt/in2.zarr", "--out", "s3://bkt/to", "-q"))
# damage: delete a model chunk object & a representatives chunk; verify and rerun
objs = [o for o in fs.find("bkt/fo/model") if "/c/" in o]
fs.rm(objs[0]); print("deleted", objs[0])
print("verify after model chunk rm:", r(cred, "verify", "s3://bkt/fo"))
print("transform on damaged:", r(cred, "transform", "s3://bkt/fo", "s3://bkt/in2.zarr", "--out", "s3://bkt/to2", "-q"))
print("rerun fit:", r(cred, "fit", "s3://bkt/in.zarr", "--out", "s3://bkt/fo", "--chunk-rows", 500, "-q"))
print("verify:", r(cred, "verify", "s3://bkt/fo"))
# change the input between runs: overwrite a chunk in s3 (same size)
ch = sorted(o for o in fs.find("bkt/in2.zarr") if "/c/" in o)[3]
data = fs.cat(ch); fs.pipe(ch, data)  # rewrite identical bytes (new etag? same md5)
print("transform rerun after identical rewrite:", r(cred, "transform", "s3://bkt/fo", "s3://bkt/in2.zarr", "--out", "s3://bkt/to", "-q"))
fs.pipe(ch, fs.cat(sorted(o for o in fs.find("bkt/in.zarr") if "/c/" in o)[3]))  # other rows, same size
print("transform rerun after input chunk changed:", r(cred, "transform", "s3://bkt/fo", "s3://bkt/in2.zarr", "--out", "s3://bkt/to", "-q"))
import zarr
shutil.rmtree("/tmp/a52/s3tr_local", ignore_errors=True)
fs.get("bkt/in2.zarr", "/tmp/a52/s3in2_local", recursive=True)
fs.get("bkt/fo", "/tmp/a52/s3fo_local", recursive=True)
print("local transform:", r(cred, "transform", "/tmp/a52/s3fo_local", "/tmp/a52/s3in2_local", "--out", "/tmp/a52/s3tr_local", "-q"))
a = zarr.open_array("s3://bkt/to/embedding", storage_options={"endpoint_url": ep})[:]
b = zarr.open_array("/tmp/a52/s3tr_local/embedding")[:]
print("s3 transform equals a fresh local transform of the changed input:", np.array_equal(a, b))
s.stop()
