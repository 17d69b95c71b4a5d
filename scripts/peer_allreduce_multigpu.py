#!/usr/bin/env python3
"""Peer baseline across GPUs: torch.distributed all-reduce, one process per GPU.

The migctl IPC transport is measured against this (NCCL, and gloo for reference) in the same run.

  python3 scripts/peer_allreduce_multigpu.py --backend nccl --np 2 --sizes 8K,1M,16M,256M --iters 20

Prints one line per size, in the same form as shared/bench/gloo_allreduce.py: median milliseconds,
algbw and busbw (nccl-tests definitions) and whether the sum was exactly right.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def worker(rank, world, sizes, iters, port, backend, q):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    for nbytes in sizes:
        x = torch.empty(nbytes // 4, dtype=torch.float32, device=f"cuda:{rank}")
        times, ok = [], True
        for it in range(iters + 2):
            x.fill_(float(rank + 1))
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if it >= 2:
                times.append(dt)
            ok = ok and bool((x == world * (world + 1) / 2).all().item())
        if rank == 0:
            med = statistics.median(times)
            algbw = nbytes / med / 1e9
            q.put(f"{backend} np={world} bytes={nbytes} ms={med*1e3:.3f} algbw={algbw:.2f}GB/s "
                  f"busbw={algbw*2*(world-1)/world:.2f}GB/s correct={ok}")
        del x
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--sizes", default="8K,1M,16M,256M")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--backend", default="nccl")
    a = ap.parse_args()
    if torch.cuda.device_count() < a.np:
        raise SystemExit(f"need {a.np} GPUs, have {torch.cuda.device_count()}")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(r, a.np, sizes, a.iters, 29700, a.backend, q)) for r in range(a.np)]
    for p in ps:
        p.start()
    for _ in sizes:
        print(q.get(timeout=300), flush=True)
    for p in ps:
        p.join(60)


if __name__ == "__main__":
    main()
