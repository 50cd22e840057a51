"""Forging feature files, as a hostile user would: edits that keep every checksum valid.

A forger can rewrite any dataset (HDF5 recomputes its fletcher32 checksums), recompute
the seal of the root attributes (:func:`rfsgen.features._seal`) and the SHA-256 in the
rfsgen header (:func:`rfsgen.features._write_header`), so only the reader's checks of
the *meaning* of a file stand between it and the transform.  Used by
``tests/test_features.py`` and reusable by the fuzz harness::

    from forge import forge, set_attr, set_values, external_storage
    bad = forge(valid_path, tmp_path / "bad.h5", set_values("term_power", 0, 2**60))

Every edit is a function of an open, writable ``h5py.File``; :func:`forge` copies the
valid file, applies the edits in order, and re-seals.  Datasets keep their names and
their ``term_node`` encoding attribute; raw values are what is stored (``term_node``
holds differences within a column, see :mod:`rfsgen.features`).
"""

from __future__ import annotations

import shutil
import zlib

import h5py
import numpy as np

from rfsgen.features import CHUNK, REQUIRED, _seal, _write_header

#: Datasets and their role, for generators.
DATASETS = REQUIRED
ATTRIBUTES = ("columns", "draws", "seed", "nodes", "scheme", "stats", "command", "tool_version", "skeleton_path",
              "format_version")


def reseal(path) -> None:
    """Recompute the attribute seal and the header checksum of ``path`` in place."""
    with h5py.File(path, "a") as f:
        if "term_node" in f and "format" in f.attrs and isinstance(f.get("term_node", getlink=True), h5py.HardLink) \
                and isinstance(f["term_node"], h5py.Dataset) and "encoding" in f["term_node"].attrs:
            try:
                _seal(f)
            except Exception:  # an attribute forged into something the seal cannot hash: leave it
                pass
    with open(path, "r+b") as fh:
        _write_header(fh, header_version(fh))


def header_version(fh) -> int:
    """The format version the file's rfsgen header states (a forger keeps it: 3 for EOF files)."""
    import re

    from rfsgen.features import FORMAT_VERSION, USERBLOCK

    fh.seek(0)
    m = re.search(rb"format_version (\d+)", fh.read(USERBLOCK))
    return int(m.group(1)) if m else FORMAT_VERSION


def forge(src, dst, *edits, seal: bool = True):
    """Copy the valid feature file ``src`` to ``dst``, apply ``edits`` (functions of an
    open ``h5py.File``), re-seal unless ``seal`` is false, and return ``dst``."""
    shutil.copy(src, dst)
    with h5py.File(dst, "a") as f:
        for edit in edits:
            edit(f)
    if seal:
        reseal(dst)
    return dst


# ----------------------------------------------------------------------------- attributes
def set_attr(name, value):
    """Set root attribute ``name`` to ``value`` (any type h5py stores: str, int, float, array)."""
    def edit(f):
        f.attrs[name] = value
    return edit


def del_attr(name):
    def edit(f):
        del f.attrs[name]
    return edit


# ----------------------------------------------------------------------------- datasets
def _keep_attrs(f, name):
    return dict(f[name].attrs) if name in f and isinstance(f[name], h5py.Dataset) else {}


def write_dataset(name, data, *, compress=True, fletcher32=True, **kw):
    """Replace dataset ``name`` by ``data`` (any shape and dtype), chunked and checksummed
    as rfsgen writes it (its attributes kept)."""
    def edit(f):
        attrs = _keep_attrs(f, name)
        del f[name]
        a = np.asarray(data)
        opts = dict(track_times=False, **kw)
        if a.size and "chunks" not in kw:
            opts["chunks"] = tuple(min(s, CHUNK) or 1 for s in a.shape) if a.ndim else None
            opts["fletcher32"] = fletcher32
            if compress:
                opts.update(compression="gzip", shuffle=True)
        f.create_dataset(name, data=a, **opts)
        for k, v in attrs.items():
            f[name].attrs[k] = v
    return edit


def map_dataset(name, fn, dtype=None):
    """Replace dataset ``name`` by ``fn(values)`` (values as int64, or float64 for omega),
    stored as ``dtype`` (default: int64 / float64)."""
    def edit(f):
        a = f[name][()]
        a = np.real(a).astype(np.float64 if a.dtype.kind in "fc" else np.int64)
        out = np.asarray(fn(a))
        write_dataset(name, out.astype(dtype) if dtype is not None else out)(f)
    return edit


def set_values(name, index, value, dtype=None):
    """Dataset ``name`` with ``values[index] = value`` (index may be a slice; negative
    indexes count from the end); stored as int64/float64 or ``dtype`` so any value fits."""
    def fn(a):
        a = a.astype(np.float64) if isinstance(value, float) or a.dtype.kind == "f" else a.astype(np.int64)
        if a.size:
            a[index] = value
        return a
    return map_dataset(name, fn, dtype)


# ----------------------------------------------------------------------------- reaching outside the file
def external_storage(name, target, nbytes=None):
    """Dataset ``name`` stored in the external file ``target`` (HDF5 "external storage":
    raw data read from any path, a FIFO included), with its current shape and dtype."""
    def edit(f):
        attrs = _keep_attrs(f, name)
        ds = f[name]
        shape, dtype = ds.shape, ds.dtype
        del f[name]
        size = nbytes if nbytes is not None else int(np.prod(shape)) * dtype.itemsize
        f.create_dataset(name, shape=shape, dtype=dtype, external=[(str(target), 0, max(size, 1))])
        for k, v in attrs.items():
            f[name].attrs[k] = v
    return edit


def external_link(name, target_file, target_path="/x"):
    def edit(f):
        del f[name]
        f[name] = h5py.ExternalLink(str(target_file), target_path)
    return edit


def soft_link(name, target="/column_kind"):
    def edit(f):
        del f[name]
        f[name] = h5py.SoftLink(target)
    return edit


def virtual(name, source_file, source_path=None):
    """Dataset ``name`` as a virtual dataset mapping ``source_path`` (default: the same
    name) of ``source_file``."""
    def edit(f):
        ds = f[name]
        shape, dtype = ds.shape, ds.dtype
        attrs = dict(ds.attrs)
        del f[name]
        layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
        layout[:] = h5py.VirtualSource(str(source_file), source_path or name, shape=shape, dtype=dtype)
        f.create_virtual_dataset(name, layout)
        for k, v in attrs.items():
            f[name].attrs[k] = v
    return edit


def with_filter(name, **kw):
    """Dataset ``name`` rewritten with other filters (e.g. ``compression="lzf"`` or
    ``scaleoffset=0``)."""
    def edit(f):
        a = f[name][()]
        attrs = _keep_attrs(f, name)
        del f[name]
        f.create_dataset(name, data=a, chunks=(max(1, min(a.size, CHUNK)),), **kw)
        for k, v in attrs.items():
            f[name].attrs[k] = v
    return edit


def gzip_bomb(name, n, dtype=np.uint64, chunk=1 << 20, chunks_written=1):
    """Dataset ``name`` declaring ``n`` values of ``dtype`` in gzip chunks of ``chunk``
    values, of which only the first ``chunks_written`` are stored (zeros, compressed
    about 1000:1); the rest read as the fill value.  A few kB of file for gigabytes."""
    def edit(f):
        attrs = _keep_attrs(f, name)
        del f[name]
        dt = np.dtype(dtype)
        ds = f.create_dataset(name, shape=(n,), dtype=dt, chunks=(min(chunk, n),), compression="gzip", shuffle=True,
                              fletcher32=True)
        payload = _zero_chunk(min(chunk, n) * dt.itemsize)
        for i in range(min(chunks_written, -(-n // chunk))):
            ds.id.write_direct_chunk((i * chunk,), payload)
        for k, v in attrs.items():
            ds.attrs[k] = v
    return edit


def _zero_chunk(nbytes: int) -> bytes:
    """A shuffled (zeros stay zeros), gzip-compressed, fletcher32-checksummed chunk of zeros."""
    from rfsgen._compiled import fletcher32

    comp = zlib.compressobj(9)
    block = bytes(1 << 20)
    out = []
    left = nbytes
    while left:
        k = min(left, len(block))
        out.append(comp.compress(block[:k]))
        left -= k
    packed = b"".join(out) + comp.flush()
    return packed + int(fletcher32(np.frombuffer(packed, dtype=np.uint8))).to_bytes(4, "little")


def embedded_skeleton(text: str):
    """Replace the embedded skeleton by ``text`` and its recorded SHA-256 accordingly."""
    import hashlib

    def edit(f):
        raw = text.encode("utf-8")
        write_dataset("skeleton", skeleton_data(f, raw))(f)
        f.attrs["skeleton_sha256"] = hashlib.sha256(raw).hexdigest()
    return edit


def skeleton_data(f, raw: bytes):
    """``raw`` as the file ``f`` stores its skeleton: one fixed-length UTF-8 string (format
    versions 4 and 5), or an array of its bytes (1-3)."""
    import h5py

    from rfsgen.features import STRING_SKELETON_VERSIONS

    if int(f.attrs["format_version"]) in STRING_SKELETON_VERSIONS:
        return np.array([raw], dtype=h5py.string_dtype("utf-8", max(len(raw), 1)))
    return np.frombuffer(raw, dtype=np.uint8)
