"""Exact low degrees (``--scheme exact``): the features of total degree 0 and 1 enumerated
with their exact probabilities as float column weights, the rest sampled conditionally.

A draw's *total degree* is the number of base factors its walk draws (before they combine
at an input node).  Its generating function, with one variable ``z_u`` per input node,
follows the skeleton: ``G_u = z_u`` at an input node and ``G_v = sigma_hat_v(mean of G_c
over v's children)`` at an internal node.  Hence

* ``P0 = G_out(0)``: the probability of the constant feature (no factor at all), by the
  same recurrence as the kernel with every input kernel replaced by 0;
* ``P1(u) = dG_out / dz_u`` at 0: the probability that the draw's only factor is at input
  node ``u``; a reverse-mode derivative pushed from the output down, each internal node
  multiplying by ``sigma_hat_v'(m_v) / fan-in`` (``m_v`` the mean of its children's P0).

A single factor at a node with finitely many codes (binary, circle, categorical, sphere)
gives finitely many columns, listed here with their exact weights (:func:`plan`).  Every
other draw (two or more factors, or one factor at a gaussian, laplace or brownian node,
whose frequencies are continuous or unbounded) is sampled as ``strat`` samples it, but
conditionally on not being enumerated: the walk's output degree is drawn from its law
conditioned on being large enough, and draws that still land in the enumerated set are
rejected.  A sampled column's weight is ``P_high * count / q`` with ``P_high = 1 - P0 -
sum of the enumerated P1`` and ``q`` the accepted draws, so the estimator is unbiased:
``E[sum_j w_j col_j(x) col_j(x')] = k(x, x')``.  A sampled draw that combines to an
enumerated column (a circle factor times its conjugate is the constant) adds to that
column's weight; the budget D counts every distinct column once.

**Wide inputs.** Degree 1 gives one column per code of every enumerable input node
(cifar-deep: 576 sphere nodes of 3 values, 1,728 columns).  Degrees ``0 .. k`` are
enumerated for the largest ``k <= 1`` whose columns take at most half of D; with degree 1
left out its features are sampled as ``strat`` samples them (stratified codes), and with
degree 0 left out too (D = 1) the scheme is ``strat``.  Where no draw has degree 2 or
more, the listed columns are every feature and may take all of D (none is kept for a
sampled part of no mass); fewer features than D is refused with their number.  A PPS
subset's sampled part draws only degree 2 and up, which may hold fewer new features than
the rest of D (three binary inputs under a degree-2 activation: 7 features, a reach of 6
at D = 7): a sample that falls short then starts again with every feature in reach
(``plan(..., reach_all=True)``): every degree-0 and 1 column listed where they are fewer
than D, else the constant and the ``D/2 - 1`` heaviest, with the sampled part drawing every
other draw, the unlisted single factors included.  Nodes are listed only while their
columns fit in :data:`MAX_LISTED`; the rest are sampled like gaussian nodes.  The file's ``stats`` record the
degrees enumerated (``exact_degrees``: -1, 0 or 1), their columns and their total weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .skeleton import InputNode, Skeleton

#: Enumerated columns may take at most this fraction of the budget D (the wide-input rule).
MAX_EXACT_SHARE = 0.5
#: Most one-factor columns listed in all (before the wide-input rule picks among them):
#: input nodes are listed in skeleton order while their columns fit, counted from the
#: base's parameters before anything is built; a node that does not fit is sampled, as a
#: gaussian node is (a categorical node of 2^31 categories would need 16 GiB to list).
MAX_LISTED = 1 << 18
#: Below this, the probability that a draw is not enumerated counts as zero: the
#: enumerated columns are then every feature the skeleton has.
NO_MASS = 1e-14
#: A 128-bit column key (two int64) as one comparable item.
_KEY = np.dtype((np.void, 16))


def _dual_derivative(act, m: float) -> float:
    """``sigma_hat'(m)`` for ``m`` in [0, 1]: the series on the coefficient table (exact for
    activations without a tail: the table is their whole, renormalised, distribution);
    activations with a heavy tail beyond the table (relu, step, leaky_relu) take a
    five-point central difference of their closed-form dual where the tail's terms are
    not negligible (``m^(table size) > 1e-16``), whose error is ~1e-12 there."""
    a = act.coefficients
    if m >= 1.0:
        return float(act.derivative_at_one)
    if act.tail is not None and a.size * math.log(max(m, 1e-300)) > math.log(1e-16):
        h = min(1e-3, (1.0 - m) / 4.0, max(m, 1e-3) / 4.0) if m > 0 else 1e-3
        pts = np.array([m - 2 * h, m - h, m + h, m + 2 * h])
        f = act.dual(pts)
        return float((f[0] - 8 * f[1] + 8 * f[2] - f[3]) / (12 * h))
    i = np.arange(1, a.size, dtype=np.float64)
    return float(np.polynomial.polynomial.polyval(m, i * a[1:])) if a.size > 1 else 0.0


def degree_probabilities(skel: Skeleton, t):
    """``(p0, p1)``: the probability that a draw has no base factor (float) and, for every
    node, that its only factor is at that node (float64 ``(N,)``, 0 at internal nodes).
    ``t`` is the sampler's table of ``skel`` (:func:`rfsgen.draws._tables`)."""
    from .draws import _push_down

    n = len(skel.nodes)
    p0 = np.zeros(n)
    slope = np.zeros(n)  # sigma_hat_v'(m_v) / fan-in
    memo: dict = {}
    for v in skel.nodes:  # topological order: children first
        if isinstance(v, InputNode):
            continue
        kids = t.children[t.child_ptr[v.id]:t.child_ptr[v.id + 1]]
        m = float(min(1.0, p0[kids].mean()))
        key = (id(v.activation), m)
        if key not in memo:
            memo[key] = (float(v.activation.dual(np.array([m]))[0]), _dual_derivative(v.activation, m))
        p0[v.id], d = memo[key]
        slope[v.id] = d / kids.size if math.isfinite(d) else 0.0  # infinite only where m = 1: no factor below
    p1 = _push_down(skel, t, slope)
    p1[~t.is_input] = 0.0
    return float(p0[skel.output]), p1


def one_factor_count(base):
    """How many columns :func:`one_factor_columns` lists for ``base`` (None: not finitely
    many), from its parameters alone."""
    if base.name == "categorical":
        return 2 * int(base.param("categories"))
    if base.name == "sphere":
        return int(base.width)
    return {"binary": 1, "circle": 2}.get(base.name)


def one_factor_columns(base):
    """The columns of one factor at a node of ``base``, or ``None`` where its codes are
    not finitely many (gaussian, laplace, brownian): ``(code, power, phase, prob)`` int64,
    int64, int64 and float64 arrays, ``prob`` summing to 1, such that the sum over rows of
    ``prob * col(x) col(x')`` (a row's column: its factor at ``(code, power)`` with phase
    bit ``phase``, the sampler's convention) is the base kernel.  A power of 0 is no factor
    (the constant column).  Sphere ``pair`` nodes list the cos column of every code
    ``2 j`` only, ``sqrt(d) x_j``: d columns where the sampler's codes give 2d (its sin
    columns repeat the cos columns of the next coordinate), with the same kernel."""
    name = base.name
    one = np.ones(1, np.int64)
    zero = np.zeros(1, np.int64)
    if name == "binary":
        return zero, one, zero, np.ones(1)
    if name == "circle":  # e^{it}: cos t and sin t
        return np.zeros(2, np.int64), np.ones(2, np.int64), np.array([0, 1]), np.full(2, 0.5)
    if name == "categorical":  # e^{2 pi i w x / n}, w uniform; both phases of each
        n = int(base.param("categories"))
        w = np.repeat(np.arange(n, dtype=np.int64), 2)
        return np.zeros(2 * n, np.int64), w, np.tile(np.array([0, 1]), n), np.full(2 * n, 0.5 / n)
    if name == "sphere":
        d = base.width
        j = np.arange(d, dtype=np.int64)
        code = 2 * j if base.param("scheme") == "pair" else j
        return code, np.ones(d, np.int64), np.zeros(d, np.int64), np.full(d, 1.0 / d)
    return None


@dataclass
class Plan:
    """What ``--scheme exact`` enumerates for one skeleton and budget (see the module)."""

    degrees: int  # highest degree enumerated: -1 (none), 0 or 1
    batch: object  # rfsgen.draws._Batch: one draw per enumerated column, canonical, distinct
    weight: np.ndarray  # float64 (E,): exact weight of each enumerated column
    p_high: float  # probability that a draw is not enumerated (the sampled part's weight)
    enumerable: np.ndarray  # bool (N,): input nodes whose single factors are enumerated
    min_out_degree: int  # output degrees below this are never sampled (all enumerated)
    enumerable_columns: int = 0  # columns of degrees 0 .. degrees (more than ``columns`` when a subset is taken)
    #: The listed columns are a subset of degrees 0 and 1 with their exact weights, and the
    #: sampled part draws every other column, the unlisted single-factor ones included
    #: (rejecting a single-factor draw whose key is listed): ``listed_keys`` (the listed
    #: columns' 128-bit keys, void16) is then set.  None: the rejection is by node alone.
    listed_keys: np.ndarray | None = None

    @property
    def columns(self) -> int:
        return int(self.weight.size)

    @property
    def restricted(self) -> bool:
        """Whether some features are out of the sampled part's reach: a PPS subset of the
        single-factor columns is listed and the others are never drawn (their mass is in
        the chosen ones' Horvitz-Thompson weights).  A sample that then falls short of D
        is retried with ``plan(..., reach_all=True)``."""
        return self.degrees >= 1 and self.listed_keys is None and self.columns < self.enumerable_columns

    def listed(self, keys: np.ndarray) -> np.ndarray:
        """bool (n,): which of ``keys`` (int64 (n, 2), :func:`rfsgen.draws._keys`) are listed."""
        return np.isin(np.ascontiguousarray(keys, dtype=np.int64).view(_KEY).ravel(), self.listed_keys)

    def accept(self, factors: np.ndarray, single: np.ndarray) -> np.ndarray:
        """bool (n,): the draws (with ``factors`` base factors each, float64, and ``single``
        the node of a draw's only factor, -1 otherwise) that are not enumerated."""
        if self.degrees < 0:
            return np.ones(factors.size, dtype=bool)
        keep = factors >= 1
        if self.degrees >= 1 and self.listed_keys is None:
            keep &= (factors >= 2) | ~self.enumerable[np.maximum(single, 0)]
        return keep


def plan(skel: Skeleton, t, columns: int, seed: int = 0, reach_all: bool = False) -> Plan:
    """The enumerated columns of ``skel`` (the skeleton the sampler walks) under the
    wide-input rule for a budget of ``columns``; ``seed`` chooses the subset of degree-1
    columns of wide inputs (its own generator, apart from the blocks').  ``reach_all``:
    where the rule would take a PPS subset (whose sampled part cannot draw the unlisted
    degree-1 columns), list every degree-0 and 1 column when they are fewer than D, and
    otherwise the constant and the ``D/2 - 1`` heaviest, with the sampled part drawing
    all the rest (:attr:`Plan.listed_keys`): every feature is then within reach."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(0, 1))))
    from .draws import _Batch, _canonicalise, _keys, _unique_keys

    n_nodes = len(skel.nodes)
    p0, p1 = degree_probabilities(skel, t)
    enumerable = np.zeros(n_nodes, dtype=bool)
    rows = [(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), 0, p0)]  # the constant
    listed = 0
    for v in skel.nodes:
        if not isinstance(v, InputNode) or p1[v.id] <= 0.0:
            continue
        count = one_factor_count(v.base)
        if count is None or listed + count > MAX_LISTED:
            continue
        listed += count
        table = one_factor_columns(v.base)
        if table is None:
            continue
        enumerable[v.id] = True
        code, power, phase, prob = table
        for k in range(code.size):
            if power[k] == 0:  # no factor (categorical frequency 0): the constant column
                rows.append((np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), 0,
                             p1[v.id] * prob[k]))
            else:
                rows.append((np.array([v.id]), code[k:k + 1], power[k:k + 1], int(phase[k]), p1[v.id] * prob[k]))

    def build(rows):
        lengths = np.array([r[0].size for r in rows], dtype=np.int64)
        ptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=ptr[1:])
        cat = (lambda i: np.concatenate([r[i] for r in rows]).astype(np.int64))
        b = _Batch(kind=np.zeros(len(rows), np.uint8), ptr=ptr, node=cat(0), code=cat(1), power=cat(2),
                   omega=np.zeros(0), continuous=np.zeros(len(rows), dtype=bool),
                   factors=lengths.astype(np.float64), degree=np.zeros(len(rows), np.int64))
        _canonicalise(skel, t, b, np.array([r[3] for r in rows], dtype=np.int64))
        keys = _keys(b, 0)
        inv, first, _, _ = _unique_keys(keys[:, 0], keys[:, 1])
        w = np.bincount(inv, weights=[r[4] for r in rows], minlength=first.size)
        live = np.flatnonzero(w > 0)
        return _select(b, first[live]), w[live]

    p_all = p0 + float(p1[enumerable].sum())
    budget = int(MAX_EXACT_SHARE * columns)
    degrees, batch, weight = 1, *build(rows)
    subset = weight.size
    if 1.0 - p_all <= NO_MASS and weight.size > budget and (
            weight.size < columns or (budget >= 2 and weight[0] > 0 and batch.ptr[1] == 0)):
        # Nothing beyond degree 1: the listed columns are every feature, and no room is
        # kept for a sampled part of no mass (half of D here refused a D that the features
        # fill, with a false count): all are taken, a PPS subset of D when there are more,
        # and fewer than D is refused at once with their true number.
        budget = columns
    listed_keys = None
    if reach_all and weight.size > budget and budget >= 2 and weight[0] > 0 and batch.ptr[1] == 0:
        # A retry after a PPS subset fell short of D (its sampled part reaches only degree
        # 2 and up, which may be fewer features than the rest of D: three binary inputs
        # under a degree-2 activation have 7 features, the subset's reach was 6 at D = 7).
        if weight.size < columns:  # all listed, the rest of D is for degree 2 and up
            budget = weight.size
        else:  # the heaviest listed with their exact weights, the sampled part draws the rest
            top = 1 + np.sort(np.argsort(-weight[1:], kind="stable")[:budget - 1])
            keep = np.concatenate(([0], top))
            batch, weight = _select(batch, keep), weight[keep]
            p_all = float(weight.sum())
            listed_keys = np.ascontiguousarray(_keys(batch, 0)).view(_KEY).ravel()
            budget = weight.size
    if weight.size > budget and budget >= 2 and weight[0] > 0 and batch.ptr[1] == 0:
        # Wide inputs: the constant stays exact, and budget - 1 of the degree-1 columns are
        # chosen by systematic sampling with probabilities proportional to their weights
        # (Horvitz-Thompson: a chosen column's weight is divided by its probability).
        pick, w = _pps(weight[1:], budget - 1, rng)
        batch, weight = _select(batch, np.concatenate(([0], 1 + pick))), np.concatenate((weight[:1], w))
    elif weight.size > budget:  # degree 1 is sampled (stratified), degree 0 alone is exact
        degrees, enumerable[:] = 0, False
        p_all = p0
        batch, weight = build(rows[:1])
        if weight.size > budget:  # D = 1: nothing enumerated
            degrees, p_all = -1, 0.0
            batch, weight = _empty(), np.zeros(0)
        subset = weight.size
    p_high = max(0.0, 1.0 - p_all)
    out = skel.nodes[skel.output]
    min_out = 0
    if degrees >= 0 and not isinstance(out, InputNode):
        min_out = 1  # output degree 0: no factor
        kids = t.children[t.child_ptr[out.id]:t.child_ptr[out.id + 1]]
        if degrees >= 1 and listed_keys is None and enumerable[kids].all():
            min_out = 2  # output degree 1: one factor at an enumerated node
    return Plan(degrees, batch, weight, p_high if p_high > NO_MASS else 0.0, enumerable, min_out, subset, listed_keys)


def _pps(w: np.ndarray, m: int, rng: np.random.Generator):
    """``m`` of the items with weights ``w`` (float64 > 0, more than ``m`` of them), by
    systematic sampling in their order with inclusion probabilities ``pi`` proportional to
    ``w`` (capped at 1, the rest rescaled): the chosen indices (int64, increasing) and
    their weights ``w / pi``, so that the chosen items' weighted sum is unbiased."""
    pi = np.zeros(w.size)
    full = np.zeros(w.size, dtype=bool)
    while True:  # items whose share would exceed 1 are taken surely
        left = m - int(full.sum())
        pi[~full] = left * w[~full] / w[~full].sum()
        over = ~full & (pi >= 1.0)
        if not over.any():
            break
        full |= over
    pi[full] = 1.0
    edges = np.floor(np.concatenate(([0.0], np.cumsum(pi))) + rng.random())
    pick = np.flatnonzero(edges[1:] > edges[:-1])
    return pick, w[pick] / pi[pick]


def _empty():
    from .draws import _Batch

    z = np.zeros(0, np.int64)
    return _Batch(kind=np.zeros(0, np.uint8), ptr=np.zeros(1, np.int64), node=z, code=z, power=z, omega=np.zeros(0),
                  continuous=np.zeros(0, dtype=bool), factors=np.zeros(0), degree=z)


def _select(b, rows: np.ndarray):
    """The draws ``rows`` (int64, increasing) of batch ``b``, as a batch (continuous terms
    keep their offsets into ``b.omega``)."""
    from ._compiled import take_terms
    from .draws import _Batch

    rows = np.asarray(rows, dtype=np.int64)
    lengths = b.ptr[rows + 1] - b.ptr[rows]
    size = int(lengths.sum())
    node, code, power = (np.empty(size, dtype=np.int64) for _ in range(3))
    if rows.size:
        take_terms(b.ptr, b.node, b.code, b.power, rows, node, code, power, 0)
    ptr = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    return _Batch(kind=b.kind[rows], ptr=ptr, node=node, code=code, power=power, omega=b.omega,
                  continuous=b.continuous[rows], factors=b.factors[rows], degree=b.degree[rows],
                  single=None if b.single is None else b.single[rows])
