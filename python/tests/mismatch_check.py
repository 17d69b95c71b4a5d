"""Ranks whose collective calls differ: every rank must raise a clear error at
once (not return a wrong result, not wait for the collective deadline):

    migctl run --sim h200x8 --profile 1g.18gb --np 3 -- python3 python/tests/mismatch_check.py --case count

Cases (the last rank is the odd one out; the others agree):
- count: dist.all_reduce of one more element;
- dtype: int32 instead of float32 (same byte count);
- coll: all_gather instead of all_reduce, asynchronous (wait() raises);
- ddp: a model with one more parameter under DDP (its constructor's checks).

Each rank prints one JSON line (rank, case, raised, seconds, error) with
"failures" listing what did not hold; exits 1 on failure. With --device cuda
the tensors are on the GPU."""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import migctl_torch  # noqa: E402,F401  (registers the backend)

MISMATCH = "collective calls differ between ranks"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=("count", "dtype", "coll", "ddp"), default="count")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--within", type=float, default=10.0, help="seconds the error must come within")
    args = ap.parse_args()
    dist.init_process_group("migctl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    odd = rank == world - 1
    failures = []
    # One matching call first: the check must not fire on agreeing ranks.
    t = torch.full((1000,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    if t[0].item() != world * (world + 1) / 2:
        failures.append(f"matching all-reduce gave {t[0].item()}")
    err, t0 = None, time.perf_counter()
    try:
        if args.case == "count":
            x = torch.ones(1000 + (1 if odd else 0), device=dev)
            dist.all_reduce(x)
        elif args.case == "dtype":
            x = torch.ones(1000, device=dev, dtype=torch.int32 if odd else torch.float32)
            dist.all_reduce(x)
        elif args.case == "coll":
            x = torch.ones(1000, device=dev)
            if odd:
                out = [torch.empty_like(x) for _ in range(world)]
                w = dist.all_gather(out, x, async_op=True)
            else:
                w = dist.all_reduce(x, async_op=True)
            w.wait()
        else:
            model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 3 if odd else 2)).to(dev)
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            ddp(torch.ones(4, 8, device=dev)).sum().backward()
            if dev.type == "cuda":
                torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - what is raised is what is checked
        err = e
    secs = time.perf_counter() - t0
    text = f"{type(err).__name__}: {err}" if err is not None else ""
    if err is None:
        failures.append("no error raised")
    elif args.case != "ddp" and MISMATCH not in str(err):
        failures.append(f"the error does not name the cause: {text}")
    if secs > args.within:
        failures.append(f"raised after {secs:.1f} s (want within {args.within} s)")
    print(json.dumps({"rank": rank, "case": args.case, "raised": err is not None, "seconds": round(secs, 3),
                      "error": text[:600], "failures": failures}), flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
