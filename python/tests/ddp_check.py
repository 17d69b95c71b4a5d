"""DDP over the migctl backend ends with the same parameters as DDP over gloo,
and so does a gloo-group model with migctl_torch.allreduce_hook, and DDP
with torch's PowerSGD hook (which waits for collectives inside its Futures'
callbacks) over migctl and over gloo; the data
comes from a DataLoader with forked workers (num_workers=2) in this process,
which has loaded libmigctl.so; a forked child that calls the library gets an
error instead of a hang. Run under `migctl run --backend host --np 2`.
Prints one JSON line per rank; exits 1 on a mismatch."""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import migctl_torch  # noqa: E402
import migctl_torch.multinode  # noqa: E402
from migctl_torch import _lib  # noqa: E402


class Synthetic(torch.utils.data.Dataset):
    """Deterministic samples per rank; each worker checks it cannot use the library."""

    def __init__(self, rank, n):
        self.rank, self.n = rank, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None and i < 2:
            _child_cannot_call()
        g = torch.Generator().manual_seed(1000 * self.rank + i)
        x = torch.randn(16, generator=g)
        y = torch.randn(4, generator=g)
        return x, y


def _child_cannot_call():
    lib = _lib.load()  # the parent's, inherited
    if lib.lib.migctl_rank() != -1 or b"forked" not in (lib.lib.migctl_last_error() or b""):
        raise AssertionError("a forked DataLoader worker could call libmigctl")


def model():
    torch.manual_seed(0)
    # BatchNorm: DDP broadcasts its buffers from C++ before every forward (Works torch holds only in C++)
    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def train(m, loader, steps):
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    losses = []
    it = iter(loader)
    for _ in range(steps):
        x, y = next(it)
        opt.zero_grad()
        loss = nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def flat(m):
    mod = m.module if hasattr(m, "module") else m
    return torch.cat([p.detach().reshape(-1) for p in mod.parameters()])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=15)
    a = ap.parse_args()
    t0 = time.time()
    dist.init_process_group("migctl")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    bs = 8
    mk = lambda: torch.utils.data.DataLoader(Synthetic(rank, bs * a.steps), batch_size=bs, num_workers=2,  # noqa: E731
                                             multiprocessing_context="fork")
    failures = []

    # the fork guard, directly
    pid = os.fork()
    if pid == 0:
        try:
            _child_cannot_call()
            code = 0
            try:
                migctl_torch.process_group._Comm.get()
                code = 3
            except migctl_torch.MigctlError as e:
                code = 0 if e.code == _lib.ERR_FORKED else 4
        except BaseException:  # noqa: BLE001
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        failures.append(f"forked child: exit {os.waitstatus_to_exitcode(status)} (the library did not refuse it)")

    m_migctl = DDP(model(), process_group=dist.group.WORLD)
    m_gloo = DDP(model(), process_group=gloo)
    m_hook = DDP(model(), process_group=gloo)
    m_hook.register_comm_hook(None, migctl_torch.allreduce_hook)

    # PowerSGD's hook waits, inside its Futures' callbacks, for the all-reduces it issues there
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    m_psgd = DDP(model(), process_group=dist.group.WORLD)
    m_psgd.register_comm_hook(psgd.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2),
                              psgd.powerSGD_hook)
    m_psgd_gloo = DDP(model(), process_group=gloo)
    m_psgd_gloo.register_comm_hook(psgd.PowerSGDState(gloo, matrix_approximation_rank=1, start_powerSGD_iter=2),
                                   psgd.powerSGD_hook)

    l_migctl = train(m_migctl, mk(), a.steps)
    l_gloo = train(m_gloo, mk(), a.steps)
    l_hook = train(m_hook, mk(), a.steps)
    train(m_psgd, mk(), a.steps)
    train(m_psgd_gloo, mk(), a.steps)

    p_m, p_g, p_h = flat(m_migctl), flat(m_gloo), flat(m_hook)
    d_mg = (p_m - p_g).abs().max().item()
    d_hg = (p_h - p_g).abs().max().item()
    tol = 0.0 if world <= 2 else 1e-5  # two summands are exact; more may round differently
    if d_mg > tol:
        failures.append(f"DDP over migctl vs gloo: parameters differ by {d_mg}")
    if d_hg > tol:
        failures.append(f"allreduce_hook vs gloo: parameters differ by {d_hg}")
    d_psgd = (flat(m_psgd) - flat(m_psgd_gloo)).abs().max().item()
    if d_psgd > tol:
        failures.append(f"PowerSGD hook over migctl vs gloo: parameters differ by {d_psgd}")
    # every rank holds the same parameters
    allp = [torch.empty_like(p_m) for _ in range(world)]
    dist.all_gather(allp, p_m)
    if any(not torch.equal(allp[0], q) for q in allp[1:]):
        failures.append("ranks hold different parameters after DDP over migctl")
    h = migctl_torch.multinode.Hier._instance  # set when the job spans nodes
    print(json.dumps({"rank": rank, "world": world, "torch": torch.__version__, "nodes": h.nodes if h else 1,
                      "max_diff_migctl_gloo": d_mg,
                      "max_diff_hook_gloo": d_hg, "max_diff_powersgd_gloo": d_psgd, "loss_migctl": l_migctl[-1], "loss_gloo": l_gloo[-1],
                      "losses_equal": l_migctl == l_gloo, "seconds": round(time.time() - t0, 2),
                      "failures": failures}), flush=True)
    dist.barrier()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
