"""init_process_group("migctl", timeout=...) is the collectives' deadline: a
rank that stays in the job but stops calling makes the others raise a
timeout error once it has passed, not at the launcher's deadline
(MIGCTL_TIMEOUT, `migctl run --timeout`); without a timeout the launcher's
stays:

    migctl run --sim h200x8 --profile 1g.18gb --np 2 --timeout 60s -- \\
        python3 python/tests/timeout_check.py --timeout 2

Rank 1 sleeps --sleep seconds instead of its second all-reduce; rank 0 must
raise within [timeout, timeout + 5 s). Prints one JSON line per rank;
exits 1 on failure."""

import argparse
import json
import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import migctl_torch  # noqa: E402,F401  (registers the backend)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=2.0, help="init_process_group's timeout, seconds")
    ap.add_argument("--sleep", type=float, default=8.0, help="how long rank 1 does not call")
    a = ap.parse_args()
    dist.init_process_group("migctl", timeout=timedelta(seconds=a.timeout))
    rank = dist.get_rank()
    failures = []
    t = torch.ones(1000)
    dist.all_reduce(t)  # everybody is in the job
    if rank == 1:
        time.sleep(a.sleep)
        print(json.dumps({"rank": rank, "failures": []}), flush=True)
        return
    t0 = time.perf_counter()
    err = None
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        err = e
    secs = time.perf_counter() - t0
    if err is None:
        failures.append("no error")
    elif "timeout" not in str(err).lower() and "deadline" not in str(err).lower():
        failures.append(f"not a timeout: {err}")
    if not a.timeout <= secs < a.timeout + 5:
        failures.append(f"raised after {secs:.2f} s, want within [{a.timeout}, {a.timeout + 5})")
    print(json.dumps({"rank": rank, "seconds": round(secs, 3), "error": str(err)[:300], "failures": failures}), flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
