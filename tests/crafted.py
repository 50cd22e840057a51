"""Generators of hostile inputs for the tests and the fuzz harness: crafted input files
(headers declaring huge shapes, HDF5 links that loop or reach outside the file, NUL
row names) and rows of finite extremes (subnormals, the largest floats, mixed scales).

Every file writer takes a directory and returns the input spec to open; none writes
more than a few kilobytes whatever shape it declares.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

#: The largest finite float64 and the smallest subnormal.
BIG = float(np.finfo(np.float64).max)
TINY = 5e-324


def npy_header(shape, descr: str = "<f8", fortran: bool = False) -> bytes:
    """A version 1.0 ``.npy`` header declaring ``shape`` (no data)."""
    from numpy.lib import format as npformat

    buf = io.BytesIO()
    npformat.write_array_header_1_0(buf, {"descr": descr, "fortran_order": fortran, "shape": tuple(shape)})
    return b"\x93NUMPY\x01\x00" + buf.getvalue() if not buf.getvalue().startswith(b"\x93NUMPY") else buf.getvalue()


def npy_bytes(shape, payload_rows: int = 1, descr: str = "<f8") -> bytes:
    """A ``.npy`` declaring ``shape`` followed by only ``payload_rows`` rows of data."""
    width = int(np.prod(shape[1:], dtype=np.float64)) if len(shape) > 1 else 1
    item = np.dtype(descr).itemsize
    return npy_header(shape, descr) + bytes(min(payload_rows * width * item, 4096))


def huge_npy(d: Path, shape) -> str:
    p = Path(d) / "huge.npy"
    p.write_bytes(npy_bytes(shape))
    return str(p)


def _member(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def sparse_npz(d: Path, fmt: str, shape, nnz: int = 2, declared_nnz: int | None = None) -> str:
    """A ``scipy.sparse.save_npz``-style archive of ``fmt`` (coo, csr, csc) declaring
    ``shape`` with ``nnz`` stored values; ``declared_nnz`` makes the data member's
    header claim more values than it holds."""
    n_rows, n_cols = (int(v) for v in shape)
    rng = np.random.default_rng(nnz)
    rows = rng.integers(0, max(n_rows, 1), nnz) if n_rows else np.zeros(0, np.int64)
    cols = rng.integers(0, max(n_cols, 1), nnz) if n_cols else np.zeros(0, np.int64)
    members = {"format": np.array(fmt), "shape": np.array([n_rows, n_cols])}
    if fmt == "coo":
        members.update(row=rows.astype(np.int64), col=cols.astype(np.int64), data=np.ones(nnz))
    else:
        members.update(indices=cols.astype(np.int64), data=np.ones(nnz),
                       indptr=np.concatenate(([0], np.full(min(n_rows, 4), nnz))).astype(np.int64))
    p = Path(d) / f"crafted-{fmt}.npz"
    with zipfile.ZipFile(p, "w") as z:
        for k, v in members.items():
            raw = _member(v)
            if k == "data" and declared_nnz is not None:
                raw = npy_header((declared_nnz,)) + raw[len(npy_header((nnz,))):]
            z.writestr(k + ".npy", raw)
    return str(p)


def dense_npz(d: Path, shape) -> str:
    """An ``.npz`` whose only member declares ``shape`` but holds a few bytes."""
    p = Path(d) / "crafted-dense.npz"
    with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", npy_bytes(shape))
    return str(p)


def h5_dense(d: Path, shape, chunks=None, suffix: str = ".h5") -> str:
    """An HDF5 file with a never-written dataset ``/X`` declaring ``shape``."""
    import h5py

    p = Path(d) / f"crafted-dense{suffix}"
    with h5py.File(p, "w") as f:
        f.create_dataset("X", shape=tuple(shape), dtype="f8", chunks=chunks)
    return str(p) + ":/X"


def h5_csr(d: Path, shape, indptr, indices, data) -> str:
    """An ``.h5ad`` whose X is a CSR group with the given (possibly inconsistent) parts."""
    import h5py

    p = Path(d) / "crafted-csr.h5ad"
    with h5py.File(p, "w") as f:
        g = f.create_group("X")
        g.attrs["encoding-type"] = "csr_matrix"
        g.attrs["shape"] = np.asarray(shape, dtype=np.int64)
        g["indptr"], g["indices"], g["data"] = (np.asarray(indptr, np.int64), np.asarray(indices, np.int64),
                                                np.asarray(data, np.float64))
    return str(p)


def h5_soft_loop(d: Path, length: int = 2) -> str:
    """An ``.h5ad`` whose X is a cycle of ``length`` soft links."""
    import h5py

    p = Path(d) / f"loop{length}.h5ad"
    with h5py.File(p, "w") as f:
        names = ["X"] + [f"L{i}" for i in range(1, length)]
        for i, n in enumerate(names):
            f[n] = h5py.SoftLink("/" + names[(i + 1) % length])
    return str(p)


def h5_outside(d: Path, kind: str) -> str:
    """An ``.h5`` whose ``/X`` reaches outside the file: ``external_link``,
    ``external_storage`` or ``virtual``."""
    import h5py

    other = Path(d) / "other.h5"
    with h5py.File(other, "w") as f:
        f["Y"] = np.ones((4, 2))
    p = Path(d) / f"{kind}.h5"
    with h5py.File(p, "w") as f:
        if kind == "external_link":
            f["X"] = h5py.ExternalLink(str(other), "/Y")
        elif kind == "external_storage":
            raw = Path(d) / "raw.bin"
            raw.write_bytes(bytes(64))
            f.create_dataset("X", shape=(4, 2), dtype="f8", external=[(str(raw), 0, h5py.h5f.UNLIMITED)])
        else:
            layout = h5py.VirtualLayout(shape=(4, 2), dtype="f8")
            layout[:] = h5py.VirtualSource(str(other), "Y", shape=(4, 2))
            f.create_virtual_dataset("X", layout)
    return str(p) + ":/X"


def h5ad_names(d: Path, names: list[bytes]) -> str:
    """An ``.h5ad`` with a dense X and an obs index of fixed-length byte names (which,
    unlike HDF5's variable-length strings, can hold NUL)."""
    import h5py

    p = Path(d) / "names.h5ad"
    width = max(1, max(len(n) for n in names))
    with h5py.File(p, "w") as f:
        f["X"] = np.ones((len(names), 3))
        g = f.create_group("obs")
        g.attrs["encoding-type"] = "dataframe"
        g.attrs["_index"] = "_index"
        g.create_dataset("_index", data=np.array(names, dtype=f"S{width}"))
    return str(p)


# ----------------------------------------------------------------------------- rows
def extreme_values():
    """A hypothesis strategy of finite floats biased to the extremes: subnormals, the
    largest floats, zeros, tiny and huge powers of ten, ordinary values."""
    from hypothesis import strategies as st

    return st.one_of(
        st.sampled_from([0.0, -0.0, TINY, -TINY, BIG, -BIG, 2.0**-1040, -(2.0**-1040), 1e-300, 1e300, 1.0, -1.0]),
        st.floats(allow_nan=False, allow_infinity=False),
        st.floats(min_value=-10, max_value=10),
    )


def scaled_rows(rng: np.random.Generator, n: int, width: int, exponent: int) -> np.ndarray:
    """``n`` standard normal rows scaled by 2^exponent (exactly, unless subnormal)."""
    return np.ldexp(rng.standard_normal((n, width)), exponent)
