"""AnnData's on-disk encoding, written with h5py (anndata itself is not needed).

A transform output is an ``.h5ad``-compatible HDF5 file: ``X`` (a ``csr_matrix``
group or a dense ``array``), ``obs`` and ``var`` dataframes (row names and the
input's ``obs`` columns; column names ``skeletonfeatures0`` .. as scikit-learn names
them, :func:`feature_names`), ``uns["rfsgen"]`` (the provenance) and empty
``obsm``/``layers``/... dicts, with rfsgen's provenance attributes also at the root.  ``anndata.read_h5ad`` opens
it, also in backed mode.  See https://anndata.readthedocs.io (on-disk format).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

#: Names are written in blocks of this many, so memory does not grow with the rows.
NAME_BLOCK = 1 << 16

_EMPTY_DICTS = ("layers", "obsm", "obsp", "uns", "varm", "varp")

#: Column names are this prefix and the column number: what scikit-learn's
#: ``get_feature_names_out`` names :class:`rfsgen.sklearn.SkeletonFeatures`' outputs
#: (its class name lowercased), so a file and a pipeline name columns alike.
FEATURE_PREFIX = "skeletonfeatures"


def feature_names(start: int, stop: int) -> list:
    """Names of columns ``start .. stop - 1``: ``["skeletonfeatures0", ...]`` (str)."""
    return [f"{FEATURE_PREFIX}{i}" for i in range(start, stop)]


def _enc(obj, kind: str, version: str) -> None:
    obj.attrs["encoding-type"] = kind
    obj.attrs["encoding-version"] = version


def mark_root(f) -> None:
    """Root attributes and the empty mappings anndata writes beside X, obs and var."""
    _enc(f, "anndata", "0.1.0")
    for name in _EMPTY_DICTS:
        _enc(f.create_group(name), "dict", "0.1.0")


def write_uns_dict(f, name: str, items: dict) -> None:
    """``uns[name]``: a dict of scalars, as anndata writes them (str: ``string``; int:
    ``numeric-scalar``, int64), in the order of ``items``."""
    import h5py

    g = f["uns"].create_group(name)
    _enc(g, "dict", "0.1.0")
    for key, value in items.items():
        if isinstance(value, str):
            ds = g.create_dataset(key, data=value, dtype=h5py.string_dtype("utf-8"), track_times=False)
            _enc(ds, "string", "0.2.0")
        else:
            ds = g.create_dataset(key, data=np.int64(value), track_times=False)
            _enc(ds, "numeric-scalar", "0.2.0")


def mark_dense(ds) -> None:
    _enc(ds, "array", "0.2.0")


def mark_csr(group, shape) -> None:
    _enc(group, "csr_matrix", "0.1.0")
    group.attrs["shape"] = np.asarray(shape, dtype=np.int64)


def write_index(f, name: str, n: int, names: Callable[[int, int], list] | None, first: int = 0, digest=None,
                columns: list | None = None) -> None:
    """A dataframe group ``name`` (``obs`` or ``var``) with ``n`` string index values:
    ``names(a, b)`` for entries ``a:b`` when given, else the numbers
    ``first .. first + n - 1`` as strings.  ``digest.update(block)``, if given, sees
    every block of values in order (the output's integrity record).  ``columns``: the
    names of the columns the caller writes next (its ``column-order``)."""
    import h5py

    g = f.create_group(name)
    _enc(g, "dataframe", "0.2.0")
    g.attrs["_index"] = "_index"
    if columns:
        g.attrs.create("column-order", np.array(columns, dtype=object), dtype=h5py.string_dtype("utf-8"))
    else:
        g.attrs["column-order"] = np.array([], dtype=np.float64)
    ds = g.create_dataset("_index", shape=(n,), dtype=h5py.string_dtype("utf-8"), track_times=False)
    _enc(ds, "string-array", "0.2.0")
    for a in range(0, n, NAME_BLOCK):
        b = min(n, a + NAME_BLOCK)
        block = names(a, b) if names is not None else [str(i) for i in range(first + a, first + b)]
        if digest is not None:
            digest.update(block)
        ds[a:b] = np.array(block, dtype=object)
