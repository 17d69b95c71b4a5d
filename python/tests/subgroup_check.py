"""Groups of some of the ranks (dist.new_group(ranks=[...])) on the migctl
backend, across the real processes of `migctl run` (4 ranks or more; CPU
tensors, or CUDA with --device cuda):

    migctl run --backend host --np 4 -- python3 python/tests/subgroup_check.py

- pairs {0,1}, {2,3}, ... and the group of the odd ranks: every collective
  on them (all-reduce with each op, all_gather, all_gather_into_tensor,
  reduce_scatter_tensor, broadcast from a member, barrier, async Works and
  Futures), interleaved with the job's group and each other, exact results;
- DDP on each pair (process_group=pair) ends with the same parameters as
  DDP on gloo pairs of the same ranks, and differs from the other pair's;
- destroying a pair's group frees it in the library (its collectives raise
  afterwards), the job's group goes on;
- --gloo-default: with gloo as the default group, a migctl group of some
  ranks formed before the job's migctl group raises NotImplementedError
  saying what to do at its first collective; after new_group(backend=
  "migctl") of every rank it works.

In a job across nodes (2 nodes x 2 ranks in CI) the pairs are within a
node (migctl) and the odd ranks' group spans both (a gloo group).

Prints one JSON line per rank; exits 1 on a failure."""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

import migctl_torch  # noqa: E402,F401
import migctl_torch.multinode  # noqa: E402

failures = []
checks = 0


def expect(name, got, want):
    global checks
    checks += 1
    if not torch.equal(got.cpu(), want.cpu()):
        failures.append(f"{name}: got {got.cpu().tolist()}, want {want.cpu().tolist()}")


def groups(world):
    """Every rank forms every group, in one order (torch's rule)."""
    pairs = [dist.new_group(ranks=[2 * i, 2 * i + 1]) for i in range(world // 2)]
    odd = dist.new_group(ranks=list(range(world - 1 if world % 2 == 0 else world - 2, 0, -2)))  # listed high first
    return pairs, odd


def torch_name(pg):
    """torch's name of a group (its registry: 2.x _world.pg_names, 1.13 _pg_names)."""
    c = dist.distributed_c10d
    names = getattr(getattr(c, "_world", None), "pg_names", None)
    return (names if names is not None else getattr(c, "_pg_names", {})).get(pg)


def collectives(rank, world, dev):
    pairs, odd = groups(world)
    # every group carries torch's name for it (torch 2.x's DeviceMesh, so FSDP2, reads group_name)
    for what, pg in (("job", dist.group.WORLD), ("pair", pairs[min(rank // 2, len(pairs) - 1)]), ("odd", odd)):
        if pg == dist.GroupMember.NON_GROUP_MEMBER or not isinstance(pg, migctl_torch.ProcessGroupMigctl):
            continue  # torch names its own groups (a gloo group across nodes)
        global checks
        checks += 1
        name = torch_name(pg)
        if not name or getattr(pg, "group_name", None) != name:
            failures.append(f"{what} group: group_name {getattr(pg, 'group_name', None)!r}, torch's {name!r}")
    members = [r for r in range(1, world, 2)]
    pair = pairs[rank // 2] if rank // 2 < len(pairs) else None
    mine = [2 * (rank // 2), 2 * (rank // 2) + 1]
    for rnd in range(3):  # the job's group between the groups' calls
        if pair is not None:
            for name, op, want in (("sum", dist.ReduceOp.SUM, float(sum(r + 1 for r in mine))),
                                   ("max", dist.ReduceOp.MAX, float(max(mine) + 1)),
                                   ("min", dist.ReduceOp.MIN, float(min(mine) + 1))):
                t = torch.full((5,), float(rank + 1), device=dev)
                dist.all_reduce(t, op=op, group=pair)
                expect(f"round {rnd} pair all_reduce {name}", t, torch.full((5,), want))
        t = torch.full((3,), float(rank), device=dev)
        dist.all_reduce(t)
        expect(f"round {rnd} job all_reduce", t, torch.full((3,), float(world * (world - 1) // 2)))
        if rank in members:
            t = torch.full((4,), float(rank), device=dev, dtype=torch.float64)
            w = dist.all_reduce(t, op=dist.ReduceOp.SUM, group=odd, async_op=True)
            w.wait()
            expect(f"round {rnd} odd all_reduce async", t, torch.full((4,), float(sum(members)), dtype=torch.float64))
    if rank in members:
        k = len(members)
        me = members.index(rank)  # torch numbers a group's ranks in ascending order
        if dist.get_rank(odd) != me or dist.get_world_size(odd) != k:
            failures.append(f"odd group: rank {dist.get_rank(odd)} of {dist.get_world_size(odd)}, want {me} of {k}")
        outs = [torch.zeros(2, dtype=torch.int64, device=dev) for _ in range(k)]
        dist.all_gather(outs, torch.tensor([rank, -rank], device=dev), group=odd)
        expect("odd all_gather", torch.stack(outs), torch.tensor([[r, -r] for r in members]))
        flat = torch.zeros(3 * k, device=dev)
        ag = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
        ag(flat, torch.full((3,), float(rank), device=dev), group=odd)
        expect("odd all_gather_into_tensor", flat, torch.tensor([float(r) for r in members for _ in range(3)]))
        rs = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
        out = torch.zeros(2, device=dev)
        rs(out, torch.arange(2 * k, dtype=torch.float32, device=dev) + rank, group=odd)
        expect("odd reduce_scatter_tensor", out,
               torch.tensor([k * (2 * me + j) + float(sum(members)) for j in range(2)]))
        b = torch.full((6,), float(rank), device=dev)
        dist.broadcast(b, src=members[-1], group=odd)  # the job's rank, as torch takes it
        expect("odd broadcast", b, torch.full((6,), float(members[-1])))
        fut = dist.all_reduce(torch.ones(2, device=dev), group=odd, async_op=True).get_future()
        expect("odd future", fut.wait()[0], torch.full((2,), float(k)))
        dist.barrier(group=odd)
    if pair is not None:
        x = torch.full((1000,), float(rank), device=dev)
        works = [dist.all_reduce(x, group=pair, async_op=True) for _ in range(2)]
        for w in works:
            w.wait()
        expect("pair two async all_reduces", x, torch.full((1000,), 2.0 * sum(mine)))
    dist.barrier()


def ddp_pairs(rank, world, dev):
    """DDP on each pair over migctl, against DDP on gloo pairs of the same ranks."""
    pairs, _ = groups(world)
    glo = [dist.new_group(ranks=[2 * i, 2 * i + 1], backend="gloo") for i in range(world // 2)]
    if rank // 2 >= len(pairs):  # no pair: only the job's all_gather below
        n = sum(p.numel() for p in nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).parameters())
        dist.all_gather([torch.zeros(n, device=dev) for _ in range(world)], torch.zeros(n, device=dev))
        return
    params = {}
    for name, pg in (("migctl", pairs[rank // 2]), ("gloo", glo[rank // 2])):
        torch.manual_seed(rank // 2)  # one model per pair
        model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).to(dev)
        d = nn.parallel.DistributedDataParallel(model, process_group=pg, device_ids=[dev.index] if dev.type == "cuda" else None)
        opt = torch.optim.SGD(d.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(100 + rank)  # every rank its own batches
        for _ in range(5):
            xb, yb = torch.randn(8, 16, generator=g).to(dev), torch.randn(8, 4, generator=g).to(dev)
            opt.zero_grad()
            nn.functional.mse_loss(d(xb), yb).backward()
            opt.step()
        params[name] = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
    global checks
    checks += 1
    diff = (params["migctl"] - params["gloo"]).abs().max().item()
    if diff > 1e-5:
        failures.append(f"DDP on a pair: migctl and gloo parameters differ by {diff}")
    # the pair's ranks agree with each other, and the other pair trained another model
    both = [torch.zeros_like(params["migctl"]) for _ in range(world)]
    both = [b.to(dev) for b in both]
    dist.all_gather(both, params["migctl"].to(dev))
    checks += 1
    if not torch.equal(both[2 * (rank // 2)].cpu(), both[2 * (rank // 2) + 1].cpu()):
        failures.append("DDP on a pair: the pair's ranks hold different parameters")
    if world >= 4 and torch.equal(both[0].cpu(), both[2].cpu()):
        failures.append("DDP on a pair: both pairs hold the same parameters (were they one group?)")


def teardown(rank, world, dev):
    """Destroying a group of some of the ranks frees it in the library (torch
    2.9+'s destroy_process_group calls the group's shutdown; older torch
    does not, so the check calls it): its collectives raise afterwards,
    naming the freed group, and the job's group goes on."""
    global checks
    pairs, _ = groups(world)
    if rank // 2 < len(pairs):
        pair = pairs[rank // 2]
        t = torch.ones(2, device=dev)
        dist.all_reduce(t, group=pair)
        expect("pair before its destruction", t, torch.full((2,), 2.0))
        if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 9):
            dist.destroy_process_group(pair)
        else:
            pair.shutdown()
        checks += 1
        try:
            pair.allreduce([t]).wait()
            failures.append("a collective on a destroyed group: no error")
        except RuntimeError as e:
            if "freed" not in str(e):
                failures.append(f"a collective on a destroyed group: {e}")
    t = torch.ones(2, device=dev)
    dist.all_reduce(t)
    expect("the job's group after a group's destruction", t, torch.full((2,), float(world)))


def before_job_group(rank, world, dev):
    """gloo default: a migctl group of some ranks needs the job's first."""
    global checks
    early = dist.new_group(ranks=[0, 1], backend="migctl")
    if rank in (0, 1):
        checks += 1
        try:
            dist.all_reduce(torch.ones(2, device=dev), group=early)
            failures.append("a migctl group of some ranks before the job's: no NotImplementedError")
        except NotImplementedError as e:
            if "new_group(backend='migctl')" not in str(e):
                failures.append(f"the error does not say what to do: {e}")
    job = dist.new_group(backend="migctl")
    t = torch.ones(2, device=dev)
    dist.all_reduce(t, group=job)
    expect("job's migctl group on a gloo job", t, torch.full((2,), float(world)))
    late = dist.new_group(ranks=[0, 1], backend="migctl")
    if rank in (0, 1):
        t = torch.full((2,), float(rank + 1), device=dev)
        dist.all_reduce(t, group=late)
        expect("a migctl group of some ranks after the job's", t, torch.full((2,), 3.0))
    dist.barrier()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--gloo-default", action="store_true")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if a.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device("cpu")
    if a.gloo_default:
        dist.init_process_group("gloo")
        before_job_group(rank, world, dev)
    else:
        dist.init_process_group("migctl")
        collectives(rank, world, dev)
        ddp_pairs(rank, world, dev)
        teardown(rank, world, dev)
    dist.barrier()
    nodes = migctl_torch.multinode.nodes()[1] if migctl_torch.multinode.spans_nodes() else 1
    print(json.dumps({"rank": rank, "nodes": nodes, "checks": checks, "failures": failures}), flush=True)
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
