"""Compositional paths: the column kind of the ``rfs``, ``strat``, ``exact``, ``rr`` and ``orf``
schemes (and selected subsets of them), :class:`PathsKind`; its transform below.

A column is a product of base factors, one per path from the output node to an input node
(the terms of :class:`~rfsgen.featureset.FeatureSet`); the feature file's common datasets
hold them, so this kind adds no dataset of its own (format version 4; 1 and 2 still read).

The transform:

Every column is ``scale_j * Re(e^{i b_j} * prod_k z_k(x)^{p_k})``: a product of a few
*factors*, each an atom's complex value raised to an integer power.  An atom is an
input node with a code (a circle angle, a categorical frequency, a sphere pair or
coordinate, a binary value) or one gaussian/laplace frequency.  Per chunk of rows:

* the rows are validated and prepared; sphere atoms are linear in the prepared
  values and read from them directly, other bases compute their atoms' values
  row-major (gaussian and laplace angles by a fixed-order compiled sum, not BLAS);
* one compiled loop (:mod:`rfsgen._compiled`) takes tiles of 8 rows, raises the
  distinct (atom, power != 1) factors once, multiplies each column's factors in
  8-lane float64 vector operations, and stores ``scale * Re`` (or ``-Im`` for the
  b = pi/2 phase) in the output dtype;
* the rare columns whose factors could overflow (high powers of sphere factors, as
  ``step`` draws: heavy-tailed degree laws) skip that loop and are computed in the log
  domain instead, over blocks of rows: each atom's log-modulus and argument once per
  row, shared by every term that uses it.  Almost all of their values round to a signed
  zero, written without exp, sin or cos where the sign is certain (columns of real atoms
  take it from the parity of the negative atoms' odd powers, without their phases).

Apart from those columns, no cosine or logarithm is evaluated per output value.  The output is deterministic
from the feature file: identical whatever the chunk size or thread count,
byte-identical across runs.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from .bases import csr_phases, gathered_columns, gathered_phases
from .errors import DataError
from .featureset import FORMAT_VERSION, ColumnKind, FeatureSet, buffered_chunks
from .inputs import SparseRows, check_finite
from .recurrence import checked_rows, prepare_groups, prepare_inputs
from .skeleton import InputNode


@dataclass
class _GroupAtoms:
    group: int  # index into skeleton.input_groups
    gi: np.ndarray  # int64 (a,): node index within the group of each atom
    codes: np.ndarray  # int64 (a,) codes, or float64 (a, width) omega rows for continuous bases
    offset: int  # first column of this group's values in the source rows
    linear: bool  # source columns are the prepared values themselves (else [re | im])


def _frequencies(omega, offsets, width):
    """The ``(a, width)`` frequencies ``omega[offsets[k]:offsets[k] + width]``: a view of
    ``omega`` where they follow one another (as sampled: no copy of 25 MB at d = 784,
    D = 4096, on every transform) or sit a fixed step of at least ``width`` apart (the
    first of each of ``--scheme orf``'s pairs: a strided view), else a copy."""
    n = offsets.size
    if n and width and omega.ndim == 1 and offsets[0] >= 0:
        step = int(offsets[1] - offsets[0]) if n > 1 else width
        o = int(offsets[0])
        if step >= width and o + (n - 1) * step + width <= omega.size and np.all(np.diff(offsets) == step):
            if step == width:
                return omega[o:o + n * width].reshape(n, width)
            return np.lib.stride_tricks.as_strided(omega[o:], (n, width), (step * omega.itemsize, omega.itemsize),
                                                   writeable=False)
    return omega[offsets[:, None] + np.arange(width)[None, :]]


def _frequency_twins(omega, node, code, cont, group_of, skel) -> np.ndarray:
    """For each term (int64 ``(n,)``): the first term of the same node whose frequency row
    (``omega[code[t]:code[t] + width]``) has the same bits, itself where none does; -1 for
    terms of bases without frequencies.  Rows are hashed by their node and first four
    values' bits (random frequencies differ there), and only terms whose hash an earlier
    term shares are compared bit by bit, so a collision only leaves two atoms apart and a
    feature set without twins costs one sort of its terms."""
    twin = np.full(node.size, -1, np.int64)
    terms = np.flatnonzero(cont)
    if not terms.size:
        return twin
    groups = group_of[node[terms]]
    for g in np.unique(groups):
        t = terms[groups == g]
        width = skel.input_groups[int(g)][0].width
        rows = _frequencies(omega, code[t], width)
        if rows.dtype != np.float64:  # (a feature set made in memory: the float64 the angles take)
            rows = rows.astype(np.float64)
        h = node[t].astype(np.uint64)
        for k in range(min(width, 4)):  # (uint64 arithmetic wraps around)
            h = h * np.uint64(0x9E3779B97F4A7C15) + np.ascontiguousarray(rows[:, k]).view(np.uint64)
        order = np.argsort(h, kind="stable")  # equal hashes in term order: the first is the twin
        hs = h[order]
        start = np.ones(t.size, dtype=bool)
        start[1:] = hs[1:] != hs[:-1]
        cand = np.empty(t.size, np.int64)
        cand[order] = order[np.flatnonzero(start)[np.cumsum(start) - 1]]
        own = np.arange(t.size)
        maybe = np.flatnonzero(cand != own)
        per = max(1, 2**20 // max(width, 1))  # pairs compared at once: 16 MB of copies at most
        for lo in range(0, maybe.size, per):
            k = maybe[lo:lo + per]
            a, b = rows[k].view(np.uint64), rows[cand[k]].view(np.uint64)
            same = (node[t[k]] == node[t[cand[k]]]) & (a == b).all(axis=1)
            own[k[same]] = cand[k[same]]
        twin[t] = t[own]
    return twin


#: Whether a transformer may write plain random Fourier features' columns straight from the
#: angles (Transformer._plan_fused); False forces the product loop (tests compare the bytes).
FUSED = True

#: A GPU chunk is cut into at most GPU_PARTS row parts of at least GPU_PART_ROWS rows, each
#: run from its own thread on that thread's CUDA stream (Transformer._gpu_chunk), so that
#: one part's copies overlap another's kernels; the bytes are those of the whole chunk.
GPU_PARTS = 2
GPU_PART_ROWS = 256


class Transformer:
    """Evaluates a :class:`FeatureSet` of compositional paths on chunks of rows (the paths
    kind's transformer; :class:`rfsgen.transform.Transformer` makes the kind's own).

    Build once per feature set; :meth:`chunk` maps float ``(m, width)`` rows to
    a C-ordered ``(m, D)`` array of dtype ``dtype``.
    """

    def __init__(self, fs: FeatureSet, dtype=np.float32, device="cpu"):
        self.fs = fs
        self.dtype = np.dtype(dtype)
        #: where the gaussian and laplace atoms and the products into columns (with the
        #: activations' weights) are computed: cpu, or cuda (rfsgen._cuda; the same bits); the
        #: other atoms, the log-domain columns and the checks run on the CPU either way
        self.device = device
        skel = fs.walk_skeleton
        self.skeleton = skel
        # Factors of modulus below 1 (brownian, sphere) multiply into values that float32
        # can flush to zero (a brownian node over 200 columns: about 1e-67): such rows are
        # checked after each chunk (_check_underflow); modulus-1 bases never underflow.
        self._may_underflow = self.dtype.itemsize < 8 and any(
            n.base.name in ("brownian", "sphere") for n in skel.nodes if isinstance(n, InputNode))
        self._wide = None  # the float64 transformer that decides a suspect row, made on first use
        self._gpu_columns = None  # device == "cuda": the product loop's arrays on the GPU (rfsgen._cuda.ColumnsPlan)
        self._scratch = threading.local()  # each thread's source buffer for chunk() (_source_buffer)
        n_nodes = len(skel.nodes)
        cont = np.array([isinstance(n, InputNode) and n.base.continuous for n in skel.nodes])
        group_of = np.full(n_nodes, -1)
        index_in_group = np.zeros(n_nodes, dtype=np.int64)
        for g, (_, ids, _) in enumerate(skel.input_groups):
            group_of[ids] = g
            index_in_group[ids] = np.arange(ids.size)
        node, code = fs.node.astype(np.int64), fs.code.astype(np.int64)
        n_terms = node.size
        is_cont = cont[node] if n_terms else np.zeros(0, dtype=bool)
        # Integer terms share atoms (node, code); continuous terms are atoms of their own,
        # unless their frequencies are the same bits at the same node (the [cos, sin] pairs
        # of --scheme orf): one angle, and its cos and sin, then serve both columns.
        # Sorting by group first makes each group's atoms one block.
        twin = _frequency_twins(fs.omega, node, code, is_cont, group_of, skel)
        keys = np.stack([group_of[node], node, np.where(is_cont, 0, code), np.where(is_cont, twin, -1)])
        uniq, first, term_atom = _unique_columns(keys)
        n_atoms = uniq.shape[1]
        a_node, a_code = node[first], code[first]
        # How the compiled loop reads atom k from a chunk's source rows (see
        # rfsgen._compiled.columns): linear bases point into the prepared values,
        # the others into [re | im] blocks the base computes per chunk.
        ir, ii = np.zeros(n_atoms, np.int64), np.full(n_atoms, -1, np.int64)
        cr, ci = np.ones(n_atoms), np.zeros(n_atoms)
        # each atom's unit vector (the first source column of its node's prepared values,
        # for bases whose nodes' values are unit vectors), else -1: _plan_huge's joint bound
        self._unit = np.full(n_atoms, -1, np.int64)
        self.groups: list[_GroupAtoms] = []
        width = 0
        for g, (base, ids, _) in enumerate(skel.input_groups):
            sel = np.flatnonzero(uniq[0] == g)
            if not sel.size:
                continue
            gi = index_in_group[a_node[sel]]
            codes = _frequencies(fs.omega, a_code[sel], base.width) if base.continuous else a_code[sel]
            lin = base.linear(gi, codes) if not base.continuous else None
            if lin is not None:
                ir[sel], cr[sel], ii[sel], ci[sel] = lin[0] + width, lin[1], np.where(lin[2] >= 0, lin[2] + width, -1), lin[3]
                if base.kind.unit_rows:
                    self._unit[sel] = width + gi * base.width
                self.groups.append(_GroupAtoms(g, gi, codes, width, True))
                width += ids.size * base.width
            else:
                ir[sel] = width + np.arange(sel.size)
                ii[sel] = width + sel.size + np.arange(sel.size)
                ci[sel] = 1.0
                self.groups.append(_GroupAtoms(g, gi, codes, width, False))
                width += 2 * sel.size
        self.source_width = width
        # Groups whose atoms read CSR rows without densifying them (:meth:`_source_sparse`):
        # gaussian and laplace nodes (angles w.x) whose preparation leaves the values alone.
        self._csr_groups = {ga.group for ga in self.groups if not ga.linear
                            and skel.input_groups[ga.group][0].continuous
                            and not dict(skel.input_groups[ga.group][0].params).get("normalize_blocks", 0)}
        #: groups that dense rows reach as float32 in one gather (:meth:`source`); the CPU only
        self._direct = frozenset(self._csr_groups) if device == "cpu" else frozenset()
        self._cols = {}  # group -> its columns, int64, flattened
        #: chunks may come as rfsgen.inputs.SparseRows (rfsgen.inputs.chunks_for); the CPU only
        self.reads_sparse = bool(self._csr_groups) and device == "cpu"
        self._inverse = {}  # group -> where each input column sits in the group's values
        self.ir, self.cr, self.ii, self.ci = ir, cr, ii, ci
        power = fs.power.astype(np.int64)
        imag = fs.kind == 2  # cos(theta + pi/2) = -Im
        self.term_atom = term_atom  # the atom of each term of fs (int64)
        self._plan_huge(fs, term_atom, power, imag)
        # Columns computed in the log domain are left out of the product loop (it
        # writes their scale, which the log-domain loop overwrites): their factors'
        # powers run into the millions and were raised per 8-row tile for nothing.
        counts = np.diff(fs.ptr.astype(np.int64))
        in_loop = np.ones(n_terms, dtype=bool)
        if self.huge.size:
            in_loop[np.repeat(np.isin(np.arange(fs.columns), self.huge), counts)] = False
            counts = counts.copy()
            counts[self.huge] = 0
        # Distinct (atom, power != 1) pairs become extra factors, raised once per tile.
        factor = term_atom.copy()
        odd = (power != 1) & in_loop
        if odd.any():
            pairs, _, inverse = _unique_columns(np.stack([term_atom[odd].astype(np.int64), power[odd]]))
            factor[odd] = n_atoms + inverse
            self.xatom, self.xpow = pairs[0].copy(), pairs[1].copy()
        else:
            self.xatom, self.xpow = np.zeros(0, np.int64), np.zeros(0, np.int64)
        # Columns in order of their number of factors (stable): the loop's branches
        # then follow long runs.  pos[j] is where column j sits in that order.
        order = np.argsort(np.minimum(counts, 3), kind="stable")
        self.pos = np.empty(order.size, np.int64)
        self.pos[order] = np.arange(order.size)
        self.fptr = np.zeros(order.size + 1, np.int64)
        np.cumsum(counts[order], out=self.fptr[1:])
        starts = fs.ptr[:-1].astype(np.int64)[order]
        self.fidx = factor[np.repeat(starts - self.fptr[:-1], counts[order]) + np.arange(self.fptr[-1])]
        self.imag = np.ascontiguousarray(imag[order])
        # Columns whose factors are all real (atoms without an imaginary part, and their
        # powers) and that take the real part: a multiply a factor (rfsgen._compiled.columns)
        real_term = ii[term_atom] < 0 if n_terms else np.zeros(0, dtype=bool)
        col_of_term = np.repeat(np.arange(fs.columns), np.diff(fs.ptr.astype(np.int64)))
        all_real = np.bincount(col_of_term, real_term, fs.columns) == np.diff(fs.ptr.astype(np.int64))
        self.real = np.ascontiguousarray((all_real & ~imag)[order])
        self.sc = np.where(imag, -1.0, 1.0)[order] * fs.scale.astype(np.float64)[order]
        self._plan_fused(fs, term_atom, power, n_atoms)
        self._plan_phase_products()

    def _plan_fused(self, fs, term_atom, power, n_atoms):
        """Whether :meth:`chunk` may write the columns straight from the angles
        (:func:`rfsgen.bases.fused_values`): every column is one factor, power 1, of an atom
        of a single gaussian or laplace group (a plain random Fourier features skeleton),
        each atom in one or two columns (``--scheme orf``'s [cos, sin] pairs), on the CPU,
        float32 or float64 output.  Such a column's value in the product loop is ``sc *
        (1.0 * cos)`` or ``sc * (1.0 * sin)`` (rfsgen._vector.product with no further factor;
        ``cr = ci = 1`` for these atoms), which the fused loop reproduces bit for bit.
        ``fused_col``, ``fused_sc``, ``fused_imag``: each atom's (first) column, scale and
        part; ``fused_second``: the same for its second column (-1: none), or None.
        :data:`FUSED` False (or :attr:`fused` set False) forces the product loop (tests)."""
        self.fused = False
        D = fs.columns
        if not FUSED:
            return
        counts = np.diff(fs.ptr.astype(np.int64))
        if (self.device != "cpu" or self.dtype not in (np.float32, np.float64) or len(self.groups) != 1 or self.groups[0].linear
                or self.huge.size
                or not self.skeleton.input_groups[self.groups[0].group][0].continuous
                or term_atom.size != D or not D or np.any(counts != 1) or np.any(power != 1)):
            return
        uses = np.bincount(term_atom, minlength=n_atoms)
        if np.any(uses < 1) or np.any(uses > 2) or np.any(self.cr != 1.0) or np.any(self.ci != 1.0):
            return
        # one term a column: term j is column j's; an atom's first column is its smallest
        col = np.full(n_atoms, -1, np.int64)
        col[term_atom[::-1]] = np.arange(D)[::-1]
        col2 = np.full(n_atoms, -1, np.int64)
        later = np.flatnonzero(col[term_atom] != np.arange(D))
        col2[term_atom[later]] = later
        p = self.pos[col]
        self.fused_col = col
        self.fused_sc, self.fused_imag = np.ascontiguousarray(self.sc[p]), np.ascontiguousarray(self.imag[p])
        self.fused_second = None
        if later.size:
            p2 = self.pos[np.maximum(col2, 0)]
            self.fused_second = (col2, np.where(col2 >= 0, self.sc[p2], 0.0), np.ascontiguousarray(self.imag[p2]))
        self.fused = True

    def _plan_phase_products(self):
        """Whether :meth:`chunk` may run the angles and the product loop in one pass over
        each tile of rows (:func:`rfsgen.bases.gathered_columns`), so that the atoms' float64
        cos and sin never reach memory: the atoms are one gaussian or laplace group's whose
        preparation leaves the values alone (read in place from the rows), each atom k's cos
        at source column k and sin at ``a + k`` with factors ``cr = ci = 1`` (the group's
        atoms in node order), no log-domain columns, on the CPU, and not a plain random
        Fourier features skeleton (:meth:`_plan_fused` writes those straight from the
        angles).  :data:`FUSED` False forces the two passes (tests)."""
        self.phase_products = False
        if not FUSED or self.fused or self.device != "cpu" or len(self.groups) != 1 or self.huge.size:
            return
        ga = self.groups[0]
        a = ga.gi.size
        if ga.linear or ga.group not in self._direct or ga.offset != 0 or self.ir.size != a:
            return
        k = np.arange(a)
        if np.array_equal(self.ir, k) and np.array_equal(self.ii, a + k) and np.all(self.cr == 1.0) \
                and np.all(self.ci == 1.0):
            self.phase_products = True

    def _plan_huge(self, fs, term_atom, power, imag):
        """Find the columns whose values could overflow.

        Every atom is bounded: sphere factors by max(|cr|, |ci|) (the prepared values
        form a unit vector), all others by 1.  So a column is bounded by
        ``|scale| * prod bound_k^|p_k|``; columns whose bound stays below 1e300 are
        computed by the product loop without any overflow (a product of factors
        that underflows gives 0, never 0 * inf).  The rare columns above it (high
        powers, e.g. step over a sphere ``coordinate`` node) are computed in the log
        domain instead (and left out of the product loop).  Columns whose bound
        exceeds the output dtype's range are checked for inf after each chunk.
        """
        log_bound = np.log(np.maximum(np.maximum(np.abs(self.cr), np.abs(self.ci)), 1.0))
        log_bound[self.ii < 0] = np.log(np.maximum(np.abs(self.cr[self.ii < 0]), 1.0))
        col = np.repeat(np.arange(fs.columns), np.diff(fs.ptr.astype(np.int64)))
        per_term = np.abs(power).astype(np.float64) * log_bound[term_atom] if term_atom.size else np.zeros(0)
        bound = np.log(np.maximum(fs.scale.astype(np.float64), 1e-300)) + np.bincount(col, per_term, fs.columns)
        limit = math.log(np.finfo(self.dtype).max) - 1.0
        self.checked = np.flatnonzero(bound > limit)  # original column indices
        if self.checked.size:
            self.checked = self.checked[self._joint_bound(fs, term_atom, power, self.checked) > limit]
        self.log_domain(fs, np.flatnonzero(bound > math.log(1e300)), term_atom, power, imag)

    def _joint_bound(self, fs, term_atom, power, cols) -> np.ndarray:
        """A log bound (float64) on the modulus of columns ``cols`` (int64, ascending), tighter
        than :meth:`_plan_huge`'s, which bounds each factor alone: the factors a column takes
        from one unit vector u (a sphere node's prepared values) are bounded together.
        Factor k is ``cr u_a + i ci u_b`` (``ci = 0``: real), so ``|z_k| <= c_k s_k`` with
        ``c_k = max(|cr|, |ci|)`` and ``s_k^2 = u_a^2 (+ u_b^2)``; with each coordinate in at
        most ``n`` of the column's factors on u, ``sum_k s_k^2 <= n``, and then ``prod_k
        s_k^p_k <= prod_k (n p_k / P)^(p_k / 2)`` (``P = sum_k p_k``, equality at ``s_k^2 =
        n p_k / P``), where taking ``s_k <= 1`` alone gave ``prod_k c_k^p_k``.  Other
        factors keep their bound.  Only the overflow check uses it (which columns are
        checked for inf after each chunk), never how a value is computed."""
        ptr = fs.ptr.astype(np.int64)
        lengths = np.diff(ptr)[cols]
        col = np.repeat(np.arange(cols.size), lengths)
        t = np.repeat(ptr[cols], lengths) + (np.arange(col.size) - np.repeat(np.cumsum(lengths) - lengths, lengths))
        a = term_atom[t]
        p = np.abs(power[t]).astype(np.float64)
        unit = self._unit[a]
        c = np.maximum(np.abs(self.cr[a]), np.where(self.ii[a] >= 0, np.abs(self.ci[a]), 0.0))
        alone = np.log(np.maximum(c, 1.0))
        joint = np.log(np.maximum(c, 1e-300))
        on = unit >= 0
        if on.any():
            # (column, unit vector) sets of factors; each coordinate's count of factors in its set
            key = col[on] * (int(self._unit.max()) + 1) + unit[on]
            sets, set_of = np.unique(key, return_inverse=True)
            total = np.bincount(set_of, p[on], sets.size)
            coords = np.concatenate([np.stack([set_of, self.ir[a[on]]]), np.stack([set_of, self.ii[a[on]]])], axis=1)
            coords = coords[:, coords[1] >= 0]
            uniq, inv = np.unique(coords[0] * (self.source_width + 1) + coords[1], return_inverse=True)
            per_coord = np.bincount(inv.ravel(), minlength=uniq.size)
            n = np.zeros(sets.size, np.int64)
            np.maximum.at(n, uniq // (self.source_width + 1), per_coord)
            share = np.log(np.where(p[on] > 0, n[set_of] * p[on] / np.maximum(total[set_of], 1e-300), 1.0))
            alone[on] = joint[on] + 0.5 * share
        per_term = p * alone
        return np.log(np.maximum(fs.scale.astype(np.float64)[cols], 1e-300)) + np.bincount(col, per_term, cols.size)

    def log_domain(self, fs, huge, term_atom, power, imag):
        """Compute columns ``huge`` (int64, original indices, ascending) in the log domain
        (:func:`rfsgen._compiled.log_domain_columns`): their terms, and the atoms they use
        listed once (``huge_uatom``; ``huge_local`` points each term at its entry)."""
        ptr = fs.ptr.astype(np.int64)
        lengths = np.diff(ptr)[huge]
        self.huge = huge
        self.huge_ptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        take = np.repeat(ptr[huge] - self.huge_ptr[:-1], lengths) + np.arange(self.huge_ptr[-1])
        self.huge_uatom, local = np.unique(term_atom[take].astype(np.int64), return_inverse=True)
        self.huge_local = local.ravel().astype(np.int64)
        self.huge_power = power[take].astype(np.float64)
        self.huge_log_sc = np.log(fs.scale.astype(np.float64)[huge])
        self.huge_sign = np.where(imag[huge], -1.0, 1.0)
        self.huge_imag = np.ascontiguousarray(imag[huge])
        # columns of real atoms whose values' signs need no phase sums (log_domain_columns)
        self.huge_odd, self.huge_easy = easy_columns(self.ii, self.huge_uatom, self.huge_ptr, self.huge_local,
                                                     self.huge_power, self.huge_imag)

    @property
    def columns(self) -> int:
        return self.fs.columns

    @property
    def row_bytes(self) -> int:
        """Bytes one row of a chunk holds at most at once: the row read and converted
        (float64), its prepared input groups (float64; float32 where gathered straight into
        float32, :meth:`source`), its atoms (:meth:`source`) and its output values in two
        reused buffers plus a copy (sparse parts or the written block); on ``cuda``, also the
        host's page-locked copies (:mod:`rfsgen._cuda`)."""
        skel = self.skeleton
        prepared = sum(ids.size * base.width for base, ids, _ in skel.input_groups)
        host = 8 * (2 * skel.width + prepared + self.source_width) + 3 * self.dtype.itemsize * self.columns
        if self.device == "cuda":  # rfsgen._cuda's page-locked buffers: float32 rows, atoms, source values, output
            host += 4 * skel.width + 16 * self.source_width + self.dtype.itemsize * self.columns
        return host

    def sparse_row_bytes(self, stored: float) -> int:
        """:attr:`row_bytes` of a CSR row holding ``stored`` values (:meth:`_source_sparse`):
        the stored values and their positions, the densified columns of the groups that are
        not read as CSR, the atoms and the output values; no dense row."""
        skel = self.skeleton
        dense = sum(ids.size * base.width for g, (base, ids, _) in enumerate(skel.input_groups)
                    if g not in self._csr_groups)
        return int(32 * stored) + 8 * (2 * dense + self.source_width) + 3 * self.dtype.itemsize * self.columns

    @property
    def what(self) -> str:
        return f"the transform by '{self.fs.skeleton.path}' features ({self.columns} columns)"

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_scratch"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._scratch = threading.local()

    def _source_buffer(self, m: int, scratch: bool) -> np.ndarray:
        """A float64 ``(m, source_width)`` array for :meth:`source`: with ``scratch``, rows of
        this thread's buffer, kept from one chunk to the next (a fresh array of tens of MB
        per chunk cost about as much in page faults as the chunk's angles), else new."""
        if not scratch:
            return np.empty((m, self.source_width))
        buf = getattr(self._scratch, "src", None)
        if buf is None or buf.shape[0] < m:
            buf = self._scratch.src = np.empty((m, self.source_width))
        return buf[:m]

    def source(self, x: np.ndarray, row0: int = 0, source: str = "<array>", scratch: bool = False) -> np.ndarray:
        """Validated, prepared rows as the compiled loop reads them: float64 ``(m, s)``.
        ``x`` may be :class:`rfsgen.inputs.SparseRows` (the same bits as its dense rows).
        ``scratch``: in this thread's buffer, which the next such call overwrites
        (:meth:`chunk`)."""
        if isinstance(x, SparseRows):
            src = self._source_sparse(x, row0, source, scratch) if self.reads_sparse else None
            if src is not None:
                return src
            x = x.toarray()
        x = checked_rows(self.skeleton, x, row0, source)
        # Gaussian and laplace groups (their preparation leaves the values alone) are
        # gathered straight into the angle loop's float32 rows (bases.gathered_phases).
        direct = self._direct
        xp = prepare_groups(self.skeleton, x, row0, source, skip=direct)
        return self._source_of(xp, x.shape[0], row0, source, scratch, x=x, direct=direct)

    def _source_of(self, xp, m: int, row0: int, source: str, scratch: bool, x=None, direct=frozenset()):
        """:meth:`source` of the prepared groups ``xp`` of ``m`` rows; the groups in ``direct``
        (absent from ``xp``) are gathered from the checked rows ``x`` straight into float32."""
        if len(self.groups) == 1 and self.groups[0].linear:
            return np.ascontiguousarray(xp[self.groups[0].group].reshape(m, -1))
        src = self._source_buffer(m, scratch)
        for ga in self.groups:
            base = self.skeleton.input_groups[ga.group][0]
            if ga.group in direct:
                a = ga.gi.size
                labels = [self.skeleton.nodes[i].label for i in self.skeleton.input_groups[ga.group][1]]
                cols, ucols = self._flat_cols(ga.group)
                gathered_phases(base, x, cols, ga.gi, ga.codes,
                                (src[:, ga.offset:ga.offset + a], src[:, ga.offset + a:ga.offset + 2 * a]),
                                where=(row0, source, labels), buf=self._gather_buffer(m * cols.size, scratch), ucols=ucols)
            elif ga.linear:
                flat = xp[ga.group].reshape(m, -1)
                src[:, ga.offset:ga.offset + flat.shape[1]] = flat
            else:
                a = ga.gi.size
                labels = [self.skeleton.nodes[i].label for i in self.skeleton.input_groups[ga.group][1]]
                base.values(xp[ga.group], ga.gi, ga.codes,
                            out=(src[:, ga.offset:ga.offset + a], src[:, ga.offset + a:ga.offset + 2 * a]),
                            where=(row0, source, labels), device=self.device)
        return src

    def _columns_plan(self):
        """The product loop's static arrays for the GPU (:class:`rfsgen._cuda.ColumnsPlan`),
        made on first use and kept with the transformer."""
        if self._gpu_columns is None:
            from . import _cuda

            self._gpu_columns = _cuda.ColumnsPlan(self.ir, self.cr, self.ii, self.ci, self.xatom, self.xpow,
                                                  self.fidx, self.fptr, self.sc, self.imag, self.pos)
        return self._gpu_columns

    def _gpu_chunk(self, xp, m: int, row0: int, source: str, out) -> bool:
        """:meth:`_gpu_resident` over the chunk cut into row parts (:data:`GPU_PARTS`), run on
        the pool's threads, each with its own stream and buffers: while one part's rows go
        over or its output comes back, another part's kernels run.  False when any part
        needs the host's path; the caller then computes the whole chunk there (the parts
        already written are overwritten with the same bits)."""
        from ._compiled import run_parts

        parts = max(1, min(GPU_PARTS, m // max(GPU_PART_ROWS, 1)))
        if parts == 1:
            return self._gpu_resident(xp, m, row0, source, out)
        self._columns_plan()  # made once here, not raced for by the parts
        cuts = [m * k // parts for k in range(parts + 1)]
        declined = []
        run_parts(self._gpu_part, cuts, xp, row0, source, out, declined)
        return not declined

    def _gpu_part(self, xp, row0: int, source: str, out, declined: list, a: int, b: int) -> None:
        """Rows ``a:b`` of a chunk for :meth:`_gpu_chunk`; appends to ``declined`` where the
        part needs the host's path."""
        if not self._gpu_resident([g[a:b] for g in xp], b - a, row0 + a, source, out[a:b]):
            declined.append(a)

    def _gpu_resident(self, xp, m: int, row0: int, source: str, out) -> bool:
        """``out`` for the prepared groups ``xp`` computed by :func:`rfsgen._cuda.columns_resident`
        (the gaussian and laplace groups' atoms on the GPU, the other groups' values from the
        host), or False where a part needs the host's path (:func:`rfsgen.bases.gpu_phases_job`;
        an angle beyond the fast range): the caller then runs it, the same bits either way."""
        from . import _cuda
        from .bases import gpu_phases_job

        host = self._source_buffer(m, True)
        jobs = []
        for ga in self.groups:
            base = self.skeleton.input_groups[ga.group][0]
            a = ga.gi.size
            if ga.linear:
                flat = xp[ga.group].reshape(m, -1)
                host[:, ga.offset:ga.offset + flat.shape[1]] = flat
            elif base.continuous:
                job = gpu_phases_job(base, xp[ga.group], ga.gi, ga.codes)
                if job is None:
                    return False
                jobs.append((ga.offset, *job))
            else:
                labels = [self.skeleton.nodes[i].label for i in self.skeleton.input_groups[ga.group][1]]
                base.values(xp[ga.group], ga.gi, ga.codes,
                            out=(host[:, ga.offset:ga.offset + a], host[:, ga.offset + a:ga.offset + 2 * a]),
                            where=(row0, source, labels))
        return _cuda.columns_resident(host, jobs, self._columns_plan(), out)

    def _flat_cols(self, g: int):
        """Input group ``g``'s columns, int64 ``(G * width,)``, and their distinct values."""
        got = self._cols.get(g)
        if got is None:
            cols = np.ascontiguousarray(self.skeleton.input_groups[g][2], dtype=np.int64).reshape(-1)
            got = self._cols[g] = cols, np.unique(cols)
        return got

    def _gather_buffer(self, n: int, scratch: bool):
        """A float32 array of at least ``n`` values for the rows that :meth:`source` gathers
        straight into float32: with ``scratch``, this thread's, kept from one chunk to the next
        (as :meth:`_source_buffer`), else None (a new one)."""
        if not scratch:
            return None
        buf = getattr(self._scratch, "x32", None)
        if buf is None or buf.size < n:
            buf = self._scratch.x32 = np.empty(n, np.float32)
        return buf

    def _group_entries(self, g: int, x):
        """The stored values of CSR rows ``x`` that fall in input group ``g``, as CSR rows
        over the group's flattened ``(G, width)`` values: ``(ptr, pos, take)`` with
        ``pos`` sorted and unique within each row and ``x.data[take]`` the values (an input
        column read by several nodes, as overlapping patches are, appears once per node)."""
        inv = self._inverse.get(g)
        if inv is None:
            flat = np.asarray(self.skeleton.input_groups[g][2], dtype=np.int64).reshape(-1)
            width = self.skeleton.width
            if flat.size == width and np.array_equal(flat, np.arange(width)):
                inv = None, None, True, True
            else:
                order = np.argsort(flat, kind="stable")
                ptr = np.zeros(width + 1, np.int64)
                np.cumsum(np.bincount(flat, minlength=width), out=ptr[1:])
                inv = ptr, order, False, bool(np.all(np.diff(flat) > 0))
            self._inverse[g] = inv
        iptr, ipos, identity, monotone = inv
        if identity:
            return x.indptr, x.indices, None
        ind = x.indices
        cnt = iptr[ind + 1] - iptr[ind]
        total = int(cnt.sum())
        q = np.repeat(np.arange(ind.size), cnt)
        pos = ipos[np.repeat(iptr[ind] - (np.cumsum(cnt) - cnt), cnt) + np.arange(total)]
        row = np.repeat(np.arange(x.shape[0]), np.diff(x.indptr))[q]
        if not monotone:
            order = np.lexsort((pos, row))
            pos, q, row = pos[order], q[order], row[order]
        ptr = np.zeros(x.shape[0] + 1, np.int64)
        np.cumsum(np.bincount(row, minlength=x.shape[0]), out=ptr[1:])
        return ptr, pos, q

    def _source_sparse(self, x, row0: int, source: str, scratch: bool = False):
        """:meth:`source` of CSR rows without densifying the gaussian and laplace groups'
        values; the other groups' values (a few columns, or rows that a sphere node
        normalises as a whole) are densified and prepared as today.  None where the dense
        path must run (:func:`rfsgen.bases.csr_phases`)."""
        skel = self.skeleton
        m = x.shape[0]
        if x.shape[1] != skel.width:
            return None  # the dense path's width error
        if x.data.dtype.kind == "f":
            bad = np.flatnonzero(~np.isfinite(x.data))
            if bad.size:  # the first by row, then column: the dense check's message, from that row
                r = int(np.searchsorted(x.indptr, int(bad[0]), "right")) - 1
                check_finite(x.toarray([r]), row0 + r, source)
        prepared = {}
        for g, (base, ids, cols) in enumerate(skel.input_groups):
            if g in self._csr_groups:
                continue
            labels = [skel.nodes[i].label for i in ids]
            ptr, pos, take = self._group_entries(g, x)
            gathered = np.zeros((m, ids.size * base.width))
            vals = x.data if take is None else x.data[take]
            gathered[np.repeat(np.arange(m), np.diff(ptr)), pos] = vals
            prepared[g] = base.prepare(gathered.reshape(m, ids.size, base.width), labels, row0, source,
                                       overwrite=True)
        src = self._source_buffer(m, scratch)
        for ga in self.groups:
            base = skel.input_groups[ga.group][0]
            a = ga.gi.size
            re, im = src[:, ga.offset:ga.offset + a], src[:, ga.offset + a:ga.offset + 2 * a]
            if ga.group in self._csr_groups:
                ptr, pos, take = self._group_entries(ga.group, x)
                vals = x.data if take is None else x.data[take]
                if not csr_phases(base, ptr, pos, vals, ga.gi, ga.codes, (re, im)):
                    return None
            elif ga.linear:
                flat = prepared[ga.group].reshape(m, -1)
                src[:, ga.offset:ga.offset + flat.shape[1]] = flat
            else:
                labels = [skel.nodes[i].label for i in skel.input_groups[ga.group][1]]
                base.values(prepared[ga.group], ga.gi, ga.codes, out=(re, im), where=(row0, source, labels),
                            device=self.device)
        return src

    def chunk(self, x: np.ndarray, row0: int = 0, source: str = "<array>", out: np.ndarray | None = None) -> np.ndarray:
        """Feature values for rows ``x`` (float ``(m, width)``) as ``(m, D)`` of ``self.dtype``.

        ``out``, if given, is a C-contiguous ``(m, D)`` array of ``self.dtype`` to fill
        (reusing one buffer saves the page faults of a fresh 10-100 MB array per chunk).
        """
        from ._compiled import columns

        m = x.shape[0]
        if out is None:
            out = np.empty((m, self.columns), dtype=self.dtype)
        elif out.shape != (m, self.columns) or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous ({m}, {self.columns}) {self.dtype} array")
        if getattr(self, "fused", False) and m and not isinstance(x, SparseRows):
            # a plain random Fourier features skeleton: the columns straight from the angles
            # where the dense loop applies (rfsgen.bases.fused_gathered from the rows' own
            # columns, fused_values from a prepared group), else the rows' source
            from .bases import fused_gathered, fused_values

            ga = self.groups[0]
            base = self.skeleton.input_groups[ga.group][0]
            fused = (self.fused_col, self.fused_sc, self.fused_imag, out, self.fused_second)
            if ga.group in self._direct:
                x = checked_rows(self.skeleton, x, row0, source)
                cols, ucols = self._flat_cols(ga.group)
                if fused_gathered(base, x, cols, ga.gi, ga.codes, *fused, ucols=ucols,
                                  buf=self._gather_buffer(m * cols.size, True)):
                    src = None
                else:
                    src = self.source(x, row0, source, scratch=True)
            else:
                xp = prepare_inputs(self.skeleton, x, row0, source)
                src = None if fused_values(base, xp[ga.group], ga.gi, ga.codes, *fused) else \
                    self._source_of(xp, m, row0, source, True)
        elif getattr(self, "phase_products", False) and m and self.columns and not isinstance(x, SparseRows):
            # one gaussian or laplace group: the angles and the products in one pass over each
            # tile of rows where the dense loop applies (rfsgen.bases.gathered_columns)
            x = checked_rows(self.skeleton, x, row0, source)
            ga = self.groups[0]
            cols, ucols = self._flat_cols(ga.group)
            static = (self.xatom, self.xpow, self.fidx, self.fptr, self.sc, self.imag, self.pos, self.real)
            if gathered_columns(self.skeleton.input_groups[ga.group][0], x, cols, ga.gi, ga.codes, static, out,
                                ucols=ucols, buf=self._gather_buffer(x.size, True)):
                src = None
            else:
                src = self.source(x, row0, source, scratch=True)
        elif self.device == "cuda" and m and self.columns and not self.huge.size and not isinstance(x, SparseRows):
            # the GPU: atoms computed and multiplied into columns there, without a round
            # trip of the atoms through the host, where no part needs the host's path
            xp = prepare_inputs(self.skeleton, x, row0, source)
            src = None if self._gpu_chunk(xp, m, row0, source, out) else self._source_of(xp, m, row0, source, True)
        else:
            src = self.source(x, row0, source, scratch=True)
        if m and self.columns:
            if src is not None:  # (None: written by fused_gathered, fused_values, gathered_columns or _gpu_resident)
                static = (self.ir, self.cr, self.ii, self.ci, self.xatom, self.xpow, self.fidx, self.fptr, self.sc,
                          self.imag, self.pos)
                if self.device == "cuda":
                    from . import _cuda

                    _cuda.columns(src, self._columns_plan(), out)
                else:
                    columns(src, *static, out, self.real)  # real: all-real columns, the same bits
            if self.huge.size:
                from ._compiled import log_domain_columns

                log_domain_columns(src, self.ir, self.cr, self.ii, self.ci, self.huge_uatom, self.huge, self.huge_ptr,
                                   self.huge_local, self.huge_power, self.huge_log_sc, self.huge_sign, self.huge_imag,
                                   out, self.huge_odd, self.huge_easy)
            if self.checked.size:
                from ._compiled import first_nonfinite_rows

                r, c = first_nonfinite_rows(out, self.checked)
                if r >= 0:
                    raise DataError(
                        f"{source}: row {row0 + int(r)}, column {int(self.checked[c])}: the feature's value is too "
                        f"large for {self.dtype.name} (a high power of a sphere factor); "
                        + ("use --dtype float64, or " if self.dtype == np.float32 else "use ")
                        + "a skeleton without step over sphere 'coordinate' or 'pair' nodes"
                    )
            if self._may_underflow:
                self._check_underflow(x, row0, source, out)
        return out

    def _check_underflow(self, x, row0: int, source: str, out: np.ndarray) -> None:
        """Refuse a row whose values all fall below the output dtype's smallest normal
        number while they are not zero: written as they are, the row would be silently
        zero (or a few subnormal digits).  Rows whose largest value is normal keep every
        value to the dtype's precision relative to it.  Suspect rows (rare: zero rows of
        sparse inputs, or tiny products) are recomputed in float64 to tell the two apart."""
        from ._compiled import faint_rows, on_rows

        tiny = np.finfo(self.dtype).tiny
        faint = np.zeros(out.shape[0], dtype=np.bool_)
        on_rows(faint_rows, out.shape[0], out, float(tiny), faint, min_rows=4096)
        suspect = np.flatnonzero(faint)
        if not suspect.size:
            return
        if self._wide is None:
            self._wide = Transformer(self.fs, np.float64)
        rows = x.toarray(suspect) if isinstance(x, SparseRows) else np.ascontiguousarray(x[suspect])
        peak = np.abs(self._wide.chunk(rows, row0, source)).max(axis=1, initial=0.0)
        lost = np.flatnonzero(peak > 0)
        if lost.size:
            r = int(suspect[lost[0]])
            raise DataError(f"{source}: row {row0 + r}: its largest feature is {peak[lost[0]]:.3g}, below "
                            f"{self.dtype.name}'s smallest normal number {tiny:.3g}: written in {self.dtype.name} the "
                            "row would lose its values (products of many brownian or sphere factors are tiny); use "
                            "--dtype float64, or fewer columns under one brownian/sphere node")

    def chunks(self, src, chunk_rows: int, start: int = 0, stop: int | None = None, buffers: int = 1):
        """Yield ``(row0, values)`` over an input source.  ``values`` cycles through
        ``buffers`` reused arrays: it stays valid for ``buffers - 1`` further steps."""
        return buffered_chunks(self, src, chunk_rows, start, stop, buffers)


def easy_columns(ii, uatom, ptr, local, power, imag):
    """``(odd, easy)`` for :func:`rfsgen._compiled.log_domain_columns`.

    A column is easy when its atoms are all real (``ii < 0``: log|z| and an argument of 0
    or pi), it takes the cosine (not ``imag``), its powers are integers below 2^53, and
    its phase, summed in float64 from the terms' ``p * pi``, stays within 0.5 of the exact
    ``K pi`` (``K``: the sum of the powers of the row's negative atoms): the rounding of
    ``n`` products and ``n`` additions is at most ``(n + 2) sum|p| pi 2^-52`` (generous),
    required below 0.5.  Then cos(phase) is at least cos(0.5) = 0.88 in magnitude with
    the sign ``(-1)^K``, which rfsgen's cosine (under an ulp) keeps; ``K``'s parity is that
    of the number of the row's negative atoms among those of odd power (``odd``)."""
    na = uatom.size
    nw = (na + 63) // 64
    n_cols = ptr.size - 1
    odd = np.zeros((n_cols, nw), np.uint64)
    easy = np.zeros(n_cols, np.bool_)
    if not n_cols:
        return odd, easy
    lengths = np.diff(ptr)
    col = np.repeat(np.arange(n_cols), lengths)
    whole = power == np.floor(power)
    small = np.abs(power) < 2.0**53
    real = ii[uatom][local] < 0
    good = whole & small & real
    ok_terms = np.bincount(col, good, n_cols) == lengths
    total = np.bincount(col, np.abs(np.where(small, power, 0.0)), n_cols)
    easy[:] = ok_terms & ~np.asarray(imag, bool) & ((lengths + 2) * total * math.pi * 2.0**-52 < 0.5)
    odd_term = good & (np.fmod(np.abs(np.where(good, power, 0.0)), 2.0) == 1.0)
    bit = np.left_shift(np.uint64(1), (local[odd_term] & 63).astype(np.uint64))
    np.bitwise_xor.at(odd, (col[odd_term], local[odd_term] >> 6), bit)
    return odd, easy


def _unique_columns(keys: np.ndarray):
    """``np.unique(keys, axis=1, return_index=True, return_inverse=True)`` for int64
    ``(k, n)`` keys, by one stable lexsort (numpy's axis version sorts opaque records,
    about 10x slower)."""
    n = keys.shape[1]
    order = np.lexsort(keys[::-1])
    sk = keys[:, order]
    new = np.ones(n, dtype=bool)
    new[1:] = (sk[:, 1:] != sk[:, :-1]).any(axis=0)
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return sk[:, new], order[new], inverse


def can_vanish(base) -> bool:
    """True for a base whose factors are exactly zero on a positive share of the inputs
    it takes: a sphere ``coordinate`` factor (one coordinate of the unit vector: zero
    wherever the input's value is, as in sparse rows) and a ``brownian`` one (sin(m pi u):
    zero at the lower edge of its domain, where clipped or count data sit).  A sphere
    ``pair`` factor is zero only where two neighbouring values are both zero, and every
    other base's factors have modulus 1 (circle, categorical, gaussian, laplace, binary):
    they are taken as never zero."""
    if base.name == "sphere":
        return base.param("scheme") == "coordinate"
    return base.name == "brownian"


def density(fs) -> tuple:
    """``(density, nonzero_columns)`` of compositional paths (:func:`rfsgen.output.expected_density`).

    A column is ``scale * Re(e^{ib} * prod_k z_k^{p_k})``.  When none of its factors
    can vanish (:func:`can_vanish`), it is ``scale`` times the moduli of its factors
    times the cosine of a sum of angles: non-zero for almost every input.  A column
    with a factor that can vanish is zero wherever that factor is (sparse inputs to a
    sphere ``coordinate`` node, for example); a column of scale 0, or a sine column
    without factors, is always zero.  ``density`` is the fraction of almost surely
    non-zero columns."""
    D = fs.columns
    nodes = fs.walk_skeleton.nodes
    vanishing = np.array([isinstance(n, InputNode) and can_vanish(n.base) for n in nodes], dtype=bool)
    lengths = np.diff(fs.ptr.astype(np.int64))
    zero = np.zeros(D, dtype=bool)
    if fs.node.size:
        np.logical_or.at(zero, np.repeat(np.arange(D), lengths), vanishing[fs.node.astype(np.int64)])
    zero |= fs.scale == 0
    zero |= (fs.kind == 2) & (lengths == 0)  # cos(pi/2): the constant 0
    sure = int(D - zero.sum())
    return (sure / D if D else 1.0), sure


class PathsKind(ColumnKind):
    """Compositional paths (:class:`~rfsgen.featureset.ColumnKind`): the feature file's common
    datasets are all of it."""

    name = "compositional paths"
    schemes = ("rfs", "rr", "orf", "strat", "exact")
    listed = ("rfs", "strat", "exact", "rr", "orf")
    format_version = FORMAT_VERSION
    versions = (1, 2, FORMAT_VERSION)

    def transformer(self, fs, dtype=np.float32, device="cpu"):
        return Transformer(fs, dtype, device)

    def kernel(self, skel, x, y=None, *, options=None, x_source="<array>", y_source="<array>", copies=0,
               progress=None):
        from .recurrence import kernel

        return kernel(skel, x, y, progress=progress, x_source=x_source, y_source=y_source, copies=copies)

    def expected_density(self, fs):
        return density(fs)

    def inspect_rows(self, info: dict) -> list:
        return [
            ("features", f"{info['features']} distinct term sets"),
            ("draws", f"{info['draws']} (dedup ratio q/D = {info['dedup_ratio']:.3f})"),
            ("constant", f"weight {info['constant_weight']:.6f}"),
            ("weights", "count / draws per column" if info["column_weights"] == "counts"
             else "float column weights (/column_weight)"),
            ("terms", f"mean {info['mean_terms']:.3f} per column, max {info['max_terms']}"),
            # A feature set made in code and saved may carry no sampler statistics.
            ("factors", (f"mean {info['mean_factors_per_draw']:.4f} per draw before combining"
                         if info["mean_factors_per_draw"] is not None else "not recorded")
             + f"; C(S) = {info['complexity']:.4g}"),
            ("out degree", " ".join(f"{i}:{c}" for i, c in enumerate(info["output_degree_histogram"] or []) if c)
             if info["output_degree_histogram"] is not None else "not recorded"),
            ("input nodes", f"{info['input_nodes_used']} of {info['input_nodes']} used; most used: "
             + ", ".join(f"{t['node']} ({t['terms']})" for t in info["top_input_nodes"])),
        ]

    def density_text(self, dens: dict) -> str:
        sure, D = dens["nonzero_columns"], dens["columns"]
        d = dens["density"]
        shown = f"{d:.3f}" if d >= 0.001 or d == 0 else f"{d:.2g}"
        return (f"at least {shown} expected ({sure} of {D} columns almost surely non-zero"
                + ("; the others vanish where their sphere 'coordinate' or brownian inputs are zero" if sure < D else "")
                + ")")


#: The kind (rfsgen.kinds.KINDS).
PATHS = PathsKind()
