"""A slow, obviously-correct evaluator of base factors and feature columns, for the tests.

It follows DESIGN.md's formulas literally (one complex number per factor,
Python-level products) and shares no code with rfsgen's transform.
"""

import cmath
import math

import numpy as np


def factor(base, x_node: np.ndarray, code: int, power: int, omega=None) -> complex:
    """psi of one combined base factor on one node's raw values ``x_node`` (1-D)."""
    name = base.name
    p = dict(base.params)
    if name == "binary":
        return complex(x_node[0] ** power)
    if name == "circle":
        return cmath.exp(1j * power * p["scale"] * x_node[0])
    if name == "categorical":
        n = p["categories"]
        return cmath.exp(2j * math.pi * power * x_node[0] / n)
    if name in ("gaussian", "laplace"):
        return cmath.exp(1j * p["scale"] * float(np.dot(omega, x_node)))
    if name == "sphere":
        d = x_node.size
        norm = math.sqrt(float(np.dot(x_node, x_node)))
        v = x_node / norm if norm > 0 else np.full(d, 1 / math.sqrt(d))
        if p["scheme"] == "pair":
            j, s = code // 2, (-1 if code % 2 else 1)
            return (math.sqrt(d / 2) * complex(v[j], s * v[(j + 1) % d])) ** power
        return complex((math.sqrt(d) * v[code]) ** power)
    if name == "brownian":  # code (m - 1) w + j: sin(m pi u_j) / sqrt(3), u the value in the node's box
        from rfsgen.bases import box_of

        lo, hi = box_of(base)
        w = x_node.size
        m, j = code // w + 1, code % w
        u = (x_node[j] - lo[j]) / (hi[j] - lo[j])
        return complex((math.sin(m * math.pi * u) / math.sqrt(3)) ** power)
    raise AssertionError(name)


def feature_value(skel, x_row, terms, omegas) -> complex:
    """Product of a feature's factors on one input row. ``terms`` = [(node, code, power)]."""
    val = 1 + 0j
    for node, code, power in terms:
        n = skel.nodes[node]
        cols = np.array(n.columns)
        om = omegas[code] if n.base.continuous else None
        val *= factor(n.base, x_row[cols], code, power, om)
    return val


def column_value(skel, x_row, terms, omegas, kind, weight) -> float:
    """DESIGN.md's real column: psi if real (kind 0), else sqrt(2) R cos(theta + b), scaled by sqrt(w)."""
    psi = feature_value(skel, x_row, terms, omegas)
    if kind == 0:
        val = psi.real
    else:
        b = 0.0 if kind == 1 else math.pi / 2
        val = math.sqrt(2) * abs(psi) * math.cos(cmath.phase(psi) + b)
    return math.sqrt(weight) * val
