"""migctl_torch: the torch.distributed backend "migctl".

``import migctl_torch`` registers the backend; then, in a process started by
``migctl run``::

    dist.init_process_group("migctl")

runs torch.distributed's collectives (and so DDP and FSDP) over migctl's
trainer SDK in libmigctl.so: shared host memory between MIG instances of a
GPU, CUDA IPC between whole GPUs, host memory without a GPU. For a model that
keeps another default backend, ``model.register_comm_hook(None,
migctl_torch.allreduce_hook)`` averages DDP's gradient buckets with migctl.

Implemented: allreduce (SUM, AVG, MIN, MAX on float32, float16, bfloat16,
float64, int32, int64, uint8), allgather, all_gather_into_tensor
(_allgather_base), reduce_scatter, reduce_scatter_tensor
(_reduce_scatter_base), broadcast, barrier, the coalesced variants, and reduce,
gather, scatter and all-to-all of equal or uneven blocks (built on the others,
for small tensors), send and recv (isend, irecv, batch_isend_irecv: between
ranks of one node, each direction a link of its own beside the collectives), on CPU
and CUDA tensors, async (Work with wait() and get_future()). Other calls raise
NotImplementedError naming the call. A job across nodes (`migctl run --nnodes
N`) runs hierarchically: migctl within each node, gloo between the nodes
(multinode.py). The library: MIGCTL_LIB, next to this package, the
repository's bin/, or next to the migctl binary.
"""

import inspect

import torch.distributed as dist

from ._lib import ABI_VERSION, MigctlError
from .process_group import SUPPORTED, ProcessGroupMigctl, allreduce_hook, create_extended

__all__ = ["ABI_VERSION", "MigctlError", "ProcessGroupMigctl", "SUPPORTED", "allreduce_hook",
           "BACKEND"]

BACKEND = "migctl"


def _register():
    if getattr(dist.Backend, BACKEND.upper(), None) is not None:
        return  # registered already (a second import)
    kwargs = {"extended_api": True}  # the creator gets the group's name too
    params = inspect.signature(dist.Backend.register_backend).parameters
    if "devices" in params:  # torch 2.x: the devices the backend serves
        kwargs["devices"] = ["cpu", "cuda"]
    dist.Backend.register_backend(BACKEND, create_extended, **kwargs)


_register()
