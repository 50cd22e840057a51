"""Ways to damage or forge rfsgen output files (shards), for the merge tests and the fuzz
harness.

Each function changes one file in place.  ``forged`` changes recompute the integrity
record and its seal as a forger would (so only the other checks can catch them);
the others leave the record as it was (accidental damage).  :data:`DAMAGES` lists
the single-shard damages by name, each ``fn(path, rng)`` with a
``numpy.random.Generator`` choosing offsets and values.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np

from rfsgen.output import (CHECKSUM_V1, RECORD_ATTR, BlockChecksum, DataChecksum, NamesChecksum, canonical_json,
                           seal_of)


# ----------------------------------------------------------------------------- reading the layout
def data_extents(path) -> list:
    """``(dataset, file offset, bytes)`` of every stored piece of X's data: the
    contiguous area of a dense X, or every chunk of a chunked dataset (a chunk stored
    uncompressed: only the part within the dataset's shape; the rest is no data)."""
    out = []
    with h5py.File(path, "r") as f:
        x = f["X"]
        items = [("X", x)] if isinstance(x, h5py.Dataset) else [(f"X/{k}", x[k]) for k in ("data", "indices", "indptr")]
        for name, ds in items:
            if ds.chunks is None:
                off = ds.id.get_offset()
                if off is not None and ds.id.get_storage_size():
                    out.append((name, off, ds.id.get_storage_size()))
            else:
                row_bytes = int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize
                for i in range(ds.id.get_num_chunks()):
                    info = ds.id.get_chunk_info(i)
                    size = info.size
                    if ds.compression is None or info.filter_mask:  # stored raw (lzf keeps what it cannot shrink)
                        first = info.chunk_offset[0]
                        size = min(size, (min(ds.shape[0], first + ds.chunks[0]) - first) * row_bytes)
                    out.append((name, info.byte_offset, size))
    return out


def record(path) -> dict:
    with h5py.File(path, "r") as f:
        return json.loads(f.attrs[RECORD_ATTR])


# ----------------------------------------------------------------------------- accidental damage
def flip_bit(path, offset: int, bit: int) -> None:
    """Flip bit ``bit`` (0-7) of the byte at ``offset``."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([b ^ (1 << bit)]))


def flip_data_bit(path, rng) -> str:
    """Flip one random bit in X's stored data; returns the dataset's name."""
    ext = [e for e in data_extents(path) if e[2] > 0]
    name, off, size = ext[int(rng.integers(len(ext)))]
    flip_bit(path, off + int(rng.integers(size)), int(rng.integers(8)))
    return name


def truncate(path, rng) -> None:
    """Cut the file at a random point of its second half."""
    with open(path, "r+b") as fh:
        size = fh.seek(0, 2)
        fh.truncate(size // 2 + int(rng.integers(max(1, size // 2))))


def set_attr(path, key, value) -> None:
    """Set a root attribute, leaving the record as it is."""
    with h5py.File(path, "r+") as f:
        f.attrs[key] = value


def strip_record(path) -> None:
    """A shard as written before integrity records."""
    with h5py.File(path, "r+") as f:
        del f.attrs[RECORD_ATTR]


def edit_record(path, reseal: bool = False, **changes) -> None:
    """Change fields of the record (``reseal``: and recompute the seal)."""
    with h5py.File(path, "r+") as f:
        rec = json.loads(f.attrs[RECORD_ATTR])
        rec.update(changes)
        if reseal:
            rec["seal"] = seal_of(rec)
        f.attrs[RECORD_ATTR] = canonical_json(rec)


def to_version1(path) -> None:
    """The shard as rfsgen wrote it before record version 2: the same record with
    version 1 and :data:`CHECKSUM_V1` (xxh64 of 1 MiB blocks of each of X's datasets'
    bytes), sealed."""
    with h5py.File(path, "r+") as f:
        rec = json.loads(f.attrs[RECORD_ATTR])
        x = f["X"]
        items = {"X": x} if isinstance(x, h5py.Dataset) else {f"X/{k}": x[k] for k in ("data", "indices", "indptr")}
        rec["datasets"] = {}
        for name, ds in items.items():
            c = BlockChecksum()
            c.update(ds[()])
            rec["datasets"][name] = c.hexdigest()
        rec.update(version=1, checksum=CHECKSUM_V1)
        rec["seal"] = seal_of(rec)
        f.attrs[RECORD_ATTR] = canonical_json(rec)


# ----------------------------------------------------------------------------- forgeries (record recomputed)
def reseal(path, **changes) -> None:
    """Recompute the record from the file as it now is (checksums of X's datasets and
    of the row names, root attributes), apply ``changes``, and seal it."""
    with h5py.File(path, "r+") as f:
        rec = json.loads(f.attrs[RECORD_ATTR])
        x = f["X"]
        items = {"X": x} if isinstance(x, h5py.Dataset) else {f"X/{k}": x[k] for k in ("data", "indices", "indptr")
                                                               if k in x}
        start = f.attrs.get("rows_start", 0)
        rec["datasets"] = data_digests(items, int(start) if isinstance(start, (int, np.integer)) else 0)
        names = NamesChecksum()
        names.update(list(f["obs/_index"].asstr()[()]))
        rec["obs_names_sha256"] = names.hexdigest()
        for k in ("rfsgen_version", "features_file", "features_sha256", "input", "rows_start", "rows_stop", "columns",
                  "layout"):
            v = f.attrs[k]
            rec[k] = v.item() if isinstance(v, np.generic) else v
        rec.update(changes)
        rec["seal"] = seal_of(rec)
        f.attrs[RECORD_ATTR] = canonical_json(rec)


def data_digests(items: dict, start: int) -> dict:
    """The record's checksums of X's datasets ``items`` (name -> h5py dataset) as they
    now are, row ``start`` first, as a forger computes them.  Data a checksum cannot
    describe (a dtype or shape rfsgen never writes) gets zeros: merge refuses it first."""
    digests = {name: "0" * 16 for name in items}
    try:
        if "X" in items:
            x = items["X"][()]
            c = DataChecksum("dense", x.dtype, x.shape[1] if x.ndim > 1 else 1)
            c.dense(x.reshape(x.shape[0], -1), start)
        else:
            data, indices, indptr = (items[f"X/{k}"][()] for k in ("data", "indices", "indptr"))
            ptr = indptr.astype(np.int64).reshape(-1)
            if not ptr.size or ptr[0] < 0 or np.any(np.diff(ptr) < 0) or ptr[-1] > min(data.size, indices.size):
                return digests  # not a row pointer into the data (the compiled sums trust it)
            width = items["X/data"].file.attrs.get("columns", 0)
            c = DataChecksum("csr", data.dtype, int(width) if isinstance(width, (int, np.integer)) else 0)
            c.csr(data.reshape(-1), indices.reshape(-1), ptr, start)
    except (KeyError, ValueError, TypeError, IndexError):
        return digests
    return {**digests, **c.hexdigests()}


def forge_attr(path, key, value, **changes) -> None:
    """Set a root attribute and recompute the record (and its seal) to agree."""
    set_attr(path, key, value)
    try:
        reseal(path, **changes)
    except (TypeError, ValueError):  # a value JSON cannot hold: the record is left alone
        pass


def replace_dataset(path, name, data, **changes) -> None:
    """Replace dataset ``name`` (e.g. ``X`` or ``X/data``) by ``data`` and reseal."""
    with h5py.File(path, "r+") as f:
        attrs = dict(f[name].attrs)
        del f[name]
        ds = f.create_dataset(name, data=data)
        for k, v in attrs.items():
            ds.attrs[k] = v
    reseal(path, **changes)


def retype_x(path, dtype) -> None:
    """X's values (dense X, or X/data) stored as ``dtype`` (int32, float16, ...), resealed."""
    with h5py.File(path, "r") as f:
        name = "X" if isinstance(f["X"], h5py.Dataset) else "X/data"
        data = f[name][()]
    replace_dataset(path, name, data.astype(dtype))


def narrow_x(path) -> None:
    """A dense X with its last column gone, resealed (the record still says the width)."""
    with h5py.File(path, "r") as f:
        data = f["X"][()]
    replace_dataset(path, "X", data[:, :-1])


def put_nan(path, rng) -> None:
    """A NaN in X's values, record and seal recomputed."""
    with h5py.File(path, "r+") as f:
        ds = f["X"] if isinstance(f["X"], h5py.Dataset) else f["X/data"]
        data = ds[()]
        if data.size:
            data.reshape(-1)[int(rng.integers(data.size))] = rng.choice([np.nan, np.inf, -np.inf])
            ds[...] = data
    reseal(path)


def link_x(path, target, kind: str = "external") -> None:
    """X replaced by an external link to ``target``'s X, or a soft link to a copy of
    it inside the file; record left alone (it still describes the data reached)."""
    with h5py.File(path, "r+") as f:
        if kind == "external":
            del f["X"]
            f["X"] = h5py.ExternalLink(str(target), "/X")
        else:
            f.move("X", "Y")
            f["X"] = h5py.SoftLink("/Y")


def external_storage_x(path, rng=None) -> None:
    """A dense X whose data lives in a raw file beside it (HDF5 external storage)."""
    with h5py.File(path, "r+") as f:
        data = f["X"][()]
        attrs = dict(f["X"].attrs)
        del f["X"]
        raw = str(path) + ".raw"
        data.tofile(raw)
        ds = f.create_dataset("X", shape=data.shape, dtype=data.dtype, external=[(raw, 0, data.nbytes)])
        for k, v in attrs.items():
            ds.attrs[k] = v


def virtual_x(path, rng=None) -> None:
    """A dense X that is a virtual dataset over a copy of the data in another file."""
    src = str(path) + ".src.h5"
    with h5py.File(path, "r+") as f:
        data = f["X"][()]
        attrs = dict(f["X"].attrs)
        with h5py.File(src, "w") as g:
            g["X"] = data
        del f["X"]
        layout = h5py.VirtualLayout(shape=data.shape, dtype=data.dtype)
        layout[...] = h5py.VirtualSource(src, "X", shape=data.shape)
        ds = f.create_virtual_dataset("X", layout)
        for k, v in attrs.items():
            ds.attrs[k] = v


def add_member(path, rng=None, where: str = "extra") -> None:
    """An extra dataset (rfsgen writes none), record resealed."""
    with h5py.File(path, "r+") as f:
        f[where] = np.arange(3)
    reseal(path)


def remove_member(path, rng) -> None:
    """One of the output's groups or CSR datasets gone, record resealed."""
    with h5py.File(path, "r+") as f:
        names = ["obs", "var", "uns", "layers"] + ([f"X/{k}" for k in ("indices", "indptr")]
                                                    if isinstance(f["X"], h5py.Group) else [])
        del f[names[int(rng.integers(len(names)))]]
    try:
        reseal(path)
    except KeyError:  # obs gone: the record cannot be recomputed; left as it was
        pass


def swap_ranges(a, b) -> None:
    """Exchange two shards' row ranges in their attributes, each record resealed (the
    data and row names stay where they are)."""
    ra, rb = record(a), record(b)
    for path, other in ((a, rb), (b, ra)):
        forge_attr(path, "rows_start", other["rows_start"])
        forge_attr(path, "rows_stop", other["rows_stop"])


def copy(src, dst) -> None:
    shutil.copyfile(src, dst)


#: Single-shard damages: name -> fn(path, rng).  Every one must make merge refuse.
DAMAGES = {
    "flip a data bit": flip_data_bit,
    "flip bits": lambda p, rng: [flip_data_bit(p, rng) for _ in range(int(rng.integers(2, 6)))],
    "truncate": truncate,
    "rows_start text": lambda p, rng: set_attr(p, "rows_start", "abc"),
    "rows_start float": lambda p, rng: forge_attr(p, "rows_start", 1.5),
    "columns changed": lambda p, rng: set_attr(p, "columns", int(record(p)["columns"]) + int(rng.integers(1, 4))),
    "columns forged": lambda p, rng: forge_attr(p, "columns", int(record(p)["columns"]) - 1),
    "rows forged": lambda p, rng: forge_attr(p, "rows_stop", int(record(p)["rows_stop"]) + int(rng.integers(1, 4))),
    "layout forged": lambda p, rng: forge_attr(p, "layout", "dense" if record(p)["layout"] == "csr" else "csr"),
    "features forged": lambda p, rng: forge_attr(p, "features_sha256", "0" * 64),
    "record edited": lambda p, rng: edit_record(p, nnz=int(record(p)["nnz"]) + 1),
    "record resealed": lambda p, rng: edit_record(p, reseal=True, dtype="float64"),
    "record missing": lambda p, rng: strip_record(p),
    "X int32": lambda p, rng: retype_x(p, np.int32),
    "X float16": lambda p, rng: retype_x(p, np.float16),
    "NaN": put_nan,
    "extra dataset": add_member,
    "missing member": remove_member,
    "soft link": lambda p, rng: link_x(p, None, "soft"),
}


def repoint_chunk(path, name: str, coord: int, offset: int) -> bool:
    """Make the chunk index of dataset ``name`` place its chunk at ``coord`` at file
    ``offset`` (no bytes moved; the record is not touched): the first 8-byte match of
    its address that HDF5 then reads back as the chunk's.  False when none does."""
    import struct

    with h5py.File(path, "r") as f:
        was = f[name].id.get_chunk_info_by_coord((coord,)).byte_offset
    raw = Path(path).read_bytes()
    key = struct.pack("<Q", was)
    at = raw.find(key)
    while at >= 0:
        forged = bytearray(raw)
        forged[at:at + 8] = struct.pack("<Q", offset)
        Path(path).write_bytes(bytes(forged))
        try:
            with h5py.File(path, "r") as f:
                if f[name].id.get_chunk_info_by_coord((coord,)).byte_offset == offset:
                    return True
        except (OSError, RuntimeError, KeyError, ValueError):
            pass
        at = raw.find(key, at + 1)
    Path(path).write_bytes(raw)
    return False
