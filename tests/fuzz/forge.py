"""Damage done to files a case starts from: what a hostile colleague or a bad disk would do.

Every operation is a JSON-able dict ``{"op": NAME, "file": REL, ...}`` applied by :func:`apply`
in the case's directory, so a failing case replays exactly.  Forging operations on feature files
recompute what rfsgen checks (the attribute seal and the header's SHA-256, and HDF5's fletcher32
checksums by rewriting the dataset): only rfsgen's validation of values can catch them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np


def _reseal(path: Path) -> None:
    """Recompute a feature file's attribute seal and header checksum, as a forger would."""
    import h5py

    from rfsgen import features

    try:
        with h5py.File(path, "r+") as f:
            features._seal(f)
    except Exception:  # the forged file may no longer have what the seal reads; keep the old seal
        pass
    with open(path, "r+b") as fh:
        head = fh.read(len(features.MAGIC))
        if head == features.MAGIC:
            import re

            fh.seek(0)
            m = re.search(rb"format_version (\d+)", fh.read(features.USERBLOCK))
            features._write_header(fh, int(m.group(1)) if m else features.FORMAT_VERSION)


#: Largest dataset a forging operation reads whole (a "bomb" declares up to 10^9 rows:
#: rewriting one in a later operation of the same case would take the builder's memory).
MAX_READ = 256 << 20


def _whole(f, name):
    """Dataset ``name`` of the open file ``f`` read whole, if at most :data:`MAX_READ`
    bytes (else ValueError: the case cannot be built and is skipped)."""
    ds = f[name]
    nbytes = int(np.prod(ds.shape, dtype=object)) * ds.dtype.itemsize if ds.shape is not None else 0
    if nbytes > MAX_READ:
        raise ValueError(f"'{name}' declares {nbytes} bytes: too large to rewrite in a case")
    for target, _, _ in ds.external or ():  # an earlier op's external storage: a FIFO or device would block
        path = target.decode() if isinstance(target, bytes) else str(target)
        path = path if os.path.isabs(path) else os.path.join(os.path.dirname(f.filename), path)
        if not os.path.isfile(path):
            return np.zeros(ds.shape, ds.dtype)  # its values do not matter to a forgery; its shape does
    return ds[()]


def _value(spec):
    """An attribute value from its JSON description ``{"t": type, "v": value}``."""
    t, v = spec["t"], spec["v"]
    if t == "int":
        return np.int64(v) if -(2**63) <= v < 2**63 else str(v)
    if t == "uint":
        return np.uint64(v)
    if t == "float":
        return np.float64(float(v))
    if t == "str":
        return str(v)
    if t == "bytes":
        return np.bytes_(str(v).encode())
    if t == "array":
        return np.asarray(v)
    if t == "bool":
        return np.bool_(v)
    raise ValueError(t)


def _rewrite(f, name, data, **kw):
    attrs = dict(f[name].attrs) if name in f and hasattr(f[name], "attrs") else {}
    del f[name]
    opts = dict(fletcher32=True) if kw.pop("checksum", True) else {}
    opts.update(kw)
    ds = f.create_dataset(name, data=data, **opts)
    for k, v in attrs.items():
        ds.attrs[k] = v
    return ds


def apply(op: dict, d: Path) -> None:
    import h5py

    kind = op["op"]
    p = Path(d) / op["file"] if "file" in op else None
    if kind == "bitflip":
        size = p.stat().st_size
        lo = op.get("lo", 0)
        pos = lo + int(op["pos"] * max(1, size - lo)) if isinstance(op["pos"], float) else int(op["pos"])
        pos = min(max(pos, 0), size - 1)
        with open(p, "r+b") as fh:
            fh.seek(pos)
            b = fh.read(1)[0]
            fh.seek(pos)
            fh.write(bytes([b ^ (1 << op["bit"])]))
        if op.get("reseal"):
            _reseal(p)
    elif kind == "flip_in_dataset":
        # a bit of a dataset's stored bytes (contiguous datasets only; else anywhere after the header)
        with h5py.File(p, "r") as f:
            ds = f[op["name"]]
            off = ds.id.get_offset()
            n = ds.id.get_storage_size()
            if off is None and ds.chunks is not None and ds.id.get_num_chunks():  # chunked: a bit of one chunk
                k = int(op["pos"] * ds.id.get_num_chunks())
                info = ds.id.get_chunk_info(k)
                off, n = info.byte_offset, info.size
                if ds.compression is None:  # a chunk is allocated whole; flip a bit of the data it holds
                    n = min(n, max(1, (ds.size - k * int(np.prod(ds.chunks))) * ds.dtype.itemsize))
                op = dict(op, pos=(op["pos"] * ds.id.get_num_chunks()) % 1.0)
        if off is None or not n:
            return
        pos = off + int(op["pos"] * n)
        with open(p, "r+b") as fh:
            fh.seek(pos)
            b = fh.read(1)[0]
            fh.seek(pos)
            fh.write(bytes([b ^ (1 << op["bit"])]))
    elif kind == "chunk_place":  # the chunk index points chunk 0 elsewhere (no bytes moved)
        from tests.damage import repoint_chunk

        size = p.stat().st_size
        with h5py.File(p, "r") as f:
            if not f[op["name"]].id.get_num_chunks():
                return
            other = "X/indices" if op["name"] == "X/data" else "X/data"
            offset = {"past end": 10**9, "across end": size - 40, "file start": 0,
                      "other dataset": f[other].id.get_chunk_info(0).byte_offset}[op["where"]]
        repoint_chunk(p, op["name"], 0, offset)
    elif kind == "truncate":
        size = p.stat().st_size
        os.truncate(p, int(size * op["keep"]))
    elif kind == "set_attr":
        with h5py.File(p, "r+") as f:
            obj = f[op.get("obj", "/")]
            if op.get("delete"):
                if op["key"] in obj.attrs:
                    del obj.attrs[op["key"]]
            else:
                obj.attrs[op["key"]] = _value(op["value"])
        if op.get("reseal"):
            _reseal(p)
    elif kind == "swap_attrs":  # swap attributes between two files (shards' row ranges)
        q = Path(d) / op["other"]
        with h5py.File(p, "r+") as f, h5py.File(q, "r+") as g:
            for k in op["keys"]:
                a, b = f.attrs[k], g.attrs[k]
                f.attrs[k], g.attrs[k] = b, a
    elif kind == "dataset":
        _dataset_op(p, op)
        if op.get("reseal"):
            _reseal(p)
    elif kind == "skeleton_text":  # replace a feature file's embedded skeleton and its recorded hash
        import hashlib

        from rfsgen import features

        src = op["text"].encode()
        with h5py.File(p, "r+") as f:
            if int(f.attrs["format_version"]) in features.STRING_SKELETON_VERSIONS:  # one fixed-length string
                data = np.array([src], dtype=h5py.string_dtype("utf-8", max(len(src), 1)))
            else:
                data = np.frombuffer(src, dtype=np.uint8)
            _rewrite(f, "skeleton", data, compression="gzip")
            f.attrs["skeleton_sha256"] = hashlib.sha256(src).hexdigest()
        _reseal(p)
    elif kind == "mkfifo":
        os.mkfifo(Path(d) / op["file"])
    elif kind == "write":
        (Path(d) / op["file"]).write_bytes(op["text"].encode())
    else:
        raise ValueError(f"unknown op {kind}")


def _dataset_op(p: Path, op: dict) -> None:
    import h5py

    name, how = op["name"], op["how"]
    with h5py.File(p, "r+") as f:
        if how == "values":  # set entries (index list or 'all') to values, keep dtype unless told
            old = _whole(f, name)
            dt = np.dtype(op.get("dtype", old.dtype.str))
            # Integers as Python ints (object): a uint64 value of 2^63 or more fits no int64,
            # neither as an entry written (the op's values) nor one kept (the old data's).
            new = old.astype(np.float64) if dt.kind == "f" else \
                (old if old.dtype.kind in "iub" else old.astype(np.int64)).astype(object)
            idx = op.get("index", "all")
            vals = np.asarray(op["values"], dtype=np.float64 if dt.kind == "f" else object)
            if dt.kind in "iu" and any(not np.iinfo(dt).min <= int(v) <= np.iinfo(dt).max for v in vals.ravel()):
                dt = np.dtype("<u8") if min(int(v) for v in vals.ravel()) >= 0 and dt.kind == "u" else np.dtype("<i8")
                if any(not np.iinfo(dt).min <= int(v) <= np.iinfo(dt).max for v in vals.ravel()):
                    dt = np.dtype("<u8")  # only 2^63..2^64-1 gets here
            if new.size == 0:  # nothing to overwrite: the case runs on the intact dataset
                return
            if idx == "all":
                new[...] = vals[0] if vals.size == 1 else vals
            else:
                idx = [i % max(1, new.shape[0]) for i in idx]
                new = new.reshape(new.shape[0], -1) if new.ndim > 1 else new
                for i, v in zip(idx, np.resize(vals, len(idx))):
                    new[i] = v
            with np.errstate(all="ignore"):
                data = np.asarray(new, dtype=dt) if dt.kind == "f" else np.asarray([int(v) for v in new.ravel()],
                                                                                      dtype=object).astype(dt).reshape(new.shape)
            _rewrite(f, name, data, compression="gzip" if dt.kind != "f" or name != "X" else None)
        elif how == "dtype":
            data = _whole(f, name)
            with np.errstate(all="ignore"):
                _rewrite(f, name, data.astype(op["dtype"]))
        elif how == "reshape2d":
            data = _whole(f, name)
            _rewrite(f, name, data.reshape(1, -1) if data.ndim == 1 else data.reshape(-1))
        elif how == "narrow":  # drop the last column of a 2-D dataset
            data = _whole(f, name)
            _rewrite(f, name, data[:, :-1], checksum=False)
        elif how == "empty":
            data = _whole(f, name)
            _rewrite(f, name, data[:0])
        elif how == "bomb":  # a tiny dataset that declares a huge size: unwritten chunks read as the fill value
            old = f[name]
            dt = old.dtype
            shape = tuple(op["shape"])
            attrs = dict(old.attrs)
            del f[name]
            # a string dataset (the skeleton since feature-file format 4) takes the empty string's fill
            fill = None if h5py.check_string_dtype(dt) is not None else op.get("fill", 0)
            ds = f.create_dataset(name, shape=shape, dtype=dt, chunks=True, compression="gzip", fletcher32=True,
                                  fillvalue=fill)
            for k, v in attrs.items():
                ds.attrs[k] = v
        elif how == "external":  # raw storage in another file of the machine
            old = f[name]
            dt, shape = old.dtype, old.shape
            target = op["target"]
            tpath = target if os.path.isabs(target) else str(p.parent / target)
            nbytes = int(np.prod(shape)) * dt.itemsize
            del f[name]
            f.create_dataset(name, shape=shape, dtype=dt, external=[(tpath, 0, max(nbytes, 1))])
        elif how in ("softlink", "extlink", "loop"):
            target = op.get("target", "/elsewhere")
            data = _whole(f, name) if isinstance(f[name], h5py.Dataset) else None
            del f[name]
            if how == "loop":
                f[name] = h5py.SoftLink("/" + name)
            elif how == "softlink":
                f.create_dataset("/elsewhere", data=data)
                f[name] = h5py.SoftLink("/elsewhere")
            else:
                other = p.parent / op.get("other", "elsewhere.h5")
                with h5py.File(other, "a") as g:
                    if "d" not in g and data is not None:
                        g.create_dataset("d", data=data)
                f[name] = h5py.ExternalLink(other.name, "/d")
        elif how == "virtual":
            data = _whole(f, name)
            other = p.parent / op.get("other", "source.h5")
            with h5py.File(other, "a") as g:
                if "d" not in g:
                    g.create_dataset("d", data=data)
            layout = h5py.VirtualLayout(shape=data.shape, dtype=data.dtype)
            layout[...] = h5py.VirtualSource(other.name, "d", shape=data.shape)
            del f[name]
            f.create_virtual_dataset(name, layout)
        else:
            raise ValueError(how)


def describe(op: dict) -> str:
    return json.dumps(op, sort_keys=True)
