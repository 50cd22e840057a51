"""Transform: rows through a feature file into feature columns, in memory or streamed to HDF5.

A feature set's column kind (:mod:`rfsgen.kinds`) computes its columns (:class:`Transformer`
makes the kind's transformer: compositional paths, :class:`rfsgen.paths.Transformer`; EOF
grid cells, :class:`rfsgen.eof.Transformer`); this module streams rows through it into
memory (:func:`transform`) or an HDF5 file (:func:`transform_file`, :mod:`rfsgen.output`).
The output is deterministic from the feature file: identical whatever the chunk size or
thread count, byte-identical across runs.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .errors import FeatureFileError, UsageError
from .features import FeatureSet
# what every kind's transformer shares lives below the kinds; still importable from here
from .featureset import buffered_chunks  # noqa: F401
from .kinds import of as kind_of
from .output import DTYPES, _check_options, _sparse_parts, default_chunk_rows, file_sha256, resolve_layout, write_output


class Transformer:
    """Evaluates a :class:`FeatureSet` on chunks of rows: ``Transformer(fs, dtype)`` is the
    transformer of the set's column kind (:meth:`rfsgen.featureset.ColumnKind.transformer`;
    compositional paths: :class:`rfsgen.paths.Transformer`), with ``columns``, ``dtype``,
    ``row_bytes``, ``what``, :meth:`chunk` (float ``(m, width)`` rows to a C-ordered ``(m, D)``
    array of ``dtype``) and :meth:`chunks`.  ``device``: ``cpu`` or ``cuda`` (resolved,
    :func:`resolve_device`): where the kind computes what it can on a GPU, the same bits."""

    def __new__(cls, fs: FeatureSet, dtype=np.float32, device="cpu"):
        return kind_of(fs).transformer(fs, dtype, device)


def _remote_device(device: str) -> tuple[str, str]:
    """``(device, note)`` for a computation on other machines (Dask workers): ``device``
    checked here, resolved by each worker (:func:`resolve_device`), where a GPU may be
    that this process lacks; any mix gives the same bytes."""
    from ._cuda import DEVICES
    from .errors import DeviceError

    if device not in DEVICES:
        raise DeviceError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    return device, "cpu" if device == "cpu" else f"{device} (resolved on each Dask worker)"


def resolve_device(device: str) -> tuple[str, str]:
    """``(cpu|cuda, note)`` for ``device`` ``cpu``, ``cuda`` or ``auto`` (:func:`rfsgen._cuda.resolve`;
    numba's CUDA target is imported only for ``cuda`` and ``auto``).  ``cuda`` without a GPU:
    :class:`rfsgen.errors.DeviceError`."""
    if device == "cpu":
        return "cpu", "cpu"
    from . import _cuda

    return _cuda.resolve(device)


def transform(fs: FeatureSet, x, *, layout: str = "auto", dtype="float32", chunk_rows: int | None = None,
              progress: Callable[[int], None] | None = None, layer: str | None = None, device: str = "cpu"):
    """Transform rows in memory: ``scipy.sparse.csr_matrix`` (layout ``csr``) or ndarray (``dense``;
    ``auto``, the default: the one the ``transform`` command's ``--layout auto`` writes for ``fs``,
    :func:`rfsgen.output.auto_layout`: dense when at least half its columns are almost surely non-zero).

    ``x`` is an array ``(m, width)`` or anything :func:`rfsgen.inputs.open_input` takes,
    an ``anndata.AnnData`` among them (its X, or ``layers[layer]``; backed X too).

    ``device``: ``cpu`` (the default), ``cuda`` (gaussian and laplace atoms and the products into
    columns on a GPU, the same bytes; :mod:`rfsgen._cuda` says what runs where) or ``auto`` (``cuda`` where numba finds a GPU).
    """
    from .inputs import check_width, chunk_row_bytes, chunks_for, open_input

    _check_options(layout, dtype, "none")
    device, _ = resolve_device(device)
    layout = resolve_layout(layout, fs)
    tr = Transformer(fs, DTYPES[dtype], device)
    if chunk_rows is not None:
        chunk_rows = default_chunk_rows(fs.columns, tr.row_bytes, tr.what, chunk_rows)
    with open_input(x, layer=layer) as src:
        check_width(src, fs.skeleton.width, fs.skeleton.path, fs.skeleton.shape, **_bound_by(fs, "the feature set", src))
        if chunk_rows is None:  # (CSR rows read as CSR: more rows a chunk for the same bytes)
            chunk_rows = default_chunk_rows(fs.columns, chunk_row_bytes(tr, src), tr.what, None)
        D = fs.columns
        if layout == "dense" and src.n_rows is not None:
            out = np.empty((src.n_rows, D), dtype=DTYPES[dtype])
            for row0, block in chunks_for(src, tr, chunk_rows):
                tr.chunk(block, row0, src.name, out=out[row0:row0 + block.shape[0]])
                if progress:
                    progress(block.shape[0])
            return out
        if layout == "csr" and src.n_rows is not None:
            return _csr_known_rows(tr, src, chunk_rows, progress)
        parts = []
        direct = layout == "csr" and getattr(tr, "direct_csr", False)  # EOF: CSR rows written straight (rfsgen.eof)
        for _, piece in tr.sparse_chunks(src, chunk_rows) if direct else ():
            parts.append(tuple(a.copy() for a in piece))
            if progress:
                progress(piece[2].size)
        for _, vals in tr.chunks(src, chunk_rows) if not direct else ():
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

    from .output import compress_into

    n, D = src.n_rows, tr.columns
    if getattr(tr, "direct_csr", False):  # EOF: CSR rows written straight, at most T a row (rfsgen.eof)
        return _csr_direct(tr, src, chunk_rows, progress)
    data = np.empty(n * D, dtype=tr.dtype)
    indices = np.empty(n * D, dtype=np.int32 if D < 2**31 else np.int64)
    indptr = np.zeros(n + 1, dtype=np.int64)
    nnz = 0
    for row0, vals in tr.chunks(src, chunk_rows):
        m = vals.shape[0]
        counts = np.empty(m, dtype=np.int64)
        nnz += compress_into(vals, data[nnz:], indices[nnz:], counts)  # on every thread
        np.cumsum(counts, out=indptr[row0 + 1:row0 + m + 1])
        indptr[row0 + 1:row0 + m + 1] += indptr[row0]
        if progress:
            progress(m)
    if nnz < 0.9 * data.size:  # release the unused tail
        data, indices = data[:nnz].copy(), indices[:nnz].copy()
    return sp.csr_matrix((data[:nnz], indices[:nnz], indptr), shape=(n, D))


def _csr_direct(tr, src, chunk_rows, progress):
    """:func:`_csr_known_rows` for a transformer that writes CSR rows itself (``tr.csr_rows``,
    at most ``tr.max_row_nonzeros`` a row): each chunk's rows go straight into arrays sized
    for that many, trimmed at the end.  The same arrays as compressing dense chunks."""
    import scipy.sparse as sp

    from .inputs import chunks_for

    n, D, T = src.n_rows, tr.columns, tr.max_row_nonzeros
    data = np.empty(n * T, dtype=tr.dtype)
    indices = np.empty(n * T, dtype=np.int32)
    indptr = np.zeros(n + 1, dtype=np.int64)
    counts = np.empty(min(n, max(1, chunk_rows)), dtype=np.int64)
    nnz = 0
    for row0, block in chunks_for(src, tr, chunk_rows):
        m = block.shape[0]
        if counts.size < m:
            counts = np.empty(m, dtype=np.int64)
        nnz += tr.csr_rows(block, data[nnz:], indices[nnz:], counts, row0, src.name)
        np.cumsum(counts[:m], out=indptr[row0 + 1:row0 + m + 1])
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
                   engine=None, obsm=None, layer=None, device="cpu") -> dict:
    """Stream ``input`` rows through the feature file ``features`` into HDF5 ``output``.

    Memory is bounded by the chunk; the output is written to a temporary file and
    renamed on success.  ``layout``: ``csr``, ``dense``, or ``auto`` (the default: the
    one :func:`rfsgen.output.auto_layout` picks from the feature file).  ``rows`` (``"START:STOP"``) or ``shard`` (``"K/N"``, see
    :func:`rfsgen.inputs.shard_rows`) select part of the input.  Returns a summary dict
    (rows, columns, nnz, output).  ``engine(fs, dtype, device)``, if given, makes what
    computes the chunks in place of a :class:`Transformer` (``rfsgen.dask`` passes one
    that runs them on a cluster, each worker resolving ``device`` itself); the output is
    the same.

    ``obsm`` (an ``.h5ad`` input): the output is a copy of the input AnnData file with
    the features of every row added as ``obsm[obsm]`` (:func:`rfsgen.output.write_obsm`).
    ``layer``: with an ``.h5ad`` path, read ``layers[layer]`` instead of X.
    ``device``: as :func:`transform`'s, resolved before anything is opened; the summary's
    ``device`` says which was used and why (``cpu``, ``cuda``, ``cpu (--device auto: ...)``).
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
    if engine is None:
        device, device_note = resolve_device(device)
    else:  # a cluster's workers compute: each resolves the device where it runs
        device, device_note = _remote_device(device)
    adata_path = _obsm_input(input, obsm, rows, shard) if obsm is not None else None
    try:
        fs = load(features)
    except FeatureFileError as e:
        raise _swapped(features, input) or e from None
    layout = resolve_layout(layout, fs)
    tr = engine(fs, DTYPES[dtype], device) if engine is not None else Transformer(fs, DTYPES[dtype], device)
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

            info = write_obsm(output, tr, src, adata_path, obsm, layout=layout, dtype=dtype,
                              compression=compression, chunk_rows=chunk_rows, overwrite=overwrite,
                              inputs=[features, input], progress=progress, provenance=provenance)
        else:
            info = write_output(output, tr, src, start, stop, layout=layout, dtype=dtype, compression=compression,
                                chunk_rows=chunk_rows, overwrite=overwrite, inputs=[features, input],
                                progress=progress, provenance=provenance)
    info["device"] = device_note
    return info
