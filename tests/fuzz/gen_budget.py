"""Memory-budget cases: ``--max-memory 64M`` (the case's ``budget``) on inputs that would take
more: ``select`` from a 200,000-column pool, ``kernel --eof`` of thousands of rows, a transform
through an EOF file over 8,000 columns, a ``.npy`` on standard input declaring 10^12 rows read
near its end.  And process limits: an ``RLIMIT_AS`` (the case's ``memory_limit``) far below
``--max-memory``, which rfsgen must take as its ceiling.  The oracle: one line, or a peak RSS
within the budget (harness.RSS_OVERHEAD above it); never numpy's MemoryError.
"""

from __future__ import annotations

import numpy as np

BUDGETS = ["64M", "64M", "128M", "256M"]
#: (RLIMIT_AS, --max-memory): a process limit below the budget rfsgen is told
LIMITS = [("1G", "64G"), ("1500M", "1T"), ("2G", "16G")]


def _labels(n, seed):
    return {"fmt": "npy", "values": [int(v) for v in np.random.default_rng(seed).integers(0, 2, n)]}


def generate(rng: np.random.Generator, cid: str) -> dict:
    seed = int(rng.integers(2**31))
    k = int(rng.integers(5))
    if k == 0:  # select from a big pool
        n = int(rng.choice([30, 300, 3000]))
        files = {"pool.h5": {"fixture": "feat:gauss8-200k"},
                 "rows.npy": {"rows": {"seed": seed, "n": n, "width": 8, "mode": "normal", "fmt": "npy"}},
                 "y.npy": {"labels": _labels(n, seed)}}
        argv = ["select", "pool.h5", "rows.npy", "y.npy", "-n", str(int(rng.choice([16, 256]))), "--method",
                str(rng.choice(["eerf", "lkrf", "corr", "greedy"])), "-o", "out.h5", "-q"]  # greedy: a 200k x 200k Gram
        out, check = "out.h5", {"type": "sample", "columns": int(argv[5])}
    elif k == 1:  # kernel --eof of many rows
        n = int(rng.choice([3000, 4000, 8000]))
        files = {"s.yaml": {"skeleton": "brownian3"},
                 "rows.npy": {"rows": {"seed": seed, "n": n, "width": 4, "mode": "uniform", "lo": -2.0, "hi": 2.0,
                                       "fmt": "npy"}}}
        argv = ["kernel", "s.yaml", "rows.npy", "--eof", "-o", "K.npy", "-q"]
        out, check = "K.npy", {"type": "kernel_any"}
    elif k == 2:  # EOF transform over 8,000 columns
        n = int(rng.choice([4, 64, 512]))
        files = {"f.h5": {"fixture": "feat:eof-brownian-wide"},
                 "rows.npy": {"rows": {"seed": seed, "n": n, "width": 8000, "mode": "uniform", "fmt": "npy"}}}
        argv = ["transform", "f.h5", "rows.npy", "-o", "out.h5", "-q", "--layout", "dense"]
        out, check = "out.h5", {"type": "transform_any"}
    elif k == 3:  # a .npy on standard input declaring 10^12 rows, read near its end
        declared = 10**12
        files = {"f.h5": {"fixture": "feat:gauss8"},
                 "rows.npy": {"rows": {"fmt": "crafted-npy", "declared_rows": declared, "width": 8, "seed": seed}}}
        a = declared - int(rng.choice([1, 10, 1000]))
        argv = ["transform", "f.h5", "-", "-o", "out.h5", "-q", "--rows", f"{a}:{declared}"]
        return {"kind": "budget", "id": cid, "files": files, "ops": [], "argv": argv, "stdin": "rows.npy",
                "output": "out.h5", "check": {"type": "transform_any", "must_fail": "a .npy declaring 1e12 rows"},
                "budget": str(rng.choice(BUDGETS))}
    else:  # a process limit below --max-memory: a kernel or a transform sized past the limit
        cap, told = LIMITS[rng.integers(len(LIMITS))]
        n = int(rng.choice([12000, 20000, 40000]))
        rows = {"seed": seed, "n": n, "width": 8, "mode": "normal", "fmt": "npy"}
        if rng.random() < 0.5:
            files = {"s.yaml": {"skeleton": "gauss8"}, "rows.npy": {"rows": rows}}
            argv, out, check = ["kernel", "s.yaml", "rows.npy", "-o", "K.npy", "-q"], "K.npy", {"type": "kernel_any"}
        else:
            files = {"f.h5": {"fixture": "feat:circle-4k"}, "rows.npy": {"rows": rows}}
            argv = ["transform", "f.h5", "rows.npy", "-o", "out.h5", "-q", "--layout", "dense", "--dtype", "float64",
                    "--chunk-rows", str(n)]
            out, check = "out.h5", {"type": "transform_any"}
        return {"kind": "budget", "id": cid, "files": files, "ops": [], "argv": argv, "output": out, "check": check,
                "budget": told, "memory_limit": cap}
    return {"kind": "budget", "id": cid, "files": files, "ops": [], "argv": argv, "output": out, "check": check,
            "budget": str(rng.choice(BUDGETS))}
