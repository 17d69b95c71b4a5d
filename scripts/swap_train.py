#!/usr/bin/env python3
"""swap_train.py — the H200 measurement of libmigswap.so (shim/), run by scripts/swap-h200.sh.

Subcommands:
  train     the training program: torchvision ResNet-18 on random data with a fixed seed
            (eager, or one CUDA graph per step with --graphs). It knows nothing about the shim;
            it writes one JSON line per step (the loss, repr'd) to --log.
  hold      a victim: holds --gib GiB in one tensor with a known pattern; on stdin "check" it
            prints the pattern's sums, on "stop" it exits.
  drive     the measurement: acts as the daemon (speaks shim/PROTOCOL.md on a Unix socket),
            runs every phase, compares losses, prints the summary table and writes
            summary.json / summary.txt / logs.tgz under --out.
  selftest  the driver's protocol server against the fake libcuda.so and the C test program
            (no GPU, no torch): swap cycles through this script's server.

The daemon side here is a small driver speaking PROTOCOL.md directly (swap_out/swap_in with
ids, result/progress/usage/need), so that request-to-free latency is measured at the socket.
"""
import argparse
import ctypes
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
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

    t0 = time.perf_counter()
    for step in range(a.steps):
        if step == a.warm:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        x, y = batch()
        loss = step_fn(x, y)
        log.write(json.dumps({"step": step, "loss": repr(loss)}) + "\n")
        log.flush()
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    log.write(json.dumps({"done": True, "timed_steps": a.steps - a.warm, "seconds": secs,
                          "ms_per_step": 1000 * secs / max(1, a.steps - a.warm),
                          "reserved": torch.cuda.memory_reserved()}) + "\n")
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


# --------------------------------------------------------------------------- measurement helpers

class NVML:
    def __init__(self):
        self.ok = False
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


class Driver:
    def __init__(self, a):
        self.a = a
        self.bin = os.path.abspath(a.bin)
        self.shim = os.path.join(self.bin, "libmigswap.so")
        self.out = os.path.abspath(a.out)
        self.work = a.work or os.path.join("/tmp", f"swap-h200-{os.getpid()}")
        os.makedirs(self.work, exist_ok=True)
        os.makedirs(self.out, exist_ok=True)
        self.logfile = open(os.path.join(self.work, "driver.log"), "a")
        self.server = Server(os.path.join(self.work, "migswap.sock"), self.log)
        self.nvml = NVML()
        self.res = {"quick": a.quick, "phases": {}}
        self.procs = []
        self.t_start = time.time()

    def log(self, s):
        line = f"[{time.time() - self.t_start:7.1f}s] {s}"
        print(line, flush=True)
        self.logfile.write(line + "\n")
        self.logfile.flush()

    def env(self, shim, checksum=False, job="job"):
        e = dict(os.environ)
        e.update({"PYTHONUNBUFFERED": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
                  "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                  "NVSHMEM_DISABLE_NVLS": "1"})
        for k in [k for k in e if k.startswith("MIGSWAP_")]:
            del e[k]
        if shim:
            e.update({"LD_PRELOAD": self.shim, "MIGSWAP_SOCKET": self.server.path, "MIGSWAP_JOB": job,
                      "MIGSWAP_LOG": "1"})
            if checksum:
                e["MIGSWAP_CHECKSUM"] = "1"
        return e

    def start_train(self, name, shim, graphs, steps, checksum=False):
        a = self.a
        log = os.path.join(self.work, f"{name}.jsonl")
        args = [sys.executable, os.path.abspath(__file__), "train", "--log", log, "--steps", str(steps),
                "--batch", str(a.batch), "--res", str(a.res), "--seed", "7", "--warm", str(min(20, steps // 4))]
        if graphs:
            args.append("--graphs")
        errf = open(os.path.join(self.work, f"{name}.stderr"), "w")
        t0 = time.perf_counter()
        p = subprocess.Popen(args, env=self.env(shim, checksum, name), stdout=errf, stderr=errf)
        self.procs.append(p)
        return p, log, t0, {"name": name, "shim": shim, "graphs": graphs, "steps": steps}

    def train(self, name, shim, graphs, steps, swaps=False, checksum=False):
        return self.finish_train(*self.start_train(name, shim, graphs, steps, checksum), swaps=swaps)

    def finish_train(self, p, log, t0, info, swaps=False):
        a = self.a
        shim, name = info["shim"], info["name"]
        if shim:
            c = self.server.wait_pid(p.pid, timeout=a.phase_timeout)
            info["device"] = c.hello.get("device")
            if swaps:
                info.update(self.swap_while_training(p, c, log))
        rc = p.wait(timeout=a.phase_timeout)
        info["rc"] = rc
        info["wall"] = time.perf_counter() - t0
        losses, done = read_losses(log)
        info["losses"] = losses
        info["done"] = done
        self.log(f"{name}: rc={rc} steps={len(losses)} ms/step={done and round(done['ms_per_step'], 3)} "
                 f"swaps={info.get('cycles', 0)}")
        return info

    def swap_while_training(self, p, c, log):
        """Swap the trainer out and in until it ends: after each swap-in wait for one more
        logged step, so it trains between swaps; NVML is read while out on a few cycles."""
        outs, ins, wall_out, wall_in, drops, errors = [], [], [], [], [], []
        t_first = time.perf_counter()
        while count_steps(log) < 2 and p.poll() is None and time.perf_counter() - t_first < self.a.phase_timeout:
            time.sleep(0.005)
        cycle = 0
        while p.poll() is None:
            before = self.nvml.used() if cycle % 25 == 0 else None
            r, w = c.swap("swap_out", self.a.phase_timeout)
            if not r.get("ok"):
                errors.append(r.get("error"))
                if p.poll() is not None:
                    break
                time.sleep(0.01)
                continue
            outs.append(r)
            wall_out.append(w)
            if before is not None:
                during = self.nvml.used()
                drops.append((before, during))
            r, w = c.swap("swap_in", self.a.phase_timeout)
            if not r.get("ok"):
                errors.append("swap_in: " + str(r.get("error")))
                break
            ins.append(r)
            wall_in.append(w)
            cycle += 1
            n0 = count_steps(log)
            t_wait = time.perf_counter()
            while count_steps(log) < n0 + 1 and p.poll() is None and time.perf_counter() - t_wait < 10:
                time.sleep(0.001)
        return {"cycles": cycle, "swap_errors": errors[:5], "n_errors": len(errors),
                "bytes": [int(r["bytes"]) for r in outs[:1]],
                "out_wall_p50": pct(wall_out, 50), "in_wall_p50": pct(wall_in, 50),
                "nvml_drops": drops}

    def hold(self, name, gib, shim, prepin=False):
        errf = open(os.path.join(self.work, f"{name}.stderr"), "w")
        env = self.env(shim, False, name)
        if prepin:
            env["MIGSWAP_PREPIN"] = "1"
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "hold", "--gib", str(gib)],
                             env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=errf, text=True)
        self.procs.append(p)
        ready = p.stdout.readline().split()
        if not ready or ready[0] != "READY":
            raise RuntimeError(f"{name}: victim did not start: {ready}")
        self.victim_reserved = int(ready[2])
        return p, ready[3:]

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

    # ----------------------------------------------------------------------- phases

    def phase(self, name, fn):
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
                if p.poll() is None:
                    p.kill()
        self.procs = [p for p in self.procs if p.poll() is None]
        r["phase_seconds"] = time.perf_counter() - t0
        self.res["phases"][name] = r
        self.save()
        return r

    def p_info(self):
        r = {}
        try:
            r["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used",
                                              "--format=csv,noheader"], capture_output=True, text=True,
                                             timeout=30).stdout.strip()
        except Exception as e:  # noqa: BLE001
            r["nvidia_smi"] = str(e)
        r["nvml"] = self.nvml.ok
        return r

    def p_bench(self):
        ptx = os.path.join(self.work, "noop.ptx")
        with open(ptx, "w") as f:
            f.write(".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry noop()\n{\n\tret;\n}\n")
        prog = os.path.join(self.bin, "migswap_testprog")
        n = str(self.a.launches)
        out = {}
        for label, shim in (("bare", False), ("shim", True), ("bare2", False), ("shim2", True)):
            e = self.env(shim, False, "bench")
            e["MIGSWAP_TEST_PTX"] = ptx
            p = subprocess.Popen([prog, "gpa", "bench", n], env=e, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            if shim:
                self.server.wait_pid(p.pid, timeout=60)
            so, se = p.communicate(timeout=120)
            res = [l for l in so.splitlines() if l.startswith("RESULT")]
            stats = [l for l in so.splitlines() if l.startswith("STATS")]
            if not res:
                raise RuntimeError(f"bench {label}: {so} {se}")
            kv = dict(x.split("=", 1) for x in res[0].split()[1:])
            out[label] = float(kv["ns_per_launch"])
            out[label + "_burst"] = float(kv.get("ns_per_launch_burst", "nan"))
            if stats:
                out[label + "_stats"] = stats[0]
            self.log(f"bench {label}: {kv['ns_per_launch']} ns/launch")
        out["overhead_ns"] = min(out["shim"], out["shim2"]) - min(out["bare"], out["bare2"])
        out["overhead_burst_ns"] = min(out["shim_burst"], out["shim2_burst"]) - min(out["bare_burst"], out["bare2_burst"])
        return out

    def p_train(self):
        """Bare and shim-without-swaps eager runs one after the other (overhead), then the eager
        and the CUDA-graph runs under swaps side by side, with the bare graph run beside them."""
        a = self.a
        A = self.train("eager_bare", False, False, a.steps)
        B = self.train("eager_shim_noswap", True, False, a.steps)
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
        ms = lambda x: x["done"]["ms_per_step"] if x["done"] else float("nan")  # noqa: E731
        eager = {
            "ms_bare": ms(A), "ms_shim": ms(B), "overhead_pct": 100 * (ms(B) / ms(A) - 1),
            "noswap_equal": B["losses"] == A["losses"],
            "swaps_equal": C["losses"] == A["losses"] and len(C["losses"]) == a.steps,
            "steps": len(C["losses"]), "cycles": C.get("cycles"), "swap_errors": C.get("swap_errors"),
            "n_errors": C.get("n_errors"), "bytes": C.get("bytes"), "nvml_drops": C.get("nvml_drops"),
            "out_wall_p50": C.get("out_wall_p50"), "in_wall_p50": C.get("in_wall_p50"),
            "first_losses": A["losses"][:3], "last_loss_bare": A["losses"][-1:], "last_loss_swaps": C["losses"][-1:],
            "rc": [A["rc"], B["rc"], C["rc"]], "device": C.get("device"),
        }
        graphs = {
            "swaps_equal": E["losses"] == D["losses"] and len(E["losses"]) == a.graph_steps,
            "steps": len(E["losses"]), "cycles": E.get("cycles"), "swap_errors": E.get("swap_errors"),
            "n_errors": E.get("n_errors"), "bytes": E.get("bytes"), "nvml_drops": E.get("nvml_drops"),
            "last_loss_bare": D["losses"][-1:], "last_loss_swaps": E["losses"][-1:], "rc": [D["rc"], E["rc"]],
            "out_wall_p50": E.get("out_wall_p50"), "in_wall_p50": E.get("in_wall_p50"),
        }
        self.res["phases"]["train_graphs"] = graphs
        return eager

    def p_overhead(self):
        """Training step time with the shim loaded and no swaps, against bare runs, alternated
        in pairs so that drift of the machine cancels; medians compared."""
        a = self.a
        ms = lambda x: x["done"]["ms_per_step"] if x["done"] else float("nan")  # noqa: E731
        bare, shim = [], []
        for i in range(a.overhead_pairs):
            bare.append(ms(self.train(f"overhead_bare{i}", False, False, a.overhead_steps)))
            shim.append(ms(self.train(f"overhead_shim{i}", True, False, a.overhead_steps)))
        return {"ms_bare": bare, "ms_shim": shim, "steps": a.overhead_steps,
                "overhead_pct": 100 * (statistics.median(shim) / statistics.median(bare) - 1)}

    def p_swap_throughput(self):
        a = self.a
        gib = a.gib
        if not a.no_checkpoint:
            # start the checkpoint-API victim now (no shim), so its start overlaps this phase
            try:
                self.ckpt_victim = self.hold("ckpt_victim", gib, False)
                self.ckpt_reserved = self.victim_reserved
            except Exception as e:  # noqa: BLE001
                self.log(f"checkpoint victim did not start early: {e}")
                self.ckpt_victim = None
        used0 = self.nvml.used()
        p, sums0 = self.hold("victim", gib, True, prepin=a.prepin)
        c = self.server.wait_pid(p.pid, timeout=60)
        used_in = self.nvml.used()
        # warm-up cycle: allocates the pinned arena once
        t0 = time.perf_counter()
        r, w = c.swap("swap_out")
        if not r.get("ok"):
            raise RuntimeError(f"warm-up swap_out: {r}")
        used_out = self.nvml.used()
        proc_out = self.nvml.proc_used(p.pid)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
        r2, w2 = c.swap("swap_in")
        warm = {"out_wall": w, "in_wall": w2, "total": time.perf_counter() - t0}
        self.log(f"warm-up cycle (pinned arena): out {w:.3f}s in {w2:.3f}s; NVML used before victim "
                 f"{used0 / GiB:.2f} GiB, resident {used_in / GiB:.2f} GiB, out {used_out / GiB:.2f} GiB; nvidia-smi {smi}")
        lat, sout, sin, win, bytes_ = [], [], [], [], 0
        for i in range(a.cycles):
            r, w = c.swap("swap_out")
            if not r.get("ok"):
                raise RuntimeError(f"swap_out {i}: {r}")
            lat.append(w)
            sout.append(float(r["seconds"]))
            bytes_ = int(r["bytes"])
            r, w = c.swap("swap_in")
            if not r.get("ok"):
                raise RuntimeError(f"swap_in {i}: {r}")
            win.append(w)
            sin.append(float(r["seconds"]))
        sums1 = self.check(p)
        self.stop(p)
        gibs = bytes_ / GiB
        res = {
            "gib": gibs, "cycles": a.cycles, "data_intact": sums0 == sums1,
            "out_gibps_p50": gibs / statistics.median(sout), "in_gibps_p50": gibs / statistics.median(sin),
            "out_gibps_min": gibs / max(sout), "in_gibps_min": gibs / max(sin),
            "latency_p50": pct(lat, 50), "latency_p99": pct(lat, 99), "latency_max": max(lat),
            "in_wall_p50": pct(win, 50), "in_wall_p99": pct(win, 99),
            "nvml_used_before_victim": used0, "nvml_used_resident": used_in, "nvml_used_out": used_out,
            "nvml_proc_out": proc_out, "nvidia_smi_out": smi, "warmup": warm,
        }
        self.log(f"shim {gibs:.1f} GiB: out {res['out_gibps_p50']:.1f} GiB/s, in {res['in_gibps_p50']:.1f} GiB/s, "
                 f"request->free p50 {res['latency_p50']:.3f}s p99 {res['latency_p99']:.3f}s, intact {res['data_intact']}")
        return res

    def p_checkpoint(self):
        early = getattr(self, "ckpt_victim", None)
        if early and early[0].poll() is None:
            p, sums0 = early
            gib = self.ckpt_reserved / GiB
        else:
            p, sums0 = self.hold("ckpt_victim", self.a.gib, False)
            gib = self.victim_reserved / GiB
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
        self.log(f"checkpoint API {gib} GiB: codes {codes}, lock {t_lock:.3f}s checkpoint {t_ck:.2f}s "
                 f"restore {t_rs:.2f}s unlock {t_un:.3f}s")
        return res

    def save(self):
        with open(os.path.join(self.out, "summary.json"), "w") as f:
            json.dump(self.res, f, indent=1, default=str)

    def table(self):
        ph = self.res["phases"]
        L = []
        g = lambda n, k, d=float("nan"): ph.get(n, {}).get(k, d)  # noqa: E731
        L.append("migswap on one H200 — summary" + (" (QUICK check run)" if self.a.quick else ""))
        L.append(f"GPU: {g('info', 'nvidia_smi', '?')}")
        L.append("")
        L.append(f"| measure | libmigswap.so | driver checkpoint API | target |")
        L.append(f"|---|---|---|---|")
        tp, ck = ph.get("swap_throughput", {}), ph.get("checkpoint", {})
        L.append(f"| swap-out of {tp.get('gib', self.a.gib):.2f} GiB (p50 over {self.a.cycles}) | "
                 f"{tp.get('out_gibps_p50', float('nan')):.1f} GiB/s (worst {tp.get('out_gibps_min', float('nan')):.1f}) | "
                 f"{ck.get('out_gibps', float('nan')):.2f} GiB/s ({ck.get('checkpoint_s', float('nan')):.2f} s) | >= 25, goal 40 GiB/s |")
        L.append(f"| swap-in of {tp.get('gib', self.a.gib):.2f} GiB | "
                 f"{tp.get('in_gibps_p50', float('nan')):.1f} GiB/s (worst {tp.get('in_gibps_min', float('nan')):.1f}) | "
                 f"{ck.get('in_gibps', float('nan')):.2f} GiB/s ({ck.get('restore_s', float('nan')):.2f} s) | >= 25, goal 40 GiB/s |")
        L.append(f"| request -> memory free, p50 / p99 of {self.a.cycles} | {tp.get('latency_p50', float('nan')):.3f} s / "
                 f"{tp.get('latency_p99', float('nan')):.3f} s | lock+checkpoint {ck.get('lock_s', 0) + ck.get('checkpoint_s', 0):.2f} s | <= 1 s, goal 0.5 s |")
        L.append(f"| data intact after swaps | {tp.get('data_intact')} | {ck.get('data_intact')} | True |")
        fr = lambda r: (r.get('nvml_used_resident', 0) - r.get('nvml_used_out', 0)) / GiB  # noqa: E731
        L.append(f"| device memory freed while out (NVML, whole GPU: resident -> out) | {fr(tp):.2f} GiB "
                 f"({tp.get('nvml_used_resident', -1) / GiB:.2f} -> {tp.get('nvml_used_out', -1) / GiB:.2f}) | {fr(ck):.2f} GiB "
                 f"({ck.get('nvml_used_resident', -1) / GiB:.2f} -> {ck.get('nvml_used_out', -1) / GiB:.2f}) | memory gone while out |")
        b = ph.get("bench", {})
        L.append(f"| cost per intercepted launch (C, no-op kernel, back to back) | {b.get('overhead_ns', float('nan')):.0f} ns "
                 f"({min(b.get('bare', 0), b.get('bare2', 0)):.0f} -> {min(b.get('shim', 0), b.get('shim2', 0)):.0f} ns/launch) | — | <= 1 us, goal 0.5 us |")
        L.append(f"| cost per intercepted launch (bursts of 32, queue not full) | {b.get('overhead_burst_ns', float('nan')):.0f} ns "
                 f"({min(b.get('bare_burst', 0), b.get('bare2_burst', 0)):.0f} -> {min(b.get('shim_burst', 0), b.get('shim2_burst', 0)):.0f} ns/launch) | — | <= 1 us, goal 0.5 us |")
        e = ph.get("train_eager", {})
        o = ph.get("overhead") or e
        L.append(f"| ResNet-18 training overhead, shim loaded, no swaps (medians) | {o.get('overhead_pct', float('nan')):+.2f}% "
                 f"(ms/step bare {o.get('ms_bare')}, shim {o.get('ms_shim')}) | — | <= 3%, goal 1% |")
        L.append("")
        gr = ph.get("train_graphs", {})
        L.append(f"| training check | steps | swap cycles | losses equal to the run without the shim | swap errors |")
        L.append(f"|---|---|---|---|---|")
        L.append(f"| eager, MIGSWAP_CHECKSUM=1 | {e.get('steps')} | {e.get('cycles')} | {e.get('swaps_equal')} | {e.get('n_errors')} |")
        L.append(f"| CUDA graphs, MIGSWAP_CHECKSUM=1 | {gr.get('steps')} | {gr.get('cycles')} | {gr.get('swaps_equal')} | {gr.get('n_errors')} |")
        L.append(f"eager: shim without swaps equal: {e.get('noswap_equal')}; "
                 f"footprint swapped {e.get('bytes')} B; NVML (before, while out): {e.get('nvml_drops')}")
        L.append(f"graphs: footprint swapped {gr.get('bytes')} B; NVML (before, while out): {gr.get('nvml_drops')}")
        for n, r in ph.items():
            if not r.get("ok", True):
                L.append(f"PHASE {n} FAILED: {r.get('error')}")
        return "\n".join(L)

    def run(self):
        a = self.a
        self.phase("info", self.p_info)
        self.phase("bench", self.p_bench)
        self.phase("train_eager", self.p_train)
        if a.overhead_pairs > 0:
            self.phase("overhead", self.p_overhead)
        self.phase("swap_throughput", self.p_swap_throughput)
        if not a.no_checkpoint:
            self.phase("checkpoint", self.p_checkpoint)
        t = self.table()
        print(t, flush=True)
        with open(os.path.join(self.out, "summary.txt"), "w") as f:
            f.write(t + "\n")
        self.save()
        with tarfile.open(os.path.join(self.out, "logs.tgz"), "w:gz") as tf:
            tf.add(self.work, arcname="swap-h200")


def cmd_drive(a):
    Driver(a).run()


# --------------------------------------------------------------------------- selftest (fake driver)

def cmd_selftest(a):
    """Protocol server + swap cycles against the fake libcuda and the C test program."""
    b = os.path.abspath(a.bin)
    work = a.work or f"/tmp/swap-selftest-{os.getpid()}"
    os.makedirs(work, exist_ok=True)
    srv = Server(os.path.join(work, "s.sock"), print)
    e = dict(os.environ, LD_PRELOAD=os.path.join(b, "libmigswap.so"), MIGSWAP_SOCKET=srv.path,
             LD_LIBRARY_PATH=os.path.join(b, "fakecuda"), MIGSWAP_CHECKSUM="1",
             FAKECUDA_STATS=os.path.join(work, "stats"))
    p = subprocess.Popen([os.path.join(b, "migswap_testprog"), "gpa", "loop", "3", str(4 << 20)], env=e,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    c = srv.wait_pid(p.pid, 20)
    assert p.stdout.readline().startswith("READY")
    lat = []
    for _ in range(a.cycles):
        r, w = c.swap("swap_out")
        assert r["ok"], r
        lat.append(w)
        r, _ = c.swap("swap_in")
        assert r["ok"], r
    out, _ = p.communicate("stop\n", timeout=30)
    res = [l for l in out.splitlines() if l.startswith("RESULT")]
    print(res[0] if res else out)
    ok = bool(res) and " ok=1 " in res[0] + " "
    print(f"selftest: {a.cycles} cycles, request->free p50 {pct(lat, 50) * 1000:.2f} ms, "
          f"progress messages {c.progress}, usage {c.usage} B: {'PASS' if ok else 'FAIL'}")
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


def main():
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
    h = sub.add_parser("hold")
    h.add_argument("--gib", type=float, default=16)
    d = sub.add_parser("drive")
    d.add_argument("--bin", default="bin")
    d.add_argument("--out", required=True)
    d.add_argument("--work", default="")
    d.add_argument("--quick", action="store_true")
    d.add_argument("--steps", type=int, default=130)
    d.add_argument("--batch", type=int, default=64)
    d.add_argument("--res", type=int, default=112)
    d.add_argument("--gib", type=float, default=16)
    d.add_argument("--cycles", type=int, default=20)
    d.add_argument("--launches", type=int, default=50000)
    d.add_argument("--phase-timeout", type=float, default=300)
    d.add_argument("--no-checkpoint", action="store_true")
    d.add_argument("--graph-steps", type=int, default=0, help="steps of the CUDA-graph runs (default 2x --steps)")
    d.add_argument("--overhead-pairs", type=int, default=3, help="alternated bare/shim timing runs (0: none)")
    d.add_argument("--overhead-steps", type=int, default=400)
    d.add_argument("--prepin", action="store_true", help="run the 16 GiB victim with MIGSWAP_PREPIN=1")
    s = sub.add_parser("selftest")
    s.add_argument("--bin", default="bin")
    s.add_argument("--work", default="")
    s.add_argument("--cycles", type=int, default=20)
    a = ap.parse_args()
    if a.cmd == "drive" and a.quick:
        a.steps, a.gib, a.cycles, a.launches = min(a.steps, 40), min(a.gib, 2), min(a.cycles, 3), min(a.launches, 20000)
        a.phase_timeout = min(a.phase_timeout, 90)
        a.overhead_pairs, a.overhead_steps = min(a.overhead_pairs, 1), min(a.overhead_steps, 60)
    if a.cmd == "drive" and not a.graph_steps:
        a.graph_steps = 2 * a.steps
    {"train": cmd_train, "hold": cmd_hold, "drive": cmd_drive, "selftest": cmd_selftest}[a.cmd](a)


if __name__ == "__main__":
    main()
