"""Entropic optimal features (EOF; DESIGN.md section 9, seeds/002_f98ed459b9c81ecb.txt).

EOF applies to a skeleton whose kernel is one product Markov kernel on a box: one
``laplace`` node (taken *pinned* on the cube's faces) or one ``brownian`` node.  Rows
are mapped to the unit cube, ``u = (x - lo) / (hi - lo)`` per column (clipped to
[0, 1]; clipped values are counted), and per column the 1-D kernel is

- brownian: ``k1(u, v) = min(u, v) - u v``;
- pinned laplace (scale s in the unit cube, ``s = scale (hi - lo)``):
  ``k1 = e(u, v) - e(u, B) E(B, B)^-1 e(B, v)``, ``e = exp(-s |u - v|)``, ``B = {0, 1}``,
  in closed form ``2 sinh(s min) sinh(s (1 - max)) / sinh(s)``.

1-D features: on the dyadic grids ``G_l = {i / 2^l}``, level l's increment has the
orthogonal basis ``phi_{l,i}`` (i odd) supported on the parent cell
``[a, b] = [(i-1)/2^l, (i+1)/2^l]``; by the Markov property ``k1 - k1_{l-1}`` on that
cell is the Green's function ``G_ab`` of the same operator on [a, b] with zero ends, so
``phi_{l,i}(u) = G_ab(u, g) / sqrt(G_ab(g, g))`` with ``g = i / 2^l``:

- brownian: ``G_ab(u, v) = (min - a)(b - max) / (b - a)``: phi is the hat
  ``dist(u, {a, b}) / sqrt(b - a)`` on the cell;
- pinned laplace: ``G_ab(u, v) = 2 sinh(s (min - a)) sinh(s (b - max)) / sinh(s (b - a))``,
  evaluated as ``e^{-s (max - min)} (1 - e^{-2 s (min - a)}) (1 - e^{-2 s (b - max)}) /
  (1 - e^{-2 s (b - a)})`` (no overflow for large s); ``G_ab(g, g) = tanh(s h)``,
  ``h = 2^-l``.

d-D features are tensor products over level vectors ``l`` (entries >= 1) of the sparse
grid ``I_n = {l : |l|_1 <= n + d - 1}`` and odd index vectors.  Evaluation is the seed's
Algorithm 1: per row and level vector only the index ``i_j = 2 floor(u_j 2^(l_j - 1)) + 1``
can be non-zero, so a row costs O(|I_n| d), and has at most |I_n| non-zeros.

**Boundary.** A node's ``boundary:`` (rfsgen.bases.BOUNDARIES) picks the 1-D kernel:
``pinned`` (the default, the seed's: the kernels above, zero on the faces) or ``free``:

- free laplace: ``k1(u, v) = exp(-s |u - v|)`` -- the product is the laplace kernel
  ``exp(-scale |x - x'|_1)`` itself for rows in the box;
- free brownian: ``k1(u, v) = 1 + [(u - 1/2)(v - 1/2) > 0] min(|u - 1/2|, |v - 1/2|)``, the
  kernel of ``||f||^2 = f(1/2)^2 + int_0^1 f'^2``.

Its levels start at 0, on the nested point sets ``S_0 = {1/2}``, ``S_1 = {0, 1/2, 1}``,
``S_l = {i / 2^l : 0 <= i <= 2^l}``: level 0 is one function on [0, 1],
``k1(u, 1/2) / sqrt(k1(1/2, 1/2))`` (laplace ``exp(-s |u - 1/2|)``, brownian 1); level 1 two, one
per half, the face's function pinned at 1/2 (laplace ``exp(-s u) (1 - exp(-2 s (1/2 - u))) /
sqrt(1 - exp(-s))`` on [0, 1/2] and its mirror, brownian ``sqrt(2) (1/2 - u)`` and its mirror);
levels l >= 2 are the pinned levels.  Level vectors have entries >= 0 and the sparse grid is
``I_n = {l : |l|_1 <= n - 1}`` (as many level vectors as the pinned grid); the features reproduce
``sum_{l in I_n} prod_j (k1_{l_j} - k1_{l_j - 1})``, k1_l the Nystrom interpolant on S_l
(k1_{-1} = 0), and converge to the product of the free k1.  In the compiled loop a free level l
is *slot level* l + 1 (:func:`_factor_any`), so the root takes the place of the pinned level 1.

In the feature file an EOF set is an ordinary feature set with scheme ``eof``, one draw
and no terms per column, plus the datasets ``eof_level`` and ``eof_index`` (uint,
``(D, d)``: each column's level and odd index vectors) and the root attribute ``eof``
(JSON: kernel, node, level n, lo, hi, margin, domain source; ``boundary: "free"`` for a free
node, nothing for a pinned one); format version 3.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numba
import numpy as np

from .errors import DataError, FeatureFileError, LimitError, UsageError, article, count
from .featureset import ColumnKind

KERNELS = ("brownian", "laplace")
#: Deepest 1-D level: cells 2^-l and cell numbers stay exact in float64 and int64.
MAX_LEVEL = 50
#: Default margin of a domain measured from rows, as a fraction of each column's range.
DEFAULT_MARGIN = 0.05
#: Format version of feature files holding EOF columns (other files keep theirs): 5, the
#: skeleton as an HDF5 string (rfsgen.features.FORMAT_VERSION 4); 3, as uint8 bytes, still read.
FORMAT_VERSION = 5
#: The laplace unit-cube scale s = scale (hi - lo) must lie in this range: beyond it the
#: 1-D features' exponentials under- or overflow float64 (s = 0 or inf would give NaN).
UNIT_SCALE_RANGE = (1e-100, 1e100)
#: Features are scaled by 2^e (``scale_exponent`` in the file) when a typical row's
#: feature vector would otherwise have a norm below 2^-SCALE_FROM (tiny in float32);
#: below that no scale is recorded and the features are the unscaled ones (their bytes
#: unchanged since format version 3).
SCALE_FROM = 32
#: ... and so that no feature of any row exceeds 2^PEAK_LOG2 (:func:`scale_exponent`).
PEAK_LOG2 = 120


# ---------------------------------------------------------------------- 1-D mathematics
def k1(kernel: str, s, u, v, boundary: str = "pinned"):
    """The 1-D kernel on the unit interval, elementwise (broadcasting): float64.
    ``s`` is the scale in unit-cube coordinates (ignored by brownian).  ``boundary``
    ``free``: laplace ``exp(-s |u - v|)``, brownian ``1 + [(u - 1/2)(v - 1/2) > 0]
    min(|u - 1/2|, |v - 1/2|)`` (module docstring)."""
    u, v = np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64)
    if boundary == "free":
        if kernel == "brownian":
            a, b = u - 0.5, v - 0.5
            return 1.0 + np.where(a * b > 0, np.minimum(np.abs(a), np.abs(b)), 0.0)
        return np.exp(-np.asarray(s, dtype=np.float64) * np.abs(u - v))
    lo, hi = np.minimum(u, v), np.maximum(u, v)
    if kernel == "brownian":
        return lo * (1.0 - hi)
    s = np.asarray(s, dtype=np.float64)
    return np.exp(-s * (hi - lo)) * -np.expm1(-2.0 * s * lo) * -np.expm1(-2.0 * s * (1.0 - hi)) / -np.expm1(-2.0 * s)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _norms(kernel, s, level):  # pragma: no cover - compiled
    """The two divisors of a level's 1-D features, which depend on the scale and the
    level only (not on x): computed once per column and level, not once per value."""
    h = 1.0 / (2.0 * (1 << (level - 1)))
    if kernel == 0:
        return math.sqrt(2.0 * h), 1.0
    return -math.expm1(-4.0 * s * h), math.sqrt(math.tanh(s * h))


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _factor_normed(kernel, s, x, level, n1, n2):  # pragma: no cover - compiled
    """:func:`_factor` with the level's divisors ``n1, n2`` (:func:`_norms`) given: the same bits."""
    if not x >= 0.0:  # below the cube, or NaN: its face (callers clip; this proves 0 <= c)
        x = 0.0
    elif x > 1.0:
        x = 1.0
    half = 1 << (level - 1)
    c = int(math.floor(x * half))
    if c > half - 1:
        c = half - 1  # x = 1: the last cell (where phi is 0)
    h = 1.0 / (2.0 * half)  # 2^-level, exact
    a = 2.0 * c * h
    g = a + h
    b = g + h
    if kernel == 0:  # brownian: the hat of height sqrt(h / 2)
        d = x - a if x <= g else b - x
        return c, d / n1
    mn = x if x < g else g
    mx = x if x > g else g
    num = math.exp(-s * (mx - mn)) * -math.expm1(-2.0 * s * (mn - a)) * -math.expm1(-2.0 * s * (b - mx))
    return c, num / n1 / n2


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _factor(kernel, s, x, level):  # pragma: no cover - compiled
    """(cell, value): the parent cell number c (index i = 2c + 1) of level ``level`` that
    holds ``x`` in [0, 1], and phi_{level, 2c+1}(x)."""
    n1, n2 = _norms(kernel, s, level)
    return _factor_normed(kernel, s, x, level, n1, n2)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _norms_free(kernel, s, level):  # pragma: no cover - compiled
    """:func:`_norms` of the free boundary's level ``level`` >= 0 (levels >= 2: the pinned ones)."""
    if level == 0:
        return 1.0, 1.0
    if level == 1:
        if kernel == 0:
            return math.sqrt(2.0), 1.0
        return math.sqrt(-math.expm1(-s)), 1.0
    return _norms(kernel, s, level)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _factor_free(kernel, s, x, level, n1, n2):  # pragma: no cover - compiled
    """(cell, value) of the free boundary's level ``level`` >= 0 at ``x``: level 0 the one
    function of the centre (laplace ``exp(-s |x - 1/2|)``, brownian 1), level 1 the two
    face functions on the halves [0, 1/2] and [1/2, 1] (pinned at 1/2, free at the face),
    levels >= 2 the pinned ones (:func:`_factor_normed`)."""
    if not x >= 0.0:  # below the cube, or NaN: its face (callers clip)
        x = 0.0
    elif x > 1.0:
        x = 1.0
    if level == 0:
        if kernel == 0:
            return 0, 1.0
        return 0, math.exp(-s * abs(x - 0.5))
    if level == 1:
        c = 0 if x < 0.5 else 1
        t = 0.5 - x if c == 0 else x - 0.5  # distance to the centre, in [0, 1/2]
        if kernel == 0:  # the ramp sqrt(2) (1/2 - dist to the face)
            return c, t * n1
        f = x if c == 0 else 1.0 - x  # distance to the face
        return c, math.exp(-s * f) * -math.expm1(-2.0 * s * t) / n1
    return _factor_normed(kernel, s, x, level, n1, n2)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _norms_any(kernel, free, s, slot_level):  # pragma: no cover - compiled
    """The divisors of a slot level (free: level ``slot_level - 1``; pinned: ``slot_level``)."""
    if free:
        return _norms_free(kernel, s, slot_level - 1)
    return _norms(kernel, s, slot_level)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _factor_any(kernel, free, s, x, slot_level, n1, n2):  # pragma: no cover - compiled
    """(cell, value) at a slot level: level ``slot_level - 1`` of the free boundary (its
    level 0, one cell, is slot level 1 as the pinned grid's level 1), else the pinned level."""
    if free:
        return _factor_free(kernel, s, x, slot_level - 1, n1, n2)
    return _factor_normed(kernel, s, x, slot_level, n1, n2)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _edge(kernel, free, s, slot_level):  # pragma: no cover - compiled
    """``-expm1(-2 s h)``, ``h = 2^-level`` of the pinned level at a slot level (laplace; else 0):
    a pinned level's factor at the half of its cell that ``x`` is not in (``b - g = g - a = h``
    exactly), the same bits as computed per value."""
    level = slot_level - 1 if free else slot_level
    if kernel == 0 or level < (2 if free else 1):
        return 0.0
    h = 1.0 / (2.0 * (1 << (level - 1)))
    return -math.expm1(-2.0 * s * h)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _level_tables(kernel, free, s, d, top, n1, n2, edge):  # pragma: no cover - compiled
    """Columns ``0..d-1``'s per-level divisors and edge factors (``n1, n2, edge``: ``(d, top + 1)``,
    levels 1..top filled), which depend on the scale and the level only."""
    for j in range(d):
        for l in range(1, top + 1):
            n1[j, l], n2[j, l] = _norms_any(kernel, free, s[j], l)
            edge[j, l] = _edge(kernel, free, s[j], l)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _run_products(val, d, seg):  # pragma: no cover - compiled
    """``seg[a, b] = prod_{a <= k < b} val[k, 1]`` for ``0 <= a <= b <= d``, in increasing k:
    the level-1 factors of the columns a level vector leaves at level 1."""
    for a in range(d + 1):
        p = 1.0
        seg[a, a] = p
        for b in range(a + 1, d + 1):
            p *= val[b - 1, 1]
            seg[a, b] = p


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _row_factors(kernel, free, s, u, r, top, n1, n2, edge, mult, cell, val):  # pragma: no cover - compiled
    """``cell[j, l], val[j, l] = _factor_any(kernel, free, s[j], u[r, j], l, n1[j, l], n2[j, l])`` times
    ``mult[j]``, for every column ``j`` of row ``r`` and slot level ``l = 1..top``: the same bits
    with one transcendental call fewer per pinned laplace level.  Its value is ``exp(-s (max -
    min)) E(min - a) E(b - max)`` (``E(t) = -expm1(-2 s t)``, ``min, max`` of ``x`` and the
    centre ``g``), and the ``E`` of the half of the cell that does not hold ``x`` is ``E(h)``
    (``g - a = b - g = h`` exactly: the cells are exact in float64), the level's own, computed
    once per column (``edge[j, l]``, :func:`_edge`).  Branch-free (selects): which half holds
    ``x`` is a coin toss.  (Levels reuse no other call: a cell's endpoint on x's side is often
    the level before's, but a branch to skip its ``E`` costs more than the call saves.)"""
    d = u.shape[1]
    first = 3 if free else 1  # free: the root and face levels (slot levels 1, 2), then the pinned levels from 2
    for j in range(d):
        x = u[r, j]
        if not x >= 0.0:  # below the cube, or NaN: its face (as _factor_normed)
            x = 0.0
        elif x > 1.0:
            x = 1.0
        sj = s[j]
        mj = mult[j]
        if free:
            for l in range(1, min(top, 2) + 1):
                c, v = _factor_free(kernel, sj, x, l - 1, n1[j, l], n2[j, l])
                cell[j, l] = c
                val[j, l] = v * mj
        if kernel == 0:
            for l in range(first, top + 1):
                c, v = _factor_normed(kernel, sj, x, l - 1 if free else l, n1[j, l], n2[j, l])
                cell[j, l] = c
                val[j, l] = v * mj
            continue
        for l in range(first, top + 1):
            level = l - 1 if free else l
            half = 1 << (level - 1)
            c = int(math.floor(x * half))
            if c > half - 1:
                c = half - 1  # x = 1: the last cell (where phi is 0)
            h = 1.0 / (2.0 * half)  # 2^-level, exact
            a = 2.0 * c * h
            g = a + h
            b = g + h
            lt = x < g
            e = -math.expm1(-2.0 * sj * ((x - a) if lt else (b - x)))  # x = g: b - x = h, E(h)
            ed = edge[j, l]
            num = math.exp(-sj * ((g - x) if lt else (x - g))) * (e if lt else ed) * (ed if lt else e)
            cell[j, l] = c
            val[j, l] = num / n1[j, l] / n2[j, l] * mj


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _factors(kernel, free, s, u, top, cell, val):  # pragma: no cover - compiled
    for r in range(u.shape[0]):
        for j in range(u.shape[1]):
            for l in range(1, top + 1):
                n1, n2 = _norms_any(kernel, free, s[j], l)
                c, v = _factor_any(kernel, free, s[j], u[r, j], l, n1, n2)
                cell[r, j, l] = c
                val[r, j, l] = v


def factors(kernel: str, s, u: np.ndarray, top: int, boundary: str = "pinned"):
    """Per row, column and level ``1..top``: the parent cell number (int64, index
    ``i = 2 c + 1``) and the 1-D feature's value, each ``(m, d, top + 1)`` (level 0 unused).
    ``u`` is float64 ``(m, d)`` in [0, 1]; ``s`` the per-column unit-cube scales ``(d,)``.
    ``boundary`` ``free``: entry ``l`` holds the free boundary's level ``l - 1``."""
    u = np.ascontiguousarray(u, dtype=np.float64)
    m, d = u.shape
    cell = np.zeros((m, d, top + 1), np.int64)
    val = np.zeros((m, d, top + 1))
    _factors(KERNELS.index(kernel), boundary == "free",
             np.ascontiguousarray(np.broadcast_to(np.asarray(s, np.float64), (d,))), u, top, cell, val)
    return cell, val


# ---------------------------------------------------------------------- sparse grids
def grid_counts(n: int, d: int, free: bool = False) -> tuple[int, int]:
    """(level vectors, features) of the sparse grid I_n in d dimensions (Python ints):
    ``C(n - 1 + d, d)`` and ``sum_{k < n} C(k + d - 1, d - 1) 2^k``.  ``free``: the free
    boundary's grid (levels from 0, ``|l|_1 <= n - 1``, 1, 2, 2, 4, 8, ... cells per level):
    the same level vectors, ``sum_{k < n} [x^k] W(x)^d`` features with
    ``W(x) = 1 + 2 x + sum_{l >= 2} 2^(l - 1) x^l``."""
    vectors = math.comb(n - 1 + d, d)
    if not free:
        return vectors, sum(math.comb(k + d - 1, d - 1) << k for k in range(n))

    def mul(a, b):  # product of two polynomials truncated at degree n - 1
        out = [0] * n
        for i, x in enumerate(a):
            if x:
                for j in range(n - i):
                    out[i + j] += x * b[j]
        return out

    w = [1] + [cells_per_level(k, True) for k in range(1, n)]
    power, base, e = [1] + [0] * (n - 1), w, d
    while e:
        if e & 1:
            power = mul(power, base)
        e >>= 1
        if e:
            base = mul(base, base)
    return vectors, sum(power)


def cells_per_level(level: int, free: bool = False) -> int:
    """The cells (features) of one coordinate at ``level``: pinned 2^(l - 1) (l >= 1); free
    1 at level 0, 2 at level 1 (the halves), 2^(l - 1) from level 2."""
    return 1 if free and level == 0 else 1 << (max(level, 2) - 1 if free else level - 1)


def cells_per(levels: np.ndarray, free: bool = False) -> np.ndarray:
    """:func:`cells_per_level` elementwise, int64."""
    levels = np.asarray(levels, dtype=np.int64)
    if not free:
        return np.left_shift(1, levels - 1).astype(np.int64)
    return np.where(levels == 0, 1, np.left_shift(1, np.maximum(levels - 1, 1))).astype(np.int64)


def level_vectors(n: int, d: int, full: bool = False, free: bool = False) -> np.ndarray:
    """The level vectors of I_n (``full``: of the full grid, max_j l_j <= n), int64 ``(T, d)``,
    in lexicographic order.  ``free``: levels from 0 (each entry one less: ``|l|_1 <= n - 1``,
    full ``max_j l_j <= n - 1``)."""
    if full:
        grids = np.meshgrid(*[np.arange(1, n + 1)] * d, indexing="ij")
        out = np.stack([g.ravel() for g in grids], axis=1).astype(np.int64)
    else:
        out = np.empty((math.comb(n - 1 + d, d), d), np.int64)
        if d:
            _compositions(n - 1, out)
    if free:
        out -= 1
    return out


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _compositions(cap, out):  # pragma: no cover - compiled
    """Every vector of d = out.shape[1] levels >= 1 whose excesses (l_j - 1) sum to at most
    ``cap``, in lexicographic order, into ``out`` (one row each): an odometer that steps
    the last coordinate it can raise and resets those after it to 1."""
    d = out.shape[1]
    cur = np.ones(d, np.int64)
    used = 0  # sum of (cur_j - 1)
    row = 0
    while True:
        out[row, :] = cur
        row += 1
        j = d - 1
        while j >= 0 and used >= cap:  # no room: drop trailing coordinates back to 1
            used -= cur[j] - 1
            cur[j] = 1
            j -= 1
            if j >= 0 and used < cap:
                break
        if j < 0:
            return
        cur[j] += 1
        used += 1


def enumerate_features(levels: np.ndarray, free: bool = False):
    """All features of the level vectors ``levels`` ``(T, d)``: their level-vector number
    ``t`` (int64 ``(F,)``) and cell vectors (int64 ``(F, d)``, index ``2 c + 1``), in
    level-vector order and, within one, row-major over the cells (last column fastest):
    feature ``off[t] + sum_j c_j stride[t, j]`` (see :func:`strides`)."""
    off, stride, sizes = strides(levels, free)
    total = int(sizes.sum())
    t = np.repeat(np.arange(levels.shape[0]), sizes)
    k = np.arange(total) - off[t]
    cells = (k[:, None] // stride[t]) % cells_per(levels[t], free)
    return t, cells


def features_at(levels: np.ndarray, numbers: np.ndarray, free: bool = False):
    """The level-vector number and cell vector of the features numbered ``numbers``
    (sorted int64, in :func:`enumerate_features`' numbering) without enumerating the rest."""
    off, _, _ = strides(levels, free)
    t = np.searchsorted(off, numbers, side="right") - 1
    cells = np.empty((numbers.size, levels.shape[1]), np.int64)
    _cells_at(np.ascontiguousarray(cells_per(levels, free), dtype=np.int64), off, t,
              np.ascontiguousarray(numbers, dtype=np.int64), cells)
    return t, cells


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _cells_at(per_cells, off, t, numbers, cells):  # pragma: no cover - compiled
    """Row-major digits of ``numbers[i] - off[t[i]]`` in the cell counts ``per_cells[t[i]]``
    of level vector ``t[i]`` (the last column fastest): one pass, no (D, d) temporaries."""
    d = per_cells.shape[1]
    for i in range(numbers.size):
        k = numbers[i] - off[t[i]]
        for j in range(d - 1, -1, -1):
            per = per_cells[t[i], j]
            cells[i, j] = k % per
            k //= per


def strides(levels: np.ndarray, free: bool = False):
    """(off, stride, sizes) of level vectors ``(T, d)``: each vector's ``prod_j cells(l_j)``
    features (pinned ``2^(|l|_1 - d)``) numbered row-major from ``off[t]``; int64 ``(T,)``,
    ``(T, d)``, ``(T,)``."""
    per = cells_per(levels, free)
    stride = np.ones_like(per)
    if levels.shape[1] > 1:
        stride[:, :-1] = np.cumprod(per[:, ::-1], axis=1)[:, ::-1][:, 1:]
    sizes = np.prod(per, axis=1)
    off = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    return off, stride, sizes


def smallest_level(d: int, columns: int, free: bool = False) -> int:
    """The smallest n with at least ``columns`` features in I_n."""
    n = 1
    while grid_counts(n, d, free)[1] < columns:
        n += 1
    return n


# ---------------------------------------------------------------------- the skeleton's node
@dataclass(frozen=True)
class Spec:
    """What EOF needs from a skeleton: its one laplace/brownian node and box."""

    kernel: str
    node: str  # the node's label
    columns: tuple  # input columns of the node, (d,)
    scale: float  # laplace's scale in input units (brownian: 0)
    domain: tuple | None  # the node's stated (lo, hi) arrays, or None
    boundary: str = "pinned"  # the node's 'boundary:' (rfsgen.bases.BOUNDARIES)

    @property
    def d(self) -> int:
        return len(self.columns)

    @property
    def free(self) -> bool:
        return self.boundary == "free"


def spec_of(skel) -> Spec:
    """The EOF description of ``skel``, or :class:`UsageError` saying why it has none."""
    from .bases import box_of, boundary_of
    from .skeleton import InputNode

    out = skel.nodes[skel.output]
    why = None
    if not isinstance(out, InputNode):
        why = f"its output is node '{out.label}', an internal node"
    elif out.base.name not in KERNELS:
        why = f"its output node '{out.label}' has base {out.base.name}"
    if why:
        raise UsageError(f"{skel.path}: --scheme eof needs a skeleton whose kernel is one laplace or brownian node "
                         f"(a product Markov kernel), but {why}; use --scheme rfs for it")
    dom = dict(out.base.params).get("domain")
    box = box_of(out.base) if dom is not None or out.base.name == "brownian" else None
    scale = out.base.param("scale") if out.base.name == "laplace" else 0.0
    return Spec(out.base.name, out.label, tuple(out.columns), scale, box, boundary_of(out.base))


def measure_domain(spec: Spec, rows, margin: float = DEFAULT_MARGIN):
    """Per-column (lo, hi) of the node's columns over ``rows`` (anything
    :func:`rfsgen.inputs.open_input` reads), each widened by ``margin`` times the range.
    A constant column has no box: :class:`DataError`."""
    from .inputs import open_input

    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin >= 0):
        raise UsageError(f"--margin must be a number >= 0, got {margin!r}")
    cols = np.array(spec.columns, dtype=np.int64)
    lo = np.full(cols.size, np.inf)
    hi = np.full(cols.size, -np.inf)
    with open_input(rows) as src:
        name = src.name
        if src.width <= cols.max():
            raise UsageError(f"{name}: rows have {count(src.width, 'value')} but node '{spec.node}' reads column "
                             f"{int(cols.max())}; pass the training rows the skeleton was written for")
        known = src.column_extremes(cols)  # a COO matrix: from its stored values, no row streamed
        if known is not None:
            lo, hi = known
        for row0, block in src.chunks(1 << 14) if known is None else ():
            x = np.asarray(block[:, cols], dtype=np.float64)
            if not np.isfinite(x).all():
                r, c = np.argwhere(~np.isfinite(x))[0]
                raise DataError(f"{name}: row {row0 + int(r)}, column {int(cols[c])}: value {x[r, c]} is not finite; "
                                "clean the training rows before measuring a domain from them")
            lo = np.minimum(lo, x.min(axis=0, initial=np.inf))
            hi = np.maximum(hi, x.max(axis=0, initial=-np.inf))
    if not np.isfinite(lo).all():
        raise DataError(f"{name}: no rows to measure a domain from; pass the training rows")
    flat = np.flatnonzero(hi <= lo)
    if flat.size:
        c = int(flat[0])
        raise DataError(f"{name}: column {int(cols[c])} is constant ({lo[c]:g}) on every row: it has no box to map "
                        f"to [0, 1]; drop it from node '{spec.node}' or state 'domain:' for the node")
    check_box(spec, lo, hi, DataError, f"{name}: the rows' range of",
              "rescale the column (e.g. standardise it) or state 'domain:' for the node")
    with np.errstate(over="ignore", invalid="ignore"):
        width = hi - lo
        lo, hi = lo - margin * width, hi + margin * width
    check_box(spec, lo, hi, UsageError, f"--margin {margin:g} widens", "use a smaller --margin")
    return lo, hi


def check_box(spec: Spec, lo, hi, error=UsageError, where: str = "the box of", fix: str = "state another box"):
    """Raise ``error`` (one line: ``where`` node and column, why, ``fix``) unless every column
    of the box ``[lo, hi]`` maps to [0, 1] safely (:func:`rfsgen.bases.box_problem`: finite
    bounds and width, 2^20 float64 values at least) and, for laplace, the unit-cube scale
    ``scale (hi - lo)`` lies in :data:`UNIT_SCALE_RANGE`."""
    from .bases import box_problem

    lo, hi = (np.atleast_1d(np.asarray(a, dtype=np.float64)) for a in (lo, hi))
    problem = box_problem(lo, hi)
    if problem is None and spec.kernel == "laplace":
        with np.errstate(over="ignore"):
            s = spec.scale * (hi - lo)
        bad = np.flatnonzero(~((s >= UNIT_SCALE_RANGE[0]) & (s <= UNIT_SCALE_RANGE[1])))
        if bad.size:
            c = int(bad[0])
            problem = c, (f"[{lo[c]:g}, {hi[c]:g}] times scale {spec.scale:g} is {s[c]:g} in unit-cube units, outside "
                          f"[{UNIT_SCALE_RANGE[0]:g}, {UNIT_SCALE_RANGE[1]:g}] (EOF's features would under- or overflow)")
    if problem is not None:
        c, why = problem
        col = spec.columns[c] if c < len(spec.columns) else c
        raise error(f"{where} node '{spec.node}', column {col}: {why}; {fix}")


# ---------------------------------------------------------------------- sampling
def sample(skel, *, columns: int | None = None, level: int | None = None, seed: int = 0, domain=None,
           margin=None, domain_source: str = "skeleton"):
    """An EOF :class:`~rfsgen.features.FeatureSet` for ``skel``.

    ``level`` n: every feature of I_n.  ``columns`` D: the smallest level with at least D
    features and, if it has more, a uniform subset of D drawn with ``seed`` (kept in
    feature order).  ``domain``: (lo, hi) per column (from :func:`measure_domain`), else
    the node's stated ``domain:`` (laplace needs one of the two)."""
    from . import budget
    from .featureset import FeatureSet

    spec = spec_of(skel)
    d = spec.d
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**63:
        raise UsageError(f"--seed must be an integer from 0 to 2**63 - 1, got {seed!r}")
    seed = int(seed)
    if (columns is None) == (level is None):
        raise UsageError("--scheme eof takes either -n D or --level N")
    if level is not None:
        if isinstance(level, bool) or not isinstance(level, int) or level < 1:
            raise UsageError(f"--level must be an integer >= 1, got {level!r}")
        n = level
    else:
        if columns < 1:
            raise UsageError(f"-n must be at least 1, got {columns}")
        # the number of features at level n grows at least as 2^(n-1): n <= log2(D) + 1
        n = smallest_level(d, columns, spec.free)
    if n > MAX_LEVEL:
        raise LimitError(f"EOF level {n} is beyond the deepest level {MAX_LEVEL} (cells of 2^-{MAX_LEVEL}); "
                         "ask for fewer features")
    n_vec, n_feat = grid_counts(n, d, spec.free)
    keep = n_feat if columns is None else min(columns, n_feat)
    # the kept features' level and cell vectors (about 3 int64 arrays of D x d while built),
    # the level vectors, and the draw of D of the grid's numbers
    budget.check(8.0 * d * (3 * keep + n_vec) + 16.0 * n_feat, f"the EOF grid of level {n} in {d} dimensions "
                 f"({n_feat:,} features over {n_vec:,} level vectors)", "ask for a lower --level or fewer columns (-n)")
    if domain is None:
        if spec.domain is None:
            raise UsageError(f"{skel.path}: node '{spec.node}' states no 'domain:' and EOF needs a box; add "
                             "'domain: [lo, hi]' to the node or pass --domain-from TRAINING_ROWS")
        domain = spec.domain
        domain_source, margin = "skeleton", None
    lo, hi = (np.broadcast_to(np.asarray(a, dtype=np.float64), (d,)).copy() for a in domain)
    check_box(spec, lo, hi, UsageError, f"{skel.path}: the EOF box of",
              "state another 'domain:' (or measure one with --domain-from)")
    levels = level_vectors(n, d, free=spec.free)
    if keep < n_feat:
        pick = np.sort(np.random.default_rng(seed).choice(n_feat, keep, replace=False))
        t, cells = features_at(levels, pick, spec.free)
    else:
        t, cells = enumerate_features(levels, spec.free)
    lev = levels[t]
    meta = {"kernel": spec.kernel, "node": spec.node, "level": n, "level_vectors": n_vec, "grid_features": n_feat,
            "lo": lo.tolist(), "hi": hi.tolist(), "margin": margin, "domain_source": domain_source}
    if spec.free:  # recorded only when free: pinned files keep their bytes
        meta["boundary"] = "free"
    e = scale_exponent(spec.kernel, _unit_scales(spec.kernel, spec.scale, lo, hi), spec.boundary)
    if e:
        meta["scale_exponent"] = e
    D = keep
    fs = FeatureSet(skeleton=skel, scheme="eof", seed=seed, draws=D, count=np.ones(D, np.int64),
                    kind=np.zeros(D, np.uint8), ptr=np.zeros(D + 1, np.int64), node=np.zeros(0, np.int64),
                    code=np.zeros(0, np.int64), power=np.zeros(0, np.int64), omega=np.zeros(0))
    cells *= 2  # cell numbers c -> odd indices 2c + 1, in place (D x d: the largest arrays here)
    cells += 1
    fs.eof = Columns(meta, lev.astype(np.int64, copy=False), cells.astype(np.int64, copy=False))
    return fs


@dataclass(eq=False)
class Columns:
    """The EOF part of a feature set: ``meta`` (the ``eof`` attribute), and per column its
    level vector and odd index vector, int64 ``(D, d)`` each."""

    meta: dict
    level: np.ndarray
    index: np.ndarray
    #: The root attribute that holds ``meta`` (and the name ``FeatureSet.eof`` answers to).
    attribute = "eof"

    @property
    def lo(self) -> np.ndarray:
        return np.asarray(self.meta["lo"], dtype=np.float64)

    @property
    def boundary(self) -> str:
        """``pinned`` (no ``boundary`` key: every file before it) or ``free``."""
        return self.meta.get("boundary", "pinned")

    @property
    def free(self) -> bool:
        return self.boundary == "free"

    @property
    def hi(self) -> np.ndarray:
        return np.asarray(self.meta["hi"], dtype=np.float64)

    def unit_scales(self, skel) -> np.ndarray:
        """Per column, the kernel's scale in unit-cube coordinates (laplace: scale (hi - lo))."""
        return _unit_scales(self.meta["kernel"], spec_of(skel).scale, self.lo, self.hi)

    @property
    def scale_exponent(self) -> int:
        """e: the features are 2^e times the unscaled ones, so the kernel they estimate is
        ``Z Z^T / 4^e`` (exactly: a power of two); 0 when the file records none."""
        return int(self.meta.get("scale_exponent", 0))

    def multipliers(self) -> np.ndarray:
        """Per node column j, the power of two 2^(e_j) its 1-D factors are multiplied by:
        ``e_j = floor(e (j + 1) / d) - floor(e j / d)`` (integers; they sum to e), so that
        every partial product stays near unit order; all 1.0 when e = 0 (the same bits)."""
        d, e = self.lo.size, self.scale_exponent
        j = np.arange(d + 1)
        return np.ldexp(1.0, np.diff((e * j) // max(d, 1)))


def _unit_scales(kernel_name: str, scale: float, lo, hi) -> np.ndarray:
    if kernel_name == "brownian":
        return np.zeros(np.asarray(lo).size)
    return scale * (np.asarray(hi, np.float64) - np.asarray(lo, np.float64))


def scale_exponent(kernel_name: str, s, boundary: str = "pinned") -> int:
    """The e of :attr:`Columns.scale_exponent` for a new EOF set.  Nearly every feature is
    a product of level-1 factors phi_1(u_j) (a sparse grid's level vectors have at most
    n - 1 coordinates above 1), so a typical row's features are about 2^(sum_j A_j), with
    ``A_j = max(E_u log2 phi_1,j(u), P_j - 2)`` for u uniform on [0, 1] (midpoint rule, 4096
    points; a kernel far narrower than the cells makes most values tiny, which no scale
    mends), and no row's exceed 2^(sum_j P_j), ``P_j = log2 phi_1,j(1/2)`` (the center's).  e brings
    the typical row to unit order, ``round(-sum A_j)`` (rows spread over the box then lie
    within about 2^(+-1.5 sqrt(d)) of it: their products stay inside float32 too), but at
    most ``floor(PEAK_LOG2 - sum P_j)`` so that no value of any row exceeds 2^120 (float32's
    largest is about 2^128); it is recorded only when the typical row would be below
    2^-:data:`SCALE_FROM` (e >= SCALE_FROM), else 0.

    ``boundary`` ``free``: the typical feature is a product of level-0 factors instead,
    ``exp(-s |u - 1/2|)`` (laplace; peak 1 at the centre) or 1 (brownian: e = 0)."""
    s = np.asarray(s, np.float64)[:, None]
    u = ((np.arange(4096) + 0.5) / 4096)[None, :]
    if boundary == "free":
        if kernel_name == "brownian":
            return 0
        log_phi = -s * np.abs(u - 0.5) / math.log(2.0)
        log_peak = np.zeros(s.shape)
    elif kernel_name == "brownian":  # the hat min(u, 1 - u) (level 1: h = 1/2, divisor sqrt(2 h) = 1)
        log_phi = np.broadcast_to(np.log2(np.minimum(u, 1.0 - u)), (s.size, u.size))
        log_peak = np.full(s.shape, -1.0)
    else:  # level 1 on [0, 1], g = 1/2 (as _factor_normed), in logs: no underflow for large s
        mn, mx = np.minimum(u, 0.5), np.maximum(u, 0.5)
        log_norm = np.log2(-np.expm1(-2.0 * s)) + 0.5 * np.log2(np.tanh(0.5 * s))
        log_phi = (-s * (mx - mn) / math.log(2.0) + np.log2(-np.expm1(-2.0 * s * mn))
                   + np.log2(-np.expm1(-2.0 * s * (1.0 - mx))) - log_norm)
        log_peak = 2.0 * np.log2(-np.expm1(-s)) - log_norm
    # a column's typical value is taken at most 2 bits below its peak: a tent loses 1.44 bits;
    # a laplace kernel far narrower than the grid's cells makes most rows' values tiny whatever the scale
    typical = np.maximum(np.mean(log_phi, axis=1), log_peak.ravel() - 2.0)
    raw = int(round(-float(np.sum(typical))))
    cap = int(math.floor(PEAK_LOG2 - float(np.sum(log_peak))))
    return min(raw, cap) if raw >= SCALE_FROM else 0


# ---------------------------------------------------------------------- feature file
def write(f, cols: Columns) -> None:
    """Write the EOF datasets ``(D, d)`` into the open feature file ``f`` (narrowest unsigned
    dtype, shuffled, gzip-compressed, fletcher32-checksummed, no timestamps)."""
    from .featureset import CHUNK, GZIP_LEVEL, _narrow

    for name, a in (("eof_level", cols.level), ("eof_index", cols.index)):
        a = np.ascontiguousarray(_narrow(a))
        rows = max(1, min(a.shape[0], CHUNK // max(1, a.shape[1])))
        f.create_dataset(name, data=a, chunks=(rows, a.shape[1]), fletcher32=True, track_times=False,
                         compression="gzip", compression_opts=GZIP_LEVEL, shuffle=True)


DATASETS = ("eof_level", "eof_index")


def read(p: str, f, columns: int) -> dict:
    """The EOF datasets of an open feature file of ``columns`` columns, checked as every
    dataset of a feature file is (:func:`rfsgen.featureset._check_dataset`), their declared
    sizes against the memory budget before they are read."""
    from . import budget
    from .featureset import _bad, _check_dataset, _read_data

    shapes = {k: _check_dataset(p, f, k, matrix=True) for k in DATASETS}
    for k, shape in shapes.items():
        if shape[0] != columns or not 1 <= shape[1] <= 1 << 20:
            raise _bad(p, f"dataset '{k}' has shape {shape}; expected ({columns}, d) with 1 <= d <= 2^20")
    budget.check(2 * 8 * sum(math.prod(s) for s in shapes.values()),
                 f"feature file '{p}': loading its EOF level and index vectors ({shapes['eof_level']})",
                 "use a feature file with fewer columns")
    return {k: _read_data(p, f, k, shape) for k, shape in shapes.items()}


def from_file(p: str, fs, attr, data: dict) -> Columns:
    """Validate the EOF part of a loaded feature set (untrusted file) and return it."""
    from .featureset import _bad

    try:
        meta = json.loads(attr)
    except (TypeError, ValueError):
        raise _bad(p, "the 'eof' attribute is not JSON") from None
    keys = {"kernel", "node", "level", "level_vectors", "grid_features", "lo", "hi", "margin", "domain_source"}
    if not isinstance(meta, dict) or set(meta) - {"scale_exponent", "boundary"} != keys:
        raise _bad(p, "the 'eof' attribute lacks or has extra keys")
    if "boundary" in meta and meta["boundary"] != "free":  # pinned files record none
        raise _bad(p, f"EOF boundary {meta['boundary']!r} is not 'free' (pinned files record none)")
    try:
        spec = spec_of(fs.skeleton)
    except UsageError:
        raise _bad(p, "an EOF file whose skeleton is not one laplace or brownian node") from None
    d = spec.d
    level, index = data["eof_level"], data["eof_index"]
    if meta["kernel"] != spec.kernel or meta["node"] != spec.node:
        raise _bad(p, "the 'eof' attribute names another node or kernel than the skeleton")
    free = meta.get("boundary", "pinned") == "free"
    if free != spec.free:
        raise _bad(p, f"the 'eof' attribute's boundary ({meta.get('boundary', 'pinned')}) is not the skeleton node's "
                      f"({spec.boundary})")
    n = meta["level"]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_LEVEL:
        raise _bad(p, f"EOF level {n!r} outside 1..{MAX_LEVEL}")
    if [meta["level_vectors"], meta["grid_features"]] != list(grid_counts(n, d, free)):
        raise _bad(p, "the EOF grid counts do not match its level")
    lo, hi = meta["lo"], meta["hi"]
    if not (isinstance(lo, list) and isinstance(hi, list) and len(lo) == len(hi) == d
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in lo + hi)
            and all(a < b for a, b in zip(lo, hi))):
        raise _bad(p, f"the EOF domain is not {d} finite pairs lo < hi")
    try:
        check_box(spec, lo, hi, ValueError, "", "")
    except ValueError as err:
        raise _bad(p, "the EOF box of " + str(err).strip().rstrip(";").removeprefix("node ")) from None
    e = meta.get("scale_exponent", 0)
    if isinstance(e, bool) or not isinstance(e, int) or not 0 <= e <= 400 * d or ("scale_exponent" in meta and not e):
        raise _bad(p, f"EOF scale exponent {e!r} outside 1..{400 * d}")
    if level.shape[1] != d or index.shape[1] != d:
        raise _bad(p, f"EOF level/index vectors of {level.shape[1]}/{index.shape[1]} entries for {article(d)} {d}-column node")
    first = 0 if free else 1  # the root's level
    if level.size and (int(level.min()) < first or int(level.max()) > n - 1 + first):
        raise _bad(p, f"an EOF level outside {first}..{n - 1 + first}")
    level = level.astype(np.int64)
    if level.size and int((level.sum(axis=1) - first * d).max()) > n - 1:
        raise _bad(p, f"an EOF level vector outside the sparse grid of level {n}")
    index = index.astype(np.uint64)
    if index.size and (np.any(index % 2 == 0)
                       or np.any(index >= 2 * cells_per(level, free).astype(np.uint64))):
        raise _bad(p, "an EOF index that is even or beyond its level's 2^l")
    index = index.astype(np.int64)
    if fs.node.size or fs.count.max(initial=1) != 1:
        raise _bad(p, "an EOF file with terms or repeated columns")
    cols = Columns(meta, level, index)
    off, slot, _ = _slots(cols)
    if np.unique(slot).size != slot.size:
        raise _bad(p, "an EOF feature appears twice")
    return cols


# ---------------------------------------------------------------------- transform
def _slots(cols: Columns):
    """The used level vectors (int64 ``(T, d)``, sorted) and each column's slot in
    their row-major numbering, int64 ``(D,)``; and the level vector of each column."""
    levels, t = np.unique(cols.level, axis=0, return_inverse=True)
    t = t.ravel()
    off, stride, _ = strides(levels, cols.free)
    slot = off[t] + np.sum(((cols.index - 1) // 2) * stride[t], axis=1)
    return levels, slot, t


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _rows(u, kernel, free, s, mult, top, act_ptr, act_j, act_l, act_stride, off, table, out, peak, start, stop):  # pragma: no cover - compiled
    """Algorithm 1 over rows [start, stop).  A level vector is stored by its active
    coordinates (l_j > 1, increasing j; level-1 coordinates have the one cell 0): its value
    is the product, in increasing j, of runs of level-1 factors (``seg``, per row) and the
    active factors -- O(d^2 + |levels| |active|) per row instead of O(|levels| d).
    Levels are slot levels (:func:`_factor_any`): ``free``, level l of the free boundary is
    slot level l + 1, so that its root (level 0, one cell) takes the place of level 1.
    Column j's factors are multiplied by ``mult[j]`` (powers of two: exact), and ``peak[r]``
    gets the row's largest |value| in float64 (the caller checks it fits ``out``'s dtype).

    Memory safety whatever the values: :func:`_factor_normed` clamps its x to [0, 1] (NaN
    to 0), so each cell lies in [0, 2^(l-1)); each slot is checked against the table and
    each column against ``out`` before they are used (a wrong table is skipped, not
    followed)."""
    m, d = u.shape
    cell = np.empty((d, top + 1), np.int64)
    val = np.empty((d, top + 1))
    seg = np.empty((d + 1, d + 1))  # seg[a, b] = prod_{a <= k < b} phi_1(u_k), in increasing k
    n1 = np.empty((d, top + 1))
    n2 = np.empty((d, top + 1))
    edge = np.empty((d, top + 1))
    _level_tables(kernel, free, s, d, top, n1, n2, edge)
    for r in range(start, stop):
        _row_factors(kernel, free, s, u, r, top, n1, n2, edge, mult, cell, val)
        _run_products(val, d, seg)
        top_v = 0.0
        for t in range(off.size):
            slot = off[t]
            v = 1.0
            prev = 0
            for k in range(act_ptr[t], act_ptr[t + 1]):
                j = act_j[k]
                slot += cell[j, act_l[k]] * act_stride[k]
                v *= seg[prev, j]
                v *= val[j, act_l[k]]
                prev = j + 1
            v *= seg[prev, d]
            if slot < 0 or slot >= table.size:
                continue
            col = table[slot]
            if 0 <= col < out.shape[1]:
                out[r, col] = v
                a = abs(v)
                if not a <= top_v:  # NaN included: it is the row's peak
                    top_v = a
        peak[r] = top_v


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _rows_csr(u, kernel, free, s, mult, top, pad_j, pad_l, pad_stride, off, table, columns, scale, data, indices,
              counts, peak, start, stop):  # pragma: no cover - compiled
    """:func:`_rows` written as CSR rows, without a dense row: the same values, cast to
    ``data``'s dtype, times ``scale[col]`` when ``scale`` is not empty (as the dense chunk's
    ``*= col_scale``), kept unless exactly zero (+0 or -0, as :func:`rfsgen._compiled.compress_rows`),
    each row's in the order of its level vectors (the caller makes sure the columns increase
    with it).  Row ``r``'s values go to ``data`` and ``indices`` from ``start * T`` on (``T``
    level vectors: a row has at most ``T``), packed, its count to ``counts[r]``: the caller
    closes the gaps between the parts of rows that threads wrote.

    A level vector is ``K`` padded entries (``pad_j``, ``pad_l``, ``pad_stride``, ``(T, K)``):
    its active coordinates, then column ``d``, whose factor is 1 and cell 0, and whose run
    products ``seg[d + 1, d]`` are 1: the product is the same to the bit (times 1 is exact)
    and the loop has no data-dependent trip count.  Nothing is written when ``data`` or
    ``indices`` is shorter than ``stop * T`` or the padded tables do not fit (memory safety)."""
    m, d = u.shape
    T, K = pad_j.shape
    if (data.size < stop * T or indices.size < stop * T or counts.size < stop or peak.size < stop or off.size < T
            or pad_l.shape[0] < T or pad_l.shape[1] < K or pad_stride.shape[0] < T or pad_stride.shape[1] < K):
        return
    for t in range(T):  # a wrong table is refused whole (checked once, not in the loop)
        for q in range(K):
            if pad_j[t, q] < 0 or pad_j[t, q] > d or pad_l[t, q] < 0 or pad_l[t, q] > top:
                return
    narrow = data.itemsize == 4  # float32: values rounded in a register (exact in float64) before the zero test
    cell = np.zeros((d + 1, top + 1), np.int64)
    val = np.ones((d + 1, top + 1))
    seg = np.ones((d + 2, d + 1))  # seg[a, b] = prod_{a <= k < b} phi_1(u_k); seg[d + 1, d] = 1 (padding)
    n1 = np.empty((d, top + 1))
    n2 = np.empty((d, top + 1))
    edge = np.empty((d, top + 1))
    _level_tables(kernel, free, s, d, top, n1, n2, edge)
    scaled = scale.size >= columns
    n_table = table.size
    k = start * T
    for r in range(start, stop):
        _row_factors(kernel, free, s, u, r, top, n1, n2, edge, mult, cell, val)
        _run_products(val, d, seg)
        top_v = 0.0
        first = k
        for t in range(T):
            slot = off[t]
            v = 1.0
            prev = 0
            if K == 2:  # (a sparse grid of level 3: the common case, unrolled)
                j = pad_j[t, 0]
                lv = pad_l[t, 0]
                j2 = pad_j[t, 1]
                lv2 = pad_l[t, 1]
                slot += cell[j, lv] * pad_stride[t, 0] + cell[j2, lv2] * pad_stride[t, 1]
                v = seg[0, j] * val[j, lv] * seg[j + 1, j2] * val[j2, lv2] * seg[j2 + 1, d]
            else:
                for q in range(K):
                    j = pad_j[t, q]
                    lv = pad_l[t, q]
                    slot += cell[j, lv] * pad_stride[t, q]
                    v *= seg[prev, j]
                    v *= val[j, lv]
                    prev = j + 1
                v *= seg[prev, d]
            inside = (slot >= 0) & (slot < n_table)
            col = table[slot if inside else 0]
            ok = inside & (col >= 0) & (col < columns)
            c = col if ok else 0
            # The value as the dense chunk holds it: cast to the dtype, then times the column's
            # scale in the dtype (a float32 product is exact in float64, rounded once: the same bits).
            y = float(np.float32(v)) if narrow else v
            if scaled:
                y = y * scale[c]
                y = float(np.float32(y)) if narrow else y
            data[k] = y
            indices[k] = c
            k += ok & (y != 0.0)
            a = abs(v)
            if ok and not a <= top_v:  # NaN included: it is the row's peak
                top_v = a
        counts[r] = k - first
        peak[r] = top_v


class Transformer:
    """Evaluates an EOF feature set on chunks of rows (the interface of every kind's transformer,
    :meth:`rfsgen.featureset.ColumnKind.transformer`: ``columns``, ``dtype``, ``chunk``, ``chunks``).
    ``clipped`` counts the values mapped outside the box and clipped to it."""

    def __init__(self, fs, dtype=np.float32):
        from . import budget

        self.fs = fs
        self.dtype = np.dtype(dtype)
        cols = fs.eof
        self.kernel = KERNELS.index(cols.meta["kernel"])
        self.cols = np.array(spec_of(fs.skeleton).columns, dtype=np.int64)
        self.lo, self.hi = cols.lo, cols.hi
        self.s = np.ascontiguousarray(cols.unit_scales(fs.skeleton))
        self.mult = np.ascontiguousarray(cols.multipliers())
        levels, slot, _ = _slots(cols)
        off, stride, sizes = strides(levels, cols.free)
        self.free = cols.free
        shift = 1 if cols.free else 0  # slot levels (_factor_any): the free root is slot level 1
        n_slots = int(sizes.sum())
        budget.check(8.0 * n_slots, f"the EOF column table ({n_slots:,} slots)", "sample fewer EOF columns")
        # Each thread of _rows (_rows_csr) holds its own (d + 1)^2 ((d + 2)(d + 1)) run products and
        # five d x (top + 1) ((d + 1) x (top + 1)) factor tables (8,000 brownian dimensions: 512 MB
        # a thread), counted (the larger) before the table.
        from ._compiled import threads

        d, top, n_threads = self.cols.size, int(levels.max(initial=1 - shift)) + shift, threads()
        budget.check(8.0 * n_threads * ((d + 2) * (d + 1) + 5 * (d + 1) * (top + 1)),
                     f"the EOF transform's working tables in {d} dimensions ({n_threads} threads, each (d + 1)^2 "
                     "products and 5 x d x (top level + 1) factors)",
                     "use fewer threads (--threads N) or an EOF skeleton over fewer columns")
        self.table = np.full(n_slots, -1, np.int64)
        self.table[slot] = np.arange(slot.size)
        self.lev, self.off = levels, off
        active = levels + shift > 1
        self.act_ptr = np.concatenate(([0], np.cumsum(active.sum(axis=1)))).astype(np.int64)
        t_idx, self.act_j = np.nonzero(active)  # row-major: by level vector, then increasing j
        self.act_l = (levels[t_idx, self.act_j] + shift).astype(np.int64)
        self.act_stride = stride[t_idx, self.act_j].astype(np.int64)
        self.act_j = self.act_j.astype(np.int64)
        self.top = top
        # The same level vectors padded to K entries for the CSR loop (_rows_csr): column d (factor 1,
        # cell 0, stride 0) after the active ones.  CSR rows are written straight from it when every
        # row's columns increase with the level vectors' order (a sampled file's always do).
        T = off.size
        K = int(np.max(np.diff(self.act_ptr), initial=0))
        budget.check(24.0 * T * max(K, 1), f"the EOF transform's padded level vectors ({T:,} x {max(K, 1)})",
                     "sample fewer EOF columns")
        self.pad_j = np.full((T, K), d, np.int64)
        self.pad_l = np.zeros((T, K), np.int64)
        self.pad_stride = np.zeros((T, K), np.int64)
        rank = np.arange(self.act_j.size) - self.act_ptr[t_idx]  # position among its level vector's actives
        self.pad_j[t_idx, rank] = self.act_j
        self.pad_l[t_idx, rank] = self.act_l
        self.pad_stride[t_idx, rank] = self.act_stride
        kept = self.table[self.table >= 0]  # the columns in slot order
        self.direct_csr = bool(np.all(np.diff(kept) > 0)) and self.columns < 2**31
        # Float column weights (LKRF over an EOF pool): column j is sqrt(w_j) times its feature.
        self.col_scale = (None if fs.column_weight is None else
                          np.sqrt(np.asarray(fs.column_weight, dtype=np.float64)).astype(self.dtype))
        self.clipped = 0
        import threading

        self._lock = threading.Lock()  # chunks may run on several threads

    @property
    def columns(self) -> int:
        return self.fs.columns

    @property
    def row_bytes(self) -> int:
        """Bytes one row of a chunk holds at most at once: the row read and converted
        (float64), its unit-cube coordinates and its dense output values in two reused
        buffers plus a copy (sparse parts or the written block), or, written straight as
        CSR (:meth:`sparse_chunks`), room for a value and a column per level vector in two
        reused buffers plus a copy."""
        out = max(3 * self.dtype.itemsize * self.columns, 3 * (self.dtype.itemsize + 4) * self.max_row_nonzeros)
        return 8 * (2 * self.fs.skeleton.width + 2 * self.cols.size) + out

    @property
    def what(self) -> str:
        return f"the transform by '{self.fs.skeleton.path}' EOF features ({self.columns} columns)"

    def _mapped(self, x: np.ndarray) -> np.ndarray:
        u = np.asarray(x, dtype=np.float64)[:, self.cols]
        with np.errstate(over="ignore"):  # far outside the box: +-inf, clipped (the width is finite: check_box)
            return (u - self.lo) / (self.hi - self.lo)

    def clipped_in(self, x: np.ndarray) -> int:
        """How many values of rows ``x`` lie outside the box (and are clipped by :meth:`unit`)."""
        u = self._mapped(x)
        return int(np.count_nonzero((u < 0.0) | (u > 1.0)))

    def unit(self, x: np.ndarray, row0: int = 0, source: str = "<array>") -> np.ndarray:
        """Rows mapped to the unit cube, float64 ``(m, d)``; values outside are clipped
        (and counted in ``clipped``); NaN or infinity in any column, used or not, is a
        :class:`DataError`, as in every other transform."""
        from .inputs import check_finite

        check_finite(np.asarray(x), row0, source)
        u = self._mapped(x)
        out = (u < 0.0) | (u > 1.0)
        n_out = int(np.count_nonzero(out))
        if n_out:
            with self._lock:
                self.clipped += n_out
            np.clip(u, 0.0, 1.0, out=u)
        return np.ascontiguousarray(u)

    def chunk(self, x: np.ndarray, row0: int = 0, source: str = "<array>", out: np.ndarray | None = None) -> np.ndarray:
        """Feature values of rows ``x`` (float ``(m, width)``): ``(m, D)`` of ``self.dtype``."""
        from ._compiled import on_rows

        u = self.unit(x, row0, source)
        m = u.shape[0]
        if out is None:
            out = np.zeros((m, self.columns), dtype=self.dtype)
        elif out.shape != (m, self.columns) or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous ({m}, {self.columns}) {self.dtype} array")
        else:
            out[...] = 0
        if m and self.columns:
            peak = np.zeros(m)
            on_rows(_rows, m, u, self.kernel, self.free, self.s, self.mult, self.top, self.act_ptr, self.act_j, self.act_l,
                    self.act_stride, self.off, self.table, out, peak, min_rows=max(1, 65536 // max(1, self.lev.size)))
            self._check_range(peak, row0, source)
            if self.col_scale is not None:
                out *= self.col_scale
        return out

    @property
    def max_row_nonzeros(self) -> int:
        """The most non-zeros a row can have: one per level vector used."""
        return int(self.off.size)

    def csr_rows(self, x: np.ndarray, data: np.ndarray, indices: np.ndarray, counts: np.ndarray, row0: int = 0,
                 source: str = "<array>") -> int:
        """The CSR rows of ``x`` (float ``(m, width)``) written straight into ``data`` (``self.dtype``)
        and ``indices`` (int32) from position 0, each row's count into ``counts[:m]``: the same
        values, columns and exact zeros dropped as :meth:`chunk` followed by compressing it
        (:func:`rfsgen.output._sparse_parts`), without the dense chunk.  ``data`` and ``indices``
        hold at least ``m * max_row_nonzeros`` values (threads write their rows from their
        first row's ``T`` slots on; the gaps are closed here).  Returns the values written.
        Only where ``direct_csr``."""
        from ._compiled import row_parts, run_parts

        if not self.direct_csr:
            raise ValueError("this EOF set's columns do not follow its level vectors: use chunk()")
        m, T = len(x), self.max_row_nonzeros
        if (data.dtype != self.dtype or indices.dtype != np.int32 or data.size < m * T or indices.size < m * T
                or counts.size < m or not (data.flags.c_contiguous and indices.flags.c_contiguous)):
            raise ValueError(f"data ({self.dtype}) and indices (int32) must hold {m} x {T} values, counts {m}")
        u = self.unit(x, row0, source)
        if not m:
            return 0
        counts = counts[:m]
        if not self.columns:
            counts[:] = 0
            return 0
        peak = np.zeros(m)
        scale = self.col_scale if self.col_scale is not None else np.zeros(0, self.dtype)
        cuts = row_parts(m, min_rows=max(1, 65536 // max(1, self.lev.size)))
        args = (u, self.kernel, self.free, self.s, self.mult, self.top, self.pad_j, self.pad_l, self.pad_stride,
                self.off, self.table, self.columns, scale, data, indices, counts, peak)
        run_parts(_rows_csr, cuts, *args)
        self._check_range(peak, row0, source)
        nnz = 0
        for a, b in zip(cuts[:-1], cuts[1:]):  # each part's rows from a * T on: packed after the parts before
            n = int(counts[a:b].sum())
            if nnz != a * T:
                data[nnz:nnz + n] = data[a * T:a * T + n]
                indices[nnz:nnz + n] = indices[a * T:a * T + n]
            nnz += n
        return nnz

    def _check_range(self, peak: np.ndarray, row0: int, source: str) -> None:
        """:class:`DataError` for the first row whose largest feature value (float64) is not
        finite, overflows ``self.dtype`` or underflows it (non-zero, below its smallest normal
        number: the row would be written as zeros or subnormals).  A row that passes keeps
        every value to within the dtype's precision of its largest (a value flushed to zero
        is below 2^-23 of it in float32).  float64 output is written as computed."""
        info = np.finfo(self.dtype)
        tiny = info.tiny if self.dtype.itemsize < 8 else 0.0  # float64 holds the values as computed
        bad = np.flatnonzero(~(peak <= info.max) | ((peak > 0) & (peak < tiny)))
        if not bad.size:
            return
        r = int(bad[0])
        e = self.fs.eof.scale_exponent
        what = (f"its largest EOF feature is {peak[r]:.3g}, below {self.dtype.name}'s smallest normal number "
                f"{info.tiny:.3g}: written in {self.dtype.name} the row would lose its values"
                if peak[r] > 0 and peak[r] < info.tiny else
                f"its largest EOF feature is {peak[r]:.3g}, beyond {self.dtype.name}")
        raise DataError(f"{source}: row {row0 + r}: {what} (features scaled by 2^{e}); write --dtype float64, or "
                        "sample a node of fewer columns or a box that fits the rows more closely")

    def sparse_chunks(self, src, chunk_rows: int, start: int = 0, stop: int | None = None, buffers: int = 1):
        """:meth:`chunks` as CSR pieces (:meth:`csr_rows`): ``(row0, (data, indices, counts))`` per
        chunk, in ``buffers`` reused sets of arrays (each valid until ``buffers`` chunks later)."""
        from .inputs import chunks_for

        bufs = [None] * buffers
        T = self.max_row_nonzeros
        for i, (row0, block) in enumerate(chunks_for(src, self, chunk_rows, start, stop)):
            m = block.shape[0]
            k = i % buffers
            if bufs[k] is None or bufs[k][2].size < m:
                bufs[k] = (np.empty(m * T, self.dtype), np.empty(m * T, np.int32), np.empty(m, np.int64))
            data, indices, counts = bufs[k]
            nnz = self.csr_rows(block, data, indices, counts, row0, src.name)
            yield row0, (data[:nnz], indices[:nnz], counts[:m])

    def chunks(self, src, chunk_rows: int, start: int = 0, stop: int | None = None, buffers: int = 1):
        """As :meth:`rfsgen.transform.Transformer.chunks`."""
        from .featureset import buffered_chunks

        return buffered_chunks(self, src, chunk_rows, start, stop, buffers)


# ---------------------------------------------------------------------- kernels
def unit_rows(spec: Spec, lo, hi, x) -> np.ndarray:
    """Rows mapped to the unit cube and clipped, float64 ``(m, d)``."""
    with np.errstate(over="ignore"):  # far outside the box: +-inf, clipped (the width is finite: check_box)
        u = (np.asarray(x, dtype=np.float64)[:, list(spec.columns)] - lo) / (hi - lo)
    return np.clip(u, 0.0, 1.0)


#: float64 (b, k) temporaries that :func:`k1` holds at once for a block of b rows (laplace
#: at most; brownian fewer), counted by :func:`limit_kernel`.
K1_TEMPORARIES = 8


def limit_kernel(kernel: str, s, u: np.ndarray, v: np.ndarray, copies: int = 0,
                 boundary: str = "pinned") -> np.ndarray:
    """The kernel EOF converges to (the product of :func:`k1` of ``boundary``) between unit-cube
    rows ``u`` ``(m, d)`` and ``v`` ``(k, d)``: float64 ``(m, k)``.  The matrix (plus
    ``copies`` more that the caller will make) and the temporaries of :func:`k1` are
    checked against the memory budget first; rows go in blocks sized to fit it (the
    same bits whatever the block)."""
    from . import budget

    s = np.broadcast_to(np.asarray(s, np.float64), (u.shape[1],))
    m, k = u.shape[0], v.shape[0]
    fixed = 8.0 * m * k * (1 + copies) + 8.0 * (u.size + v.size)
    per_row = 8.0 * K1_TEMPORARIES * k
    budget.check(fixed + per_row * min(m, 1), f"the EOF limit kernel on {m} x {k} rows (the {m} x {k} float64 matrix"
                 f"{f' and {copies} copy' if copies else ''}, and temporaries per block of rows)",
                 "use fewer rows (--rows START:STOP)")
    block = int(max(1, min(m, (budget.limit() - fixed) // max(per_row, 1), 1 << 12)))
    out = np.ones((m, k))
    for a in range(0, m, block):
        b = min(m, a + block)
        for j in range(u.shape[1]):
            out[a:b] *= k1(kernel, s[j], u[a:b, j, None], v[None, :, j], boundary)
    return out


def summary(fs) -> dict:
    """What :func:`rfsgen.features.describe` reports differently for an EOF set: every
    column a distinct feature, no constant column, and the ``eof`` entry (:func:`describe`)."""
    return {"features": fs.columns, "constant_weight": 0.0, "eof": describe(fs)}


def describe(fs) -> dict:
    """The EOF lines of ``rfsgen inspect``."""
    meta = fs.eof.meta
    levels, _, t = _slots(fs.eof)
    _, _, sizes = strides(levels, fs.eof.free)
    kept = np.bincount(t, minlength=levels.shape[0])
    kernel_text = (meta["kernel"] + " (free on the box's faces)" if fs.eof.free else
                   meta["kernel"] + (" (pinned on the box's faces)" if meta["kernel"] == "laplace" else ""))
    return {"kernel": kernel_text, "boundary": fs.eof.boundary,
            "node": meta["node"], "level": meta["level"], "level_vectors": meta["level_vectors"],
            "level_vectors_used": int(levels.shape[0]), "grid_features": meta["grid_features"],
            "max_nonzeros_per_row": int(levels.shape[0]),
            # for rows spread uniformly over the box: per level vector, the fraction of its cells kept
            "expected_nonzeros_per_row": float(np.sum(kept / sizes)),
            "domain_source": meta["domain_source"], "margin": meta["margin"]}


def box(skel, domain_from=None, margin=None, rows=None):
    """The EOF box of ``skel``'s node: measured from ``domain_from`` (rows, widened by
    ``margin``), else the node's stated ``domain:`` (brownian: [0, 1] by default).
    Returns ``(spec, lo, hi, source, margin)``."""
    spec = spec_of(skel)
    if margin is not None and domain_from is None and rows is None:
        raise UsageError("--margin widens a domain measured with --domain-from; give --domain-from ROWS too")
    if domain_from is not None or (rows is not None and spec.domain is None):
        margin = DEFAULT_MARGIN if margin is None else margin
        lo, hi = measure_domain(spec, domain_from if domain_from is not None else rows, margin)
        return spec, lo, hi, f"rows of {domain_from}" if domain_from is not None else "the input rows", margin
    if spec.domain is None:
        raise UsageError(f"{skel.path}: node '{spec.node}' states no 'domain:' and EOF needs a box; add "
                         "'domain: [lo, hi]' to the node or pass --domain-from TRAINING_ROWS")
    return spec, spec.domain[0], spec.domain[1], "skeleton", None


def kernel(skel, x, y=None, *, lo, hi, x_source: str = "<array>", y_source: str = "<array>",
           copies: int = 0) -> np.ndarray:
    """The kernel EOF converges to for ``skel`` on the box ``[lo, hi]``: the product of the
    pinned laplace (or brownian) 1-D kernels between rows ``x`` ``(m, width)`` and ``y``
    ``(k, width)`` (default ``x``), clipped to the box; float64 ``(m, k)``.  NaN or
    infinity in a row is a :class:`DataError` naming ``x_source`` / ``y_source`` and the
    row, as everywhere; the box is checked (:func:`check_box`) and the memory counted
    (:func:`limit_kernel`, ``copies`` more matrices the caller will make)."""
    from .inputs import check_finite

    spec = spec_of(skel)
    lo, hi = (np.broadcast_to(np.asarray(a, np.float64), (spec.d,)) for a in (lo, hi))
    check_box(spec, lo, hi, UsageError, f"{skel.path}: the EOF box of", "state another box")
    for rows, source in ((x, x_source), (y, y_source)):
        if rows is not None:
            check_finite(np.asarray(rows), 0, source)
    u = unit_rows(spec, lo, hi, x)
    v = u if y is None else unit_rows(spec, lo, hi, y)
    return limit_kernel(spec.kernel, spec.scale * (hi - lo), u, v, copies, spec.boundary)


def limit_name(kernel_name: str, boundary: str = "pinned") -> str:
    if boundary == "free":
        return ("the laplace kernel exp(-scale |x - x'|_1) on the box" if kernel_name == "laplace"
                else "the free brownian kernel on the box")
    return ("the laplace kernel pinned on the box's faces" if kernel_name == "laplace"
            else "the brownian kernel on the box")


# ---------------------------------------------------------------------- the column kind
def inspect_rows(info: dict) -> list:
    """The lines of ``rfsgen inspect`` for an EOF set (its grid instead of terms)."""
    e = info["eof"]
    return [
        ("eof", f"{e['kernel']} node '{e['node']}', level {e['level']}: {e['level_vectors']} level vectors, "
                f"{e['grid_features']} features in the grid, {info['columns']} kept"),
        ("non-zeros", f"at most {e['max_nonzeros_per_row']} per row (one per level vector used), "
                      f"{e['expected_nonzeros_per_row']:.1f} expected for rows spread over the box"),
        ("domain", f"{e['domain_source']}" + (f", widened by {e['margin']:g} of each column's range on each side"
                                              if e["margin"] is not None else "")),
    ]


class EOFKind(ColumnKind):
    """EOF grid cells as a column kind (:class:`rfsgen.featureset.ColumnKind`): files of scheme
    ``eof``, format version 5 (3 still read), the root attribute ``eof`` and the datasets
    ``eof_level`` and ``eof_index``; the set's :class:`Columns` is ``fs.extra``."""

    name = "EOF"
    schemes = ("eof",)
    format_version = FORMAT_VERSION
    versions = (3, FORMAT_VERSION)
    attribute = Columns.attribute
    weights_add_up = False  # a column's weight multiplies its own (unit) feature
    counts_clipped = True  # rows are clipped to the box, and counted
    walked = False  # its own grid (sample)
    options = ("level", "domain_from", "margin")
    needs_columns = False  # -n D or --level N
    #: approx: the level n of the sparse grid the D features come from, and the error of that
    #: whole grid's kernel (its own truncation).
    approx_keys = ("level", "truncation_mae", "truncation_max_abs")
    approx_counts = ("level",)

    def attrs(self, fs) -> dict:
        return {self.attribute: json.dumps(fs.extra.meta, sort_keys=True)}

    def write(self, f, fs) -> None:
        write(f, fs.extra)

    def read(self, p, f, fs, attrs) -> None:
        from .featureset import _attr

        fs.extra = from_file(p, fs, _attr(p, attrs, self.attribute), read(p, f, fs.columns))

    def summary(self, fs) -> dict:
        return summary(fs)

    def inspect_rows(self, info: dict) -> list:
        return inspect_rows(info)

    def expected_density(self, fs):
        D = fs.columns
        density = min(1.0, describe(fs)["expected_nonzeros_per_row"] / D) if D else 1.0
        return density, int(round(density * D))

    def density_text(self, dens: dict) -> str:
        return f"{dens['density']:.3f} expected (the expected non-zeros of a row over the columns)"

    def transformer(self, fs, dtype=np.float32, device="cpu"):
        return Transformer(fs, dtype)  # EOF columns run on the CPU whatever the device (rfsgen._cuda)

    def kernel(self, skel, x, y=None, *, options=None, x_source="<array>", y_source="<array>", copies=0,
               progress=None):
        options = options or {}
        if "domain" in options:  # fit's
            lo, hi = options["domain"]
        else:
            _, lo, hi, _, _ = box(skel, options.get("domain_from"), options.get("margin"))
        return kernel(skel, x, y, lo=lo, hi=hi, x_source=x_source, y_source=y_source, copies=copies)

    def fit(self, skel, rows=None) -> dict:
        _, lo, hi, source, margin = box(skel, rows=rows() if rows is not None else None)
        return {"domain": (lo, hi), "margin": margin, "domain_source": source}

    def sample(self, skel, columns, seed, *, scheme, level=None, domain=None, margin=None, domain_source="skeleton"):
        return sample(skel, columns=columns, level=level, seed=seed, domain=domain, margin=margin,
                      domain_source=domain_source)

    def sample_file(self, skel, columns, seed, *, scheme, level=None, domain_from=None, margin=None):
        if columns is None and level is None:
            raise UsageError("--scheme eof needs -n D (columns) or --level N (the whole sparse grid of level N)")
        if columns is not None and level is not None:
            raise UsageError("give -n or --level, not both")
        if margin is not None and domain_from is None:
            raise UsageError("--margin widens a domain measured with --domain-from; give --domain-from ROWS too")
        spec = spec_of(skel)
        domain, source = None, "skeleton"
        if domain_from is not None:
            margin = DEFAULT_MARGIN if margin is None else margin
            domain = measure_domain(spec, domain_from, margin)
            source = f"rows of {domain_from}"
        fs = sample(skel, columns=columns, level=level, seed=seed, domain=domain, margin=margin,
                    domain_source=source)
        return (fs, f"-n {columns}" if columns is not None else f"--level {level}",
                f" --domain-from {domain_from} --margin {margin:g}" if domain_from is not None else "",
                [domain_from] if domain_from else [])

    def unscale(self, fs) -> float:
        return 2.0 ** -fs.extra.scale_exponent  # the recorded scale (exact: a power of two)

    def approx_extra(self, skel, fs, options, cache, errors) -> dict:
        n = fs.extra.meta["level"]
        if n not in cache:  # the whole grid of that level
            cache[n] = sample(skel, level=n, **options)
        trunc = errors(cache[n])
        return {"level": n, "truncation_mae": trunc["mae"], "truncation_max_abs": trunc["max_abs"]}

    def approx_lines(self, records) -> list:
        if not records:
            return []
        return (["eof: errors against the kernel EOF converges to (laplace or brownian on the box, pinned or free); "
                 "the whole sparse grid of each level (its own truncation):"]
                + [f"  D {r['features']}: level {r['level']:.0f}, grid MAE {r['truncation_mae']:.5f}, "
                   f"max |err| {r['truncation_max_abs']:.5f}" for r in records])

    def unit_weight(self, fs):
        return None  # its features as they are, without any weights of their own

    def subset(self, fs, keep):
        return Columns(fs.extra.meta, fs.extra.level[keep], fs.extra.index[keep])

    def digest(self, fs, h) -> None:
        h.update(np.ascontiguousarray(fs.extra.level, dtype=np.int64).tobytes())
        h.update(np.ascontiguousarray(fs.extra.index, dtype=np.int64).tobytes())


#: The kind (rfsgen.kinds.KINDS).
EOF = EOFKind()
