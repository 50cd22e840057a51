"""The ``--max-memory`` and ``--threads`` options shared by the commands that compute."""

from __future__ import annotations

import functools

import click

HELP = ("Memory budget, e.g. 4G or 512M (default: $RFSGEN_MAX_MEMORY, else 75% of this machine's memory; never "
        "more than this process's limits leave: ulimit -v, ulimit -d, its cgroup). "
        "Work estimated to need more stops before it starts, with an error naming what and how much.")


def _parse(ctx, param, value):
    if value is None:
        return None
    from ..budget import parse_size
    from ..errors import UsageError

    try:
        return parse_size(value)
    except UsageError as e:
        raise click.BadParameter(str(e).split(": ", 1)[-1]) from None


def max_memory_option(fn):
    """Add ``--max-memory SIZE`` to a command and run its body inside
    :func:`rfsgen.budget.limited` (place it below ``translate_errors``)."""

    @click.option("--max-memory", metavar="SIZE", callback=_parse, help=HELP)
    @functools.wraps(fn)
    def wrapper(*args, max_memory=None, **kwargs):
        from ..budget import limited

        with limited(max_memory):
            return fn(*args, **kwargs)

    return wrapper


def _threads(ctx, param, value):
    if value is None:
        return None
    from .._threads import check
    from ..errors import UsageError

    try:
        return check(value, "--threads")
    except UsageError as e:  # "--threads is 3; give 1 to 2 (...)"
        raise click.BadParameter(str(e).replace("--threads is ", "", 1)) from None


def threads_option(fn):
    """Add ``--threads N`` to a command and run its body on N threads
    (:func:`rfsgen._threads.using`; place it below ``translate_errors``)."""

    @click.option("--threads", type=int, metavar="N", callback=_threads,
                  help="Threads to compute on, 1 to this machine's cores (default: all of them, or "
                       "$NUMBA_NUM_THREADS). The output is the same bytes for every N.")
    @functools.wraps(fn)
    def wrapper(*args, threads=None, **kwargs):
        from .._threads import using

        with using(threads):
            return fn(*args, **kwargs)

    return wrapper
