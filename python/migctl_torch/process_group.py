"""The "migctl" ProcessGroup: torch.distributed collectives over libmigctl.so.

The state lives in the library (the job's group, and the groups of some of
its ranks that dist.new_group forms: migctl_new_group); this module converts
tensors to pointers, streams and dtype codes, and turns the library's handles
into Work objects and torch Futures. A call only queues the collective in
the library (one C call, migctl_issue) and returns a Work: it never waits for
a peer, so DDP's reducer overlaps the buckets' all-reduces with the backward
pass. wait() waits for the handle in the library (GIL released); a Future is
settled by the completion thread, which waits for the handles in the order
they were issued (the library runs collectives one at a time in that order).
"""

import atexit
import ctypes
import functools
import os
import queue
import secrets
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _futures, _lib, multinode

import collections

_DTYPES = {
    torch.float32: _lib.FLOAT32,
    torch.float16: _lib.FLOAT16,
    torch.bfloat16: _lib.BFLOAT16,
    torch.float64: _lib.FLOAT64,
    torch.int32: _lib.INT32,
    torch.int64: _lib.INT64,
    torch.uint8: _lib.UINT8,
}

# torch.distributed.ReduceOp members and the library's operators.
_OPS = [(name, code) for name, code in (("SUM", _lib.SUM), ("AVG", _lib.AVG), ("MIN", _lib.MIN), ("MAX", _lib.MAX))
        if hasattr(dist.ReduceOp, name)]

_SUM = dist.ReduceOp.SUM

# init_process_group's timeout when the caller gave none: the launcher's
# collective deadline (MIGCTL_TIMEOUT) stays then.
_TORCH_DEFAULT_TIMEOUT = getattr(getattr(dist, "constants", None), "default_pg_timeout", timedelta(minutes=30))


def _op_hashes():
    """hash(ReduceOp) -> the library's operator: a ReduceOp hashes to its
    RedOpType's value (torch 1.13 and 2.x), which costs ~0.4 us where == costs
    ~1.5 (torch 1.13, per call). Empty unless the four hash apart to such
    small values (an identity hash would be an address, reused once freed)."""
    try:
        m = {hash(getattr(dist.ReduceOp, name)): code for name, code in _OPS}
        again = {hash(getattr(dist.ReduceOp, name)) for name, _ in _OPS}
    except TypeError:
        return {}
    ok = len(m) == len(_OPS) and set(m) == again and all(0 <= k < 256 for k in m)
    return m if ok else {}


_OP_BY_HASH = _op_hashes()

# The current CUDA stream's CUstream on a device: torch's raw accessor where
# it has one (no Stream object per call), else through torch.cuda.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _record_on_current(keep, device):
    """Records the CUDA tensors of keep (a tensor, or several) on device's
    current stream (Tensor.record_stream)."""
    if keep is None:
        return
    ts = (keep,) if isinstance(keep, torch.Tensor) else keep
    stream = None
    for t in ts:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            if stream is None:
                stream = torch.cuda.current_stream(device)
            t.record_stream(stream)


def _current_stream(device):
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream

SUPPORTED = ("allreduce", "allgather", "_allgather_base", "all_gather_single", "reduce_scatter",
             "_reduce_scatter_base", "reduce_scatter_single", "broadcast", "barrier", "allreduce_coalesced",
             "allgather_coalesced", "allgather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced", "reduce",
             "gather", "scatter", "alltoall", "alltoall_base", "send", "recv")


def _unsupported(call):
    return NotImplementedError(
        f"migctl backend: {call} is not supported (it implements {', '.join(SUPPORTED)}); "
        "create a gloo group for it with dist.new_group(backend='gloo')"
    )


def _op(opts, call):
    if opts is None:
        return _lib.SUM
    op = opts.reduceOp
    try:
        code = _OP_BY_HASH.get(hash(op))
    except TypeError:
        code = None
    if code is not None:
        return code
    try:
        if op == _SUM:
            return _lib.SUM
    except TypeError:
        pass
    for name, code in _OPS:
        try:
            if op == getattr(dist.ReduceOp, name):
                return code
        except TypeError:
            pass
    raise NotImplementedError(f"migctl backend: {call} with ReduceOp {_op_name(op)} is not supported (SUM, AVG, MIN and MAX "
                              "are); use a gloo group for it")


def _op_name(op):
    """The ReduceOp's name (PRODUCT, BAND, ...) for an error message."""
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
        try:
            if hasattr(dist.ReduceOp, name) and op == getattr(dist.ReduceOp, name):
                return name
        except (TypeError, RuntimeError):
            pass
    inner = getattr(op, "op", None)  # torch 2.x: ReduceOp.op is its RedOpType
    return str(getattr(inner, "name", inner if inner is not None else op))


def _sync_path(comm, opts, method):
    """comm's method that issues and waits in one C call (migctl_run), when
    torch says the caller waits at once (torch 2.x's opts.asyncOp=False, as
    a collective without async_op passes) and comm has it (not across
    nodes); else None."""
    if opts is None or getattr(opts, "asyncOp", True) is not False:
        return None
    return getattr(comm, method, None)


def _queued_broadcast(comm, tensors):
    """Whether an asynchronous broadcast of tensors (DDP's buffers every
    forward pass) may take the one-call path: one contiguous CUDA tensor no
    larger than what the library queues whole on the device
    (migctl_queued_broadcast_bytes: one arena chunk; 0 with
    MIGCTL_TUNING=bcast=cpu, the IPC transport, a swap job), and nothing of
    this process in flight. migctl_run then returns at once, the current
    stream ordered after the broadcast, as NCCL's does; otherwise it would
    wait for the collectives before it and for the peers, which an
    asynchronous call must not (a peer may first wait for this rank's next
    send), so the general path issues it."""
    if len(tensors) != 1:
        return False
    t = tensors[0]
    if not (t.is_cuda and t.is_contiguous()):
        return False
    limit = getattr(comm, "queued_broadcast_bytes", None)
    return limit is not None and t.numel() * t.element_size() <= limit() and comm.quiet()


def _reduce_dtype(t, call, op):
    """(dtype code, op) of a reduction of t: bool reduces as uint8, its SUM
    a logical OR (MAX, as torch's NCCL backend does), MIN and MAX AND and
    OR."""
    dt = _DTYPES.get(t.dtype)
    if dt is not None:
        return dt, op
    if t.dtype == torch.bool and op in (_lib.SUM, _lib.MIN, _lib.MAX):
        return _lib.UINT8, _lib.MAX if op == _lib.SUM else op
    if t.dtype == torch.bool:
        raise NotImplementedError(f"migctl backend: {call} on torch.bool with ReduceOp {_op_name_of(op)} is not supported "
                                  "(SUM, a logical OR, MIN and MAX are)")
    raise NotImplementedError(
        f"migctl backend: {call} on {t.dtype} is not supported (float32, float16, bfloat16, float64, "
        "int32, int64, uint8 are, and bool with SUM, MIN or MAX)")


def _op_name_of(code):
    """The ReduceOp name of a library op code."""
    for name, c in _OPS:
        if c == code:
            return name
    return str(code)


def _move_dtype(t):
    """(dtype code, element count) for a collective that only moves data."""
    dt = _DTYPES.get(t.dtype)
    if dt is None:
        return _lib.UINT8, t.numel() * t.element_size()
    return dt, t.numel()


class _Completer:
    """Completes, in issue order, the Works whose Future was asked for (or
    that nobody claimed): a thread that waits for their handles in the
    library (migctl_wait, with the GIL released) and settles their Futures.
    The caller's thread never waits for a peer: DDP's reducer issues a
    bucket, asks for its Future and goes on with the backward pass."""

    def __init__(self):
        self.q = queue.SimpleQueue()
        self.streams = set()  # devices whose current stream in this thread is a private one
        self.thread = threading.Thread(target=self._run, name="migctl-completion", daemon=True)
        self.thread.start()
        self.ident = self.thread.ident

    def submit(self, work):
        """Hands work (claimed) to the thread; called on the thread itself
        (a Future's callback: PowerSGD's hook waits there for the all-reduce
        it issues), it finishes work at once instead: queued behind the
        callback, it would never finish."""
        if threading.get_ident() == self.ident:
            self.finish(work)
        else:
            self.q.put(work)

    def finish(self, w):
        """Waits for w and settles its Future (on the thread)."""
        if w._early and w._devices[0] not in self.streams:
            # Works ready early order this thread's current stream after
            # their result (Work._run): a stream of its own, not the
            # default one, where the training's kernels would wait for
            # every bucket's copies back as soon as they are queued. The
            # Future's events go on it, and its waiter's stream waits
            # for them when it waits (as NCCL's Futures).
            torch.cuda.set_stream(torch.cuda.Stream(device=w._devices[0]))
            self.streams.add(w._devices[0])
        w._run()

    def _run(self):
        get = self.q.get
        finish = self.finish
        while True:
            w = get()
            finish(w)
            w = None  # no reference left in this thread's frame


# Work states.
_ISSUED, _CLAIMED, _DONE = 0, 1, 2


def _seconds(timeout):
    """A Work's wait() timeout in seconds, or None for none (torch passes
    timedelta(0), or nothing, for none)."""
    if isinstance(timeout, timedelta) and timeout.total_seconds() > 0:
        return timeout.total_seconds()
    return None


class Work(dist._Work):
    """A collective in flight: wait() blocks until its result is determined
    and raises its error; get_future() is a torch Future completed with the
    output tensors. On CPU tensors the result is then in them. On CUDA
    tensors the current stream is ordered after the result, as NCCL's
    Works do: a large all-reduce staged through host memory completes once
    its last copies back are queued, while they still run (C ABI
    migctl_wait_stream, with MIGCTL_TUNING=complete=device; by default once
    they are done), and
    a synchronous dist.all_reduce of small CUDA tensors with
    MIGCTL_TUNING=smallon=device returns once queued on the GPU.

    Issuing never waits: the library queues the collective and returns a
    handle. The first thread to need the result claims the handles and waits
    for them in the library itself (wait(): no hand-off, a synchronous
    collective costs one C call more than the library's); get_future() hands
    the Work to the completion thread instead, which settles the Future, and
    so does wait(timeout) (it raises once timeout passes; the collective goes
    on). is_completed() finishes a Work nobody claimed once the library has.

    torch reaches a Work it got through C++ (DDP's reducer, broadcasts of
    module states) only while this Python object lives: once it is gone the
    C++ side falls back to the base class, whose wait() never returns. So the
    communicator keeps every Work until it has finished and its wait() or
    get_future() has been called, or, unconsumed, until KEEP later ones have
    finished."""

    def __init__(self, comm, name, handles, result, keep=None, post=None, devices=None, completer=None):
        super().__init__()
        self._comm = comm
        # what completes it when nobody waits (a point-to-point transfer's
        # link has its own: it finishes out of the collectives' order)
        self._completer = completer or comm.completer
        self._name = name
        self._handles = handles
        self._result = result
        self._keep = keep  # tensors the library reads or writes until the end
        self._post = post
        self._devices = devices
        # may complete early on the GPU (migctl_wait_stream): one CUDA device, the library told to
        self._early = comm.early and devices is not None and len(devices) == 1
        self._exc = None
        self._waited_on = None  # the CUDA stream _run ordered after the result (None: the host waited)
        self._state = _ISSUED
        self._consumed = False
        self._future = None  # what get_future handed out (_futures.pair's outer)
        self._inner = None  # the Future this Work settles
        comm._hold(self)

    def _run(self):
        """Waits for the handles in the library and finishes (the claimer only).

        With MIGCTL_TUNING=complete=device, on CUDA tensors of one device the
        wait returns once the result is queued on the GPU, with this thread's
        current stream ordered after it
        (migctl_wait_stream; a large all-reduce staged through host memory
        returns while its last copies back still run), and the tensors the
        library writes are recorded on that stream, so that the caching
        allocator does not hand their memory out before the copies are done.
        What comes after (the post step's copies, the Future's events, the
        waiter's use of the result) is ordered on that stream as well."""
        c = self._comm
        err = None
        dev = self._devices[0] if self._early else None
        stream = _current_stream(dev) if dev is not None else None  # 0: the legacy default stream
        for h in self._handles:
            if stream is not None:
                code = c.cwait_stream(h, stream, -1)  # ctypes releases the GIL while it blocks
            else:
                code = c.cwait(h, -1)
            if code != _lib.OK and err is None:
                err = c.lib.error(code, self._name)
        if stream is not None and err is None:
            _record_on_current(self._keep, dev)
            self._waited_on = stream
        if err is None and self._post is not None:
            try:
                self._post()
            except Exception as e:  # noqa: BLE001 - handed to the waiter
                err = e
        self._keep = self._post = None
        with c._mu:
            self._exc = err
            self._state = _DONE
            c._unfinished -= 1
            inner = self._inner
            if self._consumed:
                c._live.pop(id(self), None)
            elif len(c._live) > c.KEEP:
                c._trim()
            if c._waiters:
                c._cv.notify_all()
        if inner is not None:
            _futures.settle(inner, self._result, self._exc)

    def wait(self, timeout=None):
        c = self._comm
        if self._state != _DONE:
            with c._mu:
                mine = self._state == _ISSUED
                if mine:
                    self._state = _CLAIMED
            if mine and (not timeout or _seconds(timeout) is None):  # torch's C++ passes timedelta(0): none
                self._run()
            else:
                if mine:  # a timeout: the completion thread waits, this one for at most that long
                    self._completer.submit(self)
                self._await(timeout)
        with c._mu:
            self._consumed = True
            c._live.pop(id(self), None)
        if self._exc is not None:
            raise self._exc
        if self._waited_on is not None:
            self._order_caller()
        return True

    def _order_caller(self):
        """Orders the caller's current stream after the result when another
        thread's stream was (the completion thread's, which claimed the Work):
        the result may still be on its way there."""
        dev = self._devices[0]
        if _current_stream(dev) == self._waited_on:
            return
        ev = torch.cuda.Event()
        s = self._waited_on
        ev.record(torch.cuda.default_stream(dev) if s == 0 else torch.cuda.ExternalStream(s, device=dev))
        torch.cuda.current_stream(dev).wait_event(ev)

    def _await(self, timeout):
        """Waits for the thread that claimed the handles to finish (raises
        after timeout, a positive timedelta, when given)."""
        c = self._comm
        secs = _seconds(timeout)
        end = None if secs is None else time.monotonic() + secs
        with c._cv:
            c._waiters += 1
            try:
                while self._state != _DONE:
                    left = None if end is None else end - time.monotonic()
                    if left is not None and left <= 0:
                        raise RuntimeError(f"migctl {self._name}: not finished after {timeout}")
                    c._cv.wait(left)  # woken whenever a Work of the group finishes
            finally:
                c._waiters -= 1

    def get_future(self):
        c = self._comm
        with c._mu:
            self._consumed = True
            fut = self._future
            if fut is not None:
                return fut
            self._inner, fut = _futures.pair(self._devices)
            self._future = fut
            state = self._state
            if state == _ISSUED:
                self._state = _CLAIMED
            elif state == _DONE:
                c._live.pop(id(self), None)
        if state == _ISSUED:
            self._completer.submit(self)
        elif state == _DONE:
            _futures.settle(self._inner, self._result, self._exc)
        # _CLAIMED: the claimer settles it when it finishes (it reads _inner under the lock)
        return fut

    def is_completed(self):
        if self._state == _ISSUED:
            # nobody waits for it: finish it here once the library has (a
            # caller polling is_completed() would otherwise poll forever)
            self._comm._finish_done((self,))
        return self._state == _DONE

    def is_success(self):
        return self.is_completed() and self._exc is None

    def exception(self):
        return self._exc

    def result(self):
        return self._result


class _Done(dist._Work):
    """A collective that has finished: what a synchronous call returns (torch
    2.x says so with opts.asyncOp=False; the library issued and waited for it
    in one call, migctl_run). torch waits for it at once; until then the
    class keeps it alive (see Work: through C++ torch reaches the overrides
    only while the Python object lives), and lets it go then (with its
    tensors: the 64 newest at most)."""

    _held = {}  # id -> _Done not yet waited for

    def __init__(self, result, devices=None):
        super().__init__()
        self._result = result
        self._devices = devices
        held = _Done._held
        held[id(self)] = self
        if len(held) > 64:
            try:
                del held[next(iter(held))]
            except (KeyError, RuntimeError, StopIteration):  # another thread took it meanwhile
                pass

    def wait(self, timeout=None):
        _Done._held.pop(id(self), None)
        return True

    def get_future(self):
        _Done._held.pop(id(self), None)
        fut = torch.futures.Future(devices=self._devices) if self._devices else torch.futures.Future()
        fut.set_result(self._result)
        return fut

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def exception(self):
        return None

    def result(self):
        return self._result


class _Comm:
    """The process's group in libmigctl, and the collectives on tensors."""

    _instance = None
    _imu = threading.Lock()

    @classmethod
    def get(cls, rank=-1, size=-1):
        with cls._imu:
            c = cls._instance
            if c is None or c.pid != os.getpid():
                if c is not None:
                    raise _lib.MigctlError(_lib.ERR_FORKED, "migctl: this process was forked from the training "
                                                            "process; only the training process may run collectives")
                c = cls._instance = _Comm(rank, size)
            elif rank >= 0 and (rank, size) != (c.rank, c.size):
                raise RuntimeError(
                    f"migctl backend: the job's group as rank {rank} of {size} in a process that is rank {c.rank} "
                    f"of {c.size}")
            return c

    @classmethod
    def existing(cls):
        """The process's group if it was joined in this process, else None."""
        with cls._imu:
            c = cls._instance
            return c if c is not None and c.pid == os.getpid() else None

    @classmethod
    def for_group(cls, store, rank, size, timeout):
        """What a torch group of size ranks runs on: the job's group (joined
        on first use), or a new group of some of its ranks (new_group(ranks=
        [...])) formed through torch's store for that group."""
        world = cls.existing()
        job_size = world.size if world is not None else int(os.environ.get("WORLD_SIZE", -1))
        if job_size < 0 or size == job_size:
            c = cls.get(rank, size)
            c.set_timeout(timeout)
            return c
        if world is None:
            raise multinode.no_job_group(size)
        return _SubComm.form(world, store, rank, size, timeout)

    @classmethod
    def get_node(cls, rank, size, rdzv, job):
        """The group of this node's ranks of a multi-node job (rank and size
        among them), whose rendezvous is at rdzv (see multinode.py)."""
        with cls._imu:
            c = cls._instance
            if c is not None and c.pid == os.getpid():
                if (c.rank, c.size) != (rank, size):
                    raise RuntimeError(f"migctl backend: this process is rank {c.rank} of {c.size} of its node's "
                                       f"group already, not {rank} of {size}")
                return c
            if c is not None:
                raise _lib.MigctlError(_lib.ERR_FORKED, "migctl: this process was forked from the training "
                                                        "process; only the training process may run collectives")
            c = cls._instance = _Comm(rank, size, rdzv, job)
            return c

    def __init__(self, rank, size, rdzv=None, job=None):
        self.lib = _lib.load()
        self.pid = os.getpid()
        if rdzv is None:
            self.lib.check(self.lib.lib.migctl_init(rank, size), "init")
        else:
            self.lib.check(self.lib.lib.migctl_init_group(rank, size, rdzv.encode(), job.encode()),
                           "init (this node's group)")
        self.rank = self.lib.lib.migctl_rank()
        self.size = self.lib.lib.migctl_size()
        self.on_gpu = self.lib.lib.migctl_on_gpu() == 1
        # large all-reduces of CUDA tensors complete once queued (migctl_wait_stream) where the
        # library says they may (MIGCTL_TUNING=complete=device, a device that orders streams);
        # elsewhere the Works wait as before, with no stream bookkeeping
        self.early = self.on_gpu and self.lib.lib.migctl_completes_early(0) == 1
        self.cissue = self.lib.lib.migctl_issue
        self.cwait = self.lib.lib.migctl_wait
        self.cwait_stream = self.lib.lib.migctl_wait_stream
        self.crun = self.lib.lib.migctl_run
        self.completer = _Completer()
        self._subs = []  # the groups of some of the ranks formed in this process (_SubComm)
        self._init_works()
        atexit.register(self._finalize)

    def _init_works(self):
        self._mu = threading.Lock()
        self._cv = threading.Condition(self._mu)
        self._waiters = 0
        self._unclaimed = collections.deque()  # the last Works issued, oldest first
        self._live = {}  # id -> Work not yet finished and consumed (insertion ordered)
        self._unfinished = 0  # Works of _live not finished yet
        self._links = {}  # (kind, peer) -> the _Completer of that point-to-point link's Works

    def _busy(self):
        return self._unfinished > 0  # an int read: atomic under the GIL

    def quiet(self):
        """Nothing of this process in flight in any of its groups (the library
        runs a process's collectives in issue order, whatever their group).
        An asynchronous collective nobody waited for stops counting once the
        library has finished it (_reap_finished)."""
        w = getattr(self, "world", self)
        groups = (w, *w._subs)
        if not any(g._busy() for g in groups):
            return True
        for g in groups:
            g._reap_finished()
        return not any(g._busy() for g in groups)

    def _reap_finished(self):
        """Finishes here the Works nobody has claimed whose collectives the
        library has finished (migctl_test: done, the handle kept): without
        this an asynchronous call never waited for would count as in flight
        until UNCLAIMED later ones pushed it to the completion thread. A later
        wait() or get_future() on them returns at once."""
        if self._unfinished:
            self._finish_done(self._unclaimed)

    def _finish_done(self, works):
        """Claims and finishes, on this thread, those of works nobody has
        claimed whose handles the library has finished (migctl_test)."""
        test = self.lib.lib.migctl_test
        with self._mu:
            ready = [w for w in works if w._state == _ISSUED and all(test(h) != _lib.PENDING for h in w._handles)]
            for w in ready:
                w._state = _CLAIMED
        for w in ready:
            w._run()  # its handles are done: the waits return at once

    def queued_broadcast_bytes(self):
        """migctl_queued_broadcast_bytes of this group, asked once."""
        q = getattr(self, "_qbcast", None)
        if q is None:
            gid = getattr(self, "gid", 0)
            q = 0 if gid is None else max(0, self.lib.lib.migctl_queued_broadcast_bytes(gid))
            self._qbcast = q
        return q

    def _finalize(self):
        if os.getpid() != self.pid:
            return
        # with collectives in flight (a peer died) exiting must not wait for their deadline;
        # finished ones nobody waited for are not in flight (quiet reaps them)
        if self.quiet():
            self.lib.lib.migctl_finalize()  # frees the groups of some of the ranks too

    # --- helpers ----------------------------------------------------------

    KEEP = 4096  # finished but never consumed Works kept for a late C++ wait()

    UNCLAIMED = 64  # Works issued but never waited for, before the completion thread reaps them

    def _hold(self, w):
        reap = None
        with self._mu:
            self._live[id(w)] = w
            self._unfinished += 1
            u = self._unclaimed
            u.append(w)
            if len(u) > self.UNCLAIMED:
                reap = u.popleft()
                if reap._state == _ISSUED:
                    reap._state = _CLAIMED
                else:
                    reap = None
        if reap is not None:
            reap._completer.submit(reap)

    def _trim(self):
        """Drops the oldest finished, never consumed Works beyond KEEP (lock held)."""
        extra = len(self._live) - self.KEEP
        for k in [k for k, v in self._live.items() if v._state == _DONE][:extra]:
            del self._live[k]

    def _fail(self, code, name):
        raise self.lib.error(int(code), name)

    def set_timeout(self, timeout):
        """Applies init_process_group's timeout to the collectives issued from
        now on, unless it is torch's default (then the launcher's, MIGCTL_TIMEOUT
        from `migctl run --timeout`, stays)."""
        if not isinstance(timeout, timedelta) or timeout == _TORCH_DEFAULT_TIMEOUT:
            return
        # the library refuses one that is not positive
        self.lib.check(self._set_timeout_ms(int(timeout.total_seconds() * 1000)), "set_timeout")

    def _set_timeout_ms(self, ms):
        return self.lib.lib.migctl_set_timeout(ms)

    def _where(self, t, name):
        """(device flag, CUstream) of a tensor for the library. A CUDA
        tensor's collective waits for the work queued on the current stream
        at the call and not for later work: the library marks the stream when
        it is issued (an event, or nothing when the stream is idle)."""
        if not t.is_cuda:
            if t.device.type != "cpu":
                raise NotImplementedError(f"migctl backend: tensors on {t.device} are not supported (cpu and cuda are)")
            return _lib.HOST, 0
        if not self.on_gpu:
            raise RuntimeError(
                f"migctl {name}: a CUDA tensor, but this process's migctl group runs on host memory "
                "(MIGCTL_BACKEND=host): start the job with `migctl run --profile ...` or `--gpus ...` "
                "(MIGCTL_BACKEND=gpu), or use CPU tensors")
        return _lib.DEVICE, _current_stream(t.device)

    def _issue(self, kind, name, t, send, recv, count, dt, op, root):
        dev, stream = self._where(t, name)
        h = self.cissue(kind, send, recv, count, dt, op, root, dev, stream)
        if h < 0:
            self._fail(h, name)
        return h

    @staticmethod
    def _devices(tensors):
        devs = []
        for t in tensors:
            if t.is_cuda and t.device not in devs:
                devs.append(t.device)
        return devs or None

    @staticmethod
    def _copy_back(pairs):
        """A post step copying finished temporaries (src) into the caller's tensors (dst)."""
        if not pairs:
            return None

        def post():
            cuda = [d.device for d, _ in pairs if d.is_cuda]
            if cuda:
                s = torch.cuda.Stream(cuda[0])
                with torch.cuda.stream(s):
                    for dst, src in pairs:
                        dst.copy_(src.view_as(dst))
                s.synchronize()
            else:
                for dst, src in pairs:
                    dst.copy_(src.view_as(dst))
        return post

    # --- collectives --------------------------------------------------------

    def run_allreduce(self, tensors, op, name="allreduce"):
        """A synchronous all-reduce of one contiguous tensor (issued and
        waited for in one C call, migctl_run): a finished Work, or None when
        the tensors need the general path."""
        if len(tensors) != 1:
            return None
        t = tensors[0]
        dt = _DTYPES.get(t.dtype)
        if dt is None or not t.is_contiguous():
            return None
        p = t.data_ptr()
        return self._run(_lib.KIND_ALLREDUCE, name, t, p, p, t.numel(), dt, op, 0, tensors)

    def allreduce(self, tensors, op, name="allreduce"):
        if len(tensors) == 1:  # the common case (DDP's buckets, dist.all_reduce), with the fewest steps
            t = tensors[0]
            dt = _DTYPES.get(t.dtype)
            if dt is not None and t.is_contiguous():
                p = t.data_ptr()
                if t.is_cpu:
                    h = self.cissue(_lib.KIND_ALLREDUCE, p, p, t.numel(), dt, op, 0, _lib.HOST, 0)
                    if h < 0:
                        self._fail(h, name)
                    return Work(self, name, (h,), tensors, t)
                if t.is_cuda and self.on_gpu:
                    d = t.device
                    h = self.cissue(_lib.KIND_ALLREDUCE, p, p, t.numel(), dt, op, 0, _lib.DEVICE, _current_stream(d))
                    if h < 0:
                        self._fail(h, name)
                    return Work(self, name, (h,), tensors, t, None, [d])
        handles, keep, back = [], [], []
        for t in tensors:
            dt, top = _reduce_dtype(t, name, op)
            buf = t if t.is_contiguous() else t.contiguous()
            if buf is not t:
                back.append((t, buf))
            keep.append(buf)
            p = buf.data_ptr()
            handles.append(self._issue(_lib.KIND_ALLREDUCE, name, buf, p, p, buf.numel(), dt, top, 0))
        return Work(self, name, handles, list(tensors), keep, self._copy_back(back), self._devices(tensors))

    def allgather(self, output_lists, inputs, name="allgather"):
        if len(output_lists) != len(inputs):
            raise ValueError(f"migctl {name}: {len(output_lists)} output lists for {len(inputs)} inputs")
        handles, keep, back, results = [], [], [], []
        for outs, inp in zip(output_lists, inputs):
            if len(outs) != self.size:
                raise ValueError(f"migctl {name}: {len(outs)} output tensors, want one per rank ({self.size})")
            for o in outs:
                if o.numel() != inp.numel() or o.dtype != inp.dtype or o.device != inp.device:
                    raise ValueError(f"migctl {name}: every output must match the input ({inp.numel()} "
                                     f"{inp.dtype} on {inp.device}), got {o.numel()} {o.dtype} on {o.device}")
            src = inp if inp.is_contiguous() else inp.contiguous()
            flat = torch.empty(self.size * inp.numel(), dtype=inp.dtype, device=inp.device)
            keep += [src, flat]
            back += [(o, flat[k * inp.numel():(k + 1) * inp.numel()]) for k, o in enumerate(outs)]
            dt, n = _move_dtype(src)
            handles.append(self._issue(_lib.KIND_ALL_GATHER, name, src, src.data_ptr(), flat.data_ptr(), n, dt, 0, 0))
            results.append(outs)
        return Work(self, name, handles, results, keep, self._copy_back(back), self._devices(inputs))

    def _gather_operands(self, output, inp, name):
        """(source, destination, copies back) of an all-gather into output."""
        if output.numel() != self.size * inp.numel() or output.dtype != inp.dtype or output.device != inp.device:
            raise ValueError(f"migctl {name}: output has {output.numel()} {output.dtype} on {output.device}, "
                             f"want {self.size} x the input's {inp.numel()} {inp.dtype} on {inp.device}")
        back = []
        out = output if output.is_contiguous() else output.contiguous()
        if out is not output:
            back.append((output, out))
        block = inp.numel() * inp.element_size()
        in_place = out is output and inp.is_contiguous() and inp.data_ptr() == out.data_ptr() + self.rank * block
        src = out if in_place else (inp if inp.is_contiguous() else inp.contiguous())
        return src, out, back

    def allgather_base(self, output, inp, name="_allgather_base"):
        src, out, back = self._gather_operands(output, inp, name)
        dt, n = _move_dtype(inp)
        h = self._issue(_lib.KIND_ALL_GATHER, name, out, src.data_ptr(), out.data_ptr(), n, dt, 0, 0)
        return Work(self, name, (h,), [output], (src, out), self._copy_back(back), self._devices([output]))

    def run_allgather_base(self, output, inp, name="_allgather_base"):
        """allgather_base issued and waited for in one C call: a finished
        Work, or None where it needs the general path."""
        src, out, back = self._gather_operands(output, inp, name)
        if back:
            return None
        dt, n = _move_dtype(inp)
        return self._run(_lib.KIND_ALL_GATHER, name, out, src.data_ptr(), out.data_ptr(), n, dt, 0, 0, [output])

    def reduce_scatter(self, outputs, input_lists, op, name="reduce_scatter"):
        if len(outputs) != len(input_lists):
            raise ValueError(f"migctl {name}: {len(outputs)} outputs for {len(input_lists)} input lists")
        handles, keep, back = [], [], []
        for out, ins in zip(outputs, input_lists):
            if len(ins) != self.size:
                raise ValueError(f"migctl {name}: {len(ins)} input tensors, want one per rank ({self.size})")
            for i in ins:
                if i.numel() != out.numel() or i.dtype != out.dtype or i.device != out.device:
                    raise ValueError(f"migctl {name}: every input must match the output ({out.numel()} "
                                     f"{out.dtype} on {out.device}), got {i.numel()} {i.dtype} on {i.device}")
            dt, top = _reduce_dtype(out, name, op)
            flat = torch.cat([i.reshape(-1) for i in ins]) if out.numel() else torch.empty(0, dtype=out.dtype, device=out.device)
            dst = out if out.is_contiguous() else torch.empty(out.numel(), dtype=out.dtype, device=out.device)
            if dst is not out:
                back.append((out, dst))
            keep += [flat, dst]
            handles.append(self._issue(_lib.KIND_REDUCE_SCATTER, name, flat, flat.data_ptr(), dst.data_ptr(),
                                       out.numel(), dt, top, 0))
        return Work(self, name, handles, list(outputs), keep, self._copy_back(back), self._devices(outputs))

    def _scatter_operands(self, output, inp, op, name):
        """(source, destination, copies back, dtype, op) of a reduce-scatter of inp."""
        if inp.numel() != self.size * output.numel() or output.dtype != inp.dtype or output.device != inp.device:
            raise ValueError(f"migctl {name}: input has {inp.numel()} {inp.dtype} on {inp.device}, "
                             f"want {self.size} x the output's {output.numel()} {output.dtype} on {output.device}")
        dt, op = _reduce_dtype(output, name, op)
        back = []
        block = output.numel() * output.element_size()
        in_place = (inp.is_contiguous() and output.is_contiguous()
                    and output.data_ptr() == inp.data_ptr() + self.rank * block)
        if in_place:
            src = dst = inp
        else:
            src = inp if inp.is_contiguous() else inp.contiguous()
            dst = output if output.is_contiguous() else torch.empty(output.numel(), dtype=output.dtype,
                                                                     device=output.device)
            if dst is not output:
                back.append((output, dst))
        return src, dst, back, dt, op

    def reduce_scatter_base(self, output, inp, op, name="_reduce_scatter_base"):
        src, dst, back, dt, op = self._scatter_operands(output, inp, op, name)
        h = self._issue(_lib.KIND_REDUCE_SCATTER, name, src, src.data_ptr(), dst.data_ptr(), output.numel(), dt, op,
                        0)
        return Work(self, name, (h,), [output], (src, dst), self._copy_back(back), self._devices([output]))

    def run_reduce_scatter_base(self, output, inp, op, name="_reduce_scatter_base"):
        """reduce_scatter_base issued and waited for in one C call: a finished
        Work, or None where it needs the general path."""
        src, dst, back, dt, op = self._scatter_operands(output, inp, op, name)
        if back:
            return None
        return self._run(_lib.KIND_REDUCE_SCATTER, name, src, src.data_ptr(), dst.data_ptr(), output.numel(), dt, op,
                         0, [output])

    def broadcast(self, tensors, root, name="broadcast"):
        if not 0 <= root < self.size:
            raise ValueError(f"migctl {name}: root {root} of {self.size} ranks")
        handles, keep, back = [], [], []
        for t in tensors:
            buf = t if t.is_contiguous() else t.contiguous()
            if buf is not t:
                back.append((t, buf))
            keep.append(buf)
            dt, n = _move_dtype(buf)
            p = buf.data_ptr()
            handles.append(self._issue(_lib.KIND_BROADCAST, name, buf, p, p, n, dt, 0, root))
        return Work(self, name, handles, list(tensors), keep, self._copy_back(back), self._devices(tensors))

    def run_broadcast(self, tensors, root, name="broadcast"):
        """A broadcast of one contiguous tensor issued and waited for in one C
        call: a finished Work, or None where it needs the general path."""
        if not 0 <= root < self.size:
            raise ValueError(f"migctl {name}: root {root} of {self.size} ranks")
        if len(tensors) != 1 or not tensors[0].is_contiguous():
            return None
        t = tensors[0]
        dt, n = _move_dtype(t)
        p = t.data_ptr()
        return self._run(_lib.KIND_BROADCAST, name, t, p, p, n, dt, 0, root, list(tensors))

    def barrier(self, name="barrier"):
        h = self.cissue(_lib.KIND_BARRIER, None, None, 0, 0, 0, 0, 0, 0)
        if h < 0:
            self._fail(h, name)
        return Work(self, name, (h,), [])

    def run_barrier(self, name="barrier"):
        """A barrier issued and waited for in one C call: a finished Work."""
        code = self.crun(_lib.KIND_BARRIER, None, None, 0, 0, 0, 0, 0, 0)
        if code != _lib.OK:
            self._fail(code, name)
        return _Done([])

    def transfer(self, kind, tensors, peer, name):
        """dist.send (kind KIND_SEND) or dist.recv (KIND_RECV) of one tensor
        to or from rank peer of this group. The library runs each direction
        between two ranks as a link of its own, beside the collectives: its
        Works finish in their link's order, so a link has its own completion
        thread for the Futures asked of them."""
        if len(tensors) != 1:
            raise ValueError(f"migctl {name}: one tensor per call, got {len(tensors)}")
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"migctl {name}: peer {peer}: want another rank of this group of {self.size} "
                             f"(this is rank {self.rank})")
        t = tensors[0]
        buf = t if t.is_contiguous() else t.contiguous()
        back = [(t, buf)] if buf is not t and kind == _lib.KIND_RECV else []
        dt, n = _move_dtype(buf)
        p = buf.data_ptr()
        h = self._issue(kind, name, buf, p, p, n, dt, 0, peer)
        with self._mu:
            done = self._links.get((kind, peer))
            if done is None:
                done = self._links[(kind, peer)] = _Completer()
        return Work(self, name, (h,), [t], [buf], self._copy_back(back), self._devices([t]), done)

    def _run(self, kind, name, t, send, recv, count, dt, op, root, result):
        """A collective on memory of t's device issued and waited for in one
        C call (migctl_run): a finished Work with result, or None where t
        needs the general path (a CUDA tensor on the host backend raises
        there)."""
        if t.is_cpu:
            dev, stream, devices = _lib.HOST, 0, None
        elif t.is_cuda and self.on_gpu:
            dev, stream, devices = _lib.DEVICE, _current_stream(t.device), [t.device]
        else:
            return None
        code = self.crun(kind, send, recv, count, dt, op, root, dev, stream)
        if code != _lib.OK:
            self._fail(code, name)
        if kind == _lib.KIND_BROADCAST and devices is not None:
            # A broadcast the library queued may still use t after this returns, ordered before the
            # current stream's later work: if t was allocated on another stream, its memory must not
            # go to that stream's work before the current stream gets past the broadcast.
            t.record_stream(torch.cuda.current_stream(t.device))
        return _Done(result, devices)


def members(store, rank, size, mine):
    """Every member's mine (its rank in the job, or in its node's group), by
    rank in the group whose torch store is store."""
    store.set(f"migctl/member/{rank}", str(mine))
    return [int(store.get(f"migctl/member/{i}")) for i in range(size)]


class _SubComm(_Comm):
    """A group of some of the job's ranks (dist.new_group(ranks=[...])):
    _Comm's collectives on its id in the library (migctl_new_group). It
    shares the job's group's completion thread: the library runs a
    process's collectives in issue order, whatever their group."""

    @classmethod
    def form(cls, world, store, rank, size, timeout, ranks=None):
        """Forms the group whose torch store is store (torch's, prefixed for
        this group alone): the members learn each other's ranks in world
        (unless given: ranks), and its rank 0 names it."""
        if ranks is None:
            ranks = members(store, rank, size, world.rank)
        if rank == 0:
            store.set("migctl/name", "g" + secrets.token_hex(8))
        name = store.get("migctl/name").decode()
        c = cls(world, ranks, name)
        if (c.rank, c.size) != (rank, size):
            raise RuntimeError(f"migctl backend: torch says rank {rank} of {size} in the group of ranks {ranks}, "
                               f"the library rank {c.rank} of {c.size}")
        c.set_timeout(timeout)
        return c

    def __init__(self, world, ranks, name):  # noqa: PLW0231 - the job's group is initialised
        self.lib = world.lib
        self.pid = world.pid
        lib = self.lib.lib
        gid = lib.migctl_new_group((ctypes.c_int * len(ranks))(*ranks), len(ranks), name.encode())
        if gid < 0:
            raise self.lib.error(gid, f"new_group of ranks {ranks}")
        self.gid = gid
        self.rank, self.size = lib.migctl_group_rank(gid), lib.migctl_group_size(gid)
        self.on_gpu = world.on_gpu
        self.early = world.on_gpu and lib.migctl_completes_early(gid) == 1
        self.cissue = functools.partial(lib.migctl_issue_on, gid)
        self.crun = functools.partial(lib.migctl_run_on, gid)
        self.cwait = world.cwait
        self.cwait_stream = world.cwait_stream
        self.completer = world.completer
        self._init_works()
        self.world = world
        world._subs.append(self)

    def _set_timeout_ms(self, ms):
        return self.lib.lib.migctl_set_timeout_on(self.gid, ms)

    def free(self):
        """Frees the group in the library (its segment); its collectives
        raise afterwards. Idempotent."""
        with self._mu:
            if self.gid is None:
                return
            gid, self.gid = self.gid, None
        self.world._subs.remove(self)
        self.lib.check(self.lib.lib.migctl_free_group(gid), "free_group")


class _Several(dist._Work):
    """Several Works as one (the coalesced calls): wait() waits for each;
    get_future() completes with result once all have."""

    _recent = collections.deque(maxlen=1024)  # alive while C++ may hold them (see Work)

    def __init__(self, works, result, post=None):
        super().__init__()
        self._works, self._result = works, result
        self._post = post  # run once, after every work has finished (a copy out of a temporary)
        self._exc = None  # what post raised
        self._mu = threading.Lock()
        _Several._recent.append(self)

    def _finish(self):
        """Runs post once (a second caller returns once it has run) and
        raises its error, every time."""
        with self._mu:
            post, self._post = self._post, None
            if post is not None:
                try:
                    post()
                except Exception as e:  # noqa: BLE001 - the waiter's
                    self._exc = e
        if self._exc is not None:
            raise self._exc

    def wait(self, timeout=None):
        for w in self._works:
            w.wait(timeout)
        self._finish()
        return True

    def get_future(self):
        result = self._result

        def done(f):
            for x in f.value():
                x.value()  # raises the first error
            self._finish()
            return result
        return torch.futures.collect_all([w.get_future() for w in self._works]).then(done)

    def is_completed(self):
        if not all(w.is_completed() for w in self._works):
            return False
        if all(w.is_success() for w in self._works):
            try:
                self._finish()  # the outputs hold the result once it says so
            except Exception:  # noqa: BLE001 - wait() and exception() give it
                pass
        return True

    def is_success(self):
        return self.is_completed() and self.exception() is None

    def exception(self):
        for w in self._works:
            e = w.exception()
            if e is not None:
                return e
        return self._exc

    def result(self):
        return self._result


class _Refused:
    """The collectives of a group the backend cannot run (some of the ranks,
    formed before the job's migctl group): every one raises the
    NotImplementedError that forming it gave."""

    def __init__(self, err):
        self._err = err

    def __getattr__(self, name):
        raise NotImplementedError(str(self._err))


class ProcessGroupMigctl(dist.ProcessGroup):
    """torch.distributed ProcessGroup over libmigctl.so. Created by
    dist.init_process_group("migctl") in a process started by `migctl run`."""

    def __init__(self, store, rank, size, timeout=None, name=None, ranks=None):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        # torch 2.x's ProcessGroup keeps its name on its C++ backends, which a
        # Python group has none of: group_name (what DeviceMesh, and so FSDP2,
        # reads) raised "ProcessGroup name not set". The group keeps it.
        self._group_name = name
        try:
            if multinode.spans_nodes():  # migctl inside each node, gloo between nodes
                self._comm = multinode.Hier.for_group(store, rank, size, timeout, ranks)
            else:  # the job's group, or a group of some of its ranks
                self._comm = _Comm.for_group(store, rank, size, timeout)
        except NotImplementedError as e:
            # A group the backend cannot run (some of the ranks, formed
            # before the job's migctl group). torch forms a group on every
            # rank together and then waits on a store barrier for all of
            # them: raising here would leave the ranks outside this one
            # waiting in new_group until its timeout. The group is formed;
            # its first collective raises.
            self._comm = _Refused(e)
            return
        if self._comm.rank != rank or self._comm.size != size:
            raise RuntimeError(
                f"migctl backend: torch says rank {rank} of {size}, the migctl group rank {self._comm.rank} of "
                f"{self._comm.size}: start the ranks with `migctl run` and let init_process_group read "
                "RANK and WORLD_SIZE from the environment")

    def getBackendName(self):
        return "migctl"

    @property
    def group_name(self):
        """torch's name of the group (torch 2.x's _DistributedBackendOptions.group_id)."""
        if not self._group_name:
            raise RuntimeError("ProcessGroup name not set")
        return self._group_name

    def _set_group_name(self, name):
        self._group_name = name

    def shutdown(self):
        """Frees a group of some of the ranks in the library (recent torch's
        destroy_process_group(group) calls it); its collectives raise
        afterwards. The job's group stays until the process exits."""
        if isinstance(self._comm, _SubComm):
            self._comm.free()

    def __repr__(self):
        return f"ProcessGroupMigctl(rank={self._rank}, size={self._size})"

    # torch's names and argument orders (see torch.distributed.distributed_c10d).

    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        op = _op(opts, "allreduce")
        # torch 2.x says when the caller waits at once (dist.all_reduce
        # without async_op): then one C call issues and waits (migctl_run)
        if opts is not None and getattr(opts, "asyncOp", True) is False:
            run = getattr(self._comm, "run_allreduce", None)  # not across nodes
            if run is not None:
                w = run(tensors, op)
                if w is not None:
                    return w
        return self._comm.allreduce(tensors, op)

    def allgather(self, output_tensors, input_tensors, opts=None):
        if (len(output_tensors) == 1 and len(input_tensors) == 1 and len(output_tensors[0]) == self._size
                and len({o.numel() for o in output_tensors[0]}) > 1):
            return self._allgather_uneven(output_tensors[0], input_tensors[0])
        return self._comm.allgather(output_tensors, input_tensors)

    def _allgather_uneven(self, outs, inp, name="allgather"):
        """all_gather into outputs of different sizes (rank j's input has
        outs[j]'s): every input padded to the largest, one all-gather."""
        if inp.numel() != outs[self._rank].numel():
            raise ValueError(f"migctl {name}: this rank's input has {inp.numel()} elements, its output "
                             f"{outs[self._rank].numel()}")
        if any(o.dtype != inp.dtype or o.device != inp.device for o in outs):
            raise ValueError(f"migctl {name}: every output must have the input's dtype and device")
        longest = max(o.numel() for o in outs)
        padded = torch.zeros(longest, dtype=inp.dtype, device=inp.device)
        padded[:inp.numel()].copy_(inp.reshape(-1))
        gathered = torch.empty(self._size * longest, dtype=inp.dtype, device=inp.device)
        w = self._comm.allgather_base(gathered, padded, name=name)

        def post():
            g = gathered.view(self._size, longest)
            for j, o in enumerate(outs):
                o.copy_(g[j, :o.numel()].view_as(o))
        return _Several([w], [outs], post)

    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's name
        return self._gather(output, input, opts, "_allgather_base")

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        return self._comm.reduce_scatter(output_tensors, input_tensors, _op(opts, "reduce_scatter"))

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        return self._scatter(output, input, opts, "_reduce_scatter_base")

    # Newer torch calls the flat variants by these names (all_gather_into_tensor,
    # reduce_scatter_tensor and functional collectives).
    def all_gather_single(self, output, input, opts=None):  # noqa: A002
        return self._gather(output, input, opts, "all_gather_single")

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        return self._scatter(output, input, opts, "reduce_scatter_single")

    def _gather(self, output, inp, opts, name):
        run = _sync_path(self._comm, opts, "run_allgather_base")
        w = run(output, inp, name=name) if run is not None else None
        return w if w is not None else self._comm.allgather_base(output, inp, name=name)

    def _scatter(self, output, inp, opts, name):
        op = _op(opts, name)
        run = _sync_path(self._comm, opts, "run_reduce_scatter_base")
        w = run(output, inp, op, name=name) if run is not None else None
        return w if w is not None else self._comm.reduce_scatter_base(output, inp, op, name=name)

    def broadcast(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        root = getattr(opts, "rootRank", 0) if opts is not None else 0
        run = _sync_path(self._comm, opts, "run_broadcast")
        if run is None and _queued_broadcast(self._comm, tensors):
            run = getattr(self._comm, "run_broadcast", None)
        w = run(tensors, root) if run is not None else None
        return w if w is not None else self._comm.broadcast(tensors, root)

    def barrier(self, opts=None):
        run = _sync_path(self._comm, opts, "run_barrier")
        return run() if run is not None else self._comm.barrier()

    # The coalesced variants (torch.distributed's *_coalesced calls, the
    # functional collectives of torch 2.x): one collective per tensor, in order.

    def allreduce_coalesced(self, tensors, opts=None):
        return self._comm.allreduce(list(tensors), _op(opts, "allreduce_coalesced"), name="allreduce_coalesced")

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        # torch's layout: output_lists[rank][i] receives input i of that rank
        if len(output_lists) != self._size or any(len(o) != len(input_list) for o in output_lists):
            raise ValueError(f"migctl allgather_coalesced: want {self._size} output lists of {len(input_list)} tensors")
        per_input = [[output_lists[r][i] for r in range(self._size)] for i in range(len(input_list))]
        return self._comm.allgather(per_input, list(input_list), name="allgather_coalesced")

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        if len(outputs) != len(inputs):
            raise ValueError(f"migctl allgather_into_tensor_coalesced: {len(outputs)} outputs for {len(inputs)} inputs")
        works = [self._comm.allgather_base(o, i, name="allgather_into_tensor_coalesced") for o, i in zip(outputs, inputs)]
        return _Several(works, list(outputs))

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        if len(outputs) != len(inputs):
            raise ValueError(f"migctl reduce_scatter_tensor_coalesced: {len(outputs)} outputs for {len(inputs)} inputs")
        op = _op(opts, "reduce_scatter_tensor_coalesced")
        works = [self._comm.reduce_scatter_base(o, i, op, name="reduce_scatter_tensor_coalesced")
                 for o, i in zip(outputs, inputs)]
        return _Several(works, list(outputs))

    # reduce, gather and scatter through the collectives above (evaluation code
    # reduces metrics and gathers predictions with them): every rank computes
    # the reduction, all-gathers, or receives the whole scatter list, and keeps
    # what the call defines. They move up to Size() times the data a dedicated
    # algorithm would; fine for the small tensors they are used on.

    def _root(self, opts, call):
        root = getattr(opts, "rootRank", 0) if opts is not None else 0
        if not 0 <= root < self._size:
            raise ValueError(f"migctl {call}: root {root} of {self._size} ranks")
        return root

    def reduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        root, op = self._root(opts, "reduce"), _op(opts, "reduce")
        if self._rank == root:
            return self._comm.allreduce(list(tensors), op, name="reduce")
        # The others' tensors keep their values, as with gloo and NCCL.
        return _Several([self._comm.allreduce([t.clone() for t in tensors], op, name="reduce")], list(tensors))

    def gather(self, output_tensors, input_tensors, opts=None):
        root = self._root(opts, "gather")
        if len(input_tensors) != 1:
            raise ValueError(f"migctl gather: {len(input_tensors)} input tensors, want 1")
        inp = input_tensors[0]
        if self._rank == root:
            if len(output_tensors) != 1 or len(output_tensors[0]) != self._size:
                raise ValueError(f"migctl gather: the root needs one list of {self._size} output tensors")
            outs = output_tensors[0]
        else:
            outs = [torch.empty_like(inp) for _ in range(self._size)]
        return self._comm.allgather([outs], [inp], name="gather")

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = self._root(opts, "scatter")
        if len(output_tensors) != 1:
            raise ValueError(f"migctl scatter: {len(output_tensors)} output tensors, want 1")
        out = output_tensors[0]
        n = out.numel()
        if self._rank == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self._size:
                raise ValueError(f"migctl scatter: the root needs one list of {self._size} input tensors")
            parts = input_tensors[0]
            for p in parts:
                if p.numel() != n or p.dtype != out.dtype:
                    raise ValueError(f"migctl scatter: every input must be {n} {out.dtype} like the output, "
                                     f"got {p.numel()} {p.dtype}")
            flat = torch.cat([p.reshape(-1).to(out.device) for p in parts])
        else:
            flat = torch.empty(self._size * n, dtype=out.dtype, device=out.device)
        w = self._comm.broadcast([flat], root, name="scatter")
        lo = self._rank * n

        def post():
            out.copy_(flat[lo:lo + n].view_as(out))
        return _Several([w], [out], post)

    # Asked of a group by parts of torch 2.x (flight recorder, debug info).

    def _get_backend_name(self):
        return "migctl"

    def _set_sequence_number_for_group(self):
        self._seq = 0

    def _get_sequence_number_for_group(self):
        return getattr(self, "_seq", 0)

    # What the backend does not do: a clear error naming the call.

    def all_gather_single_coalesced(self, *a, **k):
        raise _unsupported("all_gather_single_coalesced")

    def reduce_scatter_single_coalesced(self, *a, **k):
        raise _unsupported("reduce_scatter_single_coalesced")

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, opts=None):  # noqa: A002
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts,
                                  name="all_to_all_single")


    # all-to-all through one all-gather of every rank's whole input, each rank
    # keeping its blocks: Size() times the traffic of a real all-to-all, so for
    # small exchanges (metrics, predictions, routing of a few tokens). Uneven
    # blocks (all_to_all_single with split sizes, all_to_all of a list) first
    # all-gather every rank's block sizes (the call waits for that small
    # one), then every input padded to the largest. all_to_all_single
    # without split sizes takes the equal blocks' path: every rank must
    # then leave them out.

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None,  # noqa: A002
                      name="all_to_all_single (alltoall_base)"):
        if output.dtype != input.dtype or output.device != input.device:
            raise ValueError(f"migctl {name}: input is {input.dtype} on {input.device}, output {output.dtype} on "
                             f"{output.device}: want one dtype and device")
        if not output_split_sizes and not input_split_sizes:
            total = input.numel()
            if total % self._size or output.numel() != total:
                raise ValueError(f"migctl {name}: input of {total} and output of {output.numel()} elements: want "
                                 f"equal sizes, a multiple of {self._size} (or split sizes)")
            return self._all_to_all(name, [output], [input.reshape(-1)], total // self._size)
        # splits count rows (dim 0); a row is the rest of the shape
        rows = lambda t: t.shape[0] if t.dim() else 1  # noqa: E731
        ins = self._splits(name, "input", input_split_sizes, rows(input))
        outs = self._splits(name, "output", output_split_sizes, rows(output))
        row = input.numel() // rows(input) if rows(input) else output.numel() // max(rows(output), 1)
        return self._all_to_all_v(name, output, input.reshape(-1), [n * row for n in ins], [n * row for n in outs],
                                  output)

    def _splits(self, name, what, sizes, rows):
        """Split sizes of rows rows: as given (one per rank, summing to rows),
        or equal blocks."""
        if not sizes:
            if rows % self._size:
                raise ValueError(f"migctl {name}: {what} of {rows} rows cannot be split equally among {self._size}")
            return [rows // self._size] * self._size
        sizes = [int(n) for n in sizes]
        if len(sizes) != self._size or sum(sizes) != rows or min(sizes) < 0:
            raise ValueError(f"migctl {name}: {what} split sizes {sizes}: want {self._size} sizes >= 0 summing to "
                             f"its {rows} rows")
        return sizes

    def alltoall(self, output_tensors, input_tensors, opts=None):
        name = "all_to_all (alltoall)"
        if len(input_tensors) != self._size or len(output_tensors) != self._size:
            raise ValueError(f"migctl {name}: {len(input_tensors)} inputs and {len(output_tensors)} outputs, want "
                             f"one per rank ({self._size})")
        ts = list(input_tensors) + list(output_tensors)
        if any(t.dtype != ts[0].dtype or t.device != ts[0].device for t in ts):
            raise ValueError(f"migctl {name}: every input and output must have one dtype and device")
        # Always the uneven path: that this rank's blocks are all equal says
        # nothing of the others' (MoE routing), and ranks that took two
        # paths would issue different collectives.
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        return self._all_to_all_v(name, None, flat_in, [t.numel() for t in input_tensors],
                                  [t.numel() for t in output_tensors], list(output_tensors))

    def _all_to_all(self, name, outputs, inputs, k):
        """Rank r's output block j (k elements) = rank j's input block r."""
        size, r = self._size, self._rank
        flat = torch.cat(inputs) if len(inputs) > 1 else inputs[0].contiguous()
        gathered = torch.empty(size * flat.numel(), dtype=flat.dtype, device=flat.device)
        w = self._comm.allgather_base(gathered, flat, name=name)

        def post():
            mine = gathered.view(size, size, k)[:, r, :]
            if len(outputs) == 1:
                outputs[0].copy_(mine.reshape(outputs[0].shape))
            else:
                for j, o in enumerate(outputs):
                    o.copy_(mine[j].reshape(o.shape))
        return _Several([w], outputs if len(outputs) > 1 else outputs[0], post)

    def _all_to_all_v(self, name, output, flat_in, in_counts, out_counts, result):
        """Uneven blocks (element counts): rank r's block j (out_counts[j]
        elements) = rank j's block r, whose size rank j gave. output is one
        tensor (the blocks in rank order) or, as result, a list of them."""
        size, r = self._size, self._rank
        dev = flat_in.device
        table = torch.empty(size * size, dtype=torch.int64, device=dev)
        self._comm.allgather_base(table, torch.tensor(in_counts, dtype=torch.int64, device=dev), name=name).wait()
        counts = table.view(size, size).tolist()  # counts[j][k]: what rank j sends rank k
        sent = [counts[j][r] for j in range(size)]
        longest = max(sum(c) for c in counts)
        padded = torch.zeros(longest, dtype=flat_in.dtype, device=dev)
        padded[:flat_in.numel()].copy_(flat_in)
        gathered = torch.empty(size * longest, dtype=flat_in.dtype, device=dev)
        w = self._comm.allgather_base(gathered, padded, name=name)

        def post():
            if sent != list(out_counts):
                raise ValueError(f"migctl {name}: rank {r} expects blocks of {list(out_counts)} elements from the "
                                 f"ranks, they send {sent}")
            g = gathered.view(size, longest)
            blocks = [g[j, sum(counts[j][:r]):sum(counts[j][:r]) + sent[j]] for j in range(size)]
            if isinstance(result, list):
                for o, b in zip(result, blocks):
                    o.copy_(b.view_as(o))
            else:
                output.copy_(torch.cat(blocks).view_as(output))
        return _Several([w], result, post)

    # Point-to-point (dist.send/recv/isend/irecv, batch_isend_irecv: pipeline
    # parallelism) between ranks of one node. Tags are not matched: the k-th
    # send from a rank to a peer meets the peer's k-th receive from that rank,
    # as with NCCL. recv_anysource has no counterpart.

    def send(self, tensors, dstRank, tag=0):  # noqa: N803 - torch's names
        return self._p2p(_lib.KIND_SEND, tensors, dstRank, "send")

    def recv(self, tensors, srcRank, tag=0):  # noqa: N803
        return self._p2p(_lib.KIND_RECV, tensors, srcRank, "recv")

    def _p2p(self, kind, tensors, peer, name):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        return self._comm.transfer(kind, tensors, peer, name)

    def recv_anysource(self, *a, **k):
        raise _unsupported("recv_anysource")

    def monitored_barrier(self, *a, **k):
        raise _unsupported("monitored_barrier")


def create_extended(opts, pg_options=None):
    """The creator registered with torch.distributed.Backend.register_backend
    (extended_api=True, torch 1.13 and 2.x): torch's _DistributedBackendOptions
    carry the group's name as well, which torch 2.x needs on the group. In a
    job across nodes the members of a group of some of the ranks learn each
    other's ranks here (multinode.Hier.for_group: migctl when they are on one
    node, gloo when not)."""
    store, rank, size, timeout = opts.store, opts.group_rank, opts.group_size, opts.timeout
    ranks = None
    if multinode.spans_nodes() and size != multinode.world_size():
        ranks = members(store, rank, size, int(os.environ.get("RANK", -1)))
    return ProcessGroupMigctl(store, rank, size, timeout, name=getattr(opts, "group_id", None), ranks=ranks)


def allreduce_hook(state, bucket):
    """DDP communication hook averaging the gradient bucket with migctl, for a
    model whose process group is another backend (say gloo):
    ``model.register_comm_hook(None, migctl_torch.allreduce_hook)``. state may
    be None or a ProcessGroupMigctl; the migctl group of the process is joined
    from the launcher's environment on first use."""
    if isinstance(state, ProcessGroupMigctl):
        comm = state._comm
    elif multinode.spans_nodes():
        comm = multinode.Hier.get(dist.PrefixStore("migctl_hook/", dist.distributed_c10d._get_default_store()),
                                  dist.get_rank(), dist.get_world_size(), timedelta(minutes=30))
    else:
        comm = _Comm.get(int(os.environ.get("RANK", -1)), int(os.environ.get("WORLD_SIZE", -1)))
    t = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    return comm.allreduce([t], _lib.AVG, name="allreduce_hook").get_future().then(lambda fut: fut.value()[0])
