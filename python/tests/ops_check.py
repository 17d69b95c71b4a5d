"""Correctness of every collective of the migctl backend, on CPU tensors (or
CUDA with --device cuda), across the real processes of `migctl run`:

    migctl run --backend host --np 3 -- python3 python/tests/ops_check.py

Every op, every dtype, odd sizes, in place and out of place, non-contiguous
tensors, async Work and Futures, a group of some of the ranks, and the
NotImplementedError of unsupported calls. Inputs are small integers, so every sum is exact in every dtype and
every element is checked. Prints one JSON line; exits 1 on any mismatch."""

import argparse
import faulthandler
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import migctl_torch  # noqa: E402
import migctl_torch.multinode  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.uint8]
OPS = [("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG), ("min", dist.ReduceOp.MIN),
       ("max", dist.ReduceOp.MAX)]

failures = []
checks = 0


def values(n, rank, dtype, device):
    """Small integers, distinct per rank and position (non-negative for uint8)."""
    i = torch.arange(n, dtype=torch.int64)
    v = (i * 7 + rank * 3) % 11
    if dtype != torch.uint8:
        v = v - 5
    return v.to(dtype).to(device)


# OPS_TRACE=1 prints every check with the seconds it took (stderr), to tell a
# slow path from a hang; OPS_DUMP_AFTER=S dumps every thread's stack and exits
# after S seconds.
_TRACE = os.environ.get("OPS_TRACE") == "1"
_last = [time.monotonic()]


def expect(name, got, want):
    global checks
    checks += 1
    if _TRACE:
        now = time.monotonic()
        print(f"[ops] {now - _last[0]:8.3f}s {name}", file=sys.stderr, flush=True)
        _last[0] = now
    if got.is_complex():
        got, want = torch.view_as_real(got), torch.view_as_real(want)
    got64, want64 = got.detach().cpu().to(torch.float64), want.detach().cpu().to(torch.float64)
    tol = 0.0
    if got.dtype in (torch.float16, torch.bfloat16) and "avg" in name:
        tol = 0.02 * (want64.abs().max().item() if want64.numel() else 0) + 1e-2
    elif got.is_floating_point() and "avg" in name:
        tol = 1e-6
    if got64.shape != want64.shape:
        failures.append(f"{name}: shape {tuple(got64.shape)}, want {tuple(want64.shape)}")
        return
    bad = ((got64 - want64).abs() > tol).nonzero()
    if bad.numel():
        k = bad[0].tolist()
        k = tuple(k) if len(k) > 1 else k[0]
        failures.append(f"{name}: {bad.shape[0]} of {got64.numel()} wrong; first at {k}: got "
                        f"{got64[k].item()}, want {want64[k].item()}")


def reduced(n, world, dtype, op):
    stack = torch.stack([values(n, r, torch.int64, "cpu") if dtype != torch.uint8 else values(n, r, dtype, "cpu").to(torch.int64)
                         for r in range(world)])
    if op == "sum":
        out = stack.sum(0)
    elif op == "min":
        out = stack.min(0).values
    elif op == "max":
        out = stack.max(0).values
    elif dtype.is_floating_point:
        return (stack.to(torch.float64).sum(0) / world)
    else:
        out = torch.div(stack.sum(0), world, rounding_mode="trunc")
    return out


def run(device, sizes):
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device(device)

    for dtype in DTYPES:
        for n in sizes:
            for opname, op in OPS:
                want = reduced(n, world, dtype, opname)
                # in place
                t = values(n, rank, dtype, dev)
                dist.all_reduce(t, op=op)
                expect(f"all_reduce {opname} {dtype} n={n} in place", t, want)
            # non-contiguous (a transposed view), sum
            if n >= 6 and n % 2 == 0:
                base = values(n, rank, dtype, dev).reshape(2, n // 2)
                tv = base.t()
                dist.all_reduce(tv)
                expect(f"all_reduce sum {dtype} n={n} non-contiguous", base.reshape(-1), reduced(n, world, dtype, "sum"))

            # all_gather (list of tensors)
            outs = [torch.empty(n, dtype=dtype, device=dev) for _ in range(world)]
            dist.all_gather(outs, values(n, rank, dtype, dev))
            for r in range(world):
                expect(f"all_gather {dtype} n={n} block {r}", outs[r], values(n, r, dtype, "cpu"))

            # all_gather_into_tensor: out of place and in place
            flat = torch.empty(world * n, dtype=dtype, device=dev)
            want = torch.cat([values(n, r, dtype, "cpu") for r in range(world)])
            _all_gather_into_tensor(flat, values(n, rank, dtype, dev))
            expect(f"all_gather_into_tensor {dtype} n={n}", flat, want)
            flat = torch.zeros(world * n, dtype=dtype, device=dev)
            flat[rank * n:(rank + 1) * n] = values(n, rank, dtype, dev)
            _all_gather_into_tensor(flat, flat[rank * n:(rank + 1) * n])
            expect(f"all_gather_into_tensor {dtype} n={n} in place", flat, want)

            # reduce_scatter (list) and reduce_scatter_tensor, out of place and in place
            for opname, op in OPS:
                full = torch.cat([values(world * n, rank, dtype, "cpu")])
                want_all = reduced(world * n, world, dtype, opname)
                want = want_all[rank * n:(rank + 1) * n]
                out = torch.empty(n, dtype=dtype, device=dev)
                dist.reduce_scatter(out, list(full.to(dev).chunk(world)) if n else
                                    [torch.empty(0, dtype=dtype, device=dev) for _ in range(world)], op=op)
                expect(f"reduce_scatter {opname} {dtype} n={n}", out, want)
                out = torch.empty(n, dtype=dtype, device=dev)
                _reduce_scatter_tensor(out, full.to(dev), op)
                expect(f"reduce_scatter_tensor {opname} {dtype} n={n}", out, want)
                inp = full.to(dev).clone()
                _reduce_scatter_tensor(inp[rank * n:(rank + 1) * n], inp, op)
                expect(f"reduce_scatter_tensor {opname} {dtype} n={n} in place", inp[rank * n:(rank + 1) * n], want)

            # broadcast from every root
            for root in range(world):
                t = values(n, rank, dtype, dev)
                dist.broadcast(t, src=root)
                expect(f"broadcast {dtype} n={n} root {root}", t, values(n, root, dtype, "cpu"))

    # dtypes the SDK lacks still move (gather, broadcast) as bytes; bool reduces with MIN/MAX
    for dtype in (torch.int16, torch.int8, torch.bool, torch.complex64):
        n = 13
        src = values(n, rank, torch.int64, "cpu").to(dtype).to(dev)
        outs = [torch.empty(n, dtype=dtype, device=dev) for _ in range(world)]
        dist.all_gather(outs, src)
        for r in range(world):
            expect(f"all_gather {dtype} block {r}", outs[r], values(n, r, torch.int64, "cpu").to(dtype))
        t = src.clone()
        dist.broadcast(t, src=world - 1)
        expect(f"broadcast {dtype}", t, values(n, world - 1, torch.int64, "cpu").to(dtype))
    # the flat variants under newer torch's names, on the group object itself
    pg = dist.group.WORLD
    flat = torch.empty(world * 5, device=dev)
    pg.all_gather_single(flat, values(5, rank, torch.float32, dev)).wait()
    expect("pg.all_gather_single", flat, torch.cat([values(5, r, torch.float32, "cpu") for r in range(world)]))
    out = torch.empty(5, device=dev)
    pg.reduce_scatter_single(out, values(5 * world, rank, torch.float32, dev)).wait()
    expect("pg.reduce_scatter_single", out, reduced(5 * world, world, torch.float32, "sum")[rank * 5:(rank + 1) * 5])
    # the coalesced variants: one collective per tensor
    ts = [values(n, rank, dt, dev) for n, dt in ((3, torch.float64), (0, torch.float64), (9, torch.float64))]
    dist.all_reduce_coalesced(ts, op=dist.ReduceOp.SUM)
    for t, (n, dt) in zip(ts, ((3, torch.float64), (0, torch.float64), (9, torch.float64))):
        expect(f"all_reduce_coalesced {dt} n={n}", t, reduced(n, world, dt, "sum"))
    ins = [values(4, rank, torch.int32, dev), values(7, rank, torch.int32, dev)]
    outs = [[torch.empty_like(i) for i in ins] for _ in range(world)]
    dist.all_gather_coalesced(outs, ins)
    for r in range(world):
        expect(f"all_gather_coalesced block {r} #0", outs[r][0], values(4, r, torch.int32, "cpu"))
        expect(f"all_gather_coalesced block {r} #1", outs[r][1], values(7, r, torch.int32, "cpu"))
    flats = [torch.empty(world * 4, device=dev), torch.empty(world * 6, dtype=torch.int64, device=dev)]
    pg.allgather_into_tensor_coalesced(flats, [values(4, rank, torch.float32, dev),
                                               values(6, rank, torch.int64, dev)]).get_future().wait()
    expect("allgather_into_tensor_coalesced #0", flats[0], torch.cat([values(4, r, torch.float32, "cpu") for r in range(world)]))
    expect("allgather_into_tensor_coalesced #1", flats[1], torch.cat([values(6, r, torch.int64, "cpu") for r in range(world)]))
    outs = [torch.empty(3, device=dev), torch.empty(5, dtype=torch.int32, device=dev)]
    pg.reduce_scatter_tensor_coalesced(outs, [values(3 * world, rank, torch.float32, dev),
                                              values(5 * world, rank, torch.int32, dev)]).wait()
    expect("reduce_scatter_tensor_coalesced #0", outs[0], reduced(3 * world, world, torch.float32, "sum")[rank * 3:(rank + 1) * 3])
    expect("reduce_scatter_tensor_coalesced #1", outs[1], reduced(5 * world, world, torch.int32, "sum")[rank * 5:(rank + 1) * 5])
    b = torch.tensor([rank == 0, False, True], device=dev)
    dist.all_reduce(b, op=dist.ReduceOp.MAX)
    expect("all_reduce max bool", b, torch.tensor([True, False, True]))
    # bool SUM is a logical OR, as torch's NCCL backend reduces it: true bytes stay 1
    # (a byte sum would hold 2 and more, and wrap to false at 256 ranks)
    b = torch.tensor([rank == 0, False, True, rank % 2 == 1], device=dev)
    dist.all_reduce(b)
    expect("all_reduce sum bool", b, torch.tensor([True, False, True, world > 1]))
    expect("all_reduce sum bool bytes", b.view(torch.uint8), torch.tensor([1, 0, 1, int(world > 1)], dtype=torch.uint8))
    out = torch.empty(2, dtype=torch.bool, device=dev)
    _reduce_scatter_tensor(out, torch.tensor([i <= rank for i in range(2 * world)], device=dev), dist.ReduceOp.SUM)
    want = torch.tensor([i < world for i in range(2 * world)])[2 * rank:2 * rank + 2]
    expect("reduce_scatter_tensor sum bool bytes", out.view(torch.uint8), want.to(torch.uint8))

    # async: several in flight, waited in reverse order; futures carry the tensors
    ts = [values(1000 + k, rank, torch.float32, dev) for k in range(5)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in reversed(works):
        w.wait()
    for k, t in enumerate(ts):
        expect(f"async all_reduce #{k}", t, reduced(1000 + k, world, torch.float32, "sum"))
    t = values(77, rank, torch.float64, dev)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    expect("future.then", fut.wait(), reduced(77, world, torch.float64, "sum") * 2)
    dist.barrier()

    # reduce, gather and scatter (through all-reduce, all-gather and broadcast): the
    # root gets the result, the others' tensors keep their values
    for root in sorted({0, world - 1}):
        for dtype in (torch.float32, torch.int64):
            n = 13
            t = values(n, rank, dtype, dev)
            dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
            want = reduced(n, world, dtype, "sum") if rank == root else values(n, rank, dtype, "cpu")
            expect(f"reduce {dtype} dst {root}", t, want)
            outs = [torch.empty(n, dtype=dtype, device=dev) for _ in range(world)] if rank == root else None
            dist.gather(values(n, rank, dtype, dev), outs, dst=root)
            if rank == root:
                for r in range(world):
                    expect(f"gather {dtype} dst {root} block {r}", outs[r], values(n, r, dtype, "cpu"))
            parts = [values(n, 100 + r, dtype, dev) for r in range(world)] if rank == root else None
            out = torch.zeros(n, dtype=dtype, device=dev)
            dist.scatter(out, parts, src=root)
            expect(f"scatter {dtype} src {root}", out, values(n, 100 + rank, dtype, "cpu"))
        m = torch.full((4,), float(rank), device=dev)
        work = dist.reduce(m, dst=root, op=dist.ReduceOp.MAX, async_op=True)
        work.wait()
        expect(f"reduce max async dst {root}", m, torch.full((4,), float(world - 1 if rank == root else rank)))

    # all-to-all (equal blocks): rank r's block j is rank j's block r
    for dtype in (torch.float32, torch.int64):
        k = 3
        src = torch.cat([values(k, 10 * rank + j, dtype, "cpu") for j in range(world)]).to(dev)
        out = torch.empty(world * k, dtype=dtype, device=dev)
        dist.all_to_all_single(out, src)
        expect(f"all_to_all_single {dtype}", out, torch.cat([values(k, 10 * j + rank, dtype, "cpu") for j in range(world)]))
        outs = [torch.empty(k, dtype=dtype, device=dev) for _ in range(world)]
        dist.all_to_all(outs, [values(k, 10 * rank + j, dtype, dev) for j in range(world)])
        for j in range(world):
            expect(f"all_to_all {dtype} block {j}", outs[j], values(k, 10 * j + rank, dtype, "cpu"))

    # all-to-all of uneven blocks: rank s sends rank d n(s, d) rows (0 to 2) of 2 elements
    def n(src, dst):
        return (2 * src + dst) % 3

    def block(src, dst, dtype):
        return (torch.arange(2 * n(src, dst)).view(-1, 2) + 1000 * src + 100 * dst).to(dtype)

    for dtype in (torch.float32, torch.int64):
        src = torch.cat([block(rank, j, dtype) for j in range(world)]).to(dev)
        want = torch.cat([block(j, rank, dtype) for j in range(world)])
        out = torch.empty(want.shape, dtype=dtype, device=dev)
        dist.all_to_all_single(out, src, [n(j, rank) for j in range(world)], [n(rank, j) for j in range(world)])
        expect(f"all_to_all_single uneven {dtype}", out, want)
        outs = [torch.empty(2 * n(j, rank), dtype=dtype, device=dev) for j in range(world)]
        dist.all_to_all(outs, [block(rank, j, dtype).reshape(-1).to(dev) for j in range(world)])
        for j in range(world):
            expect(f"all_to_all uneven {dtype} block {j}", outs[j], block(j, rank, dtype).reshape(-1))
    # all_to_all of a list where rank 0's blocks are all equal (2 elements each way) and the
    # others' are not: every rank must take the same path
    def m(src, dst):
        return 2 if 0 in (src, dst) else 1 + src + dst

    ins = [torch.full((m(rank, j),), 10.0 * rank + j, device=dev) for j in range(world)]
    outs = [torch.empty(m(j, rank), device=dev) for j in range(world)]
    try:
        dist.all_to_all(outs, ins)
        for j in range(world):
            expect(f"all_to_all equal blocks on rank 0 only, block {j}", outs[j],
                   torch.full((m(j, rank),), 10.0 * j + rank))
    except Exception as e:  # noqa: BLE001
        failures.append(f"all_to_all equal blocks on rank 0 only: {type(e).__name__}: {e}")
    # all_gather of inputs of different sizes (rank j's has j + 1 rows of 2)
    for dtype in (torch.float32, torch.int64):
        outs = [torch.empty(j + 1, 2, dtype=dtype, device=dev) for j in range(world)]
        dist.all_gather(outs, block(rank, rank, dtype).new_full((rank + 1, 2), rank + 7).to(dev))
        for j in range(world):
            expect(f"all_gather uneven {dtype} from {j}", outs[j], torch.full((j + 1, 2), j + 7, dtype=dtype))
    # a rank that expects other blocks than the others send: that rank raises, saying so
    global checks
    if world > 1:
        wrong = [n(j, rank) for j in range(world)]
        if rank == 0:
            wrong[0], wrong[1] = wrong[0] + 1, wrong[1] - 1
        src = torch.cat([block(rank, j, torch.float32) for j in range(world)]).to(dev)
        out = torch.empty(sum(wrong), 2, device=dev)
        try:
            dist.all_to_all_single(out, src, wrong, [n(rank, j) for j in range(world)])
            if rank == 0:
                failures.append("all_to_all_single with split sizes that differ from the senders': no error")
        except ValueError as e:
            if rank != 0 or "they send" not in str(e):
                failures.append(f"all_to_all_single with other split sizes: {e}")
        checks += 1
    # unsupported calls name themselves
    for name, call, words in [
        ("recv_anysource", lambda: dist.recv(torch.ones(2, device=dev)), ()),  # a receive without a source
        ("ReduceOp", lambda: dist.all_reduce(torch.ones(2, device=dev), op=dist.ReduceOp.PRODUCT), ("PRODUCT",)),
        ("allreduce", lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool, device=dev), op=dist.ReduceOp.AVG),
         ("torch.bool", "AVG")),
    ]:
        checks += 1
        try:
            call()
            failures.append(f"{name}: no NotImplementedError")
        except NotImplementedError as e:
            if name not in str(e) or not all(w in str(e) for w in words):
                failures.append(f"{name}: NotImplementedError does not name the call ({', '.join(words) or name}): {e}")
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: {type(e).__name__} instead of NotImplementedError: {e}")
    # A group of some of the ranks (subgroup_check.py tests them whole): the first and
    # the last rank, which are on two nodes in a job across nodes (a gloo group there).
    if world > 1:
        sub = dist.new_group(ranks=[0, world - 1])
        if rank in (0, world - 1):
            checks += 1
            t = torch.full((2,), float(rank), device=dev)
            dist.all_reduce(t, group=sub)
            if t.tolist() != [float(world - 1)] * 2:
                failures.append(f"new_group(ranks=[0, last]): all_reduce gave {t.tolist()}")
    dist.barrier()


def _all_gather_into_tensor(out, inp):
    f = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
    f(out, inp)


def _reduce_scatter_tensor(out, inp, op):
    f = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
    f(out, inp, op=op)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", default="0,1,7,1000,65539")
    ap.add_argument("--large", type=int, default=600011, help="one float32 all-reduce past the 2 MiB chunk (0: none)")
    a = ap.parse_args()
    if os.environ.get("OPS_DUMP_AFTER"):
        faulthandler.dump_traceback_later(float(os.environ["OPS_DUMP_AFTER"]), exit=True)
    if a.device.startswith("cuda"):
        torch.cuda.set_device(0)
    dist.init_process_group("migctl")
    sizes = [int(s) for s in a.sizes.split(",")]
    run(a.device, sizes)
    if a.large:
        t = values(a.large, dist.get_rank(), torch.float32, a.device)
        dist.all_reduce(t)
        expect(f"all_reduce sum float32 n={a.large}", t, reduced(a.large, dist.get_world_size(), torch.float32, "sum"))
    h = migctl_torch.multinode.Hier._instance  # set when the job spans nodes
    print(json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "backend": dist.get_backend(),
                      "nodes": h.nodes if h else 1, "local_size": h.lsize if h else dist.get_world_size(),
                      "torch": torch.__version__, "checks": checks, "failures": failures[:20],
                      "failed": len(failures)}), flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
