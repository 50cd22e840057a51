"""Domain cases: a brownian or laplace node's ``domain:`` with extreme, subnormal, one-ulp,
inverted or non-finite bounds, whose width overflows; ``--domain-from`` rows holding +-1e308
or NaN; ``--margin`` extremes.  Run through ``sample`` (EOF and rfs), ``kernel --eof`` and
``kernel``.  The oracle: a box whose bounds or width are not finite, or empty, is refused; for
every box accepted, rows well inside it get a positive kernel (brownian: exactly
prod (min(u, v) - u v), computed here) and features that are finite and not all zero, through
the feature file ``sample`` wrote (transformed here, in a child).
"""

from __future__ import annotations

import numpy as np

from .gen_skeletons import render

BIG = 1.7976931348623157e308
#: (lo, hi) bounds: ordinary, huge, tiny, a few ulps, inverted, empty, non-finite
BOUNDS = [(0.0, 1.0), (-2.0, 2.0), (-1e308, 1e308), (-BIG, BIG), (0.0, 1e308), (-1e308, 0.0), (1e-308, 2e-308),
          (0.0, 5e-324), (1.0, 1.0 + 2.0**-51), (1e300, 1.0000001e300), (0.0, float("inf")), (float("nan"), 1.0),
          (1.0, 1.0), (2.0, 1.0), (-1e200, 1e200), (-0.0, 0.0)]
MARGINS = [0.05, 0.0, 1e308, -0.5, -1.0, float("nan"), float("inf"), 1e-300, 0.5, 10.0, 1e300]
POKES = [1e308, -1e308, BIG, float("nan"), 5e-324, 1e300]


def _fmt(v: float) -> str:
    return repr(float(v)) if np.isfinite(v) else {"inf": ".inf", "-inf": "-.inf"}.get(str(v), ".nan")


def box_problem(lo, hi) -> str | None:
    """Why a box cannot be accepted (None when it can): non-finite bounds or width, lo >= hi."""
    lo, hi = np.atleast_1d(np.asarray(lo, dtype=np.float64)), np.atleast_1d(np.asarray(hi, dtype=np.float64))
    with np.errstate(all="ignore"):
        width = hi - lo
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        return "a domain bound that is not finite"
    if not (lo < hi).all():
        return "a domain with lo >= hi"
    if not np.isfinite(width).all():
        return "a domain whose width is not finite"
    return None


def measured_box(x, margin):
    """The box --domain-from measures: each column's min..max widened by margin x range."""
    with np.errstate(all="ignore"):
        a, b = x.min(axis=0), x.max(axis=0)
        r = b - a
        return a - margin * r, b + margin * r


def _skeleton(base, width, lo, hi, per_column):
    node = {"name": "k", "base": base}
    if base == "laplace":
        node["scale"] = 0.7
    text = render({"rfsgen": 1, "input": {"width": width}, "nodes": [node]})
    if per_column:  # lists: the first column gets the bounds, the others [0, 1]
        los, his = [_fmt(lo)] + ["0.0"] * (width - 1), [_fmt(hi)] + ["1.0"] * (width - 1)
        dom = f"[[{', '.join(los)}], [{', '.join(his)}]]"
    else:
        dom = f"[{_fmt(lo)}, {_fmt(hi)}]"
    return text.replace('"base": "' + base + '"', '"base": "' + base + '", "domain": ' + dom), \
        ([lo] + [0.0] * (width - 1), [hi] + [1.0] * (width - 1)) if per_column else ([lo] * width, [hi] * width)


def generate(rng: np.random.Generator, cid: str) -> dict:
    width = int(rng.choice([1, 2, 3]))
    base = str(rng.choice(["brownian", "brownian", "laplace"]))
    lo, hi = BOUNDS[rng.integers(len(BOUNDS))]
    text, (los, his) = _skeleton(base, width, lo, hi, bool(rng.random() < 0.3))
    files = {"s.yaml": {"text": text}}
    seed = int(rng.integers(2**31))
    must_fail = box_problem(los, his)
    from_rows = base == "laplace" or rng.random() < 0.4  # laplace has no kernel outside --eof
    cmd = str(rng.choice(["sample", "sample", "kernel"]))
    eof = from_rows or rng.random() < 0.6
    extra = []
    if eof and rng.random() < 0.5:  # the box measured from rows instead
        margin = float(rng.choice(MARGINS))
        tp = {"seed": seed + 1, "n": int(rng.integers(2, 20)), "width": width, "mode": "normal", "fmt": "npy"}
        if rng.random() < 0.5:
            tp.update(mode="uniform", lo=-3.0, hi=3.0, poke=[float(rng.choice(POKES))], density=0.1)
        files["train.npy"] = {"rows": tp}
        extra = ["--domain-from", "train.npy"]
        if rng.random() < 0.8:
            extra += ["--margin", repr(margin)]
        else:
            margin = 0.05  # the default
        from .gen_rows import make_array

        t = make_array(tp)
        los, his = measured_box(t, margin)
        must_fail = "NaN in the --domain-from rows" if np.isnan(t).any() else box_problem(los, his)
        if must_fail is None and np.isnan(margin):
            must_fail = "--margin nan"
        los, his = [float(v) for v in los], [float(v) for v in his]
    probe = {"seed": seed, "n": int(rng.integers(1, 8)), "width": width, "mode": "uniform", "fmt": "npy",
             "lo": los, "hi": his}
    box = {"lo": los, "hi": his} if must_fail is None else None
    if cmd == "sample":
        if eof:
            level = int(rng.choice([1, 2, 3]))
            argv = ["sample", "s.yaml", "--scheme", "eof", "--level", str(level)]
        else:
            argv = ["sample", "s.yaml", "-n", str(int(rng.choice([16, 64]))), "--seed", str(seed)]
        argv += extra + ["-o", "f.h5", "-q"]
        check = {"type": "sample", "columns": None if eof else int(argv[3]), "probe_rows": probe,
                 "then_transform": {"dtype": str(rng.choice(["float32", "float64"]))}}
        out = "f.h5"
    else:
        files["rows.npy"] = {"rows": probe}
        argv = ["kernel", "s.yaml", "rows.npy"] + (["--eof"] if eof else []) + extra + ["-o", "K.npy", "-q"]
        check = {"type": "kernel", "shape": [probe["n"]] * 2, "square": False, "probe_rows": probe,
                 "brownian": base == "brownian"}
        out = "K.npy"
    if box:
        check["box"] = box
    if must_fail:
        check["must_fail"] = must_fail
    return {"kind": "domains", "id": cid, "files": files, "ops": [], "argv": argv, "output": out, "check": check}
