"""A killed rank makes every other rank raise: ranks all-reduce in a loop,
rank --kill SIGKILLs itself at step 5, the others must raise a MigctlError
(peer dead, aborted or deadline) instead of hanging. Started by the Go test
with its own rendezvous (migctl run would SIGTERM the survivors itself).
With --p2p each step is a ring of isend to the next rank and recv from the
previous one instead: the survivors' transfers raise.
A survivor prints one JSON line and exits 0 when it raised. With --ddp the
loop is DDP training steps (a bucket's Future fails inside backward: the
survivors must raise there, not crash). With --subgroup ranks 0 and 1 also
all-reduce in a group of their own each step: its survivor must raise there.

On the GPU machine, the same on CUDA tensors through get_future().wait() and
a device synchronize (DDP's path), under migctl run with SIGTERM ignored for
its --grace, so that the survivors' own raise is what ends them:

    MIGCTL_TIMEOUT=10s migctl run --gpus 0 --np 3 --grace 60s -- \
        python3 python/tests/kill_check.py --device cuda --future --ignore-term"""

import argparse
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import migctl_torch  # noqa: E402,F401


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kill", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--future", action="store_true", help="all-reduce through get_future().wait(), then synchronize")
    ap.add_argument("--ddp", action="store_true", help="DDP training steps instead of bare all-reduces")
    ap.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM (a launcher's stop of the survivors)")
    ap.add_argument("--subgroup", action="store_true",
                    help="ranks 0 and 1 also all-reduce in a group of their own before each step's all-reduce")
    ap.add_argument("--p2p", action="store_true", help="a ring of isend/recv each step instead of the all-reduce")
    a = ap.parse_args()
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if a.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("MIGCTL_DEVICE", "0")))
    dist.init_process_group("migctl")
    rank = dist.get_rank()
    t = torch.ones(4096, device=a.device)
    sub = dist.new_group(ranks=[0, 1]) if a.subgroup else None
    ddp = None
    if a.ddp:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).to(a.device)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        x = torch.randn(16, 64, device=a.device)
    start = time.time()
    for step in range(100000):
        if rank == a.kill and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            if ddp is not None:
                opt.zero_grad()
                ddp(x).square().mean().backward()
                opt.step()
                if a.device == "cuda":
                    torch.cuda.synchronize()
            elif a.future:
                dist.all_reduce(t, async_op=True).get_future().wait()
                if a.device == "cuda":
                    torch.cuda.synchronize()  # a stream left waiting for a collective that never ends hangs here
                t.fill_(1)
            elif a.p2p:
                world = dist.get_world_size()
                w = dist.isend(t, (rank + 1) % world)
                got = torch.empty_like(t)
                dist.recv(got, (rank - 1) % world)
                w.wait()
            else:
                if sub is not None and rank in (0, 1):
                    dist.all_reduce(t, group=sub)
                dist.all_reduce(t)
        except RuntimeError as e:  # a MigctlError
            if "migctl" not in str(e):
                raise
            print(json.dumps({"rank": rank, "raised": True, "step": step, "error": str(e)}), flush=True)
            sys.exit(0)
        if time.time() - start > 120:
            break
    print(json.dumps({"rank": rank, "raised": False}), flush=True)
    sys.exit(1)


if __name__ == "__main__":
    main()
