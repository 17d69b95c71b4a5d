"""Per-call cost of the migctl backend on CPU tensors (no GPU needed):

    migctl run --sim h200x8 --profile 1g.18gb --np 1 -- python3 python/tests/overhead_check.py

- process_group_us: an 8 KiB float32 dist.all_reduce (issue + wait), median
  of blocks of N calls;
- c_abi_us: the library's C calls for the same (migctl_issue + migctl_wait);
- async_issue_us: dist.all_reduce(async_op=True) alone (Python and a C call
  that only queues the collective);
- python_only_us: dist.all_reduce with the library's two calls stubbed out,
  i.e. what torch's wrapper and this package cost per call (the issue's
  budget is 20 us).

With --np 1 the collective itself is trivial, so the numbers are the per-call
overheads; with more ranks they include the collective (and, on a machine
with fewer cores than ranks need, its scheduling). Prints one JSON line per
rank."""

import itertools
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import migctl_torch  # noqa: E402,F401  (registers the backend)
from migctl_torch import _lib, process_group  # noqa: E402

N = int(os.environ.get("N", 500))
ROUNDS = int(os.environ.get("ROUNDS", 12))


def blocks(f):
    out = []
    for _ in range(ROUNDS):
        dist.barrier()
        t0 = time.perf_counter()
        f(N)
        out.append((time.perf_counter() - t0) / N * 1e6)
    return round(statistics.median(out), 2)


def main():
    dist.init_process_group("migctl")
    rank = dist.get_rank()
    comm = process_group._Comm.get()
    t = torch.ones(2048)  # 8 KiB of float32
    p = t.data_ptr()
    issue, wait = comm.cissue, comm.cwait

    def pg(n):
        for _ in range(n):
            dist.all_reduce(t)

    def raw(n):
        for _ in range(n):
            wait(issue(_lib.KIND_ALLREDUCE, p, p, 2048, _lib.FLOAT32, _lib.SUM, 0, _lib.HOST, 0), -1)

    def async_issue(n):
        ws = [dist.all_reduce(t, async_op=True) for _ in range(n)]
        return ws

    pg(200)
    res = {"rank": rank, "world": dist.get_world_size(), "torch": torch.__version__,
           "process_group_us": blocks(pg), "c_abi_us": blocks(raw)}
    iss = []
    for _ in range(ROUNDS):
        dist.barrier()
        t0 = time.perf_counter()
        ws = async_issue(64)
        iss.append((time.perf_counter() - t0) / 64 * 1e6)
        for w in ws:
            w.wait()
    res["async_issue_us"] = round(statistics.median(iss), 2)
    dist.barrier()
    # the library stubbed: what is left is Python (torch's and ours)
    count = itertools.count(1)
    comm.cissue, comm.cwait = (lambda *a: next(count)), (lambda h, ms: 0)
    try:
        res["python_only_us"] = round(min(blocks(pg) for _ in range(3)), 2)
    finally:
        comm.cissue, comm.cwait = issue, wait
    print(json.dumps(res), flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
