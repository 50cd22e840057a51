"""The exact compositional kernel, by the recurrence of DESIGN.md section 1 (below the column
kinds: the compositional paths' kernel, :mod:`rfsgen.paths`; :mod:`rfsgen.kernel` re-exports it).

``k_u`` is the base kernel at input nodes; ``k_v = sigma_hat_v(mean_{u in in(v)} k_u)``
at internal nodes.  Nodes are evaluated level by level (a level holds the nodes
whose longest path down to an input has the same length); a level's mean is one
sparse-times-dense product, and a level's values are freed once every node that
reads them has been computed.  Rows of the first argument are processed in
blocks so memory stays under ``memory_bytes`` whatever the number of rows.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from . import budget
from .errors import count
from .inputs import check_finite
from .skeleton import Skeleton

DEFAULT_MEMORY = 512 * 2**20


def prepare_inputs(skeleton: Skeleton, x: np.ndarray, row0: int = 0, source: str = "<array>") -> list:
    """Validate rows and apply each input group's preparation.

    ``x`` is float ``(m, width)`` (float32 and float64 are read as they are, other
    dtypes converted).  Returns a list aligned with ``skeleton.input_groups`` of
    prepared float64 ``(m, G, base.width)`` arrays.  Raises
    :class:`~rfsgen.errors.DataError` naming the row/column/node for NaN/inf or
    out-of-domain values.
    """
    return prepare_groups(skeleton, checked_rows(skeleton, x, row0, source), row0, source)


def checked_rows(skeleton: Skeleton, x: np.ndarray, row0: int = 0, source: str = "<array>") -> np.ndarray:
    """:func:`prepare_inputs`'s checks of rows ``x``: C-contiguous float32 or float64
    ``(m, width)`` rows (other dtypes converted to float64), finite."""
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    if x.ndim != 2 or x.shape[1] != skeleton.width:
        from .inputs import width_error

        got = int(x.shape[1]) if x.ndim == 2 else x.shape
        origin = None if not skeleton.auto else f"binding it (Skeleton.bind({skeleton.width}))"
        raise width_error(source, got, skeleton.width, skeleton.path, origin=origin,
                          fix=f"pass rows of {skeleton.width} values, or bind the skeleton to {got}" if origin else None)
    from ._compiled import all_finite

    x = np.ascontiguousarray(x)
    if not all_finite(x):
        check_finite(x, row0, source)  # names the first bad value
    return x


def prepare_groups(skeleton: Skeleton, x: np.ndarray, row0: int = 0, source: str = "<array>", skip=()) -> list:
    """:func:`prepare_inputs` of rows already checked by :func:`checked_rows`; the groups in
    ``skip`` (whose preparation leaves the values alone) are not gathered: None there."""
    out = []
    for g, (base, ids, cols) in enumerate(skeleton.input_groups):
        if g in skip:
            out.append(None)
            continue
        labels = [skeleton.nodes[i].label for i in ids]
        out.append(base.prepare_columns(x, np.asarray(cols).reshape(ids.size, base.width), labels, row0, source))
    return out


class _Plan:
    """Levels of the DAG with their sparse averaging matrices (built once per skeleton)."""

    def __init__(self, skeleton: Skeleton):
        nodes = skeleton.nodes
        level = np.zeros(len(nodes), dtype=np.int64)
        for n in skeleton.internal_nodes:
            level[n.id] = 1 + level[list(n.children)].max()
        self.level = level
        self.nlevels = int(level.max()) + 1
        self.members = [np.flatnonzero(level == lv) for lv in range(self.nlevels)]
        self.index = np.zeros(len(nodes), dtype=np.int64)
        for ids in self.members:
            self.index[ids] = np.arange(ids.size)
        # last level that reads each level (for freeing)
        self.last_reader = np.zeros(self.nlevels, dtype=np.int64)
        self.mats = {}
        self.act_groups = {}
        for lv in range(1, self.nlevels):
            ids = self.members[lv]
            rows, cols, vals, src = [], [], [], []
            for r, i in enumerate(ids):
                kids = np.array(nodes[i].children)
                rows.append(np.full(kids.size, r))
                cols.append(self.index[kids])
                src.append(level[kids])
                vals.append(np.full(kids.size, 1.0 / kids.size))
            rows, cols, vals, src = map(np.concatenate, (rows, cols, vals, src))
            import scipy.sparse as sp  # here: rfsgen transform imports this module, never this class

            for l_src in np.unique(src):
                sel = src == l_src
                self.mats[lv, int(l_src)] = sp.csr_matrix(
                    (vals[sel], (rows[sel], cols[sel])), shape=(ids.size, self.members[l_src].size)
                )
                self.last_reader[l_src] = max(self.last_reader[l_src], lv)
            groups: dict = {}
            for r, i in enumerate(ids):
                groups.setdefault(id(nodes[i].activation), (nodes[i].activation, []))[1].append(r)
            self.act_groups[lv] = [(a, np.array(rs)) for a, rs in groups.values()]
        # input-level order: position of each input group's nodes in level 0
        self.input_pos = [self.index[ids] for _, ids, _ in skeleton.input_groups]
        self.out_level = int(level[skeleton.output])
        self.out_index = int(self.index[skeleton.output])


def kernel(
    skeleton: Skeleton,
    x: np.ndarray,
    y: np.ndarray | None = None,
    *,
    memory_bytes: int = DEFAULT_MEMORY,
    progress: Callable[[int], None] | None = None,
    x_source: str = "<array>",
    y_source: str = "<array>",
    copies: int = 0,
) -> np.ndarray:
    """Exact kernel matrix ``K[i, j] = k_S(x_i, y_j)``, float64 ``(m, n)``.

    ``x`` and ``y`` are ``(m, width)`` and ``(n, width)`` rows (``y`` defaults to
    ``x``): arrays, ``scipy.sparse`` matrices, DataFrames, lists of rows, or paths
    (anything :func:`rfsgen.inputs.open_input` takes).  A ``width: auto`` skeleton is
    bound to the rows' width.  ``progress(rows_done)`` is called after each block of ``x`` rows.
    Raises :class:`~rfsgen.errors.LimitError` before any work when the matrix, the prepared
    rows and one row's node values exceed the memory budget (:func:`check_memory`;
    ``copies`` more m x n matrices that the caller will make, e.g. to write it).
    """
    x = _rows(x)
    y = None if y is None else _rows(y)
    if not skeleton.bound:
        skeleton = skeleton.bind(x.shape[1])
    skeleton.check_walkable()
    same = y is None
    if np.asarray(x).shape[0] == 0 or (y is not None and np.asarray(y).shape[0] == 0):
        m, n = np.asarray(x).shape[0], np.asarray(x if y is None else y).shape[0]
        return np.zeros((m, n))
    m = np.asarray(x).shape[0]
    n = m if same else np.asarray(y).shape[0]
    plan = _Plan(skeleton)
    per_row, fixed = check_memory(skeleton, plan, m, n, same, copies)
    xp = prepare_inputs(skeleton, x, 0, x_source)
    yp = xp if same else prepare_inputs(skeleton, y, 0, y_source)
    # Blocks of rows as large as memory_bytes and the budget allow (the values of a row do
    # not depend on its block).
    block = int(max(1, min(m, min(memory_bytes, budget.limit() - fixed) // max(per_row, 1))))
    out = np.empty((m, n))
    for a in range(0, m, block):
        b = min(m, a + block)
        out[a:b] = _block(skeleton, plan, [g[a:b] for g in xp], yp)
        if progress:
            progress(b - a)
    if same:
        # Symmetrise away rounding differences so the Gram matrix is exactly symmetric.
        out = 0.5 * (out + out.T)
    return out


def check_memory(skeleton: Skeleton, plan: "_Plan", m: int, n: int, same: bool, copies: int = 0):
    """:func:`rfsgen.budget.check` the kernel of ``m`` x ``n`` rows before allocating:
    the float64 matrix (three at once when it is symmetrised, plus ``copies``), the
    prepared rows of each input group, and one row of node values (rho, delta and eps,
    an n-vector each, for the input level and two levels alive at once).  Returns
    ``(per_row, fixed)``: bytes per row of a block and bytes outside the blocks."""
    widest = max(ids.size for ids in plan.members)
    per_row = 24 * n * (len(skeleton.input_nodes) + 2 * widest + 1)
    prepared = 8 * (m + (0 if same else n)) * sum(ids.size * base.width for base, ids, _ in skeleton.input_groups)
    fixed = 8 * m * n * ((3 if same else 1) + copies) + prepared
    lv = int(np.argmax([ids.size for ids in plan.members]))
    label = skeleton.nodes[int(plan.members[lv][0])].layer
    budget.check(fixed + per_row, f"the kernel of skeleton '{skeleton.path}' on {m} x {n} rows (the {m} x {n} float64 "
                                  f"matrix, the prepared rows and the values of layer '{label}', "
                                  f"{count(widest, 'node')} of {count(n, 'value')} per row)",
                 "use fewer rows (--rows START:STOP)")
    return per_row, fixed


def _rows(obj) -> np.ndarray:
    """Rows as a 2-D array (the kernel needs them all at once)."""
    if isinstance(obj, np.ndarray) and obj.ndim == 2:
        return obj
    from .inputs import open_input

    with open_input(obj) as src:
        return src.read()


def _block(skeleton, plan, xp, yp):
    """One block of rows.  Every level carries rho, delta = 1 - rho and eps = 1 + rho,
    averaged over children and mapped through the activation (``dual``, ``gap`` and
    ``dual_and_lift``), so values near 1 (an input with itself) and near -1 (with its
    opposite) never lose their digits to 1 -+ rho; the result is 1 - delta where
    delta < 1/2, -1 + eps where eps < 1/2, rho elsewhere."""
    mb = xp[0].shape[0]
    n = yp[0].shape[0]
    values = {}
    level0 = [np.empty((plan.members[0].size, mb * n)) for _ in range(3)]
    for (base, _, _), pos, xg, yg in zip(skeleton.input_groups, plan.input_pos, xp, yp):
        for dst, part in zip(level0, base.gram(xg, yg)):
            dst[pos] = part.reshape(len(pos), mb * n)
    values[0] = tuple(level0)
    for lv in range(1, plan.nlevels):
        acc = None
        for (dst, src), mat in plan.mats.items():
            if dst != lv:
                continue
            part = tuple(mat @ v for v in values[src])
            acc = part if acc is None else tuple(a + b for a, b in zip(acc, part))
        rho, delta, eps = acc
        for act, rows in plan.act_groups[lv]:
            r, d, e = rho[rows], delta[rows], eps[rows]
            rho[rows], eps[rows] = act.dual_and_lift(r, e)
            delta[rows] = act.gap(r, d)
        values[lv] = (rho, delta, eps)
        for src in list(values):
            if src < lv and plan.last_reader[src] <= lv:
                del values[src]
    rho, delta, eps = (v[plan.out_index] for v in values[plan.out_level])
    return np.where(delta < 0.5, 1.0 - delta, np.where(eps < 0.5, eps - 1.0, rho)).reshape(mb, n)
