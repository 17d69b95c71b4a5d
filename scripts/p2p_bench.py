"""Point-to-point ping-pong between ranks 0 and 1 (the others idle): one-way
time and bandwidth per message size, for the migctl backend or gloo (the
peer: CUDA tensors through host memory, as a gloo user has to write it).

    migctl run --gpus 0 --np 2 -- python3 scripts/p2p_bench.py --backend migctl
    migctl run --gpus 0 --np 2 -- python3 scripts/p2p_bench.py --backend gloo

Rank 0 prints one JSON line: rows of {bytes, one_way_us, gbps} (median of
--iters round trips, halved)."""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["migctl", "gloo"], default="migctl")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default="8KiB,256KiB,4MiB,64MiB")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    if a.backend == "migctl":
        import migctl_torch  # noqa: F401
    if a.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("MIGCTL_DEVICE", "0")))
    dev = torch.device(a.device)
    dist.init_process_group(a.backend)
    rank = dist.get_rank()
    host = a.backend == "gloo" and dev.type == "cuda"
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    rows = []
    for spec in a.sizes.split(","):
        n = int(spec[:-3]) * units[spec[-3:]] if spec[-3:] in units else int(spec)
        t = torch.ones(n // 4, device=dev)
        times = []
        for i in range(a.warmup + a.iters):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            if rank in (0, 1):
                peer = 1 - rank
                for turn in ((0, 1) if rank == 0 else (1, 0)):
                    if turn == 0:  # send
                        dist.send(t.cpu() if host else t, peer)
                    else:
                        buf = torch.empty(t.shape, device="cpu") if host else t
                        dist.recv(buf, peer)
                        if host:
                            t.copy_(buf)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
            if i >= a.warmup:
                times.append(time.perf_counter() - t0)
        times.sort()
        one_way = times[len(times) // 2] / 2 if times else float("nan")
        rows.append({"bytes": n, "one_way_us": round(one_way * 1e6, 1), "gbps": round(n / one_way / 1e9, 2)})
    dist.barrier()
    if rank == 0:
        print(json.dumps({"bench": "p2p", "backend": a.backend, "device": str(dev), "rows": rows}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
