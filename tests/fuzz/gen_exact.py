"""Exact-count cases: tiny skeletons of w binary (+-1) inputs under ``coefficients``, whose distinct
features are known here: a degree-k feature is the product of k picks among the w inputs, i.e.
the parity of a subset S with |S| <= k and |S| = k mod 2 (x_i x_i = 1).  ``-n`` up to that count,
with ``--scheme exact`` (and rfs / strat): a valid request, which must succeed (``must_succeed``:
a refusal with a false count is a silent wrong result) with exactly -n columns.
"""

from __future__ import annotations

from math import comb

import numpy as np

from .gen_skeletons import render


def distinct_features(width: int, coefficients) -> int:
    """How many distinct functions the degrees with a positive coefficient give over ``width``
    +-1 inputs: the subsets S of the inputs with |S| <= k and |S| = k (mod 2), for each such k."""
    sizes = {s for k, c in enumerate(coefficients) if c > 0 for s in range(k % 2, min(k, width) + 1, 2)}
    return sum(comb(width, s) for s in sizes)


def generate(rng: np.random.Generator, cid: str) -> dict:
    width = int(rng.integers(1, 5))
    degrees = int(rng.choice([2, 2, 1, 3, 4]))  # degrees 0 and 1 only (all enumerated by exact) half the time
    coef = [float(np.round(v, 3)) if rng.random() < 0.7 else 0.0 for v in rng.uniform(0.05, 1, degrees)]
    if not any(coef):
        coef[-1] = 0.5
    sk = {"rfsgen": 1, "input": {"width": width},
          "nodes": [{"name": "b", "base": "binary", "per": "column"},
                    {"name": "out", "activation": {"name": "coefficients", "values": coef}, "inputs": ["b"]}]}
    count = distinct_features(width, coef)
    n = int(rng.choice([count, count, max(1, count - 1), int(rng.integers(1, count + 1))]))
    scheme = str(rng.choice(["exact", "exact", "exact", "rfs", "strat"]))
    argv = ["sample", "s.yaml", "-n", str(n), "--scheme", scheme, "--seed", str(int(rng.integers(2**31))), "-o",
            "f.h5", "-q"]
    check = {"type": "sample", "columns": n,
             "must_succeed": f"-n {n} of the {count} distinct features of {width} binary inputs under {coef}"}
    return {"kind": "exact", "id": cid, "files": {"s.yaml": {"text": render(sk)}}, "ops": [], "argv": argv,
            "output": "f.h5", "check": check}
