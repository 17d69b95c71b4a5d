"""A collective inside a CUDA graph capture (torch.cuda.graph): the migctl
backend cannot be captured (its copies and flags run on the host), so the
call must raise at once on every rank, and the group must go on working
after the capture is abandoned:

    migctl run --gpus 0 --np 2 -- python3 python/tests/capture_check.py

Prints one JSON line per rank: the capture's error and the ones it was
raised while handling (torch's graph context raises its own when the
capture ends invalidated, chained to ours), how long it took, and the
result of an all-reduce after it (the world size when the group still
works); exits 1 when our error is not in the chain or the group broke."""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import migctl_torch  # noqa: E402,F401  (registers the backend)

dist.init_process_group("migctl")
r = dist.get_rank()
dev = torch.device("cuda", 0)
x = torch.ones(1024, device=dev)
dist.all_reduce(x)  # warm
s = torch.cuda.Stream()
g = torch.cuda.CUDAGraph()
err, t0 = None, time.perf_counter()
try:
    with torch.cuda.graph(g, stream=s):
        y = x * 2
        dist.all_reduce(y)
except Exception as e:
    err = e
secs = time.perf_counter() - t0
after = None
try:
    torch.cuda.synchronize()
    z = torch.ones(1024, device=dev)
    dist.all_reduce(z)
    after = z[0].item()
except Exception as e:
    after = f"{type(e).__name__}: {str(e)[:200]}"
chain = []  # the exception and the ones it was raised while handling
e = err
while e is not None and len(chain) < 4:
    chain.append(f"{type(e).__name__}: {str(e)[:300]}")
    e = e.__context__
failures = []
if err is None:
    failures.append("the capture did not raise")
elif not any("CUDA graph" in c for c in chain):
    failures.append("no error in the chain says the collective cannot be captured")
if after != float(dist.get_world_size()):
    failures.append(f"all-reduce after the capture gave {after}")
print(json.dumps({"rank": r, "errors": chain, "seconds": round(secs, 3), "after": after, "failures": failures}),
      flush=True)
sys.exit(1 if failures else 0)
