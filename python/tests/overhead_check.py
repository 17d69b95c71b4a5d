"""Per-call cost of the migctl backend, an 8 KiB float32 all-reduce (ELEMS=n: n elements):

    migctl run --sim h200x8 --profile 1g.18gb --np 1 -- python3 python/tests/overhead_check.py
    migctl run --gpus 0 --np 7 -- python3 python/tests/overhead_check.py --device cuda --breakdown

- process_group_us: dist.all_reduce (issue + wait), median of blocks of N
  calls;
- c_abi_us: the library's C calls for the same (migctl_issue + migctl_wait;
  on CUDA with the current stream); c_run_us: the same in one call
  (migctl_run, what a synchronous all-reduce calls);
- sync_pg_us: ProcessGroupMigctl.allreduce with opts.asyncOp=False, then
  wait(): what torch 2.x's dist.all_reduce does without async_op, less
  torch's wrapper (torch 1.13 has no asyncOp: its dist.all_reduce takes
  the asynchronous path);
- async_issue_us: dist.all_reduce(async_op=True) alone (Python and a C call
  that only queues the collective);
- python_only_us: dist.all_reduce with the library's two calls stubbed out,
  i.e. what torch's wrapper and this package cost per call (the issue's
  budget is 20 us);
- lib: the library's counters over each measurement, per call (migctl_stats):
  queue_us (issue -> the dispatcher takes it), run_us (the trainer SDK's
  call), wake_us (its end -> the wait returns), wait_sleeps and
  dispatch_sleeps (futex sleeps per call: each costs a wake), marks and
  idle_marks (device calls whose stream had work queued / was idle), runs
  (share of the calls that went through migctl_run: 1.0 for
  process_group when torch passes asyncOp=False);
- sched: the scheduler's view of this process over each measurement, per
  call (Linux /proc schedstat): run_us and runq_us (on a CPU / runnable but
  waiting for one) of the calling thread and of all threads, and how often
  the calling thread was preempted; cpus, how many CPUs it may run on;
- --breakdown: where a dist.all_reduce's time goes, from timers wrapped
  around the package's methods for one more measurement (each adds ~0.2 us):
  torch_us (torch.distributed's wrapper around the process group), pg_issue_us
  (ProcessGroupMigctl.allreduce, of which c_issue_us, or c_run_us for a
  synchronous call, is the C call) and wait_us (Work.wait, of which
  c_wait_us is the C call);
- CUDA: after_kernel_us, a dist.all_reduce after a kernel that writes the
  tensor on the current stream (the collective waits for it through an
  event), beside kernel_sync_us, the same kernel and a stream synchronize.

With --np 1 the collective itself is trivial, so the numbers are the per-call
overheads; with more ranks they include the collective (and, on a machine
with fewer cores than ranks need, its scheduling). Prints one JSON line per
rank."""

import argparse
import collections
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
COUNT = int(os.environ.get("ELEMS", 2048))  # float32 elements: 8 KiB unless ELEMS says otherwise

LIB_STATS = {}  # measurement -> the library's counters over it, per call
SCHED = {}  # measurement -> the scheduler's view of this process over it, per call


def sched_now():
    """(main thread run ns, main thread run-queue wait ns, all threads' run
    ns, all threads' run-queue wait ns, main thread's involuntary switches)
    from /proc (Linux); None where /proc has no schedstat."""
    def stat(path):
        with open(path) as f:
            run, wait, _ = f.read().split()
        return int(run), int(wait)
    try:
        run, wait = stat("/proc/thread-self/schedstat")
        trun = twait = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                r, w = stat(f"/proc/self/task/{tid}/schedstat")
            except OSError:
                continue
            trun, twait = trun + r, twait + w
        with open("/proc/thread-self/status") as f:
            nv = next(int(line.split()[1]) for line in f if line.startswith("nonvoluntary_ctxt_switches"))
        return run, wait, trun, twait, nv
    except (OSError, ValueError, StopIteration):
        return None


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def blocks(f, name, device):
    out = []
    lib = _lib.load()
    before = lib.stats()
    s0 = sched_now()
    for _ in range(ROUNDS):
        sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        f(N)
        sync(device)
        out.append((time.perf_counter() - t0) / N * 1e6)
    after = lib.stats()
    s1 = sched_now()
    if s0 and s1:
        calls = N * ROUNDS
        ds = [(b - a) / calls for a, b in zip(s0, s1)]
        SCHED[name] = {"run_us": round(ds[0] / 1e3, 2), "runq_us": round(ds[1] / 1e3, 2),
                       "threads_run_us": round(ds[2] / 1e3, 2), "threads_runq_us": round(ds[3] / 1e3, 2),
                       "preempted": round(ds[4], 3), "cpus": len(os.sched_getaffinity(0))}
    d = {k: after[k] - before[k] for k in after}
    done, waits = max(d["done"], 1), max(d["waits"], 1)
    LIB_STATS[name] = {"queue_us": round(d["queue_ns"] / done / 1e3, 2), "run_us": round(d["run_ns"] / done / 1e3, 2),
                       "wake_us": round(d["wake_ns"] / waits / 1e3, 2),
                       "wait_sleeps": round(d["wait_sleeps"] / waits, 3),
                       "dispatch_sleeps": round(d["dispatch_sleeps"] / done, 3),
                       "marks": d["marks"], "idle_marks": d["idle_marks"],
                       "runs": round(d.get("runs", 0) / done, 3), "direct": round(d.get("direct", 0) / done, 3)}
    return round(statistics.median(out), 2)


def breakdown(t, device, comm):
    """Times of the parts of a dist.all_reduce, from wrappers (restored after)."""
    acc = collections.Counter()
    clock = time.perf_counter_ns
    pg_cls, work_cls = process_group.ProcessGroupMigctl, process_group.Work
    allreduce, wait, issue, cwait, crun = pg_cls.allreduce, work_cls.wait, comm.cissue, comm.cwait, comm.crun

    def t_allreduce(self, tensors, opts=None):
        t0 = clock()
        r = allreduce(self, tensors, opts)
        acc["pg_issue"] += clock() - t0
        return r

    def t_wait(self, timeout=None):
        t0 = clock()
        r = wait(self, timeout)
        acc["wait"] += clock() - t0
        return r

    def t_issue(*a):
        t0 = clock()
        r = issue(*a)
        acc["c_issue"] += clock() - t0
        return r

    def t_cwait(h, ms):
        t0 = clock()
        r = cwait(h, ms)
        acc["c_wait"] += clock() - t0
        return r

    def t_crun(*a):
        t0 = clock()
        r = crun(*a)
        acc["c_run"] += clock() - t0
        return r

    pg_cls.allreduce, work_cls.wait, comm.cissue, comm.cwait, comm.crun = t_allreduce, t_wait, t_issue, t_cwait, t_crun
    try:
        for _ in range(50):
            dist.all_reduce(t)
        sync(device)
        acc.clear()
        dist.barrier()
        n = N * 4
        t0 = clock()
        for _ in range(n):
            dist.all_reduce(t)
        total = clock() - t0
    finally:
        pg_cls.allreduce, work_cls.wait, comm.cissue, comm.cwait, comm.crun = allreduce, wait, issue, cwait, crun
    us = {k: round(v / n / 1e3, 2) for k, v in acc.items()}
    res = {"total_us": round(total / n / 1e3, 2), "torch_us": round((total - acc["pg_issue"] - acc["wait"]) / n / 1e3, 2)}
    res.update({f"{k}_us": us.get(k, 0.0) for k in ("pg_issue", "c_issue", "c_run", "wait", "c_wait")})
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--breakdown", action="store_true")
    args = ap.parse_args()
    device = args.device
    if device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("migctl")
    rank = dist.get_rank()
    comm = process_group._Comm.get()
    t = torch.ones(COUNT, device=device)
    p = t.data_ptr()
    issue, wait = comm.cissue, comm.cwait
    where = _lib.DEVICE if device == "cuda" else _lib.HOST
    stream = process_group._current_stream(t.device) if device == "cuda" else 0

    def pg(n):
        for _ in range(n):
            dist.all_reduce(t)

    def raw(n):
        for _ in range(n):
            wait(issue(_lib.KIND_ALLREDUCE, p, p, COUNT, _lib.FLOAT32, _lib.SUM, 0, where, stream), -1)

    crun = comm.crun

    def raw_run(n):
        for _ in range(n):
            crun(_lib.KIND_ALLREDUCE, p, p, COUNT, _lib.FLOAT32, _lib.SUM, 0, where, stream)

    pgroup = dist.distributed_c10d._get_default_group()
    sync_opts = SyncOpts()

    def sync_pg(n):
        for _ in range(n):
            pgroup_allreduce([t], sync_opts).wait()
    # the Python object (torch 2.x's default group wraps it in a C++ one)
    pgroup_allreduce = process_group.ProcessGroupMigctl.allreduce.__get__(pg_object(pgroup))

    pg(200)
    res = {"rank": rank, "world": dist.get_world_size(), "torch": torch.__version__, "device": device, "bytes": 4 * COUNT,
           "spin_env": {k: v for k, v in os.environ.items() if k.startswith("MIGCTL_LIB_SPIN") or
                        k.startswith("MIGCTL_LIB_DISPATCH")},
           "process_group_us": blocks(pg, "process_group", device), "c_abi_us": blocks(raw, "c_abi", device),
           "c_run_us": blocks(raw_run, "c_run", device), "sync_pg_us": blocks(sync_pg, "sync_pg", device)}
    iss = []
    for _ in range(ROUNDS):
        dist.barrier()
        t0 = time.perf_counter()
        ws = [dist.all_reduce(t, async_op=True) for _ in range(64)]
        iss.append((time.perf_counter() - t0) / 64 * 1e6)
        for w in ws:
            w.wait()
    res["async_issue_us"] = round(statistics.median(iss), 2)
    if device == "cuda":
        def after_kernel(n):
            for _ in range(n):
                t.mul_(1.0)
                dist.all_reduce(t)

        def kernel_sync(n):
            s = torch.cuda.current_stream()
            for _ in range(n):
                t.mul_(1.0)
                s.synchronize()
        res["after_kernel_us"] = blocks(after_kernel, "after_kernel", device)
        res["kernel_sync_us"] = blocks(kernel_sync, "kernel_sync", device)
    if args.breakdown:
        res["breakdown"] = breakdown(t, device, comm)
    dist.barrier()
    # the library stubbed: what is left is Python (torch's and ours)
    count = itertools.count(1)
    comm.cissue, comm.cwait, comm.crun = (lambda *a: next(count)), (lambda h, ms: 0), (lambda *a: 0)
    try:
        res["python_only_us"] = round(min(statistics.median(
            [timed_block(pg) for _ in range(ROUNDS)]) for _ in range(3)), 2)
    finally:
        comm.cissue, comm.cwait, comm.crun = issue, wait, crun
    res["lib"] = LIB_STATS
    res["sched"] = SCHED
    print(json.dumps(res), flush=True)
    dist.barrier()


class SyncOpts:
    """AllreduceOptions as torch 2.x fills them for dist.all_reduce without
    async_op (torch 1.13's have no asyncOp)."""
    reduceOp = dist.ReduceOp.SUM
    asyncOp = False


def pg_object(group):
    """The ProcessGroupMigctl behind torch's default group."""
    if isinstance(group, process_group.ProcessGroupMigctl):
        return group
    for dev in ("cpu", "cuda"):
        try:
            b = group._get_backend(torch.device(dev))
        except Exception:  # noqa: BLE001 - older torch, or no backend for dev
            continue
        if isinstance(b, process_group.ProcessGroupMigctl):
            return b
    raise RuntimeError(f"no ProcessGroupMigctl behind {group!r}")


def timed_block(f):
    t0 = time.perf_counter()
    f(N)
    return (time.perf_counter() - t0) / N * 1e6


if __name__ == "__main__":
    main()
