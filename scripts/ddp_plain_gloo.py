"""A plain PyTorch DDP script over gloo, as written for torchrun: the check that such a script
runs unchanged under `migctl run` (issue 7). It reads only torchrun's environment (env://
rendezvous on MASTER_ADDR/MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK), trains a small MLP on
synthetic data for --steps steps on cuda:0 (each worker sees its own device as 0) or the CPU, and
checks at the end that every rank holds the same parameters. Rank 0 prints one JSON line.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    dist.init_process_group("gloo")  # env:// from MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)).to(dev)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator(device="cpu").manual_seed(1000 + rank)
    t0 = time.time()
    losses = []
    for _ in range(args.steps):
        x = torch.randn(args.batch, 64, generator=g).to(dev)
        y = x.sum(dim=1, keepdim=True).sin()
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = time.time() - t0
    flat = torch.cat([q.detach().flatten().cpu() for q in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(gathered[0], t) for t in gathered)
    if rank == 0:
        print(json.dumps({"script": "ddp_plain_gloo", "world": world, "device": str(dev),
                          "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                          "steps_per_s": args.steps / dt, "first_loss": losses[0], "last_loss": losses[-1],
                          "ranks_identical": same}), flush=True)
    dist.destroy_process_group()
    if not same:
        raise SystemExit("ranks hold different parameters")


if __name__ == "__main__":
    main()
