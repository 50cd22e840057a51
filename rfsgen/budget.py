"""The memory budget: one bound, checked from arithmetic before memory is spent.

Every place that is about to allocate an amount that an input decides (a skeleton's
expansion, a sampler's tables, a kernel matrix, a transform's chunk, a dataset read
from a file that came from elsewhere) asks :func:`check` first, with its estimate in
bytes.  Over the budget it raises :class:`~rfsgen.errors.LimitError`, one line naming
what needed the memory, the estimate, the budget and the fix.

The budget is, in order: the innermost :func:`limited` block (the CLI's
``--max-memory``), the environment variable ``RFSGEN_MAX_MEMORY``, or 75% of the
machine's memory (the smaller of physical memory and a cgroup limit).  Sizes are
written as bytes or with a unit: ``512M``, ``4G``, ``1.5GiB``, ``2e9``.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager

from .errors import LimitError, UsageError

ENV = "RFSGEN_MAX_MEMORY"
DEFAULT_FRACTION = 0.75

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:e[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)

_override: list[int] = []


def parse_size(text, where: str = "--max-memory") -> int:
    """Bytes from ``'4G'``, ``'512MiB'``, ``'2e9'`` or an int; a usage error otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _SIZE.match(str(text))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise UsageError(f"{where}: {text!r} is not a size; write bytes or a number with a unit, e.g. 4G or 512M")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value < 1:
        raise UsageError(f"{where}: {text!r} must be a positive size, e.g. 4G")
    return value


def machine_memory() -> int:
    """Bytes of memory this process may use: physical memory, or a smaller cgroup limit."""
    total = 0
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as fh:
                raw = fh.read().strip()
        except OSError:
            continue
        if raw.isdigit() and 0 < int(raw) < (total or 1 << 62):
            total = int(raw)
    return total or 8 << 30


def limit() -> int:
    """The budget in force, in bytes."""
    if _override:
        return _override[-1]
    env = os.environ.get(ENV)
    if env:
        return parse_size(env, where=ENV)
    return int(machine_memory() * DEFAULT_FRACTION)


@contextmanager
def limited(nbytes):
    """Use ``nbytes`` (an int or a size string; None keeps the current budget) inside the block."""
    if nbytes is None:
        yield
        return
    _override.append(parse_size(nbytes))
    try:
        yield
    finally:
        _override.pop()


def fmt(nbytes: float) -> str:
    """``1.5 GiB``-style text for a byte count."""
    n = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


def check(nbytes: float, what: str, fix: str = "") -> None:
    """Raise :class:`LimitError` when ``nbytes`` (an estimate, may be a float or huge)
    exceeds the budget.  ``what`` names the object and place (``"skeleton 'a.yaml',
    node 'h': the sampler's terms"``); ``fix`` says what the user can change."""
    budget = limit()
    if nbytes > budget:
        hint = f"; {fix}" if fix else ""
        raise LimitError(f"{what} needs about {fmt(nbytes)}, over the memory budget of {fmt(budget)}{hint} "
                         f"(or raise the budget with --max-memory or {ENV})")
