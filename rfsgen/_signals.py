"""Interruptions: SIGINT, SIGTERM and SIGHUP end a run cleanly, at a safe point.

Batch schedulers send SIGTERM at a time limit and SIGHUP when a session ends; they
must leave no output and no temporary file, exactly like Ctrl-C.  The handlers
raise :class:`KeyboardInterrupt` (SIGINT) or :class:`Terminated` (the others) in
the main thread, which unwinds through the atomic-output context managers.  Inside
:func:`deferred` (short library sections such as HDF5 bookkeeping, where an
exception raised midway would be swallowed by h5py's cleanup code) the signal is
only recorded and raised when the section ends.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

HANDLED = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")) if s is not None)


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM or SIGHUP (not an error: like KeyboardInterrupt)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_depth = 0
_pending: int | None = None


def _raise(signum):
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


def _handler(signum, frame):
    global _pending
    if _depth:
        _pending = _pending or signum
        return
    _raise(signum)


def install() -> None:
    """Route SIGINT, SIGTERM and SIGHUP through :func:`_handler` (the CLI does this first)."""
    for s in HANDLED:
        signal.signal(s, _handler)


@contextmanager
def deferred():
    """Hold SIGINT/SIGTERM/SIGHUP until the block ends, then raise the first one."""
    global _depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {}
    for s in HANDLED:
        if signal.getsignal(s) is not _handler:
            saved[s] = signal.signal(s, _handler)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        for s, h in saved.items():
            signal.signal(s, h)
        if not _depth and _pending is not None:
            signum, _pending = _pending, None
            _raise(signum)


def checkpoint() -> None:
    """Inside :func:`deferred`: raise a signal received so far, at this safe point."""
    global _pending
    if _pending is not None and threading.current_thread() is threading.main_thread():
        signum, _pending = _pending, None
        _raise(signum)
