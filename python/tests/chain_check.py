"""Asynchronous all-reduces issued back to back, as DDP issues its gradient
buckets: the library lets a large host-staged all-reduce's successor start
once its copies out are done (MIGCTL_TUNING=chain=off: not), so this checks
every element of calls of many sizes (below the small-message limit up to
several arena chunks) and dtypes, all issued before any is waited for, with
a chain of in-place calls on one tensor among them (each must read what the
one before wrote), one whose input is the previous call's output, and one on
a second group (which must not run beside the job's chained calls). Some
calls are waited for through their Future (DDP's way). On CUDA tensors the
waits may return while a call's last copies back still run, the current
stream ordered after them (migctl_wait_stream, MIGCTL_STAT_EARLY): the
results are read through that stream only, never after a device-wide
synchronize. Run under `migctl run --np 2` or more; --device cuda for CUDA
tensors. Prints one JSON line per rank; exits 1 on failure."""

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import migctl_torch  # noqa: E402,F401  (registers the backend)
from migctl_torch import _lib  # noqa: E402

SIZES = [1, 100, 16384, 65537, 300000, 1 << 20, 3 << 20 | 5]  # elements
DTYPES = [torch.float32, torch.int32, torch.float64]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--expect-chained", choices=["auto", "yes", "no"], default="auto",
                    help="whether some all-reduces must have let the next call start early (the library's "
                         "MIGCTL_STAT_CHAINED); auto: yes unless MIGCTL_TUNING has chain=off")
    ap.add_argument("--expect-early", choices=["auto", "yes", "no"], default="auto",
                    help="whether some waits must have returned before their all-reduce ended (the library's "
                         "MIGCTL_STAT_EARLY); auto: yes on CUDA tensors where MIGCTL_TUNING has complete=device "
                         "or complete=queued and not chain=off, else no (with complete=queued, some all-reduces "
                         "must also have queued their copies back at once: MIGCTL_STAT_QUEUED_BACK)")
    args = ap.parse_args()
    if args.device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("MIGCTL_DEVICE", "0")))
    dist.init_process_group("migctl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device(args.device)
    rng = random.Random(args.seed)  # the same calls on every rank
    failures = []
    plan, works, tensors = [], [], []
    chain = torch.full((1 << 19,), float(rank + 1), device=dev)  # 2 MiB of float32
    # a group of all the ranks beside the job's: its calls must not run beside a chained one of the job's
    sub = dist.new_group(list(range(world)))
    sub_t = torch.full((1 << 20,), float(rank), device=dev)
    chain_calls = 0
    stats0 = _lib.load().stats()
    t0 = time.perf_counter()
    for k in range(args.calls):
        n, dt = rng.choice(SIZES), rng.choice(DTYPES)
        # exact in every dtype: integers below 2^24 after the sum
        t = ((torch.arange(n, device=dev) % 1000) + rank * 7 + k).to(dt)
        plan.append((k, n, dt))
        tensors.append(t)
        w = dist.all_reduce(t, async_op=True)
        works.append(w.get_future() if k % 4 == 1 else w)  # DDP waits for its buckets' Futures
        if k == 12:
            works.append(dist.all_reduce(sub_t, group=sub, async_op=True))
        if k % 7 == 3 and chain_calls < 4:  # the in-place chain, two calls in a row (4 in all: exact in float32)
            for _ in range(2):
                works.append(dist.all_reduce(chain, async_op=True))
                chain_calls += 1
    # an input that is the previous call's output (issued before that one is done)
    last = tensors[-1]
    works.append(dist.all_reduce(last, async_op=True))
    issued = time.perf_counter() - t0
    for w in works:
        w.wait()
    if dev.type == "cuda":
        torch.cuda.current_stream().synchronize()  # the results are ordered on this stream, not device-wide
    took = time.perf_counter() - t0
    for (k, n, dt), t in zip(plan, tensors):
        base = (torch.arange(n) % 1000).to(torch.float64) * world + sum(r * 7 + k for r in range(world))
        if t is last:
            base = base * world
        got = t.cpu().to(torch.float64)
        if not torch.equal(got, base):
            bad = int((got != base).sum())
            failures.append(f"call {k} ({n} x {dt}): {bad} wrong, e.g. {got[(got != base).nonzero()[0]].item()}")
    stats = _lib.load().stats()
    chained = stats.get("chained", 0) - stats0.get("chained", 0)
    early = stats.get("early", 0) - stats0.get("early", 0)
    queued = stats.get("queued_back", 0) - stats0.get("queued_back", 0)
    tuning = os.environ.get("MIGCTL_TUNING", "")
    early_on = "complete=device" in tuning or "complete=queued" in tuning
    want_early = args.expect_early
    if want_early == "auto":
        want_early = "yes" if dev.type == "cuda" and "chain=off" not in tuning and early_on else "no"
    # a call that fits the arena's slots queues its copies back at once with complete=queued (and only then)
    want_queued = dev.type == "cuda" and "chain=off" not in tuning and "complete=queued" in tuning
    if want_queued and queued == 0:
        failures.append("no all-reduce queued its copies back at once (MIGCTL_STAT_QUEUED_BACK did not move)")
    if not want_queued and queued != 0:
        failures.append(f"{queued} all-reduces queued their copies back without complete=queued")
    if want_early == "yes" and early == 0:
        failures.append("no wait returned before its all-reduce ended (MIGCTL_STAT_EARLY did not move)")
    if want_early == "no" and early != 0:
        failures.append(f"{early} waits returned before their all-reduce ended")
    expect = args.expect_chained
    if expect == "auto":
        expect = "no" if "chain=off" in os.environ.get("MIGCTL_TUNING", "") else "yes"
    if expect == "yes" and chained == 0:
        failures.append("no all-reduce let the next call start early (MIGCTL_STAT_CHAINED did not move)")
    if expect == "no" and chained != 0:
        failures.append(f"{chained} all-reduces chained with chaining off")
    if args.calls > 12 and not torch.all(sub_t.cpu() == world * (world - 1) / 2).item():
        failures.append(f"all-reduce on a second group: {sub_t[:3].tolist()}, want {world * (world - 1) / 2}")
    want = world * (world + 1) / 2 * world ** (chain_calls - 1)
    if not torch.all(chain.cpu() == want).item():
        failures.append(f"in-place chain of {chain_calls} calls: {chain[:3].tolist()}, want {want}")
    print(json.dumps({"rank": rank, "world": world, "device": str(dev), "calls": len(works),
                      "issue_ms": round(issued * 1e3, 2), "total_ms": round(took * 1e3, 2), "chained": chained, "early": early,
                      "queued_back": queued, "failures": failures}), flush=True)
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
