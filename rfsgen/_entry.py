"""The console-script entry point (and ``python -m rfsgen``): route signals before
anything heavy is imported, run the command line, and end the process so that a
SIGINT, SIGTERM or SIGHUP at any moment ends it with 128 + N and one line.

The last step reports a signal received after the command's work ended (after the
output was renamed into place: the output is complete and kept) and leaves with
``os._exit``: the interpreter's shutdown would restore the default handlers, and a
signal then would kill the process without a word.  Every file is closed and every
output complete by then; stdout and stderr are flushed first.  The signals are
blocked for that last check: one that arrives later stays pending, unseen, as it
would for a process that has exited."""

from __future__ import annotations

import os
import signal
import sys

# The console script imports this module first: hold the signals from here until
# _signals.install() routes them (python -m rfsgen holds them from its first line).
if hasattr(signal, "pthread_sigmask"):  # POSIX
    signal.pthread_sigmask(signal.SIG_BLOCK, {getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP")
                                              if hasattr(signal, n)})


def main() -> None:
    code = 1
    try:
        from . import _signals

        _signals.install()
        _signals.reached("start")
        try:
            from .cli import main as cli_main

            cli_main(prog_name="rfsgen")  # ends with SystemExit
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:
        # A signal raised before the command line's own translation took over (its
        # import) or after it ended (between its end and here), or a bug's exception.
        code = _last_resort(e)
    os._exit(_finish(code))


def _last_resort(e: BaseException) -> int:
    from . import _signals

    _signals.finish()
    signum = _signals.received()
    if signum is None and isinstance(e, (KeyboardInterrupt, _signals.Terminated)):
        signum = 2 if isinstance(e, KeyboardInterrupt) else e.signum
    if signum is None:
        import traceback

        traceback.print_exception(e)  # a bug: its traceback is what a report needs
        return 1
    _say(signum)
    return 128 + signum


def _say(signum: int) -> None:
    from ._signals import message

    try:
        sys.stderr.write(f"rfsgen: error: {message(signum)}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _finish(code: int) -> int:
    """The exit code: ``code``, or 128 + N for a signal received after the command's
    work ended with success (reported in one line)."""
    import signal

    from . import _signals

    _signals.finish()  # from here the handler only records
    atomic = sys.modules.get(f"{__package__}.atomic")
    if atomic is not None:
        atomic.remove_own_temporaries()  # not moved into place: never a temporary file left
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            if stream is sys.stdout and code == 0:
                code = 141  # the reader went away before the last bytes were flushed
    _signals.reached("end")
    signal.pthread_sigmask(signal.SIG_BLOCK, _signals.HANDLED)
    late = signal.sigpending()  # (a function call: the handler of a signal caught just before runs here)
    signum = _signals.received()
    if signum is None:
        signum = next((int(s) for s in _signals.HANDLED if s in late), None)
    if signum is not None and code == 0:
        _say(signum)
        code = 128 + signum
    return code
