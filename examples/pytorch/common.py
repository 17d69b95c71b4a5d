"""What ddp_resnet.py and ddp_gpt.py share: flags, process-group setup for
--backend migctl|gloo|none, the timed training loop, and the JSON report."""

import argparse
import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

# migctl_torch from the checkout unless it is installed (pip install -e python/).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


def parser(description):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--backend", choices=["migctl", "gloo", "nccl", "none"], default="migctl",
                    help="none: the same processes train without any communication (the bound)")
    ap.add_argument("--steps", type=int, default=60, help="timed steps")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    ap.add_argument("--batch", type=int, default=32, help="batch per rank")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--losses", type=int, default=50, help="losses of the first N steps in the report")
    ap.add_argument("--bucket-mb", type=float, default=25, help="DDP bucket_cap_mb")
    ap.add_argument("--probe-hook", choices=["", "noop", "sync"], default="",
                    help="diagnosis: DDP without reducing gradients (noop: no communication; sync: a 1-element "
                         "all-reduce per bucket) — the parameters diverge, the step time is what matters")
    ap.add_argument("--deterministic", action="store_true",
                    help="deterministic cuDNN/cuBLAS kernels, so that two backends' losses can be compared to "
                         "round-off (ResNet's convolutions otherwise pick non-deterministic algorithms)")
    ap.add_argument("--step-delay", type=float, default=0.0, help="seconds of sleep after every step (timed as part of "
                    "the step's --sync-every window when K > 1)")
    ap.add_argument("--mark-at", type=int, default=-1, help="rank 0 creates --mark-file after this step")
    ap.add_argument("--mark-file", default="", help="see --mark-at (a driver waits for it)")
    ap.add_argument("--bucket-view", action="store_true",
                    help="DDP gradient_as_bucket_view=True (gradients are views into the buckets: no copy in or out)")
    ap.add_argument("--profile", default="",
                    help="diagnosis: write a torch.profiler trace (CPU and CUDA activity: kernels, the library's "
                         "copies) of --profile-steps steps after the warmup to PROFILE.rank<r>.json.gz")
    ap.add_argument("--profile-ranks", default="0", help="ranks that write --profile traces (comma-separated)")
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--lockstep", action="store_true",
                    help="with --backend none: the ranks wait for each other once per step, or per window of "
                         "--sync-every steps (a barrier after it, over migctl under `migctl run`, else gloo), "
                         "moving no gradients: the bound of a synchronous data-parallel job, whose every step is "
                         "as slow as the slowest rank's")
    ap.add_argument("--lockstep-via", choices=["migctl", "gloo"], default="",
                    help="with --lockstep: the backend of the per-step barrier (default: migctl under "
                         "`migctl run`, else gloo); gloo keeps the migctl library out of the process")
    ap.add_argument("--no-broadcast-buffers", dest="broadcast_buffers", action="store_false",
                    help="DDP broadcast_buffers=False (no broadcast of BatchNorm statistics and other buffers "
                         "at every forward; the ranks' buffers then differ)")
    ap.add_argument("--cuda-sched", choices=["auto", "spin", "yield", "blocking"], default="auto",
                    help="diagnosis: how this process's CPU threads wait for the GPU (the primary context's "
                         "CU_CTX_SCHED_* flag, set before torch creates it): blocking sleeps instead of spinning")
    ap.add_argument("--sync-every", type=int, default=1, metavar="K",
                    help="the host waits for the GPU (and, with --lockstep, the ranks meet) every K steps, and "
                         "a step's time is its window's over K. 1 (default): every step alone, starting on an idle "
                         "GPU; K > 1 runs like a training loop that reads its loss every K steps, whose CPU work "
                         "(DDP's buffer broadcast, launching the forward pass) overlaps the GPU's previous step. "
                         "--steps must be a multiple of K")
    ap.add_argument("--time-ddp", action="store_true",
                    help="diagnosis: time DDP's buffer broadcast before every forward pass (its CPU time, the "
                         "process group's broadcast calls within it, and, with --sync-every 1, when the GPU got "
                         "past it) and report the means per rank")
    return ap


class MeanPool(nn.Module):
    """Global average pooling as a mean (--deterministic): AdaptiveAvgPool2d's
    CUDA backward has no deterministic implementation."""

    def forward(self, x):
        return x.mean(dim=(2, 3), keepdim=True)


def setup(args):
    """Joins the group (the environment of `migctl run` or torchrun) and
    returns (rank, world, device). --backend none still joins a gloo group
    for the report only: training itself never communicates."""
    backend = "gloo" if args.backend == "none" else args.backend
    if getattr(args, "lockstep_via", "") and not getattr(args, "lockstep", False):
        raise SystemExit("--lockstep-via is for --lockstep")
    k = getattr(args, "sync_every", 1)
    if k < 1:
        raise SystemExit(f"--sync-every {k}: must be at least 1")
    if args.steps % k:
        raise SystemExit(f"--steps {args.steps} is not a multiple of --sync-every {k}")
    if getattr(args, "lockstep", False):
        if args.backend != "none":
            raise SystemExit("--lockstep is for --backend none (a backend's collectives synchronise the ranks)")
        via = getattr(args, "lockstep_via", "")
        if via:
            backend = via
        elif os.environ.get("MIGCTL_RDZV_ADDR"):  # under `migctl run`: the cheapest barrier there is
            backend = "migctl"
    if backend == "migctl":
        import migctl_torch  # noqa: F401  (registers the backend)
    if getattr(args, "deterministic", False):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True, warn_only=True)  # an op without one warns, not fails
    if args.device.startswith("cuda"):
        # Under `migctl run` every worker sees its device (MIG instance or GPU) as cuda:0.
        index = int(os.environ.get("MIGCTL_DEVICE", "0"))
        if getattr(args, "cuda_sched", "auto") != "auto":
            _cuda_sched(args.cuda_sched, index)
        torch.cuda.set_device(index)
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), device


def _cuda_sched(mode, index):
    """Sets the scheduling flag of device index's primary context (the one
    torch uses) through the driver API, before torch creates it."""
    import ctypes
    flag = {"spin": 1, "yield": 2, "blocking": 4}[mode]  # CU_CTX_SCHED_SPIN, _YIELD, _BLOCKING_SYNC
    cu = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()

    def check(what, rc):
        if rc != 0:
            raise RuntimeError(f"--cuda-sched {mode}: {what} returned CUDA error {rc}")
    check("cuInit", cu.cuInit(0))
    check("cuDeviceGet", cu.cuDeviceGet(ctypes.byref(dev), index))
    check("cuDevicePrimaryCtxSetFlags", cu.cuDevicePrimaryCtxSetFlags_v2(dev, flag))


def wrap(model, args, device):
    if args.backend == "none":
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP
    ids = [device.index] if device.type == "cuda" else None
    kw = {"gradient_as_bucket_view": True} if getattr(args, "bucket_view", False) else {}
    if not getattr(args, "broadcast_buffers", True):
        kw["broadcast_buffers"] = False
    ddp = DDP(model, device_ids=ids, bucket_cap_mb=args.bucket_mb, **kw)
    if getattr(args, "probe_hook", ""):
        ddp.register_comm_hook(None, _PROBE_HOOKS[args.probe_hook])
    if getattr(args, "time_ddp", False):
        # the GPU figure only where every step starts on an idle GPU (--sync-every 1)
        _time_buffer_sync(ddp, device, gpu=getattr(args, "sync_every", 1) == 1)
    return ddp


class _BufferSyncTimes:
    """Diagnosis (--time-ddp): per step, the CPU time of DDP's buffer sync
    (_sync_buffers), the CPU time of the process group's broadcast calls in
    it, and the GPU time from the step's start to the end of what the sync
    queued (cuda events; only with gpu, where the GPU is idle at every step's
    start: --sync-every 1)."""

    def __init__(self, device, gpu=True):
        self.cuda = device.type == "cuda" and gpu
        self.cpu, self.bcast, self.gpu = [], [], []
        self.step_bcast, self.synced = 0.0, False
        self.events = None

    def start_step(self):
        self.step_bcast, self.synced = 0.0, False
        if self.cuda:
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record()

    def end_step(self):
        """After the step's synchronize: this step's figures."""
        self.bcast.append(self.step_bcast)
        if self.events is not None and self.synced:
            self.gpu.append(self.events[0].elapsed_time(self.events[1]) / 1e3)
            self.events = None

    def means_ms(self, last):
        """Each figure's mean over the last `last` steps (the timed ones), in ms."""
        tail = [x[max(0, len(x) - last):] if last else [] for x in (self.cpu, self.bcast, self.gpu)]
        return [1e3 * sum(x) / max(len(x), 1) for x in tail]


def _time_buffer_sync(ddp, device, gpu=True):
    times = _BufferSyncTimes(device, gpu)
    sync_buffers = ddp._sync_buffers

    def timed_sync(*a, **k):
        t = time.perf_counter()
        try:
            return sync_buffers(*a, **k)
        finally:
            times.cpu.append(time.perf_counter() - t)
            times.synced = True
            if times.events is not None:
                times.events[1].record()
    ddp._sync_buffers = timed_sync
    if dist.get_backend() == "migctl":
        import migctl_torch.process_group as pg
        cls = pg.ProcessGroupMigctl
        if not getattr(cls, "_timed_broadcast", False):
            broadcast = cls.broadcast

            def timed_broadcast(self, *a, **k):
                t = time.perf_counter()
                try:
                    return broadcast(self, *a, **k)
                finally:
                    times.step_bcast += time.perf_counter() - t
            cls.broadcast, cls._timed_broadcast = timed_broadcast, True
    ddp._diag_times = times


# Diagnosis only (--probe-hook): DDP with its gradients left unreduced, to
# split a step's exposed time into synchronisation and data movement.
def _noop_hook(state, bucket):
    """No communication at all (DDP's own overhead)."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _sync_hook(state, bucket):
    """A one-element all-reduce per bucket: the ranks synchronise as they
    would, but move no data."""
    t = torch.zeros(1, device=bucket.buffer().device)
    return dist.all_reduce(t, async_op=True).get_future().then(lambda f: bucket.buffer())


_PROBE_HOOKS = {"noop": _noop_hook, "sync": _sync_hook}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _profiler(args, rank, device):
    """A torch.profiler for --profile on this rank, or None."""
    if not getattr(args, "profile", "") or str(rank) not in args.profile_ranks.split(","):
        return None
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=acts)


def _mark(prof, name):
    """A named range in the --profile trace (nothing when not profiling)."""
    if prof is None:
        return contextlib.nullcontext()
    return torch.autograd.profiler.record_function(name)


def _stop_profiler(prof, args, rank):
    import gzip
    import shutil
    prof.stop()
    path = f"{args.profile}.rank{rank}.json"
    prof.export_chrome_trace(path)
    with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(path)


def train(name, args, model, batches, loss_fn, rank, world, device, extra=None):
    """Runs warmup + steps SGD steps over the cycled synthetic batches; rank 0
    prints one JSON line: steps/s and mean step time of the slowest rank, the
    first losses (rank 0's), a parameter checksum and whether every rank
    holds the same parameters. The timed steps run in windows of
    --sync-every steps, the host waiting for the GPU only at their edges;
    a step's time is its window's mean."""
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    losses, times = [], []
    prof = _profiler(args, rank, device)
    cpu0 = cpu1 = 0.0  # this process's CPU time (every thread) over the timed steps
    lockstep = getattr(args, "lockstep", False)
    k = getattr(args, "sync_every", 1)
    pending = []  # this window's first losses, read (loss.item() waits for the GPU) at its end
    t0 = 0.0
    for step in range(args.warmup + args.steps):
        if prof is not None and step == args.warmup:
            prof.start()
        if prof is not None and step == args.warmup + args.profile_steps:
            _stop_profiler(prof, args, rank)
            prof = None
        x, y = batches[step % len(batches)]
        # warmup steps one at a time; then windows of k steps, the host waiting for the GPU at their edges only
        timed = step >= args.warmup
        first = not timed or (step - args.warmup) % k == 0
        last = not timed or (step - args.warmup) % k == k - 1
        if first:
            sync(device)
            if step == args.warmup:
                cpu0 = time.process_time()
        diag = getattr(model, "_diag_times", None)
        if diag is not None:
            diag.start_step()
        if first:
            t0 = time.perf_counter()
        with _mark(prof, f"train_step_{step}"):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            with _mark(prof, "backward"):
                loss.backward()
            opt.step()
            if last:
                sync(device)
                if lockstep:
                    dist.barrier()
        if diag is not None:
            diag.end_step()
        if len(losses) + len(pending) < args.losses:
            pending.append(loss.detach())
        if last:
            if timed:
                times.append((time.perf_counter() - t0) / k)  # one figure per window: its mean step
                cpu1 = time.process_time()
            losses.extend(v.item() for v in pending)
            pending = []
        if args.step_delay > 0:
            time.sleep(args.step_delay)
        if step == args.mark_at and rank == 0 and args.mark_file:
            open(args.mark_file, "w").close()
    med = sorted(times)[len(times) // 2] if times else 0.0
    cpu_step = (cpu1 - cpu0) / max(len(times) * k, 1)
    diag = getattr(model, "_diag_times", None)
    diag_ms = diag.means_ms(len(times) * k) if diag is not None else [0.0, 0.0, 0.0]
    mine = torch.tensor([sum(times) / max(len(times), 1), med, cpu_step] + diag_ms, dtype=torch.float64)
    params = torch.cat([p.detach().reshape(-1).double().cpu() for p in model.parameters()])
    checksum = torch.tensor([params.sum().item(), (params * params).sum().item()], dtype=torch.float64)
    # the report goes over gloo on CPU tensors whatever the backend, so it measures nothing of it
    rep = dist.new_group(backend="gloo")
    all_t = [torch.zeros(mine.numel(), dtype=torch.float64) for _ in range(world)]
    dist.all_gather(all_t, mine, group=rep)
    all_c = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(all_c, checksum, group=rep)
    slowest = max(t[0].item() for t in all_t)
    slowest_median = max(t[1].item() for t in all_t)
    if rank == 0:
        out = {"model": name, "backend": args.backend, "world": world, "device": str(device),
               "torch": torch.__version__, "batch_per_rank": args.batch, "steps": args.steps,
               "step_ms_slowest_rank": round(slowest * 1e3, 3),
               "step_ms_per_rank": [round(t[0].item() * 1e3, 3) for t in all_t],
               "step_ms_median_slowest_rank": round(slowest_median * 1e3, 3),  # robust on a busy machine
               "sync_every": k,  # steps per timed window (the median above is over windows)
               # CPU time of each rank's process (all its threads) per timed step, profiled steps included
               "cpu_ms_per_step": [round(t[2].item() * 1e3, 2) for t in all_t],
               "steps_per_s": round(1.0 / slowest, 3) if slowest > 0 else None,
               "lockstep": lockstep, "barrier_backend": dist.get_backend() if lockstep else None,
               "losses": losses, "param_checksum": checksum.tolist(),
               "ranks_identical": all(torch.equal(c, all_c[0]) for c in all_c)}
        if args.backend == "migctl":
            # rank 0's library counters over the whole run: collectives done, all-reduces chained
            # (the next one started before they ended), waits that returned early (results on the GPU),
            # all-reduces whose copies back were queued at once (MIGCTL_TUNING=complete=queued)
            from migctl_torch import _lib  # noqa: PLC0415
            st = _lib.load().stats()
            out["library"] = {k: st.get(k, 0) for k in ("done", "chained", "early", "queued_back")}
        if diag is not None:  # --time-ddp: per rank, ms per step
            out["buffer_sync"] = {k: [round(t[3 + i].item(), 3) for t in all_t]
                                  for i, k in enumerate(("cpu_ms", "pg_broadcast_cpu_ms", "gpu_ms"))}
        out.update(extra or {})
        print(json.dumps(out), flush=True)
    dist.barrier(group=rep)
    dist.destroy_process_group()
