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

Whatever is asked, the process's own limits are ceilings (:func:`ceiling`): what is
left under its address-space limit (``RLIMIT_AS``, ``ulimit -v``), under its data
limit (``RLIMIT_DATA``, ``ulimit -d``), and in its memory cgroups (``memory.max`` or
``memory.limit_in_bytes`` of its own cgroup, named in ``/proc/self/cgroup``, and of each
ancestor, less the memory that cgroup already holds outside the page cache; the
tightest binds).  A budget past such a ceiling would only trade the budget's one-line error
for numpy's ``MemoryError``; the error then names the ceiling and how to raise it.
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
    """Bytes of memory this process may use: physical memory, or a smaller limit of its
    memory cgroup (the tightest from its own cgroup up to the root, :func:`cgroup_limits`)."""
    total = 0
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        pass
    for _, cap, *_rest in cgroup_limits():
        if 0 < cap < (total or 1 << 62):
            total = cap
    return total or 8 << 30


def _proc_status() -> dict:
    """``{'VmSize': bytes, 'VmData': bytes, ...}`` of this process (Linux), else {}."""
    out = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                    out[key] = int(parts[0]) << 10
    except OSError:
        pass
    return out


def _read_int(path: str):
    try:
        with open(path) as fh:
            raw = fh.read().strip()
    except OSError:
        return None
    return int(raw) if raw.isdigit() else None


#: Where this process's cgroups are named and where the cgroup file systems are mounted
#: (module attributes, so that tests can point them at a fake tree).
PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"

#: The memory controller's files, v2 then v1: (the hierarchy's directory under
#: :data:`CGROUP_ROOT`, limit, usage, statistics, the page cache's key in the statistics).
CGROUP_FILES = (("", "memory.max", "memory.current", "memory.stat", "file"),
                ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat", "total_cache"))


def _own_cgroups() -> dict:
    """``{0: path}`` for the v2 (unified) hierarchy and ``{1: path}`` for v1's memory
    controller, from :data:`PROC_CGROUP` (``0::/a/b``, ``4:memory:/a/b``); {} unreadable."""
    own = {}
    try:
        with open(PROC_CGROUP) as fh:
            text = fh.read(1 << 16)
    except OSError:
        return own
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            own.setdefault(0, path)
        elif "memory" in controllers.split(","):
            own.setdefault(1, path)
    return own


def _levels(path: str) -> list:
    """``'/a/b'`` -> ``['a/b', 'a', '']``: a cgroup and each of its ancestors, the root last."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    return ["/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def cgroup_limits() -> list:
    """``[(limit file, limit, usage file, statistics file, page-cache key)]``: every memory
    limit over this process, from its own cgroup (:data:`PROC_CGROUP`, v2 and v1) up to
    the root of each hierarchy.  A level whose directory is not visible (a container that
    sees only its own cgroup at the root) is passed over; "max" (no limit) is left out."""
    own = _own_cgroups()
    found = []
    for version, (sub, limit_name, usage_name, stat_name, key) in enumerate(CGROUP_FILES):
        base = os.path.join(CGROUP_ROOT, sub) if sub else CGROUP_ROOT
        for rel in _levels(own.get(version, "/")):
            d = os.path.join(base, rel) if rel else base
            cap = _read_int(os.path.join(d, limit_name))
            if cap is None or cap >= 1 << 60:  # "max", or v1's "no limit" (a page short of 2^63)
                continue
            found.append((os.path.join(d, limit_name), cap, os.path.join(d, usage_name), os.path.join(d, stat_name),
                          key))
    return found


def _cgroup_room():
    """``(bytes left, limit file)`` under the tightest of this process's memory cgroups
    (:func:`cgroup_limits`): at each level its limit less what that cgroup holds outside
    the (reclaimable) page cache; None without a limit."""
    best = None
    for limit_file, cap, usage_file, stat_file, stat_key in cgroup_limits():
        used = _read_int(usage_file) or 0
        try:
            with open(stat_file) as fh:
                for line in fh:
                    k, _, v = line.partition(" ")
                    if k == stat_key and v.strip().isdigit():
                        used -= int(v)
                        break
        except OSError:
            pass
        room = max(0, cap - max(used, 0))
        if best is None or room < best[0]:
            best = (room, limit_file)
    return best


def ceiling():
    """``(bytes, why)``: the most this process can still allocate under its own limits
    (module docstring), with the limit that binds named for messages; ``(None, "")``
    when no such limit is set."""
    best, why = None, ""
    status = None
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        resource = None
    if resource is not None:
        for name, key, shell in (("RLIMIT_AS", "VmSize", "ulimit -v"), ("RLIMIT_DATA", "VmData", "ulimit -d")):
            res = getattr(resource, name, None)
            if res is None:
                continue
            try:
                soft = resource.getrlimit(res)[0]
            except (OSError, ValueError):
                continue
            if soft == resource.RLIM_INFINITY or soft < 0:
                continue
            if status is None:
                status = _proc_status()
            room = max(0, soft - status.get(key, 0))
            if best is None or room < best:
                best, why = room, f"what this process may still allocate under its limit {name} ({shell})"
    cg = _cgroup_room()
    if cg is not None and (best is None or cg[0] < best):
        best, why = cg[0], f"what is left in this process's memory cgroup ({cg[1]})"
    return best, why


def _in_force():
    """``(bytes, why)``: the budget in force and, when a process limit binds, its name."""
    if _override:
        asked = _override[-1]
    else:
        env = os.environ.get(ENV)
        asked = parse_size(env, where=ENV) if env else int(machine_memory() * DEFAULT_FRACTION)
    cap, why = ceiling()
    if cap is not None and cap < asked:
        return max(cap, 1), why
    return asked, ""


def limit() -> int:
    """The budget in force, in bytes: the one asked for (:func:`limited`, the
    environment, or the default), at most :func:`ceiling`."""
    return _in_force()[0]


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
    budget, why = _in_force()
    if nbytes > budget:
        raise _over(nbytes, what, fix, budget, why)


def room(per_unit: float) -> int:
    """How many units of ``per_unit`` bytes the budget in force holds (at least 1): for a
    reader that bounds a piece of input (a line of text) before reading it, then reports
    one past it with :func:`refuse`."""
    return max(1, int(_in_force()[0] // per_unit))


def refuse(nbytes: float, what: str, fix: str = "") -> None:
    """Raise :func:`check`'s error for ``nbytes`` (a lower bound: "needs more than")
    whatever the budget is now (a reader that stopped at :func:`room` has decided)."""
    budget, why = _in_force()
    raise _over(max(nbytes, budget + 1), what, fix, budget, why, "needs more than")


def _over(nbytes, what, fix, budget, why, needs="needs about") -> LimitError:
    hint = f"; {fix}" if fix else ""
    if why:
        return LimitError(f"{what} {needs} {fmt(nbytes)}, over the memory budget of {fmt(budget)}, {why}{hint} "
                          "(or raise that limit)")
    return LimitError(f"{what} {needs} {fmt(nbytes)}, over the memory budget of {fmt(budget)}{hint} "
                      f"(or raise the budget with --max-memory or {ENV})")
