"""A killed rank makes every other rank raise: ranks all-reduce in a loop,
rank --kill SIGKILLs itself at step 5, the others must raise a MigctlError
(peer dead, aborted or deadline) instead of hanging. Started by the Go test
with its own rendezvous (migctl run would SIGTERM the survivors itself).
A survivor prints one JSON line and exits 0 when it raised."""

import argparse
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import migctl_torch  # noqa: E402,F401


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kill", type=int, default=1)
    a = ap.parse_args()
    dist.init_process_group("migctl")
    rank = dist.get_rank()
    t = torch.ones(4096)
    start = time.time()
    for step in range(100000):
        if rank == a.kill and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(t)
        except RuntimeError as e:  # a MigctlError
            if "migctl" not in str(e):
                raise
            print(json.dumps({"rank": rank, "raised": True, "step": step, "error": str(e)}), flush=True)
            sys.exit(0)
        if time.time() - start > 120:
            break
    print(json.dumps({"rank": rank, "raised": False}), flush=True)
    sys.exit(1)


if __name__ == "__main__":
    main()
