"""Collectives of the migctl backend never block the caller: with the last
rank SLOW seconds late, every other rank issues async all-reduces (two in a
row, as DDP issues its buckets), a broadcast, an all-gather, a reduce-scatter
and a barrier, and asks for the first one's Future (what DDP's reducer does):
every call must return long before the slow rank's data can have arrived,
nothing may be complete yet, and the Future must then be completed by the
completion thread without anybody calling wait(). The results are checked
afterwards. Then wait(timeout) must raise once the timeout passes, and
is_completed() must turn True on its own (an all-reduce, an uneven
all-gather copied out of a temporary). Also a DDP model whose backward on the punctual ranks must end
before the slow rank has even started its backward (the reducer's all-reduces
run behind it, finalize waits). Run under `migctl run --np 2` or more. Prints
one JSON line per rank; exits 1 on failure."""

import json
import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import migctl_torch  # noqa: E402,F401  (registers the backend)

SLOW = 2.0  # seconds the last rank sleeps before its collectives
LIMIT = 0.5  # what the other ranks' calls may take together, at most

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def main():
    dist.init_process_group("migctl")
    rank, world = dist.get_rank(), dist.get_world_size()
    slow = rank == world - 1
    dist.barrier()
    n = 1 << 16
    a = torch.full((n,), float(rank + 1))
    b = torch.full((n,), float(2 * rank))
    c = torch.arange(8, dtype=torch.float64) if rank == 0 else torch.zeros(8, dtype=torch.float64)
    g_in = torch.full((3,), rank, dtype=torch.int32)
    g_out = [torch.empty(3, dtype=torch.int32) for _ in range(world)]
    rs_in = [torch.full((5,), float(rank + k)) for k in range(world)]
    rs_out = torch.empty(5)
    if slow:
        time.sleep(SLOW)
    t0 = time.perf_counter()
    w1 = dist.all_reduce(a, async_op=True)
    first = time.perf_counter() - t0
    w2 = dist.all_reduce(b, async_op=True)
    fut = w1.get_future()
    ws = [dist.broadcast(c, 0, async_op=True), dist.all_gather(g_out, g_in, async_op=True),
          dist.reduce_scatter(rs_out, rs_in, async_op=True), dist.barrier(async_op=True)]
    issued = time.perf_counter() - t0
    pending = not (w1.is_completed() or w2.is_completed() or fut.done())
    # the Future completes on its own (the completion thread), nobody waits for w1
    deadline = time.perf_counter() + 30
    while not fut.done() and time.perf_counter() < deadline:
        time.sleep(0.005)
    fut_s = time.perf_counter() - t0
    check(fut.done(), "the Future of an all-reduce nobody waited for did not complete within 30 s")
    w2.wait()
    for w in ws:
        w.wait()
    done = time.perf_counter() - t0
    if not slow:
        check(first < LIMIT, f"the first async all_reduce blocked the caller {first:.3f} s "
                             f"(the slow rank's data comes after {SLOW} s)")
        check(issued < LIMIT, f"issuing 6 async collectives took {issued:.3f} s: a call blocks the caller")
        check(pending, "a collective was complete before the slow rank had issued it")
        check(done > SLOW / 2, f"everything finished after {done:.3f} s, before the slow rank could take part")
    s = world * (world + 1) / 2
    check(torch.all(fut.value()[0] == s).item(), f"all_reduce via the Future: {fut.value()[0][:4]} want {s}")
    check(torch.all(a == s).item(), f"all_reduce: {a[:4]} want {s}")
    check(torch.all(b == world * (world - 1)).item(), f"second all_reduce: {b[:4]} want {world * (world - 1)}")
    check(torch.equal(c, torch.arange(8, dtype=torch.float64)), f"broadcast: {c}")
    check(all(torch.all(g_out[r] == r).item() for r in range(world)), f"all_gather: {g_out}")
    want_rs = sum(float(r + rank) for r in range(world))
    check(torch.all(rs_out == want_rs).item(), f"reduce_scatter: {rs_out} want {want_rs}")
    poll_s = polled(rank, world, slow)
    ddp_ms = ddp_backward(rank, world, slow)
    print(json.dumps({"rank": rank, "world": world, "first_call_s": round(first, 4), "issue_s": round(issued, 4),
                      "future_s": round(fut_s, 3), "done_s": round(done, 3), "polled": poll_s, "ddp_backward_s": ddp_ms,
                      "failures": failures}), flush=True)
    dist.barrier()
    sys.exit(1 if failures else 0)


def polled(rank, world, slow):
    """Works nobody waits for complete on their own: with the slow rank late,
    wait(timeout) on the punctual ranks raises after that timeout (not at the
    slow rank's arrival), and is_completed() turns True once the result is in
    the outputs, for an all-reduce and an all-gather of uneven blocks (copied
    out of a temporary), with nobody calling wait()."""
    dist.barrier()
    a = torch.full((1000,), float(rank + 1))
    outs = [torch.zeros(j + 1) for j in range(world)]
    if slow:
        time.sleep(SLOW)
    t0 = time.perf_counter()
    w = dist.all_reduce(a, async_op=True)
    g = dist.all_gather(outs, torch.full((rank + 1,), float(rank)), async_op=True)
    raised = None
    try:
        w.wait(timeout=timedelta(seconds=0.2))
    except RuntimeError as e:
        raised = time.perf_counter() - t0
        check("not finished after" in str(e), f"wait(timeout) raised {e!r}")
    if not slow:
        check(raised is not None, "wait(timeout=0.2 s) of an all-reduce the slow rank joins after "
                                  f"{SLOW} s did not raise")
        check(raised is None or raised < SLOW, f"wait(timeout=0.2 s) raised after {raised} s, not before the slow "
                                               "rank came")
    deadline = time.perf_counter() + 30
    while not (w.is_completed() and g.is_completed()) and time.perf_counter() < deadline:
        time.sleep(0.005)
    check(w.is_completed() and w.is_success(), "is_completed() of an all-reduce nobody waited for stayed False 30 s")
    check(g.is_completed() and g.is_success(), "is_completed() of an uneven all-gather nobody waited for stayed False")
    s = world * (world + 1) / 2
    check(torch.all(a == s).item(), f"polled all_reduce: {a[:4]} want {s}")
    check(all(torch.all(outs[j] == j).item() for j in range(world)),
          f"polled uneven all_gather once complete: {[o.tolist() for o in outs]}")
    w.wait()
    g.wait()
    return {"wait_timeout_raised_s": None if raised is None else round(raised, 3),
            "completed_s": round(time.perf_counter() - t0, 3)}


def ddp_backward(rank, world, slow):
    """A DDP step with several buckets: on the punctual ranks backward()
    issues every bucket's all-reduce and must reach finalize without waiting
    for them; the slow rank's lateness shows up in backward's end (finalize
    waits for the Futures), not before the last bucket was issued."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    ddp = DDP(model, bucket_cap_mb=0.25)  # one bucket per layer or so
    issued = []
    cls = migctl_torch.ProcessGroupMigctl
    orig = cls.allreduce

    def traced(self, tensors, opts=None):
        t = time.perf_counter()
        w = orig(self, tensors, opts)
        issued.append(time.perf_counter() - t)
        return w
    cls.allreduce = traced
    try:
        x = torch.randn(4, 256)
        for _ in range(2):  # the first steps: the second one's forward broadcasts the rebuilt buckets (blocking)
            ddp(x).sum().backward()
        dist.barrier()
        issued.clear()
        if slow:
            time.sleep(SLOW)
        t0 = time.perf_counter()
        ddp(x).sum().backward()
        total = time.perf_counter() - t0
    finally:
        cls.allreduce = orig
    if not slow:
        check(len(issued) >= 3, f"DDP issued {len(issued)} all-reduces, want several buckets")
        check(max(issued) < LIMIT, f"a DDP bucket's all-reduce blocked the backward pass {max(issued):.3f} s")
        check(total > SLOW / 2, f"backward ended after {total:.3f} s, before the slow rank took part")
    dist.barrier()
    return {"buckets": len(issued), "max_issue_s": round(max(issued), 4) if issued else None,
            "backward_s": round(total, 3)}


if __name__ == "__main__":
    main()
