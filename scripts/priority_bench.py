#!/usr/bin/env python3
"""priority_bench.py — issue 10, deliverable 1: a high-priority inference job next to best-effort
training on one GPU, with and without compute-priority control. Run by scripts/h200-priority.sh.

Roles:
  infer   the high-priority job: torchvision ResNet-50 (random init, eval, batch 1, 224x224, fp32
          weights and activations by default, --dtype bf16 for bf16; cuDNN's default TF32
          convolutions stay on; cudnn.benchmark off unless --cudnn-benchmark), one request every
          --interval-ms (10 ms) open loop: request k is due at T + k*interval whatever happened to
          request k-1. A request copies a pinned host image to the device, runs the model and
          copies the 1000 logits back; its latency is the wall time from issue to the logits being
          on the host (the copy back synchronises). It reports p50/p90/p99/p99.9/max of that
          latency, the same measured from the due time (what a caller sees: latency plus queueing
          behind a late request), and the slip of each issue behind its due time.
  train   the best-effort job: torchvision ResNet-18 (random init), batch 32, 224x224, synthetic
          data (one fixed batch on the device), SGD momentum 0.9, fp32, one loss.item() per step
          (a sync, as a training loop that logs its loss). Reports steps/s over the window.
  drive   runs the cases (each in fresh processes; see CASES below), writes every role's JSON and
          stderr under --out, prints one row per case, a markdown table (table.md), PASS/FAIL/SKIP
          and TARGET lines (summary.txt) and everything (results.json).
  selftest  the drive without a GPU: a two-layer torch model on the CPU, then timed kernels on the
          fake libcuda.so under the real shim and daemon; PASS/FAIL per case.

Both roles: warm up (--warmup requests/steps), write --ready FILE, keep working at their normal
pace, and wait for --go FILE, which holds the window's start T (Unix time, written by the driver
once every role of the case is ready, T = now + 0.5 s). Both measure exactly [T, T + --duration];
training keeps going --tail seconds past the window so that the last requests still have company.
A role that never sees the go file exits with an error after --go-timeout seconds. Under
libmigswap.so each role adds the shim's migswap_get_stats (and slicing stats) to its JSON.
--model tiny (a two-layer net, no torchvision) and --model fake (the fake libcuda.so, no torch)
are for the plumbing tests only.
"""
import argparse
import contextlib
import ctypes
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

# --------------------------------------------------------------------------- shared helpers


def pct(xs, p):
    """Nearest-rank percentile (p in 0..100) of xs; nan when empty."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    # p * n / 100 in floating point can land just above an integer (99.9 of 1000
    # gives 999.0000000000001): without the epsilon p99.9 would be the maximum.
    k = max(0, min(len(s) - 1, int(math.ceil(p * len(s) / 100.0 - 1e-9)) - 1))
    return s[k]


def summary_ms(xs):
    """Percentiles of a list of seconds, in ms."""
    ms = [1000.0 * x for x in xs]
    return {"p50": pct(ms, 50), "p90": pct(ms, 90), "p99": pct(ms, 99), "p99.9": pct(ms, 99.9),
            "max": max(ms) if ms else float("nan"), "mean": statistics.fmean(ms) if ms else float("nan")}


def short(msg, n=360):
    """msg on one line, at most n characters: its start and its end (where the exception is)."""
    m = " ".join(str(msg).split())
    return m if len(m) <= n else m[:n // 3] + " ... " + m[-(n - n // 3 - 5):]


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def shim_stats():
    """migswap_get_stats from libmigswap.so when it is preloaded, else None. Read into a large
    buffer, so that a newer shim's longer struct never overruns it; ABI 2 (issue 10 D2) appends
    the prio_* fields, anything after them is kept raw (extra_u64)."""
    try:
        fn = ctypes.CDLL(None).migswap_get_stats
    except (AttributeError, OSError):
        return None
    buf = (ctypes.c_uint64 * 512)()
    if fn(ctypes.byref(buf)) != 0:
        return {"error": "migswap_get_stats failed"}
    u32 = (ctypes.c_uint32 * 1024).from_buffer(buf)
    i32 = (ctypes.c_int32 * 1024).from_buffer(buf)
    names = ["allocations", "bytes", "gated_calls", "swaps_out", "swaps_in", "bytes_out", "bytes_in",
             "refusals", "needs", "arena_bytes"]
    d = {"abi_version": u32[0], "mode": u32[1], "state": u32[2], "connected": u32[3]}
    for i, n in enumerate(names):
        d[n] = buf[2 + i]
    nxt = 2 + len(names)  # u64 index after arena_bytes
    if d["abi_version"] >= 2:
        for i, n in enumerate(["prio_holds", "prio_held_ns", "prio_busy_periods", "prio_busy_ns", "prio_mask"]):
            d[n] = buf[nxt + i]
        w = 2 * (nxt + 5)  # the four 32-bit fields after them
        d.update({"prio_policy": u32[w], "prio_budget": u32[w + 1], "prio_slot": i32[w + 2], "prio_signal": u32[w + 3]})
        nxt += 7
    extra = list(buf[nxt:nxt + 16])
    while extra and extra[-1] == 0:
        extra.pop()
    if extra:
        d["extra_u64"] = extra  # fields a later ABI appended, in the order of its migswap.h
    try:  # slicing (issue 10 D3): struct migswap_slice_stats, eight uint64 (shim/ptxslice.h)
        sl = ctypes.CDLL(None).migswap_slice_get_stats
        sb = (ctypes.c_uint64 * 64)()
        if sl(ctypes.byref(sb)) == 0:
            d["slice"] = dict(zip(["modules_rewritten", "modules_skipped", "entries_sliceable", "entries_refused",
                                   "functions_mapped", "sliced_launches", "slices", "fallbacks"], sb))
    except (AttributeError, OSError):
        pass
    return d


class Window:
    """The start barrier: --ready is written by the role, --go by the driver (the window's
    start as Unix time). perf() times are converted with one offset taken at start."""

    def __init__(self, a):
        self.a = a
        self.off = time.time() - time.perf_counter()
        self.t0 = None  # window start, perf_counter time
        self.t_ready = None

    def ready(self):
        self.t_ready = time.perf_counter()
        if self.a.ready:
            write_atomic(self.a.ready, f"{os.getpid()}\n")

    def poll(self):
        """The window's start (perf time) once the go file exists, else None. Raises after
        --go-timeout seconds without one."""
        if self.t0 is not None:
            return self.t0
        if not self.a.go:  # standalone run: the window starts at once
            self.t0 = time.perf_counter() + 0.05
            return self.t0
        try:
            with open(self.a.go) as f:
                txt = f.read().strip()
            if txt:
                self.t0 = float(txt) - self.off
                return self.t0
        except (OSError, ValueError):
            pass
        if time.perf_counter() - self.t_ready > self.a.go_timeout:
            raise TimeoutError(f"no start signal in {self.a.go} after {self.a.go_timeout} s")
        return None


def setup_torch(a):
    import torch
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.cuda.set_device(0)
        # off by default: with it, the two jobs of a case would time cuDNN's algorithms against each
        # other during warm-up and could pick other kernels than when alone
        torch.backends.cudnn.benchmark = a.cudnn_benchmark
    torch.manual_seed(a.seed)
    if a.device == "cpu":
        torch.set_num_threads(max(1, a.cpu_threads))
    return torch, dev


def build_model(torch, kind, role):
    """ResNet-50 (infer) / ResNet-18 (train) from torchvision with random weights; 'tiny' is a
    two-conv net for the CPU plumbing test only (no torchvision needed)."""
    if kind == "resnet":
        import torchvision
        return torchvision.models.resnet50(weights=None) if role == "infer" else torchvision.models.resnet18(weights=None)
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=4), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 1000))


def stream_ctx(torch, dev, which):
    """A CUDA stream of the asked priority (high: the device's greatest, asked as -100, which torch
    clamps to the range; an older torch that refuses it gets -1; low: 0, the least, the default
    stream's), or a no-op context. Lower numbers are higher priorities."""
    if which == "none" or dev.type != "cuda":
        return contextlib.nullcontext(), None
    torch.cuda.synchronize()  # the model and data were made on the default stream
    try:
        s = torch.cuda.Stream(priority=-100 if which == "high" else 0)
    except (RuntimeError, ValueError):
        s = torch.cuda.Stream(priority=-1 if which == "high" else 0)
    return torch.cuda.stream(s), s


def device_info(torch, dev):
    d = {"torch": torch.__version__, "device": str(dev)}
    if dev.type == "cuda":
        d.update({"name": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
                  "cudnn": torch.backends.cudnn.version()})
    return d


def finite(x):
    """x with every NaN/inf float replaced by None (strict JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def emit(a, res):
    line = json.dumps(finite(res))
    if a.json:
        write_atomic(a.json, line + "\n")
    print(line, flush=True)


def wait_until(t):
    """Sleep to within 0.5 ms of perf time t, then spin (sleep alone overshoots by ~0.1 ms)."""
    d = t - time.perf_counter()
    if d > 0.0008:
        time.sleep(d - 0.0005)
    while time.perf_counter() < t:
        pass


# --------------------------------------------------------------------------- roles


class FakeGPU:
    """The fake libcuda.so (shim/fakecuda.c, found through LD_LIBRARY_PATH) through ctypes, for the
    shim's plumbing without a GPU (--model fake): its timed kernel sleep_us(usec) occupies the
    stream for usec of wall time, asynchronously, as a real kernel would. The fake has no shared
    device: two processes do not slow each other down, only the shim's gate can."""

    def __init__(self):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from swap_train import FakeCu  # the same ctypes bindings swap-h200's self-test uses
        self.cu = FakeCu()
        c = ctypes
        mod, self.f = c.c_void_p(), c.c_void_p()
        self.cu.ck(self.cu.l.cuModuleLoadData(c.byref(mod), c.c_char_p(b"fake-module")), "cuModuleLoadData")
        self.cu.ck(self.cu.l.cuModuleGetFunction(c.byref(self.f), mod, c.c_char_p(b"sleep_us")), "cuModuleGetFunction")
        self.buf = self.cu.alloc(1 << 20)  # so that the shim has an allocation to track

    def kernel(self, usec):
        u = ctypes.c_uint64(int(usec))
        params = (ctypes.c_void_p * 1)(ctypes.addressof(u))
        self.cu.ck(self.cu.l.cuLaunchKernel(self.f, 1, 1, 1, 1, 1, 1, 0, None, params, None), "cuLaunchKernel")

    def sync(self):
        self.cu.sync()


def role_infer(a):
    t_start = time.perf_counter()
    if a.model == "fake":  # one 3-ms kernel per request
        g = FakeGPU()
        info, stream = {"device": "fake libcuda.so"}, None

        def request():
            g.kernel(a.fake_kernel_us)
            g.sync()
    else:
        torch, dev = setup_torch(a)
        info = device_info(torch, dev)
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
        model = build_model(torch, a.model, "infer").eval().to(dev, dtype=dtype)
        res = 224 if a.model == "resnet" else 64
        x_host = torch.randn(a.batch, 3, res, res, dtype=dtype)
        if dev.type == "cuda":
            x_host = x_host.pin_memory()
        x_dev = torch.empty_like(x_host, device=dev)
        ctx, stream = stream_ctx(torch, dev, a.stream_priority)
        graph = None
        if a.graph and dev.type == "cuda":
            # the model replayed as one CUDA graph: no per-kernel launches from Python, so the request
            # is bound by the GPU, not by the CPU (how inference servers run small batches)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.inference_mode():
                for _ in range(3):
                    model(x_dev)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(graph):
                y_static = model(x_dev)
            torch.cuda.synchronize()

        def request():
            with ctx, torch.inference_mode():
                x_dev.copy_(x_host, non_blocking=True)
                if graph is not None:
                    graph.replay()
                    out = y_static.float().cpu()
                else:
                    out = model(x_dev).float().cpu()  # pageable destination: returns when the logits are here
                if stream is not None:
                    stream.synchronize()
                return out

    win = Window(a)
    for _ in range(a.warmup):
        request()
    t_warm = time.perf_counter() - t_start
    win.ready()
    iv = a.interval_ms / 1000.0
    recs = []  # (due, issued, done) in perf seconds
    due = time.perf_counter()
    t0 = None
    truncated = False
    while True:
        if t0 is None:
            t0 = win.poll()
            if t0 is not None:  # align the schedule on the window: due times T + k*iv
                due = t0 + math.ceil((time.perf_counter() - t0) / iv) * iv
        wait_until(due)
        ti = time.perf_counter()
        request()
        td = time.perf_counter()
        if t0 is not None and due >= t0 - 1e-9:
            if due >= t0 + a.duration - 1e-9:
                break
            recs.append((due, ti, td))
            if td > t0 + a.duration + a.max_overrun:  # hopelessly behind: stop, say so
                truncated = True
                break
        due += iv
    lat = [d - i for _, i, d in recs]
    lat_due = [d - u for u, _, d in recs]
    slip = [i - u for u, i, _ in recs]
    out = {"role": "infer", "model": "resnet50" if a.model == "resnet" else a.model, "dtype": a.dtype,
           "batch": a.batch, "graph": bool(a.graph), "interval_ms": a.interval_ms, "duration_s": a.duration,
           "stream_priority": a.stream_priority, "stream_priority_value": getattr(stream, "priority", None),
           "count": len(recs),
           "expected": int(round(a.duration / iv)), "truncated": truncated,
           "latency_ms": summary_ms(lat), "latency_from_due_ms": summary_ms(lat_due),
           "slip_ms": {"p50": pct([1000 * s for s in slip], 50), "p99": pct([1000 * s for s in slip], 99),
                       "max": 1000 * max(slip) if slip else float("nan"),
                       "late_over_1ms": sum(1 for s in slip if s > 0.001)},
           "warmup_s": t_warm, "waited_for_go_s": (t0 - win.t_ready) if t0 else None,
           "info": info, "shim": shim_stats(), "pid": os.getpid()}
    if a.samples and recs:
        with open(a.samples, "w") as f:
            for u, i, d in recs:
                f.write(f"{1000 * (u - t0):.3f} {1000 * (i - u):.3f} {1000 * (d - i):.3f}\n")
    emit(a, out)


def role_train(a):
    t_start = time.perf_counter()
    res = 224 if a.model == "resnet" else 64
    if a.model == "fake":  # ten 1-ms kernels per step, queued at once, then a sync
        g = FakeGPU()
        info, stream = {"device": "fake libcuda.so"}, None

        def step():
            for _ in range(10):
                g.kernel(a.fake_kernel_us / 3)
            g.sync()
            return 0.0
    else:
        torch, dev = setup_torch(a)
        info = device_info(torch, dev)
        model = build_model(torch, a.model, "train").to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        lossf = torch.nn.CrossEntropyLoss()
        x = torch.randn(a.batch, 3, res, res, device=dev)
        y = torch.randint(0, 1000, (a.batch,), device=dev)
        ctx, stream = stream_ctx(torch, dev, a.stream_priority)

        def step():
            with ctx:
                opt.zero_grad(set_to_none=True)
                loss = lossf(model(x), y)
                loss.backward()
                opt.step()
                return loss.item()

    win = Window(a)
    for _ in range(a.warmup):
        step()
    t_warm = time.perf_counter() - t_start
    win.ready()
    done = []  # completion times (perf) of steps that started at or after the window's start
    t0 = None
    n_pre = 0
    while True:
        if t0 is None:
            t0 = win.poll()
        ts = time.perf_counter()
        loss = step()
        te = time.perf_counter()
        if t0 is None or ts < t0:
            n_pre += 1
        else:
            done.append((ts, te))
        if t0 is not None and te >= t0 + a.duration + a.tail:
            break
    end = t0 + a.duration
    inwin = [(s, e) for s, e in done if e <= end]
    # steps whose whole run fell in the window, plus the fraction of the step straddling its end
    n = len(inwin)
    part = [(s, e) for s, e in done if s < end < e]
    frac = (end - part[0][0]) / (part[0][1] - part[0][0]) if part else 0.0
    first_start = done[0][0] if done else end
    span = end - first_start  # the window less the rest of the step that was running at T
    sps = (n + frac) / span if span > 0 else float("nan")
    st = [e - s for s, e in inwin]
    out = {"role": "train", "model": "resnet18" if a.model == "resnet" else a.model, "batch": a.batch,
           "res": res, "dtype": "fp32", "duration_s": a.duration, "stream_priority": a.stream_priority,
           "stream_priority_value": getattr(stream, "priority", None),
           "steps_in_window": n, "steps_per_s": sps, "images_per_s": sps * a.batch,
           "step_ms": summary_ms(st), "last_loss": loss, "warmup_s": t_warm, "steps_before_window": n_pre,
           "waited_for_go_s": t0 - win.t_ready, "info": info, "shim": shim_stats(),
           "pid": os.getpid()}
    emit(a, out)


# --------------------------------------------------------------------------- driver

CASES = {
    # id: (what, roles, mode)
    "a": ("infer alone", ["infer"], "plain"),
    "b": ("train alone", ["train"], "plain"),
    "c": ("infer + train, no control", ["infer", "train"], "plain"),
    "d": ("infer + train, infer on a high-priority CUDA stream (MPS not run)", ["infer", "train"], "streams"),
    "e0": ("infer + train under the shim, daemon with no priority policy", ["infer", "train"], "shim"),
    "e1": ("infer + train under the shim, policy gate", ["infer", "train"], "gate"),
    "e2": ("infer + train under the shim, policy budget=N", ["infer", "train"], "budget"),
    "e3": ("infer + train under the shim, policy gate,depth=M", ["infer", "train"], "depth"),
    "f": ("infer + train under the shim, gate,depth=M + slicing (MIGSWAP_SLICE_BLOCKS)", ["infer", "train"], "slice"),
    "g": ("infer + train under the shim, `migctl daemon --mps`: one MPS server, training at below-normal client "
          "priority", ["infer", "train"], "mps"),
    "g1": ("infer + train under the shim, `migctl daemon --mps --gate gate`", ["infer", "train"], "mps-gate"),
    "g2": ("infer + train under the shim, `migctl daemon --mps --mps-low-sm P`: training also capped at P% of "
           "the SMs", ["infer", "train"], "mps-low"),
}
# Most wanted first: a tight budget drops the last (the shim's own cost and stream priorities are
# diagnostics). A case's start is bounded by --startup-timeout and by what the budget leaves, so a
# slow one (slicing rewrites and JIT-compiles the PTX it finds at module load) cannot eat the run.
RUN_ORDER = ["a", "b", "c", "g", "g2", "e1", "g1", "e3", "e2", "f", "e0", "d"]
TABLE_ORDER = ["a", "b", "c", "d", "e0", "e1", "e2", "e3", "f", "g", "g1", "g2"]
GATED = ("gate", "budget", "depth", "slice", "mps-gate")  # the modes that need the daemon's --gate
MPS_MODES = ("mps", "mps-gate", "mps-low")  # the modes that need the daemon's --mps


class Features:
    """What the binaries in --bin can do, found without running anything on the GPU: the
    daemon's flags from `migctl daemon --help`, the shim's environment names from the strings in
    libmigswap.so. The names are H1's (launch gating) and H2's (slicing) of issue 10."""

    def __init__(self, a):
        self.a = a
        self.migctl = os.path.join(a.bin, "migctl")
        self.shim = os.path.join(a.bin, "libmigswap.so")
        self.help = ""
        self.err = []
        if not os.access(self.migctl, os.X_OK):
            self.err.append(f"no {self.migctl} (make build)")
        else:
            try:
                r = subprocess.run([self.migctl, "daemon", "--help"], capture_output=True, text=True, timeout=20)
                self.help = r.stdout + r.stderr
            except (OSError, subprocess.TimeoutExpired) as e:
                self.err.append(f"migctl daemon --help: {e}")
        self.shim_env = set()
        if not os.path.isfile(self.shim):
            self.err.append(f"no {self.shim} (make shim)")
        else:
            with open(self.shim, "rb") as f:
                self.shim_env = {m.decode() for m in re.findall(rb"MIGSWAP_[A-Z0-9_]+", f.read())}
        # `migctl daemon --gate off|gate|budget=N` (context/gate.go, H1); a differently named flag is
        # still found (or give --gate-flag)
        self.gate_flag = self._flag(a.gate_flag, r"--(gate)(?![a-z0-9-])") or \
            self._flag(a.gate_flag, r"--([a-z0-9-]*(?:gate|gating|launch-policy|compute-policy)[a-z0-9-]*)")

    def _flag(self, forced, pattern):
        if forced:
            return forced.lstrip("-") if ("--" + forced.lstrip("-")) in self.help else None
        m = re.search(pattern, self.help)
        return m.group(1) if m else None

    def shim_ok(self):
        return None if not self.err else "; ".join(self.err)

    def why_not(self, mode):
        """None when the case can run, else the reason to skip it."""
        if mode in ("plain", "streams"):
            return None
        if self.err:
            return "; ".join(self.err)
        if mode in GATED and not self.gate_flag:
            return ("migctl daemon has no launch-gating policy flag (issue 10 D2, helper H1: not in this build; "
                    "looked for --*gate*/--*launch-policy* in `migctl daemon --help`, or --gate-flag)")
        if mode in MPS_MODES and "--mps" not in self.help:
            return "migctl daemon has no --mps in this build"
        if mode == "slice" and self.a.slice_env not in self.shim_env:
            return f"libmigswap.so does not read {self.a.slice_env} (issue 10 D3, helper H2: not in this build)"
        if mode == "depth" and not self.depth_ok():
            return "the daemon's --gate takes no ,depth=M in this build (or --depth 0)"
        return None

    def depth_ok(self):
        return self.a.depth > 0 and "depth=" in self.help

    def gate_with_depth(self):
        """The gate value of cases e3 and f: gate,depth=M where the daemon has it, else gate."""
        return f"{self.a.gate_value},depth={self.a.depth}" if self.depth_ok() else self.a.gate_value

    def daemon_args(self, mode):
        mps = ["--mps"] + (["--mps-control", self.a.mps_control] if self.a.mps_control else [])
        if mode == "mps":
            return mps + ([f"--{self.gate_flag}", "off"] if self.gate_flag else [])
        if mode == "mps-gate":
            return mps + [f"--{self.gate_flag}", self.a.gate_value]
        if mode == "mps-low":
            return mps + ["--mps-low-sm", str(self.a.mps_low_sm)]
        if mode == "gate":
            return [f"--{self.gate_flag}", self.a.gate_value]
        if mode == "budget":
            return [f"--{self.gate_flag}", self.a.budget_value.replace("N", str(self.a.budget_n))]
        if mode in ("depth", "slice"):
            return [f"--{self.gate_flag}", self.gate_with_depth()]
        if mode == "shim" and self.gate_flag:  # say "off" rather than trust the default
            return [f"--{self.gate_flag}", "off"]
        return []


class Stopped(BaseException):
    pass


class Driver:
    def __init__(self, a):
        self.a = a
        self.out = os.path.abspath(a.out)
        os.makedirs(self.out, exist_ok=True)
        self.t_start = time.time()
        self.deadline = self.t_start + a.budget
        self.procs = []  # every Popen this driver started (killed at the end if still alive)
        self.pidfile = os.path.join(self.out, "pids")
        self.work = tempfile.mkdtemp(prefix="prio-")  # short: unix socket paths live here
        self.feat = Features(a)
        self.results = {}
        self.start_est = 25.0  # seconds from spawning a case's roles to all ready; updated as cases run
        self.logf = open(os.path.join(self.out, "driver.log"), "a")

    def log(self, s):
        line = f"[{time.time() - self.t_start:6.1f}s] {s}"
        print(line, flush=True)
        self.logf.write(line + "\n")
        self.logf.flush()

    def spawn(self, name, args, env, cdir):
        f = open(os.path.join(cdir, f"{name}.stderr"), "w")
        p = subprocess.Popen(args, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        p.name, p.logf = name, f
        self.procs.append(p)
        with open(self.pidfile, "a") as pf:
            pf.write(f"{p.pid} {name}\n")
        return p

    def stop(self, p, grace=5.0):
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)  # its own session: the role and nothing else
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        p.logf.close()

    def env(self, role, mode, sock):
        e = dict(os.environ)
        for k in [k for k in e if k.startswith("MIGSWAP_")]:
            del e[k]
        e.update({"PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": e.get("PRIO_CUDA_VISIBLE_DEVICES", "0")})
        if self.a.model == "fake":
            e["LD_LIBRARY_PATH"] = os.path.join(self.a.bin, "fakecuda") + ":" + e.get("LD_LIBRARY_PATH", "")
        if mode == "shim" or mode in GATED or mode in MPS_MODES:
            e.update({"LD_PRELOAD": os.path.abspath(self.feat.shim), "MIGSWAP_SOCKET": sock, "MIGSWAP_JOB": role,
                      "MIGSWAP_PRIORITY": str(self.a.infer_priority if role == "infer" else 0), "MIGSWAP_LOG": "1"})
            if mode == "slice" and role == "train":
                e[self.a.slice_env] = str(self.a.slice_blocks)
        return e

    def role_args(self, role, mode, cdir):
        a = self.a
        me = [a.python, os.path.abspath(__file__), role, "--device", a.device, "--model", a.model,
              "--duration", str(a.duration), "--ready", os.path.join(cdir, f"{role}.ready"),
              "--go", os.path.join(cdir, "go"), "--go-timeout", str(a.startup_timeout + 30),
              "--json", os.path.join(cdir, f"{role}.json")]
        if role == "infer":
            me += ["--interval-ms", str(a.interval_ms), "--dtype", a.dtype, "--warmup", str(a.infer_warmup),
                   "--samples", os.path.join(cdir, "infer.samples"), "--batch", str(a.infer_batch)]
            if a.infer_graph:
                me += ["--graph"]
            if mode == "streams":
                me += ["--stream-priority", "high"]
        else:
            me += ["--batch", str(a.batch), "--warmup", str(a.train_warmup), "--tail", str(a.tail)]
            if mode == "streams":
                me += ["--stream-priority", "low"]
        if a.device == "cpu":
            me += ["--cpu-threads", str(a.cpu_threads)]
        if a.cudnn_benchmark:
            me += ["--cudnn-benchmark"]
        return me

    def start_daemon(self, mode, cdir):
        sd = tempfile.mkdtemp(prefix="d", dir=self.work)
        sock, ctl = os.path.join(sd, "s.sock"), os.path.join(sd, "c.sock")
        args = [self.feat.migctl, "daemon", "--swap-socket", sock, "--socket", ctl] + self.feat.daemon_args(mode)
        if self.a.gpu_memory:
            args += ["--gpu-memory", self.a.gpu_memory]
        self.log(f"  daemon: {' '.join(args)}")
        p = self.spawn("daemon", args, dict(os.environ), cdir)
        t0 = time.time()
        while not (os.path.exists(sock) and os.path.exists(ctl)):
            if p.poll() is not None or time.time() - t0 > 15:
                self.stop(p)
                with open(os.path.join(cdir, "daemon.stderr")) as f:
                    raise RuntimeError(f"migctl daemon did not start (rc {p.poll()}): {f.read()[-800:]}")
            time.sleep(0.02)
        return p, sock, ctl

    def swap_status(self, ctl, path):
        try:
            r = subprocess.run([self.feat.migctl, "swap", "status", "--socket", ctl, "-o", "json"],
                               capture_output=True, text=True, timeout=10)
            txt = r.stdout if r.returncode == 0 else f'{{"error": {json.dumps(r.stderr.strip()[-500:])}}}'
        except (OSError, subprocess.TimeoutExpired) as e:
            txt = json.dumps({"error": str(e)})
        with open(path, "w") as f:
            f.write(txt)
        try:
            return json.loads(txt)
        except ValueError:
            return {"error": "not JSON", "text": txt[:300]}

    def run_case(self, cid):
        what, roles, mode = CASES[cid]
        a = self.a
        cdir = os.path.join(self.out, cid)
        res = {"case": cid, "what": what, "mode": mode}
        why = self.feat.why_not(mode)
        if why:
            res["skip"] = why
            return res
        need = self.start_est + a.duration + a.tail + 8
        if time.time() + need > self.deadline:
            res["skip"] = f"budget: {need:.0f} s needed, {self.deadline - time.time():.0f} s left of --budget {a.budget:.0f} s"
            return res
        os.makedirs(cdir, exist_ok=True)
        daemon, sock, ctl = None, "", ""
        procs = {}
        try:
            if mode not in ("plain", "streams"):
                daemon, sock, ctl = self.start_daemon(mode, cdir)
                res["daemon_args"] = self.feat.daemon_args(mode)
            # a case may take at most what is left of the budget to start
            startup_limit = min(a.startup_timeout, self.deadline - time.time() - a.duration - a.tail - 5)
            t_spawn = time.time()
            for r in roles:
                procs[r] = self.spawn(r, self.role_args(r, mode, cdir), self.env(r, mode, sock), cdir)
            ready = {r: os.path.join(cdir, f"{r}.ready") for r in roles}
            while not all(os.path.exists(f) for f in ready.values()):
                for r, p in procs.items():
                    if p.poll() is not None:
                        raise RuntimeError(f"{r} exited (rc {p.returncode}) before it was ready: {self.tail(cdir, r)}")
                if time.time() - t_spawn > startup_limit:
                    late = [r for r, f in ready.items() if not os.path.exists(f)]
                    raise RuntimeError(f"not ready after {startup_limit:.0f} s (what the budget left): {late}; "
                                       + "; ".join(f"{r}: {self.tail(cdir, r, 300)}" for r in late))
                if daemon is not None and daemon.poll() is not None:
                    raise RuntimeError(f"migctl daemon exited (rc {daemon.returncode}): {self.tail(cdir, 'daemon')}")
                time.sleep(0.05)
            t_ready = time.time()
            res["startup_s"] = t_ready - t_spawn
            self.start_est = max(self.start_est * 0.5, res["startup_s"] + 2, 5.0)
            T = time.time() + 0.5
            write_atomic(os.path.join(cdir, "go"), f"{T:.6f}\n")
            self.log(f"  all ready after {res['startup_s']:.1f} s; window {a.duration:g} s starts at +0.5 s")
            if ctl:  # what the daemon says about the two processes, mid-window and near its end
                time.sleep(max(0.0, T + a.duration / 2 - time.time()))
                res["status_mid"] = self.swap_status(ctl, os.path.join(cdir, "swap-status-mid.json"))
                time.sleep(max(0.0, T + a.duration - 0.5 - time.time()))
                res["status_end"] = self.swap_status(ctl, os.path.join(cdir, "swap-status-end.json"))
            end_by = T + a.duration + a.tail + a.max_overrun + 20
            for r, p in procs.items():
                try:
                    p.wait(timeout=max(1.0, end_by - time.time()))
                except subprocess.TimeoutExpired:
                    raise RuntimeError(f"{r} still running {end_by - T - a.duration:.0f} s after the window") from None
                if p.returncode != 0:
                    raise RuntimeError(f"{r} exited rc {p.returncode}: {self.tail(cdir, r)}")
            for r in roles:
                with open(os.path.join(cdir, f"{r}.json")) as f:
                    res[r] = json.load(f)
        except Exception as e:  # noqa: BLE001 - a failed case is a row saying why, the others still run
            res["error"] = str(e)[-1500:]
        finally:
            for p in procs.values():
                self.stop(p)
            if daemon is not None:
                self.stop(daemon, grace=10)
        return res

    @staticmethod
    def tail(cdir, name, n=600):
        """The last lines of a process's output, up to n characters, on one line (" / " between)."""
        try:
            with open(os.path.join(cdir, f"{name}.stderr")) as f:
                lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
        except OSError:
            return ""
        out = []
        for ln in reversed(lines):
            if sum(len(x) + 3 for x in out) + len(ln) > n:
                break
            out.insert(0, ln)
        return " / ".join(out) if out else (lines[-1][-n:] if lines else "")

    # ----------------------------------------------------------------------- report

    def row(self, cid):
        r = self.results.get(cid, {"case": cid, "what": CASES[cid][0], "skip": "not run (--cases)"})
        base_i = (self.results.get("a") or {}).get("infer") or {}
        base_t = (self.results.get("b") or {}).get("train") or {}

        def f(x, fmt="{:.2f}"):
            return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)
        inf, tr = r.get("infer") or {}, r.get("train") or {}
        lat = inf.get("latency_ms") or {}
        b99 = (base_i.get("latency_ms") or {}).get("p99")
        ratio = lat.get("p99") / b99 if lat.get("p99") is not None and b99 else None
        sps, bsps = tr.get("steps_per_s"), base_t.get("steps_per_s")
        share = 100.0 * sps / bsps if sps is not None and bsps else None
        note = r.get("skip") and f"SKIP: {r['skip']}" or r.get("error") and f"FAIL: {short(r['error'])}" or ""
        if not note:
            bits = []
            if inf:
                bits.append(f"{inf.get('count')}/{inf.get('expected')} requests, slip p99 "
                            f"{f((inf.get('slip_ms') or {}).get('p99'))} ms, from due p99 "
                            f"{f((inf.get('latency_from_due_ms') or {}).get('p99'))} ms")
                if inf.get("truncated"):
                    bits.append("TRUNCATED (requests fell too far behind)")
            if tr:
                bits.append(f"step p50 {f((tr.get('step_ms') or {}).get('p50'))} ms")
            for p in (r.get("status_end") or {}).get("processes") or []:
                g = p.get("gate") or {}
                if g.get("class"):
                    bits.append(f"daemon: {p.get('job')} class {g['class']} policy {g.get('policy')} held "
                                f"{g.get('heldSeconds', 0):.2f} s/{g.get('holds', 0)} busy {g.get('busySeconds', 0):.2f} s")
            for k in ("infer", "train"):
                sh = (r.get(k) or {}).get("shim")
                if sh:
                    b = f"{k} shim mode {sh.get('mode')}"
                    if "prio_policy" in sh:
                        b += (f" policy {sh['prio_policy']} slot {sh['prio_slot']} holds {sh['prio_holds']} "
                              f"held {sh['prio_held_ns'] / 1e9:.2f} s busy {sh['prio_busy_ns'] / 1e9:.2f} s")
                    sl = sh.get("slice") or {}
                    if sl.get("modules_rewritten") or sl.get("modules_skipped") or sl.get("sliced_launches"):
                        b += (f" sliced {sl['sliced_launches']} launches into {sl['slices']} slices "
                              f"({sl['functions_mapped']} functions with a twin, {sl['modules_rewritten']} modules "
                              f"rewritten, {sl['modules_skipped']} skipped)")
                    if sh.get("extra_u64"):
                        b += f" extra {sh['extra_u64']}"
                    bits.append(b)
            note = "; ".join(bits)
        what = CASES[cid][0].replace("budget=N", f"budget={self.a.budget_n}").replace(
            "gate,depth=M", self.feat.gate_with_depth()).replace(
            "(MIGSWAP_SLICE_BLOCKS)", f"({self.a.slice_env}={self.a.slice_blocks})")
        return {"case": cid, "what": what,
                "p50": lat.get("p50"), "p99": lat.get("p99"), "p999": lat.get("p99.9"), "max": lat.get("max"),
                "ratio": ratio, "sps": sps, "share": share, "note": note,
                "cells": [cid, what, f(lat.get("p50")), f(lat.get("p99")), f(lat.get("p99.9")),
                          f(lat.get("max")), f(ratio, "{:.2f}x"), f(sps, "{:.1f}"), f(share, "{:.0f}%"), note]}

    def table(self):
        a = self.a
        dev = "fake libcuda.so" if a.model == "fake" else a.device
        L = [f"Priority benchmark, {dev}, ResNet-50 batch {a.infer_batch} {a.dtype}"
             f"{' replayed as a CUDA graph' if a.infer_graph else ''} every {a.interval_ms:g} ms (high) vs "
             f"ResNet-18 batch {a.batch} 224x224 SGD fp32 (best effort), {a.duration:g} s window per case"
             + (f" [model {a.model}: plumbing test, not a measurement]" if a.model != "resnet" else ""), "",
             "| case | what | p50 ms | p99 ms | p99.9 ms | max ms | p99 / alone | train steps/s | % of alone | notes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
        for cid in TABLE_ORDER:
            L.append("| " + " | ".join(" ".join(str(c).replace("|", "/").split()) for c in self.row(cid)["cells"]) + " |")
        L.append("")
        L.append("Latency: request issue to logits on the host (H2D copy, forward, D2H copy). p99 / alone: "
                 "the case's p99 over case a's. % of alone: training steps/s over case b's. "
                 "Targets (issue 10): p99 <= 1.5x alone (must), <= 1.072x (goal); training >= 60% (must), >= 80% (goal).")
        return "\n".join(L)

    def summary(self):
        """One line per case: PASS (it ran and measured), FAIL (why), SKIP (why); then the issue's
        targets for the controlled cases that ran (met / NOT met: a measurement, not a failure)."""
        L = []
        for cid in TABLE_ORDER:
            r = self.results.get(cid)
            if r is None:
                continue
            row = self.row(cid)
            if r.get("skip"):
                L.append(f"SKIP {cid} ({row['what']}): {r['skip']}")
            elif r.get("error"):
                L.append(f"FAIL {cid} ({row['what']}): {short(r['error'], 500)}")
            else:
                L.append(f"PASS {cid} ({row['what']}): p99 {row['cells'][3]} ms ({row['cells'][6]} alone), "
                         f"train {row['cells'][7]} steps/s ({row['cells'][8]} of alone)")
        for cid in ("c", "e1", "e2", "e3", "f"):
            r = self.results.get(cid) or {}
            if r.get("skip") or r.get("error") or cid not in self.results:
                continue
            row = self.row(cid)
            if row["ratio"] is not None:
                verdict = "goal met" if row["ratio"] <= 1.072 else "met" if row["ratio"] <= 1.5 else "NOT met"
                L.append(f"TARGET {cid} p99 <= 1.5x alone (goal 1.072x): {row['ratio']:.2f}x: {verdict}")
            if row["share"] is not None:
                verdict = "goal met" if row["share"] >= 80 else "met" if row["share"] >= 60 else "NOT met"
                L.append(f"TARGET {cid} training >= 60% of alone (goal 80%): {row['share']:.0f}%: {verdict}")
        return "\n".join(L)

    def run(self):
        a = self.a

        def term(signum, _frame):
            raise Stopped(f"signal {signum}")
        signal.signal(signal.SIGTERM, term)
        self.log(f"priority bench: out {self.out}; bin {a.bin}; device {a.device}; model {a.model}; "
                 f"duration {a.duration:g} s; budget {a.budget:g} s")
        self.log(f"  features: daemon gate flag {self.feat.gate_flag!r}; shim reads "
                 f"{sorted(self.feat.shim_env)}; {self.feat.shim_ok() or 'binaries present'}")
        stopped = None
        try:
            for cid in [c for c in RUN_ORDER if c in a.cases]:
                self.log(f"case {cid}: {CASES[cid][0]}")
                r = self.run_case(cid)
                self.results[cid] = r
                row = self.row(cid)
                if r.get("skip"):
                    self.log(f"  SKIP {cid}: {r['skip']}")
                elif r.get("error"):
                    self.log(f"  FAIL {cid}: {short(r['error'], 800)}")
                else:
                    self.log("  ROW " + " | ".join(str(c) for c in row["cells"]))
        except Stopped as e:
            stopped = str(e)
            self.log(f"STOPPED: {e}")
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            for p in self.procs:
                if p.poll() is None:
                    self.stop(p, grace=2)
            shutil.rmtree(self.work, ignore_errors=True)
            t = self.table()
            if stopped:
                t += f"\n\nRUN STOPPED EARLY: {stopped}"
            print("\n" + t, flush=True)
            sm = self.summary()
            print("\n" + sm, flush=True)
            write_atomic(os.path.join(self.out, "table.md"), t + "\n")
            write_atomic(os.path.join(self.out, "summary.txt"), sm + "\n")
            with open(os.path.join(self.out, "results.json"), "w") as f:
                json.dump(finite({"args": vars(a), "features": {"gate_flag": self.feat.gate_flag,
                                                         "shim_env": sorted(self.feat.shim_env)},
                           "rows": [{k: v for k, v in self.row(c).items() if k != "cells"} for c in TABLE_ORDER],
                           "cases": self.results, "wall_s": time.time() - self.t_start}), f, indent=1, default=str)
        failed = [c for c, r in self.results.items() if r.get("error")]
        return 1 if failed or stopped else 0


# --------------------------------------------------------------------------- self-test


def run_selftest(a):
    """No GPU: the drive with a two-layer torch model on the CPU (cases a-d: the torch code, the
    barrier, the JSON and the table), then with timed kernels on the fake libcuda.so under the
    real shim and daemon (every case: e1/e2/f run where bin/ has the feature, and then the
    trainer's launches must have been held). Exits non-zero unless every check holds."""
    fails = []
    common = ["--bin", a.bin, "--python", a.python, "--duration", str(a.duration), "--infer-warmup", "5",
              "--train-warmup", "2", "--tail", "0.3", "--gpu-memory", "80GiB", "--budget", "400",
              "--mps-control", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "context", "testdata",
                                            "fake-mps-control")]
    runs = []
    if not a.no_torch:
        runs.append(("torch-cpu", ["--device", "cpu", "--model", "tiny", "--cases", "a,b,c,d"]))
    runs.append(("fake-driver", ["--model", "fake", "--cases", ",".join(TABLE_ORDER)]))
    for name, extra in runs:
        out = os.path.join(a.out, name)
        da = build_parser().parse_args(["drive", "--out", out] + common + extra)
        da.cases = [c for c in da.cases.split(",")]
        da.bin = os.path.abspath(da.bin)
        print(f"selftest {name}: drive {' '.join(extra)}", flush=True)
        d = Driver(da)
        d.run()
        for cid in da.cases:
            r = d.results.get(cid, {})
            row = d.row(cid)
            if r.get("skip") and CASES[cid][2] in GATED and "budget:" not in r["skip"]:
                print(f"  [skip] {name} {cid}: {r['skip'][:120]}")
                continue
            ok = not r.get("skip") and not r.get("error")
            roles = CASES[cid][1]
            ok = ok and ("infer" not in roles or (row["p99"] is not None and
                                                 r["infer"]["count"] == r["infer"]["expected"]))
            ok = ok and ("train" not in roles or (row["sps"] or 0) > 0)
            why = r.get("skip") or r.get("error") or ""
            if ok and (CASES[cid][2] == "shim" or CASES[cid][2] in GATED):
                si, st = r["infer"].get("shim") or {}, r["train"].get("shim") or {}
                ok = si.get("mode") == 2 and st.get("mode") == 2
                why = f"shim modes {si.get('mode')}/{st.get('mode')} (want 2: registered with the daemon)"
                if ok and CASES[cid][2] in ("gate", "budget", "depth"):
                    ok = (st.get("prio_holds") or 0) > 0 and (si.get("prio_signal") == 1)
                    why = f"train prio_holds {st.get('prio_holds')}, infer prio_signal {si.get('prio_signal')}"
                if ok and CASES[cid][2] == "slice":
                    # the fake's kernels are not PTX, so nothing is sliced here: check that slicing
                    # was on in the trainer only (it looked at the modules loaded) and it was held
                    tsl, isl = st.get("slice") or {}, si.get("slice") or {}
                    looked = lambda d: (d.get("modules_rewritten") or 0) + (d.get("modules_skipped") or 0)  # noqa: E731
                    ok = looked(tsl) > 0 and looked(isl) == 0 and (st.get("prio_holds") or 0) > 0
                    why = f"train slice stats {tsl}, infer {isl}, train prio_holds {st.get('prio_holds')}"
            print(f"  [{'ok' if ok else 'FAIL'}] {name} {cid}: {CASES[cid][0]}" + ("" if ok else f": {why[:300]}"))
            if not ok:
                fails.append(f"{name} {cid}")
    print("selftest:", "PASS" if not fails else f"FAIL {fails}", flush=True)
    return 1 if fails else 0


# --------------------------------------------------------------------------- command line


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="role", required=True)

    def common(p):
        p.add_argument("--device", default="cuda", help="cuda (GPU 0 as the process sees it) or cpu")
        p.add_argument("--model", choices=["resnet", "tiny", "fake"], default="resnet",
                       help="resnet: ResNet-50 (infer) / ResNet-18 (train); tiny: a two-layer net for the CPU "
                            "plumbing test; fake: timed kernels on the fake libcuda.so (the shim's plumbing, no torch)")
        p.add_argument("--fake-kernel-us", type=float, default=3000,
                       help="--model fake: a request's kernel (a training step: ten of a third of it)")
        p.add_argument("--duration", type=float, default=20, help="seconds of the measured window")
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--cpu-threads", type=int, default=2)
        p.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark (default off)")

    for role in ("infer", "train"):
        p = sub.add_parser(role)
        common(p)
        p.add_argument("--ready", default="", help="file written once warm")
        p.add_argument("--go", default="", help="file the window's start (Unix time) appears in; none: start at once")
        p.add_argument("--go-timeout", type=float, default=180)
        p.add_argument("--json", default="", help="also write the result line here")
        p.add_argument("--stream-priority", choices=["none", "high", "low"], default="none")
        if role == "infer":
            p.add_argument("--interval-ms", type=float, default=10)
            p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
            p.add_argument("--warmup", type=int, default=100, help="requests back to back before ready")
            p.add_argument("--batch", type=int, default=1, help="images per request")
            p.add_argument("--graph", action="store_true",
                           help="replay the model as one CUDA graph (GPU-bound requests instead of launch-bound)")
            p.add_argument("--max-overrun", type=float, default=10,
                           help="stop if the requests finish this many seconds behind the window's end")
            p.add_argument("--samples", default="", help="write 'due_ms slip_ms latency_ms' per request here")
        else:
            p.add_argument("--batch", type=int, default=32)
            p.add_argument("--warmup", type=int, default=20, help="steps before ready")
            p.add_argument("--tail", type=float, default=1.0, help="seconds of training past the window")
    d = sub.add_parser("drive")
    common(d)
    d.add_argument("--out", required=True)
    d.add_argument("--bin", default="bin", help="migctl and libmigswap.so (make build shim)")
    d.add_argument("--python", default=sys.executable)
    d.add_argument("--cases", default=",".join(TABLE_ORDER), help="comma-separated subset of " + ",".join(TABLE_ORDER))
    d.add_argument("--budget", type=float, default=265, help="seconds; cases that would not fit are skipped")
    d.add_argument("--startup-timeout", type=float, default=120, help="seconds for a case's roles to be ready")
    d.add_argument("--interval-ms", type=float, default=10)
    d.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    d.add_argument("--batch", type=int, default=32)
    d.add_argument("--infer-warmup", type=int, default=100)
    d.add_argument("--infer-batch", type=int, default=1, help="images per inference request")
    d.add_argument("--infer-graph", action="store_true",
                   help="the inference job replays ResNet-50 as one CUDA graph (GPU-bound requests)")
    d.add_argument("--train-warmup", type=int, default=20)
    d.add_argument("--tail", type=float, default=1.0)
    d.add_argument("--max-overrun", type=float, default=10)
    d.add_argument("--infer-priority", type=int, default=10, help="MIGSWAP_PRIORITY of the inference job (train: 0)")
    d.add_argument("--gate-flag", default="", help="the daemon's launch-gating policy flag (default: found in its --help)")
    d.add_argument("--gate-value", default="gate", help="its value for case e1 (and f)")
    d.add_argument("--budget-value", default="budget=N", help="its value for case e2 (N: --budget-n)")
    d.add_argument("--budget-n", type=int, default=2, help="in-flight launches a gated process keeps (case e2)")
    d.add_argument("--depth", type=int, default=8,
                   help="M of case e3 and f: gate,depth=M (a gated process keeps at most M launches in flight; 0: no e3)")
    d.add_argument("--slice-env", default="MIGSWAP_SLICE_BLOCKS", help="the shim's slicing variable (case f)")
    d.add_argument("--slice-blocks", type=int, default=64, help="its value, set for the training process only")
    d.add_argument("--mps-low-sm", type=int, default=50, help="case g2: the daemon's --mps-low-sm (percent of the SMs)")
    d.add_argument("--mps-control", default="",
                   help="the daemon's --mps-control for cases g, g1 (default: nvidia-cuda-mps-control in PATH; the "
                        "selftest gives the fake of context/testdata)")
    d.add_argument("--gpu-memory", default="", help="the daemon's --gpu-memory (default NVML; the CPU test sets it)")
    t = sub.add_parser("selftest")
    t.add_argument("--out", required=True)
    t.add_argument("--bin", default="bin", help="migctl, libmigswap.so and fakecuda/ (make build shim)")
    t.add_argument("--python", default=sys.executable)
    t.add_argument("--duration", type=float, default=2)
    t.add_argument("--no-torch", action="store_true", help="only the fake-driver run")
    return ap


def main():
    a = build_parser().parse_args()
    if a.role == "drive":
        a.cases = [c.strip() for c in a.cases.split(",") if c.strip()]
        bad = [c for c in a.cases if c not in CASES]
        if bad:
            sys.exit(f"unknown cases {bad}; known: {TABLE_ORDER}")
        a.bin = os.path.abspath(a.bin)
        sys.exit(Driver(a).run())
    if a.role == "selftest":
        a.bin = os.path.abspath(a.bin)
        sys.exit(run_selftest(a))
    try:
        {"infer": role_infer, "train": role_train}[a.role](a)
    except TimeoutError as e:
        emit(a, {"role": a.role, "error": str(e)})
        sys.exit(3)


if __name__ == "__main__":
    main()
