"""Transform: rows through a feature file into feature columns, in memory or streamed to HDF5.

Every column is ``scale_j * exp(L_j(x)) * cos(theta_j(x) + b_j)`` where

* ``theta = A(x) @ P``: ``A`` holds the angle of every distinct *atom* (an input
  node with a code, or one continuous omega) on each row, ``P`` (sparse, atoms x
  D) the integer powers of each column's terms -- one sparse-times-dense product
  per chunk turns per-node angles into feature phases;
* ``L = M(x) @ Pm``: the same for log-magnitudes, only for atoms whose factor is
  not of unit modulus (sphere);
* gaussian/laplace angles are one BLAS product per node over its columns.

The output is deterministic from the feature file: identical whatever the chunk
size, byte-identical across runs.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import scipy.sparse as sp

from .errors import UsageError
from .features import FeatureSet
from .kernel import prepare_inputs
from .skeleton import InputNode

DTYPES = {"float32": np.float32, "float64": np.float64}
LAYOUTS = ("csr", "dense")
COMPRESSIONS = ("none", "gzip", "lzf")


@dataclass
class _GroupAtoms:
    group: int  # index into skeleton.input_groups
    atoms: np.ndarray  # int64 atom indices (columns of A)
    gi: np.ndarray  # node index within the group
    codes: np.ndarray  # codes, or (a, width) omega rows for continuous bases
    mag: np.ndarray | None  # positions (columns of M) of these atoms, if the base has magnitudes


class Transformer:
    """Evaluates a :class:`FeatureSet` on chunks of rows.

    Build once per feature set; :meth:`chunk` maps float ``(m, width)`` rows to
    a float ``(m, D)`` array of dtype ``dtype``.
    """

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
        lengths = np.diff(fs.ptr)
        col = np.repeat(np.arange(fs.columns), lengths)
        node, code, power = fs.node, fs.code, fs.power
        is_cont = cont[node] if node.size else np.zeros(0, dtype=bool)
        # Integer terms share atoms (node, code); continuous terms are atoms of their own.
        ti = np.flatnonzero(~is_cont)
        span = int(code[ti].max()) + 1 if ti.size else 1
        uniq, inv = np.unique(node[ti] * span + code[ti], return_inverse=True)
        a_node = np.concatenate([uniq // span, node[is_cont]])
        a_code = np.concatenate([uniq % span, code[is_cont]])
        term_atom = np.empty(node.size, dtype=np.int64)
        term_atom[ti] = inv.ravel()
        term_atom[is_cont] = uniq.size + np.arange(int(is_cont.sum()))
        n_atoms = a_node.size
        self.P = sp.csr_matrix(
            (power.astype(np.float64), (term_atom, col)), shape=(n_atoms, fs.columns)
        )
        self.groups: list[_GroupAtoms] = []
        mag_atoms = []
        for g, (base, _, _) in enumerate(skel.input_groups):
            atoms = np.flatnonzero(group_of[a_node] == g)
            if not atoms.size:
                continue
            gi = index_in_group[a_node[atoms]]
            if base.continuous:
                w = base.width
                codes = fs.omega[a_code[atoms][:, None] + np.arange(w)[None, :]]
            else:
                codes = a_code[atoms]
            has_mag = base.name == "sphere"
            mag = None
            if has_mag:
                mag = np.arange(len(mag_atoms), len(mag_atoms) + atoms.size)
                mag_atoms.extend(atoms.tolist())
            self.groups.append(_GroupAtoms(g, atoms, gi, codes, mag))
        self.n_atoms = n_atoms
        mag_atoms = np.array(mag_atoms, dtype=np.int64)
        self.n_mag = mag_atoms.size
        # Work in the output precision: powers are small integers, exact in float32.
        wd = np.float32 if self.dtype == np.float32 else np.float64
        self.work = wd
        self.PT = self.P.T.tocsr().astype(wd)
        # Log-magnitude powers over all D columns (rows of zeros give exp(0) = 1), so the
        # magnitudes multiply in place.
        self.PmT = self.P[mag_atoms].T.tocsr().astype(wd) if mag_atoms.size else None
        self.phase = np.where(fs.kind == 2, math.pi / 2, 0.0).astype(wd)[:, None]
        self.scale = fs.scale.astype(wd)[:, None]

    @property
    def columns(self) -> int:
        return self.fs.columns

    def chunk(self, x: np.ndarray, row0: int = 0, source: str = "<array>") -> np.ndarray:
        """Feature values for rows ``x`` (float ``(m, width)``) as ``(m, D)`` of ``self.dtype``.

        Computed feature-major (D x m), where the sparse products and the in-place
        cos/exp are cheapest, then transposed in cache-sized tiles.
        """
        xp = prepare_inputs(self.skeleton, x, row0, source)
        m = x.shape[0]
        ang_t = np.zeros((self.n_atoms, m))
        log_t = np.zeros((self.n_mag, m)) if self.PmT is not None else None
        for ga in self.groups:
            base = self.skeleton.input_groups[ga.group][0]
            ang, mag = base.atoms(xp[ga.group], ga.gi, ga.codes)
            ang_t[ga.atoms] = ang.T
            if ga.mag is not None:
                log_t[ga.mag] = mag.T
        if self.work == np.float32:
            # Reduce angles to [-pi, pi] in float64 before rounding them to float32.
            ang_t -= (2 * math.pi) * np.rint(ang_t * (1 / (2 * math.pi)))
        theta = self.PT @ ang_t.astype(self.work)  # (D, m): one sparse-times-dense product
        theta += self.phase
        np.cos(theta, out=theta)
        if self.PmT is not None:
            with np.errstate(invalid="ignore"):
                lm = self.PmT @ log_t.astype(self.work)
            np.exp(lm, out=lm)
            theta *= lm
        theta *= self.scale
        return _transpose(theta, self.dtype)


def _transpose(a: np.ndarray, dtype, block: int = 256) -> np.ndarray:
    """``a.T`` as a C-contiguous array of ``dtype``, copied in square tiles (cache-friendly)."""
    out = np.empty((a.shape[1], a.shape[0]), dtype=dtype)
    for i in range(0, a.shape[0], block):
        for j in range(0, a.shape[1], block):
            out[j:j + block, i:i + block] = a[i:i + block, j:j + block].T
    return out


def transform(fs: FeatureSet, x, *, layout: str = "csr", dtype="float32", chunk_rows: int | None = None,
              progress: Callable[[int], None] | None = None):
    """Transform rows in memory: ``scipy.sparse.csr_matrix`` (layout ``csr``) or ndarray (``dense``).

    ``x`` is an array ``(m, width)`` or anything :func:`rfsgen.io.open_input` takes.
    """
    from .io import check_width, open_input

    _check_options(layout, dtype, "none")
    tr = Transformer(fs, DTYPES[dtype])
    chunk_rows = chunk_rows or default_chunk_rows(fs.columns)
    with open_input(x) as src:
        check_width(src, fs.skeleton.width, fs.skeleton.path, fs.skeleton.shape)
        parts = []
        for row0, block in src.chunks(chunk_rows):
            vals = tr.chunk(block, row0, src.name)
            parts.append(sp.csr_matrix(vals) if layout == "csr" else vals)
            if progress:
                progress(block.shape[0])
    if layout == "csr":
        if not parts:
            return sp.csr_matrix((0, fs.columns), dtype=DTYPES[dtype])
        return sp.vstack(parts, format="csr")
    return np.concatenate(parts) if parts else np.zeros((0, fs.columns), DTYPES[dtype])


def default_chunk_rows(columns: int) -> int:
    """About 64 MiB of float64 work per chunk, between 16 and 8192 rows."""
    return int(min(8192, max(16, (64 << 20) // (8 * max(columns, 1)))))


def _check_options(layout, dtype, compression):
    if layout not in LAYOUTS:
        raise UsageError(f"--layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if compression not in COMPRESSIONS:
        raise UsageError(f"--compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")


# ----------------------------------------------------------------------------- HDF5 output
class _Appender:
    """Appends to a resizable 1-D dataset in fixed blocks, so the file's bytes depend
    only on the data written, never on how the caller chunked it."""

    def __init__(self, group, name, dtype, block, compression):
        self.block = block
        kw = {} if compression == "none" else {"compression": compression}
        self.ds = group.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dtype, chunks=(block,),
                                       track_times=False, **kw)
        self.buf = []
        self.buffered = 0
        self.size = 0

    def add(self, a):
        if a.size:
            self.buf.append(a)
            self.buffered += a.size
        if self.buffered >= self.block:
            data = np.concatenate(self.buf)
            full = (data.size // self.block) * self.block
            self._write(data[:full])
            rest = data[full:]
            self.buf = [rest] if rest.size else []
            self.buffered = rest.size

    def _write(self, data):
        if not data.size:
            return
        self.ds.resize((self.size + data.size,))
        self.ds[self.size:self.size + data.size] = data
        self.size += data.size

    def close(self):
        if self.buf:
            self._write(np.concatenate(self.buf))
        self.buf = []


def transform_file(features, input, output, *, layout="csr", dtype="float32", compression="none",
                   chunk_rows=None, rows=None, overwrite=False, progress=None, stdin=None) -> dict:
    """Stream ``input`` rows through the feature file ``features`` into HDF5 ``output``.

    Memory is bounded by the chunk; the output is written to a temporary file and
    renamed on success.  Returns a summary dict (rows, columns, nnz, output).
    """
    import h5py

    from . import __version__
    from .features import load
    from .io import atomic_path, check_width, open_input, parse_rows

    _check_options(layout, dtype, compression)
    if chunk_rows is not None and chunk_rows < 1:
        raise UsageError(f"--chunk-rows must be at least 1, got {chunk_rows}")
    start, stop = parse_rows(rows)
    fs = load(features)
    sha = hashlib.sha256()
    with open(features, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    tr = Transformer(fs, DTYPES[dtype])
    chunk_rows = chunk_rows or default_chunk_rows(fs.columns)
    np_dtype = np.dtype(DTYPES[dtype])
    D = fs.columns
    with open_input(input, stdin=stdin) as src:
        check_width(src, fs.skeleton.width, fs.skeleton.path, fs.skeleton.shape)
        if src.n_rows is not None:
            stop = src.n_rows if stop is None else min(stop, src.n_rows)
            if start > src.n_rows:
                raise UsageError(f"--rows starts at {start} but {src.name} has {src.n_rows} rows")
        with atomic_path(output, overwrite) as tmp:
            with h5py.File(tmp, "w", libver="earliest") as f:
                n_rows, nnz = _write(f, tr, src, start, stop, layout, np_dtype, compression, chunk_rows, progress)
                f.attrs["rfsgen_version"] = __version__
                f.attrs["features_file"] = str(features)
                f.attrs["features_sha256"] = sha.hexdigest()
                f.attrs["input"] = src.name
                f.attrs["rows_start"] = start
                f.attrs["rows_stop"] = start + n_rows
                f.attrs["columns"] = D
                f.attrs["layout"] = layout
    return {"rows": n_rows, "columns": D, "nnz": nnz, "output": str(output)}


def _write(f, tr, src, start, stop, layout, dtype, compression, chunk_rows, progress):
    D = tr.columns
    known = stop is not None
    n_rows = 0
    nnz = 0
    if layout == "dense":
        if known and compression == "none":
            ds = f.create_dataset("X", shape=(stop - start, D), dtype=dtype, track_times=False)
            for row0, block in src.chunks(chunk_rows, start, stop):
                ds[row0 - start:row0 - start + block.shape[0]] = tr.chunk(block, row0, src.name)
                n_rows += block.shape[0]
                if progress:
                    progress(block.shape[0])
        else:
            rows_per_block = max(1, (1 << 20) // max(D, 1))
            kw = {} if compression == "none" else {"compression": compression}
            ds = f.create_dataset("X", shape=(0, D), maxshape=(None, D), dtype=dtype,
                                  chunks=(rows_per_block, D), track_times=False, **kw)
            pending = np.zeros((0, D), dtype=dtype)
            for row0, block in src.chunks(chunk_rows, start, stop):
                pending = np.concatenate([pending, tr.chunk(block, row0, src.name)])
                n_rows += block.shape[0]
                full = (pending.shape[0] // rows_per_block) * rows_per_block
                if full:  # whole HDF5 chunks only, so bytes do not depend on chunk_rows
                    ds.resize((ds.shape[0] + full, D))
                    ds[-full:] = pending[:full]
                    pending = pending[full:]
                if progress:
                    progress(block.shape[0])
            if pending.shape[0]:
                ds.resize((ds.shape[0] + pending.shape[0], D))
                ds[-pending.shape[0]:] = pending
        return n_rows, n_rows * D
    g = f.create_group("X", track_order=False)
    block = 1 << 20
    index_dtype = np.int32 if D < 2**31 else np.int64
    data = _Appender(g, "data", dtype, block, compression)
    indices = _Appender(g, "indices", index_dtype, block, compression)
    indptr_parts = [np.zeros(1, dtype=np.int64)]
    for row0, blk in src.chunks(chunk_rows, start, stop):
        vals = tr.chunk(blk, row0, src.name)
        r, c = np.nonzero(vals)
        data.add(vals[r, c])
        indices.add(c.astype(index_dtype))
        counts = np.bincount(r, minlength=vals.shape[0])
        indptr_parts.append(nnz + np.cumsum(counts))
        nnz += int(r.size)
        n_rows += blk.shape[0]
        if progress:
            progress(blk.shape[0])
    data.close()
    indices.close()
    indptr = np.concatenate(indptr_parts)
    kw = {} if compression == "none" else {"compression": compression}
    g.create_dataset("indptr", data=indptr, track_times=False, **kw)
    g.attrs["encoding-type"] = "csr_matrix"
    g.attrs["encoding-version"] = "0.1.0"
    g.attrs["shape"] = np.array([n_rows, D], dtype=np.int64)
    return n_rows, nnz
