"""Put transform shards back together (``rfsgen merge``), trusting nothing in them.

Shards are outputs of ``rfsgen transform --rows`` / ``--shard`` over one input with one
feature file.  Each carries an integrity record (:mod:`rfsgen.output`): its provenance,
row range, dtype, layout, shape, the checksums of its data and row names, sealed.
:func:`merge_files` verifies every shard against it, and the shards against each
other, then writes the merged file through the same writer as ``rfsgen transform``: it
is identical, byte for byte, to one transform over the whole range, record included.
With ``virtual=True`` (dense shards) ``X`` is an HDF5 virtual dataset over the shards'
``X`` instead of a copy.

What is verified, and when:

* before any file is created: that each shard is a regular file, an HDF5 file of the
  output kind (exactly the groups, datasets and links rfsgen writes; no external,
  soft or virtual links, no external storage, only the filters rfsgen uses), the type
  of every attribute read and the dtype and shape of every dataset, dataset sizes
  against the file's real size, the record (present, canonical, sealed, equal to the
  attributes and to the datasets), the same feature file, input, columns, dtype,
  layout, compression, rfsgen version and kind of row names across shards, row ranges
  that meet with no gap or overlap (shards are sorted by ``rows_start``: the order on
  the command line does not matter), the row names' checksums, and the memory the
  merge needs against the budget (:mod:`rfsgen.budget`);
* as the data is copied, into a temporary file that is removed when a check fails:
  the data's checksums (a flipped bit anywhere in ``X`` is found), NaN and infinities,
  and (CSR) the index structure.  The data is read and hashed once: the merged
  file's checksums are the sums of its shards' (:data:`rfsgen.output.CHECKSUM`), so
  the output is never hashed again.  Uncompressed shards (record version 2) are read
  by position from their files into merge's own buffers (:class:`_RawDense`,
  :class:`_CSRChunks`), not through HDF5: the bytes verified are the bytes written.
  Nothing that fails a check ever becomes the output, and no temporary file remains.
* throughout: that no shard shrinks (another program truncating it) while it is read:
  its size is compared with the size checked after each read, and a shrink is an
  :class:`~rfsgen.errors.InputChangedError` naming the shard (exit code 1).

The shards are only read, except that ``merge_files(consume=True)`` (the Dask engine's
own shards, removed when its run ends) frees each shard's data once it is in merge's
buffers (:class:`_Spent`), after every check made before the copy; the checks made as
it is copied run on those buffers, so none is lost.

Shards with a record of version 1 (:data:`rfsgen.output.CHECKSUM_V1`) are verified by
that checksum, and merge, alone or with newer shards, into an output with a current
record.  Shards written before the record existed are refused, with the advice to
re-create them.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import InputChangedError, InputError, RfsgenError, UsageError

#: The root attributes every shard must have (written by ``rfsgen transform``).
SHARD_ATTRS = ("rfsgen_version", "features_file", "features_sha256", "input", "rows_start", "rows_stop", "columns",
               "layout")
_TEXT_ATTRS = ("rfsgen_version", "features_file", "features_sha256", "input", "layout")
_INT_ATTRS = ("rows_start", "rows_stop", "columns")
#: The members of an output's root group, and of its groups.
_ROOT = {"X", "obs", "var", "layers", "obsm", "obsp", "uns", "varm", "varp"}
_EMPTY = ("layers", "obsm", "obsp", "uns", "varm", "varp")
_CSR = {"data", "indices", "indptr"}
#: HDF5 filters rfsgen writes: deflate (gzip) and lzf.
_FILTERS = {"none": set(), "gzip": {1}, "lzf": {32000}}
#: An attribute larger than this is not rfsgen's (the record is about 1 KiB).
_MAX_ATTR = 1 << 20
#: No deflate stream expands more than 1032 times; lzf much less.
_MAX_RATIO = 1100
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")
_REFUSE = "merge takes files written by 'rfsgen transform'"


def _damaged(path, what: str) -> InputError:
    return InputError(f"{path}: {what}; the shard is damaged or not rfsgen's; re-create it with 'rfsgen transform'")


def _check_size(s, fd: int) -> None:
    """Raise :class:`InputChangedError` when the shard ``s`` (open as ``fd``) is now
    shorter than the file its checks were made on (another program truncated it)."""
    try:
        size = os.fstat(fd).st_size
    except OSError:  # not seen on a descriptor HDF5 holds open; a read then fails and is named
        return
    if size < s.size:
        raise _shrank(s, size)


def _shrank(s, size: int) -> InputChangedError:
    return InputChangedError(f"{s.path}: shrank from {s.size} to {size} bytes while it was being merged (another "
                             "program truncated or rewrote it); nothing was written; merge again once the shard is "
                             "complete and nothing writes it")


def _pread(s, fd: int, out: memoryview, offset: int, where: str) -> None:
    """Fill ``out`` (writable bytes) from byte ``offset`` of shard ``s``'s file (open
    as ``fd``; read by position, so HDF5's own reads of it are not disturbed).  A read
    that ends early is the file shrinking: :class:`InputChangedError` naming it."""
    pos = offset
    while out:
        try:
            k = os.preadv(fd, [out], pos)
        except OSError as e:
            _check_size(s, fd)
            raise _damaged(s.path, f"'{where}' cannot be read at byte {pos} ({e.strerror})") from None
        if not k:  # its end, which its checks placed after these bytes
            _check_size(s, fd)
            raise _shrank(s, pos)  # and grown back since
        out, pos = out[k:], pos + k


#: fallocate(2)'s mode that frees a byte range's storage and keeps the file's size:
#: FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (<linux/falloc.h>; Python's os does not name it).
_PUNCH_HOLE = 0x02 | 0x01


def _fallocate():
    """libc's ``fallocate`` (Linux), or None where there is none."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


class _Spent:
    """Frees the storage of a shard's data bytes once merge has read them into its own
    buffers (``merge_files(consume=True)``: the Dask engine's shards, in a run directory
    removed when the run ends).  Those bytes are never read from the shard again: they
    are hashed and written from the buffers, so no check changes.  What it saves is
    the second copy: without it a merge holds every shard and the output at once (for
    a 1.6 GB CSR output, 3.2 GB of page cache to fill and write back), with it the
    output takes over the shards' memory as it grows, and shard bytes not yet written
    back never reach the disk.  Best effort: where the system cannot (not Linux, a file
    system without holes, a shard not writable here) the shard is left as it is."""

    fn = None  # _fallocate(), looked up once

    def __init__(self, s: "_Shard"):
        self.fd = None
        if _Spent.fn is None:
            _Spent.fn = _fallocate() or False
        if not _Spent.fn:
            return
        try:
            fd = os.open(s.path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return
        try:
            mine, checked = os.fstat(fd), os.fstat(s.fd)
        except OSError:
            os.close(fd)
            return
        if (mine.st_dev, mine.st_ino) != (checked.st_dev, checked.st_ino):  # the path names another file now
            os.close(fd)
            return
        self.fd = fd
        # A forged chunk index may place data over the row pointer, which is read after
        # the chunks before it are freed: that range is never freed (the shard would then
        # be refused for a pointer it does not hold, not for its own fault).
        self.keep = None
        if s.layout == "csr":
            ptr = s.file["X/indptr"].id
            start = ptr.get_offset()
            if start is not None:
                self.keep = (start, start + ptr.get_storage_size())

    def __call__(self, offset: int, size: int) -> None:
        if self.fd is None or size <= 0:
            return
        if self.keep is not None and offset < self.keep[1] and self.keep[0] < offset + size:
            return
        if _Spent.fn(self.fd, _PUNCH_HOLE, offset, size) != 0:  # EOPNOTSUPP and the like: stop trying
            self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass
class _Shard:
    path: str
    file: object  # open h5py.File
    attrs: dict
    record: dict
    start: int
    stop: int
    dtype: np.dtype
    compression: str
    names: list = field(default_factory=list)
    obs_columns: list = field(default_factory=list)  # rfsgen.obs.Column, from the shard's obs
    obs: object = None  # rfsgen.obs.ObsColumns of its rows, read and verified by _verify_names
    size: int = 0  # the file's size its checks were made on (a shrink while it is read is named)
    spent: "_Spent | None" = None  # merge_files(consume=True): gives back the storage of bytes read

    @property
    def fd(self) -> int:
        """The descriptor HDF5 reads the shard through: reads by position read the file
        that was checked, whatever its path names now."""
        return self.file.id.get_vfd_handle()

    @property
    def label(self) -> str:
        return f"{self.path} (rows {self.start}:{self.stop})"

    @property
    def layout(self) -> str:
        return self.attrs["layout"]

    @property
    def columns(self) -> int:
        return self.attrs["columns"]


# ----------------------------------------------------------------------------- one shard
def _attr(path, obj, key: str, where: str = ""):
    """The attribute ``key`` of ``obj``, its stored size checked before it is read."""
    size = obj.attrs.get_id(key).get_storage_size()
    if size > _MAX_ATTR:
        raise _damaged(path, f"attribute '{where}{key}' holds {size} bytes")
    return obj.attrs[key]


def _text(path, v, key: str) -> str:
    if isinstance(v, bytes):
        try:
            v = v.decode("utf-8")
        except UnicodeDecodeError:
            raise _damaged(path, f"attribute '{key}' is not UTF-8 text") from None
    if not isinstance(v, str):
        raise _damaged(path, f"attribute '{key}' is {_show(v)}, not text")
    return v


def _integer(path, v, key: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise _damaged(path, f"attribute '{key}' is {_show(v)}, not an integer")
    return int(v)


def _show(v) -> str:
    text = repr(v.item() if isinstance(v, np.generic) else v)
    return text if len(text) <= 40 else text[:37] + "..."


def _link(path, group, name: str, where: str):
    """Member ``name`` of ``group``, which must be a hard link (an object in this file)."""
    import h5py

    link = group.get(name, getlink=True)
    if link is None:
        raise _damaged(path, f"has no '{where}'")
    if not isinstance(link, h5py.HardLink):
        kind = "an external link" if isinstance(link, h5py.ExternalLink) else "a soft link"
        raise _damaged(path, f"'{where}' is {kind}, not data in the file (a merge never follows links)")
    return group[name]


def _members(path, group, want: set, where: str) -> None:
    have = set(group.keys())
    if have != want:
        extra, missing = sorted(have - want), sorted(want - have)
        what = (f"has unexpected members {extra}" if extra else "") + (" and " if extra and missing else "") + (
            f"lacks {missing}" if missing else "")
        raise _damaged(path, f"'{where}' {what}")


def _dataset(path, obj, where: str, dtype, shape, compression: str, file_size: int):
    """Check that ``obj`` is a dataset rfsgen could have written: kind, dtype, shape,
    storage inside the file, filters, and a stored size that fits the file's size."""
    import h5py

    from . import budget

    if not isinstance(obj, h5py.Dataset):
        raise _damaged(path, f"'{where}' is a group, not a dataset")
    if obj.is_virtual:
        raise _damaged(path, f"'{where}' is a virtual dataset (reads other files); merge the original shards")
    dcpl = obj.id.get_create_plist()
    if dcpl.get_external_count():
        raise _damaged(path, f"'{where}' keeps its data in external files (HDF5 external storage)")
    if obj.dtype != np.dtype(dtype):
        raise _damaged(path, f"'{where}' has dtype {obj.dtype}, expected {np.dtype(dtype).str} ({np.dtype(dtype)})")
    if tuple(obj.shape) != tuple(shape):
        raise _damaged(path, f"'{where}' has shape {tuple(obj.shape)}, but its record says {tuple(shape)}")
    filters = {dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters())}
    if filters != _FILTERS[compression]:
        raise _damaged(path, f"'{where}' has HDF5 filters {sorted(filters)}, expected {sorted(_FILTERS[compression])} "
                             f"(compression {compression})")
    nbytes = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
    stored = obj.id.get_storage_size()
    if stored > file_size:
        raise _damaged(path, f"'{where}' says it stores {stored} bytes, more than the file's {file_size}")
    kind = dcpl.get_layout()
    if kind == h5py.h5d.CONTIGUOUS:
        offset = obj.id.get_offset()
        if nbytes and (stored != nbytes or offset is None or offset + nbytes > file_size):
            raise _damaged(path, f"'{where}' declares {nbytes} bytes of data that the file does not hold "
                                 f"(it is {file_size} bytes; truncated?)")
    elif kind == h5py.h5d.CHUNKED:
        chunks = obj.chunks
        chunk_bytes = int(np.prod(chunks, dtype=object)) * np.dtype(dtype).itemsize
        budget.check(chunk_bytes, f"shard {path}: one HDF5 chunk of '{where}'")
        expected = int(np.prod([-(-s // c) for s, c in zip(shape, chunks)], dtype=object)) if nbytes else 0
        if obj.id.get_num_chunks() != expected:
            raise _damaged(path, f"'{where}' stores {obj.id.get_num_chunks()} chunks, expected {expected}")
        if compression == "none" and stored != expected * chunk_bytes:
            raise _damaged(path, f"'{where}' stores {stored} bytes for {expected} chunks of {chunk_bytes} bytes")
        if compression != "none" and nbytes > _MAX_RATIO * stored + chunk_bytes:
            raise _damaged(path, f"'{where}' declares {nbytes} bytes compressed into {stored}: more than "
                                 f"{compression} can expand")
    elif nbytes > 65536:  # compact: kept in the object header, at most 64 KiB
        raise _damaged(path, f"'{where}' declares {nbytes} bytes in a compact layout")
    return obj


def _encoding(path, obj, where: str, kind: str, version: str) -> None:
    for key, want in (("encoding-type", kind), ("encoding-version", version)):
        if key not in obj.attrs or _text(path, _attr(path, obj, key, where + "."), where + "." + key) != want:
            raise _damaged(path, f"'{where}' is not encoded as {kind} {version}")


def _read_record(path, f) -> dict:
    from .output import (CHECKSUM, CHECKSUM_V1, COMPRESSIONS, DTYPES, RECORD_ATTR, RECORD_FORMAT, RECORD_VERSION,
                         canonical_json, seal_of)

    if RECORD_ATTR not in f.attrs:
        raise InputError(f"{path}: has no integrity record ('{RECORD_ATTR}'): it was written before rfsgen recorded "
                         "one, so its data cannot be verified; re-create the shard with this version of 'rfsgen "
                         "transform' (the same --rows or --shard)")
    text = _text(path, _attr(path, f, RECORD_ATTR), RECORD_ATTR)
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        raise _damaged(path, f"its integrity record '{RECORD_ATTR}' is not JSON") from None
    if not isinstance(record, dict):
        raise _damaged(path, f"its integrity record '{RECORD_ATTR}' is not a JSON object")
    if record.get("format") != RECORD_FORMAT:
        raise _damaged(path, f"its integrity record has format {_show(record.get('format'))}, not '{RECORD_FORMAT}'")
    version = record.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > RECORD_VERSION:
        raise InputError(f"{path}: its integrity record is version {version}, newer than this rfsgen reads "
                         f"({RECORD_VERSION}); merge with the rfsgen version that wrote it")
    try:
        canonical = canonical_json(record)
    except ValueError:  # NaN or infinity in it
        raise _damaged(path, "its integrity record holds a non-finite number") from None
    if canonical != text:
        raise _damaged(path, "its integrity record is not in canonical form (edited?)")
    if record.get("seal") != seal_of(record):
        raise _damaged(path, "its integrity record does not match its seal (edited or damaged)")
    kinds = {"format": str, "version": int, "rfsgen_version": str, "features_file": str, "features_sha256": str,
             "input": str, "rows_start": int, "rows_stop": int, "columns": int, "layout": str, "dtype": str,
             "compression": str, "shape": list, "nnz": int, "checksum": str, "datasets": dict, "obs_names": str,
             "obs_names_sha256": str, "seal": str}
    if "clipped_values" in record:  # EOF outputs (optional)
        kinds["clipped_values"] = int
    if "obs_columns_sha256" in record:  # outputs of .h5ad inputs with obs columns (optional)
        kinds["obs_columns_sha256"] = str
    if set(record) != set(kinds):
        raise _damaged(path, f"its integrity record has fields {sorted(record)}, expected {sorted(kinds)}")
    for key, kind in kinds.items():
        v = record[key]
        if not isinstance(v, kind) or isinstance(v, bool):
            raise _damaged(path, f"its integrity record's '{key}' is {_show(v)}, not {kind.__name__}")
    checksum, digest = {1: (CHECKSUM_V1, _HEX64), 2: (CHECKSUM, _HEX16)}.get(version, (None, None))
    if checksum is None:
        raise _damaged(path, f"its integrity record has version {version}")
    if record["checksum"] != checksum:
        raise _damaged(path, f"its integrity record (version {version}) uses checksum {_show(record['checksum'])}, "
                             f"not {checksum}")
    choices = {"layout": ("csr", "dense"), "dtype": tuple(DTYPES), "compression": COMPRESSIONS,
               "obs_names": ("numbers", "input")}
    for key, allowed in choices.items():
        if record[key] not in allowed:
            raise _damaged(path, f"its integrity record's '{key}' is {_show(record[key])}, not one of {list(allowed)}")
    want = {"X"} if record["layout"] == "dense" else {"X/data", "X/indices", "X/indptr"}
    sums = record["datasets"]
    if set(sums) != want or not all(isinstance(v, str) and digest.match(v) for v in sums.values()):
        raise _damaged(path, f"its integrity record's 'datasets' should hold the checksums of {sorted(want)}")
    for key in ("features_sha256", "obs_names_sha256", "obs_columns_sha256"):
        if key in record and not _HEX64.match(record[key]):
            raise _damaged(path, f"its integrity record's '{key}' is not a SHA-256 in hex")
    return record


def _open_shard(path) -> _Shard:
    import h5py

    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(f"{path}: no such shard; check the path") from None
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror}); check the path and its permissions") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block HDF5's open forever
        raise InputError(f"{path}: not a regular file; {_REFUSE}")
    try:
        f = h5py.File(p, "r")
    except OSError:
        raise InputError(f"{path}: not a readable HDF5 file; {_REFUSE}") from None
    try:
        shard = _check_shard(str(path), f, st.st_size)
        shard.size = st.st_size
        return shard
    except RfsgenError:
        f.close()
        raise
    except (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError, AttributeError, OverflowError) as e:
        # h5py's own errors on a damaged file (unreadable metadata, a bad link)
        f.close()
        detail = " ".join(str(e).split())[:120]
        raise _damaged(path, f"HDF5 cannot read it ({type(e).__name__}: {detail})") from None
    except BaseException:
        f.close()
        raise


def _check_shard(path: str, f, file_size: int) -> _Shard:
    """Everything about one shard that can be checked without reading its data."""
    import h5py

    from .output import number_names_digest

    attrs = {}
    for k in SHARD_ATTRS:
        if k not in f.attrs:
            raise InputError(f"{path}: not an rfsgen transform output (no '{k}' attribute); {_REFUSE}")
        v = _attr(path, f, k)
        attrs[k] = _text(path, v, k) if k in _TEXT_ATTRS else _integer(path, v, k)
    # the definition of the values (rfsgen.output.OUTPUT_DEFINITION); 1 before it was written
    attrs["output_definition"] = (_integer(path, _attr(path, f, "output_definition"), "output_definition")
                                  if "output_definition" in f.attrs else 1)
    if "clipped_values" in f.attrs:  # EOF outputs: how many input values were clipped to the box
        attrs["clipped_values"] = _integer(path, _attr(path, f, "clipped_values"), "clipped_values")
    start, stop, D = attrs["rows_start"], attrs["rows_stop"], attrs["columns"]
    if not 0 <= start <= stop:
        raise _damaged(path, f"rows {start}:{stop} are not a range of rows")
    if not 1 <= D < 2**31:  # int32 column indices, which the verifying pass takes as uint32
        raise _damaged(path, f"attribute 'columns' is {D}; rfsgen writes 1 to 2^31 - 1 columns")
    if not 0 <= attrs.get("clipped_values", 0) <= (stop - start) << 32:  # at most a row's values per row
        raise _damaged(path, f"attribute 'clipped_values' is {attrs['clipped_values']} for {stop - start} rows")
    if attrs["layout"] not in ("csr", "dense"):
        raise _damaged(path, f"attribute 'layout' is {_show(attrs['layout'])}, not 'csr' or 'dense'")
    record = _read_record(path, f)
    if record.get("clipped_values") != attrs.get("clipped_values"):
        raise _damaged(path, f"attribute 'clipped_values' is {_show(attrs.get('clipped_values'))} but its integrity "
                             f"record says {_show(record.get('clipped_values'))}")
    for k in SHARD_ATTRS:
        if record[k] != attrs[k]:
            raise _damaged(path, f"attribute '{k}' is {_show(attrs[k])} but its integrity record says "
                                 f"{_show(record[k])}")
    n, layout, dtype, comp, nnz = stop - start, record["layout"], np.dtype(record["dtype"]), record["compression"], \
        record["nnz"]
    if record["shape"] != [n, D]:
        raise _damaged(path, f"its integrity record's shape {record['shape']} is not rows x columns [{n}, {D}]")
    if not 0 <= nnz <= n * D or (layout == "dense" and nnz != n * D):
        raise _damaged(path, f"its integrity record's nnz {nnz} is impossible for {n} x {D} ({layout})")
    x = _link(path, f, "X", "X")
    _members(path, f, _ROOT, "/")
    if layout == "dense":
        _dataset(path, x, "X", dtype, (n, D), comp, file_size)
        _encoding(path, x, "X", "array", "0.2.0")
    else:
        if not isinstance(x, h5py.Group):
            raise _damaged(path, "'X' is a dataset, but its layout is csr (a group)")
        _members(path, x, _CSR, "X")
        _encoding(path, x, "X", "csr_matrix", "0.1.0")
        shape = _attr(path, x, "shape", "X.")
        if not isinstance(shape, np.ndarray) or shape.dtype.kind not in "iu" or shape.tolist() != [n, D]:
            raise _damaged(path, f"'X' has shape attribute {_show(shape)}, expected [{n}, {D}]")
        index = np.int32 if D < 2**31 else np.int64
        _dataset(path, _link(path, x, "data", "X/data"), "X/data", dtype, (nnz,), comp, file_size)
        _dataset(path, _link(path, x, "indices", "X/indices"), "X/indices", index, (nnz,), comp, file_size)
        _dataset(path, _link(path, x, "indptr", "X/indptr"), "X/indptr", np.int64, (n + 1,), comp, file_size)
    obs_columns = []
    for name, size in (("obs", n), ("var", D)):
        g = _link(path, f, name, name)
        if not isinstance(g, h5py.Group):
            raise _damaged(path, f"'{name}' is not a group")
        if name == "obs":
            obs_columns = _obs_columns(path, g, n, file_size)
            if bool(obs_columns) != ("obs_columns_sha256" in record):
                raise _damaged(path, f"'obs' holds {len(obs_columns)} columns but its integrity record "
                                     f"{'has no' if obs_columns else 'has a'} checksum of obs columns")
        _members(path, g, {"_index"} | {c.name for c in obs_columns} if name == "obs" else {"_index"}, name)
        ds = _link(path, g, "_index", f"{name}/_index")
        if not isinstance(ds, h5py.Dataset) or ds.shape != (size,) or h5py.check_string_dtype(ds.dtype) is None \
                or ds.is_virtual or ds.id.get_create_plist().get_external_count():
            raise _damaged(path, f"'{name}/_index' is not {size} strings stored in the file")
    for name in _EMPTY:
        g = _link(path, f, name, name)
        if not isinstance(g, h5py.Group):
            raise _damaged(path, f"'{name}' is not a group")
        if len(g) and name != "uns":  # uns: the provenance, checked below
            raise _damaged(path, f"'{name}' is not an empty group")
    # Last: the number of rows is now known to be what the file holds.
    if record["obs_names"] == "numbers" and record["obs_names_sha256"] != number_names_digest(start, stop):
        raise _damaged(path, f"its record says its row names are the row numbers {start}:{stop}, but their "
                             "checksum is of other names (rows moved?)")
    if len(f["uns"]):  # the provenance (shards written before it was there have none)
        _check_uns(path, f["uns"], attrs, n, D, layout)
    return _Shard(path, f, attrs, record, start, stop, dtype, comp, obs_columns=obs_columns)


def _obs_columns(path, obs, n: int, file_size: int) -> list:
    """The shard's obs columns (:func:`rfsgen.obs.describe`, under merge's rules: hard
    links only, data stored in the file, sizes that fit it)."""
    from . import obs as obs_mod

    def get(group, name, where):
        return _link(path, group, name, where)

    def fail(where, what):
        return _damaged(path, f"'{where}': {what}")

    def check(ds, where):
        import h5py

        if h5py.check_string_dtype(ds.dtype) is None:
            _dataset(path, ds, where, ds.dtype, ds.shape, "none", file_size)
        elif ds.is_virtual or ds.id.get_create_plist().get_external_count():  # as obs/_index
            raise _damaged(path, f"'{where}' is not strings stored in the file")

    return obs_mod.describe(obs, n, get, fail, check)


def _check_uns(path, uns, attrs: dict, n: int, D: int, layout: str) -> None:
    """``uns`` holds exactly ``uns["rfsgen"]``, the provenance that the root attributes
    (already checked against the record) say, as :func:`rfsgen.output.write_root_attrs`
    writes it.  A merge writes its own: nothing of it is copied."""
    import h5py

    from .output import UNS_KEY, provenance_items

    _members(path, uns, {UNS_KEY}, "uns")
    g = _link(path, uns, UNS_KEY, f"uns/{UNS_KEY}")
    where = f"uns/{UNS_KEY}"
    if not isinstance(g, h5py.Group):
        raise _damaged(path, f"'{where}' is not a group")
    _encoding(path, g, where, "dict", "0.1.0")
    want = provenance_items(attrs, attrs["rows_start"], n, D, layout, attrs.get("clipped_values"))
    _members(path, g, set(want), where)
    for key, value in want.items():
        ds = _link(path, g, key, f"{where}/{key}")
        text = isinstance(value, str)
        if not isinstance(ds, h5py.Dataset) or ds.shape != () or ds.is_virtual \
                or ds.id.get_create_plist().get_external_count() \
                or (h5py.check_string_dtype(ds.dtype) is None if text else ds.dtype != np.int64):
            raise _damaged(path, f"'{where}/{key}' is not a {'string' if text else 'int64'} scalar stored in the file")
        _encoding(path, ds, f"{where}/{key}", "string" if text else "numeric-scalar", "0.2.0")
        got = ds[()]
        got = got.decode("utf-8", "replace") if isinstance(got, bytes) else (got if text else int(got))
        if got != value:
            raise _damaged(path, f"'{where}/{key}' is {_show(got)} but the shard's attributes and integrity record "
                                 f"say {_show(value)}")


def _verify_names(s: _Shard) -> None:
    """Read the shard's row names, compare their checksum with the record, and keep
    them when they come from the input (they are copied into the merged file)."""
    from .h5ad import NAME_BLOCK
    from .output import NamesChecksum

    ds = s.file["obs"]["_index"].asstr()
    digest = NamesChecksum()
    keep = s.record["obs_names"] == "input"
    for a in range(0, s.stop - s.start, NAME_BLOCK):
        b = min(a + NAME_BLOCK, s.stop - s.start)
        try:  # variable-length strings: a damaged global heap fails here, not in the checksum
            block = list(ds[a:b])
        except (OSError, RuntimeError, ValueError) as e:
            detail = " ".join(str(e).split())[:100]
            raise _damaged(s.path, f"'obs/_index' cannot be read at {a}:{b} ({type(e).__name__}: {detail})") from None
        digest.update(block)
        if keep:
            s.names.extend(block)
    if digest.hexdigest() != s.record["obs_names_sha256"]:
        raise _damaged(s.path, "'obs/_index' (the row names) does not match its integrity record")
    if s.obs_columns:  # read whole (they are copied from memory) and checked against the record
        from . import budget
        from . import obs as obs_mod

        n = s.stop - s.start
        budget.check(obs_mod.nbytes(s.obs_columns, n), f"shard {s.path}: its {len(s.obs_columns)} obs columns")
        try:
            s.obs = obs_mod.in_memory(s.file["obs"], s.obs_columns, n)
        except (OSError, RuntimeError, ValueError) as e:
            detail = " ".join(str(e).split())[:100]
            raise _damaged(s.path, f"its obs columns cannot be read ({type(e).__name__}: {detail})") from None
        if s.obs.digest(0, n) != s.record["obs_columns_sha256"]:
            raise _damaged(s.path, "its obs columns do not match the checksum in its integrity record (a changed "
                                   "value)")


# ----------------------------------------------------------------------------- shards together
def check_shards(shards: list) -> list:
    """Sort ``shards`` by ``rows_start`` (the order given does not matter) and check that
    they belong together and tile their range.  Each violation is a one-line
    :class:`InputError` naming the shards."""
    first = shards[0]
    for s in shards[1:]:
        _check_pair(first, s)
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


#: What shards merged together must share: (record key, what differs, the fix).
_SAME = (("features_sha256", "come from different feature files", "sample once and transform every shard with it"),
         ("input", "come from different inputs", "merge shards of one input"),
         ("layout", "have different layouts", "transform every shard with the same --layout"),
         ("columns", "have different column counts", "transform every shard with the same feature file"),
         ("dtype", "have different dtypes", "transform every shard with the same --dtype"),
         ("compression", "were written with different --compression", "use one --compression for every shard"),
         ("rfsgen_version", "were written by different rfsgen versions", "transform every shard with one version"),
         ("obs_names", "disagree on where row names come from", "merge shards of one input"))


def _check_pair(first: "_Shard", s: "_Shard") -> None:
    """That shard ``s`` belongs with ``first``: the same output definition, feature file,
    input, layout, columns, dtype, compression, version and obs columns."""
    a, b = first.attrs["output_definition"], s.attrs["output_definition"]
    if a != b:
        raise InputError(f"{first.path} and {s.path} hold values of different output definitions ({a} vs {b}: "
                         "rfsgen's cos/sin changed between the versions that wrote them); transform every shard "
                         "with one rfsgen version")
    for key, what, fix in _SAME:
        a, b = first.record[key], s.record[key]
        if a != b:
            shown = f"{a} vs {b}" if key == "dtype" else f"{key} {a!r} vs {b!r}"
            raise InputError(f"{first.path} and {s.path} {what} ({shown}); {fix}")
    if [c.meta() for c in s.obs_columns] != [c.meta() for c in first.obs_columns]:
        raise InputError(f"{first.path} and {s.path} have different obs columns (names, types or categories); "
                         "merge shards of one input")


@dataclass
class _Pending:
    """A shard of a streamed merge (:func:`merge_streamed`) not opened yet: its rows
    ``start:stop``, the path it is written to and ``arrive()``, which returns once it
    is complete."""
    start: int
    stop: int
    path: str
    arrive: Callable[[], None]


class _Hasher:
    """Hashes the blocks the readers read in one background thread, so that a block's
    checksum (rfsgen._compiled: no GIL) overlaps reading the next block (h5py holds the
    GIL) and writing this one.  At most one block waits or is hashed at a time (it is
    alive anyway: the writer still holds it while the next is read).

    The order of the checks is kept: :meth:`settle` (called before any other check of a
    shard fails, before its checksums are compared, and before the end) reports a
    block's NaN or infinity exactly where hashing it in line would have."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rfsgen-verify")
        self.pending = None  # (future of the first bad row or None, what raises for a bad row)

    def submit(self, fn, args, bad_error) -> None:
        """Run ``fn(*args)`` (returns the index of a bad row, or None) in the thread;
        ``bad_error(index)`` is the error raised for a bad row."""
        self.settle()
        self.pending = (self.pool.submit(fn, *args), bad_error)

    def settle(self) -> None:
        """Wait for the block in flight; raise its error if it has a bad row."""
        if self.pending is None:
            return
        done, bad_error = self.pending
        self.pending = None
        bad = done.result()
        if bad is not None:
            raise bad_error(bad)

    def close(self) -> None:
        """Wait for the thread (after an error too: the block in flight is a copy)."""
        self.pending = None
        self.pool.shutdown(wait=True)


class _Reader:
    """Reads one shard's rows in order (dense: float arrays ``(m, columns)``; CSR: its
    pieces, :meth:`csr_pieces`), hashing each block once as it is read
    (:class:`rfsgen.output.DataChecksum`, keyed by the rows' global numbers) and
    checking values (finite, in the same pass; CSR: nonzero, column
    indices increasing within each row).  A shard with a version-1 record is also fed
    to the :class:`rfsgen.output.BlockChecksum` it was sealed with.  :meth:`finish`
    compares the checksums once every row was read; :meth:`digests` are then the
    shard's (current) checksums, which add up to the merged file's."""

    def __init__(self, s: _Shard, hasher: _Hasher):
        from .output import BlockChecksum, DataChecksum

        self.s = s
        self.hasher = hasher
        self.next = 0  # the next row (within the shard) to read
        # One thread: the hasher's, beside this one's reads and writes.  Splitting a block
        # over more threads only takes cores from the reading and writing (up to 3% slower).
        self.sums = DataChecksum(s.layout, s.dtype, s.columns, finite=True, threads=False)
        self.v1 = s.record["version"] == 1
        x = s.file["X"]
        if s.layout == "dense":
            self.x = x
            self.old = {"X": BlockChecksum()}
        else:
            self.data, self.indices, self.indptr = x["data"], x["indices"], x["indptr"]
            self.old = {"X/data": BlockChecksum(), "X/indices": BlockChecksum(), "X/indptr": BlockChecksum()}
            self.end = 0  # indptr where the next row starts
        self.fd = s.fd
        self.map = None
        self.mappable = _CSRChunks.applies(s)  # its chunks found when its rows are first read
        self.done = False

    def _read(self, ds, a, b, where):
        """``ds[a:b]`` through HDF5, the file's size checked after it (HDF5 reads zeros
        past a file's end: a shrink would pass for damage)."""
        try:
            out = ds[a:b]
        except (OSError, RuntimeError, ValueError) as e:
            _check_size(self.s, self.fd)
            detail = " ".join(str(e).split())[:100]
            raise _damaged(self.s.path, f"'{where}' cannot be read at {a}:{b} ({type(e).__name__}: {detail})") from None
        _check_size(self.s, self.fd)
        return out

    def _csr_fault(self, row0, run_of):
        """The error for a fault :meth:`rfsgen.output.DataChecksum.csr` found in CSR rows
        ``row0`` on (global); ``run_of(r)`` gives row ``r``'s ``(values, columns)``."""
        s, D = self.s, self.s.columns

        def fault(found):
            bad, kind = found
            row = row0 + bad
            if kind == "indices":
                return _damaged(s.path, f"'X/indices' is not canonical CSR at row {row} (a column index outside "
                                        f"0..{D - 1}, out of order or repeated)")
            if kind == "zero":
                return _damaged(s.path, f"'X/data' stores a zero at row {row} (an output never does)")
            run, cols = run_of(bad)
            k = int(np.flatnonzero(~np.isfinite(run))[0])
            return self._nonfinite("X/data", row, int(cols[k]))
        return fault

    def _nonfinite(self, where, row, column):
        return _damaged(self.s.path, f"'{where}' holds NaN or infinity (row {row}, column {column}); an output never "
                                     "does")

    def read(self, a: int, b: int) -> np.ndarray:
        """Dense rows ``a:b`` of the shard (in order), hashed and checked in the hasher's
        thread (CSR shards are read with :meth:`csr_pieces`)."""
        try:
            return self._block(a, b)
        except RfsgenError:
            self.hasher.settle()  # a bad row in a block read before is reported first, as in line
            raise

    def _block(self, a: int, b: int) -> np.ndarray:
        s = self.s
        if a != self.next:  # pragma: no cover - _ShardRows reads in order
            raise AssertionError("shard rows read out of order")
        self.next = b
        block = self._read(self.x, a, b, "X")
        if self.v1:
            self.old["X"].update(block)

        def nonfinite(bad):
            column = int(np.flatnonzero(~np.isfinite(block[bad]))[0])
            return self._nonfinite("X", s.start + a + bad, column)

        self.hasher.submit(self.sums.dense, (block, s.start + a), nonfinite)
        return block

    def _pointer(self, a: int, b: int) -> np.ndarray:
        """The row pointer of rows ``a:b`` (read in order), checked: it goes on from the
        rows before, never down, no row longer than a row, not past nnz."""
        s = self.s
        if a != self.next:  # pragma: no cover - _ShardRows reads in order
            raise AssertionError("shard rows read out of order")
        self.next = b
        ptr = self._read(self.indptr, a, b + 1, "X/indptr")
        if self.v1:
            self.old["X/indptr"].update(ptr if a == 0 else ptr[1:])
        steps = np.diff(ptr)
        if int(ptr[0]) != self.end or np.any(steps < 0) or int(ptr[-1]) > s.record["nnz"] or np.any(steps > s.columns):
            raise _damaged(s.path, f"'X/indptr' is not a CSR row pointer at rows {s.start + a}:{s.start + b}")
        self.end = int(ptr[-1])
        return ptr

    def _csr(self, a: int, b: int):
        s = self.s
        ptr = ptr0 = self._pointer(a, b)
        lo, hi = int(ptr[0]), int(ptr[-1])
        if self.map is not None:
            vals, cols = self.map.read(lo, hi)
        else:
            vals = self._read(self.data, lo, hi, "X/data")
            cols = self._read(self.indices, lo, hi, "X/indices")
        if self.v1:
            self.old["X/data"].update(vals)
            self.old["X/indices"].update(cols)
        ptr = ptr - lo
        # After the pointer's checks (it addresses vals); vals, cols and ptr0 are not changed
        # below.  The values' checks (finite; canonical CSR: columns strictly increasing
        # within 0 .. D - 1; no stored zero) come with the hash, in the hasher's thread, in
        # one pass (in numpy on this thread they took 13% of a CSR merge's wall time).
        self.hasher.submit(self.sums.csr, (vals, cols, ptr0, s.start + a),
                           self._csr_fault(s.start + a, lambda r: (vals[ptr[r]:ptr[r + 1]], cols[ptr[r]:ptr[r + 1]])))
        return vals, cols, ptr

    def csr_pieces(self, a: int, b: int):
        """CSR rows ``a:b`` of the shard (in order), to be verified in the hasher's thread
        while the caller writes them (until :meth:`finish` or the next read): ``(pieces,
        counts)``, their values and columns as ``[(data, indices)]`` and each row's
        count (int64 ``(b - a,)``).  Read by position from the file where the shard
        allows it (:class:`_CSRChunks`), else through HDF5."""
        try:
            if self.mappable:
                self.mappable = False
                self.map = _CSRChunks(self.s, self.fd)
            vals, cols, ptr = self._csr(a, b)
            return [(vals, cols)], np.diff(ptr)
        except RfsgenError:
            self.hasher.settle()  # a bad row in a block read before is reported first, as in line
            raise

    def unmap(self) -> None:
        """Let go of the shard's chunk places and read buffers (once its rows are
        written and verified)."""
        if self.map is not None:
            self.map.close()
            self.map = None

    def finish(self) -> None:
        """Compare the checksums (every row must have been read)."""
        s = self.s
        if self.done:
            return
        self.hasher.settle()  # this shard's last block (and any before it) hashed and checked
        self.done = True
        if s.layout == "csr":
            if s.stop == s.start:  # no rows read: indptr is [0]
                ptr = self._read(self.indptr, 0, 1, "X/indptr")
                if self.v1:
                    self.old["X/indptr"].update(ptr)
                self.end = int(ptr[0])
            if self.end != s.record["nnz"]:
                raise _damaged(s.path, f"'X/indptr' ends at {self.end}, but the record says nnz {s.record['nnz']}")
        have = {k: c.hexdigest() for k, c in self.old.items()} if self.v1 else self.sums.hexdigests()
        for where, digest in have.items():
            if digest != s.record["datasets"][where]:
                raise _damaged(s.path, f"'{where}' does not match the checksum in its integrity record (a changed "
                                       "bit)")

    def digests(self) -> dict:
        """The shard's :data:`rfsgen.output.CHECKSUM` digests (once :meth:`finish` passed)."""
        return self.sums.hexdigests()


#: Fewest values an HDF5 chunk of a CSR shard must hold to be read by position
#: (:class:`_CSRChunks`; transform writes 2^12 to 2^20): shards of smaller chunks
#: (another writer's) are read through HDF5, which handles many small chunks better
#: than a read of each.
MAP_MIN_CHUNK = 1 << 12


class _CSRChunks:
    """An uncompressed CSR shard's ``X/data`` and ``X/indices`` read by position from its
    file (``os.preadv``, into two pairs of buffers used in turn), at the offsets HDF5's
    chunk index gives, checked first: each chunk once, unfiltered, whole, inside the
    file.  No HDF5 read: a block of rows is one read per chunk it spans and dataset,
    into buffers the verifying thread hashes while the writer copies them out (the
    pair read next is the other one).  Not a map of the file: a shard that shrinks
    while it is read is an error naming it, where a map's missing page is SIGBUS.
    Made when the shard's rows are first read and let go once they are written, so
    a merge of many shards holds the buffers of one or two at a time."""

    @staticmethod
    def applies(s: _Shard) -> bool:
        """Whether ``s`` (checked by :func:`_check_shard`) can be read so."""
        if s.layout != "csr" or s.compression != "none" or s.record["version"] < 2:
            return False
        data, indices = s.file["X/data"], s.file["X/indices"]
        return (data.chunks is not None and data.chunks == indices.chunks and data.chunks[0] >= MAP_MIN_CHUNK
                and hasattr(data.id, "chunk_iter"))

    def __init__(self, s: _Shard, fd: int):
        """A chunk out of place raises :class:`InputError`."""
        x = s.file["X"]
        nnz = s.record["nnz"]
        self.s, self.fd = s, fd
        self.C = C = x["data"].chunks[0]
        self.dtypes = (x["data"].dtype, x["indices"].dtype)
        self.buffers = [None, None]  # (data, indices) each, read into in turn
        size = s.size
        n = -(-nnz // C)
        found = {}
        for name in ("data", "indices"):
            ds = x[name]
            nbytes = C * ds.dtype.itemsize
            places = np.full(n, -1, dtype=np.int64)
            bad = []

            def seen(info):
                k, off = divmod(int(info.chunk_offset[0]), C)
                where = info.byte_offset
                if off or not 0 <= k < n or places[k] >= 0 or info.filter_mask or info.size != nbytes \
                        or where is None or where + nbytes > size:
                    bad.append(f"'X/{name}' has a chunk at {info.chunk_offset[0]} that is not {nbytes} unfiltered "
                               f"bytes inside the file, once (it is {info.size} at offset {where} of {size})")
                    return True  # ends the iteration
                places[k] = where
                return None

            try:
                ds.id.chunk_iter(seen)
            except (OSError, RuntimeError, ValueError, KeyError) as e:
                raise _damaged(s.path, f"'X/{name}' has a chunk index HDF5 cannot read ({type(e).__name__})") from None
            if bad:
                raise _damaged(s.path, bad[0])
            if n and places.min() < 0:  # _check_shard counted them: a chunk given twice hides another
                raise _damaged(s.path, f"'X/{name}' has no chunk at {int(np.argmin(places)) * C}")
            found[name] = places
        self.places = (found["data"], found["indices"])

    def read(self, lo: int, hi: int):
        """Values ``lo:hi`` as ``(data, indices)``, in the buffers not read into last
        (the block before may still be hashed from the others)."""
        m = hi - lo
        pair = self.buffers[0]
        if pair is None or pair[0].size < m:  # grown by half at least: blocks vary, few allocations
            pair = tuple(np.empty(max(m, 0 if pair is None else pair[0].size * 3 // 2), dtype=t) for t in self.dtypes)
        self.buffers = [self.buffers[1], pair]
        out = (pair[0][:m], pair[1][:m])
        C, s, fd = self.C, self.s, self.fd
        _check_size(s, fd)
        for k in range(lo // C, -(-hi // C)):
            a, b = max(lo, k * C), min(hi, (k + 1) * C)
            for arr, places, where in zip(out, self.places, ("X/data", "X/indices")):
                _pread(s, fd, memoryview(arr[a - lo:b - lo]).cast("B"),
                       int(places[k]) + (a - k * C) * arr.itemsize, where)
        _check_size(s, fd)
        if s.spent is not None:
            nnz = s.record["nnz"]
            for k in range(lo // C, -(-hi // C)):
                if min((k + 1) * C, nnz) <= hi:  # every value of chunk k is in a buffer now
                    for places, t in zip(self.places, self.dtypes):
                        s.spent(int(places[k]), C * t.itemsize)
        return out

    def close(self) -> None:
        self.buffers = [None, None]


class _ShardRows:
    """The shards' rows in order, numbered as in the input (``rows_start`` onwards),
    verified as they are read (see :class:`_Reader`); each shard's checksums are
    compared as soon as its last row is read, and all of them before the end.

    Shards given as :class:`_Pending` (a streamed merge) are waited for, opened and
    checked against the first (:func:`_check_pair`, their rows, their names) when the
    rows before theirs have been read; each opened shard is appended to ``opened`` (the
    caller closes them) and, with ``consume``, gives back its bytes as they are read
    (:class:`_Spent`)."""

    def __init__(self, shards: list, opened: list | None = None, consume: bool = False):
        self.shards = list(shards)
        self.opened = opened if opened is not None else []
        self.consume = consume
        self.hasher = _Hasher()
        self.readers = []
        try:
            for s in self.shards:
                self.readers.append(None if isinstance(s, _Pending) else _Reader(s, self.hasher))
            first = self.shards[0]
            self.name = first.attrs["input"]
            self.width = first.columns
            self.n_rows = self.shards[-1].stop
            self.numbers = first.record["obs_names"] == "numbers"
            self.obs_columns = None
            if first.obs_columns:  # each shard's, verified by _verify_names: every shard is needed now
                from .obs import concatenated

                self._open_before(self.n_rows + 1)
                self.obs_columns = concatenated([(s.start, s.stop - s.start, s.obs) for s in self.shards])
        except BaseException:
            self.close()
            raise

    def _open_before(self, b: int) -> None:
        """Wait for, open and check the pending shards that start before row ``b``, in order."""
        for i, p in enumerate(self.shards):
            if p.start >= b:
                break
            if not isinstance(p, _Pending):
                continue
            s = _open_arrived(p, self.opened)
            _check_pair(self.shards[0], s)
            _verify_names(s)
            if self.consume:
                s.spent = _Spent(s)
            self.shards[i] = s
            self.readers[i] = _Reader(s, self.hasher)

    def _pieces(self, a, b):
        self._open_before(b)
        for s, r in zip(self.shards, self.readers):
            lo, hi = max(a, s.start), min(b, s.stop)
            if lo < hi:
                yield s, r, lo, hi

    def chunks(self, chunk_rows, start=0, stop=None):
        stop = self.n_rows if stop is None else stop
        for a in range(start, stop, chunk_rows):
            b = min(a + chunk_rows, stop)
            parts = [r.read(lo - s.start, hi - s.start) for s, r, lo, hi in self._pieces(a, b)]
            yield a, parts[0] if len(parts) == 1 else np.concatenate(parts)
            # Read whole: compare its checksums now, before anything more is read (after
            # the block was handed on, so that its hashing overlapped the writing).
            for s, r in zip(self.shards, self.readers):
                if s.stop <= b and r is not None:  # (None: an empty shard still pending)
                    r.finish()
        # The writer asks for a next chunk after the last one (a for loop does), so a
        # mismatch found here still ends the write before the output is in place.
        self._open_before(self.n_rows + 1)
        for r in self.readers:
            r.finish()

    def csr_chunks(self, chunk_rows, start=0, stop=None):
        """As :meth:`chunks`, for CSR shards, without densifying: ``(row0, (pieces,
        counts))``, the rows' values and columns as ``[(data, indices), ..]`` and their
        counts per row, verified the same way (read in place where the shard allows it:
        :meth:`_Reader.csr_pieces`)."""
        stop = self.n_rows if stop is None else stop
        for a in range(start, stop, chunk_rows):
            b = min(a + chunk_rows, stop)
            pieces, counts = [], []
            for s, r, lo, hi in self._pieces(a, b):
                p, c = r.csr_pieces(lo - s.start, hi - s.start)
                pieces += p
                counts.append(c)
            for s, r in zip(self.shards, self.readers):
                if s.stop <= b and r is not None:  # (None: an empty shard still pending)
                    r.finish()
            yield a, (pieces, counts[0] if len(counts) == 1 else np.concatenate(counts))
            pieces = None
            for s, r in zip(self.shards, self.readers):  # written: their read buffers are no longer needed
                if s.stop <= b and r is not None:
                    r.unmap()
        self._open_before(self.n_rows + 1)
        for r in self.readers:
            r.finish()

    def close(self) -> None:
        """Stop the hashing thread (see :class:`_Hasher`), then let go of the shards' read buffers."""
        self.hasher.close()
        for r in self.readers:
            if r is not None:
                r.unmap()

    def digests(self) -> dict:
        """The merged rows' :data:`rfsgen.output.CHECKSUM` digests: the sums of the
        shards' (each verified: call once every row was read)."""
        from .output import add_digests

        self._open_before(self.n_rows + 1)  # (a streamed merge: every shard was read by now)
        for r in self.readers:
            r.finish()
        return add_digests(*[r.digests() for r in self.readers])

    def row_names(self, start, stop):
        """None for row numbers (the writer writes them as a direct run does); else
        the names read (and verified) from the shards."""
        if self.numbers:
            return None
        out = []
        for s, _, lo, hi in self._pieces(start, stop):
            out.extend(s.names[lo - s.start:hi - s.start])
        return out


class _Copy:
    """What :func:`rfsgen.output.write_output` needs of a transformer, for rows
    that are already features: they are copied as they are."""

    def __init__(self, columns: int, dtype, src: "_ShardRows | None" = None):
        self.columns = columns
        self.dtype = np.dtype(dtype)
        self.src = src

    @property
    def clipped(self) -> int | None:
        """EOF shards' clipped values added up, read by the writer after the last row (when
        every shard of a streamed merge is open)."""
        return None if self.src is None else _clipped(self.src.shards)

    def chunk(self, block, row0=0, source="", out=None):
        if out is None:
            return np.ascontiguousarray(block, dtype=self.dtype)
        out[...] = block
        return out

    def chunks(self, src, chunk_rows, start=0, stop=None, buffers=1):
        for row0, block in src.chunks(chunk_rows, start, stop):
            yield row0, self.chunk(block)

    def csr_chunks(self, src, chunk_rows, start=0, stop=None):
        """CSR shards' rows as ``(row0, (pieces, counts))``, not densified (see
        :meth:`_ShardRows.csr_chunks`)."""
        return src.csr_chunks(chunk_rows, start, stop)


#: Bytes of a shard read and copied at a time by :class:`_RawDense` (its buffer).
RAW_STEP = 64 << 20


class _RawDense(_Copy):
    """A merge of dense uncompressed shards (record version 2, ``X`` contiguous): each
    shard's ``X`` bytes are read by position (``os.preadv``) a piece at a time into one
    buffer, hashed and checked for NaN and infinity (its :class:`_Reader`'s checksum,
    keyed by global row) while they are written with ``os.pwrite`` at their place in
    the output, bytes as they are: no HDF5 read.  The verified bytes are the bytes
    written, and a shard that shrinks meanwhile is an error naming it (a map of it
    would fault: SIGBUS, or EFAULT blamed on the output)."""

    @staticmethod
    def applies(order) -> bool:
        return all(s.layout == "dense" and s.compression == "none" and s.record["version"] >= 2
                   and (s.stop == s.start or s.file["X"].id.get_offset() is not None) for s in order)

    def copy_into(self, fd, offset, row_bytes, start, stop, progress) -> int:
        step = max(1, min(RAW_STEP // row_bytes, max(s.stop - s.start for s in self.src.shards)))
        buf = np.empty(step * row_bytes, dtype=np.uint8)  # hashed whole before it is read into again
        for s, r in zip(self.src.shards, self.src.readers):
            n = s.stop - s.start
            if n:
                base = s.file["X"].id.get_offset()
                for a in range(0, n, step):
                    b = min(n, a + step)
                    data = memoryview(buf)[:(b - a) * row_bytes]
                    _check_size(s, r.fd)
                    _pread(s, r.fd, data, base + a * row_bytes, "X")
                    _check_size(s, r.fd)
                    if s.spent is not None:
                        s.spent(base + a * row_bytes, data.nbytes)
                    block = buf[:data.nbytes].view(self.dtype).reshape(b - a, self.columns)
                    try:
                        # Hashed in the verifying thread while this process writes the same block.
                        r.hasher.submit(r.sums.dense, (block, s.start + a), _first_nonfinite(r, block, s.start + a))
                        pos = offset + (s.start + a - start) * row_bytes
                        while data:  # pwrite may write less than asked
                            k = os.pwrite(fd, data, pos)
                            data, pos = data[k:], pos + k
                    finally:
                        r.hasher.settle()  # hashed before the buffer is read into again
                    r.next = b
                    if progress:
                        progress(b - a)
            r.finish()
        return stop - start


def _first_nonfinite(r, block, row0):
    """What :class:`_Hasher` raises for a bad row of ``block`` (global rows ``row0`` on)."""
    def error(bad):
        column = int(np.flatnonzero(~np.isfinite(block[bad]))[0])
        return r._nonfinite("X", row0 + bad, column)

    return error


def _clipped(order) -> int | None:
    """EOF shards: their counts of clipped values add up (None when no shard has one)."""
    if not any("clipped_values" in s.attrs for s in order):
        return None
    return sum(s.attrs.get("clipped_values", 0) for s in order)


def _check_memory(order, chunk_rows: int) -> None:
    """The merge's memory, from the shards' declared sizes, against the budget: a chunk
    of rows read, densified and written (twice while the writer overlaps), and for CSR
    the merged row pointer, held until the end."""
    from . import budget

    first = order[0]
    n = order[-1].stop - first.start
    D = first.columns
    est = chunk_rows * D * (4 * first.dtype.itemsize + 8)
    if first.layout == "csr":
        est += 16 * (n + 1)
    budget.check(est, f"merging {len(order)} shards ({n} rows x {D} columns, {first.layout})")


def merge_files(shards, output, *, virtual: bool = False, overwrite: bool = False,
                progress: Callable[[int], None] | None = None, chunk_rows: int | None = None,
                consume: bool = False) -> dict:
    """Merge transform shards into ``output`` (see the module docstring).  Returns a
    summary dict (rows, columns, nnz, output, shards, virtual).  A shard that fails a
    check raises :class:`InputError` (one line naming the shard and what failed) and
    no output is left behind.  ``consume=True`` (for shards that are removed after the
    merge, whatever its outcome: the Dask engine's) frees the storage of the shards'
    data as it is copied (:class:`_Spent`), so the shards are no longer usable; the
    shards read by position (dense and CSR, uncompressed) are freed so."""
    if not shards:
        raise UsageError("give the shards to merge")
    if consume and virtual:
        raise UsageError("a virtual merge reads its shards whenever it is read: they cannot be consumed")
    opened = []
    try:
        for p in shards:
            opened.append(_open_shard(p))
        return _merge_opened(opened, list(shards), output, virtual, overwrite, progress, chunk_rows, consume)
    finally:
        _close(None, opened)


def _merge_opened(opened, inputs, output, virtual, overwrite, progress, chunk_rows, consume) -> dict:
    """:func:`merge_files` of the shards ``opened`` (closed by the caller)."""
    from .output import default_chunk_rows

    order = check_shards(opened)
    first = order[0]
    if virtual and first.layout != "dense":
        raise UsageError("--virtual needs dense shards (--layout dense): a CSR matrix cannot be a virtual "
                         "dataset, since each shard's indptr must be shifted; merge without --virtual")
    chunk_rows = chunk_rows or default_chunk_rows(first.columns)
    _check_memory(order, chunk_rows)
    for s in order:
        _verify_names(s)
    if consume:  # every shard checked: only bytes that are about to be copied are freed
        for s in order:
            s.spent = _Spent(s)
    src = _ShardRows(order)
    try:
        if virtual:
            info = _write_virtual(order, src, output, overwrite, chunk_rows, _provenance(first), progress)
        else:
            info = _write_merged(order, src, output, overwrite, chunk_rows, progress, inputs, "merge",
                                 _RawDense.applies(order))
    finally:
        src.close()
    info.update(shards=len(order), virtual=virtual)
    return info


def merge_streamed(ranges, paths, arrive, output, *, overwrite: bool = False,
                   progress: Callable[[int], None] | None = None, chunk_rows: int | None = None,
                   consume: bool = False) -> dict:
    """:func:`merge_files` of shards still being written (the Dask engine's): shard ``i``
    is ``paths[i]``, written for rows ``ranges[i]`` (``(start, stop)``, in order, each
    starting where the one before stops), and ``arrive(i)`` returns once it is complete.
    Each shard is waited for, opened and checked (its rows must be its range's) when the
    rows before it are written, in chunks of at most ``chunk_rows`` rows and no longer
    than the shortest range, so the merge of the first shards overlaps the writing of the
    later ones; ``progress`` counts the rows written.  The same checks, bytes and errors
    as :func:`merge_files` (a shard that fails one raises, and no output is left behind).
    Dense uncompressed shards (copied raw) and shards with obs columns are merged once
    every shard is there; ``progress`` then counts each shard's rows as it arrives, and
    the merge's rows afterwards (its phase ``merge``)."""
    from .output import default_chunk_rows

    if not paths or len(paths) != len(ranges):
        raise UsageError("give one row range for each shard to merge")
    ranges = [(int(a), int(b)) for a, b in ranges]
    if any(b < a for a, b in ranges) or any(r[1] != n[0] for r, n in zip(ranges, ranges[1:])):
        raise UsageError(f"the shards' row ranges must follow each other without a gap or an overlap, got {ranges}")
    opened = []
    src = None
    try:
        pending = [_Pending(a, b, p, (lambda i=i: arrive(i))) for i, ((a, b), p) in enumerate(zip(ranges, paths))]
        first = _open_arrived(pending[0], opened)
        if _RawDense.applies([first]) or first.obs_columns:  # every shard before the first row is written
            for i, p in enumerate(pending):
                if i:
                    _open_arrived(p, opened)
                if progress:
                    progress(p.stop - p.start)
            return _merge_opened(opened, list(paths), output, False, overwrite, progress, chunk_rows, consume)
        order = [first] + pending[1:]
        shortest = min((b - a for a, b in ranges if b > a), default=1)
        chunk_rows = max(1, min(chunk_rows or default_chunk_rows(first.columns), shortest))
        _check_memory(order, chunk_rows)
        _verify_names(first)
        if consume:
            first.spent = _Spent(first)
        src = _ShardRows(order, opened, consume)
        info = _write_merged(order, src, output, overwrite, chunk_rows, progress, list(paths), "transform", False)
        info.update(shards=len(order), virtual=False)
        return info
    finally:
        _close(src, opened)


def _open_arrived(p: _Pending, opened: list) -> _Shard:
    """Shard ``p`` once complete (``p.arrive()``), opened (appended to ``opened``, which
    the caller closes) and holding the rows it was written for."""
    p.arrive()
    s = _open_shard(p.path)
    opened.append(s)
    if (s.start, s.stop) != (p.start, p.stop):
        raise InputError(f"{s.label}: written for rows {p.start}:{p.stop}, it holds others; run again")
    return s


def _provenance(first: _Shard) -> dict:
    return {k: first.attrs[k] for k in ("rfsgen_version", "features_file", "features_sha256", "input",
                                        "output_definition")}


def _write_merged(order, src, output, overwrite, chunk_rows, progress, inputs, phase, raw) -> dict:
    """The merged rows of ``src`` written to ``output`` (``raw``: dense uncompressed shards,
    copied as bytes by :class:`_RawDense`)."""
    from .output import write_output

    first = order[0]
    copy = _RawDense(src.width, first.dtype, src) if raw else _Copy(src.width, first.dtype, src)
    copy.known_digests = src.digests  # the shards' verified sums: the output is not hashed again
    return write_output(output, copy, src, first.start, order[-1].stop, layout=first.layout,
                        dtype=first.dtype.name, compression=first.compression, chunk_rows=chunk_rows,
                        overwrite=overwrite, inputs=inputs, progress=progress, provenance=_provenance(first),
                        phase=phase)


def _close(src, opened) -> None:
    if src is not None:
        src.close()
    for s in opened:
        if s.spent is not None:
            s.spent.close()
        s.file.close()


def _write_virtual(order, src, output, overwrite, chunk_rows, provenance, progress) -> dict:
    """A merged file whose X is a virtual dataset over the shards' X.  The shards are
    read through once first (to verify them; the merged record's checksum is the sum
    of theirs), before any file is created."""
    import h5py

    from ._signals import deferred
    from .atomic import SafeFile, atomic_path
    from .output import _write_annotations, make_record, write_record, write_root_attrs

    first = order[0]
    start, stop = first.start, order[-1].stop
    D = first.columns
    if progress is not None and hasattr(progress, "phase"):
        progress.phase("verify", stop - start)
    for _, block in src.chunks(chunk_rows, start, stop):
        if progress:
            progress(block.shape[0])
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
                names, names_sha, obs_sha = _write_annotations(f, src, start, stop - start, D, "dense")
                clipped = _clipped(order)
                write_root_attrs(f, provenance, start, stop - start, D, "dense", clipped)
                f.attrs["virtual_sources"] = [os.path.relpath(os.path.abspath(s.path), out_dir) for s in order]
                write_record(f, make_record(provenance, start=start, n_rows=stop - start, columns=D, layout="dense",
                                            dtype=first.dtype, compression="none", nnz=(stop - start) * D,
                                            checksums=src.digests(), names=names, names_sha256=names_sha,
                                            clipped=clipped, obs_sha256=obs_sha))
        sink.check()
    return {"rows": stop - start, "columns": D, "nnz": (stop - start) * D, "output": str(output)}
