"""Pipeline parallelism over point-to-point transfers: a deep MLP split into
one stage per rank (a model too large for one small MIG instance, spread
over several), trained with the GPipe schedule (every micro-batch forward
through the stages, then every one backward), activations sent forward and
their gradients back with isend/irecv. Synthetic data, fixed seeds.

    migctl run --gpus 0 --np 4 -- python examples/pytorch/pipeline.py --backend migctl
    migctl run --gpus 0 --np 4 -- python examples/pytorch/pipeline.py --backend gloo   # the peer
    migctl run --backend host --np 3 -- python examples/pytorch/pipeline.py --device cpu --width 256 --steps 5

gloo sends CPU tensors only, so with --backend gloo CUDA activations go
through host memory (a copy to the host before the send, back after the
receive: what a gloo user has to write). --check also runs the whole model
in every process, step by step from the same weights, and reports how far
each stage's parameters are from it at the end (fp32 round-off: the
micro-batches' gradients are summed in another order).

Rank 0 prints one JSON line: steps/s (the slowest rank), the losses of the
first steps (the last stage's, mean over micro-batches), max difference from
the whole model (--check)."""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

# migctl_torch from the checkout unless it is installed (pip install -e python/).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


def stage_layers(layers, world, rank):
    """The layers of stage rank: an even split, the first stages one more."""
    per, extra = divmod(layers, world)
    start = rank * per + min(rank, extra)
    return start, start + per + (1 if rank < extra else 0)


def build(args):
    torch.manual_seed(args.seed)
    blocks = [nn.Sequential(nn.Linear(args.width, args.width), nn.GELU()) for _ in range(args.layers)]
    head = nn.Linear(args.width, args.classes)
    return blocks, head


class Wire:
    """isend/irecv of activations and gradients; through host memory for gloo."""

    def __init__(self, backend, device):
        self.host = backend == "gloo" and device.type == "cuda"
        self.device = device

    def isend(self, t, peer):
        if self.host:
            t = t.to("cpu")
        return dist.isend(t.contiguous(), peer), t  # keep t alive until the send finishes

    def recv(self, shape, peer):
        buf = torch.empty(shape, device="cpu" if self.host else self.device)
        dist.recv(buf, peer)
        return buf.to(self.device) if self.host else buf


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["migctl", "gloo"], default="migctl")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--batch", type=int, default=256, help="samples per step (all micro-batches)")
    ap.add_argument("--micro", type=int, default=8, help="micro-batches per step")
    ap.add_argument("--steps", type=int, default=30, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--losses", type=int, default=20, help="losses of the first N steps in the report")
    ap.add_argument("--check", action="store_true", help="compare with the whole model run in one process")
    args = ap.parse_args()
    if args.backend == "migctl":
        import migctl_torch  # noqa: F401  (registers the backend)
    if args.device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("MIGCTL_DEVICE", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.layers < world or args.batch % args.micro:
        raise SystemExit(f"want --layers >= {world} ranks and --batch a multiple of --micro")

    blocks, head = build(args)
    lo, hi = stage_layers(args.layers, world, rank)
    last = rank == world - 1
    mine = nn.Sequential(*blocks[lo:hi], *([head] if last else [])).to(device)
    whole = None
    if args.check:  # a copy of its own, from the same seed
        ref_blocks, ref_head = build(args)
        whole = nn.Sequential(*ref_blocks, ref_head).to(device)
    opt = torch.optim.SGD(mine.parameters(), lr=args.lr)
    ref_opt = torch.optim.SGD(whole.parameters(), lr=args.lr) if whole is not None else None
    g = torch.Generator().manual_seed(args.seed + 1)
    pool = [(torch.randn(args.batch, args.width, generator=g), torch.randint(0, args.classes, (args.batch,), generator=g))
            for _ in range(4)]
    pool = [(x.to(device), y.to(device)) for x, y in pool]
    mb = args.batch // args.micro
    wire = Wire(args.backend, device)
    shape = (mb, args.width)
    losses, times = [], []

    for step in range(args.warmup + args.steps):
        x, y = pool[step % len(pool)]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        ins, outs, sends, step_loss = [], [], [], 0.0
        for m in range(args.micro):  # forward of every micro-batch
            if rank == 0:
                h = x[m * mb:(m + 1) * mb]
            else:
                h = wire.recv(shape, rank - 1).requires_grad_()
            out = mine(h)
            if last:
                out = nn.functional.cross_entropy(out, y[m * mb:(m + 1) * mb]) / args.micro
                step_loss += out.item()
            else:
                sends.append(wire.isend(out.detach(), rank + 1))
            ins.append(h)
            outs.append(out)
        for m in reversed(range(args.micro)):  # backward, last micro-batch first
            if last:
                outs[m].backward()
            else:
                outs[m].backward(wire.recv(shape, rank + 1))
            if rank > 0:
                sends.append(wire.isend(ins[m].grad, rank - 1))
        for w, _ in sends:
            w.wait()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if last and len(losses) < args.losses:
            losses.append(step_loss)
        if whole is not None:  # the same step on the whole model, in one process
            ref_opt.zero_grad(set_to_none=True)
            for m in range(args.micro):
                loss = nn.functional.cross_entropy(whole(x[m * mb:(m + 1) * mb]), y[m * mb:(m + 1) * mb]) / args.micro
                loss.backward()
            ref_opt.step()

    timed = sorted(times[args.warmup:])
    median = timed[len(timed) // 2] if timed else float("nan")
    diff = 0.0
    if whole is not None:
        ref = list(whole)[lo:hi] + ([list(whole)[-1]] if last else [])
        for a, b in zip(nn.Sequential(*ref).parameters(), mine.parameters()):
            diff = max(diff, (a - b).abs().max().item())
    # the slowest stage's median step time, the last stage's losses, the largest difference
    t = torch.tensor([median, diff], dtype=torch.float64)  # CPU tensors: either backend takes them
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    kept = min(args.losses, args.warmup + args.steps)
    lt = torch.tensor(losses + [0.0] * (kept - len(losses)), dtype=torch.float64)
    dist.broadcast(lt, world - 1)
    if rank == 0:
        print(json.dumps({"example": "pipeline", "backend": args.backend, "world": world, "device": str(device),
                          "layers": args.layers, "width": args.width, "micro": args.micro, "batch": args.batch,
                          "step_ms": round(t[0].item() * 1e3, 3), "steps_per_s": round(1 / t[0].item(), 3),
                          "losses": [round(v, 7) for v in lt.tolist()],
                          "max_diff_whole": t[1].item() if args.check else None}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
