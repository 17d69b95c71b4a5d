"""Session tool: run a command on this rank's own CPUs, then exec it:
    migctl run --np 7 -- python3 scripts/h200-session.d/pin_rank.py python3 train.py
LOCAL_RANK r of LOCAL_WORLD_SIZE w gets CPUs [r*k, (r+1)*k) of the CPUs this
process may use, k = max(1, cpus // w) (PIN_CPUS overrides k). What the
launcher's CPU binding would do, measured before building it."""
import os
import sys

cpus = sorted(os.sched_getaffinity(0))
w = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
r = int(os.environ.get("LOCAL_RANK", "0"))
k = int(os.environ.get("PIN_CPUS", "0")) or max(1, len(cpus) // w)
mine = [cpus[(r * k + i) % len(cpus)] for i in range(k)]
os.sched_setaffinity(0, mine)
os.execvp(sys.argv[1], sys.argv[1:])
