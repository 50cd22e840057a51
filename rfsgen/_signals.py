"""Interruptions: SIGINT, SIGTERM and SIGHUP end a run cleanly, whenever they arrive.

Batch schedulers send SIGTERM at a time limit (and cancel jobs at any moment) and
SIGHUP when a session ends; these must end a run exactly like Ctrl-C: exit status
128 + N, one line on stderr, no output and no temporary file.  The command line
(:mod:`rfsgen._entry`) calls :func:`install` first thing; from then on:

* The handler raises :class:`KeyboardInterrupt` (SIGINT) or :class:`Terminated`
  (the others) in the main thread, **once**: a second signal (a scheduler's
  repeated SIGTERM, a double Ctrl-C) is recorded but never raised inside the clean-up
  that the first one started.
* Inside :func:`deferred` (HDF5 bookkeeping, where h5py would turn an exception raised
  in its file callbacks into an error of its own; numba's compilation, where an
  exception raised while llvmlite holds its lock deadlocks the next compilation) a
  signal is only recorded and raised when the section ends.
* The signal of a run is never lost, even if an exception is swallowed or wrapped on
  its way (h5py, numba's imports): :func:`commit` (the rename of an output into place,
  :mod:`rfsgen.atomic`) refuses once any signal was received, and the CLI reports the
  received signal whatever exception (or success) the run ends with.
* The rule after the output is complete: a signal received after an output was renamed
  into place still ends the run with 128 + N and one line, which says that the output
  is complete and was kept (:data:`committed` lists such outputs).
* :func:`finish` ends the run: from then on signals are only recorded, and the CLI's
  last step reports one recorded so far and exits at once (``os._exit``), so that no
  signal falls into the interpreter's shutdown.

Library use (no :func:`install`): :func:`deferred` installs the handler for its block
only and afterwards delivers a held signal to the handler that was there before
(Python's default raises KeyboardInterrupt for SIGINT; SIGTERM's default ends the
process).
"""

from __future__ import annotations

import signal
import sys
import threading
import time

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


_installed = False   # install() routed the signals here for the whole process (the CLI)
_armed = False       # the handler may raise (else it only records)
_depth = 0           # nesting of deferred() blocks in the main thread
_pending: int | None = None   # a signal recorded and not raised yet
_received: int | None = None  # the first signal of this run, raised or not
#: Outputs renamed into place during this run (by :func:`commit`), for the message.
committed: list[str] = []


def _exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _handler(signum, frame):
    global _pending, _received, _armed
    if _installed and _received is None:
        _received = signum
    if _depth or not _armed:
        if _pending is None:
            _pending = signum
        return
    if _unsafe(frame):
        _retry(signum)
        return
    _armed = False  # raise once: never again inside the clean-up this one starts
    raise _raising(signum)


_last: BaseException | None = None  # the exception the handler raised last


def _raising(signum: int) -> BaseException:
    global _last
    _last = _exception(signum)
    return _last


def _unraisable(info) -> None:
    """``sys.unraisablehook`` while the CLI runs: the signal's exception raised where
    Python ignores exceptions (a weakref callback, a finaliser) is not printed but
    raised again, 2 ms later, wherever the run is then."""
    global _armed
    if _last is not None and info.exc_value is _last:
        signum = _last.signum if isinstance(_last, Terminated) else int(signal.SIGINT)
        _armed = True
        _retry(signum)
        return
    sys.__unraisablehook__(info)


def _retry(signum: int) -> None:
    """Deliver ``signum`` to the main thread again in 2 ms (from a short-lived thread),
    until the handler finds it out of an unsafe place (and raises) or the run ends."""

    global _depth
    out = threading.Event()

    def later():
        out.wait()  # the redelivery must not land in the start() below (it would be held and lost)
        time.sleep(0.002)
        if _armed:
            signal.pthread_kill(threading.main_thread().ident, signum)

    # Thread.start() waits for the thread: another signal then would be raised inside this
    # function (inside the unraisable hook or an unsafe frame); held, it is only recorded
    # (this retry raises the run's signal in any case).
    _depth += 1
    try:
        threading.Thread(target=later, name="rfsgen-signal", daemon=True).start()
    finally:
        _depth -= 1
        out.set()


#: Code whose frames must not see the signal's exception, besides every ``__del__``
#: (Python prints "Exception ignored" and drops it): HDF5's callbacks into SafeFile
#: (h5py turns the exception into an error of its own), registered by rfsgen.atomic.
UNSAFE_CODE: set = set()


def _unsafe(frame) -> bool:
    """Whether ``frame`` or a caller is a place where an exception would be ignored or
    leave a lock held: a ``__del__``, Python's import machinery (its lock callbacks
    ignore exceptions; a module half imported is worse than one imported a moment
    later), llvmlite and numba (llvmlite's lock is taken and released by plain calls,
    and its objects are disposed of in ``__del__``), HDF5's callbacks."""
    import os

    libs = tuple(os.path.dirname(m.__file__) + os.sep for m in map(sys.modules.get, ("llvmlite", "numba"))
                 if m is not None and getattr(m, "__file__", None))
    while frame is not None:
        code = frame.f_code
        if (code.co_name == "__del__" or code in UNSAFE_CODE or code.co_filename.startswith("<frozen importlib")
                or code.co_filename.startswith(libs)):
            return True
        frame = frame.f_back
    return False


def install() -> None:
    """Route SIGINT, SIGTERM and SIGHUP through this module for the rest of the process
    and start a run (the CLI does this first)."""
    global _installed, _armed, _pending, _received, _depth, _pause_at
    for s in HANDLED:
        if signal.getsignal(s) is not signal.SIG_IGN:  # ignored (nohup, a background job): stays so
            signal.signal(s, _handler)
    if hasattr(signal, "SIGXFSZ"):
        # Past the file-size limit (ulimit -f) a write then fails with EFBIG, which the
        # writer reports in one line and cleans up after; the default action kills the
        # process and leaves its temporary file behind.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    sys.unraisablehook = _unraisable
    _installed = True
    _depth = 0
    _pending = _received = None
    committed.clear()
    _armed = True
    import os

    hook = os.environ.get("RFSGEN_SIGNAL_PAUSE")
    _pause_at = hook.split("=", 1) if hook and "=" in hook else None
    # The entry point holds them until now (rfsgen/__main__.py, _entry's import): one that
    # arrived meanwhile is delivered here, to the handler.
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)


#: Tests only: ``RFSGEN_SIGNAL_PAUSE=PHASE=FILE`` makes the run stop the first time it
#: reaches PHASE (see :func:`reached`), create FILE and wait for a signal there, so that
#: a test can deliver one at exactly that point.  Unset, each phase costs one test.
_pause_at: list[str] | None = None


def reached(phase: str) -> None:
    """A named point of a run (``start``, ``parse``, ``compile``, ``deferred``,
    ``commit``, ``committed``, ``end``): pauses there when ``RFSGEN_SIGNAL_PAUSE`` asks."""
    if _pause_at is not None and _pause_at[0] == phase:
        _pause(phase)


def _pause(phase: str) -> None:
    global _pause_at
    import time

    path = _pause_at[1]
    _pause_at = None  # once
    with open(path, "w") as fh:
        fh.write(phase)
    end = time.monotonic() + 120
    # The handler runs (and, where it may, raises) between these sleeps; a signal that
    # is held (deferred) ends the wait, and the run goes on to where it is raised.
    while _received is None and time.monotonic() < end:
        time.sleep(0.005)


def received() -> int | None:
    """The first signal received since :func:`install`, or None."""
    return _received


def message(signum: int) -> str:
    """The CLI's line (after ``rfsgen: error: ``) for a run ended by ``signum``: whether
    an output completed before the signal (it is then complete and kept) or none was
    written."""
    from .errors import one_line

    what = "interrupted" if signum == signal.SIGINT else f"terminated by {signal.Signals(signum).name}"
    if committed:
        return one_line(f"{what} after {', '.join(committed)} was complete; the output was kept")
    return f"{what}; no output was written"


def finish() -> int | None:
    """End the run: signals are only recorded from now on.  Returns the first signal
    received during the run (or None)."""
    global _armed
    _armed = False
    return _received


def _raise_pending() -> None:
    """Raise the signal recorded so far, if the handler may raise (once)."""
    global _pending, _armed
    if _pending is not None and _armed:
        signum, _pending = _pending, None
        _armed = False
        raise _raising(signum)


class _Deferred:
    """``with deferred():`` (a class, not a generator: it is entered around every
    compilation check and should cost well under a microsecond)."""

    __slots__ = ("saved", "main")

    def __enter__(self):
        global _depth
        self.main = threading.current_thread() is threading.main_thread()
        self.saved = None
        if not self.main:
            return self  # handlers run in the main thread only: nothing to hold here
        if not _installed:
            self.saved = {s: signal.signal(s, _handler) for s in HANDLED if signal.getsignal(s) is not _handler}
        _depth += 1
        if _pause_at is not None:
            reached("deferred")
        return self

    def __exit__(self, *exc):
        global _depth, _pending
        if not self.main:
            return False
        _depth -= 1
        if _depth:
            return False
        if self.saved is not None:
            for s, h in self.saved.items():
                signal.signal(s, h)
            if _pending is not None:
                # Library use: hand the held signal to the handler that was there before.
                signum, _pending = _pending, None
                signal.raise_signal(signum)
            return False
        _raise_pending()
        return False


def deferred() -> _Deferred:
    """Hold SIGINT/SIGTERM/SIGHUP until the block ends, then raise the first one."""
    return _Deferred()


def checkpoint() -> None:
    """Inside :func:`deferred`: raise a signal received so far, at this safe point."""
    global _pending
    if _pending is None or threading.current_thread() is not threading.main_thread():
        return
    if _installed:
        _raise_pending()
    else:
        signum, _pending = _pending, None
        raise _exception(signum)


def commit(path, move) -> None:
    """Call ``move()`` (which renames a complete output to ``path``) unless a signal was
    received during this run; a signal that arrives during the move is raised after it
    (``path`` is then listed in :data:`committed`: the output is complete and stays).

    The last check and the move run with signals held, so either the signal is raised
    before anything was moved, or the move is complete and the signal follows."""
    global _armed, _pending
    with deferred():
        if _installed and _received is not None:
            # Raised before (and perhaps swallowed or wrapped on its way), or held: the
            # output must not appear.
            _armed = False
            _pending = None
            raise _exception(_received)
        if not _installed:
            checkpoint()
        reached("commit")
        move()
        if _installed:
            committed.append(str(path))
            reached("committed")
