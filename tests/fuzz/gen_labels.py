"""Labels cases for ``rfsgen select``: class names in text with and without a byte-order mark,
integers beyond 2^53 (which a read through float64 merges), labels of every file format, NaN and
one-class labels, a count that is not the rows', forged ``.npy`` headers declaring huge counts,
HDF5 labels behind soft-link loops, dangling links and external links to missing files, and
``--rho`` extremes for lkrf.  A selection that exits 0 must record the true number of classes
and only finite values (``divergence: NaN`` is a silent wrong result).
"""

from __future__ import annotations

import struct

import numpy as np

ROWS = 30
#: Integer class pairs that float64 cannot tell apart (2^53 and 2^53 + 1, 2^63 - 1 and 2^63 - 2, ...)
BIG = [(2**53, 2**53 + 1), (2**63 - 2, 2**63 - 1), (-(2**63), -(2**63) + 1), (2**64, 2**64 + 1), (10**20, 10**20 + 1)]
RHOS = ["5e-324", "1e-300", "0", "-1", "1e308", "inf", "nan", "9", "0.5", "1e-12"]


def _npy_header(shape, descr) -> bytes:
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, tuple(shape))
    pad = (64 - (10 + len(d) + 1) % 64) % 64
    h = (d + " " * pad + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h


def write_labels(p: dict, path) -> None:
    """Write the labels ``p`` describes: ``values`` in format ``fmt`` (``npy``, ``csv``,
    ``h5``), or a forged file (``forged-npy``: a header declaring ``declared`` labels;
    ``h5-loop``, ``h5-dangling``, ``h5-extlink``: /y a link that leads nowhere)."""
    import h5py

    fmt, values = p["fmt"], p.get("values", [])
    if fmt == "npy":
        dt = p.get("dtype")
        a = np.array(values, dtype=dt) if dt else np.array(values)
        with open(path, "wb") as fh:
            np.save(fh, a, allow_pickle=False)
    elif fmt == "csv":
        text = "".join(f"{v}\n" for v in ([p["header"]] if p.get("header") else []) + list(values))
        data = text.encode("utf-8")
        with open(path, "wb") as fh:
            fh.write((b"\xef\xbb\xbf" if p.get("bom") else b"") + data)
    elif fmt == "h5":
        with h5py.File(path, "w") as f:
            a = np.array(values)
            f.create_dataset("y", data=a.astype(h5py.string_dtype()) if a.dtype.kind == "U" else a)
    elif fmt == "forged-npy":
        with open(path, "wb") as fh:
            fh.write(_npy_header((int(p["declared"]),), p.get("descr", "<i8")) + b"\0" * 64)
    elif fmt in ("h5-loop", "h5-dangling", "h5-extlink"):
        with h5py.File(path, "w") as f:
            if fmt == "h5-loop":
                f["y"] = h5py.SoftLink("/y")
            elif fmt == "h5-dangling":
                f["y"] = h5py.SoftLink("/nowhere")
            else:
                f["y"] = h5py.ExternalLink("missing.h5", "/y")
    else:
        raise ValueError(fmt)


def _classes(rng, n):
    """(values, number of classes, fmt hints): labels of two or three classes, every class present."""
    k = int(rng.choice([2, 2, 3]))
    codes = np.concatenate([np.arange(k), rng.integers(0, k, n - k)])
    rng.shuffle(codes)
    how = rng.integers(4)
    if how == 0:
        names = [str(v) for v in rng.choice(["cat", "dog", "b\u00e9b\u00e9", "x y", "1a", "NaNa"], k, replace=False)]
        return [names[c] for c in codes], k
    if how == 1:
        pair = BIG[rng.integers(len(BIG))]
        vals = list(pair) + [pair[1] + 2]
        return [vals[c] for c in codes], k
    return [int(c) for c in codes], k


def generate(rng: np.random.Generator, cid: str) -> dict:
    n_rows = ROWS
    files = {"pool.h5": {"fixture": "feat:gauss8"},
             "rows.npy": {"rows": {"seed": int(rng.integers(2**31)), "n": n_rows, "width": 8, "mode": "normal",
                                   "fmt": "npy"}}}
    values, k = _classes(rng, n_rows)
    p = {"values": values}
    classes, must_fail = k, None
    fmt = str(rng.choice(["csv", "csv", "npy", "h5"]))
    big = any(isinstance(v, int) and not -(2**63) <= v < 2**63 for v in values)
    if fmt in ("npy", "h5") and big:
        fmt = "csv"  # numpy has no integer dtype for them: text only
    if fmt == "csv":
        p["bom"] = bool(rng.random() < 0.5)
        if rng.random() < 0.2 and all(isinstance(v, int) for v in values):
            p["header"] = "label"
    r = rng.random()
    task = None
    if r < 0.12:  # forged or unreachable files
        fmt = str(rng.choice(["forged-npy", "h5-loop", "h5-dangling", "h5-extlink"]))
        p = {"declared": int(rng.choice([10**9, 10**11, 2**40, 2**62])),
             "descr": str(rng.choice(["<i8", "<f8", "<U32"]))}
        must_fail, classes = f"labels file {fmt}", None
    elif r < 0.2:  # one label too many or too few
        p["values"] = values[:-1] if rng.random() < 0.5 else values + values[:1]
        must_fail, classes = "a label count that is not the rows'", None
    elif r < 0.28:  # NaN / inf labels
        p["values"] = [float(v) for v in rng.integers(0, 2, n_rows)]
        p["values"][int(rng.integers(n_rows))] = str(rng.choice(["nan", "inf", "-inf"]))
        fmt = "csv"
        p.pop("header", None)
        must_fail, classes = "NaN or infinite labels", None
    elif r < 0.34:  # one class only
        p["values"] = [values[0]] * n_rows
        must_fail, classes = "labels of a single class", None
    elif r < 0.42:  # regression targets
        p["values"] = [float(v) for v in np.round(rng.standard_normal(n_rows), 6)]
        task, classes = "regression", None
    p["fmt"] = fmt
    if fmt == "npy" and any(isinstance(v, str) for v in p.get("values", [])) and \
            not all(isinstance(v, str) for v in p["values"]):
        p["fmt"] = fmt = "csv"
    ext = {"npy": "npy", "csv": "csv", "h5": "h5", "forged-npy": "npy", "h5-loop": "h5", "h5-dangling": "h5",
           "h5-extlink": "h5"}[fmt]
    lab = f"y.{ext}"
    files[lab] = {"labels": p}
    arg = f"{lab}:/y" if ext == "h5" and rng.random() < 0.7 else lab
    method = str(rng.choice(["eerf", "lkrf", "lkrf", "corr", "eerf-norm", "greedy"]))
    d = int(rng.choice([1, 4, 8, 16]))
    argv = ["select", "pool.h5", "rows.npy", arg, "-n", str(d), "--method", method, "-o", "out.h5", "-q"]
    rho = str(rng.choice(RHOS)) if method == "lkrf" and rng.random() < 0.7 else None
    if rho:
        argv += ["--rho", rho]
    if task:
        argv += ["--task", task]
    check = {"type": "sample", "columns": d}
    if classes and task is None:
        check["classes"] = classes
        if rho in (None, "9", "0.5"):  # valid labels of k classes, a valid request: refusing it is wrong
            check["must_succeed"] = f"labels of {classes} classes ({fmt}{', BOM' if p.get('bom') else ''})"
    if must_fail:
        check["must_fail"] = must_fail
    return {"kind": "labels", "id": cid, "files": files, "ops": [], "argv": argv, "output": "out.h5", "check": check}
