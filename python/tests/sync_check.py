"""The synchronous all-reduce of the migctl backend on CPU tensors: torch 2.x
passes opts.asyncOp=False when the caller waits at once (dist.all_reduce
without async_op), and ProcessGroupMigctl.allreduce then issues and waits in
one C call (migctl_run) and returns a finished Work. torch 1.13's options have
no asyncOp, so this calls the process group with options that have it, as
torch 2.x's dist.all_reduce does:

    migctl run --sim h200x8 --profile 1g.18gb --np 3 -- python3 python/tests/sync_check.py

Checks every dtype and op, that the Work is finished when the call returns
(an asynchronous one is not: nobody has waited for it), that it went through
migctl_run (the library's "runs" counter) while asyncOp=True and no asyncOp
did not, the general path for what the fast path leaves (non-contiguous,
several tensors), order behind collectives in flight, and errors raised at
the call; and the same one-call path for broadcast, all-gather into and
reduce-scatter of one tensor, and barrier. Where torch has asyncOp (2.x), dist.all_reduce itself must take
the path. Prints one JSON line per rank; exits 1 on failure."""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import migctl_torch  # noqa: E402,F401  (registers the backend)
from migctl_torch import _lib, process_group  # noqa: E402

failures = []
checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        failures.append(what)


class Opts:
    """A collective's options as torch 2.x fills them (1.13's have no asyncOp)."""

    def __init__(self, op=dist.ReduceOp.SUM, async_op=False, rootRank=0):
        self.reduceOp = op
        self.rootRank = rootRank
        if async_op is not None:
            self.asyncOp = async_op


def runs():
    return _lib.load().stats()["runs"]


def main():
    dist.init_process_group("migctl")
    rank, size = dist.get_rank(), dist.get_world_size()
    pg = dist.distributed_c10d._get_default_group()
    if not isinstance(pg, process_group.ProcessGroupMigctl):
        pg = pg._get_backend(torch.device("cpu"))
    ranks = torch.arange(size, dtype=torch.float64)

    ops = [("SUM", lambda v: v.sum()), ("AVG", lambda v: v.sum() / size), ("MIN", lambda v: v.min()),
           ("MAX", lambda v: v.max())]
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]
    for dt in dtypes:
        for name, ref in ops:
            if not hasattr(dist.ReduceOp, name):
                continue
            n = 7
            t = (torch.arange(n, dtype=torch.float64) + rank + 1).to(dt)
            want = torch.stack([(torch.arange(n, dtype=torch.float64) + r + 1).to(dt).to(torch.float64)
                                for r in range(size)])
            if name == "AVG":
                want = want.sum(0) / size
                if not dt.is_floating_point:
                    want = want.trunc()
            else:
                want = torch.stack([ref(want[:, k]) for k in range(n)])
            r0 = runs()
            w = pg.allreduce([t], Opts(getattr(dist.ReduceOp, name)))
            check(w.is_completed() and w.is_success() and w.exception() is None,
                  f"{dt} {name}: the synchronous Work is not finished when the call returns")
            check(runs() - r0 == 1, f"{dt} {name}: {runs() - r0} migctl_run calls, want 1")
            check(w.wait() is True, f"{dt} {name}: wait")
            got = t.to(torch.float64)
            tol = 1e-2 * float(want.abs().max()) if dt in (torch.float16, torch.bfloat16) else 1e-9
            check(torch.allclose(got, want, atol=tol, rtol=0), f"{dt} {name}: {got.tolist()} want {want.tolist()}")
            fut = w.get_future()
            check(fut.done() and fut.wait()[0] is t, f"{dt} {name}: the future")
    del ranks
    # a waited-for Work (and its tensors) is not kept by the backend
    check(not process_group._Done._held, f"{len(process_group._Done._held)} finished Works still held after wait")

    # asyncOp=True and options without asyncOp (torch 1.13): the asynchronous path
    for opts in (Opts(async_op=True), Opts(async_op=None), None):
        t = torch.full((5,), float(rank + 1))
        r0 = runs()
        w = pg.allreduce([t], opts)
        check(runs() == r0, f"asyncOp={getattr(opts, 'asyncOp', 'absent')}: went through migctl_run")
        check(isinstance(w, process_group.Work), f"asyncOp={getattr(opts, 'asyncOp', 'absent')}: {type(w).__name__}, "
                                                 "not the asynchronous path's Work")
        w.wait()
        check(t.tolist() == [size * (size + 1) / 2] * 5, f"async path: {t.tolist()}")

    # what the fast path leaves to the general one: still correct, still waited for by torch
    base = torch.zeros(4, 3)
    base[:, 0] = rank + 1
    nc = base[:, 0]  # not contiguous
    w = pg.allreduce([nc], Opts())
    w.wait()
    check(nc.tolist() == [size * (size + 1) / 2] * 4 and base[:, 1].sum().item() == 0, f"non-contiguous: {base.tolist()}")
    a, b = torch.full((3,), float(rank)), torch.full((2,), 1.0)
    w = pg.allreduce([a, b], Opts())
    w.wait()
    check(a.tolist() == [size * (size - 1) / 2] * 3 and b.tolist() == [float(size)] * 2, f"two tensors: {a} {b}")

    # in order behind collectives in flight: rank 0 comes late, so the others'
    # broadcast is still queued when they all-reduce synchronously
    x = torch.full((6,), float(rank + 1))
    if rank == 0:
        time.sleep(0.3)
    wb = dist.broadcast(x, 0, async_op=True)
    pg.allreduce([x], Opts()).wait()
    wb.wait()
    check(x.tolist() == [float(size)] * 6, f"sync all-reduce after a queued broadcast: {x.tolist()}")
    # and an asynchronous one issued after it sees its result
    y = torch.full((2,), float(rank + 1))
    pg.allreduce([y], Opts())
    w = dist.all_reduce(y, async_op=True)
    w.wait()
    check(y.tolist() == [size * size * (size + 1) / 2] * 2, f"async after sync: {y.tolist()}")

    # errors: at the call, with the library's code and text
    comm = process_group._Comm.get()
    crun = comm.crun
    comm.crun = lambda *a: _lib.ERR_TIMEOUT
    try:
        pg.allreduce([torch.ones(2)], Opts())
        check(False, "an error of migctl_run did not raise")
    except _lib.MigctlError as e:
        check(e.code == _lib.ERR_TIMEOUT and "allreduce" in str(e), f"error of migctl_run: {e.code} {e}")
    finally:
        comm.crun = crun
    # bool: SUM is a logical OR (the general path: the one-call path takes the SDK's dtypes)
    b = torch.tensor([rank == 0, False, True])
    pg.allreduce([b], Opts()).wait()
    check(b.view(torch.uint8).tolist() == [1, 0, 1], f"bool sum: {b.view(torch.uint8).tolist()}")
    try:
        pg.allreduce([torch.ones(2, dtype=torch.bool)], Opts(dist.ReduceOp.AVG))
        check(False, "a bool average did not raise")
    except NotImplementedError as e:
        check("bool" in str(e) and "AVG" in str(e), f"bool average: {e}")
    # the operators the library has not, on both paths (the operator is found by its hash first)
    for name in ("PRODUCT", "BAND", "BOR", "BXOR"):
        for async_op in (False, True):
            try:
                pg.allreduce([torch.ones(2)], Opts(getattr(dist.ReduceOp, name), async_op))
                check(False, f"{name} (asyncOp={async_op}) did not raise")
            except NotImplementedError as e:
                check("ReduceOp" in str(e), f"{name}: {e}")

    # the other collectives' synchronous calls (torch 2.x passes asyncOp=False to each):
    # one migctl_run each, finished at the return; asyncOp=True queues
    for async_op in (False, True):
        tag = f"asyncOp={async_op}"
        r0 = runs()
        b = torch.full((4,), float(rank + 10))
        w = pg.broadcast([b], Opts(async_op=async_op, rootRank=size - 1))
        done_at_return = w.is_completed()
        w.wait()
        check(b.tolist() == [float(size - 1 + 10)] * 4, f"broadcast {tag}: {b.tolist()}")
        out = torch.empty(size * 3, dtype=torch.int32)
        w = pg._allgather_base(out, torch.full((3,), rank, dtype=torch.int32), Opts(async_op=async_op))
        done_at_return = done_at_return and w.is_completed()
        w.wait()
        check(out.tolist() == [r for r in range(size) for _ in range(3)], f"all-gather into a tensor {tag}: {out}")
        red = torch.empty(2)
        w = pg._reduce_scatter_base(red, torch.arange(2 * size, dtype=torch.float32) + rank, Opts(async_op=async_op))
        done_at_return = done_at_return and w.is_completed()
        w.wait()
        base = 2 * rank
        check(red.tolist() == [float(size * (base + k) + size * (size - 1) / 2) for k in range(2)],
              f"reduce-scatter of a tensor {tag}: {red.tolist()}")
        w = pg.barrier(Opts(async_op=async_op))
        done_at_return = done_at_return and w.is_completed()
        w.wait()
        if async_op:
            check(runs() == r0, f"{tag}: {runs() - r0} collectives went through migctl_run")
        else:
            check(runs() - r0 == 4, f"{tag}: {runs() - r0} migctl_run calls for broadcast, all-gather, "
                                    "reduce-scatter and barrier, want 4")
            check(done_at_return, f"{tag}: a synchronous call returned an unfinished Work")
    # what the synchronous path leaves to the general one: a non-contiguous output
    r0 = runs()
    wide = torch.zeros(size, 2)
    w = pg._allgather_base(wide[:, 0], torch.full((1,), float(rank)), Opts())
    w.wait()
    check(runs() == r0 and wide[:, 0].tolist() == [float(r) for r in range(size)] and wide[:, 1].sum().item() == 0,
          f"all-gather into a non-contiguous tensor: {wide.tolist()}")
    try:
        pg.broadcast([torch.ones(1)], Opts(rootRank=size))
        check(False, "a broadcast from a root out of range did not raise")
    except ValueError as e:
        check("root" in str(e), f"root out of range: {e}")

    # An asynchronous broadcast takes the one-call path only where the library queues it and nothing of
    # this process is in flight (else migctl_run would wait for those and for the peers).
    comm = pg._comm
    check(comm.queued_broadcast_bytes() == 0, f"host backend queues broadcasts: {comm.queued_broadcast_bytes()}")
    check(comm.quiet(), "in flight with nothing issued")
    pending = pg.allreduce([torch.ones(4)], Opts(async_op=True))
    lib = _lib.load().lib
    handle = pending._handles[0]
    # in flight while the library runs it: quiet only once it has finished, waited for or not
    if comm.quiet():
        check(lib.migctl_test(handle) != _lib.PENDING, "quiet with an asynchronous all-reduce still running")
    deadline = time.monotonic() + 30
    while not comm.quiet() and time.monotonic() < deadline:
        time.sleep(0.001)
    check(comm.quiet(), "an asynchronous all-reduce never waited for still counts as in flight once finished")
    check(pending.is_completed(), "the finished all-reduce's Work is not completed")
    pending.wait()  # after the reap: returns at once, with the result
    check(pending.result()[0].tolist() == [float(size)] * 4, f"reaped all-reduce: {pending.result()[0].tolist()}")
    check(comm.quiet(), "not quiet after waiting for the all-reduce")

    class Stand:  # a CUDA tensor's attributes, and a group's answers, without a GPU
        def __init__(self, n=256, contiguous=True, cuda=True):
            self.n, self.contiguous, self.is_cuda = n, contiguous, cuda

        def is_contiguous(self):
            return self.contiguous

        def numel(self):
            return self.n

        def element_size(self):
            return 4

    class Group:
        def __init__(self, limit, quiet=True):
            self.limit, self.q = limit, quiet

        def queued_broadcast_bytes(self):
            return self.limit

        def quiet(self):
            return self.q

    for what, g, ts, want in [("fits", Group(1024), [Stand()], True),
                              ("limit 0 (bcast=cpu, IPC, swap)", Group(0), [Stand()], False),
                              ("over the limit", Group(1020), [Stand()], False),
                              ("collectives in flight", Group(1024, quiet=False), [Stand()], False),
                              ("two tensors", Group(1024), [Stand(), Stand()], False),
                              ("non-contiguous", Group(1024), [Stand(contiguous=False)], False),
                              ("a CPU tensor", Group(1024), [Stand(cuda=False)], False),
                              ("a group without the query (across nodes)", object(), [Stand()], False)]:
        check(process_group._queued_broadcast(g, ts) == want, f"queued broadcast, {what}: want {want}")

    # torch 2.x: dist.all_reduce without async_op says asyncOp=False itself
    asyncop = hasattr(dist.AllreduceOptions(), "asyncOp")
    if asyncop:
        t = torch.full((3,), float(rank))
        r0 = runs()
        dist.all_reduce(t)
        check(runs() - r0 == 1, f"dist.all_reduce did not go through migctl_run ({runs() - r0} calls)")
        check(t.tolist() == [size * (size - 1) / 2] * 3, f"dist.all_reduce: {t.tolist()}")

    dist.barrier()
    print(json.dumps({"rank": rank, "torch": torch.__version__, "asyncop_in_torch": asyncop, "checks": checks,
                      "failures": failures}), flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
