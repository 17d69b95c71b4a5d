"""migctl_torch.allreduce_hook on a job whose default backend is gloo (the
migctl group is joined from the environment on the hook's first call): the
hooked DDP model ends with the same parameters as plain DDP over gloo. Run
under `migctl run --np 2`. Prints one JSON line per rank; exits 1 on a
mismatch."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import migctl_torch  # noqa: E402


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    plain, hooked = DDP(model()), DDP(model())
    hooked.register_comm_hook(None, migctl_torch.allreduce_hook)
    for m in (plain, hooked):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        for _ in range(10):
            x, y = torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)
            opt.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            opt.step()
    a = torch.cat([p.detach().reshape(-1) for p in plain.parameters()])
    b = torch.cat([p.detach().reshape(-1) for p in hooked.parameters()])
    d = (a - b).abs().max().item()
    failures = [] if d <= (0.0 if world <= 2 else 1e-5) else [f"hooked vs plain gloo: parameters differ by {d}"]
    print(json.dumps({"rank": rank, "world": world, "max_diff": d, "failures": failures}), flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
