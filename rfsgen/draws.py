"""Draws of compositional paths, shared by the sampler and the exact enumeration.

The sampler (:mod:`rfsgen.sampler`) walks random paths down a skeleton; the exact
scheme's enumeration (:mod:`rfsgen.exact`) lists the columns of degree 0 and 1.  Both
hold their draws in a :class:`_Batch`, bring each feature to its canonical form
(:func:`_canonicalise`) and name it by its 128-bit key (:func:`_keys`,
:func:`_unique_keys`); both read the skeleton through its flat tables
(:class:`_Tables`, :func:`_tables`) and push weights from the output down
(:func:`_push_down`).  These pieces live here, below both modules, so that neither
imports the other's internals; :mod:`rfsgen.sampler` still offers every name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .features import term_keys
from .skeleton import InputNode, Skeleton

KIND_REAL, KIND_COS, KIND_SIN = 0, 1, 2


@dataclass
class _Tables:
    """Flat arrays describing the DAG for vectorised walks."""

    is_input: np.ndarray  # bool (N,)
    act_index: np.ndarray  # int (N,), -1 for inputs
    activations: list
    fanin: np.ndarray  # int64 (N,)
    child_ptr: np.ndarray  # int64 (N+1,)
    children: np.ndarray  # int64
    group_of: np.ndarray  # int (N,): input group index, -1 for internal nodes
    groups: list  # skeleton.input_groups
    continuous: np.ndarray  # bool (N,): input node with a continuous base
    width: np.ndarray  # int64 (N,): columns of an input node (0 for internal nodes)


def _tables(skel: Skeleton) -> _Tables:
    n = len(skel.nodes)
    is_input = np.zeros(n, dtype=bool)
    act_index = np.full(n, -1)
    acts: list = []
    fanin = np.zeros(n, dtype=np.int64)
    kids = []
    for node in skel.nodes:
        if isinstance(node, InputNode):
            is_input[node.id] = True
            kids.append(())
        else:
            key = next((i for i, a in enumerate(acts) if a is node.activation), None)
            if key is None:
                acts.append(node.activation)
                key = len(acts) - 1
            act_index[node.id] = key
            fanin[node.id] = len(node.children)
            kids.append(node.children)
    ptr = np.zeros(n + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(fanin)
    children = np.array([c for k in kids for c in k], dtype=np.int64)
    group_of = np.full(n, -1)
    for g, (_, ids, _) in enumerate(skel.input_groups):
        group_of[ids] = g
    continuous = np.array([isinstance(v, InputNode) and v.base.continuous for v in skel.nodes])
    width = np.array([v.base.width if isinstance(v, InputNode) else 0 for v in skel.nodes], dtype=np.int64)
    return _Tables(is_input, act_index, acts, fanin, ptr, children, group_of, skel.input_groups, continuous, width)


def _push_down(skel: Skeleton, t: _Tables, factor: np.ndarray) -> np.ndarray:
    """``value`` float64 ``(N,)``: 1 at the output, and every internal node adds
    ``value[v] * factor[v]`` to each of its children (once per child reference), from
    the output down.  Vectorised over the nodes of one skeleton entry (its layer),
    which never reference each other and whose children all come before them."""
    n = len(skel.nodes)
    value = np.zeros(n)
    value[skel.output] = 1.0
    index: dict = {}
    layer = np.array([index.setdefault(v.layer, len(index)) for v in skel.nodes], dtype=np.int64)
    internal = np.flatnonzero(~t.is_input)
    by_layer = internal[np.argsort(layer[internal], kind="stable")]
    cuts = np.flatnonzero(np.diff(layer[by_layer])) + 1
    groups = sorted(np.split(by_layer, cuts) if by_layer.size else [], key=lambda g: -int(g.max()))
    # Entries from elsewhere (a scheme's rewrite) may not follow the rule: node by node, then.
    order = [g for g in groups if not g.size or int(t.children[_edges(t, g)].max(initial=-1)) < int(g.min())]
    if len(order) < len(groups):
        order = [np.array([v]) for v in np.flatnonzero(~t.is_input)[::-1]]
    for g in order:
        src = value[g]
        live = src != 0.0
        if not live.any():
            continue
        g, src = g[live], src[live]
        f = factor[g]
        # An estimate may overflow to inf (heavy tails, deep stacks) and is then compared
        # with its limit as inf; a node that makes no children passes nothing down, not
        # inf * 0 = NaN (which no limit check would catch).
        with np.errstate(over="ignore", invalid="ignore"):
            share = np.where(f == 0.0, 0.0, src * f)
        edges = _edges(t, g)
        value += np.bincount(t.children[edges], weights=np.repeat(share, t.fanin[g]), minlength=n)
    return value


def _edges(t: _Tables, ids: np.ndarray) -> np.ndarray:
    """Positions in ``t.children`` of the child references of nodes ``ids`` (int64), in order."""
    counts = t.fanin[ids]
    starts = t.child_ptr[ids]
    total = int(counts.sum())
    return np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(total, dtype=np.int64)


@dataclass
class _Batch:
    kind: np.ndarray  # uint8 (n,)
    ptr: np.ndarray  # int64 (n+1,)
    node: np.ndarray  # int64 (T,)
    code: np.ndarray  # int64 (T,)
    power: np.ndarray  # int64 (T,)
    omega: np.ndarray  # float64 flat table; continuous terms' code is an offset into it
    continuous: np.ndarray  # bool (n,): draw has a continuous term (never merged)
    factors: np.ndarray  # float64 (n,): base factors drawn before combining
    degree: np.ndarray  # int64 (n,): degree drawn at the output node
    single: np.ndarray | None = None  # int64 (n,): node of a draw's only base factor, -1 otherwise (scheme exact)


def _canonicalise(skel, t, b: _Batch, phase):
    """Replace each integer feature by the smaller of itself and its conjugate; set kinds."""
    from ._compiled import canonical_forms, draw_kinds

    n = b.kind.size
    cont = b.continuous
    # Conjugate every term (continuous terms are left alone: those features never merge).
    cc, cp = b.code.copy(), b.power.copy()
    grp = t.group_of[b.node]
    for g, (base, _, _) in enumerate(t.groups):
        if base.continuous:
            continue
        sel = np.flatnonzero(grp == g)
        if sel.size:
            cc[sel], cp[sel] = base.conjugate(b.code[sel], b.power[sel])
    # A feature is real when it equals its conjugate; otherwise keep the smaller form,
    # comparing (code, power) at the first term where the two differ (nodes agree).
    code, power, real = np.empty_like(b.code), np.empty_like(b.power), np.empty(n, dtype=bool)
    canonical_forms(b.ptr, b.node, b.code, b.power, cc, cp, cont, code, power, real)
    b.code, b.power = code, power
    b.kind = np.empty(n, dtype=np.uint8)
    draw_kinds(phase, real, KIND_REAL, KIND_COS, KIND_SIN, b.kind)


def _keys(b: _Batch, first_draw: int) -> np.ndarray:
    return term_keys(b.kind, b.ptr, b.node, b.code, b.power, b.continuous, first_draw)


def _unique_keys(k1, k2):
    """The distinct 128-bit keys ``(k1, k2)`` of one block, numbered in order of first
    appearance: ``(inv, first, u1, u2)``, for each draw the number of its key, each key's
    first draw (increasing) and the keys.  The fast path is a hash table on the first
    64-bit half (:func:`rfsgen._compiled.distinct_keys`), which checks that second halves
    agree; on a collision it falls back to an exact 128-bit comparison."""
    from ._compiled import distinct_keys

    # (the two columns of _keys' (n, 2) array, read where they are: strided, not copied)
    first = np.empty(k1.size, dtype=np.int64)
    inv = np.empty(k1.size, dtype=np.int64)
    count = distinct_keys(k1, k2, first, inv)
    if count < 0:
        void = np.ascontiguousarray(np.stack([k1, k2], axis=1)).view(np.dtype((np.void, 16))).ravel()
        _, first, inv = np.unique(void, return_index=True, return_inverse=True)
        order = np.argsort(first)  # renumber np.unique's key order by first appearance
        rank = np.empty(order.size, dtype=np.int64)
        rank[order] = np.arange(order.size)
        first, inv = first[order], rank[inv.ravel()]
        count = first.size
    first = first[:count]
    return inv, first, k1[first], k2[first]
