"""FSDP over the migctl backend trains the small GPT (examples/pytorch/ddp_gpt.py)
to the same losses as DDP over migctl, to fp32 round-off (torch 2.x, CUDA; the
GPU machine runs it from scripts/h200-train.d/pytorch-fsdp.sh):

    migctl run --gpus 0 --np 4 -- python3 python/tests/fsdp_check.py

In one process group: the model from one seed trained --steps SGD steps with
DDP, then again with FullyShardedDataParallel (FULL_SHARD, one unit per
transformer block plus the root: all-gathers of the flat parameters,
reduce-scatters of the gradients through all_gather_into_tensor and
reduce_scatter_tensor; --strategy hybrid: HYBRID_SHARD, sharded within pairs
of ranks and all-reduced across them, on groups of some of the ranks), each
rank on its own synthetic batches. Compares
every step's loss on every rank and the final parameters (FSDP's gathered
with summon_full_params). Prints one JSON line per rank; exits 1 on a
mismatch, 0 with "skipped" where FSDP cannot run (torch 1.x, no CUDA)."""

import argparse
import functools
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "pytorch"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

import migctl_torch  # noqa: E402,F401


def skip(why):
    print(json.dumps({"rank": int(os.environ.get("RANK", 0)), "skipped": why, "failures": []}), flush=True)
    sys.exit(0)


def train(model, batches, steps, lr):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = batches[step % len(batches)]
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    return losses


def compare(l_ddp, l_fsdp, p_ddp, p_fsdp, tol, what, failures):
    """The largest relative loss difference and parameter difference between
    DDP's run and what's, adding to failures where they are too large."""
    rel = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(l_ddp, l_fsdp))
    if rel > tol:
        k = max(range(len(l_ddp)), key=lambda i: abs(l_ddp[i] - l_fsdp[i]))
        failures.append(f"losses differ by {rel:.3g} (relative) > {tol}; worst at step {k}: DDP {l_ddp[k]} {what} {l_fsdp[k]}")
    missing = sorted(set(p_ddp) ^ set(p_fsdp))
    if missing:
        failures.append(f"parameter names differ between DDP and {what}: {missing[:4]}")
    pdiff = max(((p_ddp[n] - p_fsdp[n]).abs().max().item() for n in p_ddp if n in p_fsdp), default=0.0)
    if pdiff > 1e-3:
        failures.append(f"final parameters differ by {pdiff:.3g}")
    return rel, pdiff


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tol", type=float, default=2e-4, help="largest relative loss difference that passes")
    ap.add_argument("--strategy", choices=("full", "hybrid", "fsdp2", "fsdp2-hybrid"), default="full",
                    help="FSDP's FULL_SHARD over the job's group, or HYBRID_SHARD: sharded within pairs of ranks "
                         "{2i, 2i+1}, replicated across them (groups of some of the ranks; an even world of 4+); "
                         "fsdp2: fully_shard (torch 2.6+) on a 1-D device mesh of every rank, fsdp2-hybrid on a "
                         "2-D one (replicate x shard pairs)")
    a = ap.parse_args()
    if int(torch.__version__.split(".")[0]) < 2:
        skip(f"FSDP over a Python process group needs torch 2.x (this is {torch.__version__})")
    if not torch.cuda.is_available():
        skip("no CUDA device")
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_gpt import GPT, Block

    try:
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        policy = ModuleWrapPolicy({Block})
    except ImportError:
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})

    t0 = time.time()
    torch.cuda.set_device(int(os.environ.get("MIGCTL_DEVICE", "0")))
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group("migctl")
    rank, world = dist.get_rank(), dist.get_world_size()

    g = torch.Generator().manual_seed(a.seed + 1000 * rank + 1)
    batches = []
    for _ in range(4):
        t = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g).to(dev)
        batches.append((t[:, :-1].contiguous(), t[:, 1:].contiguous()))

    def fresh():
        torch.manual_seed(a.seed)
        return GPT(a.vocab, a.d_model, a.layers, a.heads, a.seq).to(dev)

    failures = []
    ddp = DDP(fresh(), device_ids=[dev.index])
    l_ddp = train(ddp, batches, a.steps, a.lr)
    p_ddp = {n: p.detach().clone() for n, p in ddp.module.named_parameters()}
    t_ddp = time.time() - t0

    if a.strategy.startswith("fsdp2"):
        fsdp2(a, fresh, batches, l_ddp, p_ddp, t0, t_ddp, rank, world, dev, Block)
        return
    kw = {"sharding_strategy": ShardingStrategy.FULL_SHARD}
    if a.strategy == "hybrid":
        if world < 4 or world % 2:
            skip(f"HYBRID_SHARD over pairs needs an even world of 4 or more (this is {world})")
        # every rank forms every group, in one order
        shard = [dist.new_group(ranks=[2 * i, 2 * i + 1]) for i in range(world // 2)]
        replicate = [dist.new_group(ranks=list(range(j, world, 2))) for j in range(2)]
        kw = {"sharding_strategy": ShardingStrategy.HYBRID_SHARD,
              "process_group": (shard[rank // 2], replicate[rank % 2])}
    fsdp = FSDP(fresh(), device_id=dev, auto_wrap_policy=policy, use_orig_params=True, **kw)
    groups = [getattr(fsdp, "process_group", None), getattr(fsdp, "_inter_node_pg", None)]
    sizes = [pg.size() if pg is not None else 0 for pg in groups]
    if a.strategy == "hybrid" and sizes != [2, world // 2]:
        failures.append(f"HYBRID_SHARD's groups (shard, replicate) have {sizes} ranks, want [2, {world // 2}]")
    l_fsdp = train(fsdp, batches, a.steps, a.lr)
    with FSDP.summon_full_params(fsdp):
        p_fsdp = {n.replace("_fsdp_wrapped_module.", ""): p.detach().clone() for n, p in fsdp.named_parameters()}

    rel, pdiff = compare(l_ddp, l_fsdp, p_ddp, p_fsdp, a.tol, "FSDP", failures)
    if not all(x == x for x in l_fsdp):
        failures.append("FSDP loss is NaN")
    out = {"rank": rank, "world": world, "strategy": a.strategy, "group_sizes": sizes, "torch": torch.__version__, "steps": a.steps, "params":
           sum(p.numel() for p in p_ddp.values()), "max_rel_loss_diff": rel, "max_param_diff": pdiff,
           "loss_first": [round(x, 6) for x in l_ddp[:3]], "loss_last_ddp": l_ddp[-1], "loss_last_fsdp": l_fsdp[-1],
           "seconds_ddp": round(t_ddp, 2), "seconds_total": round(time.time() - t0, 2), "failures": failures}
    print(json.dumps(out), flush=True)
    dist.barrier()
    sys.exit(1 if failures else 0)


def fsdp2(a, fresh, batches, l_ddp, p_ddp, t0, t_ddp, rank, world, dev, block_cls):
    """fully_shard (FSDP2: DTensor parameters on a device mesh) against DDP's run."""
    failures = []
    try:
        from torch.distributed.device_mesh import init_device_mesh
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import fully_shard
    except ImportError as e:
        skip(f"no fully_shard in torch {torch.__version__}: {e}")
    if a.strategy == "fsdp2-hybrid":
        if world < 4 or world % 2:
            skip(f"a 2-D mesh of pairs needs an even world of 4 or more (this is {world})")
        mesh = init_device_mesh("cuda", (world // 2, 2), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("shard",))
    sizes = [mesh.get_group(d).size() for d in range(mesh.ndim)]
    model = fresh()
    for m in model.modules():
        if isinstance(m, block_cls):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    l_fsdp = train(model, batches, a.steps, a.lr)
    p_fsdp = {}
    for n, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        p_fsdp[n] = full.detach().clone()
    rel, pdiff = compare(l_ddp, l_fsdp, p_ddp, p_fsdp, a.tol, "FSDP2", failures)
    want = [world // 2, 2] if a.strategy == "fsdp2-hybrid" else [world]
    if sizes != want:
        failures.append(f"the mesh's groups have {sizes} ranks, want {want}")
    out = {"rank": rank, "world": world, "strategy": a.strategy, "group_sizes": sizes,
           "torch": torch.__version__, "steps": a.steps, "max_rel_loss_diff": rel, "max_param_diff": pdiff,
           "loss_last_ddp": l_ddp[-1], "loss_last_fsdp": l_fsdp[-1], "seconds_ddp": round(t_ddp, 2),
           "seconds_total": round(time.time() - t0, 2), "failures": failures}
    print(json.dumps(out), flush=True)
    dist.barrier()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
