"""Put transform shards back together (``rfsgen merge``).

Shards are outputs of ``rfsgen transform --rows`` / ``--shard`` over one input with one
feature file.  :func:`merge_files` checks that they belong together and cover a
contiguous range of rows exactly once (in any argument order), then writes the merged
file through the same writer as ``rfsgen transform``: it is identical, dataset by
dataset and attribute by attribute, to one transform over the whole range, and byte
for byte where that file's bytes do not depend on how it was written.  With
``virtual=True`` (dense shards) ``X`` is an HDF5 virtual dataset over the shards'
``X`` instead of a copy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import InputError, UsageError
from .inputs import ArraySource, CsrRowsSource, InputSource

#: The root attributes every shard must have (written by ``rfsgen transform``).
SHARD_ATTRS = ("rfsgen_version", "features_file", "features_sha256", "input", "rows_start", "rows_stop", "columns",
               "layout")


@dataclass
class _Shard:
    path: str
    file: object  # open h5py.File
    attrs: dict
    start: int
    stop: int
    dtype: np.dtype
    compression: str

    @property
    def label(self) -> str:
        return f"{self.path} (rows {self.start}:{self.stop})"

    def rows(self) -> InputSource:
        x = self.file["X"]
        if self.attrs["layout"] == "csr":
            return CsrRowsSource(self.path, x.attrs["shape"], x["indptr"], x["data"], x["indices"])
        return ArraySource(x, self.path)

    def names(self, a: int, b: int) -> list:
        ds = self.file["obs"]["_index"]
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in ds[a - self.start:b - self.start]]


def _text(v):
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def _open_shard(path) -> _Shard:
    import h5py

    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such shard; check the path")
    try:
        f = h5py.File(p, "r")
    except OSError:
        raise InputError(f"{path}: not a readable HDF5 file; merge takes files written by 'rfsgen transform'") from None
    try:
        attrs = {}
        for k in SHARD_ATTRS:
            if k not in f.attrs:
                raise InputError(f"{path}: not an rfsgen transform output (no '{k}' attribute); merge takes files "
                                 "written by 'rfsgen transform'")
            attrs[k] = _text(f.attrs[k])
        x = f.get("X")
        layout = attrs["layout"]
        if layout == "csr" and isinstance(x, h5py.Group) and "data" in x:
            dtype, comp = x["data"].dtype, x["data"].compression
        elif layout == "dense" and isinstance(x, h5py.Dataset):
            dtype, comp = x.dtype, x.compression
        else:
            raise InputError(f"{path}: its X does not match its layout '{layout}'; the file is damaged")
        start, stop = int(attrs["rows_start"]), int(attrs["rows_stop"])
        n = int(x.attrs["shape"][0]) if layout == "csr" else int(x.shape[0])
        if n != stop - start or "obs" not in f or f["obs"]["_index"].shape != (n,):
            raise InputError(f"{path}: holds {n} rows but says rows {start}:{stop}; the file is damaged")
        return _Shard(str(path), f, attrs, start, stop, np.dtype(dtype), comp or "none")
    except BaseException:
        f.close()
        raise


def check_shards(shards: list) -> list:
    """Sort ``shards`` by rows and check they belong together and tile their range.
    Each violation is a one-line :class:`InputError` naming the shards."""
    first = shards[0]
    same = (("features_sha256", "come from different feature files", "sample once and transform every shard with it"),
            ("input", "come from different inputs", "merge shards of one input"),
            ("layout", "have different layouts", "transform every shard with the same --layout"),
            ("columns", "have different column counts", "transform every shard with the same feature file"))
    for s in shards[1:]:
        for key, what, fix in same:
            if s.attrs[key] != first.attrs[key]:
                raise InputError(f"{first.path} and {s.path} {what} ({key} {first.attrs[key]!r} vs {s.attrs[key]!r}); "
                                 f"{fix}")
        if s.dtype != first.dtype:
            raise InputError(f"{first.path} and {s.path} have different dtypes ({first.dtype} vs {s.dtype}); "
                             "transform every shard with the same --dtype")
        if s.compression != first.compression:
            raise InputError(f"{first.path} and {s.path} were written with different --compression "
                             f"({first.compression} vs {s.compression})")
    order = sorted(shards, key=lambda s: (s.start, s.stop))
    for a, b in zip(order, order[1:]):
        if os.path.realpath(a.path) == os.path.realpath(b.path):
            raise InputError(f"{a.path} is given twice; give each shard once")
        if b.start > a.stop:
            raise InputError(f"rows {a.stop}:{b.start} are in no shard (between {a.label} and {b.label}); "
                             "add the missing shard")
        if b.start < a.stop:
            raise InputError(f"{a.label} and {b.label} overlap in rows {b.start}:{min(a.stop, b.stop)}; "
                             "give each row range once")
    return order


class _ShardRows(InputSource):
    """The shards' rows in order, numbered as in the input (``rows_start`` onwards)."""

    def __init__(self, shards: list):
        self.shards = shards
        self.name = shards[0].attrs["input"]
        self.width = int(shards[0].attrs["columns"])
        self.n_rows = shards[-1].stop

    def _pieces(self, a, b):
        for s in self.shards:
            lo, hi = max(a, s.start), min(b, s.stop)
            if lo < hi:
                yield s, lo, hi

    def chunks(self, chunk_rows, start=0, stop=None):
        stop = self.n_rows if stop is None else stop
        sources = {}
        for a in range(start, stop, chunk_rows):
            b = min(a + chunk_rows, stop)
            parts = []
            for s, lo, hi in self._pieces(a, b):
                src = sources.setdefault(s.path, s.rows())
                parts.extend(block for _, block in src.chunks(hi - lo, lo - s.start, hi - s.start))
            yield a, parts[0] if len(parts) == 1 else np.concatenate(parts)

    def row_names(self, start, stop):
        out = []
        for s, lo, hi in self._pieces(start, stop):
            out.extend(s.names(lo, hi))
        return out


class _Copy:
    """What :func:`rfsgen.transform.write_output` needs of a transformer, for rows
    that are already features: they are copied as they are."""

    def __init__(self, columns: int, dtype):
        self.columns = columns
        self.dtype = np.dtype(dtype)

    def chunk(self, block, row0=0, source="", out=None):
        if out is None:
            return np.ascontiguousarray(block, dtype=self.dtype)
        out[...] = block
        return out

    def chunks(self, src, chunk_rows, start=0, stop=None, buffers=1):
        for row0, block in src.chunks(chunk_rows, start, stop):
            yield row0, self.chunk(block)


def merge_files(shards, output, *, virtual: bool = False, overwrite: bool = False,
                progress: Callable[[int], None] | None = None, chunk_rows: int | None = None) -> dict:
    """Merge transform shards into ``output`` (see the module docstring).  Returns a
    summary dict (rows, columns, nnz, output, shards, virtual)."""
    from .output import write_output

    if not shards:
        raise UsageError("give the shards to merge")
    opened = []
    try:
        for p in shards:
            opened.append(_open_shard(p))
        order = check_shards(opened)
        first = order[0]
        start, stop = first.start, order[-1].stop
        if virtual:
            if first.attrs["layout"] != "dense":
                raise UsageError("--virtual needs dense shards (--layout dense): a CSR matrix cannot be a virtual "
                                 "dataset, since each shard's indptr must be shifted; merge without --virtual")
            info = _write_virtual(order, output, overwrite)
        else:
            src = _ShardRows(order)
            provenance = {k: first.attrs[k] for k in ("rfsgen_version", "features_file", "features_sha256", "input")}
            copy = _Copy(src.width, first.dtype)
            if any("clipped_values" in s.file.attrs for s in order):  # EOF shards: their clipped values add up
                copy.clipped = sum(int(s.file.attrs.get("clipped_values", 0)) for s in order)
            info = write_output(output, copy, src, start, stop, layout=first.attrs["layout"],
                                dtype=first.dtype.name, compression=first.compression, chunk_rows=chunk_rows,
                                overwrite=overwrite, inputs=list(shards), progress=progress, provenance=provenance,
                                phase="merge")
        info.update(shards=len(order), virtual=virtual)
        return info
    finally:
        for s in opened:
            s.file.close()


def _write_virtual(order, output, overwrite) -> dict:
    import h5py

    from ._signals import deferred
    from .atomic import SafeFile, atomic_path
    from .output import _write_annotations

    first = order[0]
    start, stop = first.start, order[-1].stop
    D = int(first.attrs["columns"])
    src = _ShardRows(order)
    out_dir = Path(os.path.abspath(output)).parent
    layout = h5py.VirtualLayout(shape=(stop - start, D), dtype=first.dtype)
    for s in order:
        if s.stop > s.start:
            # Relative to the merged file's directory, where HDF5 looks when the path
            # does not resolve from the working directory: the directory can move whole.
            rel = os.path.relpath(os.path.abspath(s.path), out_dir)
            layout[s.start - start:s.stop - start] = h5py.VirtualSource(rel, "X", shape=(s.stop - s.start, D))
    with atomic_path(output, overwrite, inputs=[s.path for s in order]) as tmp, SafeFile(tmp) as sink:
        with h5py.File(sink, "w", libver="latest") as f:
            f.create_virtual_dataset("X", layout, fillvalue=np.nan)
            with deferred():
                _write_annotations(f, src, start, stop - start, D, "dense")
                for key in ("rfsgen_version", "features_file", "features_sha256", "input"):
                    f.attrs[key] = first.attrs[key]
                f.attrs["rows_start"] = start
                f.attrs["rows_stop"] = stop
                f.attrs["columns"] = D
                f.attrs["layout"] = "dense"
                f.attrs["virtual_sources"] = [os.path.relpath(os.path.abspath(s.path), out_dir) for s in order]
        sink.check()
    return {"rows": stop - start, "columns": D, "nnz": (stop - start) * D, "output": str(output)}
