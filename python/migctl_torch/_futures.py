"""The Futures the backend hands out, and how a failed collective fails one.

torch's Python Future has no error that a C++ caller sees: set_exception
stores the exception as the Future's value (with an unwrap function only
Python's wait() and value() apply), and DDP's reducer, which takes the value
of a bucket's Future as a list of tensors, indexes an empty one and crashes
the process (seen with torch 1.13: a rank died mid-step and the survivors
got SIGSEGV in backward instead of an error). A callback that raises, on the
other hand, fails the Future that then() made with a C++ error: C++ wait()
throws it, DDP's backward raises it as a RuntimeError, and Python's wait()
raises it too. So the backend settles an inner Future with the result or a
_Failed and hands out inner.then(_unwrap)."""

import torch


class _Failed:
    """The inner Future's value for a collective that failed."""

    __slots__ = ("exc",)

    def __init__(self, exc):
        self.exc = exc


def _unwrap(fut):
    v = fut.value()
    if isinstance(v, _Failed):
        raise v.exc
    return v


def pair(devices=None):
    """(inner, outer): settle inner with settle(); hand out outer."""
    inner = torch.futures.Future(devices=devices) if devices else torch.futures.Future()
    return inner, inner.then(_unwrap)


def settle(inner, result, exc):
    """Completes inner with result, or makes its outer Future fail with exc."""
    inner.set_result(result if exc is None else _Failed(exc))
