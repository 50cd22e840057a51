"""The HDF5/AnnData output writer shared by ``transform``, ``merge`` and the Dask adapter.

It takes anything that yields chunks of feature values (a :class:`rfsgen.transform.Transformer`,
a merge's shard reader, a cluster engine) and writes them, atomically, as dense ``X`` or CSR
(``X/data``, ``X/indices``, ``X/indptr``) with the AnnData annotations and rfsgen's provenance.
The file's bytes depend only on the values written, never on how they were chunked.

Every output carries an integrity record (:data:`RECORD_ATTR`, see :func:`make_record`):
its provenance, row range, dtype, layout, shape, nnz, the :data:`CHECKSUM` of each of
X's datasets (:class:`DataChecksum`, fed each chunk as it is computed, so no second pass
over the file) and of the row names, sealed by a SHA-256 of the rest.  ``rfsgen merge``
verifies shards against it (records of version 1, :data:`CHECKSUM_V1`, too).
"""

from __future__ import annotations

import hashlib

import os

import numpy as np

from .checksums import NamesChecksum, canonical_json  # below obs and merge; still importable from here
from .errors import UsageError
from .h5ad import check_obsm_target, feature_names, mark_csr, mark_dense, mark_root, write_index, write_uns_dict
from .kinds import of as kind_of

DTYPES = {"float32": np.float32, "float64": np.float64}
LAYOUTS = ("csr", "dense")
COMPRESSIONS = ("none", "gzip", "lzf")


#: Bytes of work a chunk aims at (counted as :func:`default_chunk_rows` says).
CHUNK_BYTES = 64 << 20


def default_chunk_rows(columns: int, row_bytes: float = 0, what: str = "", chunk_rows: int | None = None) -> int:
    """Rows per chunk: ``chunk_rows`` if given, else about 64 MiB of work per chunk
    counted at the wider of ``row_bytes`` (the intermediates of one row: its prepared
    inputs, atoms and output values) and ``columns`` float64 values, between 16 and
    8192 rows, and no more than a quarter of the memory budget holds at ``row_bytes``
    per row, down to one row.  Sizing from the intermediates, not from the columns
    alone, keeps a chunk's memory bounded where the atoms are far wider than the output
    (patch skeletons: 2 x 12,643 atoms a row at D = 4096 made 414 MB chunks).  The
    output's bytes never depend on the chunk size.  Raises
    :class:`~rfsgen.errors.LimitError` (naming ``what``) when the chunk does not fit
    the budget."""
    from . import budget

    per_row = max(8 * max(columns, 1), int(row_bytes))
    rows = chunk_rows or int(min(8192, max(16, CHUNK_BYTES // per_row)))
    if row_bytes and not chunk_rows:
        rows = int(max(1, min(rows, budget.limit() // 4 // row_bytes)))
    if row_bytes:
        budget.check(rows * row_bytes, f"{what or 'the transform'}: a chunk of {rows} rows at {budget.fmt(row_bytes)} "
                                       f"a row", "use a smaller --chunk-rows" if chunk_rows else "")
    return rows


def csr_block(values: int | None) -> int:
    """Values per HDF5 chunk of a CSR output's ``data`` and ``indices``: the smallest
    power of two holding ``values`` (the values actually stored, nnz), between 2^12 and
    2^20 (``None``: 2^20).  HDF5 stores whole chunks, so a small output stays small (a
    sparse one too: the block follows the stored values, not rows x columns); the
    block depends only on the values written, never on how they were chunked, sharded
    or merged."""
    if values is None:
        return 1 << 20
    return 1 << min(20, max(12, (max(int(values), 1) - 1).bit_length()))


#: What ``--layout`` takes: a layout, or ``auto`` (:func:`auto_layout`).
LAYOUT_CHOICES = ("auto",) + LAYOUTS
def expected_density(fs) -> dict:
    """How dense the features of ``fs`` are expected to be, from the feature file alone.

    A column is ``scale * Re(e^{ib} * prod_k z_k^{p_k})``.  When none of its factors
    can vanish (:func:`rfsgen.paths.can_vanish`), it is ``scale`` times the moduli of its factors
    times the cosine of a sum of angles: non-zero for almost every input.  A column
    with a factor that can vanish is zero wherever that factor is (sparse inputs to a
    sphere ``coordinate`` node, for example); a column of scale 0, or a sine column
    without factors, is always zero.  ``density`` is the fraction of almost surely
    non-zero columns: the output's density for inputs that zero every factor that
    can vanish, and about the least it has (sphere ``pair`` factors of two
    neighbouring zeros aside).  Each column kind computes its own (:mod:`rfsgen.kinds`;
    compositional paths: :func:`rfsgen.paths.density`; EOF feature sets: their expected
    non-zeros per row over the columns).

    Returns ``{"density": float in [0, 1], "nonzero_columns": int, "columns": int,
    "layout": "dense" or "csr"}`` where ``layout`` is what ``--layout auto`` writes
    (:func:`auto_layout`).
    """
    D = fs.columns
    density, sure = kind_of(fs).expected_density(fs)
    return {"density": float(density), "nonzero_columns": sure, "columns": int(D),
            "layout": "dense" if density >= 0.5 else "csr"}


def auto_layout(fs) -> str:
    """The layout ``--layout auto`` writes for ``fs``: ``dense`` when at least half of
    its columns are almost surely non-zero (:func:`expected_density`), else ``csr``.
    CSR stores 4 bytes of column index beside every value (8 bytes a float32 value
    against dense's 4), so it can only be smaller when fewer than half the values are
    stored, and it takes about twice dense's time to write: with half the columns
    never zero, dense is never the larger file."""
    return expected_density(fs)["layout"]


def resolve_layout(layout: str, fs) -> str:
    """``layout``, with ``auto`` resolved for the feature set ``fs`` (:func:`auto_layout`)."""
    return auto_layout(fs) if layout == "auto" else layout


def _check_options(layout, dtype, compression):
    if layout not in LAYOUT_CHOICES:
        raise UsageError(f"--layout must be one of {', '.join(LAYOUT_CHOICES)}, got {layout!r}")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if compression not in COMPRESSIONS:
        raise UsageError(f"--compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")


# ----------------------------------------------------------------------------- HDF5 output
class _Appender:
    """Appends to resizable 1-D datasets of equal length (CSR ``data`` and ``indices``)
    in fixed blocks, writing block k of every dataset before block k + 1 of any.

    The file's bytes then depend only on the values written, never on how the caller
    chunked them: HDF5 places chunks in the file in the order they are written, so
    writing several data blocks before the matching index blocks (a large chunk of
    rows) would lay the file out differently from alternating them (small chunks).

    The datasets are created when the block is known: once ``max_block`` values have
    arrived (the block is then ``max_block``), or at :meth:`close` with
    :func:`csr_block` of the values written, so that a small output's chunks are sized
    to its data.  Nothing else is created in the file meanwhile, so the file is laid
    out as if they had been created up front.
    """

    def __init__(self, group, names, dtypes, compression, check, max_block=1 << 20):
        self.group, self.names, self.dtypes = group, names, dtypes
        self.compression = compression
        self.block = max_block  # until the datasets exist: how many values are held before they are
        self.check = check  # called after every block: raises a recorded write error
        self.ds = None
        self.raw = compression == "none"
        self.pending = [np.empty(max_block, dtype=t) for t in dtypes]
        self.n_pending = 0
        self.size = 0

    def _create(self, block):
        kw = {} if self.compression == "none" else {"compression": self.compression}
        self.block = block
        self.ds = [self.group.create_dataset(n, shape=(0,), maxshape=(None,), dtype=t, chunks=(block,),
                                             track_times=False, **kw) for n, t in zip(self.names, self.dtypes)]

    def add(self, *arrays):
        """Append one array per dataset, all of one length (copied: the caller may reuse
        its buffers)."""
        arrays = [a.reshape(-1) for a in arrays]
        n = arrays[0].size
        i = 0
        if self.n_pending:
            i = min(self.block - self.n_pending, n)
            for p, a in zip(self.pending, arrays):
                p[self.n_pending:self.n_pending + i] = a[:i]
            self.n_pending += i
            if self.n_pending < self.block:
                return
            self._write(self.pending)
            self.n_pending = 0
        for k in range(i, n - (n - i) % self.block, self.block):
            self._write([a[k:k + self.block] for a in arrays])
        rest = (n - i) % self.block
        for p, a in zip(self.pending, arrays):
            p[:rest] = a[n - rest:]
        self.n_pending = rest

    def _write(self, parts):
        size = parts[0].size
        if self.ds is None:  # a full block before the end: the largest block
            self._create(self.block)
        if not size:
            return
        for ds, data in zip(self.ds, parts):
            ds.resize((self.size + size,))
            if self.raw and size == self.block:
                # A whole uncompressed chunk goes to the file as it is: the same bytes
                # as a selection write, without HDF5's per-element machinery.
                ds.id.write_direct_chunk((self.size,), memoryview(np.ascontiguousarray(data)))
            else:
                ds[self.size:self.size + size] = data
        self.size += size
        self.check()

    def close(self):
        if self.ds is None:  # every value is still here: chunks sized to them
            self._create(csr_block(self.n_pending))
        self._write([p[:self.n_pending] for p in self.pending])
        self.n_pending = 0


def _sparse_parts(vals: np.ndarray, full_indices: np.ndarray | None = None, sums=None, row0: int = 0):
    """CSR pieces of a dense chunk: ``(data, indices, counts per row)`` without exact zeros
    (+0 or -0).

    Compositional features are rarely exactly zero, so a chunk without any costs one
    counting pass and gives views, not a gather; otherwise a second pass compresses
    each row into place (rows split over :func:`rfsgen._compiled.threads` threads).
    ``full_indices`` may hold a cached ``tile(arange(D), m)`` of sufficient length.
    ``sums`` (a CSR :class:`DataChecksum` of ``vals``' dtype and width, or None) is fed
    the CSR rows, global ``row0`` onwards, each hashed in the pass that last touched it
    (:meth:`DataChecksum.csr_parts`).
    """
    m, d = vals.shape
    index_dtype = np.int32 if d < 2**31 else np.int64
    if (vals.dtype not in (np.float32, np.float64) or index_dtype != np.int32 or not m or not d
            or (sums is not None and (sums.layout != "csr" or sums.dtype != vals.dtype or sums.columns != d))):
        # Never written by rfsgen's transform (other dtypes, no rows or columns): numpy.
        keep = vals != 0
        counts = keep.sum(axis=1, dtype=np.int64)
        if keep.all():
            data, indices = np.ascontiguousarray(vals).reshape(-1), np.tile(np.arange(d, dtype=index_dtype), m)
        else:
            rows, cols = np.nonzero(keep)
            data, indices = vals[rows, cols], cols.astype(index_dtype)
        if sums is not None:
            sums.csr(data, indices, np.concatenate([[0], np.cumsum(counts)]), row0)
        return data, indices, counts
    vals = np.ascontiguousarray(vals)
    passes = _RowPasses(vals, row0, sums)
    counts = np.empty(m, dtype=np.int64)
    passes.count(counts)
    if (counts == d).all():
        if full_indices is None or full_indices.size < m * d:
            full_indices = np.tile(np.arange(d, dtype=index_dtype), m)
        data, indices = vals.reshape(-1), full_indices[:m * d]
    else:
        ptr = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        nnz = int(ptr[-1])
        data = np.empty(nnz, dtype=vals.dtype)
        indices = np.empty(nnz, dtype=index_dtype)
        passes.compress(ptr, data, indices)
    passes.finish(sums)
    return data, indices, counts


class _RowPasses:
    """The two passes that make a dense chunk's CSR pieces, rows split over the threads
    (:func:`rfsgen._compiled.stored_counts`, :func:`rfsgen._compiled.compress_hashed`):
    ``vals`` C-ordered float32 or float64 ``(m, D)``, int32 columns; with ``sums`` (a CSR
    :class:`DataChecksum`), each row hashed in the pass that last touched it, global
    ``row0`` onwards."""

    def __init__(self, vals: np.ndarray, row0: int = 0, sums=None):
        m, d = vals.shape
        self.m, self.row0 = m, int(row0)
        self.w = vals.view(np.uint32)
        self.dper = vals.dtype.itemsize // 4
        self.hashing = sums is not None
        self.out = np.empty((m if self.hashing else 0, 8), dtype=np.uint32)
        self.masks = sums.masks if self.hashing else (np.uint32(0), np.uint32(0), np.uint32(1))
        self.min_rows = max(1, (1 << 17) // d)

    def count(self, counts: np.ndarray) -> None:
        """Each row's values that are not exactly zero into ``counts`` (int64 ``(m,)``)."""
        from ._compiled import on_rows, stored_counts

        on_rows(stored_counts, self.m, self.w, self.dper, self.row0, self.hashing, *self.masks, counts, self.out,
                min_rows=self.min_rows)

    def compress(self, ptr: np.ndarray, data: np.ndarray, indices: np.ndarray) -> None:
        """Row ``r``'s kept values and columns into ``data`` and ``indices`` at ``ptr[r]:ptr[r + 1]``
        (the counts summed)."""
        from ._compiled import compress_hashed, on_rows

        on_rows(compress_hashed, self.m, self.w, self.dper, ptr, data.view(np.uint32), indices.view(np.uint32),
                self.row0, self.hashing, *self.masks, self.out, min_rows=self.min_rows)

    def finish(self, sums) -> None:
        if self.hashing:
            sums._add(self.out[:, :6])


def compress_into(vals: np.ndarray, data: np.ndarray, indices: np.ndarray, counts: np.ndarray) -> int:
    """``vals`` (float ``(m, D)``) without its exact zeros (+0 or -0), row after row, into the
    front of ``data`` (its dtype) and ``indices`` (int32 or int64), each at least ``m * D``
    long; each row's count into ``counts`` (int64 ``(m,)``).  Returns the values kept: what
    :func:`rfsgen._compiled.compress_rows` gives, with the rows split over the threads (a
    counting pass, then each row written at its place), as :func:`_sparse_parts` does."""
    from ._compiled import compress_rows

    m, d = vals.shape
    if (vals.dtype not in (np.float32, np.float64) or data.dtype != vals.dtype or indices.dtype != np.int32
            or not vals.flags.c_contiguous or not m or not d):
        return compress_rows(vals, data, indices, counts)
    if data.size < m * d or indices.size < m * d or counts.size < m:
        raise ValueError(f"compress_into: data and indices must hold {m} x {d} values, counts {m}")
    passes = _RowPasses(vals)
    passes.count(counts)
    ptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(counts[:m], out=ptr[1:])
    passes.compress(ptr, data, indices)
    return int(ptr[-1])


# ----------------------------------------------------------------------------- integrity record
#: The root attribute holding the integrity record (one canonical JSON text).
RECORD_ATTR = "rfsgen_record"
RECORD_FORMAT = "rfsgen-output-record"
RECORD_VERSION = 2
#: The definition of the values in a transform output, written as the root attribute
#: ``output_definition`` (merge refuses to combine shards of different definitions;
#: a file without the attribute is definition 1).  1: cos/sin of atom angles from the
#: C library (rfsgen before issue 26); 2: rfsgen's own cos/sin (rfsgen._sincos) of
#: float64 angles summed without fused multiply-add, the same bits on every CPU;
#: 3 (issue 39): gaussian and laplace angles as float32 fused multiply-adds in one
#: fixed order and a float32-accurate cos/sin of them (rfsgen._sincos32), the same
#: bits on every CPU, with or without hardware FMA.  Feature files do not change with it.
OUTPUT_DEFINITION = 3
#: The data checksum of record version 2 (docs/integrity.md): for each of X's datasets,
#: two sums mod 2^32 over every stored value of a keyed mix of (dataset, global row,
#: position in the row, value), written as 16 hex digits (see :class:`DataChecksum`).
#: A sum: independent of chunking, threads and sharding, and the merged file's is the
#: sum of its shards'.
CHECKSUM = "keyed-sum64-fmix32"
#: The data checksum of record version 1 (still verified by merge): XXH64 (seed 0) of
#: each 1 MiB block of a dataset's bytes (the last block may be shorter), then SHA-256
#: of the blocks' hashes (8 bytes each, little-endian), in hex.
CHECKSUM_V1 = "xxh64-1MiB-sha256"
CHECKSUM_BLOCK = 1 << 20
#: The dataset numbers (``seed``) keying :data:`CHECKSUM`'s mix (CSR's are built into
#: rfsgen._compiled.csr_sums).
_SEEDS = {"X": 1, "X/data": 2, "X/indices": 3, "X/indptr": 4}
#: Per float width: the masks of a word's low and high 32-bit halves, and the least
#: masked half that is NaN or infinity (see rfsgen._compiled.run_sums).
_FINITE = {4: (0x7FFFFFFF, 0x7FFFFFFF, 0x7F800000), 8: (0, 0x7FFFFFFF, 0x7FF00000)}


def _hex(a: int, b: int) -> str:
    return f"{a & 0xFFFFFFFF:08x}{b & 0xFFFFFFFF:08x}"


def add_digests(*digests: dict) -> dict:
    """The :data:`CHECKSUM` digests (dicts dataset -> 16 hex digits) of the union of
    disjoint row ranges: per dataset, each of the two sums added mod 2^32."""
    out = {}
    for d in digests:
        for k, v in d.items():
            a, b = out.get(k, (0, 0))
            out[k] = (a + int(v[:8], 16), b + int(v[8:], 16))
    return {k: _hex(a, b) for k, (a, b) in out.items()}


class DataChecksum:
    """The :data:`CHECKSUM` of an output's ``X``: dense (``X``) or CSR (``X/data``,
    ``X/indices``, ``X/indptr``), fed rows in pieces of any size, in any order.

    For each dataset, two sums mod 2^32 (rfsgen._compiled.run_sums) over its values
    taken in 64-bit words (float32 values and column indices two a word), each word
    keyed by its global row (``rows_start`` onwards in a shard) and its position in the
    row's run (a dense row's values; a CSR row's stored values, or their columns, but
    not those of a full row of ``columns`` values, which can only be 0 .. columns - 1);
    ``X/indptr`` is checked through the row lengths (one word a row) and its structure
    (merge).  ``finite``: also find rows holding NaN or infinity, in the same pass.
    ``threads``: split large pieces over :func:`rfsgen._compiled.threads`.
    """

    def __init__(self, layout: str, dtype, columns: int, finite: bool = False, threads: bool = True):
        self.layout = layout
        self.columns = int(columns)
        self.dtype = np.dtype(dtype)
        self.names = ("X",) if layout == "dense" else ("X/data", "X/indices", "X/indptr")
        self.sums = [0] * (2 * len(self.names))
        self.masks = tuple(np.uint32(v) for v in (_FINITE[self.dtype.itemsize] if finite else (0, 0, 1)))
        self.finite = finite
        self.threads = threads

    def _run(self, kernel, m, values_per_row, *args):
        from ._compiled import on_rows

        if self.threads:
            on_rows(kernel, m, *args, min_rows=max(1, (1 << 17) // max(values_per_row, 1)))
        else:
            kernel(*args, 0, m)

    def _bad(self, out, col) -> int | None:
        if not self.finite:
            return None
        bad = out[:, col]
        return int(np.argmax(bad)) if bad.any() else None

    def dense(self, vals: np.ndarray, row0: int) -> int | None:
        """Feed the rows ``vals`` (float ``(m, D)``, this checksum's dtype), the first of
        them global row ``row0``.  Returns the index (in ``vals``) of the first row that
        holds NaN or infinity (``finite`` only), else None."""
        from ._compiled import dense_sums

        m = vals.shape[0]
        if not m or not vals.shape[1]:
            return None
        w = np.ascontiguousarray(vals).view(np.uint32)
        out = np.empty((m, 3), dtype=np.uint32)
        self._run(dense_sums, m, vals.shape[1], w, int(row0), _SEEDS["X"], *self.masks, out)
        self._add(out[:, :2])
        return self._bad(out, 2)

    def csr(self, data: np.ndarray, indices: np.ndarray, ptr: np.ndarray, row0: int) -> tuple | None:
        """Feed CSR rows: row ``r`` (global ``row0 + r``, for ``r < ptr.size - 1``) holds
        ``data`` and ``indices`` (int32 or int64) at ``ptr[r] - ptr[0]`` up to
        ``ptr[r + 1] - ptr[0]`` (``ptr`` int64).  With ``finite`` (a merge verifying a
        shard), also checks each row, in the same pass: returns ``(index, fault)`` for
        the first row whose data holds NaN or infinity (``fault`` "nonfinite"), else the
        first whose columns are not strictly increasing within 0 .. columns - 1
        ("indices"), else the first that stores a zero ("zero"); None when every row
        is sound (always, without ``finite``)."""
        from ._compiled import csr_sums

        m = ptr.size - 1
        if m <= 0:
            return None
        if data.dtype != self.dtype:  # its bits are hashed as this checksum's dtype
            raise ValueError(f"CSR data of dtype {data.dtype}, expected {self.dtype}")
        n = int(ptr[-1] - ptr[0])
        if np.any(np.diff(ptr) < 0) or n > min(data.size, indices.size):  # the compiled loop trusts the pointer
            raise ValueError(f"not a CSR row pointer into {min(data.size, indices.size)} values")
        out = np.empty((m, 8), dtype=np.uint32)
        # Column indices as uint32 (fewer than 2^32 columns: at most sampler.MAX_COLUMNS);
        # int64 ones (never written: fewer than 2^31 columns) are converted, a column
        # outside 0 .. 2^32 - 1 to 2^32 - 1 (past any width) so that verifying finds it.
        indices = np.ascontiguousarray(indices)
        if indices.dtype == np.int32:
            indices = indices.view(np.uint32)
        else:
            indices = np.where((indices < 0) | (indices > 0xFFFFFFFF), 0xFFFFFFFF, indices).astype(np.uint32)
        self._run(csr_sums, m, max(1, data.size // m), np.ascontiguousarray(data).view(np.uint32),
                  self.dtype.itemsize // 4, indices, np.ascontiguousarray(ptr, dtype=np.int64), self.columns,
                  int(row0), *self.masks, self.finite, out)
        self._add(out[:, :6])
        if not self.finite:
            return None
        for fault, hit in (("nonfinite", out[:, 6] != 0), ("indices", (out[:, 7] & 1) != 0),
                           ("zero", (out[:, 7] & 2) != 0)):
            if hit.any():
                return int(np.argmax(hit)), fault
        return None

    def csr_parts(self, vals: np.ndarray, row0: int, full_indices: np.ndarray | None = None):
        """:func:`_sparse_parts` of the dense rows ``vals`` (float ``(m, D)``, this
        checksum's dtype; the first of them global row ``row0``), fed to this checksum
        as the CSR rows they become, in the same passes: each row is hashed right after
        it is counted or compressed, while still in cache.  Returns ``(data, indices,
        counts per row)``, split over threads as :func:`_sparse_parts` is, whatever
        ``threads``.  A writer's checksum only (not ``finite``: a verifying merge checks
        CSR pieces as they are, with :meth:`csr`)."""
        if self.finite:
            raise ValueError("csr_parts feeds a writer's checksum; verify CSR pieces with csr()")
        return _sparse_parts(vals, full_indices, self, row0)

    def _add(self, parts) -> None:
        totals = parts.sum(axis=0, dtype=np.uint64)
        self.sums = [(s + int(t)) & 0xFFFFFFFF for s, t in zip(self.sums, totals)]

    def hexdigests(self) -> dict:
        """Each dataset's checksum: the two sums as 16 hex digits."""
        return {n: _hex(self.sums[2 * i], self.sums[2 * i + 1]) for i, n in enumerate(self.names)}


class BlockChecksum:
    """The :data:`CHECKSUM_V1` of one dataset's bytes (records of version 1), fed in
    order in pieces of any size.

    ``finite`` (a float dtype, or None) also watches for NaN and infinities in the
    bytes as they are hashed, at no extra pass: :attr:`first_bad` is then the byte
    offset of the first 1 MiB block holding one (None while there is none).
    """

    def __init__(self, finite=None):
        self.kind = 0 if finite is None else np.dtype(finite).itemsize
        self.pending = np.empty(CHECKSUM_BLOCK, dtype=np.uint8)
        self.n_pending = 0
        self.digests: list = []
        self.size = 0  # bytes fed
        self.first_bad = None

    def update(self, arr) -> None:
        """Feed the bytes of ``arr`` (any array, in C order)."""
        u8 = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        n = u8.size
        i = 0
        if self.n_pending:
            i = min(CHECKSUM_BLOCK - self.n_pending, n)
            self.pending[self.n_pending:self.n_pending + i] = u8[:i]
            self.n_pending += i
            if self.n_pending < CHECKSUM_BLOCK:
                self.size += n
                return
            self._blocks(self.pending.view(np.uint64).reshape(1, -1), self.size - (self.n_pending - i))
            self.n_pending = 0
        full = (n - i) // CHECKSUM_BLOCK
        if full:
            region = u8[i:i + full * CHECKSUM_BLOCK]
            if region.ctypes.data % 8:  # uint64 words need an aligned start
                region = region.copy()
            self._blocks(region.view(np.uint64).reshape(full, -1), self.size + i)
        rest = n - i - full * CHECKSUM_BLOCK
        self.pending[:rest] = u8[n - rest:]
        self.n_pending = rest
        self.size += n

    def _blocks(self, words, offset):
        from ._compiled import on_rows, xxh64_blocks

        out = np.empty(words.shape[0], dtype=np.uint64)
        bad = np.zeros(words.shape[0], dtype=np.bool_)
        # Threads for large pieces only (a dense chunk); the CSR writer's 4 MiB pieces are
        # hashed in its own thread, beside the compute, without starting more.
        on_rows(xxh64_blocks, words.shape[0], words, self.kind, out, bad, min_rows=8)
        self.digests.append(out)
        if self.first_bad is None and bad.any():
            self.first_bad = offset + int(np.argmax(bad)) * CHECKSUM_BLOCK

    def hexdigest(self) -> str:
        """The checksum of everything fed (the object is spent afterwards)."""
        from ._compiled import xxh64

        if self.n_pending:
            whole = self.n_pending // 8 * 8
            h, bad = xxh64(self.pending[:whole].view(np.uint64), self.pending[whole:self.n_pending], 0, self.kind)
            tail_bad = False
            if self.kind and whole < self.n_pending:  # a last float32 outside the words
                tail_bad = not np.isfinite(self.pending[whole:self.n_pending].view(np.float32)).all()
            if self.first_bad is None and (bad or tail_bad):
                self.first_bad = self.size - self.n_pending
            self.digests.append(np.array([h], dtype=np.uint64))
            self.n_pending = 0
        sha = hashlib.sha256()
        for d in self.digests:
            sha.update(d.astype("<u8").tobytes())
        return sha.hexdigest()


def number_names_digest(start: int, stop: int) -> str:
    """The :class:`NamesChecksum` of the row numbers ``start .. stop - 1`` as names."""
    from .h5ad import NAME_BLOCK

    c = NamesChecksum()
    for a in range(start, stop, NAME_BLOCK):
        c.update([str(i) for i in range(a, min(stop, a + NAME_BLOCK))])
    return c.hexdigest()


def seal_of(record: dict) -> str:
    """SHA-256 (hex) of the canonical JSON of ``record`` without its ``seal``."""
    return hashlib.sha256(canonical_json({k: v for k, v in record.items() if k != "seal"}).encode("ascii")).hexdigest()


def make_record(provenance: dict, *, start: int, n_rows: int, columns: int, layout: str, dtype, compression: str,
                nnz: int, checksums: dict, names: str, names_sha256: str, clipped: int | None = None,
                obs_sha256: str | None = None) -> dict:
    """The integrity record of an output (see :data:`RECORD_ATTR`), sealed.

    ``checksums`` maps each data dataset (``X``, or ``X/data``, ``X/indices``,
    ``X/indptr``) to its :data:`CHECKSUM` (:meth:`DataChecksum.hexdigests`); ``names``
    says where the row names come from (``"numbers"``: the row numbers; ``"input"``: the input's names) and
    ``names_sha256`` is their :class:`NamesChecksum`.  ``clipped``: an EOF output's count
    of input values clipped to the box (the ``clipped_values`` attribute), sealed with the rest.
    ``obs_sha256``: the digest of the obs columns carried from the input
    (:meth:`rfsgen.obs.ObsColumns.write`), when there are any.
    """
    record = {
        "format": RECORD_FORMAT, "version": RECORD_VERSION,
        **{k: provenance[k] for k in ("rfsgen_version", "features_file", "features_sha256", "input")},
        "rows_start": int(start), "rows_stop": int(start + n_rows), "columns": int(columns), "layout": layout,
        "dtype": np.dtype(dtype).name, "compression": compression, "shape": [int(n_rows), int(columns)],
        "nnz": int(nnz), "checksum": CHECKSUM, "datasets": dict(checksums),
        "obs_names": names, "obs_names_sha256": names_sha256,
    }
    if clipped is not None:
        record["clipped_values"] = int(clipped)
    if obs_sha256 is not None:  # an .h5ad input's obs columns (rfsgen.obs), sealed with the rest
        record["obs_columns_sha256"] = obs_sha256
    record["seal"] = seal_of(record)
    return record


def file_sha256(path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()



def room_for(output) -> tuple[int, str] | None:
    """How many bytes the file ``output`` may grow to, and what sets that figure: the
    free space of its filesystem, or the process's file-size limit (``RLIMIT_FSIZE``,
    ``ulimit -f``) where that is smaller.  None where neither is known."""
    import shutil
    from pathlib import Path

    from .budget import fmt

    parent = Path(output).parent if str(Path(output).parent) else Path(".")
    best = None
    try:
        free = shutil.disk_usage(parent).free
        best = (free, f"its filesystem has {fmt(free)} free")
    except OSError:
        pass
    try:
        import resource

        limit, unlimited = resource.getrlimit(resource.RLIMIT_FSIZE)[0], resource.RLIM_INFINITY
    except (ImportError, OSError, ValueError):  # no such limit here (not POSIX)
        limit = unlimited = -1
    if limit not in (-1, unlimited) and (best is None or limit < best[0]):
        best = (int(limit), f"the process's file-size limit (ulimit -f) is {fmt(limit)}")
    return best


def _space_fix(what: str) -> str:
    return (f"{what}; free space, raise the limit, write it elsewhere, or transform fewer rows (--rows START:STOP)")


def check_space(output, n_rows, columns: int, layout: str, itemsize: int, compression: str, extra: int = 0) -> None:
    """Refuse, before anything is written, an output that cannot fit on its filesystem
    (or under the process's file-size limit, :func:`room_for`).

    The bound is what the file must hold whatever the values: an uncompressed dense
    ``(n_rows, columns)`` matrix, or for CSR (or a compressed matrix) its row pointers
    (8 bytes a row), plus ``extra`` bytes (a copied AnnData file).  A hostile input can
    declare 10^9 rows in a few bytes; without this the run would fill the disk before
    failing.  What the values add to a CSR or compressed matrix is projected as the rows
    are written (:class:`SizeProjection`).  ``n_rows`` None (a stream of unknown length)
    checks nothing."""
    from .budget import fmt
    from .errors import OutputError

    if n_rows is None:
        return
    per_row = columns * itemsize if layout == "dense" and compression == "none" else 8
    need = int(n_rows) * per_row + int(extra)
    room = room_for(output)
    if room is not None and need > room[0]:
        raise OutputError(_space_fix(f"{output}: needs at least {fmt(need)} ({n_rows:,} rows x {columns:,} {layout} "
                                     f"columns) but {room[1]}"))


class SizeProjection:
    """The final size of a CSR or compressed output, projected from the rows written so
    far, checked against the room the write began with (:func:`room_for`).

    The least size (:func:`check_space`) leaves out what the values take: 10^9 declared,
    nearly empty input rows still give 10^9 rows of features, and a run that writes
    them would fill the disk for minutes before failing.  After each chunk, ``bytes``
    written over ``rows`` done, times the rows still to come, must fit: a projection,
    so a run whose later rows are much sparser than its first may be refused early
    (the message says so); one that fits is never refused.  ``total`` None (a stream)
    checks nothing."""

    def __init__(self, output, total, extra: int = 0):
        self.output, self.total, self.extra = output, total, int(extra)
        self.room = None if total is None else room_for(output)

    def __call__(self, rows: int, nbytes: int) -> None:
        from .budget import fmt
        from .errors import OutputError

        if self.room is None or not rows or rows >= self.total:
            return
        projected = nbytes / rows * self.total + self.extra
        if projected > self.room[0]:
            raise OutputError(_space_fix(
                f"{self.output}: its first {rows:,} rows took {fmt(nbytes)}, so {self.total:,} rows need about "
                f"{fmt(projected)} but {self.room[1]}"))


def write_output(output, tr, src, start, stop, *, layout, dtype, compression, chunk_rows, overwrite, inputs, progress,
                 provenance: dict, phase: str = "transform") -> dict:
    """Write rows ``start:stop`` of ``src`` through ``tr`` (anything with ``columns``
    and ``chunks`` like :class:`Transformer`) into the HDF5/AnnData file ``output``,
    atomically.  The record's data checksums are computed as the chunks are written,
    unless ``tr`` has ``known_digests`` (a merge's copy of verified shards): called
    after the last chunk, it returns them.  ``provenance`` holds the root attributes rfsgen_version,
    features_file, features_sha256 and input (written in that order, then
    rows_start, rows_stop, columns, layout).  ``phase`` names the work on the progress
    bar.  Returns a summary dict."""
    import h5py

    from ._signals import deferred
    from .atomic import SafeFile, atomic_path
    from .inputs import chunk_row_bytes

    chunk_rows = default_chunk_rows(tr.columns, chunk_row_bytes(tr, src), getattr(tr, "what", ""), chunk_rows)
    np_dtype = np.dtype(DTYPES[dtype])
    D = tr.columns
    # (a stream's header is not checked: it may promise rows it never sends, the stream's end decides)
    known = None if stop is None or getattr(src, "declared_only", False) else stop - start
    check_space(output, known, D, layout, np_dtype.itemsize, compression)
    if progress is not None and hasattr(progress, "phase"):
        progress.phase(phase, None if stop is None else stop - start)
    with atomic_path(output, overwrite, inputs=inputs) as tmp, SafeFile(tmp) as sink:
        # HDF5 writes through SafeFile: a full disk is reported by sink.check()
        # after each block and at the end, never inside HDF5 (where h5py crashes).
        with _first_write_error(sink), h5py.File(sink, "w", libver="earliest") as f:
            known = getattr(tr, "known_digests", None)
            sums = None if known is not None else DataChecksum(layout, np_dtype, D, threads=layout == "dense")
            n_rows, nnz = _write(f, tr, src, start, stop, layout, np_dtype, compression, chunk_rows, progress, sink,
                                 sums, output=output)
            digests = known() if known is not None else sums.hexdigests()
            with deferred():
                names, names_sha, obs_sha = _write_annotations(f, src, start, n_rows, D, layout)
                clipped = getattr(tr, "clipped", None)  # EOF: values clipped to the box (rfsgen.eof)
                write_root_attrs(f, provenance, start, n_rows, D, layout, clipped)
                write_record(f, make_record(provenance, start=start, n_rows=n_rows, columns=D, layout=layout,
                                            dtype=np_dtype, compression=compression, nnz=nnz,
                                            checksums=digests, names=names,
                                            names_sha256=names_sha, clipped=clipped, obs_sha256=obs_sha))
        sink.check()
    info = {"rows": n_rows, "columns": D, "nnz": nnz, "output": str(output)}
    if clipped is not None:
        info["clipped"] = int(clipped)
    return info


def provenance_items(provenance: dict, start: int, n_rows: int, columns: int, layout: str,
                     clipped: int | None = None) -> dict:
    """rfsgen's provenance of an output, in this order: rfsgen_version, features_file,
    features_sha256, input, rows_start, rows_stop, columns, layout, output_definition
    (``provenance``'s, else :data:`OUTPUT_DEFINITION`: a merge keeps its shards') and
    clipped_values for an EOF output."""
    items = {key: provenance[key] for key in ("rfsgen_version", "features_file", "features_sha256", "input")}
    items.update(rows_start=int(start), rows_stop=int(start + n_rows), columns=int(columns), layout=layout,
                 output_definition=int(provenance.get("output_definition", OUTPUT_DEFINITION)))
    if clipped is not None:
        items["clipped_values"] = int(clipped)
    return items


#: The ``uns`` entry holding the provenance, where anndata users look for it.
UNS_KEY = "rfsgen"


class _first_write_error:
    """On an exception from HDF5, raise the write error the sink recorded first, if
    any: HDF5 carries on past a dropped write (a full disk, a file-size limit) and may
    fail later for a reason that is only its consequence."""

    def __init__(self, sink):
        self.sink = sink

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is not None and issubclass(kind, Exception) and self.sink.error is not None:
            raise self.sink.error from None
        return False


def write_root_attrs(f, provenance: dict, start: int, n_rows: int, columns: int, layout: str,
                     clipped: int | None = None) -> None:
    """rfsgen's provenance (:func:`provenance_items`) at the root, and the same in
    ``uns["rfsgen"]`` (which anndata reads; it ignores root attributes)."""
    items = provenance_items(provenance, start, n_rows, columns, layout, clipped)
    for key, value in items.items():
        f.attrs[key] = value
    write_uns_dict(f, UNS_KEY, items)


def write_record(f, record: dict) -> None:
    """The integrity record, after every other root attribute: an addition to the
    file as it was before records (version 1), which leaves X, obs, var and the other
    attributes as they were."""
    f.attrs[RECORD_ATTR] = canonical_json(record)


def _write_annotations(f, src, start: int, n_rows: int, columns: int, layout: str) -> tuple:
    """What makes the output an AnnData file: encodings, ``obs`` (the input's row
    names for an ``.h5ad`` input, else the row numbers ``start ..``; so shards carry
    their rows' names, and the input's obs columns, :mod:`rfsgen.obs`) and ``var`` (the
    column names, :func:`rfsgen.h5ad.feature_names`).  Returns where the row names came
    from (``"input"`` or ``"numbers"``), their :class:`NamesChecksum` and the obs
    columns' digest (None without columns)."""
    if layout == "dense":
        mark_dense(f["X"])
    mark_root(f)
    names = None
    if src.row_names(start, start) is not None:  # the input has row names
        names = _offset_names(src, start)
    digest = NamesChecksum()
    obs = getattr(src, "obs_columns", None)  # an .h5ad input's obs columns (rfsgen.obs)
    write_index(f, "obs", n_rows, names, first=start, digest=digest,
                columns=[c.name for c in obs.columns] if obs is not None else None)
    obs_sha = obs.write(f["obs"], start, n_rows) if obs is not None else None
    write_index(f, "var", columns, feature_names)
    return ("numbers" if names is None else "input"), digest.hexdigest(), obs_sha


def _offset_names(src, start):
    def names(a, b):
        return src.row_names(start + a, start + b)

    return names


def _overlapped(chunks, put, progress, rows=lambda vals: vals.shape[0]) -> int:
    """Run ``put(row0, values)`` for every chunk in one writer thread, so that writing
    chunk k overlaps computing chunk k + 1 (the compiled loop and numpy release the
    GIL).  Writes stay in order; ``chunks`` must keep each buffer valid for one more
    step (``buffers=2``).  ``rows(values)``: the chunk's rows.  Returns the number of rows."""
    from concurrent.futures import ThreadPoolExecutor

    n_rows = 0
    # On an error the executor still waits for the write in flight before unwinding.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rfsgen-write") as ex:
        pending = None
        for row0, vals in chunks:
            if pending is not None:
                pending.result()  # the buffer of the next chunk is free once this is done
            pending = ex.submit(put, row0, vals)
            m = rows(vals)
            n_rows += m
            if progress:
                progress(m)
        if pending is not None:
            pending.result()
    return n_rows


def _write_dense_placed(f, tr, src, start, stop, dtype, chunk_rows, progress, sink, checksum, name="X") -> int:
    """Dense ``X`` of known size: a contiguous dataset placed up front, whose data area
    is filled directly, without going through h5py's write path.  ``checksum`` (a
    :class:`DataChecksum`, or None) is fed each chunk's values as they are written.

    Where ``os.posix_fallocate`` exists (Linux), the area's disk blocks are reserved
    first (a full disk fails here, before any work, and never as a SIGBUS later) and
    each chunk is computed straight into a memory map of its rows: no copy, and the
    page-cache work is spread over the compiled loop's threads.  The window is
    unmapped after each chunk (once hashed), so resident memory stays bounded by two chunks.
    Elsewhere a writer thread fills the area with ``os.pwrite`` while the next chunk
    is computed.  A ``tr`` with ``copy_into`` (a merge of dense uncompressed shards,
    :class:`rfsgen.merge._RawDense`) fills the area itself.  HDF5 only places the dataset; the file's bytes are the same as
    writing through h5py.
    """
    import os

    import h5py

    n = stop - start
    D = tr.columns
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)  # place the data area now...
    ds = f.create_dataset(name, shape=(n, D), dtype=dtype, track_times=False, dcpl=dcpl,
                          fill_time="never")  # ...without writing zeros into it first
    offset = ds.id.get_offset()
    if not n or not D or offset is None:  # nothing to place: an empty dataset
        return sum(vals.shape[0] for _, vals in tr.chunks(src, chunk_rows, start, stop))
    f.flush()
    sink.check()
    row_bytes = D * np.dtype(dtype).itemsize
    fd = os.open(sink.path, os.O_RDWR)
    try:
        reserved = _reserve(fd, offset, n * row_bytes)
        copy_into = getattr(tr, "copy_into", None)  # a merge of dense shards: their bytes, verified as copied
        if copy_into is not None:
            return copy_into(fd, offset, row_bytes, start, stop, progress)
        fill_placed = getattr(tr, "fill_placed", None)  # other processes write the rows (rfsgen.dask)
        if fill_placed is not None:
            return fill_placed(sink.path, offset, row_bytes, start, stop, progress)
        # A remote engine computes elsewhere: its chunks arrive as arrays and are written.
        if reserved and not getattr(tr, "remote", False):
            return _fill_mapped(fd, offset, row_bytes, tr, src, start, stop, chunk_rows, progress, checksum)

        def put(row0, vals):
            if checksum is not None:
                checksum.dense(vals, row0)
            data = memoryview(vals).cast("B")
            pos = offset + (row0 - start) * row_bytes
            while data:  # pwrite may write less than asked
                k = os.pwrite(fd, data, pos)
                data, pos = data[k:], pos + k

        return _overlapped(tr.chunks(src, chunk_rows, start, stop, buffers=2), put, progress)
    finally:
        os.close(fd)


def fill_rows(path, offset, row_bytes, tr, src, start, a, b, chunk_rows) -> dict:
    """Rows ``a:b`` of ``src`` through ``tr`` written into the placed dense ``X`` of the
    file ``path`` that another process is writing (:func:`_write_dense_placed`, through a
    ``tr`` with ``fill_placed``): row ``r`` at byte ``offset + (r - start) * row_bytes``,
    in chunks of ``chunk_rows`` (None: the default).  Written with ``pwrite``, never
    through a map of the file: ranges meet inside pages, and where several hosts share
    the file (NFS) a mapped page goes back whole, over its other bytes.  ``path`` must
    exist (it is never created: a run that failed and removed it fails here too).
    Returns the rows' data checksum (:meth:`DataChecksum.hexdigests`), to be added to the
    other ranges' (:func:`add_digests`)."""
    import os

    from .inputs import chunk_row_bytes

    if not (start <= a <= b) or row_bytes != tr.columns * np.dtype(tr.dtype).itemsize:
        raise ValueError(f"rows {a}:{b} of a dataset from row {start} with {row_bytes}-byte rows: not this transform's")
    chunk_rows = default_chunk_rows(tr.columns, chunk_row_bytes(tr, src), getattr(tr, "what", ""), chunk_rows)
    sums = DataChecksum("dense", tr.dtype, tr.columns, threads=True)
    fd = os.open(path, os.O_RDWR)
    try:
        def put(row0, vals):
            sums.dense(vals, row0)
            data = memoryview(np.ascontiguousarray(vals)).cast("B")
            pos = offset + (row0 - start) * row_bytes
            while data:  # pwrite may write less than asked
                k = os.pwrite(fd, data, pos)
                data, pos = data[k:], pos + k

        _overlapped(tr.chunks(src, chunk_rows, a, b, buffers=2), put, None)
    finally:
        os.close(fd)
    return sums.hexdigests()


def _reserve(fd, offset, size) -> bool:
    """Reserve the file's blocks for ``size`` bytes at ``offset``.  True when done;
    False where the system cannot (no ``posix_fallocate``, or a file system that
    refuses it), and the caller then writes with ``pwrite``.  A full disk raises."""
    import errno
    import os

    if not hasattr(os, "posix_fallocate"):
        return False
    try:
        os.posix_fallocate(fd, offset, size)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return False
        raise
    return True


def _populator(threads: int, pool):
    """A function that faults a shared file map in, writable, before it is written.

    ``madvise(MADV_POPULATE_WRITE)`` (Linux >= 5.14) does in one call what the first
    write to every page would do (allocate the page-cache page, zero it, map it);
    split over ``threads`` threads this is the largest part of producing a big
    output file, and about twice as fast as faulting page by page.  Where it is not
    available the pages are faulted by the compiled loop as it writes.
    """
    import ctypes

    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return lambda window: None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    MADV_POPULATE_WRITE = 23  # <linux/mman.h>; Python's mmap module does not name it

    def populate(window):
        size = len(window)
        view = (ctypes.c_char * size).from_buffer(window)
        try:
            addr = ctypes.addressof(view)
            cuts = [addr + (size * i // threads) // 4096 * 4096 for i in range(threads)] + [addr + size]
            parts = [(a, b - a) for a, b in zip(cuts, cuts[1:]) if b > a]
            for done in [pool.submit(madvise, a, n, MADV_POPULATE_WRITE) for a, n in parts]:
                done.result()  # -1 (EINVAL on an older kernel) only means no prefaulting
        finally:
            del view

    return populate


def _fill_mapped(fd, offset, row_bytes, tr, src, start, stop, chunk_rows, progress, checksum) -> int:
    """Compute each chunk into a shared memory map of its rows of the file (bytes
    ``offset + (row - start) * row_bytes`` onwards, already allocated).  ``checksum``
    (or None) hashes each chunk in a background thread while the next chunk is
    computed; the chunk's map stays open until then (two chunks mapped at most)."""
    import mmap
    from concurrent.futures import ThreadPoolExecutor, wait

    from ._compiled import threads as thread_count
    from .inputs import chunks_for

    threads = thread_count()
    n_rows = 0
    held = None  # (hashing, window): the previous chunk, hashed while this one is computed
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rfsgen-populate") as pool, \
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="rfsgen-hash") as hasher:
        populate = _populator(threads, pool)
        try:
            for row0, block in chunks_for(src, tr, chunk_rows, start, stop):
                m = block.shape[0]
                first = offset + (row0 - start) * row_bytes
                lo = first - first % mmap.ALLOCATIONGRANULARITY
                window = mmap.mmap(fd, first + m * row_bytes - lo, offset=lo)
                try:
                    populate(window)
                    out = np.frombuffer(window, dtype=tr.dtype, count=m * tr.columns, offset=first - lo)
                    tr.chunk(block, row0, src.name, out=out.reshape(m, tr.columns))
                    held = _release(held)
                    if checksum is not None:  # in the background (the compiled loop has no GIL), mapped till done
                        held = (hasher.submit(checksum.dense, out.reshape(m, tr.columns), row0), window)
                        window = None
                finally:
                    out = None
                    _unmap(window)
                n_rows += m
                if progress:
                    progress(m)
            held = _release(held)
        finally:
            if held is not None:  # an error: the window is unmapped only once its hashing has stopped
                wait([held[0]])
                _unmap(held[1])
    return n_rows


def _release(held) -> None:
    """Wait for a chunk's hashing (``(future, window)`` from :func:`_fill_mapped`, or
    None), then unmap its window.  Returns None."""
    if held is not None:
        try:
            held[0].result()
        finally:
            _unmap(held[1])
    return None


def _unmap(window) -> None:
    if window is None:
        return
    try:
        window.close()
    except BufferError:  # a view is still held (an exception's traceback, a finishing thread): unmapped when freed
        pass


def _write(f, tr, src, start, stop, layout, dtype, compression, chunk_rows, progress, sink, sums, name="X",
           output=None):
    """Write ``X`` (or the matrix at path ``name``); ``sums`` (a :class:`DataChecksum`,
    or None) is fed its rows.  ``output`` names the file in errors (default: the
    sink's path).  Returns ``(rows, nnz)``."""
    D = tr.columns
    # A stream's declared length is placed only once its rows have arrived (a forged
    # header declaring 10^12 rows would otherwise reserve petabytes).
    known = stop is not None and not getattr(src, "declared_only", False)
    n_rows = 0
    nnz = 0
    if layout == "dense":
        if known and compression == "none":
            n_rows = _write_dense_placed(f, tr, src, start, stop, dtype, chunk_rows, progress, sink, sums, name)
        else:
            rows_per_block = max(1, (1 << 20) // max(D, 1))
            kw = {} if compression == "none" else {"compression": compression}
            ds = None

            def create(rows):  # once the chunk is known: whole blocks, or all the rows if fewer
                return f.create_dataset(name, shape=(0, D), maxshape=(None, D), dtype=dtype,
                                        chunks=(max(1, rows), D), track_times=False, **kw)

            pending = np.zeros((0, D), dtype=dtype)
            project = SizeProjection(output or sink.path, stop - start if known else None)
            for row0, vals in tr.chunks(src, chunk_rows, start, stop):
                if sums is not None:
                    sums.dense(vals, row0)
                pending = np.concatenate([pending, vals])
                n_rows += vals.shape[0]
                full = (pending.shape[0] // rows_per_block) * rows_per_block
                if full:  # whole HDF5 chunks only, so bytes do not depend on chunk_rows
                    ds = ds if ds is not None else create(rows_per_block)
                    ds.resize((ds.shape[0] + full, D))
                    ds[-full:] = pending[:full]
                    pending = pending[full:]
                    sink.check()
                    project(ds.shape[0], os.fstat(sink.fileno()).st_size)
                if progress:
                    progress(vals.shape[0])
            ds = ds if ds is not None else create(n_rows)  # fewer rows than a block: a chunk of them all
            if pending.shape[0]:
                ds.resize((ds.shape[0] + pending.shape[0], D))
                ds[-pending.shape[0]:] = pending
        return n_rows, n_rows * D
    g = f.create_group(name, track_order=False)
    index_dtype = np.int32 if D < 2**31 else np.int64
    pairs = _Appender(g, ("data", "indices"), (dtype, index_dtype), compression, sink.check)
    full_indices = np.tile(np.arange(D, dtype=index_dtype), min(chunk_rows, max(1, (1 << 26) // max(D, 1))))
    indptr_parts = [np.zeros(1, dtype=np.int64)]
    project = SizeProjection(output or sink.path, stop - start if known else None)
    pair_bytes = np.dtype(dtype).itemsize + np.dtype(index_dtype).itemsize
    done = [0]

    def put(row0, vals):
        # Each row hashed in the pass that counts or compresses it, while in cache: a
        # pass of its own over the chunk (from memory) cost 4-20% (docs/performance.md).
        d, i, counts = _sparse_parts(vals, full_indices) if sums is None else sums.csr_parts(vals, row0, full_indices)
        add(d, i, counts)

    def put_csr(row0, piece):  # CSR rows as the transformer wrote them (EOF): hashed as they are
        d, i, counts = piece
        if sums is not None:
            ptr = np.zeros(counts.size + 1, dtype=np.int64)
            np.cumsum(counts, out=ptr[1:])
            sums.csr(d, i, ptr, row0)
        add(d, i, counts)

    def add(d, i, counts):
        pairs.add(d, i)
        indptr_parts.append(indptr_parts[-1][-1] + np.cumsum(counts))
        done[0] += counts.size
        # (compressed, the file's size so far; else what the rows hold, pending ones too)
        project(done[0], os.fstat(sink.fileno()).st_size if compression != "none"
                else int(indptr_parts[-1][-1]) * pair_bytes + 8 * done[0])

    # A merge of CSR shards (whose sums are known): their pieces as they are.
    direct = getattr(tr, "csr_chunks", None) if sums is None else None
    if direct is not None:
        for row0, (pieces, counts) in direct(src, chunk_rows, start, stop):
            for d, i in pieces:
                pairs.add(d, i)
            indptr_parts.append(indptr_parts[-1][-1] + np.cumsum(counts))
            n_rows += counts.size
            if progress:
                progress(counts.size)
    elif getattr(tr, "direct_csr", False) and index_dtype == np.int32:  # EOF: no dense chunk (rfsgen.eof)
        n_rows = _overlapped(tr.sparse_chunks(src, chunk_rows, start, stop, buffers=2), put_csr, progress,
                             rows=lambda piece: piece[2].size)
    else:
        n_rows = _overlapped(tr.chunks(src, chunk_rows, start, stop, buffers=2), put, progress)
    nnz = int(indptr_parts[-1][-1])
    pairs.close()
    indptr = np.concatenate(indptr_parts)
    kw = {} if compression == "none" else {"compression": compression}
    g.create_dataset("indptr", data=indptr, track_times=False, **kw)
    mark_csr(g, (n_rows, D))
    return n_rows, nnz


def write_obsm(output, tr, src, adata_path, key: str, *, layout, dtype, compression, chunk_rows, overwrite, inputs,
               progress, provenance: dict) -> dict:
    """A copy of the AnnData file ``adata_path`` (its X, obs, var, layers, ... as they
    are) with every row of ``src`` through ``tr`` added as ``obsm[key]`` (dense, or CSR
    in anndata's encoding) and the provenance as ``uns["rfsgen"][key]``, written
    atomically to ``output``.  The copy is made byte for byte, then extended with
    HDF5; no integrity record (it is not a shard).  Returns a summary dict."""
    import h5py

    from ._signals import deferred
    from .atomic import SafeFile, atomic_path
    from .errors import InputError

    D, n = tr.columns, src.n_rows
    _check_obsm_key(adata_path, key, n)
    from .inputs import chunk_row_bytes

    chunk_rows = default_chunk_rows(tr.columns, chunk_row_bytes(tr, src), getattr(tr, "what", ""), chunk_rows)
    np_dtype = np.dtype(DTYPES[dtype])
    check_space(output, n, D, layout, np_dtype.itemsize, compression, extra=os.path.getsize(adata_path))
    if progress is not None and hasattr(progress, "phase"):
        progress.phase("transform", n)
    with atomic_path(output, overwrite, inputs=inputs) as tmp, SafeFile(tmp) as sink:
        with open(adata_path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                sink.write(block)
        sink.check()
        sink.seek(0)
        try:
            f = h5py.File(sink, "r+")
        except OSError:
            raise InputError(f"{adata_path}: its copy cannot be opened by HDF5 to add obsm['{key}']; the file is "
                             "damaged") from None
        with _first_write_error(sink), f:
            check_obsm_target(f, adata_path, key, n, UNS_KEY)  # again on the copy: the input may have changed
            if "obsm" not in f:  # files written before anndata had obsm
                f.create_group("obsm").attrs.update({"encoding-type": "dict", "encoding-version": "0.1.0"})
            name = f"obsm/{key}"
            n_rows, nnz = _write(f, tr, src, 0, n, layout, np_dtype, compression, chunk_rows, progress, sink, None,
                                 name=name, output=output)  # no integrity record: not a shard
            with deferred():
                if layout == "dense":
                    mark_dense(f[name])
                if "uns" not in f:
                    f.create_group("uns").attrs.update({"encoding-type": "dict", "encoding-version": "0.1.0"})
                if UNS_KEY not in f["uns"]:
                    f["uns"].create_group(UNS_KEY).attrs.update({"encoding-type": "dict", "encoding-version": "0.1.0"})
                write_uns_dict(f, f"{UNS_KEY}/{key}", provenance_items(provenance, 0, n_rows, D, layout))
        sink.check()
    return {"rows": n_rows, "columns": D, "nnz": nnz, "output": str(output), "obsm": key}


def _check_obsm_key(adata_path, key: str, n_rows: int) -> None:
    """Before any work: ``key`` is a name, and the file can take it
    (:func:`rfsgen.h5ad.check_obsm_target`: a name it does not hold yet, in groups of
    the kinds anndata writes)."""
    import h5py

    from .errors import InputError

    if not key or "/" in key or key in (".", ".."):
        raise UsageError(f"--obsm {key!r}: give a name without '/' (for example X_rfsgen)")
    try:
        f = h5py.File(adata_path, "r")
    except OSError:
        raise InputError(f"{adata_path}: not a readable HDF5 file") from None
    with f:
        check_obsm_target(f, adata_path, key, n_rows, UNS_KEY)
