"""ctypes binding of libmigctl.so (include/migctl.h). No torch here."""

import ctypes
import os
import shutil
import threading

ABI_VERSION = 17

OK = 0
PENDING = 1
ERR_INVALID = -1
ERR_NOT_INITIALIZED = -2
ERR_TIMEOUT = -3
ERR_PEER_DEAD = -4
ERR_ABORTED = -5
ERR_UNSUPPORTED = -6
ERR_CLOSED = -7
ERR_FORKED = -8
ERR_BAD_HANDLE = -9
ERR_ALREADY_INITIALIZED = -10
ERR_INTERNAL = -99

FLOAT32, FLOAT16, BFLOAT16, FLOAT64, INT32, INT64, UINT8 = range(7)
SUM, AVG, MIN, MAX = range(4)
HOST, DEVICE = 0, 1
KIND_ALLREDUCE, KIND_REDUCE_SCATTER, KIND_ALL_GATHER, KIND_BROADCAST, KIND_BARRIER, KIND_SEND, KIND_RECV = range(7)

# migctl_stats's counters, in order (include/migctl.h, MIGCTL_STAT_*).
STATS = ("done", "queue_ns", "run_ns", "waits", "wake_ns", "wait_sleeps", "dispatch_sleeps", "marks",
         "idle_marks", "runs", "direct", "direct_transfers", "chained", "early", "queued_back")

_NAMES = {
    ERR_INVALID: "invalid argument",
    ERR_NOT_INITIALIZED: "not initialized",
    ERR_TIMEOUT: "collective deadline exceeded",
    ERR_PEER_DEAD: "peer dead",
    ERR_ABORTED: "aborted",
    ERR_UNSUPPORTED: "not supported",
    ERR_CLOSED: "closed",
    ERR_FORKED: "called in a forked child",
    ERR_BAD_HANDLE: "bad handle",
    ERR_ALREADY_INITIALIZED: "already initialized",
    ERR_INTERNAL: "internal error",
}


class MigctlError(RuntimeError):
    """An error of libmigctl; .code is its MIGCTL_ERR_* code."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def _candidates():
    env = os.environ.get("MIGCTL_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "libmigctl.so")
    yield os.path.join(here, "..", "..", "bin", "libmigctl.so")  # the repository's bin/
    exe = shutil.which("migctl")
    if exe:
        yield os.path.join(os.path.dirname(os.path.realpath(exe)), "libmigctl.so")


class Library:
    """The loaded library with its prototypes; one per process."""

    def __init__(self, path):
        self.path = path
        self.pid = os.getpid()
        lib = ctypes.CDLL(path)
        c_int, c_size, c_uptr, c_vp = ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p
        work_p = ctypes.POINTER(ctypes.c_uint64)
        proto = {
            "migctl_abi_version": ([], c_int),
            "migctl_init_from_env": ([], c_int),
            "migctl_init": ([c_int, c_int], c_int),
            "migctl_init_group": ([c_int, c_int, ctypes.c_char_p, ctypes.c_char_p], c_int),
            "migctl_serve": ([c_int, ctypes.c_char_p, c_size], c_int),
            "migctl_rank": ([], c_int),
            "migctl_size": ([], c_int),
            "migctl_local_rank": ([], c_int),
            "migctl_local_size": ([], c_int),
            "migctl_on_gpu": ([], c_int),
            "migctl_allreduce": ([c_vp, c_vp, c_size, c_int, c_int, c_int, c_uptr, work_p], c_int),
            "migctl_reduce_scatter": ([c_vp, c_vp, c_size, c_int, c_int, c_int, c_uptr, work_p], c_int),
            "migctl_all_gather": ([c_vp, c_vp, c_size, c_int, c_int, c_uptr, work_p], c_int),
            "migctl_broadcast": ([c_vp, c_vp, c_size, c_int, c_int, c_int, c_uptr, work_p], c_int),
            "migctl_barrier": ([work_p], c_int),
            # the one entry point the process group calls per collective: handle or error code
            "migctl_issue": ([c_int, c_vp, c_vp, c_size, c_int, c_int, c_int, c_int, c_uptr], ctypes.c_int64),
            # issue and wait in one call (synchronous callers): the result
            "migctl_run": ([c_int, c_vp, c_vp, c_size, c_int, c_int, c_int, c_int, c_uptr], c_int),
            "migctl_wait": ([ctypes.c_uint64, ctypes.c_int64], c_int),
            # wait with a CUDA stream ordered after the result, which may be queued only (ABI 15)
            "migctl_wait_stream": ([ctypes.c_uint64, c_uptr, ctypes.c_int64], c_int),
            "migctl_test": ([ctypes.c_uint64], c_int),
            "migctl_abort": ([ctypes.c_char_p], c_int),
            "migctl_set_timeout": ([ctypes.c_int64], c_int),
            "migctl_finalize": ([], c_int),
            "migctl_last_error": ([], ctypes.c_char_p),
            "migctl_stats": ([ctypes.POINTER(ctypes.c_uint64), c_size], c_int),
            # groups of some of the ranks (ABI 9)
            "migctl_new_group": ([ctypes.POINTER(c_int), c_int, ctypes.c_char_p], c_int),
            "migctl_free_group": ([c_int], c_int),
            "migctl_group_rank": ([c_int], c_int),
            "migctl_group_size": ([c_int], c_int),
            "migctl_issue_on": ([c_int, c_int, c_vp, c_vp, c_size, c_int, c_int, c_int, c_int, c_uptr], ctypes.c_int64),
            "migctl_run_on": ([c_int, c_int, c_vp, c_vp, c_size, c_int, c_int, c_int, c_int, c_uptr], c_int),
            "migctl_set_timeout_on": ([c_int, ctypes.c_int64], c_int),
            # how large a device broadcast migctl_run queues in stream order (ABI 13)
            "migctl_queued_broadcast_bytes": ([c_int], c_int),
            # whether migctl_wait_stream may return before the end (ABI 16)
            "migctl_completes_early": ([c_int], c_int),
        }
        for name, (args, res) in proto.items():
            f = getattr(lib, name)
            f.argtypes, f.restype = args, res
        self.lib = lib
        v = lib.migctl_abi_version()
        if v != ABI_VERSION:
            raise ImportError(
                f"{path} has C ABI version {v}, migctl_torch needs {ABI_VERSION}: "
                "rebuild it with `make lib` from the same checkout, or point MIGCTL_LIB at a matching one"
            )

    def error(self, code, what):
        text = self.lib.migctl_last_error() or b""
        text = text.decode(errors="replace") or _NAMES.get(code, f"error {code}")
        return MigctlError(code, f"migctl {what}: {text}")

    def check(self, code, what):
        if code != OK:
            raise self.error(code, what)

    def stats(self):
        """The library's counters (STATS) as a dict: where collectives' time went."""
        buf = (ctypes.c_uint64 * len(STATS))()
        n = self.lib.migctl_stats(buf, len(STATS))
        if n < 0:
            raise self.error(n, "stats")
        return dict(zip(STATS, buf[:min(n, len(STATS))]))

    def serve(self, size):
        """Hosts the rendezvous of a node's group of size ranks; returns its address."""
        buf = ctypes.create_string_buffer(128)
        self.check(self.lib.migctl_serve(size, buf, len(buf)), "serve")
        return buf.value.decode()

    def issue(self, fn, what, *args):
        """Calls a collective entry point and returns its handle."""
        if _forked:
            raise MigctlError(ERR_FORKED, f"migctl {what}: called in a process forked from the training "
                                          "process (a DataLoader worker?); only the training process may run collectives")
        h = ctypes.c_uint64(0)
        self.check(fn(*args, ctypes.byref(h)), what)
        return h.value


_lock = threading.Lock()
_lib = None
_forked = False  # set in a child forked from the process that loaded the library


def _mark_forked():
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_mark_forked)


def load():
    """Loads libmigctl.so once (see _candidates for where it is looked for)."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for p in _candidates():
            p = os.path.normpath(p)
            if os.path.exists(p):
                _lib = Library(p)
                return _lib
            tried.append(p)
        raise ImportError(
            "libmigctl.so not found (looked at: " + ", ".join(tried) + "): build it with `make lib` "
            "in the migctl checkout, or set MIGCTL_LIB=/path/to/libmigctl.so"
        )
