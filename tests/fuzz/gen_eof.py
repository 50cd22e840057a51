"""EOF seed and row cases (``--scheme eof``): seeds outside 0..2^63 - 1 (which every other scheme
refuses), rows holding NaN, infinity, +-1e308, subnormals or values outside the box through the
EOF fixtures (``transform``) and ``kernel --eof`` / ``approx --scheme eof``, and nodes of many
columns (d = 20..160) whose products of hats underflow float32; each with ``boundary: pinned`` or
``free``.  The oracle: NaN and infinity
are refused; every other row gives finite features, and a row inside the box (where both EOF
kernels are positive) a non-zero one with the whole grid, in float32 as in float64.
"""

from __future__ import annotations

import numpy as np

from . import fixtures
from .gen_skeletons import render

SEEDS = [-1, 2**64, 2**63, 2**63 - 1, 2**32, 0, 7, -(2**63), 2**64 - 1]
POKES = [float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 5e-324, -5e-324, 1e30, -50.0, 50.0]
#: The EOF fixtures' node: columns 1..3 of 4, its box (column 0 is not the node's)
BOXES = {"eof-brownian3": ([-2.0] * 3, [2.0] * 3), "eof-laplace3": ([-2.0, -1.0, -3.0], [2.0, 1.0, 3.0]),
         "eof-brownian3-free": ([-2.0] * 3, [2.0] * 3), "eof-laplace3-free": ([-2.0, -1.0, -3.0], [2.0, 1.0, 3.0])}
#: the limit kernel ``kernel --eof`` must equal (harness.eof_kernel): fixture -> (kernel, boundary, scale)
LIMITS = {"eof-brownian3": ("brownian", "pinned", None), "eof-laplace3": ("laplace", "pinned", 0.7),
          "eof-brownian3-free": ("brownian", "free", None), "eof-laplace3-free": ("laplace", "free", 0.7)}


def _rows(rng, lo, hi, width, pokes):
    p = {"seed": int(rng.integers(2**31)), "n": int(rng.integers(1, 12)), "width": width, "mode": "uniform",
         "fmt": "npy", "lo": lo, "hi": hi}
    if pokes:
        p.update(poke=[float(v) for v in rng.choice(POKES, int(rng.integers(1, 3)))],
                 density=float(rng.choice([0.02, 0.2, 1.0])))
    return p


def _nonfinite(p) -> bool:
    from .gen_rows import make_array

    return not np.isfinite(make_array(p)).all()


def generate(rng: np.random.Generator, cid: str) -> dict:
    k = rng.integers(10)
    if k < 2:  # seeds
        base = str(rng.choice(["brownian3", "laplacebox3"]))
        seed = int(rng.choice(SEEDS))
        n = int(rng.choice([1, 5, 40, 200]))
        if rng.random() < 0.4:
            base += "free"
        argv = ["sample", "s.yaml", "--scheme", "eof", "-n", str(n), "--seed", str(seed), "-o", "f.h5", "-q"]
        check = {"type": "sample", "columns": n}
        if not 0 <= seed < 2**63:
            check["must_fail"] = "a seed outside 0..2^63 - 1"
        return {"kind": "eof", "id": cid, "files": {"s.yaml": {"skeleton": base}}, "ops": [], "argv": argv,
                "output": "f.h5", "check": check}
    if k < 8:  # rows through the fixtures: transform, kernel --eof, approx --scheme eof
        feat = str(rng.choice(list(BOXES)))
        lo, hi = BOXES[feat]
        rows = _rows(rng, [-1.0] + lo, [1.0] + hi, 4, rng.random() < 0.7)
        box = {"lo": lo, "hi": hi, "columns": [1, 4]}
        files = {"rows.npy": {"rows": rows}}
        cmd = str(rng.choice(["transform", "transform", "kernel", "approx"]))
        if cmd == "transform":
            files["f.h5"] = {"fixture": f"feat:{feat}"}
            argv = ["transform", "f.h5", "rows.npy", "-o", "out.h5", "-q", "--layout", str(rng.choice(["dense", "csr"])),
                    "--dtype", str(rng.choice(["float32", "float64"]))]
            check = {"type": "transform", "rows": rows["n"], "columns": fixtures.columns_of(feat), "box": box,
                     "probe_rows": rows, "features": "f.h5"}
            out = "out.h5"
        elif cmd == "kernel":
            files["s.yaml"] = {"skeleton": fixtures.skeleton_of(feat)}
            argv = ["kernel", "s.yaml", "rows.npy", "--eof", "-o", "K.npy", "-q"]
            check = {"type": "kernel", "shape": [rows["n"]] * 2, "square": False, "box": box, "probe_rows": rows,
                     "limit": LIMITS[feat]}
            if LIMITS[feat][:2] == ("brownian", "free"):
                check["bound"] = 1.5 ** 3  # 1 + min(|u - 1/2|, |v - 1/2|) <= 3/2 per coordinate
            out = "K.npy"
        else:
            rows["n"] = max(rows["n"], 4)
            files["s.yaml"] = {"skeleton": fixtures.skeleton_of(feat)}
            argv = ["approx", "s.yaml", "rows.npy", "-n", "8,32", "--scheme", "eof", "--trials", "1", "--subset",
                    str(rows["n"]), "-q"]
            check, out = {"type": "approx"}, None
        if _nonfinite(rows):
            check["must_fail"] = "NaN or infinity in the rows"
        return {"kind": "eof", "id": cid, "files": files, "ops": [], "argv": argv, "output": out, "check": check}
    # many columns: float32 underflow of the products of hats
    d = int(rng.choice([20, 40, 81, 160]))
    base = str(rng.choice(["brownian", "laplace"]))
    node = {"name": "k", "base": base, "domain": [0, 1]}
    if base == "laplace":
        node["scale"] = 0.7
    rows = _rows(rng, 0.0, 1.0, d, False)
    box = {"lo": [0.0] * d, "hi": [1.0] * d}
    level = int(rng.choice([1, 2]))
    if rng.random() < 0.4:  # the free grid: level 0 (the kernel at the centre) is one more level
        node["boundary"] = "free"
        level += int(rng.integers(2))
    text = render({"rfsgen": 1, "input": {"width": d}, "nodes": [node]})
    argv = ["sample", "s.yaml", "--scheme", "eof", "--level", str(level), "-o", "f.h5", "-q"]
    check = {"type": "sample", "columns": None, "box": box, "probe_rows": rows,
             "then_transform": {"dtype": str(rng.choice(["float32", "float32", "float64"]))}}
    return {"kind": "eof", "id": cid, "files": {"s.yaml": {"text": text}}, "ops": [], "argv": argv, "output": "f.h5",
            "check": check}
