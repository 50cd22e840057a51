"""The ``--max-memory`` option shared by the commands that spend memory on their inputs."""

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
