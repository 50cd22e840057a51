"""Expression cases (``activation: {name: function, expr: ...}``): legal expressions, and ones
with poles or that are not square-integrable under the standard normal (``1/(x-0.3)``,
``tan(x)``, ``exp(x**2)``), numbers out of float range, NaN-producing or identically-zero
ones, nesting at and past the documented limits (20 levels of brackets, 200 syntax nodes,
1,000 characters), and skeletons of many distinct expressions.  Run through ``skeleton``,
``sample`` and ``kernel``; what the docs call an error must be one (``must_fail``).
"""

from __future__ import annotations

import numpy as np

from .gen_skeletons import render

#: Expressions every command must accept (square-integrable, finite, not identically zero).
VALID = ["tanh(x) + 0.5 * x", "where(x > 0, x, 0.1 * x)", "sin(3 * x)", "erf(x) * x", "x ** 3 - x", "clip(x, -1, 1)",
         "log1p(abs(x))", "exp(x ** 2 / 5)", "arctan(x) + cos(x)", "sign(x)", "heaviside(x, 0.5)", "sqrt(abs(x))",
         "maximum(x, 0) ** 2", "1e308 * x", "1e-300 * tanh(x)", "minimum(x, 1) - 0.5", "x / (1 + x ** 2)"]
#: Expressions the docs make an error: a pole or a value not finite for some x, not square-integrable
#: under the standard normal, NaN for some x, identically zero, or a number out of float range.
INVALID = {
    "a pole": ["1 / (x - 0.3)", "1 / x", "tan(x)", "1 / sin(x)", "x / (x - 1)", "1 / (x ** 2 - 2)"],
    "not square-integrable": ["exp(x ** 2)", "exp(x ** 2 / 4)", "exp(x ** 2 / 2) * x", "cosh(x) ** (x * x)",
                              "exp(exp(x))"],
    "NaN for some x": ["sqrt(x)", "log(x)", "x ** 0.5", "log(x - 1)", "sqrt(1 - x ** 2)"],
    "not finite at a point": ["log(abs(x))", "1 / sqrt(abs(x))"],
    "identically zero": ["0 * x", "x - x", "sin(x) - sin(x)", "maximum(x, 0) + minimum(x, 0) - x"],
    "a number out of range": ["1" + "0" * 400 + " * x", "1e400 * x", "x ** 1e400", "-1e309 + x",
                              "x * " + "9" * 330],
}


def _nested(rng):
    """Nesting near the documented limits: brackets, calls, syntax nodes, characters."""
    k = int(rng.choice([19, 20, 21, 40, 500]))
    how = rng.integers(4)
    if how == 0:
        return "(" * k + "x" + ")" * k, k > 20
    if how == 1:
        return "sin(" * k + "x" + ")" * k, k > 20
    if how == 2:
        m = int(rng.choice([50, 99, 100, 101, 150, 1000]))
        return "x" + " + x" * m, 2 * m + 1 > 200 or len("x" + " + x" * m) > 1000
    m = int(rng.choice([990, 1000, 1001, 5000]))
    e = "x + " + "0" * (m - 4)  # long number: one node, many characters
    return e, len(e) > 1000


def _skeleton(exprs, width):
    nodes = [{"name": "v", "base": "sphere", "scheme": "pair"}] if width > 1 else [
        {"name": "v", "base": "gaussian", "scale": 0.5}]
    names = []
    for i, e in enumerate(exprs):
        nodes.append({"name": f"f{i}", "activation": {"name": "function", "expr": e}, "inputs": ["v"]})
        names.append(f"f{i}")
    if len(names) > 1:
        nodes.append({"name": "out", "activation": "relu", "inputs": names})
    return {"rfsgen": 1, "input": {"width": width}, "nodes": nodes}


def generate(rng: np.random.Generator, cid: str) -> dict:
    width = int(rng.choice([1, 4, 8]))
    must_fail = None
    r = rng.random()
    if r < 0.3:
        exprs = [str(rng.choice(VALID))]
    elif r < 0.7:
        why = str(rng.choice(list(INVALID)))
        exprs = [str(rng.choice(INVALID[why]))]
        must_fail = f"an expression with {why}" if why != "identically zero" else "an identically zero expression"
        if rng.random() < 0.3:  # beside legal ones
            exprs = [str(rng.choice(VALID))] + exprs
    elif r < 0.92:
        e, over = _nested(rng)
        exprs = [e]
        if over:
            must_fail = "an expression past the documented size limits"
    else:  # many distinct legal expressions in one skeleton
        m = int(rng.choice([2, 10, 30, 100, 400]))
        exprs = [f"tanh({round(0.1 + 0.01 * i, 2)} * x) + {i % 7} * x" for i in range(m)]
    text = render(_skeleton(exprs, width))
    files = {"s.yaml": {"text": text}}
    cmd = str(rng.choice(["skeleton", "sample", "sample", "kernel"]))
    if cmd == "skeleton":
        argv, out, check = ["skeleton", "s.yaml"], None, {"type": "skeleton"}
    elif cmd == "sample":
        n = int(rng.choice([1, 8, 64]))
        argv = ["sample", "s.yaml", "-n", str(n), "--seed", str(int(rng.integers(2**31))), "-o", "f.h5", "-q"]
        out, check = "f.h5", {"type": "sample", "columns": n}
    else:
        n = int(rng.integers(1, 6))
        files["rows.npy"] = {"rows": {"seed": int(rng.integers(2**31)), "n": n, "width": width, "mode": "normal",
                                      "fmt": "npy"}}
        argv, out = ["kernel", "s.yaml", "rows.npy", "-o", "K.npy", "-q"], "K.npy"
        check = {"type": "kernel", "shape": [n, n], "square": True}
    if must_fail:
        check["must_fail"] = must_fail
    return {"kind": "expressions", "id": cid, "files": files, "ops": [], "argv": argv, "output": out, "check": check}


def shrink(case):
    """Fewer expressions: drop one function node (and the out node when one is left)."""
    from .gen_skeletons import shrink as drop_a_line

    yield from drop_a_line(case)
