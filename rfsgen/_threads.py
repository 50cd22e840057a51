"""``--threads N`` and ``threads=``: how many threads rfsgen computes on.

Every parallel part of rfsgen (the compiled transform loops, the output writer's and
checksum's thread pools, the sampler's block walkers) takes its thread count from
numba's (:func:`rfsgen._compiled.threads`), which is all cores by default
(``NUMBA_NUM_THREADS``).  :func:`using` sets it for the calling thread for the span of
a call; the results are the same bytes for every count.
"""

from __future__ import annotations

import contextlib

from .errors import UsageError


def most() -> int:
    """The most threads allowed: numba's ``NUMBA_NUM_THREADS`` (this machine's cores unless
    that variable lowers it)."""
    import numba

    return int(numba.config.NUMBA_NUM_THREADS)


def check(n, name: str = "threads") -> int:
    """``n`` as an int in 1 .. :func:`most`, else a one-line :class:`UsageError`."""
    top = most()
    if isinstance(n, bool) or not isinstance(n, int) and not (hasattr(n, "is_integer") and n.is_integer()):
        raise UsageError(f"{name} must be a whole number of threads, 1 to {top}, got {n!r}")
    n = int(n)
    if not 1 <= n <= top:
        raise UsageError(f"{name} is {n}; give 1 to {top} (this machine's cores, or NUMBA_NUM_THREADS when set)")
    return n


@contextlib.contextmanager
def using(n):
    """Compute on ``n`` threads (checked by :func:`check`) inside the block; ``None``: as
    before (all cores unless set otherwise).  Yields the count in use."""
    import numba

    if n is None:
        yield int(numba.get_num_threads())
        return
    n = check(n)
    before = numba.get_num_threads()
    numba.set_num_threads(n)  # this thread's: every pool rfsgen starts from it reads it
    try:
        yield n
    finally:
        numba.set_num_threads(before)
