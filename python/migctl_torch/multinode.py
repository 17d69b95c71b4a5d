"""The migctl backend across nodes: migctl inside each node, gloo between them.

A migctl group spans one node (its ranks share memory). In a job of N nodes
of L ranks each (`migctl run --nnodes N --np L`: GROUP_WORLD_SIZE=N,
GROUP_RANK=n, LOCAL_WORLD_SIZE=L, LOCAL_RANK=l, RANK=n*L+l), every node forms
its own migctl group (local rank 0 hosts its rendezvous in libmigctl and
hands the address to the others through torch's store; the shared-memory
segment is named after the job and the node), and each local rank l joins a
gloo group of the N ranks with local rank l, one per node ("cross" group).
Collectives are hierarchical, Horovod-style, so every rank moves 1/L of the
inter-node traffic:

  all-reduce      intra-node reduce-scatter (rank l holds the node's sum of
                  shard l) -> cross-node all-reduce of shard l over gloo ->
                  intra-node all-gather of the shards;
  all-gather      cross-node all-gather of the input (rank l gets the inputs
                  of local rank l of every node) -> intra-node all-gather ->
                  a transpose into rank order;
  reduce-scatter  a transpose so that rank l's block holds the blocks of local
                  rank l of every node -> intra-node reduce-scatter ->
                  cross-node all-reduce of that block (gloo has no
                  reduce-scatter on torch 1.13) -> this rank's part;
  broadcast       intra-node on the root's node -> the root's local rank
                  across nodes -> intra-node on the other nodes;
  barrier         intra-node, then across nodes.

AVG is a sum divided by the world size at the end (integers truncate, as the
library's AVG does). gloo lacks bfloat16 on torch 1.13: such shards cross
nodes as float32. CUDA tensors cross nodes through host memory over gloo, or
with MIGCTL_INTER_NODE=nccl over NCCL in device memory (one NCCL communicator
per local rank, of one rank per node; torch 2.x).

Every collective runs, in issue order, on one thread of this module (the
stages wait for each other); a call returns a Work at once.
"""

import collections
import os
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _futures, _lib

_ENV = ("GROUP_RANK", "GROUP_WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def _env_int(name, default=None):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise RuntimeError(f"migctl backend: {name}={v!r} is not an integer") from None


def nodes():
    """(node, nodes, local rank, local size) from the launcher's environment;
    nodes is 1 when the job runs on one node."""
    n, N = _env_int("GROUP_RANK", 0), _env_int("GROUP_WORLD_SIZE", 1)
    lr, L = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", 1)
    return n, N, lr, L


def spans_nodes():
    return _env_int("GROUP_WORLD_SIZE", 1) > 1


# Works kept alive until consumed (torch reaches them from C++ only while the
# Python object lives; see process_group.Work).
_KEEP = 4096


class HierWork(dist._Work):
    """A hierarchical collective: done when the module's thread has run all
    its stages. wait() blocks and raises its error; get_future() is a torch
    Future with the output tensors."""

    def __init__(self, hier, name, result, devices):
        super().__init__()
        self._hier = hier
        self._name = name
        self._result = result
        self._devices = devices
        self._done = threading.Event()
        self._exc = None
        self._future = None  # handed out by get_future (_futures.pair's outer)
        self._inner = None  # the Future this Work settles
        self._consumed = False
        self._lock = threading.Lock()

    def _finish(self, exc):
        with self._lock:
            self._exc = exc
            self._done.set()
            inner = self._inner
        self._hier._finished(self)
        if inner is not None:
            _futures.settle(inner, self._result, self._exc)

    def wait(self, timeout=None):
        if not self._done.is_set() and threading.get_ident() == self._hier._ident:
            self._hier._help(self)  # a Future's callback on the module's thread
        secs = None
        if isinstance(timeout, timedelta) and timeout.total_seconds() > 0:
            secs = timeout.total_seconds()
        if not self._done.wait(secs):
            raise RuntimeError(f"migctl {self._name}: not finished after {timeout}")
        self._consumed = True
        self._hier._finished(self)
        if self._exc is not None:
            raise self._exc
        return True

    def get_future(self):
        if not self._done.is_set() and threading.get_ident() == self._hier._ident:
            self._hier._help(self)  # a Future's callback on the module's thread
        with self._lock:
            self._consumed = True
            if self._future is not None:
                return self._future
            self._inner, self._future = _futures.pair(self._devices)
            fut, done = self._future, self._done.is_set()
        if done:
            _futures.settle(self._inner, self._result, self._exc)
            self._hier._finished(self)
        return fut

    def is_completed(self):
        return self._done.is_set()

    def is_success(self):
        return self._done.is_set() and self._exc is None

    def exception(self):
        return self._exc

    def result(self):
        return self._result


def world_size():
    """The job's number of ranks (WORLD_SIZE)."""
    return _env_int("WORLD_SIZE", -1)


def node_of(rank):
    """The node of a rank of the job (RANK = GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK)."""
    return rank // _env_int("LOCAL_WORLD_SIZE", 1)


def no_job_group(size):
    """The error of a group of some of the ranks formed before the job's
    migctl group (which it is formed from)."""
    return NotImplementedError(
        f"migctl backend: a group of {size} of the job's ranks needs the job's migctl group first: "
        "init_process_group('migctl'), or dist.new_group(backend='migctl') of every rank, before "
        "new_group(ranks=[...], backend='migctl')")


def _gloo(store, rank, size, timeout):
    if not isinstance(timeout, timedelta):
        timeout = timedelta(minutes=30)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _nccl(store, rank, size, timeout):
    """NCCL across nodes for CUDA tensors (MIGCTL_INTER_NODE=nccl; torch 2.x)."""
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        raise RuntimeError("migctl backend: MIGCTL_INTER_NODE=nccl, but this torch has no CUDA or no NCCL")
    opts = dist.ProcessGroupNCCL.Options()
    if isinstance(timeout, timedelta):
        try:
            opts._timeout = timeout
        except AttributeError:
            pass
    return dist.ProcessGroupNCCL(store, rank, size, opts)


INTER_NODE = "MIGCTL_INTER_NODE"  # gloo (default) or nccl: what CUDA tensors cross nodes with


def _bytes(t):
    """A contiguous 1-D uint8 view of a contiguous tensor's bytes."""
    t = t.reshape(-1)
    if t.dtype == torch.uint8:
        return t
    return t.view(torch.uint8)


class Hier:
    """This process's part of a job across nodes (see the module doc). The
    interface is process_group._Comm's (rank, size, allreduce, ...)."""

    _instance = None
    _imu = threading.Lock()

    @classmethod
    def get(cls, store, rank, size, timeout):
        with cls._imu:
            h = cls._instance
            if h is None or h.pid != os.getpid():
                h = cls._instance = Hier(store, rank, size, timeout)
            elif (rank, size) != (h.rank, h.size):
                raise RuntimeError(
                    f"migctl backend: the job's group as rank {rank} of {size} in a process that is rank {h.rank} "
                    f"of {h.size}")
            return h

    @classmethod
    def for_group(cls, store, rank, size, timeout, ranks=None):
        """The job's group (size: every rank), or a group of some of its
        ranks (ranks: their ranks in the job): on this node, it runs on the
        node's migctl group (migctl_new_group of their local ranks); across
        nodes, over gloo (Hier.across)."""
        if ranks is None:
            return cls.get(store, rank, size, timeout)
        if len({node_of(r) for r in ranks}) > 1:
            return cls.across(store, rank, size, timeout)
        from .process_group import _SubComm  # noqa: PLC0415 - cycle
        with cls._imu:
            h = cls._instance if cls._instance is not None and cls._instance.pid == os.getpid() else None
        if h is None:
            raise no_job_group(size)
        return _SubComm.form(h.local, store, rank, size, timeout, ranks=[r - h.node * h.lsize for r in ranks])

    @classmethod
    def across(cls, store, rank, size, timeout):
        """A group of some of the ranks on several nodes: to the stages of
        this class each member is a node of its own (one local rank), so
        every collective is its cross stage alone, over a gloo group of the
        members (the wire the job's group crosses nodes with), with this
        class's handling of AVG, bfloat16 and the flat variants gloo lacks."""
        h = cls.__new__(cls)
        h._start(rank, size, rank, size, 0, 1, timeout, None, _gloo(store, rank, size, timeout), None)
        return h

    def __init__(self, store, rank, size, timeout):
        from .process_group import _Comm  # noqa: PLC0415 - cycle

        n, N, lr, L = nodes()
        if N * L != size or n * L + lr != rank or not (0 <= lr < L and 0 <= n < N):
            raise RuntimeError(
                f"migctl backend: rank {rank} of {size} is not node {n} of {N} x local rank {lr} of {L} "
                f"(RANK = GROUP_RANK*LOCAL_WORLD_SIZE + LOCAL_RANK): start every node with `migctl run "
                "--nnodes N --node-rank i --np L` and the same --np")
        # the node's migctl group: local rank 0 hosts its rendezvous
        key = f"migctl/node{n}/rendezvous"
        if lr == 0:
            addr = _lib.load().serve(L)
            store.set(key, addr)
        else:
            addr = store.get(key).decode()
        job = (os.environ.get("MIGCTL_JOB") or "trainer") + f"-node{n}"
        local = _Comm.get_node(lr, L, addr, job)
        local.set_timeout(timeout)
        # local rank lr's gloo group across nodes
        cross = _gloo(dist.PrefixStore(f"migctl/cross{lr}/", store), n, N, timeout) if N > 1 else None
        inter = (os.environ.get(INTER_NODE) or "gloo").lower()
        if inter not in ("gloo", "nccl"):
            raise RuntimeError(f"migctl backend: {INTER_NODE}={inter!r}: want gloo or nccl")
        # NCCL for CUDA tensors (its communicator is made at the first collective)
        cross_cuda = None
        if inter == "nccl" and N > 1:
            cross_cuda = _nccl(dist.PrefixStore(f"migctl/cross-nccl{lr}/", store), n, N, timeout)
        self._start(rank, size, n, N, lr, L, timeout, local, cross, cross_cuda)

    def _start(self, rank, size, n, N, lr, L, timeout, local, cross, cross_cuda):
        """Sets the group's shape and stages up and starts its thread."""
        self.pid = os.getpid()
        self.rank, self.size = rank, size
        self.node, self.nodes, self.lrank, self.lsize = n, N, lr, L
        self.timeout = timeout
        self.local, self.cross, self.cross_cuda = local, cross, cross_cuda
        self._q = collections.deque()
        self._cv = threading.Condition()
        self._live = collections.OrderedDict()  # id -> HierWork not yet finished and consumed
        self._mu = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="migctl-multinode", daemon=True)
        self._thread.start()
        self._ident = self._thread.ident

    # --- the thread ---------------------------------------------------------

    def _run(self):
        while True:
            with self._cv:
                while not self._q:
                    self._cv.wait()
                item = self._q.popleft()
            self._step(*item)
            item = None

    def _help(self, w):
        """Runs the queued jobs, in order, until w has finished, on the
        thread itself: a Future's callback there that waits for a collective
        it issued (PowerSGD's hook) would otherwise wait for the thread it
        blocks."""
        while not w._done.is_set():
            with self._cv:
                item = self._q.popleft()  # w is queued: not empty
            self._step(*item)

    def _step(self, work, job, stream):
        exc = None
        try:
            if stream is not None:
                side, ev = stream
                side.wait_event(ev)
                with torch.cuda.stream(side):
                    job()
                side.synchronize()
            else:
                job()
        except Exception as e:  # noqa: BLE001 - handed to the waiter
            exc = e if isinstance(e, (_lib.MigctlError, NotImplementedError, ValueError)) else \
                RuntimeError(f"migctl {work._name} (across nodes): {e}")
            if exc is not e:
                exc.__cause__ = e
        work._finish(exc)

    def _finished(self, w):
        with self._mu:
            if w._done.is_set() and w._consumed:
                self._live.pop(id(w), None)
            extra = len(self._live) - _KEEP
            if extra > 0:
                for k in [k for k, v in self._live.items() if v._done.is_set()][:extra]:
                    del self._live[k]

    def _submit(self, name, tensors, result, job):
        """Queues job (stages run on the thread) and returns its Work. CUDA
        tensors: the job runs on a side stream that waits for the work queued
        on the current stream now."""
        devs = []
        for t in tensors:
            if t.is_cuda and t.device not in devs:
                devs.append(t.device)
            elif not t.is_cuda and t.device.type != "cpu":
                raise NotImplementedError(f"migctl backend: tensors on {t.device} are not supported (cpu and cuda are)")
        stream = None
        if devs:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(devs[0]))
            stream = (torch.cuda.Stream(devs[0]), ev)
        w = HierWork(self, name, result, devs or None)
        with self._mu:
            self._live[id(w)] = w
        with self._cv:
            self._q.append((w, job, stream))
            self._cv.notify()
        return w

    # --- stages -------------------------------------------------------------

    def _cross_allreduce(self, t, op):
        """All-reduce of t (contiguous) across nodes over gloo (SUM, MIN, MAX)."""
        if self.cross is None or t.numel() == 0:
            return
        o = dist.AllreduceOptions()
        o.reduceOp = {_lib.SUM: dist.ReduceOp.SUM, _lib.MIN: dist.ReduceOp.MIN, _lib.MAX: dist.ReduceOp.MAX}[op]
        if t.is_cuda and self.cross_cuda is not None:  # on the current (side) stream
            self.cross_cuda.allreduce([t], o).wait()
            return
        host = t if not t.is_cuda else t.cpu()
        wire = host.float() if host.dtype == torch.bfloat16 else host
        self.cross.allreduce([wire], o).wait()
        if wire is not t:
            t.copy_(wire)

    def _cross_allgather(self, out, inp):
        """Every node's inp (uint8, n bytes) into out (N*n bytes, by node)."""
        if self.cross is None:
            out.copy_(inp)
            return
        n = inp.numel()
        if inp.is_cuda and self.cross_cuda is not None:
            self.cross_cuda.allgather([[out[k * n:(k + 1) * n] for k in range(self.nodes)]], [inp]).wait()
            return
        hin = inp.cpu() if inp.is_cuda else inp
        hout = torch.empty(out.numel(), dtype=torch.uint8) if out.is_cuda else out
        self.cross.allgather([[hout[k * n:(k + 1) * n] for k in range(self.nodes)]], [hin]).wait()
        if hout is not out:
            out.copy_(hout)

    def _cross_broadcast(self, t, root):
        if self.cross is None or t.numel() == 0:
            return
        o = dist.BroadcastOptions()
        o.rootRank = root
        if t.is_cuda and self.cross_cuda is not None:
            self.cross_cuda.broadcast([t], o).wait()
            return
        host = t.cpu() if t.is_cuda else t
        self.cross.broadcast([host], o).wait()
        if host is not t:
            t.copy_(host)

    def _avg(self, t):
        if t.is_floating_point():
            t.div_(self.size)
        else:
            t.copy_(torch.div(t, self.size, rounding_mode="trunc"))

    # --- collectives (process_group._Comm's interface) ------------------------

    def transfer(self, kind, tensors, peer, name):
        """dist.send/recv between two ranks of this node, on the node's
        migctl group; between nodes they are not supported."""
        if not 0 <= peer < self.size:
            raise ValueError(f"migctl {name}: peer {peer}: want a rank of this group of {self.size}")
        if self.local is None or peer // self.lsize != self.node:
            where = "in a group whose ranks span nodes" if self.local is None else "on another node"
            raise NotImplementedError(
                f"migctl backend: {name} between rank {self.rank} and rank {peer} {where} is not supported "
                "(point-to-point transfers run between ranks of one node, in the job's group or a group of that "
                "node's ranks; use a gloo group for these)")
        return self.local.transfer(kind, tensors, peer - self.node * self.lsize, name)

    def allreduce(self, tensors, op, name="allreduce"):
        from .process_group import _reduce_dtype  # noqa: PLC0415

        ops = [_reduce_dtype(t, name, op)[1] for t in tensors]  # bool: SUM is MAX
        L, lr = self.lsize, self.lrank

        def job():
            for t, top in zip(tensors, ops):
                inner = _lib.SUM if top == _lib.AVG else top
                c = t.numel()
                if c == 0:
                    continue
                s = -(-c // L)
                work = t.view(torch.uint8) if t.dtype == torch.bool else t
                if t.is_contiguous() and s * L == c:
                    buf = work.reshape(-1)
                else:
                    buf = torch.zeros(s * L, dtype=work.dtype, device=t.device)
                    buf[:c].copy_(work.reshape(-1))
                shard = buf[lr * s:(lr + 1) * s]
                if L > 1:
                    self.local.reduce_scatter_base(shard, buf, inner, name=name).wait()
                self._cross_allreduce(shard, inner)
                if top == _lib.AVG:
                    self._avg(shard)
                if L > 1:
                    self.local.allgather_base(buf, shard, name=name).wait()
                if buf.data_ptr() != work.data_ptr() or not t.is_contiguous():
                    work.copy_(buf[:c].view_as(work))
        return self._submit(name, tensors, list(tensors), job)

    def allgather_base(self, output, inp, name="_allgather_base"):
        if output.numel() != self.size * inp.numel() or output.dtype != inp.dtype or output.device != inp.device:
            raise ValueError(f"migctl {name}: output has {output.numel()} {output.dtype} on {output.device}, "
                             f"want {self.size} x the input's {inp.numel()} {inp.dtype} on {inp.device}")
        N, L = self.nodes, self.lsize

        def job():
            src = _bytes(inp.contiguous())
            nb = src.numel()
            if nb == 0:
                return  # gloo divides by the size (SIGFPE on torch 1.13)
            x = torch.empty(N * nb, dtype=torch.uint8, device=inp.device)
            self._cross_allgather(x, src)  # [node] of local rank lr's inputs
            if L > 1:
                y = torch.empty(L * N * nb, dtype=torch.uint8, device=inp.device)
                self.local.allgather_base(y, x, name=name).wait()  # [local][node]
            else:
                y = x
            ordered = y.view(L, N, nb).transpose(0, 1)  # [node][local]: rank order
            if output.is_contiguous():
                _bytes(output).view(N, L, nb).copy_(ordered)
            else:
                output.copy_(ordered.reshape(-1).view(output.dtype).view_as(output))
        return self._submit(name, [output, inp], [output], job)

    def allgather(self, output_lists, inputs, name="allgather"):
        if len(output_lists) != len(inputs):
            raise ValueError(f"migctl {name}: {len(output_lists)} output lists for {len(inputs)} inputs")
        flats = []
        for outs, inp in zip(output_lists, inputs):
            if len(outs) != self.size:
                raise ValueError(f"migctl {name}: {len(outs)} output tensors, want one per rank ({self.size})")
            for o in outs:
                if o.numel() != inp.numel() or o.dtype != inp.dtype or o.device != inp.device:
                    raise ValueError(f"migctl {name}: every output must match the input ({inp.numel()} "
                                     f"{inp.dtype} on {inp.device}), got {o.numel()} {o.dtype} on {o.device}")
            flats.append(torch.empty(self.size * inp.numel(), dtype=inp.dtype, device=inp.device))
        works = [self.allgather_base(f, i, name=name) for f, i in zip(flats, inputs)]

        def job():
            for w in works:
                w.wait()
            for outs, f, inp in zip(output_lists, flats, inputs):
                n = inp.numel()
                for k, o in enumerate(outs):
                    o.copy_(f[k * n:(k + 1) * n].view_as(o))
        return self._submit(name, [t for outs in output_lists for t in outs], output_lists, job)

    def reduce_scatter_base(self, output, inp, op, name="_reduce_scatter_base"):
        from .process_group import _reduce_dtype  # noqa: PLC0415

        if inp.numel() != self.size * output.numel() or output.dtype != inp.dtype or output.device != inp.device:
            raise ValueError(f"migctl {name}: input has {inp.numel()} {inp.dtype} on {inp.device}, "
                             f"want {self.size} x the output's {output.numel()} {output.dtype} on {output.device}")
        _, op = _reduce_dtype(output, name, op)  # bool: SUM is MAX
        N, L, n, lr = self.nodes, self.lsize, self.node, self.lrank
        inner = _lib.SUM if op == _lib.AVG else op

        def job():
            c = output.numel()
            if c == 0:
                return
            src = inp.view(torch.uint8) if inp.dtype == torch.bool else inp
            # [node][local][c] -> [local][node][c]: local rank lr's block holds its blocks of every node
            x = torch.empty(N * L * c, dtype=src.dtype, device=src.device)  # never the caller's input
            x.view(L, N, c).copy_(src.reshape(N, L, c).transpose(0, 1))
            block = x[lr * N * c:(lr + 1) * N * c]
            if L > 1:
                self.local.reduce_scatter_base(block, x, inner, name=name).wait()
            self._cross_allreduce(block, inner)
            mine = block[n * c:(n + 1) * c]
            if op == _lib.AVG:
                self._avg(mine)
            dst = output.view(torch.uint8) if output.dtype == torch.bool else output
            dst.copy_(mine.view_as(dst))
        return self._submit(name, [output, inp], [output], job)

    def reduce_scatter(self, outputs, input_lists, op, name="reduce_scatter"):
        if len(outputs) != len(input_lists):
            raise ValueError(f"migctl {name}: {len(outputs)} outputs for {len(input_lists)} input lists")
        works = []
        for out, ins in zip(outputs, input_lists):
            if len(ins) != self.size:
                raise ValueError(f"migctl {name}: {len(ins)} input tensors, want one per rank ({self.size})")
            for i in ins:
                if i.numel() != out.numel() or i.dtype != out.dtype or i.device != out.device:
                    raise ValueError(f"migctl {name}: every input must match the output ({out.numel()} "
                                     f"{out.dtype} on {out.device}), got {i.numel()} {i.dtype} on {i.device}")
            flat = torch.cat([i.reshape(-1) for i in ins]) if out.numel() else \
                torch.empty(0, dtype=out.dtype, device=out.device)
            works.append(self.reduce_scatter_base(out, flat, op, name=name))

        def job():
            for w in works:
                w.wait()
        return self._submit(name, list(outputs), list(outputs), job)

    def broadcast(self, tensors, root, name="broadcast"):
        if not 0 <= root < self.size:
            raise ValueError(f"migctl {name}: root {root} of {self.size} ranks")
        rn, rl = divmod(root, self.lsize)
        L = self.lsize

        def job():
            for t in tensors:
                buf = t if t.is_contiguous() else t.contiguous()
                b = _bytes(buf)
                if self.node == rn and L > 1:
                    self.local.broadcast([b], rl, name=name).wait()
                if self.lrank == rl:
                    self._cross_broadcast(b, rn)
                if self.node != rn and L > 1:
                    self.local.broadcast([b], rl, name=name).wait()
                if buf is not t:
                    t.copy_(buf)
        return self._submit(name, tensors, list(tensors), job)

    def barrier(self, name="barrier"):
        def job():
            if self.lsize > 1:
                self.local.barrier(name=name).wait()
            if self.cross is not None:
                self.cross.barrier().wait()
        return self._submit(name, [], [], job)
