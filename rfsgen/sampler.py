"""Sampling compositional random features (paper Sec. 5, Algorithm 1) with exact deduplication.

One *draw* walks the skeleton from the output: at an internal node it draws a
degree l with P(l = i) = a_i and then l children uniformly with replacement; at
an input node it draws a base omega.  The walk is vectorised over a batch of
draws and over *multiplicities*: ``m`` iid sub-draws at the same node of the
same draw are one item with multiplicity ``m`` (their total degree is drawn at
once, their children by one uniform/multinomial choice), and ``c`` base draws
at one input node are combined when drawn (circle: 2 Binomial(c, 1/2) - c;
categorical: uniform; binary: c mod 2; gaussian: sqrt(c) N(0, I); laplace:
c Cauchy; sphere: a multiset of codes).  This is exact, and it is what makes
heavy-tailed degrees (relu, step) affordable without capping them.

Each draw's terms ``(input node, code, power)`` are sorted; a feature and its
conjugate are one identity (the lexicographically smaller form is kept); a
feature equal to its conjugate is real and used as is; otherwise a phase bit
``b`` in {0, pi/2} is drawn.  Identical (kind, terms) columns merge with
``count``; the weight of a column is ``count / q``.

Draws come in blocks of a fixed schedule (:func:`block_sizes`: 1024 draws, doubling
up to a cap set by the skeleton); block k has its own generator made from (seed, k)
(:func:`_block_rng`), so blocks are walked on every core and the draws do not depend
on the thread count or on D.  Draw order is defined (block, then the order inside
a block), so the D-th new column is found at a defined draw and ``q`` counts every
draw up to it.  Same skeleton, seed and D give the same file on any number of threads.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import budget
from .errors import LimitError, SamplerError, UsageError, count
# The batch of draws, its canonical forms and keys and the DAG's tables are shared with
# rfsgen.exact, one module down (rfsgen.draws); the names stay importable from here.
from .draws import (
    KIND_COS,
    KIND_REAL,
    KIND_SIN,
    _Batch,
    _canonicalise,
    _keys,
    _push_down,
    _Tables,
    _tables,
    _unique_keys,
)
from .features import FeatureSet
from .skeleton import Skeleton

#: Most draws per block.  Measured: 2^16 walks as fast per draw as 2^18, and keeps the
#: work walked past the last column needed small.
BLOCK = 1 << 16
#: Draws in the first block; later blocks double up to the cap (small D stay cheap).
FIRST_BLOCK = 1 << 10
#: Continuous bases draw a whole frequency vector per term: the cap keeps a block's
#: frequencies near this many float64 values (16 MiB) for wide inputs.
BLOCK_OMEGA_VALUES = 1 << 21


def block_sizes(skeleton: Skeleton, columns: int = 0):
    """The fixed draw schedule of ``skeleton``: an endless iterator of block sizes (even).
    It depends on the skeleton alone -- never on the seed or threads, and not on D except
    for orthogonal (orf) frequencies, whose first block is D draws when D is below one
    orthogonal set (as many rows as needed, not a whole d x d set)."""
    groups = [base for base, _, _ in skeleton.input_groups if base.continuous]
    cap = BLOCK
    if groups:
        cap = max(FIRST_BLOCK // 4, min(BLOCK, 1 << int(math.log2(max(1, BLOCK_OMEGA_VALUES // max(b.width for b in groups))))))
    ortho = [b.width for b in groups if b.name == "gaussian" and b.param("orthogonal")]
    if ortho:
        # orf: a block holds whole orthogonal d x d sets (two draws, cos and sin, per
        # frequency), as one batch of D columns did before blocks.
        unit = 2 * max(ortho)
        cap = max(unit, cap - cap % unit)
        if 0 < columns < unit:
            yield columns + columns % 2
        size = unit
    else:
        size = min(FIRST_BLOCK, cap)
    while True:
        yield size
        size = min(2 * size, cap)
#: Most columns one feature set may have.  Measured on 2 cores, cifar-deep: 10^7 columns take
#: about a minute and 2.1 GB at peak; 10^8 need roughly ten times the memory.
MAX_COLUMNS = 100_000_000
#: The sampler gives up when this many consecutive draws find no new column (plus
#: 100 times the draws per column so far, for skeletons that dedup heavily): the
#: skeleton then has (almost) no features left to find.
STALL_DRAWS = 1_000_000
#: Most draws one sample may consume: ``MAX_DRAWS + DRAWS_PER_COLUMN * D``.  Skeletons whose
#: new columns get ever rarer (circle powers behind heavy-tailed degrees) would otherwise
#: walk for hours; 2^25 draws take about 10 s for the cheapest skeletons on two cores, and a
#: skeleton that needs more than 2^25 / D draws per column dedups too hard to be of use.
MAX_DRAWS = 1 << 25
DRAWS_PER_COLUMN = 64
#: ... and the draws are fewer where one draw walks many items (stacked exp with a large
#: beta) or passes many nodes (the walk visits every node of the skeleton once per draw:
#: 999 stacked relu layers cost 13 us a draw): at most ``MAX_WALK_ITEMS`` expected walk
#: items plus nodes (:class:`Footprint`) beside the per-column allowance, a minute or so.
MAX_WALK_ITEMS = 1 << 28
#: Once this many draws are made, the sampler also stops when even a generous rate of new
#: columns (an upper confidence bound on the rate in the latter half of the draws so far;
#: the expected rate only falls as draws go on) would need more draws than the cap to
#: reach D: the run could not finish.
PROJECT_AFTER = 1 << 22
#: Bytes a block's walk holds per item (int64 draw, node, multiplicity and degree, the
#: picks and their outputs, sorting permutations), and per base term after the walk
#: (terms, their conjugates, canonical forms, keys); measured as peak RSS over items.
ITEM_BYTES = 96
TERM_BYTES = 160
#: Bytes per column found (hash table, counts, kinds, lengths, pointers) besides its terms.
COLUMN_BYTES = 96


def _children_per_item(act, fanin: int) -> float:
    """Expected items an item of multiplicity one creates at a node of ``act`` with
    ``fanin`` children: its degree, except that degrees above 8 x fan-in (drawn as
    multinomial counts, :func:`_choose_children`) make at most ``fanin`` items.  Finite
    even for heavy tails (step)."""
    a = act.coefficients
    cut = min(a.size, 8 * fanin + 1)
    i = np.arange(cut, dtype=np.float64)
    small = float(np.dot(i, a[:cut]))
    rest = max(0.0, 1.0 - float(a[:cut].sum()))  # mass above the cut, the tail's included
    # Degrees between the table's end and 8 x fan-in (only with fan-ins above 4096) make
    # up to 8 x fan-in items each; above the cut at most fan-in.
    return small + rest * (8 * fanin if cut == a.size and a.size <= 8 * fanin else fanin)


def _per_node(t: _Tables, fn) -> np.ndarray:
    """float64 ``(N,)``: ``fn(activation, fan_in)`` at each internal node, 0 at inputs (one call per distinct pair)."""
    out = np.zeros(t.is_input.size)
    internal = np.flatnonzero(~t.is_input)
    if internal.size:
        span = int(t.fanin.max()) + 1
        keys, inv = np.unique(t.act_index[internal] * span + t.fanin[internal], return_inverse=True)
        vals = np.array([fn(t.activations[int(k // span)], int(k % span)) for k in keys])
        out[internal] = vals[inv.ravel()]
    return out


@dataclass(frozen=True)
class Footprint:
    """What one draw of a skeleton costs, in expectation (the walk is random: a block's
    actual counts scatter around these).  ``reach`` is float64 ``(N,)``: items arriving
    at each node per draw (1 at the output; an internal node passes each of its items'
    expected children to its children uniformly), so ``reach`` summed over the input
    nodes is the complexity C(S) (with heavy tails capped as the walk caps them)."""

    reach: np.ndarray
    items: float  # walk items per draw, all levels
    terms: float  # base terms per draw after combining at each input node
    omega: float  # float64 frequency values per draw (gaussian/laplace rows)
    ortho: float  # float64 values of one orthogonal d x d block (orf), drawn at once
    labels: tuple  # node labels, for messages
    omega_node: int  # the input node holding most frequency values per draw (-1: none)

    def block_bytes(self, draws: int) -> float:
        """Estimated peak bytes of walking a block of ``draws`` draws."""
        return draws * (ITEM_BYTES * self.items + TERM_BYTES * self.terms + 3 * 8 * self.omega) + 8 * self.ortho

    def column_bytes(self, columns: int) -> float:
        """Estimated bytes of ``columns`` columns held until the file is written (terms
        grown by doubling, then compacted: twice their size; a new column tends to have
        more terms than the average draw, which the constant columns pull down: one more).
        Measured: cifar-deep, 10^6 columns, 166 MB over the start-up's 150 MB (estimate 155 MB)."""
        return columns * (COLUMN_BYTES + 2 * 24 * (self.terms + 1) + 2 * 8 * self.omega)

    def node(self) -> int:
        """The node most of a draw's memory goes to: the widest frequency rows, or the most reached node."""
        if self.omega_node >= 0 and 3 * 8 * self.omega >= ITEM_BYTES * self.items:
            return self.omega_node
        return int(np.argmax(self.reach))


def footprint(skel: Skeleton, t: _Tables) -> Footprint:
    """The expected cost of one draw of ``skel`` (see :class:`Footprint`): one pass over
    the nodes from the output down (nodes are in topological order)."""
    reach = _push_down(skel, t, _per_node(t, lambda act, f: _children_per_item(act, f) / f))
    terms = 0.0
    omega = 0.0
    ortho = 0.0
    omega_node, most = -1, 0.0
    for base, ids, _ in t.groups:
        r = reach[ids]
        if base.continuous:
            # A node's draws combine into one frequency row per draw that reaches it, and
            # a draw reaches it with probability at most min(1, reach).
            rows = np.minimum(r, 1.0)
            terms += float(rows.sum())
            values = rows * base.width
            omega += float(values.sum())
            if values.size and float(values.max()) > most:
                most, omega_node = float(values.max()), int(ids[int(np.argmax(values))])
            if base.name == "gaussian" and base.param("orthogonal"):
                ortho = max(ortho, 2.0 * base.width * base.width)
        else:
            codes = base.uniform_codes or 1  # combined into one term, or a multiset of codes (sphere)
            terms += float(np.minimum(r, codes).sum())
    labels = tuple(v.label for v in skel.nodes)
    return Footprint(reach, float(reach.sum()), terms, omega, ortho, labels, omega_node)


def _max_degree(act) -> float:
    """The largest degree ``act`` can draw: the table's last non-zero coefficient, or
    ``inf`` for unbounded degrees (Poisson for exp, the exact tails of relu and step)."""
    a = act.coefficients
    if act.tail is not None or (act.name == "exp" and a.size > 1):
        return math.inf
    nz = np.flatnonzero(a > 0)
    return float(nz[-1]) if nz.size else 0.0


def feature_space(skel: Skeleton, t: _Tables | None = None) -> float:
    """An upper bound on the distinct columns ``skel`` can give (``inf`` when unbounded).

    A column is a product over input nodes of each node's combined factor and a kind;
    a feature and its conjugate are one identity giving at most two kinds (cos, sin), a
    real one one kind, so the columns are at most the product over input nodes of the
    values a node's combined factor can take (power or code 0, i.e. no factor, included):
    binary 2, categorical n, circle 2F + 1 and sphere the multisets of at most F of its
    codes, where F bounds the factors a draw brings to the node (a product of the
    largest degrees along its paths); gaussian and laplace frequencies are continuous.
    Where the draw's total factors are bounded too (T, the output's largest degree times
    the largest T of its children, 1 at an input node), a value costs at least its
    factors at its node (binary odd or categorical non-zero: 1, circle power p: |p|, a
    sphere multiset of k codes: k) and the costs of one column add up to at most T: the
    columns are then at most the assignments of values within that total (three binary
    inputs under a degree-2 activation: 1 + 3 + 3 = 7, not 2^3 = 8).
    Returned as a float (it may exceed 2^63)."""
    t = t if t is not None else _tables(skel)
    most = _push_down(skel, t, _per_node(t, lambda act, f: _max_degree(act)))  # F: factors one draw can bring
    # Exact integers (float64 factor counts are exact below 2^53; above, the bound is huge anyway).
    big = 10**30
    total = 1
    costs = []  # (values of each least cost 0, 1, .., times): for the bound on the total factors
    for base, ids, _ in t.groups:
        reached, times = np.unique(most[ids], return_counts=True)
        for f, k in zip(reached.tolist(), times.tolist()):  # k input nodes reached by at most f factors
            if f == 0:
                continue
            if base.continuous or f == math.inf and base.name not in ("binary", "categorical"):
                return math.inf
            if base.name == "binary":
                values, by_cost = 2, [1.0, 1.0]
            elif base.name == "categorical":
                values = int(base.param("categories"))
                by_cost = [1.0, float(values - 1)]
            elif base.uniform_codes:  # multisets of at most f of c codes: C(f + c, c)
                c = base.uniform_codes
                log = math.lgamma(f + c + 1) - math.lgamma(f + 1) - math.lgamma(c + 1)
                values = math.comb(int(f) + c, c) if log < 80 else big
                by_cost = [float(min(math.comb(j + c - 1, c - 1), big)) for j in range(int(min(f, _MAX_COST)) + 1)] \
                    if log < 80 else None  # multisets of exactly j codes
            elif base.name == "circle":
                values = 2 * int(f) + 1
                by_cost = [1.0] + [2.0] * int(min(f, _MAX_COST))
            else:  # a base without a stated value count
                return math.inf
            if values > 1:
                total = big if k * math.log(values) > 80 else min(total * values ** k, big)
                costs.append((by_cost, k))
    return float(min(total, _within_total(skel, t, costs, big)))


#: The total-factor bound (:func:`feature_space`) is used up to this many factors.
_MAX_COST = 4096


def _within_total(skel: Skeleton, t: _Tables, costs: list, big: float) -> float:
    """The assignments of values to input nodes whose least costs add up to at most the
    draw's total factors T (``costs``: per input node kind, the values of each least cost
    and how many such nodes); ``inf`` where T is unbounded or above :data:`_MAX_COST`, or
    the count would take more than ``_MAX_COST ** 2`` steps."""
    per = _per_node(t, lambda act, f: _max_degree(act))
    most = np.zeros(len(skel.nodes))
    for v in skel.nodes:  # children first
        if t.is_input[v.id]:
            most[v.id] = 1.0
        elif per[v.id] > 0:
            kids = t.children[t.child_ptr[v.id]:t.child_ptr[v.id + 1]]
            below = float(most[kids].max())
            most[v.id] = per[v.id] * below if below > 0 else 0.0  # 0 above constants only: no factor
    cap = float(most[skel.output])
    if not cap <= _MAX_COST or any(c is None for c, _ in costs):
        return math.inf
    size = int(cap) + 1
    if sum(k * min(len(c), size) for c, k in costs) * size > _MAX_COST ** 2:  # too long to count
        return math.inf
    poly = np.zeros(size)
    poly[0] = 1.0
    with np.errstate(over="ignore"):
        for by_cost, k in costs:
            c = np.asarray(by_cost[:size])
            for _ in range(k):
                poly = np.minimum(np.convolve(poly, c)[:size], big)
                if poly[-1] >= big:
                    return math.inf
    return float(min(poly.sum(), big))


def _space_text(space: float) -> str:
    if space == math.inf:
        return "its distinct columns are unbounded, but new ones come ever more rarely"
    return f"it can give at most {space:.6g} distinct columns"


def check_block(skel: Skeleton, fp: Footprint, draws: int, columns: int = 0) -> None:
    """:func:`rfsgen.budget.check` a block of ``draws`` draws (and ``columns`` columns
    held beside it) against the memory budget, before walking it: a
    :class:`~rfsgen.errors.LimitError` naming the node the memory goes to."""
    need = fp.block_bytes(draws) + fp.column_bytes(columns)
    if need <= budget.limit():
        return
    if not draws:
        budget.check(need, f"skeleton '{skel.path}': the {columns} columns asked for (about {fp.terms:.3g} terms and "
                           f"{fp.omega:.3g} frequency values each)", "ask for fewer columns with -n")
        return
    v = fp.node()
    node = skel.nodes[v]
    if v == fp.omega_node and fp.omega_node >= 0:
        what = (f"skeleton '{skel.path}', node '{fp.labels[v]}' ({node.base.name} over {node.base.width} columns): "
                f"sampling {draws} draws with about {fp.omega / max(fp.terms, 1e-300):.3g} x {node.base.width} "
                f"frequency values per term")
        fix = "give the gaussian/laplace node fewer columns (per: group or patch), or use fewer -n"
    else:
        what = (f"skeleton '{skel.path}', node '{fp.labels[v]}': sampling {draws} draws, each reaching this node "
                f"about {fp.reach[v]:.3g} times ({fp.items:.3g} walk items, complexity C(S) = {skel.complexity:.3g})")
        fix = "use fewer or flatter layers (a smaller exp beta or polynomial degree: C(S) multiplies over layers)"
    if columns:
        what += f" and holding {columns} columns"
    budget.check(need, what, fix)


def _sort_order(key: np.ndarray) -> np.ndarray:
    """A stable sorting permutation of non-negative int64 ``key``.

    Keys below 2^32 (every batch's (draw, node) keys) go through two 16-bit radix
    passes, several times faster than a comparison sort of int64.
    """
    if key.size and int(key.max()) < 2**32:
        k = key.astype(np.uint32)
        order = np.argsort((k & 0xFFFF).astype(np.uint16), kind="stable")
        return order[np.argsort((k[order] >> 16).astype(np.uint16), kind="stable")]
    return np.argsort(key, kind="stable")


def _merge_leaves(skel, draw, node, mult, n_draws):
    """A block's leaf items (int64 each; draws below ``n_draws``) merged: one item per
    distinct (draw, node), sorted by it, with the multiplicities summed
    (:func:`rfsgen._compiled.merge_leaves`)."""
    from ._compiled import merge_leaves

    out_draw, out_node, out_mult = (np.empty(draw.size, dtype=np.int64) for _ in range(3))
    k = merge_leaves(draw, node, mult, n_draws, out_draw, out_node, out_mult)
    if k < 0:
        raise SamplerError(f"internal error: a walk of '{skel.path}' made an item outside its block of draws")
    return out_draw[:k], out_node[:k], out_mult[:k]


def _stratified_uniforms(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` uniforms on [0, 1), one in each interval [i/n, (i+1)/n) (systematic: one
    shared offset), in random order.  Each is exactly uniform; together they hit every
    part of [0, 1) in proportion."""
    return (rng.permutation(n) + rng.random()) / n


def _walk(skel: Skeleton, t: _Tables, rng: np.random.Generator, n_draws: int, stratify: bool = False,
          min_degree: int = 0, track_single: bool = False) -> _Batch:
    """``n_draws`` draws.

    ``min_degree`` (scheme ``exact``, with ``stratify``): output degrees are drawn from their
    law conditioned on being at least this (the stratified quantiles mapped into the upper
    part of the distribution).  ``track_single`` fills the batch's ``single``.

    ``stratify`` (the ``strat`` scheme): randomness that no two items of one draw share
    is drawn as stratified samples across the block instead of iid -- degrees of items
    alone in their draw at a level (every draw at the output node), the single child
    pick of such items of degree 1, and sphere codes of single leaf items per node.  The
    block's counts then follow the probabilities to within one.  Each draw's own walk
    keeps exactly the rfs distribution (each stratified value is uniform and independent
    of the rest of its draw), so the estimator stays unbiased; draws of a block are
    negatively correlated, which is what lowers the variance."""
    from ._compiled import level_census

    phase = rng.integers(0, 2, n_draws)
    draw = np.arange(n_draws, dtype=np.int64)
    node = np.full(n_draws, skel.output, dtype=np.int64)
    mult = np.ones(n_draws, dtype=np.int64)
    out_degree = np.zeros(n_draws, dtype=np.int64)
    leaves = []
    first = True
    per_act = np.zeros(len(t.activations), dtype=np.int64)
    while draw.size:
        per_act[:] = 0
        n_leaves = level_census(node, t.is_input, t.act_index, per_act)
        if n_leaves < 0:
            raise SamplerError(f"internal error: a walk of '{skel.path}' reached a node outside its tables")
        if n_leaves == draw.size:  # (the usual last level: no selections)
            leaves.append((draw, node, mult))
            break
        if n_leaves:
            leaf = t.is_input[node]
            leaves.append((draw[leaf], node[leaf], mult[leaf]))
            draw, node, mult = draw[~leaf], node[~leaf], mult[~leaf]
        degree = np.empty(draw.size, dtype=np.int64)
        if stratify:  # at most one item of a draw may take its randomness from a shared stratified sequence
            alone = np.bincount(draw, minlength=n_draws)[draw] == 1
        present = np.flatnonzero(per_act)  # a few activations: no sort needed
        several = present.size > 1
        acts = t.act_index[node] if several else None
        if not several and not stratify:
            # The usual level: one activation for every item, no selections needed.
            degree = _degrees(t.activations[present[0]], rng, mult)
            present = ()
        for a in present:
            sel = np.flatnonzero(acts == a) if several else np.arange(draw.size)
            act = t.activations[a]
            m = mult[sel]
            if stratify:
                # Items alone in their draw at this level (every item at the output node)
                # take their degrees at stratified quantiles; the rest draw as in rfs.
                st = (m == 1) & alone[sel]
                u = _stratified_uniforms(rng, int(st.sum()))
                if first and min_degree > 0:
                    lo = float(act._cdf[min_degree - 1]) / (float(act._cdf[-1]) if act.tail is None else 1.0)
                    u = lo + u * (1.0 - lo)
                degree[sel[st]] = act.degrees_at(rng, u)
                sel, m = sel[~st], m[~st]
                if not sel.size:
                    continue
            degree[sel] = _degrees(act, rng, m)
        if first:
            out_degree[draw] = degree
            first = False
        draw, node, mult = _choose_children(t, rng, draw, node, degree, alone & (degree == 1) if stratify else None)
    return _leaves_to_terms(skel, t, rng, leaves, n_draws, phase, out_degree, stratify, track_single)


def _degrees(act, rng, mult) -> np.ndarray:
    """Degrees (int64) of items with multiplicities ``mult`` at activation ``act``: single
    items draw plain degrees, merged ones the sum of as many (rarer, slower)."""
    one = mult == 1
    if one.all():
        return np.asarray(act.sample_degrees(rng, mult.size), dtype=np.int64)
    degree = np.empty(mult.size, dtype=np.int64)
    degree[one] = act.sample_degrees(rng, int(one.sum()))
    degree[~one] = act.sum_degrees(rng, mult[~one])
    return degree


def _pair(b: _Batch) -> _Batch:
    """Each draw twice in a row: complex ones with b = 0 then b = pi/2, real ones as they are.

    The [cos, sin] pair of one frequency cancels the cos(theta + theta') noise a
    single random phase carries (used by the ``orf`` scheme, as in Yu et al. 2016).
    """
    from ._compiled import take_terms

    n = b.kind.size
    lengths = np.diff(b.ptr)
    twice = np.repeat(np.arange(n), 2)
    size = 2 * int(lengths.sum())
    node, code, power = (np.empty(size, dtype=np.int64) for _ in range(3))
    take_terms(b.ptr, b.node, b.code, b.power, twice, node, code, power, 0)
    kind = np.repeat(b.kind, 2)
    kind[1::2] = np.where(b.kind == KIND_REAL, KIND_REAL, KIND_SIN)
    kind[0::2] = np.where(b.kind == KIND_REAL, KIND_REAL, KIND_COS)
    ptr = np.zeros(2 * n + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(lengths[twice])
    return _Batch(kind=kind, ptr=ptr, node=node, code=code, power=power, omega=b.omega,
                  continuous=np.repeat(b.continuous, 2), factors=np.repeat(b.factors, 2), degree=np.repeat(b.degree, 2))


def _choose_children(t, rng, draw, node, degree, stratified=None):
    """Pick ``degree`` children uniformly with replacement for every item.  Items where
    ``stratified`` (bool, optional) is set have degree 1 and are alone in their draw:
    their single pick is stratified per node (:func:`_stratified_codes`).  Returns the
    new items' ``(draw, node, multiplicity)``: one per pick, then the multinomial
    counts of items with huge degrees, node by node."""
    from ._compiled import child_plan, expand_picks

    # Items with huge degrees draw multinomial counts below; the rest pick one child per unit.
    small_deg = np.empty(degree.size, dtype=np.int64)
    total, f0, same, any_big = child_plan(node, degree, t.fanin, small_deg)
    bi = np.flatnonzero(small_deg != degree) if any_big else None  # big items (their degrees are > 0)
    # Room for every item at once (a big item yields at most min(degree, fan-in) children),
    # so that nothing is concatenated afterwards.
    room = total + (int(np.minimum(degree[bi], t.fanin[node[bi]]).sum()) if any_big else 0)
    out_draw, out_child = np.empty(room + 1, dtype=np.int64), np.empty(room + 1, dtype=np.int64)
    out_mult = np.ones(room, dtype=np.int64)
    if total:
        if same:
            pick = rng.integers(0, f0, total)  # one layer shares a fan-in: a scalar bound is much faster
        else:
            pick = rng.integers(0, np.repeat(t.fanin[node], small_deg))
        if stratified is not None and stratified.any():
            at = np.cumsum(small_deg)[stratified] - 1  # the one unit of each such item
            pick[at] = _stratified_codes(rng, node[stratified], t.fanin[node[stratified]])
        expand_picks(draw, node, small_deg, pick, t.child_ptr, t.children, out_draw, out_child)
    k = total
    if any_big:
        for v in np.unique(node[bi]):  # one multinomial call per node with huge degrees (rare)
            sel = bi[node[bi] == v]
            fan = int(t.fanin[v])
            counts = rng.multinomial(degree[sel], np.full(fan, 1.0 / fan))
            r, c = np.nonzero(counts)
            out_draw[k:k + r.size] = draw[sel][r]
            out_child[k:k + r.size] = t.children[t.child_ptr[v] + c]
            out_mult[k:k + r.size] = counts[r, c]
            k += r.size
    return out_draw[:k], out_child[:k], out_mult[:k]


def _stratified_codes(rng, node, ncodes):
    """One uniform code in [0, ncodes) per item, stratified per node: the r items of a
    node take codes floor((k + U) ncodes / r), k = 0 .. r - 1, in random order (U uniform,
    one per node).  Each item's code is exactly uniform (up to the rounding of one
    float64 product) and independent of the codes at other nodes; the items of one node
    (all from different draws) share the codes out evenly.  ``node`` int64 (n,);
    ``ncodes`` an int or int64 (n,) (the same for the items of one node); returns int64 (n,)."""
    n = node.size
    if not n:
        return np.zeros(0, np.int64)
    perm = rng.permutation(n)
    order = perm[_sort_order(node[perm])]  # by node (stable), so in random order within a node
    sn = node[order]
    starts = np.flatnonzero(np.concatenate(([True], sn[1:] != sn[:-1])))
    runs = np.diff(np.append(starts, n))
    k = np.arange(n) - np.repeat(starts, runs)
    u = (k + np.repeat(rng.random(starts.size), runs)) / np.repeat(runs, runs)
    nc = ncodes[order] if isinstance(ncodes, np.ndarray) else ncodes
    code = np.empty(n, np.int64)
    code[order] = np.minimum((u * nc).astype(np.int64), nc - 1)
    return code


def _leaves_to_terms(skel, t, rng, leaves, n_draws, phase, out_degree, stratify=False, track_single=False) -> _Batch:
    from ._compiled import term_order

    if leaves:
        draw, node, mult = (np.concatenate(x) for x in zip(*leaves)) if len(leaves) > 1 else leaves[0]
        draw, node, mult = _merge_leaves(skel, draw, node, mult, n_draws)
    else:
        draw = node = mult = np.zeros(0, dtype=np.int64)
    factors = np.bincount(draw, weights=mult, minlength=n_draws)
    single = None
    if track_single:  # a draw with one factor has one leaf item, of multiplicity one
        single = np.full(n_draws, -1, dtype=np.int64)
        one = np.flatnonzero(factors[draw] == 1)
        single[draw[one]] = node[one]
    parts = []
    omegas = []
    omega_size = 0
    has_cont = np.zeros(n_draws, dtype=bool)
    grp = t.group_of[node]
    for g, (base, _, _) in enumerate(t.groups):
        sel = np.flatnonzero(grp == g)
        if not sel.size:
            continue
        if stratify and base.uniform_codes:
            # Items of multiplicity one draw one uniform code each: stratify them per node.
            one = mult[sel] == 1
            s1 = sel[one]
            codes = _stratified_codes(rng, node[s1], base.uniform_codes)
            parts.append((draw[s1], node[s1], codes, np.ones(s1.size, np.int64)))
            sel = sel[~one]
            if not sel.size:
                continue
        item, code, power, omega = base.sample(rng, mult[sel])
        if base.continuous:
            code = omega_size + code * base.width
            omegas.append(omega.ravel())
            omega_size += omega.size
            has_cont[draw[sel][item]] = True
        parts.append((draw[sel][item], node[sel][item], code, power))
    if parts:
        d, v, c, p = (np.concatenate(x) for x in zip(*parts))
    else:
        d = v = c = p = np.zeros(0, dtype=np.int64)
    ptr = np.empty(n_draws + 1, dtype=np.int64)
    order, moved = term_order(d, v, c, n_draws, ptr)  # (d, v, c) usually come in order already
    if order.size != d.size:
        raise SamplerError(f"internal error: a walk of '{skel.path}' made a term outside its block of draws")
    if moved:
        d, v, c, p = d[order], v[order], c[order], p[order]
    omega = np.concatenate(omegas) if omegas else np.zeros(0)
    batch = _Batch(
        kind=np.zeros(n_draws, dtype=np.uint8), ptr=ptr, node=v, code=c, power=p, omega=omega,
        continuous=has_cont, factors=factors, degree=out_degree, single=single,
    )
    _canonicalise(skel, t, batch, phase)
    return batch


class _Known:
    """The keys of the columns found so far and their ids: a hash table sized for
    ``columns`` keys up front (:func:`rfsgen._compiled.known_find`), searched and
    filled by the main thread only, one block at a time."""

    def __init__(self, columns: int):
        size = 1024
        while 3 * size < 4 * columns:  # at most three quarters full
            size *= 2
        self.table = np.zeros((size, 3), dtype=np.uint64)

    def find(self, u1, u2) -> np.ndarray:
        """The id (int64) of each key ``(u1[i], u2[i])``, -1 for keys not known yet."""
        from ._compiled import known_find

        out = np.empty(u1.size, dtype=np.int64)
        known_find(self.table, u1, u2, out)
        return out

    def add(self, u1, u2, ids):
        """Record new distinct keys with their ids (int64)."""
        from ._compiled import known_insert

        known_insert(self.table, u1, u2, ids)


class _Columns:
    """Columns found so far, filled in place: their keys, kinds and term counts (one slot
    per column asked for) and their terms (int64, grown as needed: :meth:`_room`)."""

    def __init__(self, columns: int):
        self.known = _Known(columns)
        self.kind = np.empty(columns, dtype=np.uint8)
        self.lengths = np.empty(columns, dtype=np.int64)
        self.found = 0
        self.terms = 0
        self.node = self.code = self.power = np.empty(0, dtype=np.int64)
        self.omega = []

    def _room(self, need: int, found: int):
        """Room for ``need`` terms, ``found`` columns counted: for as many terms per column
        over all the columns asked for, plus a margin (later columns tend to have more
        terms), since each growth copies everything found so far."""
        if need > self.node.size:
            expected = int(1.25 * need * self.kind.size / max(found, 1))
            size = max(need, 2 * self.node.size, expected, 4096)
            for name in ("node", "code", "power"):
                grown = np.empty(size, dtype=np.int64)
                grown[:self.terms] = getattr(self, name)[:self.terms]
                setattr(self, name, grown)


def _take(b: _Batch, t: _Tables, rows: np.ndarray, cols: _Columns):
    """Append the terms of draws ``rows`` of batch ``b`` as new columns."""
    from ._compiled import take_terms

    f0, f1 = cols.found, cols.found + rows.size
    lengths = cols.lengths[f0:f1]
    np.subtract(b.ptr[rows + 1], b.ptr[rows], out=lengths)
    cols.kind[f0:f1] = b.kind[rows]
    t0 = cols.terms
    cols._room(t0 + int(lengths.sum()), f1)
    cols.terms = take_terms(b.ptr, b.node, b.code, b.power, rows, cols.node, cols.code, cols.power, t0)
    node, code = cols.node[t0:cols.terms], cols.code[t0:cols.terms]
    ci = np.flatnonzero(t.continuous[node]) if b.omega.size else ()
    if len(ci):
        w = t.width[node[ci]]
        start = code[ci]
        w0 = int(w[0])
        if np.all(w == w0) and b.omega.size % w0 == 0 and not np.any(start % w0):
            # One width everywhere (every rr/orf skeleton shipped): gather whole rows,
            # which is several times faster than an element-wise index.
            cols.omega.append(b.omega.reshape(-1, w0)[start // w0].ravel())
        else:
            gather = np.repeat(start, w) + (np.arange(w.sum()) - np.repeat(np.cumsum(w) - w, w))
            cols.omega.append(b.omega[gather])
        code[ci] = -1 - np.arange(ci.size)  # placeholder, renumbered at the end


@dataclass
class _Block:
    """One walked block: its draws, their distinct keys and per-block sums."""

    batch: _Batch
    inv: np.ndarray  # int64 (n,): index of each draw's key in u1/u2
    first: np.ndarray  # int64 (u,): first draw of each distinct key
    u1: np.ndarray  # uint64 (u,)
    u2: np.ndarray  # uint64 (u,)
    ucount: np.ndarray  # int64 (u,): draws of each distinct key
    factors: float
    factors_sq: float
    degree_hist: np.ndarray  # int64 (65,)
    raw: np.ndarray | None = None  # int64 (n,): scheme exact: each kept draw's place among the walked ones
    raw_size: int = 0  # draws walked (kept and rejected)


def _block_rng(seed: int, k: int) -> np.random.Generator:
    """The generator of block ``k``: a function of (seed, k) alone, so blocks can be walked
    in any order, on any number of threads, with the same draws."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(k,))))


class _BlockWalker:
    """Walks blocks 0, 1, 2, ... on ``threads`` worker threads (numpy releases the GIL in
    its array work), handed out in order: block 0 alone (often all a small D needs), then,
    once a second block is asked for, ``ahead`` blocks in flight.  Each block's draws
    depend only on (seed, block index), so the result does not depend on the thread count
    or on timing; blocks walked past the last one needed are discarded."""

    def __init__(self, walk, sizes, threads: int, ahead: int, check=None):
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        self._walk = walk
        self._check = check  # check(size) raises LimitError for a block over the memory budget
        self._sizes = sizes
        self._ex = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rfsgen-walk")
        self._next = 0
        self._start = 0
        self._ahead = ahead
        self._taken = 0
        self._pending = deque([self._submit()])

    def _submit(self):
        size = next(self._sizes)
        if self._check is not None:
            try:
                self._check(size)
            except LimitError as e:
                # Raised when this block is taken, not now: the blocks before it may finish the sample.
                f = Future()
                f.set_exception(e)
                self._next += 1
                self._start += size
                return f
        f = self._ex.submit(self._walk, self._next, self._start, size)
        self._next += 1
        self._start += size
        return f

    def take(self) -> _Block:
        if self._taken:
            while len(self._pending) < self._ahead:
                self._pending.append(self._submit())
        self._taken += 1
        return self._pending.popleft().result()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for f in self._pending:
            f.cancel()
        self._ex.shutdown(wait=True)


def sample(
    skeleton: Skeleton,
    columns: int,
    seed: int = 0,
    *,
    scheme: str = "rfs",
    progress: Callable[[int], None] | None = None,
    max_draws: int | None = None,
    audit: list | None = None,
    threads: int | None = None,
    _reach_all: bool = False,
) -> FeatureSet:
    """Sample ``columns`` unique random-feature columns for ``skeleton``.

    Returns a :class:`~rfsgen.features.FeatureSet`.  ``progress(n)`` is called
    with the number of new unique columns found after each block.  ``columns`` is
    1 .. :data:`MAX_COLUMNS`; ``seed`` an integer in 0 .. 2**63 - 1.  Raises
    :class:`SamplerError` when the skeleton has fewer distinct features than
    requested: at once when :func:`feature_space` bounds them below ``columns``;
    after :data:`STALL_DRAWS` + 100 q/D consecutive draws without a new column; at
    ``max_draws`` draws in all (default :data:`MAX_DRAWS` + :data:`DRAWS_PER_COLUMN`
    x D; checked after each block); or, after :data:`PROJECT_AFTER` draws, when the
    rate of new columns says the cap would come first.  Raises
    :class:`~rfsgen.errors.LimitError` before walking a block (or holding the columns)
    whose estimated memory (:class:`Footprint`) exceeds the budget
    (:mod:`rfsgen.budget`); the budget also limits the blocks walked at once.
    ``audit``, if a list, receives ``(kind, terms)`` of every consumed draw in
    draw order (slow; for checking deduplication).  ``threads`` (default: numba's
    thread count, ``NUMBA_NUM_THREADS``) walk blocks (:func:`block_sizes`) in
    parallel; the result is the same for every thread count.  The draws are made in
    blocks of a fixed size, so the first D columns of a larger sample are those of a
    sample of D columns with the same seed (not for ``scheme="exact"``, whose enumerated
    columns depend on D: :mod:`rfsgen.exact`; its feature set has float
    ``column_weight``, and the limits above count every draw walked, rejected ones included;
    where its listed columns are a PPS subset of degree 1 and the sampled part falls short
    of D, it starts again with every feature within the sampled part's reach,
    ``_reach_all``: :func:`rfsgen.exact.plan`).
    """
    skeleton.require_bound("sampling")
    if scheme != "rfs":
        from .schemes import apply_scheme

        skeleton_for_walk = apply_scheme(skeleton, scheme)
    else:
        skeleton_for_walk = skeleton
    if isinstance(columns, bool) or not isinstance(columns, (int, np.integer)) or not 1 <= columns <= MAX_COLUMNS:
        raise UsageError(f"-n must be an integer from 1 to {MAX_COLUMNS}, got {columns!r}")
    columns = int(columns)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**63:
        raise UsageError(f"--seed must be an integer from 0 to 2**63 - 1, got {seed!r}")
    seed = int(seed)
    skeleton.check_walkable()
    if threads is None:
        from ._compiled import threads as thread_count

        threads = thread_count()
    threads = max(1, int(threads))
    t = _tables(skeleton_for_walk)
    space = feature_space(skeleton_for_walk, t)

    def refuse_by_space():
        if space < columns:
            raise SamplerError(f"skeleton '{skeleton.path}' has too few distinct features for -n {columns}: it can give "
                               f"at most {count(int(space), 'distinct column')} (the values its input nodes' factors can "
                               f"take, within the factors one draw can bring); ask for at most {int(space)}, fewer if "
                               f"some are out of its reach")

    if scheme != "exact":  # exact first lists its low degrees, which may count the features exactly
        refuse_by_space()
    from .skeleton import warn_variance

    warn_variance(skeleton)  # here, where features are made from the skeleton: not on loading it or a file
    fp = footprint(skeleton_for_walk, t)
    check_block(skeleton_for_walk, fp, 0, columns)  # the columns alone
    sizes = block_sizes(skeleton_for_walk, columns)
    largest = max(next(sizes) for _ in range(32))  # the schedule reaches its cap within a few blocks
    cap_draws = max_draws if max_draws is not None else \
        int(min(MAX_DRAWS, MAX_WALK_ITEMS / max(fp.items + len(skeleton_for_walk.nodes), 1.0))) \
        + DRAWS_PER_COLUMN * columns

    # orf ends only on whole (cos, sin) pairs: the pair that brings the last column asked
    # for may bring one more (its sin half), so there is room for -n + 1 columns.
    slots = columns + 1 if scheme == "orf" else columns
    cols = _Columns(slots)
    exact = None
    if scheme == "exact":
        from .exact import _select, plan

        exact = plan(skeleton_for_walk, t, columns, seed, reach_all=_reach_all)
        if exact.columns:  # the enumerated columns come first; sampled draws that hit them add to them
            keys = _keys(exact.batch, 0)
            _, first, u1, u2 = _unique_keys(keys[:, 0], keys[:, 1])
            cols.known.add(u1, u2, np.arange(u1.size, dtype=np.int64))
            _take(exact.batch, t, first, cols)
            cols.found = u1.size
            if progress:
                progress(int(u1.size))
        if exact.p_high == 0.0 and exact.columns < columns:
            raise SamplerError(
                f"skeleton '{skeleton.path}' has only {exact.columns} distinct features (its draws of degree 0 and 1, "
                f"enumerated by --scheme exact): ask for at most {exact.columns}")
        refuse_by_space()

    def walk(k: int, start: int, size: int) -> _Block:
        rng = _block_rng(seed, k)
        raw = None
        if scheme == "orf":
            b = _pair(_walk(skeleton_for_walk, t, rng, size // 2))
        elif exact is not None:
            # Draws not enumerated: output degrees conditioned to reach them, the rest rejected.
            b = _walk(skeleton_for_walk, t, rng, size, stratify=True, min_degree=exact.min_out_degree,
                      track_single=exact.degrees >= 1)
            raw = np.flatnonzero(exact.accept(b.factors, b.single))
            if exact.listed_keys is not None:  # single-factor draws of a listed column are rejected
                one = raw[b.factors[raw] == 1]
                if one.size:
                    hit = exact.listed(_keys(_select(b, one), 0))
                    raw = raw[~np.isin(raw, one[hit])]
            b = _select(b, raw)
        else:
            b = _walk(skeleton_for_walk, t, rng, size, stratify=scheme == "strat")
        keys = _keys(b, start)
        inv, first, u1, u2 = _unique_keys(keys[:, 0], keys[:, 1])
        return _Block(b, inv, first, u1, u2, np.bincount(inv, minlength=u1.size), float(b.factors.sum()),
                      float(np.square(b.factors).sum()), np.bincount(np.minimum(b.degree, 64), minlength=65),
                      raw, size)

    counts = np.zeros(slots, dtype=np.int64)
    factors = 0.0
    factors_sq = 0.0
    degree_hist = np.zeros(65, dtype=np.int64)
    drawn = 0
    spent = 0  # draws walked (scheme exact: rejected ones included; the limits below count these)
    last_new = 0  # draws walked when the latest new column was found
    # orf blocks are whole orthogonal sets (seconds each): walk no more of them than needed.
    ahead = 1 if scheme == "orf" else threads + 1
    # Blocks in flight beside the one being consumed, as many as the memory budget holds
    # (fewer blocks at once change nothing drawn: each block's draws are its own).
    room = budget.limit() - fp.column_bytes(columns)
    ahead = max(1, min(ahead, int(room // max(fp.block_bytes(largest), 1.0)) - 1))
    history_drawn, history_found = [0], [0]  # after each block, for the rate of new columns

    checked = set()

    def check(size):
        # A block's estimate depends on its size alone, and the schedule repeats one size
        # after its first few blocks: each size is checked before its first block.  Reading
        # the cgroup's files again for every block cost about 1 ms a block (0.5-0.9 s of a
        # 10^6-column sample) and counted the sampler's own growing columns twice, since
        # their bytes are in the estimate already.
        if size not in checked:
            check_block(skeleton_for_walk, fp, size, columns)
            checked.add(size)

    if exact is not None and cols.found >= columns:  # every feature enumerated (D of them): no draw to walk
        stats = {"mean_factors_per_draw": 0.0, "var_factors_per_draw": 0.0, "output_degree_histogram": []}
        return _exact_featureset(skeleton, t, cols, counts, 0, 0, seed, stats, exact)
    retry = False  # scheme exact: a PPS subset's sampled part fell short of D
    with _BlockWalker(walk, block_sizes(skeleton_for_walk, columns), min(threads, ahead), ahead, check) as blocks:
        while True:
            try:
                blk = blocks.take()
            except SamplerError as e:
                raise SamplerError(f"{e} (after {drawn} draws of '{skeleton.path}')") from None
            b = blk.batch
            old = cols.known.find(blk.u1, blk.u2)
            new_u = np.flatnonzero(old < 0)  # in draw order: keys are numbered by first appearance
            room = columns - cols.found
            size = b.kind.size
            limit = size
            if new_u.size >= room:  # the block holds the last column needed: its draws count up to it
                limit = int(blk.first[new_u[room - 1]]) + 1
                if scheme == "orf":
                    # Whole pairs only (block sizes are even): a cos half without its sin
                    # would leave the diagonal k(x, x) inexact; the sin may be one more column.
                    limit += limit % 2
                new_u = new_u[:int(np.searchsorted(blk.first[new_u], limit))]
            truncated = limit < size
            uid = old
            uid[new_u] = cols.found + np.arange(new_u.size)
            if truncated:
                counts += np.bincount(uid[blk.inv[:limit]], minlength=slots)[:slots]
                f = b.factors[:limit]
                factors += float(f.sum())
                factors_sq += float(np.square(f).sum())
                degree_hist += np.bincount(np.minimum(b.degree[:limit], 64), minlength=65)
            else:
                counts[uid] += blk.ucount  # every key of the block has an id: all its new keys fit
                factors += blk.factors
                factors_sq += blk.factors_sq
                degree_hist += blk.degree_hist
            rows = blk.first[new_u]
            _take(b, t, rows, cols)
            if audit is not None:
                for d in range(limit):
                    a, z = b.ptr[d], b.ptr[d + 1]
                    audit.append((int(b.kind[d]), list(zip(b.node[a:z].tolist(), b.code[a:z].tolist(), b.power[a:z].tolist()))))
            cols.known.add(blk.u1[new_u], blk.u2[new_u], uid[new_u])
            cols.found += new_u.size
            raw_at = (lambda i: i) if blk.raw is None else (lambda i: int(blk.raw[i]))
            if new_u.size:  # the draw that found the latest new column
                last_new = spent + raw_at(int(rows[-1])) + 1
            drawn += limit
            spent += (raw_at(limit - 1) + 1 if limit else 0) if truncated else blk.raw_size
            if progress:
                progress(int(new_u.size))
            if cols.found >= columns:
                break
            stalled = spent - last_new > STALL_DRAWS + 100 * last_new / max(cols.found, 1)
            if (stalled or spent >= cap_draws) and exact is not None and exact.restricted:
                retry = True
                break
            if stalled or spent >= cap_draws:
                why = "it has too few distinct features" if stalled else f"the sampler stops at {cap_draws} draws"
                raise SamplerError(
                    f"skeleton '{skeleton.path}' produced only {cols.found} distinct columns in {spent} draws "
                    f"({_space_text(space)}); {why} for -n {columns}: ask for at most {cols.found}"
                )
            history_drawn.append(spent)
            history_found.append(cols.found)
            if spent >= PROJECT_AFTER and max_draws is None:
                # New columns only get rarer: even at an upper bound of the rate of the latter
                # half of the draws so far, reaching D would take more draws than are left.
                h = bisect_left(history_drawn, spent // 2)
                k = cols.found - history_found[h]
                rate = (k + 3 * math.sqrt(k) + 3) / max(spent - history_drawn[h], 1)
                need = (columns - cols.found) / rate
                if need > cap_draws - spent and exact is not None and exact.restricted:
                    retry = True
                    break
                if need > cap_draws - spent:
                    raise SamplerError(
                        f"skeleton '{skeleton.path}' produced only {cols.found} distinct columns in {spent} draws "
                        f"({_space_text(space)}): at its rate of new columns, -n {columns} would need more than "
                        f"{spent + need:.3g} draws, over the sampler's limit of {cap_draws}; ask for at most {cols.found}"
                    )
    if retry:
        if progress:
            progress(-int(cols.found))
        if audit is not None:
            del audit[:]
        return sample(skeleton, columns, seed, scheme=scheme, progress=progress, max_draws=max_draws, audit=audit,
                      threads=threads, _reach_all=True)
    q = max(drawn, 1)
    stats = {
        "mean_factors_per_draw": factors / q,
        "var_factors_per_draw": factors_sq / q - (factors / q) ** 2,
        "output_degree_histogram": np.trim_zeros(degree_hist, "b").tolist(),
    }
    if exact is None:
        return _build_featureset(skeleton, t, cols, counts, drawn, seed, scheme, stats)
    return _exact_featureset(skeleton, t, cols, counts, drawn, spent, seed, stats, exact)


def _exact_featureset(skeleton, t, cols, counts, drawn, spent, seed, stats, exact) -> FeatureSet:
    """Scheme ``exact``'s feature set: float column weights, the enumerated columns'
    exact weights plus the sampled part's ``p_high * count / q``.  The file's counts keep
    their meaning of draws (>= 1, adding up to ``draws``): an enumerated column counts one
    more than its sampled draws, so ``draws`` = sampled draws + enumerated columns."""
    e = exact.columns
    found = cols.found
    sampled = counts[:found].astype(np.float64)
    weight = exact.p_high * sampled / max(drawn, 1)
    weight[:e] += exact.weight
    counts = counts.copy()
    counts[:e] += 1
    stats.update(exact_degrees=exact.degrees, exact_columns=e, exact_of=exact.enumerable_columns,
                 exact_weight=float(exact.weight.sum()),
                 sampled_weight=exact.p_high, walked_draws=int(spent))
    fs = _build_featureset(skeleton, t, cols, counts, drawn + e, seed, "exact", stats)
    fs.column_weight = weight
    return fs


def _build_featureset(skeleton, t: _Tables, cols: _Columns, counts, q, seed, scheme, stats) -> FeatureSet:
    found, terms = cols.found, cols.terms
    lengths = cols.lengths[:found]
    node, code, power = cols.node[:terms], cols.code[:terms], cols.power[:terms]
    ptr = np.zeros(found + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    omega = np.concatenate(cols.omega) if cols.omega else np.zeros(0)
    ci = np.flatnonzero(t.continuous[node]) if omega.size else ()
    if len(ci):  # continuous terms' codes become offsets into the compacted omega table
        w = t.width[node[ci]]
        code[ci] = np.cumsum(w) - w
    return FeatureSet(
        skeleton=skeleton,
        scheme=scheme,
        seed=seed,
        draws=int(q),
        count=counts[:found],
        kind=cols.kind[:found],
        ptr=ptr,
        node=node,
        code=code,
        power=power,
        omega=omega,
        stats=stats,
    )


def sample_scheme(skeleton: Skeleton, columns: int, seed: int = 0, *, scheme: str = "rfs", rows=None,
                  options: dict | None = None, progress: Callable[[int], None] | None = None) -> FeatureSet:
    """``columns`` columns of any ``scheme`` for ``skeleton``, by its column kind
    (:func:`rfsgen.kinds.for_scheme`): the compositional walk (:func:`sample`), or the kind's
    own sampler (EOF's grid), given ``options`` (default: the kind's fit to ``rows``, a function
    returning the training rows, called only by kinds that fit to them: EOF's box)."""
    from .kinds import for_scheme

    kind = for_scheme(scheme)
    if kind.walked:
        return sample(skeleton, columns, seed, scheme=scheme, progress=progress)
    if options is None:
        options = kind.fit(skeleton, rows)
    return kind.sample(skeleton, columns, seed, scheme=scheme, **options)


def sample_file(skeleton_path, columns: int, seed: int, output, *, scheme="rfs", width=None, overwrite=False,
                progress=None, params=None, **options) -> FeatureSet:
    """Load a skeleton, sample, and write the feature file atomically (``rfsgen sample``).
    ``width`` binds a ``width: auto`` skeleton (see :meth:`Skeleton.bind`).  The scheme's
    column kind's own options (:attr:`~rfsgen.featureset.ColumnKind.options`; ``eof``:
    ``level``, ``domain_from`` and ``margin``, see :mod:`rfsgen.eof`) are keywords; given
    without its scheme, they choose it.
    ``params``: values for the skeleton's declared parameters (names to numbers or their text)."""
    from . import __version__
    from .features import save
    from .kinds import for_scheme, taking
    from .skeleton import load_skeleton

    skel = load_skeleton(skeleton_path, params=params)
    if width is not None:
        skel = skel.bind(width)
    sets = "".join(f" --set {k}={v}" for k, v in (params or {}).items())  # as typed, for the file's command
    kind = for_scheme(scheme)
    foreign = [k for k in options if k not in kind.options]
    if foreign and taking(foreign[0]) is not None:
        kind = taking(foreign[0])
        scheme = kind.schemes[0]
    if kind.walked:
        from .atomic import check_output

        if options:
            raise TypeError(f"sample_file() got an unexpected keyword argument {next(iter(options))!r}")

        check_output(output, overwrite, [skeleton_path])  # before the work and its warnings, not after them
        fs = sample(skel, columns, seed, scheme=scheme, progress=progress)
        size, more, inputs = f"-n {columns}", "", []
    else:
        fs, size, more, inputs = kind.sample_file(skel, columns, seed, scheme=scheme, **options)
    fs.tool_version = __version__
    fs.command = (f"rfsgen sample {skeleton_path} {size} --seed {seed} --scheme {scheme}"
                  + (f" --width {width}" if width is not None else "") + more + sets)
    save(fs, output, overwrite=overwrite, inputs=[skeleton_path] + inputs, progress=progress)
    return fs
