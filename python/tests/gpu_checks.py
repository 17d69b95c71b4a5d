"""GPU checks of the migctl backend (CUDA tensors; run on the GPU machine):

    migctl run --gpus 0 --np 7 -- python3 python/tests/gpu_checks.py

1. stream order: a tensor written on a side stream after a long sleep kernel
   is all-reduced with that stream current; if the collective read it before
   the kernel that wrote it had finished, the sum would be wrong. The result
   is then used by a kernel queued afterwards on the same stream.
2. the same through async_op=True and through the Future.
2b. two all-reduces in flight (DDP's buckets): each waits for its own
   producer only, not for work queued on the stream after its call.
2c. the Future of an all-reduce of one CUDA tensor (DDP's): the result is
   right for work queued on the current stream after fut.wait() and for a
   then-callback, the collective waiting for a slow producer kernel.
2d. broadcasts of CUDA tensors (the library queues one of at most a chunk
   whole on the device and returns, the stream ordered after it): each
   rank's tensor is written after a slow kernel on a side stream, then
   broadcast from rank 0 (sync, async_op + wait, two in a row of two
   dtypes as DDP's buffers, a third after them); every rank must hold the
   root's values, and a kernel queued afterwards must see them. Reports how
   long the root's call took while its GPU was still asleep.
3. overhead: mean time of an 8 KiB all-reduce through dist.all_reduce vs
   the library's C call directly (issue + wait), on CUDA and CPU tensors.

Prints one JSON line per rank; exits 1 on a wrong result."""

import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import migctl_torch  # noqa: E402
from migctl_torch import _lib, process_group  # noqa: E402

failures = []


def stream_order(rank, world, n=1 << 20, cycles=int(1e9)):
    want = float(world * (world + 1) // 2)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        x = torch.zeros(n, device="cuda")
        torch.cuda._sleep(cycles)  # ~0.5 s of GPU time before the write
        x.fill_(rank + 1)
        dist.all_reduce(x)  # must wait for the fill on s
        y = x * 2  # queued after: must see the result
    s.synchronize()
    got = x[0].item(), x[-1].item(), y[0].item()
    if got != (want, want, 2 * want) or not torch.all(x == want).item():
        failures.append(f"stream order (sync): got {got}, want {want}")
    with torch.cuda.stream(s):
        x = torch.zeros(n, device="cuda")
        torch.cuda._sleep(cycles)
        x.fill_(rank + 1)
        w = dist.all_reduce(x, async_op=True)
    w.wait()
    with torch.cuda.stream(s):
        fut = dist.all_reduce(x, async_op=True).get_future().then(lambda f: f.value()[0].sum())
    total = fut.wait().item()
    if abs(total - want * world * n) > 1e-3 * want * world * n:
        failures.append(f"stream order (async, future): sum {total}, want {want * world * n}")


def in_flight_order(rank, world, n=1 << 20, cycles=int(2e8)):
    """Two async all-reduces as DDP issues its buckets: x1 written after a
    ~0.1 s sleep kernel, all-reduced, then x2 written after a longer one and
    all-reduced while the first is in flight. Both sums must be right (the
    second must wait for its own fill), and the first must finish before the
    stream's second sleep has (it must not wait for work queued after its
    call: that was the lost overlap of DDP's buckets)."""
    want = float(world * (world + 1) // 2)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    dist.barrier()
    with torch.cuda.stream(s):
        x1 = torch.zeros(n, device="cuda")
        x2 = torch.zeros(n, device="cuda")
        torch.cuda._sleep(cycles)
        x1.fill_(rank + 1)
        f1 = dist.all_reduce(x1, async_op=True).get_future()
        # longer than every rank's first sleep together (time-sliced ranks on one GPU)
        torch.cuda._sleep(2 * world * cycles)
        x2.fill_(rank + 1)
        w2 = dist.all_reduce(x2, async_op=True)
        end = torch.cuda.Event()
        end.record(s)
    f1_first = None
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 60:
        if f1.done():
            f1_first = not end.query()
            break
        time.sleep(0.0005)
    f1.wait()
    w2.wait()
    s.synchronize()
    if not (torch.all(x1 == want).item() and torch.all(x2 == want).item()):
        failures.append(f"in-flight order: x1 {x1[0].item()} x2 {x2[0].item()}, want {want}")
    if f1_first is not True:
        failures.append("in-flight order: the first all-reduce waited for work queued on its stream after "
                        f"its call (finished before the second sleep: {f1_first})")
    return f1_first


def cuda_future(rank, world, n=1 << 20, cycles=int(4e8)):
    """The Future of an all-reduce of a CUDA tensor whose producer is a slow
    kernel: the result right for work queued after fut.wait() on the
    current stream and for a then-callback."""
    want = float(world * (world + 1) // 2)
    torch.cuda.synchronize()
    dist.barrier()
    x = torch.zeros(n, device="cuda")
    torch.cuda._sleep(cycles)  # the collective waits for this producer
    x.fill_(rank + 1)
    w = dist.all_reduce(x, async_op=True)
    fut = w.get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    fut.wait()
    y = x * 3
    got = (y[0].item(), y[-1].item(), doubled.wait()[0].item())
    w.wait()
    if got != (3 * want, 3 * want, 2 * want):
        failures.append(f"future: got {got}, want {(3 * want, 3 * want, 2 * want)}")


def broadcast_order(rank, world, n=1 << 16, cycles=int(4e8)):
    s = torch.cuda.Stream()
    root_call_ms = []
    for mode in ("sync", "async", "pair", "three"):
        torch.cuda.synchronize()
        dist.barrier()
        with torch.cuda.stream(s):
            x = torch.zeros(n, device="cuda")
            k = torch.zeros(n // 8, device="cuda", dtype=torch.int64)
            torch.cuda._sleep(cycles)  # the root's copy must wait for the fills below
            x.fill_(rank + 1)
            k.fill_(10 * (rank + 1))
            t0 = time.perf_counter()
            if mode == "sync":
                dist.broadcast(x, src=0)
            elif mode == "async":
                w = dist.broadcast(x, src=0, async_op=True)
                w.wait()
            else:
                ws = [dist.broadcast(x, src=0, async_op=True), dist.broadcast(k, src=0, async_op=True)]
                for w in ws:
                    w.wait()
                if mode == "three":
                    dist.broadcast(x, src=0)
            if rank == 0:
                root_call_ms.append(round((time.perf_counter() - t0) * 1e3, 2))
            y = x * 2  # queued after: must see the root's values
        s.synchronize()
        got = (x[0].item(), x[-1].item(), y[0].item())
        if got != (1.0, 1.0, 2.0) or not torch.all(x == 1).item():
            failures.append(f"broadcast order ({mode}): got {got}, want (1.0, 1.0, 2.0)")
        if mode in ("pair", "three") and not torch.all(k == 10).item():
            failures.append(f"broadcast order ({mode}): int64 tensor holds {k[0].item()}, want 10")
    return root_call_ms


def overhead(device, iters=2000):
    t = torch.ones(2048, device=device)  # 8 KiB of float32
    for _ in range(50):
        dist.all_reduce(t)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    pg_us = (time.perf_counter() - t0) / iters * 1e6
    lib = _lib.load()
    c = lib.lib
    h = ctypes.c_uint64()
    dev = _lib.DEVICE if device == "cuda" else _lib.HOST
    stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else 0
    p = t.data_ptr()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        c.migctl_allreduce(p, p, 2048, _lib.FLOAT32, _lib.SUM, dev, stream, ctypes.byref(h))
        c.migctl_wait(h.value, -1)
    raw_us = (time.perf_counter() - t0) / iters * 1e6
    # the issuing call alone (Python + a C call that only queues), 64 in flight at a time
    dist.barrier()
    issue = 0.0
    for _ in range(iters // 64):
        t0 = time.perf_counter()
        ws = [dist.all_reduce(t, async_op=True) for _ in range(64)]
        issue += time.perf_counter() - t0
        for w in ws:
            w.wait()
    return {"device": device, "process_group_us": round(pg_us, 2), "c_abi_us": round(raw_us, 2),
            "python_overhead_us": round(pg_us - raw_us, 2),
            "async_issue_us": round(issue / (iters // 64 * 64) * 1e6, 2)}


def main():
    torch.cuda.set_device(0)
    dist.init_process_group("migctl")
    rank, world = dist.get_rank(), dist.get_world_size()
    on_gpu = process_group._Comm.get(rank, world).lib.lib.migctl_on_gpu() == 1
    if not on_gpu:
        failures.append("the library runs the host backend: start with `migctl run --gpus 0` (MIGCTL_BACKEND=gpu)")
    stream_order(rank, world)
    in_flight_order(rank, world)
    cuda_future(rank, world)
    bc_ms = broadcast_order(rank, world)
    ov = [overhead("cuda"), overhead("cpu")]
    print(json.dumps({"rank": rank, "world": world, "torch": torch.__version__, "gpu_backend": on_gpu,
                      "broadcast_root_call_ms": bc_ms, "overhead_8KiB": ov, "failures": failures}), flush=True)
    dist.barrier()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
