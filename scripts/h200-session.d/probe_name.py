# The probe of call 4 (2026-12-02, sixth part): what torch 2.x passes the creator, and whether
# _set_group_name makes group_name readable on a Python group. Run: bin/migctl run --gpus 0 --np 1 -- python3 THIS
import sys, os
sys.path.insert(0, "python")
import torch, torch.distributed as dist
import migctl_torch
from migctl_torch import process_group as pgm
orig = pgm.create_extended
def spy(opts, pg_options=None):
    print("opts attrs:", [a for a in dir(opts) if not a.startswith("__")], "group_id:", repr(getattr(opts, "group_id", None)), flush=True)
    pg = orig(opts, pg_options)
    print("has _set_group_name:", hasattr(pg, "_set_group_name"), flush=True)
    try:
        print("group_name after create:", pg.group_name, flush=True)
    except Exception as e:
        print("group_name after create raised:", e, flush=True)
    return pg
dist.Backend._plugins["MIGCTL"] = dist.Backend._plugins["MIGCTL"]._replace(creator_fn=spy)
dist.init_process_group("migctl")
pg = dist.group.WORLD
print("world type:", type(pg), flush=True)
try:
    print("world group_name:", pg.group_name)
except Exception as e:
    print("world group_name raised:", e)
print("pg_names:", dist.distributed_c10d._world.pg_names.get(pg))
import inspect
src = inspect.getsource(dist.distributed_c10d._new_process_group_helper)
i = src.find("issubclass(type(backend_class), ProcessGroup)")
print(src[i-200:i+900])
