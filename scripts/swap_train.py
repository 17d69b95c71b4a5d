#!/usr/bin/env python3
"""swap_train.py — the H200 measurement of libmigswap.so (shim/), run by scripts/swap-h200.sh.

Subcommands:
  train      the training program: torchvision ResNet-18 on random data with a fixed seed
             (eager, or one CUDA graph per step with --graphs). It knows nothing about the shim;
             it writes one JSON line per step (the loss repr'd, the step's ms) to --log.
  hold       a victim: holds --gib GiB in one tensor with a known pattern; on stdin "check" it
             prints the pattern's sums, on "stop" it exits.
  hog        the preempting job: asks for free + --extra bytes of device memory, holds it, exits.
  drive      the measurement. Starts `migctl daemon` (--bin/migctl; sockets in a private temp
             folder) and drives every swap with `migctl swap out|in --job` (--ctl python: this
             script's own PROTOCOL.md server instead, the old fallback). Phases: per-launch cost,
             overhead (alternated bare/shim pairs, median step times; the first bare run is the
             reference losses), need-driven preemption (a priority-10 `hog` under the shim makes
             the daemon swap a priority-0 trainer out and back in), ResNet-18 eager and CUDA-graph
             runs swapped --max-cycles times while training, first swap of a fresh process with
             and without MIGSWAP_PREPIN, 16 GiB swap throughput and request->free latency (from
             issuing `migctl swap out` to NVML showing the memory gone; the CLI's own return time
             too), the driver's checkpoint API on the same size. Prints a markdown table (peer,
             ours, target, pass/fail); writes summary.md, summary.json, logs.tgz under --out.
  faketrain, fakehold   the trainer and the victim for the fake libcuda.so (ctypes; no torch).
  selftest   the whole drive flow against the fake libcuda.so (no GPU, no torch, no NVML), with
             the daemon and with the fallback driver; exits non-zero unless every check holds.
"""
import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

GiB = 1 << 30


# --------------------------------------------------------------------------- training program

def cmd_train(a):
    import torch
    import torchvision

    class MeanPool(torch.nn.Module):
        # AdaptiveAvgPool2d's CUDA backward uses atomics (non-deterministic); a mean is exact.
        def forward(self, x):
            return x.mean(dim=(2, 3), keepdim=True)

    torch.manual_seed(a.seed)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    dev = torch.device("cuda")
    model = torchvision.models.resnet18(num_classes=100)
    model.avgpool = MeanPool()
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    lossf = torch.nn.CrossEntropyLoss()
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    B, R = a.batch, a.res

    def batch():
        x = torch.randn(B, 3, R, R, device=dev, generator=gen)
        y = torch.randint(0, 100, (B,), device=dev, generator=gen)
        return x, y

    log = open(a.log, "w")
    step_fn = None
    if a.graphs:
        sx, sy = batch()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                lossf(model(sx), sy).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            sloss = lossf(model(sx), sy)
            sloss.backward()
            opt.step()

        def step_fn(x, y):
            sx.copy_(x)
            sy.copy_(y)
            g.replay()
            return sloss.item()
    else:
        def step_fn(x, y):
            opt.zero_grad(set_to_none=True)
            loss = lossf(model(x), y)
            loss.backward()
            opt.step()
            return loss.item()

    run_steps(a, log, lambda: step_fn(*batch()), torch.cuda.synchronize,
              lambda: torch.cuda.memory_reserved())


def run_steps(a, log, step, sync, reserved):
    """The step loop shared by the real and the fake trainer: one JSON line per step (the loss
    repr'd, and the step's wall time: every step ends in a device-to-host copy of the loss, so
    it is synchronous), then a summary line with the mean and the median step time."""
    t0 = time.perf_counter()
    times = []
    for i in range(a.steps):
        if i == a.warm:
            sync()
            t0 = time.perf_counter()
        ts = time.perf_counter()
        loss = step()
        dt = time.perf_counter() - ts
        if i >= a.warm:
            times.append(dt)
        log.write(json.dumps({"step": i, "loss": repr(loss), "ms": round(1000 * dt, 4)}) + "\n")
        log.flush()
    sync()
    secs = time.perf_counter() - t0
    log.write(json.dumps({"done": True, "timed_steps": a.steps - a.warm, "seconds": secs,
                          "ms_per_step": 1000 * secs / max(1, a.steps - a.warm),
                          "ms_median": 1000 * statistics.median(times) if times else float("nan"),
                          "reserved": reserved()}) + "\n")
    log.close()


# --------------------------------------------------------------------------- victim

def cmd_hold(a):
    import torch
    n = int(a.gib * GiB) // 8
    v = torch.arange(n, device="cuda", dtype=torch.int64)
    v.mul_(2654435761).add_(12345)

    def sums():
        # in 32 MiB pieces, so that the check allocates next to nothing beside v
        s1 = torch.zeros((), dtype=torch.int64, device="cuda")
        s2 = torch.zeros((), dtype=torch.int64, device="cuda")
        for c in v.split(1 << 22):
            s1 += c.sum()
            s2 += (c * c).sum()
        torch.cuda.synchronize()
        return int(s1.item()), int(s2.item()), int(v[n // 3].item())

    first = sums()
    print("READY", os.getpid(), torch.cuda.memory_reserved(), *first, flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "check":
            print("CHECK", *sums(), flush=True)
        elif cmd == "stop":
            break


def cmd_hog(a):
    """The high-priority job of the preemption check: asks for more device memory than is
    free (free after its own context + --extra bytes), so the allocation fails once and the
    shim asks the daemon for memory; holds it --hold seconds, checks it, exits."""
    import torch
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the context exists before free memory is read
    print("INIT", flush=True)
    extra = a.extra
    if a.wait:  # "go EXTRA" on stdin: the driver says when, and how much beyond free
        line = sys.stdin.readline().split()
        if not line or line[0] != "go":
            return
        extra = int(line[1])
    free, total = torch.cuda.mem_get_info()
    n = (free + int(extra)) // (2 << 20) * (2 << 20)
    print("FREE", free, total, n, flush=True)
    t0 = time.perf_counter()
    try:
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
    except Exception as e:  # noqa: BLE001
        print("RESULT ok=0 alloc failed:", str(e).splitlines()[0], flush=True)
        return
    t1 = time.perf_counter()
    x.fill_(7)
    # Check samples at the start, middle and end in 1 MiB pieces: summing a large uint8 slice
    # would need an int64 temporary 8x its size, which a job holding all free memory can't get.
    m = 1 << 20
    ok = all(int(x[o:o + m].sum()) == 7 * x[o:o + m].numel() for o in (0, n // 2, max(0, n - m)))
    print(f"GOT {n} alloc_s={t1 - t0:.3f}", flush=True)
    time.sleep(a.hold)
    print(f"RESULT ok={int(ok)} bytes={n} alloc_s={t1 - t0:.3f}", flush=True)


# --------------------------------------------------------------------------- fake-driver programs

class FakeCu:
    """The few driver calls the fake-driver trainer and victim make, through ctypes (so the
    shim sees them via dlsym, as it sees a dlopen'ed libcuda). Only for the fake libcuda.so
    (its kernels are looked up by name in any module)."""

    def __init__(self):
        c = ctypes
        self.l = c.CDLL("libcuda.so.1")
        self.ck(self.l.cuInit(0), "cuInit")
        dev = c.c_int()
        self.ck(self.l.cuDeviceGet(c.byref(dev), 0), "cuDeviceGet")
        ctx = c.c_void_p()
        self.ck(self.l.cuDevicePrimaryCtxRetain(c.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self.ck(self.l.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        mod = c.c_void_p()
        self.ck(self.l.cuModuleLoadData(c.byref(mod), c.c_char_p(b"fake-module")), "cuModuleLoadData")
        self.k_add = c.c_void_p()
        self.ck(self.l.cuModuleGetFunction(c.byref(self.k_add), mod, c.c_char_p(b"add_one")), "cuModuleGetFunction")

    @staticmethod
    def ck(r, what):
        if r != 0:
            raise RuntimeError(f"{what}: CUresult {r}")

    def alloc(self, n):
        p = ctypes.c_uint64()
        self.ck(self.l.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), "cuMemAlloc_v2")
        return p.value

    def htod(self, dst, data):
        buf = (ctypes.c_char * len(data)).from_buffer_copy(data)
        self.ck(self.l.cuMemcpyHtoD_v2(ctypes.c_uint64(dst), buf, ctypes.c_size_t(len(data))), "cuMemcpyHtoD_v2")

    def dtoh(self, src, n):
        buf = (ctypes.c_char * n)()
        self.ck(self.l.cuMemcpyDtoH_v2(buf, ctypes.c_uint64(src), ctypes.c_size_t(n)), "cuMemcpyDtoH_v2")
        return bytes(buf)

    def add_one(self, p, nfloat):
        pp, nn = ctypes.c_uint64(p), ctypes.c_uint64(nfloat)
        params = (ctypes.c_void_p * 2)(ctypes.addressof(pp), ctypes.addressof(nn))
        self.ck(self.l.cuLaunchKernel(self.k_add, 1, 1, 1, 1, 1, 1, 0, None, params, None), "cuLaunchKernel")

    def sync(self):
        self.ck(self.l.cuCtxSynchronize(), "cuCtxSynchronize")


def cmd_faketrain(a):
    """A training loop for the fake driver: the weights live in device memory and every step
    reads them back, updates them from a seeded batch and writes them again; a larger
    activation buffer is incremented on the device each step and probed. The loss depends on
    everything the device held, so a swap that lost or moved a byte changes the losses."""
    import array
    import random
    cu = FakeCu()
    nw, nact = 4096, (a.mib << 20) // 4
    w = cu.alloc(nw * 4)
    act = cu.alloc(nact * 4)
    cu.htod(w, array.array("f", [0.01 * (i % 97) for i in range(nw)]).tobytes())
    cu.htod(act, bytes(nact * 4))
    state = {"i": 0}

    def step():
        i = state["i"]
        state["i"] += 1
        rnd = random.Random(a.seed * 100003 + i)
        x = array.array("f", [rnd.uniform(-1, 1) for _ in range(nw)])
        cu.add_one(act, nact)
        wv = array.array("f")
        wv.frombytes(cu.dtoh(w, nw * 4))
        probe = array.array("f")
        probe.frombytes(cu.dtoh(act + 4 * ((i * 7919) % nact), 4))
        loss = sum(p * q for p, q in zip(wv, x)) / nw + probe[0]
        wv = array.array("f", [0.9 * p + 0.1 * q for p, q in zip(wv, x)])
        cu.htod(w, wv.tobytes())
        time.sleep(a.pace_ms / 1000)
        return loss

    log = open(a.log, "w")
    run_steps(a, log, step, cu.sync, lambda: (nw + nact) * 4)


def cmd_fakehold(a):
    """The victim for the fake driver: --mib MiB with a pattern; "check" prints its sha256."""
    import hashlib
    cu = FakeCu()
    n = a.mib << 20
    p = cu.alloc(n)
    pat = bytes((i * 131 + 7) & 0xFF for i in range(1 << 16)) * (n >> 16)
    cu.htod(p, pat)

    def sums():
        return [hashlib.sha256(cu.dtoh(p, n)).hexdigest()]

    print("READY", os.getpid(), n, *sums(), flush=True)
    for line in sys.stdin:
        if line.strip() == "check":
            print("CHECK", *sums(), flush=True)
        elif line.strip() == "stop":
            break


# --------------------------------------------------------------------------- protocol server

class Conn:
    def __init__(self, server, sock, hello):
        self.server, self.sock, self.hello = server, sock, hello
        self.pid = int(hello.get("pid", 0))
        self.cv = threading.Condition()
        self.results = {}
        self.progress = 0
        self.usage = int(hello.get("bytes", 0))
        self.closed = False
        self.next_id = 0
        self.wlock = threading.Lock()

    def send(self, obj):
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        with self.wlock:
            self.sock.sendall(data)

    def swap(self, typ, timeout=300):
        """Send swap_out/swap_in; return (result, wall seconds from request to result)."""
        with self.cv:
            self.next_id += 1
            i = self.next_id
        t0 = time.perf_counter()
        self.send({"type": typ, "id": i})
        with self.cv:
            ok = self.cv.wait_for(lambda: i in self.results or self.closed, timeout)
            wall = time.perf_counter() - t0
            if i not in self.results:
                raise RuntimeError(f"{typ} id {i}: no result ({'closed' if self.closed else 'timeout'})")
            return self.results.pop(i), wall

    def reader(self, buf=b""):
        while True:
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    m = json.loads(line)
                except ValueError:
                    self.server.log(f"invalid JSON from pid {self.pid}: {line!r}")
                    continue
                t = m.get("type")
                with self.cv:
                    if t == "result":
                        self.results[m.get("id")] = m
                    elif t == "progress":
                        self.progress += 1
                    elif t == "usage":
                        self.usage = int(m.get("bytes", 0))
                    self.cv.notify_all()
                if t == "need":
                    self.send({"type": "denied", "id": m.get("id"), "reason": "the measurement driver has no policy"})
                elif t == "error":
                    self.server.log(f"shim pid {self.pid} error: {m.get('reason')}")
            try:
                d = self.sock.recv(65536)
            except OSError:
                d = b""
            if not d:
                break
            buf += d
        with self.cv:
            self.closed = True
            self.cv.notify_all()


class Server:
    def __init__(self, path, logf=None):
        self.path = path
        if os.path.exists(path):
            os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.listen(16)
        self.cv = threading.Condition()
        self.conns = {}
        self.logf = logf
        threading.Thread(target=self.accept, daemon=True).start()

    def log(self, s):
        if self.logf:
            self.logf(s)

    def accept(self):
        while True:
            try:
                s, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(s,), daemon=True).start()

    def serve(self, s):
        f = b""
        while b"\n" not in f:
            d = s.recv(4096)
            if not d:
                s.close()
                return
            f += d
        line, rest = f.split(b"\n", 1)
        hello = json.loads(line)
        if hello.get("type") != "hello":
            s.close()
            return
        c = Conn(self, s, hello)
        c.send({"type": "welcome", "version": 1})
        with self.cv:
            self.conns[c.pid] = c
            self.cv.notify_all()
        c.reader(rest)

    def wait_pid(self, pid, timeout=120):
        with self.cv:
            if not self.cv.wait_for(lambda: pid in self.conns, timeout):
                raise RuntimeError(f"pid {pid} never connected to the driver")
            return self.conns[pid]


# --------------------------------------------------------------------------- swap controllers

class PyCtl:
    """Fallback (--ctl python): this script's own protocol server (no policy: needs denied)."""
    kind = "swap_train.py protocol driver"

    def __init__(self, d, log):
        self.server = Server(os.path.join(d, "migswap.sock"), log)
        self.path = self.server.path

    def wait(self, job, pid, timeout):
        return self.server.wait_pid(pid, timeout)

    def swap(self, h, direction, timeout=300, watch=None):
        box = {}

        def go():
            try:
                box["r"], box["wall"] = h.swap("swap_" + direction, timeout)
            except Exception as e:  # noqa: BLE001
                box["r"], box["wall"] = {"ok": False, "error": str(e)}, float("nan")
        t0 = time.perf_counter()
        th = threading.Thread(target=go)
        th.start()
        t_free = watch(lambda: not th.is_alive()) if watch else None
        th.join()
        r = dict(box["r"])
        r["wall"] = time.perf_counter() - t0
        r["free_s"] = t_free - t0 if t_free else None
        return r

    def states(self):
        return {}

    def close(self):
        pass


class DaemonCtl:
    """The real thing (default): `migctl daemon` with its sockets under a temporary folder,
    swaps through `migctl swap out|in --job`, state through `migctl swap status -o json`."""
    kind = "migctl daemon + migctl swap CLI"

    def __init__(self, migctl, d, logpath, gpu_memory=""):
        self.migctl = migctl
        self.path = os.path.join(d, "migswap.sock")
        self.ctl = os.path.join(d, "control.sock")
        args = [migctl, "daemon", "--swap-socket", self.path, "--socket", self.ctl, "--rebalance-every", "1s"]
        if gpu_memory:
            args += ["--gpu-memory", gpu_memory]
        self.logpath = logpath
        self.logf = open(logpath, "a")
        self.p = subprocess.Popen(args, stdout=self.logf, stderr=self.logf)
        t0 = time.time()
        while not (os.path.exists(self.path) and os.path.exists(self.ctl)):
            if self.p.poll() is not None or time.time() - t0 > 15:
                raise RuntimeError(f"migctl daemon did not start (rc {self.p.poll()}): {self.log_tail()}")
            time.sleep(0.02)

    def log_tail(self, n=2000):
        try:
            with open(self.logpath) as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def cli(self, *args, timeout=60):
        return subprocess.run([self.migctl, "swap", *args, "--socket", self.ctl], capture_output=True,
                              text=True, timeout=timeout)

    def status(self):
        r = self.cli("status", "-o", "json")
        if r.returncode != 0:
            raise RuntimeError(f"migctl swap status: {r.stderr.strip()}")
        return json.loads(r.stdout)

    def states(self):
        try:
            return {p["job"]: p["state"] for p in self.status().get("processes") or []}
        except Exception:  # noqa: BLE001
            return {}

    def wait(self, job, pid, timeout):
        t0 = time.time()
        while time.time() - t0 < timeout:
            for p in self.status().get("processes") or []:
                if p.get("pid") == pid or p.get("peerPID") == pid:
                    return p["job"]
            time.sleep(0.05)
        raise RuntimeError(f"pid {pid} (job {job}) never registered with the daemon")

    def swap(self, job, direction, timeout=300, watch=None):
        """One `migctl swap out|in --job JOB`; wall is from issuing the command to its exit
        (the daemon's result), free_s from issuing it to NVML showing the memory gone."""
        t0 = time.perf_counter()
        p = subprocess.Popen([self.migctl, "swap", direction, "--job", job, "--quiet", "-o", "json",
                              "--timeout", f"{int(timeout)}s", "--socket", self.ctl],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t_free = watch(lambda: p.poll() is not None) if watch else None
        out, err = p.communicate(timeout=timeout + 10)
        wall = time.perf_counter() - t0
        try:
            rs = json.loads(out).get("results") or []
        except ValueError:
            rs = []
        if rs:
            r = dict(rs[0])
            if len(rs) > 1:
                r["error"] = (r.get("error") or "") + f" ({len(rs)} processes in the job)"
        else:
            r = {"ok": False, "error": (err or out).strip()[-500:] or f"rc {p.returncode}"}
        r["wall"], r["free_s"] = wall, (t_free - t0 if t_free else None)
        return r

    def close(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
        self.logf.close()


# --------------------------------------------------------------------------- measurement helpers

class NVML:
    def __init__(self, disabled=False):
        self.ok = False
        self.err = "disabled (fake driver)"
        if disabled:
            return
        try:
            import pynvml
            pynvml.nvmlInit()
            self.n = pynvml
            self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.ok = True
        except Exception as e:  # noqa: BLE001
            self.err = str(e)

    def used(self):
        if not self.ok:
            return -1
        return int(self.n.nvmlDeviceGetMemoryInfo(self.h).used)

    def proc_used(self, pid):
        if not self.ok:
            return -1
        try:
            for p in self.n.nvmlDeviceGetComputeRunningProcesses(self.h):
                if p.pid == pid:
                    return int(p.usedGpuMemory or 0)
        except Exception:  # noqa: BLE001
            return -2
        return 0


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = max(0, min(len(xs) - 1, int(round(p / 100 * len(xs) + 0.5)) - 1))
    return xs[k]


def read_losses(path):
    losses, done = [], None
    if not os.path.exists(path):
        return losses, done
    with open(path) as f:
        for line in f:
            m = json.loads(line)
            if "loss" in m:
                losses.append(m["loss"])
            if m.get("done"):
                done = m
    return losses, done


def count_steps(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


class Stopped(BaseException):
    """SIGTERM during the run (a BaseException, so that no phase swallows it)."""


class Driver:
    def __init__(self, a):
        self.a = a
        self.bin = os.path.abspath(a.bin)
        self.shim = os.path.join(self.bin, "libmigswap.so")
        self.testprog = os.path.join(self.bin, "migswap_testprog")
        self.out = os.path.abspath(a.out)
        self.work = a.work or tempfile.mkdtemp(prefix="swap-h200-")
        os.makedirs(self.work, exist_ok=True)
        os.makedirs(self.out, exist_ok=True)
        sockdir = os.path.join(self.work, "sock")
        os.makedirs(sockdir, mode=0o700, exist_ok=True)
        self.logfile = open(os.path.join(self.work, "driver.log"), "a")
        self.t_start = time.time()
        self.deadline = self.t_start + a.budget
        self.res = {"quick": a.quick, "fake": a.fake, "phases": {}}
        self.procs = []
        self.ref = {}
        if a.fake and not a.gpu_memory:
            a.gpu_memory = str(a.fake_capacity)  # the fake's shared capacity, declared to the daemon
        self.ctl = None
        if a.ctl == "daemon":
            try:
                self.ctl = DaemonCtl(os.path.join(self.bin, "migctl"), sockdir, os.path.join(self.work, "daemon.log"),
                                     a.gpu_memory)
            except Exception as e:  # noqa: BLE001
                # say so loudly, and still measure the shim with the fallback driver
                self.res["ctl_error"] = str(e)
                print(f"MIGCTL DAEMON FAILED TO START, falling back to the protocol driver: {e}", flush=True)
        if self.ctl is None:
            self.ctl = PyCtl(sockdir, self.log)
        self.res["ctl"] = self.ctl.kind + (f" (migctl daemon FAILED: {self.res['ctl_error'][:200]})"
                                           if "ctl_error" in self.res else "")
        self.nvml = NVML(disabled=a.fake)
        self.log(f"swap control: {self.res['ctl']}; NVML: {self.nvml.ok}; work {self.work}")

    def log(self, s):
        line = f"[{time.time() - self.t_start:7.1f}s] {s}"
        print(line, flush=True)
        self.logfile.write(line + "\n")
        self.logfile.flush()

    def left(self):
        return self.deadline - time.time()

    def env(self, shim, checksum=False, job="job", priority=0, prepin=False, fake_stats=""):
        e = dict(os.environ)
        e.update({"PYTHONUNBUFFERED": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
                  "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                  "NVSHMEM_DISABLE_NVLS": "1"})
        for k in [k for k in e if k.startswith("MIGSWAP_") or k.startswith("FAKECUDA_")]:
            del e[k]
        if self.a.fake:
            e["LD_LIBRARY_PATH"] = os.path.join(self.bin, "fakecuda") + ":" + e.get("LD_LIBRARY_PATH", "")
            if fake_stats:
                e.update({"FAKECUDA_STATS": fake_stats, "FAKECUDA_MEM_BYTES": str(self.a.fake_capacity)})
        if shim:
            e.update({"LD_PRELOAD": self.shim, "MIGSWAP_SOCKET": self.ctl.path, "MIGSWAP_JOB": job,
                      "MIGSWAP_PRIORITY": str(priority), "MIGSWAP_LOG": "1"})
            if checksum:
                e["MIGSWAP_CHECKSUM"] = "1"
            if prepin:
                e["MIGSWAP_PREPIN"] = "1"
        return e

    def popen(self, name, args, env, **kw):
        errf = open(os.path.join(self.work, f"{name}.stderr"), "w")
        kw.setdefault("stdout", errf)
        p = subprocess.Popen(args, env=env, stderr=errf, **kw)
        self.procs.append(p)
        return p

    # ----------------------------------------------------------------------- trainers

    def start_train(self, name, shim, graphs, steps, checksum=False, priority=0, fake_stats=""):
        a = self.a
        log = os.path.join(self.work, f"{name}.jsonl")
        me = [sys.executable, os.path.abspath(__file__)]
        warm = str(min(20, steps // 4))
        if a.fake:
            args = me + ["faketrain", "--log", log, "--steps", str(steps), "--mib", str(a.fake_mib),
                         "--pace-ms", str(a.fake_pace_ms), "--seed", "7", "--warm", warm]
        else:
            args = me + ["train", "--log", log, "--steps", str(steps), "--batch", str(a.batch), "--res", str(a.res),
                         "--seed", "7", "--warm", warm] + (["--graphs"] if graphs else [])
        t0 = time.perf_counter()
        p = self.popen(name, args, self.env(shim, checksum, name, priority, fake_stats=fake_stats))
        return p, log, t0, {"name": name, "shim": shim, "graphs": graphs, "steps": steps}

    def train(self, name, shim, graphs, steps, swaps=False, checksum=False):
        return self.finish_train(*self.start_train(name, shim, graphs, steps, checksum), swaps=swaps)

    def finish_train(self, p, log, t0, info, swaps=False, registered=False):
        a = self.a
        shim, name = info["shim"], info["name"]
        if shim and not registered:
            h = self.ctl.wait(name, p.pid, timeout=a.phase_timeout)
            if swaps:
                info.update(self.swap_while_training(p, h, log))
        rc = p.wait(timeout=a.phase_timeout)
        info["rc"] = rc
        info["wall"] = time.perf_counter() - t0
        losses, done = read_losses(log)
        info["losses"] = losses
        info["done"] = done
        self.log(f"{name}: rc={rc} steps={len(losses)} ms/step mean={done and round(done['ms_per_step'], 3)} "
                 f"median={done and round(done.get('ms_median', float('nan')), 3)} swaps={info.get('cycles', 0)}")
        return info

    def swap_while_training(self, p, h, log):
        """Swap the trainer out and in through the controller until it has had --max-cycles
        cycles or ends: after each swap-in wait for one more logged step, so it trains between
        swaps; the process's own NVML memory is read before and while out every 20 cycles."""
        a = self.a
        outs, wall_out, wall_in, drops, errors = [], [], [], [], []
        t_first = time.perf_counter()
        while count_steps(log) < 2 and p.poll() is None and time.perf_counter() - t_first < a.phase_timeout:
            time.sleep(0.005)
        cycle = 0
        while p.poll() is None and cycle < a.max_cycles and self.left() > 60:
            before = self.nvml.proc_used(p.pid) if cycle % 20 == 0 else None
            r = self.ctl.swap(h, "out", a.phase_timeout)
            if not r.get("ok"):
                time.sleep(0.2)
                if p.poll() is not None:
                    break  # the trainer ended between two cycles
                errors.append("swap out: " + str(r.get("error")))
                continue
            outs.append(r)
            wall_out.append(r["wall"])
            if before is not None:
                drops.append((before, self.nvml.proc_used(p.pid)))
            r = self.ctl.swap(h, "in", a.phase_timeout)
            if not r.get("ok"):
                time.sleep(0.2)
                if p.poll() is not None and count_steps(log) > 0 and read_losses(log)[1]:
                    break  # it had finished its last step and exited while out: not an error
                errors.append("swap in: " + str(r.get("error")))
                break
            wall_in.append(r["wall"])
            cycle += 1
            n0 = count_steps(log)
            t_wait = time.perf_counter()
            while count_steps(log) < n0 + 1 and p.poll() is None and time.perf_counter() - t_wait < 10:
                time.sleep(0.001)
        return {"cycles": cycle, "swap_errors": errors[:5], "n_errors": len(errors),
                "bytes": [int(r.get("bytes", 0)) for r in outs[:1]],
                "out_wall_p50": pct(wall_out, 50), "in_wall_p50": pct(wall_in, 50),
                "swap_s_p50": pct([float(r.get("seconds", 0)) for r in outs], 50),
                "nvml_proc_drops": drops}

    # ----------------------------------------------------------------------- victims

    def start_hold(self, name, shim, prepin=False):
        a = self.a
        me = [sys.executable, os.path.abspath(__file__)]
        args = me + (["fakehold", "--mib", str(a.fake_victim_mib)] if a.fake else ["hold", "--gib", str(a.gib)])
        return self.popen(name, args, self.env(shim, False, name, prepin=prepin), stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)

    def ready(self, name, p):
        line = p.stdout.readline().split()
        if not line or line[0] != "READY":
            raise RuntimeError(f"{name}: victim did not start: {line}")
        return int(line[2]), line[3:]

    def check(self, p):
        p.stdin.write("check\n")
        p.stdin.flush()
        return p.stdout.readline().split()[1:]

    def stop(self, p):
        try:
            p.stdin.write("stop\n")
            p.stdin.flush()
            p.wait(timeout=60)
        except Exception:  # noqa: BLE001
            p.kill()

    def free_watch(self, threshold):
        """A watch for ctl.swap: polls NVML's whole-GPU used memory until it is at most
        threshold; returns that moment (perf_counter), None if it had not happened 1 s after
        the swap's answer."""
        def w(done):
            t_done = None
            while True:
                u = self.nvml.used()
                if 0 <= u <= threshold:
                    return time.perf_counter()
                if done():
                    if t_done is None:
                        t_done = time.perf_counter()
                    elif time.perf_counter() - t_done > 1.0:
                        return None
                time.sleep(0.0002)
        return w if self.nvml.ok else None

    # ----------------------------------------------------------------------- phases

    def phase(self, name, fn, need_s=0):
        if self.left() < need_s:
            self.log(f"== {name} SKIPPED: {self.left():.0f} s left of --budget, needs ~{need_s} s")
            self.res["phases"][name] = {"ok": False, "error": "skipped: out of time budget"}
            return None
        self.log(f"== {name}")
        t0 = time.perf_counter()
        try:
            r = fn()
            r["ok"] = r.get("ok", True)
        except Exception as e:  # noqa: BLE001
            import traceback
            self.log(f"{name} FAILED: {e}\n{traceback.format_exc()}")
            r = {"ok": False, "error": str(e)}
            for p in self.procs:
                if p.poll() is None and p not in self.keep:
                    p.kill()
        self.procs = [p for p in self.procs if p.poll() is None]
        r["phase_seconds"] = time.perf_counter() - t0
        self.log(f"   {name}: {r['phase_seconds']:.1f} s")
        self.res["phases"][name] = r
        self.save()
        return r

    keep = ()

    def p_info(self):
        r = {"ctl": self.ctl.kind}
        try:
            r["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used",
                                              "--format=csv,noheader"], capture_output=True, text=True,
                                             timeout=30).stdout.strip()
        except Exception as e:  # noqa: BLE001
            r["nvidia_smi"] = str(e)
        r["nvml"] = self.nvml.ok
        return r

    def p_bench(self):
        e0 = {}
        if not self.a.fake:
            ptx = os.path.join(self.work, "noop.ptx")
            with open(ptx, "w") as f:
                f.write(".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry noop()\n{\n\tret;\n}\n")
            e0["MIGSWAP_TEST_PTX"] = ptx
        n = str(self.a.launches)
        out = {}
        for label, shim in (("bare", False), ("shim", True), ("bare2", False), ("shim2", True)):
            e = self.env(shim, False, "bench-" + label)
            e.update(e0)
            p = subprocess.Popen([self.testprog, "gpa", "bench", n], env=e, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            so, se = p.communicate(timeout=120)
            res = [ln for ln in so.splitlines() if ln.startswith("RESULT")]
            stats = [ln for ln in so.splitlines() if ln.startswith("STATS")]
            if not res:
                raise RuntimeError(f"bench {label}: {so} {se}")
            if shim and not (stats and " connected=1 " in stats[0] + " "):
                raise RuntimeError(f"bench {label}: the shim did not connect to the daemon: {stats} {se[-500:]}")
            kv = dict(x.split("=", 1) for x in res[0].split()[1:])
            out[label] = float(kv["ns_per_launch"])
            out[label + "_burst"] = float(kv.get("ns_per_launch_burst", "nan"))
            if stats:
                out[label + "_stats"] = stats[0]
            self.log(f"bench {label}: {kv['ns_per_launch']} ns/launch, burst {out[label + '_burst']} ns/launch")
        out["overhead_ns"] = min(out["shim"], out["shim2"]) - min(out["bare"], out["bare2"])
        out["overhead_burst_ns"] = min(out["shim_burst"], out["shim2_burst"]) - min(out["bare_burst"], out["bare2_burst"])
        return out

    def p_overhead(self):
        """Step time with the shim loaded (connected to the daemon, VMM-backed allocations) and
        no swaps, against bare runs; pairs alternate their order (bare-shim, shim-bare, ...) so
        that drift cancels; each run's median step time; medians of those compared. The first
        bare run is the reference losses for the eager and preemption checks."""
        a = self.a
        med = lambda x: x["done"]["ms_median"] if x["done"] else float("nan")  # noqa: E731
        mean = lambda x: x["done"]["ms_per_step"] if x["done"] else float("nan")  # noqa: E731
        bare, shim, bare_mean, shim_mean, ratios, equal = [], [], [], [], [], True
        n = max(1, a.overhead_pairs)
        for i in range(n):
            order = (False, True) if i % 2 == 0 else (True, False)
            pair = {}
            for s in order:
                r = self.train(f"overhead_{'shim' if s else 'bare'}{i}", s, False, a.steps)
                pair[s] = r
                if not s and "eager" not in self.ref:
                    self.ref["eager"] = r["losses"]
            equal &= pair[True]["losses"] == self.ref["eager"] and len(pair[True]["losses"]) == a.steps
            bare.append(med(pair[False]))
            shim.append(med(pair[True]))
            bare_mean.append(mean(pair[False]))
            shim_mean.append(mean(pair[True]))
            ratios.append(100 * (shim[-1] / bare[-1] - 1))
            if self.left() < a.reserve_s and i + 1 < n:
                self.log(f"overhead: stopping after {i + 1} pairs (time budget)")
                break
        return {"ms_bare": bare, "ms_shim": shim, "ms_bare_mean": bare_mean, "ms_shim_mean": shim_mean,
                "pair_pct": ratios, "steps": a.steps, "pairs": len(bare),
                "overhead_pct": 100 * (statistics.median(shim) / statistics.median(bare) - 1),
                "overhead_mean_pct": 100 * (statistics.median(shim_mean) / statistics.median(bare_mean) - 1),
                "noswap_equal": equal}

    def daemon_log_since(self, off):
        path = getattr(self.ctl, "logpath", None)
        if not path:
            return ""
        with open(path) as f:
            f.seek(off)
            return f.read()

    def daemon_log_size(self):
        path = getattr(self.ctl, "logpath", None)
        return os.path.getsize(path) if path else 0

    def p_preempt(self):
        """Need-driven preemption: a priority-0 trainer under the shim; a priority-10 job under
        the shim asks for more device memory than is free; the daemon must swap the trainer
        out, grant the memory, and swap the trainer back in when the job exits; the trainer's
        losses must still equal the reference."""
        a = self.a
        if not isinstance(self.ctl, DaemonCtl):
            raise RuntimeError("preemption needs the daemon (--ctl daemon)")
        ref = self.ref.get("eager") or []
        steps = a.preempt_steps or a.steps
        steps = min(steps, len(ref)) if ref else steps
        stats = os.path.join(self.work, "fakecuda-preempt.stats") if a.fake else ""
        off = self.daemon_log_size()
        p, log, t0, info = self.start_train("preempt_low", True, False, steps, checksum=True, priority=0,
                                            fake_stats=stats)
        hp = None
        if not a.fake:  # the Python job starts now (torch's start-up overlaps) and waits for "go"
            hog = [sys.executable, os.path.abspath(__file__), "hog", "--wait", "--hold", str(a.hog_hold)]
            hp = self.popen("preempt_high", hog, self.env(True, False, "preempt_high", priority=10),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        job = self.ctl.wait("preempt_low", p.pid, a.phase_timeout)
        if hp is not None:
            line = hp.stdout.readline()
            if not line.startswith("INIT"):
                raise RuntimeError(f"the preempting job did not start: {line!r}")
        while count_steps(log) < min(30, max(2, steps // 4)) and p.poll() is None:
            time.sleep(0.01)
        if p.poll() is not None:
            raise RuntimeError("the low-priority trainer ended before the preempting job was ready")
        low = [x for x in self.ctl.status().get("processes") or [] if x["pid"] == p.pid]
        low_bytes = int(low[0]["bytes"]) if low else 0
        t_hog = time.perf_counter()
        if a.fake:
            need = a.fake_capacity - low_bytes // 2
            hog_desc = f"{need} B of {a.fake_capacity} declared"
            hp = self.popen("preempt_high", [self.testprog, "gpa", "oom", str(need)],
                            self.env(True, False, "preempt_high", priority=10, fake_stats=stats),
                            stdout=subprocess.PIPE, text=True)
        else:
            # more than is free, less than free + the low job's bytes - the daemon's 256 MiB headroom
            extra = max(64 << 20, (low_bytes - (256 << 20) - (64 << 20)) // 2)
            hog_desc = f"free + {extra / 2**20:.0f} MiB"
            hp.stdin.write(f"go {extra}\n")
            hp.stdin.flush()
        self.log(f"preempt: low job holds {low_bytes} B (daemon's registry), at step {count_steps(log)}; "
                 f"high job asks {hog_desc}")
        seen, nvml_out, t_out, t_back, t_hog_exit = [], None, None, None, None
        last = None
        while True:
            st = self.ctl.states().get(job)
            now = time.perf_counter() - t_hog
            if st != last:
                seen.append((round(now, 3), st))
                last = st
            if st == "out" and t_out is None:
                t_out = now
                nvml_out = (self.nvml.proc_used(p.pid), self.nvml.used())
            if st == "running" and t_out is not None and t_back is None:
                t_back = now
            if hp.poll() is not None and t_hog_exit is None:
                t_hog_exit = now
            if t_hog_exit is not None and (t_back is not None or p.poll() is not None or now - t_hog_exit > 15):
                break
            if now > a.phase_timeout:
                break
            time.sleep(0.03)
        hog_out = hp.communicate(timeout=60)[0]
        t_hog_end = t_hog_exit
        manual_in = None
        if t_back is None and p.poll() is None:
            # the policy did not bring it back: do it by hand so that the run goes on (the check fails)
            manual_in = self.ctl.swap(job, "in", 120)
            self.log(f"preempt: low job not swapped back in by the daemon; manual swap in: {manual_in}")
        info = self.finish_train(p, log, t0, info, registered=True)
        dl = self.daemon_log_since(off)
        pick = [ln for ln in dl.splitlines() if any(k in ln for k in ("need", "swapping back in", "swap result"))]
        hog_ok = "RESULT ok=1" in hog_out
        need_swap = any("swapping out for a need" in ln and str(p.pid) in ln for ln in pick)
        granted = any("need granted" in ln for ln in pick)
        back = any("swapping back in" in ln and str(p.pid) in ln for ln in pick)
        equal = info["losses"] == ref[:steps] and len(info["losses"]) == steps
        res = {"low_bytes": low_bytes, "high": hog_desc, "high_ok": hog_ok, "high_output": hog_out.strip()[-400:],
               "daemon_swapped_low_for_need": need_swap, "need_granted": granted, "low_swapped_back": back,
               "low_states": seen, "low_out_at_s": t_out, "low_back_at_s": t_back, "high_exit_s": t_hog_end,
               "nvml_while_out": nvml_out, "losses_equal": equal, "steps": len(info["losses"]),
               "low_rc": info["rc"], "daemon_log": pick[:20], "manual_swap_in": manual_in}
        res["ok"] = hog_ok and need_swap and granted and back and not manual_in and equal and info["rc"] == 0
        self.log(f"preempt: high ok={hog_ok}, daemon swapped low for the need={need_swap}, granted={granted}, "
                 f"low back={back}, states {seen}, losses equal={equal}")
        return res

    def p_train(self):
        """The eager and the CUDA-graph runs under the shim, swapped by the controller
        (--max-cycles each), side by side, with the bare CUDA-graph reference beside them.
        The 16 GiB victims of the next phases start here so their start-up overlaps (one with
        MIGSWAP_PREPIN=1, whose arena pins in the background)."""
        a = self.a
        if "eager" not in self.ref:
            self.ref["eager"] = self.train("eager_bare", False, False, a.steps)["losses"]
        self.victims = {}
        for name, shim, prepin in (("victim_prepin", True, True), ("victim", True, False),
                                   ("ckpt_victim", False, False)):
            if name == "ckpt_victim" and (a.no_checkpoint or a.fake):
                continue
            if name == "victim_prepin" and not a.prepin_check:
                continue
            self.victims[name] = (self.start_hold(name, shim, prepin), time.perf_counter())
        self.keep = tuple(v[0] for v in self.victims.values())
        D = self.start_train("graphs_bare", False, True, a.graph_steps)
        C0 = self.start_train("eager_shim_swaps", True, False, a.steps, checksum=True)
        E0 = self.start_train("graphs_shim_swaps", True, True, a.graph_steps, checksum=True)
        out = {}
        th = threading.Thread(target=lambda: out.__setitem__("E", self.finish_train(*E0, swaps=True)))
        th.start()
        C = self.finish_train(*C0, swaps=True)
        th.join()
        D = self.finish_train(*D)
        E = out.get("E")
        if E is None:
            raise RuntimeError("the CUDA-graph swap run failed (see driver.log)")
        keys = ("cycles", "swap_errors", "n_errors", "bytes", "nvml_proc_drops", "out_wall_p50", "in_wall_p50",
                "swap_s_p50")
        eager = {k: C.get(k) for k in keys}
        eager.update({"swaps_equal": C["losses"] == self.ref["eager"] and len(C["losses"]) == a.steps,
                      "steps": len(C["losses"]), "rc": C["rc"], "last_loss_bare": self.ref["eager"][-1:],
                      "last_loss_swaps": C["losses"][-1:]})
        graphs = {k: E.get(k) for k in keys}
        graphs.update({"swaps_equal": E["losses"] == D["losses"] and len(E["losses"]) == a.graph_steps,
                       "steps": len(E["losses"]), "rc": [D["rc"], E["rc"]], "last_loss_bare": D["losses"][-1:],
                       "last_loss_swaps": E["losses"][-1:]})
        self.res["phases"]["train_graphs"] = graphs
        return eager

    def first_swap(self, name):
        """The first swap-out and swap-in of a fresh victim (its pinned arena's cost)."""
        p, t_start = self.victims.pop(name)
        size, sums0 = self.ready(name, p)
        h = self.ctl.wait(name, p.pid, 60)
        age = time.perf_counter() - t_start
        used_in = self.nvml.used()
        r1 = self.ctl.swap(h, "out", watch=self.free_watch(used_in - 0.9 * size))
        r2 = self.ctl.swap(h, "in")
        return p, h, size, sums0, {"out_wall": r1["wall"], "free_s": r1["free_s"], "out_ok": r1.get("ok"),
                                   "out_s": r1.get("seconds"), "in_wall": r2["wall"], "in_ok": r2.get("ok"),
                                   "age_s": age, "error": r1.get("error") or r2.get("error")}

    def p_swap_throughput(self):
        a = self.a
        res = {}
        if "victim_prepin" in self.victims:
            p, _, _, sums0, first = self.first_swap("victim_prepin")
            res["first_prepin"] = first
            res["prepin_intact"] = self.check(p) == sums0
            self.stop(p)
            self.log(f"first swap, MIGSWAP_PREPIN=1 (victim {first['age_s']:.0f} s old): request->free "
                     f"{first['free_s']} s, CLI {first['out_wall']:.3f} s; in {first['in_wall']:.3f} s")
        if "victim" not in self.victims:
            self.victims["victim"] = (self.start_hold("victim", True), time.perf_counter())
        used0 = self.nvml.used()
        p, h, size, sums0, first = self.first_swap("victim")
        res["first_noprepin"] = first
        self.log(f"first swap, no prepin: request->free {first['free_s']} s, CLI {first['out_wall']:.3f} s; "
                 f"in {first['in_wall']:.3f} s")
        used_in = self.nvml.used()
        lat, cli, sout, sin, win, bytes_, used_out, smi = [], [], [], [], [], 0, -1, ""
        for i in range(a.cycles):
            r = self.ctl.swap(h, "out", watch=self.free_watch(used_in - 0.9 * size))
            if not r.get("ok"):
                raise RuntimeError(f"swap out {i}: {r}")
            if i == 0:
                used_out = self.nvml.used()
                res["nvml_proc_out"] = self.nvml.proc_used(p.pid)
                if not a.fake:
                    smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
                                         capture_output=True, text=True).stdout.strip()
            cli.append(r["wall"])
            if r["free_s"] is not None:
                lat.append(r["free_s"])
            sout.append(float(r["seconds"]))
            bytes_ = int(r["bytes"])
            r = self.ctl.swap(h, "in")
            if not r.get("ok"):
                raise RuntimeError(f"swap in {i}: {r}")
            win.append(r["wall"])
            sin.append(float(r["seconds"]))
        sums1 = self.check(p)
        self.stop(p)
        gibs = bytes_ / GiB
        res.update({
            "gib": gibs, "cycles": a.cycles, "data_intact": sums0 == sums1,
            "out_gibps_p50": gibs / statistics.median(sout), "in_gibps_p50": gibs / statistics.median(sin),
            "out_gibps_min": gibs / max(sout), "in_gibps_min": gibs / max(sin),
            "free_p50": pct(lat, 50), "free_p99": pct(lat, 99), "free_n": len(lat),
            "cli_p50": pct(cli, 50), "cli_p99": pct(cli, 99), "in_cli_p50": pct(win, 50), "in_cli_p99": pct(win, 99),
            "shim_out_s_p50": statistics.median(sout), "shim_in_s_p50": statistics.median(sin),
            "nvml_used_before_victim": used0, "nvml_used_resident": used_in, "nvml_used_out": used_out,
            "nvidia_smi_out": smi,
        })
        self.log(f"shim {gibs:.2f} GiB: out {res['out_gibps_p50']:.1f} GiB/s, in {res['in_gibps_p50']:.1f} GiB/s, "
                 f"request->free (NVML) p50 {res['free_p50']:.3f}s p99 {res['free_p99']:.3f}s, "
                 f"request->CLI done p50 {res['cli_p50']:.3f}s p99 {res['cli_p99']:.3f}s, intact {res['data_intact']}")
        return res

    def p_checkpoint(self):
        if "ckpt_victim" not in self.victims:
            self.victims["ckpt_victim"] = (self.start_hold("ckpt_victim", False), time.perf_counter())
        p, _ = self.victims.pop("ckpt_victim")
        size, sums0 = self.ready("ckpt_victim", p)
        gib = size / GiB
        cuda = ctypes.CDLL("libcuda.so.1")
        cuda.cuInit(0)
        pid = ctypes.c_int(p.pid)

        def call(fn, nbytes=64, timeout_ms=0):
            buf = ctypes.create_string_buffer(nbytes)
            if timeout_ms:
                ctypes.c_uint.from_buffer(buf).value = timeout_ms
            t0 = time.perf_counter()
            r = getattr(cuda, fn)(pid, buf)
            return r, time.perf_counter() - t0

        used_in = self.nvml.used()
        r1, t_lock = call("cuCheckpointProcessLock", timeout_ms=60000)
        r2, t_ck = call("cuCheckpointProcessCheckpoint")
        used_out = self.nvml.used()
        r3, t_rs = call("cuCheckpointProcessRestore")
        r4, t_un = call("cuCheckpointProcessUnlock")
        codes = [r1, r2, r3, r4]
        sums1 = self.check(p) if all(x == 0 for x in codes) else None
        self.stop(p)
        res = {"codes": codes, "gib": gib, "lock_s": t_lock, "checkpoint_s": t_ck, "restore_s": t_rs,
               "unlock_s": t_un, "out_gibps": gib / t_ck if t_ck else 0, "in_gibps": gib / t_rs if t_rs else 0,
               "nvml_used_resident": used_in, "nvml_used_out": used_out, "data_intact": sums0 == sums1,
               "ok": all(x == 0 for x in codes)}
        self.log(f"checkpoint API {gib:.2f} GiB: codes {codes}, lock {t_lock:.3f}s checkpoint {t_ck:.2f}s "
                 f"restore {t_rs:.2f}s unlock {t_un:.3f}s")
        return res

    def save(self):
        with open(os.path.join(self.out, "summary.json"), "w") as f:
            json.dump(self.res, f, indent=1, default=str)

    def table(self):
        ph = self.res["phases"]
        nan = float("nan")
        tp, ck, b = ph.get("swap_throughput") or {}, ph.get("checkpoint") or {}, ph.get("bench") or {}
        o, e, gr, pr = ph.get("overhead") or {}, ph.get("train_eager") or {}, ph.get("train_graphs") or {}, \
            ph.get("preempt") or {}
        unit = "GiB" if tp.get("gib", 1) >= 1 else "MiB"
        size = tp.get("gib", nan) * (1 if unit == "GiB" else 1024)

        def pf(ok, have=True):
            return "n/a" if not have else ("**PASS**" if ok else "**FAIL**")

        f = lambda x, fmt="{:.3f}": "—" if x is None or (isinstance(x, float) and x != x) else fmt.format(x)  # noqa: E731
        L = [f"## migswap on one GPU — summary{' (QUICK check run)' if self.a.quick else ''}"
             f"{' (FAKE driver selftest: numbers mean nothing)' if self.a.fake else ''}",
             f"GPU: {(ph.get('info') or {}).get('nvidia_smi', '?')}; swaps driven by: {self.res['ctl']}; "
             f"wall {time.time() - self.t_start:.0f} s", "",
             "| measure | peer | ours | target | result |", "|---|---|---|---|---|"]
        have_tp = "out_gibps_p50" in tp
        L.append(f"| swap-out of {size:.2f} {unit}, p50 of {tp.get('cycles')} (worst) | checkpoint API "
                 f"{f(ck.get('out_gibps'), '{:.2f}')} GiB/s ({f(ck.get('checkpoint_s'), '{:.2f}')} s) | "
                 f"{f(tp.get('out_gibps_p50'), '{:.1f}')} GiB/s ({f(tp.get('out_gibps_min'), '{:.1f}')}) | "
                 f">= 25 GiB/s (goal 40) | {pf(tp.get('out_gibps_p50', 0) >= 25, have_tp)} |")
        L.append(f"| swap-in of {size:.2f} {unit}, p50 (worst) | checkpoint API {f(ck.get('in_gibps'), '{:.2f}')} GiB/s "
                 f"({f(ck.get('restore_s'), '{:.2f}')} s) | {f(tp.get('in_gibps_p50'), '{:.1f}')} GiB/s "
                 f"({f(tp.get('in_gibps_min'), '{:.1f}')}) | >= 25 GiB/s (goal 40) | "
                 f"{pf(tp.get('in_gibps_p50', 0) >= 25, have_tp)} |")
        have_free = tp.get("free_n", 0) > 0
        L.append(f"| request -> memory free (from `migctl swap out` issued to NVML showing it gone), p50 / p99 of "
                 f"{tp.get('free_n')} | lock+checkpoint {f((ck.get('lock_s') or 0) + (ck.get('checkpoint_s') or 0) if ck else None, '{:.2f}')} s | "
                 f"{f(tp.get('free_p50'))} s / {f(tp.get('free_p99'))} s | <= 1 s (goal 0.5) | "
                 f"{pf(tp.get('free_p99', 9) <= 1, have_free)} |")
        L.append(f"| request -> `migctl swap out` returned (daemon's result), p50 / p99 | — | {f(tp.get('cli_p50'))} s / "
                 f"{f(tp.get('cli_p99'))} s | <= 1 s (goal 0.5) | {pf(tp.get('cli_p99', 9) <= 1, have_tp)} |")
        fp, fn_ = tp.get("first_prepin") or {}, tp.get("first_noprepin") or {}
        L.append(f"| first swap-out of a fresh process: request -> free (CLI done) | — | no prepin "
                 f"{f(fn_.get('free_s'))} s ({f(fn_.get('out_wall'))} s); MIGSWAP_PREPIN=1 {f(fp.get('free_s'))} s "
                 f"({f(fp.get('out_wall'))} s, process {f(fp.get('age_s'), '{:.0f}')} s old) | — | info |")
        L.append(f"| data intact after all swaps (victim's own sums) | checkpoint API: {ck.get('data_intact', '—')} | "
                 f"{tp.get('data_intact', '—')} | True | {pf(tp.get('data_intact') is True, have_tp)} |")
        fr = lambda r: (r.get('nvml_used_resident', 0) - r.get('nvml_used_out', 0)) / GiB  # noqa: E731
        L.append(f"| GPU memory freed while out (NVML whole GPU, resident -> out) | {f(fr(ck) if ck else None, '{:.2f}')} GiB | "
                 f"{f(fr(tp) if self.nvml.ok and have_tp else None, '{:.2f}')} GiB (process keeps "
                 f"{f(tp.get('nvml_proc_out', -1) / 1e9 if self.nvml.ok else None, '{:.2f}')} GB: its context) | "
                 f"memory gone | {pf(fr(tp) >= 0.95 * tp.get('gib', 0), self.nvml.ok and have_tp)} |")
        have_b = "overhead_ns" in b
        L.append(f"| cost per intercepted launch, C no-op kernel back to back (min of 2 runs each) | GPUpres ~1 us | "
                 f"{f(b.get('overhead_ns'), '{:+.0f}')} ns ({f(min(b.get('bare', nan), b.get('bare2', nan)), '{:.0f}')} -> "
                 f"{f(min(b.get('shim', nan), b.get('shim2', nan)), '{:.0f}')} ns/launch) | <= 1 us (goal 0.5) | "
                 f"{pf(b.get('overhead_ns', 9e9) <= 1000, have_b)} |")
        L.append(f"| cost per intercepted launch, bursts of 32 (queue not full) | GPUpres ~1 us | "
                 f"{f(b.get('overhead_burst_ns'), '{:+.0f}')} ns ({f(min(b.get('bare_burst', nan), b.get('bare2_burst', nan)), '{:.0f}')} -> "
                 f"{f(min(b.get('shim_burst', nan), b.get('shim2_burst', nan)), '{:.0f}')} ns/launch) | <= 1 us (goal 0.5) | "
                 f"{pf(b.get('overhead_burst_ns', 9e9) <= 1000, have_b)} |")
        have_o = "overhead_pct" in o
        L.append(f"| training overhead, shim loaded, no swaps: median step time, {o.get('pairs')} alternated pairs x "
                 f"{o.get('steps')} steps | GPUpres 8.38% | {f(o.get('overhead_pct'), '{:+.2f}')}% (pairs "
                 f"{', '.join(f'{x:+.1f}%' for x in o.get('pair_pct', []))}; ms bare "
                 f"{[round(x, 3) for x in o.get('ms_bare', [])]}, shim {[round(x, 3) for x in o.get('ms_shim', [])]}; "
                 f"means {f(o.get('overhead_mean_pct'), '{:+.2f}')}%) | <= 3% (goal 1%) | "
                 f"{pf(o.get('overhead_pct', 99) <= 3, have_o)} |")
        L.append(f"| shim loaded, no swaps: losses equal to bare | — | {o.get('noswap_equal', '—')} | equal | "
                 f"{pf(o.get('noswap_equal') is True, have_o)} |")
        for label, r in (("eager", e), ("one CUDA graph per step", gr)):
            have = "cycles" in r
            L.append(f"| {'fake trainer' if self.a.fake else 'ResNet-18'} {label}, MIGSWAP_CHECKSUM=1: swap cycles while training, losses vs no-swap run | — | "
                     f"{r.get('cycles')} cycles in {r.get('steps')} steps, equal: {r.get('swaps_equal')}, errors "
                     f"{r.get('n_errors')}, one cycle {f(r.get('out_wall_p50'))} s out + {f(r.get('in_wall_p50'))} s in (CLI) | "
                     f">= 100 cycles, bit-identical | {pf((r.get('cycles') or 0) >= 100 and r.get('swaps_equal') is True and r.get('n_errors') == 0, have)} |")
        have_p = "low_states" in pr
        L.append(f"| need-driven preemption: priority-10 job asks {pr.get('high')} (low job holds "
                 f"{f(pr.get('low_bytes', 0) / 1e9 if have_p else None, '{:.2f}')} GB) | — | daemon swapped low out: "
                 f"{pr.get('daemon_swapped_low_for_need')} (out at {f(pr.get('low_out_at_s'))} s), high got it: "
                 f"{pr.get('high_ok')}, low back: {pr.get('low_swapped_back')} (at {f(pr.get('low_back_at_s'))} s), "
                 f"losses equal: {pr.get('losses_equal')} | all true | {pf(pr.get('ok') is True, have_p)} |")
        L.append("")
        L.append(f"eager: footprint swapped {e.get('bytes')} B; NVML per-process (before, while out): {e.get('nvml_proc_drops')}")
        L.append(f"graphs: footprint swapped {gr.get('bytes')} B; NVML per-process (before, while out): {gr.get('nvml_proc_drops')}")
        L.append(f"preemption: low job states (s after the high job started, state) {pr.get('low_states')}; "
                 f"NVML (low process, whole GPU) while out {pr.get('nvml_while_out')}")
        for n, r in ph.items():
            if not r.get("ok", True):
                L.append(f"PHASE {n} FAILED: {r.get('error')}")
        if self.res.get("stopped"):
            L.append(f"RUN STOPPED EARLY: {self.res['stopped']}")
        return "\n".join(L)

    def run(self):
        a = self.a

        def term(signum, _frame):
            raise Stopped(f"signal {signum}: stopped early")
        signal.signal(signal.SIGTERM, term)
        try:
            self.phase("info", self.p_info)
            self.phase("bench", self.p_bench)
            self.phase("overhead", self.p_overhead)
            if isinstance(self.ctl, DaemonCtl):
                self.phase("preempt", self.p_preempt, need_s=40)
            self.phase("train_eager", self.p_train, need_s=90)
            self.phase("swap_throughput", self.p_swap_throughput, need_s=50)
            if not (a.no_checkpoint or a.fake):
                self.phase("checkpoint", self.p_checkpoint, need_s=25)
        except Stopped as e:  # SIGTERM (e.g. from timeout): still print what there is
            self.log(f"STOPPED: {e}")
            self.res["stopped"] = str(e)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            for p, _ in getattr(self, "victims", {}).values():
                p.kill()
            for p in self.procs:
                if p.poll() is None:
                    p.kill()
            self.ctl.close()
            t = self.table()
            print(t, flush=True)
            with open(os.path.join(self.out, "summary.md"), "w") as f:
                f.write(t + "\n")
            self.save()
            with tarfile.open(os.path.join(self.out, "logs.tgz"), "w:gz") as tf:
                tf.add(self.work, arcname="swap-h200", filter=lambda ti: None if ti.name.endswith(".sock") else ti)
        return self.res


def cmd_drive(a):
    Driver(a).run()


# --------------------------------------------------------------------------- selftest (fake driver)

def cmd_selftest(a):
    """The whole `drive` flow against the fake libcuda.so (no GPU, no torch, no NVML): the
    daemon started from --bin, swaps through `migctl swap`, the fake trainer swapped while it
    trains (losses compared with its bare run), the alternated overhead runs, the need-driven
    preemption (a priority-10 C program asks for more than the declared memory leaves), the
    victim's swap cycles with its sha256 compared, first swaps with and without
    MIGSWAP_PREPIN. With --ctl python (or both) the fallback protocol driver too (no
    preemption there). Exits non-zero unless every check holds."""
    failures = []
    for ctl in (["daemon", "python"] if a.ctl == "both" else [a.ctl]):
        work = tempfile.mkdtemp(prefix=f"swap-selftest-{ctl}-")
        out = os.path.join(work, "out")
        argv = ["drive", "--fake", "--ctl", ctl, "--bin", a.bin, "--out", out, "--work", os.path.join(work, "w"),
                "--steps", str(a.steps), "--graph-steps", str(a.steps), "--max-cycles", str(a.cycles),
                "--cycles", "5", "--overhead-pairs", "2", "--preempt-steps", str(a.steps // 2),
                "--launches", "20000", "--budget", "400", "--phase-timeout", "120",
                "--fake-pace-ms", str(a.pace_ms)]
        print(f"selftest ({ctl}): swap_train.py {' '.join(argv)}", flush=True)
        res = Driver(build_parser().parse_args(argv)).run()
        ph = res["phases"]
        e, g, o, tp = ph.get("train_eager", {}), ph.get("train_graphs", {}), ph.get("overhead", {}), \
            ph.get("swap_throughput", {})
        checks = {
            "bench ran under the shim": "overhead_ns" in ph.get("bench", {}),
            "overhead: pairs ran, shim losses equal bare": o.get("pairs") == 2 and o.get("noswap_equal") is True,
            "eager: all cycles, losses equal, no errors": e.get("cycles") == a.cycles and e.get("swaps_equal") is True
            and e.get("n_errors") == 0,
            "second trainer: all cycles, losses equal": g.get("cycles") == a.cycles and g.get("swaps_equal") is True
            and g.get("n_errors") == 0,
            "victim: 5 cycles, sha256 intact": tp.get("data_intact") is True and tp.get("cycles") == 5
            and tp.get("gib", 0) > 0,
            "first swap with MIGSWAP_PREPIN ok, intact": (tp.get("first_prepin") or {}).get("out_ok") is True
            and tp.get("prepin_intact") is True,
            "first swap without prepin ok": (tp.get("first_noprepin") or {}).get("out_ok") is True,
        }
        if ctl == "daemon":
            pr = ph.get("preempt", {})
            checks["preemption: low out for the need, high ran, low back, losses equal"] = pr.get("ok") is True
        for k, v in checks.items():
            print(f"  [{'ok' if v else 'FAIL'}] {ctl}: {k}")
            if not v:
                failures.append(f"{ctl}: {k}")
        if not failures:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"selftest ({ctl}): kept {work}")
    print("selftest:", "PASS" if not failures else f"FAIL {failures}")
    sys.exit(1 if failures else 0)


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--log", required=True)
    t.add_argument("--steps", type=int, default=240)
    t.add_argument("--warm", type=int, default=20)
    t.add_argument("--batch", type=int, default=64)
    t.add_argument("--res", type=int, default=112)
    t.add_argument("--seed", type=int, default=7)
    t.add_argument("--graphs", action="store_true")
    ft = sub.add_parser("faketrain")
    ft.add_argument("--log", required=True)
    ft.add_argument("--steps", type=int, default=60)
    ft.add_argument("--warm", type=int, default=5)
    ft.add_argument("--mib", type=int, default=8)
    ft.add_argument("--pace-ms", type=float, default=2)
    ft.add_argument("--seed", type=int, default=7)
    h = sub.add_parser("hold")
    h.add_argument("--gib", type=float, default=16)
    fh = sub.add_parser("fakehold")
    fh.add_argument("--mib", type=int, default=32)
    hg = sub.add_parser("hog")
    hg.add_argument("--extra", type=int, default=256 << 20, help="bytes beyond the free memory to ask for")
    hg.add_argument("--wait", action="store_true", help='start allocating on "go EXTRA" from stdin')
    hg.add_argument("--hold", type=float, default=2)
    d = sub.add_parser("drive")
    d.add_argument("--bin", default="bin/swap-h200")
    d.add_argument("--out", required=True)
    d.add_argument("--work", default="")
    d.add_argument("--ctl", choices=["daemon", "python"], default="daemon",
                   help="who drives the swaps: migctl daemon + migctl swap (default), or this script's protocol driver")
    d.add_argument("--gpu-memory", default="", help="the daemon's --gpu-memory (default: NVML)")
    d.add_argument("--quick", action="store_true")
    d.add_argument("--steps", type=int, default=700, help="steps of the eager runs (reference, overhead, swaps)")
    d.add_argument("--graph-steps", type=int, default=1500)
    d.add_argument("--max-cycles", type=int, default=120, help="swap cycles per training run")
    d.add_argument("--batch", type=int, default=64)
    d.add_argument("--res", type=int, default=112)
    d.add_argument("--gib", type=float, default=16)
    d.add_argument("--cycles", type=int, default=20)
    d.add_argument("--launches", type=int, default=50000)
    d.add_argument("--phase-timeout", type=float, default=240)
    d.add_argument("--no-checkpoint", action="store_true")
    d.add_argument("--overhead-pairs", type=int, default=4, help="alternated bare/shim timing pairs (min 1)")
    d.add_argument("--preempt-steps", type=int, default=0, help="steps of the preempted trainer (default --steps)")
    d.add_argument("--hog-hold", type=float, default=2, help="seconds the preempting job holds its memory")
    d.add_argument("--no-prepin-check", dest="prepin_check", action="store_false",
                   help="skip the first-swap measurement of a MIGSWAP_PREPIN=1 victim")
    d.add_argument("--budget", type=float, default=355, help="seconds; phases that would not fit are skipped")
    d.add_argument("--reserve-s", type=float, default=200, help="stop adding overhead pairs below this much budget")
    d.add_argument("--fake", action="store_true", help="fake libcuda.so from --bin/fakecuda (selftest)")
    d.add_argument("--fake-mib", type=int, default=8)
    d.add_argument("--fake-pace-ms", type=float, default=2)
    d.add_argument("--fake-victim-mib", type=int, default=32)
    d.add_argument("--fake-capacity", type=int, default=256 << 20)
    s = sub.add_parser("selftest")
    s.add_argument("--bin", default="bin/swap-h200")
    s.add_argument("--ctl", choices=["daemon", "python", "both"], default="both")
    s.add_argument("--steps", type=int, default=120)
    s.add_argument("--cycles", type=int, default=8)
    s.add_argument("--pace-ms", type=float, default=25, help="the fake trainer's sleep per step")
    return ap


def main():
    a = build_parser().parse_args()
    if a.cmd == "drive" and a.quick:
        a.steps, a.graph_steps, a.gib, a.cycles = min(a.steps, 60), min(a.graph_steps, 60), min(a.gib, 2), min(a.cycles, 3)
        a.launches, a.max_cycles, a.preempt_steps = min(a.launches, 20000), min(a.max_cycles, 10), min(a.preempt_steps, 60)
        a.phase_timeout = min(a.phase_timeout, 90)
        a.overhead_pairs = min(a.overhead_pairs, 1)
    {"train": cmd_train, "faketrain": cmd_faketrain, "hold": cmd_hold, "fakehold": cmd_fakehold, "hog": cmd_hog,
     "drive": cmd_drive, "selftest": cmd_selftest}[a.cmd](a)


if __name__ == "__main__":
    main()
