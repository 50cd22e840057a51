"""Transform: rows through a feature file into feature columns, in memory or streamed to HDF5.

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
  row, shared by every term that uses it.

Apart from those columns, no cosine or logarithm is evaluated per output value.  The output is deterministic
from the feature file: identical whatever the chunk size or thread count,
byte-identical across runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .errors import DataError, FeatureFileError, UsageError
from .features import FeatureSet
from .kernel import prepare_inputs
from .output import DTYPES, _check_options, _sparse_parts, default_chunk_rows, file_sha256, resolve_layout, write_output
from .skeleton import InputNode



@dataclass
class _GroupAtoms:
    group: int  # index into skeleton.input_groups
    gi: np.ndarray  # int64 (a,): node index within the group of each atom
    codes: np.ndarray  # int64 (a,) codes, or float64 (a, width) omega rows for continuous bases
    offset: int  # first column of this group's values in the source rows
    linear: bool  # source columns are the prepared values themselves (else [re | im])


class Transformer:
    """Evaluates a :class:`FeatureSet` on chunks of rows.

    Build once per feature set; :meth:`chunk` maps float ``(m, width)`` rows to
    a C-ordered ``(m, D)`` array of dtype ``dtype``.
    """

    def __new__(cls, fs: FeatureSet, dtype=np.float32):
        # An EOF feature set (DESIGN 9) has no terms: its own transformer, same interface.
        if cls is Transformer and getattr(fs, "eof", None) is not None:
            from .eof import Transformer as EOFTransformer

            return EOFTransformer(fs, dtype)
        return super().__new__(cls)

    def __init__(self, fs: FeatureSet, dtype=np.float32):
        self.fs = fs
        self.dtype = np.dtype(dtype)
        skel = fs.walk_skeleton
        self.skeleton = skel
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
        # Integer terms share atoms (node, code); continuous terms are atoms of their own.
        # Sorting by group first makes each group's atoms one block.
        keys = np.stack([group_of[node], node, np.where(is_cont, 0, code), np.where(is_cont, np.arange(n_terms), -1)])
        uniq, first, term_atom = _unique_columns(keys)
        n_atoms = uniq.shape[1]
        a_node, a_code = node[first], code[first]
        # How the compiled loop reads atom k from a chunk's source rows (see
        # rfsgen._compiled.columns): linear bases point into the prepared values,
        # the others into [re | im] blocks the base computes per chunk.
        ir, ii = np.zeros(n_atoms, np.int64), np.full(n_atoms, -1, np.int64)
        cr, ci = np.ones(n_atoms), np.zeros(n_atoms)
        self.groups: list[_GroupAtoms] = []
        width = 0
        for g, (base, ids, _) in enumerate(skel.input_groups):
            sel = np.flatnonzero(uniq[0] == g)
            if not sel.size:
                continue
            gi = index_in_group[a_node[sel]]
            codes = fs.omega[a_code[sel][:, None] + np.arange(base.width)[None, :]] if base.continuous else a_code[sel]
            lin = base.linear(gi, codes) if not base.continuous else None
            if lin is not None:
                ir[sel], cr[sel], ii[sel], ci[sel] = lin[0] + width, lin[1], np.where(lin[2] >= 0, lin[2] + width, -1), lin[3]
                self.groups.append(_GroupAtoms(g, gi, codes, width, True))
                width += ids.size * base.width
            else:
                ir[sel] = width + np.arange(sel.size)
                ii[sel] = width + sel.size + np.arange(sel.size)
                ci[sel] = 1.0
                self.groups.append(_GroupAtoms(g, gi, codes, width, False))
                width += 2 * sel.size
        self.source_width = width
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
            pairs, inverse = np.unique(np.stack([term_atom[odd], power[odd]]), axis=1, return_inverse=True)
            factor[odd] = n_atoms + inverse.ravel()
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
        self.sc = np.where(imag, -1.0, 1.0)[order] * fs.scale.astype(np.float64)[order]

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
        self.log_domain(fs, np.flatnonzero(bound > math.log(1e300)), term_atom, power, imag)

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

    @property
    def columns(self) -> int:
        return self.fs.columns

    @property
    def row_bytes(self) -> int:
        """Bytes one row of a chunk holds at most at once: the row read and converted
        (float64), its prepared input groups, its atoms (:meth:`source`) and its output
        values in two reused buffers plus a copy (sparse parts or the written block)."""
        skel = self.skeleton
        prepared = sum(ids.size * base.width for base, ids, _ in skel.input_groups)
        return 8 * (2 * skel.width + prepared + self.source_width) + 3 * self.dtype.itemsize * self.columns

    @property
    def what(self) -> str:
        return f"the transform by '{self.fs.skeleton.path}' features ({self.columns} columns)"

    def source(self, x: np.ndarray, row0: int = 0, source: str = "<array>") -> np.ndarray:
        """Validated, prepared rows as the compiled loop reads them: float64 ``(m, s)``."""
        xp = prepare_inputs(self.skeleton, x, row0, source)
        m = x.shape[0]
        if len(self.groups) == 1 and self.groups[0].linear:
            return np.ascontiguousarray(xp[self.groups[0].group].reshape(m, -1))
        src = np.empty((m, self.source_width))
        for ga in self.groups:
            base = self.skeleton.input_groups[ga.group][0]
            if ga.linear:
                flat = xp[ga.group].reshape(m, -1)
                src[:, ga.offset:ga.offset + flat.shape[1]] = flat
            else:
                a = ga.gi.size
                labels = [self.skeleton.nodes[i].label for i in self.skeleton.input_groups[ga.group][1]]
                base.values(xp[ga.group], ga.gi, ga.codes,
                            out=(src[:, ga.offset:ga.offset + a], src[:, ga.offset + a:ga.offset + 2 * a]),
                            where=(row0, source, labels))
        return src

    def chunk(self, x: np.ndarray, row0: int = 0, source: str = "<array>", out: np.ndarray | None = None) -> np.ndarray:
        """Feature values for rows ``x`` (float ``(m, width)``) as ``(m, D)`` of ``self.dtype``.

        ``out``, if given, is a C-contiguous ``(m, D)`` array of ``self.dtype`` to fill
        (reusing one buffer saves the page faults of a fresh 10-100 MB array per chunk).
        """
        from ._compiled import columns

        src = self.source(x, row0, source)
        m = x.shape[0]
        if out is None:
            out = np.empty((m, self.columns), dtype=self.dtype)
        elif out.shape != (m, self.columns) or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous ({m}, {self.columns}) {self.dtype} array")
        if m and self.columns:
            columns(src, self.ir, self.cr, self.ii, self.ci, self.xatom, self.xpow, self.fidx, self.fptr,
                    self.sc, self.imag, self.pos, out)
            if self.huge.size:
                from ._compiled import log_domain_columns

                log_domain_columns(src, self.ir, self.cr, self.ii, self.ci, self.huge_uatom, self.huge, self.huge_ptr,
                                   self.huge_local, self.huge_power, self.huge_log_sc, self.huge_sign, self.huge_imag,
                                   out)
            if self.checked.size:
                bad = ~np.isfinite(out[:, self.checked])
                if bad.any():
                    r, c = np.argwhere(bad)[0]
                    raise DataError(
                        f"{source}: row {row0 + int(r)}, column {int(self.checked[c])}: the feature's value is too "
                        f"large for {self.dtype.name} (a high power of a sphere factor); "
                        + ("use --dtype float64, or " if self.dtype == np.float32 else "use ")
                        + "a skeleton without step over sphere 'coordinate' or 'pair' nodes"
                    )
        return out

    def chunks(self, src, chunk_rows: int, start: int = 0, stop: int | None = None, buffers: int = 1):
        """Yield ``(row0, values)`` over an input source.  ``values`` cycles through
        ``buffers`` reused arrays: it stays valid for ``buffers - 1`` further steps."""
        return buffered_chunks(self, src, chunk_rows, start, stop, buffers)


def buffered_chunks(tr, src, chunk_rows: int, start: int = 0, stop: int | None = None, buffers: int = 1):
    """``tr.chunk`` over the chunks of ``src`` into ``buffers`` reused arrays (the
    ``chunks`` of every transformer: this module's and :class:`rfsgen.eof.Transformer`)."""
    bufs = [None] * buffers
    for i, (row0, block) in enumerate(src.chunks(chunk_rows, start, stop)):
        m = block.shape[0]
        k = i % buffers
        if bufs[k] is None or bufs[k].shape[0] < m:
            bufs[k] = np.empty((m, tr.columns), dtype=tr.dtype)
        yield row0, tr.chunk(block, row0, src.name, out=bufs[k][:m])


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


def transform(fs: FeatureSet, x, *, layout: str = "auto", dtype="float32", chunk_rows: int | None = None,
              progress: Callable[[int], None] | None = None, layer: str | None = None):
    """Transform rows in memory: ``scipy.sparse.csr_matrix`` (layout ``csr``) or ndarray (``dense``;
    ``auto``, the default: the one the ``transform`` command's ``--layout auto`` writes for ``fs``,
    :func:`rfsgen.output.auto_layout`: dense when at least half its columns are almost surely non-zero).

    ``x`` is an array ``(m, width)`` or anything :func:`rfsgen.inputs.open_input` takes,
    an ``anndata.AnnData`` among them (its X, or ``layers[layer]``; backed X too).
    """
    from .inputs import check_width, open_input

    _check_options(layout, dtype, "none")
    layout = resolve_layout(layout, fs)
    tr = Transformer(fs, DTYPES[dtype])
    chunk_rows = default_chunk_rows(fs.columns, tr.row_bytes, tr.what, chunk_rows)
    with open_input(x, layer=layer) as src:
        check_width(src, fs.skeleton.width, fs.skeleton.path, fs.skeleton.shape, **_bound_by(fs, "the feature set", src))
        D = fs.columns
        if layout == "dense" and src.n_rows is not None:
            out = np.empty((src.n_rows, D), dtype=DTYPES[dtype])
            for row0, block in src.chunks(chunk_rows):
                tr.chunk(block, row0, src.name, out=out[row0:row0 + block.shape[0]])
                if progress:
                    progress(block.shape[0])
            return out
        if layout == "csr" and src.n_rows is not None:
            return _csr_known_rows(tr, src, chunk_rows, progress)
        parts = []
        for _, vals in tr.chunks(src, chunk_rows):
            parts.append(vals.copy() if layout == "dense" else tuple(a.copy() for a in _sparse_parts(vals)))
            if progress:
                progress(vals.shape[0])
    if layout == "dense":
        return np.concatenate(parts) if parts else np.zeros((0, D), DTYPES[dtype])
    import scipy.sparse as sp  # imported here: file outputs never need it

    if not parts:
        return sp.csr_matrix((0, D), dtype=DTYPES[dtype])
    indptr = np.zeros(sum(p[2].size for p in parts) + 1, dtype=np.int64)
    np.cumsum(np.concatenate([p[2] for p in parts]), out=indptr[1:])
    data = np.concatenate([p[0] for p in parts])
    indices = np.concatenate([p[1] for p in parts])
    return sp.csr_matrix((data, indices, indptr), shape=(indptr.size - 1, D))


def _csr_known_rows(tr, src, chunk_rows, progress):
    """In-memory CSR of a source of known length: each chunk's nonzeros are compacted
    straight into arrays sized for the dense case (m * D), trimmed at the end."""
    import scipy.sparse as sp

    from ._compiled import compress_rows

    n, D = src.n_rows, tr.columns
    data = np.empty(n * D, dtype=tr.dtype)
    indices = np.empty(n * D, dtype=np.int32 if D < 2**31 else np.int64)
    indptr = np.zeros(n + 1, dtype=np.int64)
    nnz = 0
    for row0, vals in tr.chunks(src, chunk_rows):
        m = vals.shape[0]
        counts = np.empty(m, dtype=np.int64)
        nnz += compress_rows(vals, data[nnz:], indices[nnz:], counts)
        np.cumsum(counts, out=indptr[row0 + 1:row0 + m + 1])
        indptr[row0 + 1:row0 + m + 1] += indptr[row0]
        if progress:
            progress(m)
    if nnz < 0.9 * data.size:  # release the unused tail
        data, indices = data[:nnz].copy(), indices[:nnz].copy()
    return sp.csr_matrix((data[:nnz], indices[:nnz], indptr), shape=(n, D))


def _bound_by(fs: FeatureSet, what: str, src) -> dict:
    """For :func:`rfsgen.inputs.check_width`: where the width of a ``width: auto``
    skeleton's feature set came from (the sampling: ``--width`` or the fitted rows),
    and the fix, so that a mismatch does not ask to edit the skeleton."""
    if not fs.skeleton.auto:
        return {}
    how = f" (sampled with --width {fs.skeleton.width})" if "--width" in (fs.command or "") else ""
    return {"origin": what + how,
            "fix": f"pass rows of {fs.skeleton.width} values, or sample features for these rows "
                   f"('rfsgen sample {fs.skeleton.path} --width {src.width} ...')"}


def _swapped(features, input) -> FeatureFileError | None:
    """The error for ``transform ROWS FEATURES`` (the arguments swapped): ``features``
    is a file but not a feature file, and ``input`` is one.  None otherwise."""
    import os

    from .features import is_feature_file

    if not isinstance(features, (str, os.PathLike)) or not isinstance(input, (str, os.PathLike)):
        return None
    if not os.path.isfile(features) or not is_feature_file(input):
        return None
    return FeatureFileError(f"{features}: not a feature file, but the input {input} is one: the arguments look "
                            f"swapped; give the feature file first (transform FEATURES INPUT)")


def _obsm_input(input, key, rows, shard) -> str:
    """The AnnData file that ``--obsm`` copies: ``input`` must be an ``.h5ad`` path (its
    X or a layer), read whole."""
    import os

    from .inputs import _split_spec

    if rows is not None or shard is not None:
        raise UsageError("--obsm writes the features of every row into a copy of the input AnnData; it cannot take "
                         "--rows or --shard (transform without --obsm for parts of the rows)")
    path = _split_spec(os.fspath(input))[0] if isinstance(input, (str, os.PathLike)) else None
    if path is None or not path.lower().endswith(".h5ad"):
        raise UsageError(f"--obsm {key}: the input must be an .h5ad file (the AnnData to copy), not "
                         f"{input if path is not None else type(input).__name__}")
    return path


def transform_file(features, input, output, *, layout="auto", dtype="float32", compression="none",
                   chunk_rows=None, rows=None, shard=None, overwrite=False, progress=None, stdin=None,
                   engine=None, obsm=None, layer=None) -> dict:
    """Stream ``input`` rows through the feature file ``features`` into HDF5 ``output``.

    Memory is bounded by the chunk; the output is written to a temporary file and
    renamed on success.  ``layout``: ``csr``, ``dense``, or ``auto`` (the default: the
    one :func:`rfsgen.output.auto_layout` picks from the feature file).  ``rows`` (``"START:STOP"``) or ``shard`` (``"K/N"``, see
    :func:`rfsgen.inputs.shard_rows`) select part of the input.  Returns a summary dict
    (rows, columns, nnz, output).  ``engine(fs, dtype)``, if given, makes what computes
    the chunks in place of a :class:`Transformer` (``rfsgen.dask`` passes one that
    runs them on a cluster); the output is the same.

    ``obsm`` (an ``.h5ad`` input): the output is a copy of the input AnnData file with
    the features of every row added as ``obsm[obsm]`` (:func:`rfsgen.output.write_obsm`).
    ``layer``: with an ``.h5ad`` path, read ``layers[layer]`` instead of X.
    """
    from . import __version__
    from .features import load
    from .inputs import check_width, open_input, parse_rows, resolve_rows, shard_rows

    _check_options(layout, dtype, compression)
    if chunk_rows is not None and chunk_rows < 1:
        raise UsageError(f"--chunk-rows must be at least 1, got {chunk_rows}")
    if rows is not None and shard is not None:
        raise UsageError("give --rows or --shard, not both")
    start, stop = parse_rows(rows)
    adata_path = _obsm_input(input, obsm, rows, shard) if obsm is not None else None
    try:
        fs = load(features)
    except FeatureFileError as e:
        raise _swapped(features, input) or e from None
    layout = resolve_layout(layout, fs)
    tr = (engine or Transformer)(fs, DTYPES[dtype])
    with open_input(input, stdin=stdin, layer=layer) as src:
        check_width(src, fs.skeleton.width, fs.skeleton.path, fs.skeleton.shape,
                    **_bound_by(fs, f"feature file '{features}'", src))
        if shard is not None:
            start, stop = shard_rows(shard, src.n_rows, src.name)
        else:
            start, stop = resolve_rows(rows, src.n_rows, src.name)
        provenance = {"rfsgen_version": __version__, "features_file": str(features),
                      "features_sha256": file_sha256(features), "input": src.name}
        if adata_path is not None:
            from .output import write_obsm

            return write_obsm(output, tr, src, adata_path, obsm, layout=layout, dtype=dtype, compression=compression,
                              chunk_rows=chunk_rows, overwrite=overwrite, inputs=[features, input], progress=progress,
                              provenance=provenance)
        return write_output(output, tr, src, start, stop, layout=layout, dtype=dtype, compression=compression,
                            chunk_rows=chunk_rows, overwrite=overwrite, inputs=[features, input], progress=progress,
                            provenance=provenance)
