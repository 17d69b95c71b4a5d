"""Where one training step's time went, from a --profile trace of ddp_resnet.py
or ddp_gpt.py (torch.profiler's Chrome trace, .json or .json.gz):

    python3 examples/pytorch/profile_summary.py OUT/resnet8.rank0.json.gz [--step N]

Prints, in ms from the start of the step: the annotated ranges (forward,
backward, optimizer), the busy time of each CPU thread that ran operators and
its gaps of more than --gap ms (a backward thread idle at the end of the
backward pass is waiting for the last gradient bucket), the largest operators
by self-contained time, and the copies (device to host, host to device, device
to device) merged into runs per stream, with their bytes."""

import argparse
import collections
import gzip
import json


def _annotation(name):
    """A range train() or torch annotates (what torch 1.13's CPU-only trace
    does not tell apart from operators)."""
    return name.startswith(("train_step_", "Optimizer.", "DistributedDataParallel.")) or name == "backward"


def load(path):
    """The trace's events: torch 2.x writes an object with categories (cat),
    torch 1.13 on CPU a bare array without them (ranges told by name)."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        d = json.load(f)
    ev = d["traceEvents"] if isinstance(d, dict) else d
    for e in ev:
        if "cat" not in e and e.get("ph") == "X":
            e["cat"] = "user_annotation" if _annotation(e.get("name", "")) else "cpu_op"
    return ev


def top_level(events):
    """The events not nested in an earlier one (one thread's, sorted)."""
    out, end = [], -1.0
    for e in sorted(events, key=lambda e: e["ts"]):
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e.get("dur", 0)
    return out


def print_gaps(events, ms, gap):
    """Prints the stretches of more than gap ms in which none of events (sorted
    by start; they may overlap) was running."""
    end = events[0]["ts"]
    for e in events:
        if (e["ts"] - end) / 1000 > gap:
            print(f"    gap {(e['ts'] - end) / 1000:6.2f} ms, until {ms(e['ts']):7.2f} ({e['name'][:60]})")
        end = max(end, e["ts"] + e.get("dur", 0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--step", type=int, default=-1, help="which train_step_N (default: the second profiled)")
    ap.add_argument("--gap", type=float, default=0.3, help="report CPU gaps longer than this (ms)")
    ap.add_argument("--ops", type=int, default=10, help="operators to list per thread")
    args = ap.parse_args()
    ev = load(args.trace)
    steps = sorted((e for e in ev if e.get("cat") == "user_annotation" and e.get("name", "").startswith("train_step_")),
                   key=lambda e: e["ts"])
    if not steps:
        raise SystemExit(f"{args.trace}: no train_step_N range (was it written by examples/pytorch --profile?)")
    if args.step >= 0:
        steps = [s for s in steps if s["name"] == f"train_step_{args.step}"]
        if not steps:
            raise SystemExit(f"{args.trace}: no train_step_{args.step}")
    st = steps[min(1, len(steps) - 1)] if args.step < 0 else steps[0]
    t0, t1 = st["ts"], st["ts"] + st["dur"]

    def ms(ts):
        return (ts - t0) / 1000

    inside = [e for e in ev if "ts" in e and t0 <= e["ts"] <= t1]
    print(f"{st['name']}: {st['dur'] / 1000:.2f} ms")
    for e in sorted((e for e in inside if e.get("cat") == "user_annotation" and e is not st), key=lambda e: e["ts"]):
        print(f"  {ms(e['ts']):7.2f} +{e['dur'] / 1000:6.2f}  {e['name']}")

    threads = collections.defaultdict(list)
    for e in inside:
        if e.get("cat") == "cpu_op":
            threads[e["tid"]].append(e)
    for tid, es in threads.items():
        top = top_level(es)
        busy = sum(e.get("dur", 0) for e in top) / 1000
        print(f"thread {tid}: {len(es)} operators, busy {busy:.2f} ms between {ms(top[0]['ts']):.2f} and "
              f"{ms(top[-1]['ts'] + top[-1].get('dur', 0)):.2f}")
        print_gaps(top, ms, args.gap)
        n, d = collections.Counter(), collections.Counter()
        for e in top:
            n[e["name"]] += 1
            d[e["name"]] += e.get("dur", 0)
        for name, total in d.most_common(args.ops):
            print(f"    {total / 1000:6.2f} ms in {n[name]:4d}  {name[:80]}")

    kernels = [e for e in ev if e.get("cat") == "kernel" and t0 <= e["ts"] <= t1]
    print(f"kernels: {len(kernels)}, GPU time {sum(e['dur'] for e in kernels) / 1000:.2f} ms")
    if kernels:  # this rank's GPU timeline: when its kernels ran and where they stopped (waiting for data or the CPU)
        ks = sorted(kernels, key=lambda e: e["ts"])
        print(f"  from {ms(ks[0]['ts']):.2f} to {ms(max(e['ts'] + e['dur'] for e in ks)):.2f}; "
              f"idle gaps over {args.gap} ms:")
        print_gaps(ks, ms, args.gap)
    copies = sorted((e for e in ev if e.get("cat") == "gpu_memcpy" and t0 <= e["ts"] <= t1 + 20000),
                    key=lambda e: e["ts"])
    runs = []  # [kind, stream, start, end, bytes, n]
    for e in copies:
        kind, stream = e["name"].split(" (")[0], e["args"].get("stream")
        b = e["args"].get("bytes", 0)
        r = next((r for r in reversed(runs) if r[0] == kind and r[1] == stream), None)
        if r is not None and e["ts"] - r[3] < 200:
            r[3], r[4], r[5] = max(r[3], e["ts"] + e["dur"]), r[4] + b, r[5] + 1
        else:
            runs.append([kind, stream, e["ts"], e["ts"] + e["dur"], b, 1])
    print("copies (runs with gaps under 0.2 ms; the step ends at %.2f):" % ms(t1))
    for kind, stream, s, e, b, n in runs:
        if b >= 1 << 20:
            print(f"  {ms(s):7.2f} .. {ms(e):7.2f}  {kind:<12} stream {stream}: {b / 1e6:7.2f} MB in {n}")


if __name__ == "__main__":
    main()
