"""Rows cases: finite extremes, subnormal scalings, NaN/inf, wrong shapes and dtypes, empty
inputs, every input format, and crafted files whose headers declare huge shapes.

A rows file is described by parameters (``write_rows``), so a case replays from a few numbers:
``{"seed", "n", "width", "mode", "fmt", "dtype", "layout", ...}``.
"""

from __future__ import annotations

import io
import struct
import zipfile

import numpy as np

from . import fixtures

EXTREMES = [1.7e308, -1.7e308, 1e300, -1e300, 1e100, -1e100, 5e-324, -5e-324, 2.0**-1040, 0.0, 1.0, -1.0]
# exponents k of the scalings x * 2^k; sphere skeletons must give the unscaled features for each
SCALES = [-1074 + 60, -1060, -1040, -1022, -600, -100, 100, 600, 1000]


def make_array(p: dict) -> np.ndarray:
    """The rows (before dtype and format) that parameters ``p`` describe."""
    rng = np.random.default_rng(p["seed"])
    n, w = p["n"], p["width"]
    mode = p.get("mode", "normal")
    if mode == "categorical":
        cats = p.get("cats", [10, 10, 5, 5])
        x = np.column_stack([rng.integers(0, c, n) for c in cats] +
                            [rng.choice([-1.0, 1.0], n) for _ in range(w - len(cats))]).astype(np.float64)
        if p.get("bad_cat"):
            i, j = rng.integers(0, max(n, 1)), rng.integers(0, w)
            if n:
                x[i, j] = p["bad_cat"]
        return x
    x = rng.standard_normal((n, w))
    if mode == "pm1":
        x = rng.choice([-1.0, 1.0], size=(n, w))
    elif mode == "int01":
        x = rng.integers(0, 2, size=(n, w)).astype(np.float64)
    elif mode == "scaled":
        x = x * 2.0 ** p["scale"]
    elif mode == "extreme":
        mask = rng.random((n, w)) < p.get("density", 0.3)
        x[mask] = rng.choice(EXTREMES, size=int(mask.sum()))
    elif mode == "nonfinite":
        k = max(1, int(n * w * p.get("density", 0.01)))
        if n * w:
            idx = rng.integers(0, n * w, k)
            x.flat[idx] = rng.choice([np.nan, np.inf, -np.inf], size=k)
    elif mode == "zeros":
        x[:] = 0.0
    elif mode == "big":
        x = x * 10.0 ** p.get("exp10", 300)
    elif mode == "uniform":  # inside a box [lo, hi] (u in [0.05, 0.95]), some values replaced by ``poke`` ones
        u = rng.uniform(0.05, 0.95, (n, w))
        lo, hi = np.asarray(p.get("lo", 0.0), dtype=np.float64), np.asarray(p.get("hi", 1.0), dtype=np.float64)
        with np.errstate(all="ignore"):
            x = lo * (1 - u) + hi * u  # (no overflow for any finite box)
        if p.get("poke") and n * w:
            idx = rng.choice(n * w, size=min(n * w, max(1, int(n * w * p.get("density", 0.05)))), replace=False)
            x.flat[idx] = rng.choice(np.asarray(p["poke"], dtype=np.float64), size=idx.size)
    return x


def _has_bad_category(p: dict) -> bool:
    """Whether categorical-poly rows ``p``, as stored (after their dtype), hold a value its
    nodes refuse: a category that is not an integer in 0..k-1 (columns 0-3), a flag other
    than -1/+1 (columns 4-5), or NaN.  The bad value may land on a column where it is
    valid (-1 on a flag) or be truncated into range by an integer dtype (2.5 -> 2)."""
    x = make_array(p)
    with np.errstate(all="ignore"):
        x = x.astype(p.get("dtype", "float64")).astype(np.float64)
    cats = np.array(p.get("cats", [10, 10, 5, 5]), dtype=np.float64)
    c, f = x[:, :cats.size], x[:, cats.size:]
    bad = np.isnan(x).any() or ((c != np.floor(c)) | (c < 0) | (c >= cats)).any()
    return bool(bad or ((f != -1) & (f != 1)).any())


def write_rows(p: dict, path) -> None:
    """Write the rows ``p`` describes in format ``p['fmt']`` (crafted formats ignore the values)."""
    fmt = p.get("fmt", "npy")
    if fmt.startswith("crafted-"):
        return _crafted(fmt[len("crafted-"):], p, path)
    x = make_array(p)
    shape = p.get("shape")
    if shape == "1d":
        x = x.ravel()
    elif shape == "3d" and x.ndim == 2:
        x = x.reshape(x.shape[0], 1, -1)
    elif shape == "transposed":
        x = x.T
    elif shape == "empty":
        x = x[:0]
    dtype = p.get("dtype", "float64")
    with np.errstate(all="ignore"):
        if dtype == "bool":
            x = x > 0
        elif dtype == "complex128":
            x = x.astype(np.complex128)
        else:
            x = x.astype(dtype)
    if fmt in ("csv", "tsv", "stdin-csv", "sparse-csr", "sparse-coo", "h5ad-csr") and x.ndim > 2:
        x = x.reshape(len(x), -1)  # text and sparse matrices are 2-D
    if fmt in ("sparse-csr", "sparse-coo", "h5ad-csr") and x.dtype == np.float16:
        x = x.astype(np.float32)  # scipy.sparse has no float16
    # scipy.sparse holds native byte order only: a big-endian matrix is made native and its
    # values stored in the asked byte order member by member (as another program may write them)
    stored = x.dtype if fmt in ("sparse-csr", "sparse-coo", "h5ad-csr") and not x.dtype.isnative else None
    if stored is not None:
        x = x.astype(stored.newbyteorder("="))
    if fmt == "npy" or fmt == "stdin-npy":
        with open(path, "wb") as fh:
            np.save(fh, x)
    elif fmt == "npz":
        np.savez(path, rows=x) if not p.get("two_keys") else np.savez(path, rows=x, other=x)
        _rename(path)
    elif fmt in ("csv", "tsv", "stdin-csv"):
        sep = "\t" if fmt == "tsv" else ","
        lines = ([sep.join(f"c{j}" for j in range(x.shape[-1] if x.ndim > 1 else 1))] if p.get("header") else [])
        for row in np.atleast_2d(x) if x.ndim else [[x]]:
            lines.append(sep.join(repr(float(v)) if not isinstance(v, (complex, np.complexfloating)) else str(v)
                                  for v in np.atleast_1d(row)))
        with open(path, "w") as fh:
            fh.write("\n".join(lines) + ("\n" if lines else ""))
    elif fmt == "h5":
        import h5py

        with h5py.File(path, "w") as f:
            f.create_dataset("rows", data=x)
    elif fmt in ("sparse-csr", "sparse-coo"):
        import scipy.sparse as sp

        m = sp.csr_matrix(np.atleast_2d(x)) if fmt == "sparse-csr" else sp.coo_matrix(np.atleast_2d(x))
        if stored is None:
            with open(path, "wb") as fh:
                sp.save_npz(fh, m)
        else:  # scipy.sparse.save_npz's members, the values in their own byte order
            parts = {"indices": m.indices, "indptr": m.indptr} if fmt == "sparse-csr" else {"row": m.row, "col": m.col}
            _write_npz(path, dict(parts, format=np.array(m.format.encode()), shape=np.array(m.shape),
                                  data=m.data.astype(stored)))
    elif fmt in ("h5ad-dense", "h5ad-csr"):
        import h5py
        import scipy.sparse as sp

        with h5py.File(path, "w") as f:
            f.attrs["encoding-type"] = "anndata"
            f.attrs["encoding-version"] = "0.1.0"
            if fmt == "h5ad-dense":
                f.create_dataset("X", data=x)
            else:
                m = sp.csr_matrix(np.atleast_2d(x))
                g = f.create_group("X")
                g.attrs["encoding-type"] = "csr_matrix"
                g.attrs["encoding-version"] = "0.1.0"
                g.attrs["shape"] = np.array(m.shape, dtype=np.int64)
                g["data"] = m.data if stored is None else m.data.astype(stored)
                g["indices"], g["indptr"] = m.indices, m.indptr.astype(np.int64)
            obs = f.create_group("obs")
            obs.attrs["encoding-type"] = "dataframe"
            obs.attrs["encoding-version"] = "0.2.0"
            obs.attrs["_index"] = "_index"
            obs.attrs["column-order"] = np.array([], dtype="S")
            if p.get("nul_names"):  # VLEN strings cannot hold NUL; fixed-length ones can
                names = np.array([f"cell{i}".encode() + (b"\x00x" if i == 0 else b"") for i in range(len(x))])
                obs.create_dataset("_index", data=names)
            else:
                obs.create_dataset("_index", data=np.array([f"cell{i}" for i in range(len(x))],
                                                           dtype=h5py.string_dtype()))
    else:
        raise ValueError(fmt)


def _rename(path):
    """np.savez appends .npz when the name lacks it."""
    import os

    if not str(path).endswith(".npz") and os.path.exists(str(path) + ".npz"):
        os.replace(str(path) + ".npz", path)


def _write_npz(path, arrays: dict) -> None:
    """An ``.npz`` of ``arrays`` written member by member (so that a member may lie about the others)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for k, v in arrays.items():
            b = io.BytesIO()
            np.save(b, v)
            z.writestr(k + ".npy", b.getvalue())
    with open(path, "wb") as fh:
        fh.write(buf.getvalue())


def _npy_header(shape, descr="<f8") -> bytes:
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, tuple(shape))
    total = 10 + len(d) + 1
    pad = (64 - total % 64) % 64
    h = (d + " " * pad + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h


def _crafted(kind, p, path) -> None:
    """Small files that declare far more than they hold."""
    rows, width = int(p.get("declared_rows", 10**12)), p["width"]
    if kind == "npy":  # header says (rows, width); a few bytes of data follow
        with open(path, "wb") as fh:
            fh.write(_npy_header((rows, width), p.get("descr", "<f8")) + b"\0" * 64)
    elif kind == "npz-coo":  # scipy's COO npz declaring shape (rows, width) with 3 entries
        # three of the rows' values (their NaN/inf first) stored in the last rows declared:
        # a reader that streams the empty rows before them never reaches them
        flat = make_array(p).ravel()
        pick = np.concatenate([np.flatnonzero(~np.isfinite(flat)), np.arange(flat.size)])
        pick = pick[np.sort(np.unique(pick, return_index=True)[1])][:3]
        n = max(1, int(p.get("n", 1)))
        arrays = {"row": (rows - n + pick // width).astype(np.int64) if pick.size else np.zeros(0, np.int64),
                  "col": (pick % width).astype(np.int64), "data": flat[pick] if pick.size else np.zeros(0),
                  "shape": np.array([rows, width], dtype=np.int64), "format": np.array(b"coo")}
        _write_npz(path, arrays)
    elif kind == "npz-csr":  # CSR npz whose indptr claims rows it does not have
        arrays = {"indptr": np.zeros(4, dtype=np.int64), "indices": np.zeros(0, dtype=np.int32),
                  "data": np.zeros(0), "shape": np.array([rows, width], dtype=np.int64),
                  "format": np.array(b"csr")}
        _write_npz(path, arrays)
    elif kind == "h5":  # a chunked dataset declaring (rows, width), no chunk written: it reads as zeros
        import h5py

        with h5py.File(path, "w") as f:
            f.create_dataset("rows", shape=(rows, width), dtype="f8", chunks=(1, width), maxshape=(None, width))
    elif kind == "h5ad-loop":  # X a soft link to itself
        import h5py

        with h5py.File(path, "w") as f:
            f.attrs["encoding-type"] = "anndata"
            f["X"] = h5py.SoftLink("/X")
    elif kind == "h5ad-csr-huge":  # a CSR group whose shape attribute declares huge rows
        import h5py

        with h5py.File(path, "w") as f:
            f.attrs["encoding-type"] = "anndata"
            g = f.create_group("X")
            g.attrs["encoding-type"] = "csr_matrix"
            g.attrs["encoding-version"] = "0.1.0"
            g.attrs["shape"] = np.array([rows, width], dtype=np.int64)
            g["data"] = np.ones(3)
            g["indices"] = np.array([0, 1, 2], dtype=np.int32) % width
            g.create_dataset("indptr", shape=(rows + 1,), dtype="i8", chunks=(4096,))
    elif kind == "npy-truncated":
        with open(path, "wb") as fh:
            fh.write(_npy_header((100, width)) + b"\0" * 80)
    elif kind == "npy-fortran":
        x = np.asfortranarray(make_array(dict(p, fmt="npy")))
        with open(path, "wb") as fh:
            np.save(fh, x)
    elif kind == "npy-object":
        with open(path, "wb") as fh:
            np.save(fh, np.array([[1, "a"]] * 3, dtype=object), allow_pickle=True)
    else:
        raise ValueError(kind)


# ----------------------------------------------------------------------------- cases
SKELS = list(fixtures.WIDTHS)
FORMATS = ["npy"] * 6 + ["npz", "csv", "tsv", "h5", "sparse-csr", "sparse-coo", "h5ad-dense", "h5ad-csr",
                         "stdin-npy", "stdin-csv"]
CRAFTED = ["npy", "npz-coo", "npz-csr", "h5", "h5ad-loop", "h5ad-csr-huge", "npy-truncated", "npy-fortran",
           "npy-object"]
EXT = {"npy": "npy", "npz": "npz", "csv": "csv", "tsv": "tsv", "h5": "h5", "sparse-csr": "npz",
       "sparse-coo": "npz", "h5ad-dense": "h5ad", "h5ad-csr": "h5ad", "stdin-npy": "npy", "stdin-csv": "csv"}


def generate(rng: np.random.Generator, cid: str) -> dict:
    skel = SKELS[rng.integers(len(SKELS))]
    width = fixtures.WIDTHS[skel]
    big = width > 100
    n = int(rng.integers(1, 6 if big else 40))
    seed = int(rng.integers(2**31))
    mode = rng.choice(["normal", "scaled", "scaled", "extreme", "extreme", "nonfinite", "zeros", "big"])
    p = {"seed": seed, "n": n, "width": width, "mode": str(mode)}
    if skel == "categorical-poly":
        p["mode"] = "categorical"
        if rng.random() < 0.4:
            p["bad_cat"] = float(rng.choice([10, -1, 2.5, 1e300, 2**31, np.nan, -0.0]))
    if p["mode"] == "scaled":
        p["scale"] = int(rng.choice(SCALES))
    if p["mode"] == "big":
        p["exp10"] = int(rng.choice([100, 150, 200, 300, 307]))
    if p["mode"] in ("extreme", "nonfinite"):
        p["density"] = float(rng.choice([0.01, 0.1, 0.5, 1.0]))
    must_fail = None
    r = rng.random()
    if r < 0.12:
        fmt = "crafted-" + str(rng.choice(CRAFTED))
        p["declared_rows"] = int(rng.choice([10**9, 10**12, 2**40, 2**62]))
        p["descr"] = str(rng.choice(["<f8", "<f4", ">f8", "|b1", "<c16"]))
        ext = {"crafted-npy": "npy", "crafted-npz-coo": "npz", "crafted-npz-csr": "npz", "crafted-h5": "h5",
               "crafted-h5ad-loop": "h5ad", "crafted-h5ad-csr-huge": "h5ad", "crafted-npy-truncated": "npy",
               "crafted-npy-fortran": "npy", "crafted-npy-object": "npy"}[fmt]
        if fmt in ("crafted-npy-fortran",):
            pass
        elif fmt == "crafted-npy" and rng.random() < 0.3:
            fmt, ext = "crafted-npy", "npy"
        must_fail = None if fmt == "crafted-npy-fortran" else "a crafted file"
    else:
        fmt = FORMATS[rng.integers(len(FORMATS))]
        ext = EXT[fmt]
        if rng.random() < 0.25:
            p["dtype"] = str(rng.choice(["float32", "float16", "int64", "int8", "uint64", "bool", "complex128",
                                         ">f8"]))
        if rng.random() < 0.12:
            p["shape"] = str(rng.choice(["1d", "3d", "transposed", "empty"]))
        if fmt in ("csv", "tsv") and rng.random() < 0.3:
            p["header"] = True
        if fmt == "h5ad-dense" and rng.random() < 0.2:
            p["nul_names"] = True
    p["fmt"] = fmt
    name = f"rows.{ext}"
    stdin = None
    arg = name
    if fmt.startswith("stdin-"):
        stdin, arg = name, "-"
    cmd = "transform" if rng.random() < 0.6 else "kernel"
    files = {name: {"rows": p}}
    check = {}
    if cmd == "transform":
        files["f.h5"] = {"fixture": f"feat:{skel}"}
        layout = "dense" if rng.random() < 0.7 else "csr"
        dtype = "float32" if rng.random() < 0.6 else "float64"
        argv = ["transform", "f.h5", arg, "-o", "out.h5", "-q", "--layout", layout, "--dtype", dtype]
        cols = fixtures.columns_of(skel)
        check = {"type": "transform", "rows": n, "columns": cols}
        if p["mode"] == "scaled" and skel in fixtures.SCALE_INVARIANT and fmt in ("npy", "npz", "h5", "stdin-npy") \
                and "dtype" not in p and "shape" not in p:
            check["reference"] = {"fixture": f"feat:{skel}", "rows": dict(p, mode="normal")}
    else:
        files["s.yaml"] = {"skeleton": fixtures.skeleton_of(skel)}
        argv = ["kernel", "s.yaml", arg, "-o", "K.npy", "-q"]
        # brownian's kernel is not normalised (k(x, x) = prod u(1 - u)): no unit diagonal
        check = {"type": "kernel", "shape": [n, n], "square": skel not in fixtures.EOF}
        if p["mode"] == "scaled" and skel in fixtures.SCALE_INVARIANT and fmt in ("npy", "npz", "h5", "stdin-npy") \
                and "dtype" not in p and "shape" not in p:
            check["reference"] = {"skeleton": fixtures.FEATURES[skel][0], "rows": dict(p, mode="normal")}
    # what no correct run accepts
    if p["mode"] == "nonfinite" and p.get("dtype", "float64") in ("float64", "float32", "float16", ">f8") \
            and p.get("shape") != "empty":  # integer dtypes cannot hold NaN
        must_fail = "NaN/inf in the rows"
    if p.get("dtype") in ("bool", "complex128") and not fmt.endswith(("csv", "tsv")):  # text holds no dtype
        must_fail = f"{p['dtype']} rows"
    if p.get("shape") in ("1d", "transposed") or (p.get("shape") == "3d" and width != 1):
        pass  # a 3-D array is flattened per row (documented); transposed/1-D may or may not match by chance
    if p.get("shape") in ("transposed", "1d", "empty") or p.get("dtype") in ("float16", "int8", "int64", "uint64"):
        check.pop("reference", None)
        if check.get("type") == "transform":
            check = {"type": "transform_any"}
        elif check.get("type") == "kernel":
            check = {"type": "kernel_any"}
    # (no rows: no value to be wrong)
    if p["mode"] == "zeros" and skel in ("shallow-gaussian", "cifar-deep", "sphere8") and p.get("shape") != "empty":
        must_fail = "an all-zero row for a sphere node"
    if p.get("bad_cat") is not None and skel == "categorical-poly" and p.get("shape") != "empty" \
            and p.get("dtype") not in ("bool", "complex128") and _has_bad_category(p):
        must_fail = "a category out of range"
    if cmd == "kernel" and skel == "eof-brownian3-free":  # no exact kernel outside --eof (the error names the node)
        must_fail = "a brownian node with 'boundary: free' outside --scheme eof"
    if must_fail:
        check["must_fail"] = must_fail
    out = "out.h5" if cmd == "transform" else "K.npy"
    return {"kind": "rows", "id": cid, "files": files, "ops": [], "argv": argv, "stdin": stdin, "output": out,
            "check": check}


def shrink(case):
    """Smaller variants of a failing rows case: fewer rows."""
    for spec in case["files"].values():
        if "rows" in spec and spec["rows"]["n"] > 1:
            p = dict(spec["rows"], n=max(1, spec["rows"]["n"] // 2))
            c = json_copy(case)
            for k, s in c["files"].items():
                if "rows" in s:
                    s["rows"] = p
            for key in ("rows",):
                if c["check"].get(key):
                    c["check"][key] = p["n"]
            if c["check"].get("shape"):
                c["check"]["shape"] = [p["n"], p["n"]]
            if c["check"].get("reference"):
                c["check"]["reference"]["rows"] = dict(c["check"]["reference"]["rows"], n=p["n"])
            yield c


def json_copy(x):
    import json

    return json.loads(json.dumps(x))
