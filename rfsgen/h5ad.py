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


def _short(e) -> str:
    return " ".join(str(e).split())[:120]


def _link_words(link) -> str:
    """What a link that is not a hard link is, for a message."""
    import h5py

    if isinstance(link, h5py.ExternalLink):
        return f"an external link (to {link.filename}:{link.path})"
    if isinstance(link, h5py.SoftLink):
        return f"a soft link (to '{link.path}')"
    return f"a link of another kind ({type(link).__name__})"


def _node(g, name: str, where: str, expected: str, path) -> object:
    """``g[name]`` where anndata stores it in place: None when absent; else a hard link
    to an object that no other link reaches (HDF5's reference count 1).  A soft,
    external or dangling link, or a self-referencing one, is an error naming ``where``
    and ``expected`` (checked without following the link, so a loop cannot hang)."""
    import h5py

    from .errors import InputError

    fix = "remove it or write the file again with anndata (read_h5ad, then write_h5ad)"
    try:
        link = g.get(name, getlink=True)
        if link is None:
            return None
        if not isinstance(link, h5py.HardLink):
            raise InputError(f"{path}:{where}: is {_link_words(link)}; expected {expected} stored in the file: {fix}")
        obj = g[name]
        refs = h5py.h5o.get_info(obj.id).rc
    except InputError:
        raise
    except Exception as e:  # h5py's own errors on damaged metadata
        raise InputError(f"{path}:{where}: cannot open it ({_short(e)}); the file is damaged") from None
    if refs != 1:
        raise InputError(f"{path}:{where}: the same HDF5 object is also linked elsewhere in the file ({refs} links), "
                         f"so writing into it would change those too; expected {expected} of its own: {fix}")
    return obj


def _group(g, name: str, where: str, expected: str, path, encodings: tuple):
    """:func:`_node`, which must be a group whose ``encoding-type`` is one of
    ``encodings`` ("" for none, as anndata before 0.8 wrote dicts)."""
    import h5py

    from .errors import InputError

    obj = _node(g, name, where, expected, path)
    if obj is None:
        return None
    if not isinstance(obj, h5py.Group):
        raise InputError(f"{path}:{where}: is a dataset; expected {expected}, as anndata 0.7 and later write it: "
                         "write the file again with a current anndata (read_h5ad, then write_h5ad)")
    enc = obj.attrs.get("encoding-type", "")
    enc = enc.decode("utf-8", "replace") if isinstance(enc, bytes) else str(enc)
    if enc not in encodings:
        raise InputError(f"{path}:{where}: is a group encoded as {enc!r}; expected {expected}: write the file again "
                         "with anndata (read_h5ad, then write_h5ad)")
    return obj


def check_obsm_target(f, path, key: str, n_rows: int, uns_key: str) -> None:
    """Before ``obsm[key]`` and ``uns[uns_key][key]`` are added to the AnnData file
    ``f`` (open with h5py; ``path`` names it in messages): every node the writer
    writes into or relies on is of the kind anndata writes there, so the copy is the
    input plus those two entries and nothing else changes.

    - ``obsm``, ``uns``, ``uns[uns_key]``: absent (then created), or a dict group
      stored in place: reached by a hard link, and by no other link (a soft, external,
      dangling or self-referencing link, or a group also linked from elsewhere such
      as ``/X``, would put the features in another node or fail half-way);
    - ``obsm[key]``, ``uns[uns_key][key]``: absent (a :class:`UsageError`: choose
      another key);
    - ``obs``: absent, or a dataframe group whose index (its ``_index`` attribute)
      names a dataset in it with ``n_rows`` entries (the rows written), so that
      ``obsm[key]`` fits the file's rows.

    Raises :class:`rfsgen.errors.InputError` (one line naming the node and what was
    expected); reads metadata only."""
    import h5py

    from .errors import InputError, UsageError

    d = "a dict group"
    obsm = _group(f, "obsm", "/obsm", d, path, ("", "dict"))
    uns = _group(f, "uns", "/uns", d, path, ("", "dict"))
    mine = _group(uns, uns_key, f"/uns/{uns_key}", d, path, ("", "dict")) if uns is not None else None
    for parent, where in ((obsm, "obsm"), (mine, f"uns/{uns_key}")):
        try:
            taken = parent is not None and parent.get(key, getlink=True) is not None
        except Exception as e:
            raise InputError(f"{path}:/{where}: cannot list it ({_short(e)}); the file is damaged") from None
        if taken:
            raise UsageError(f"{path}: already holds '{where}/{key}'; choose another --obsm KEY")
    frame = "a dataframe group (anndata's obs)"
    obs = _group(f, "obs", "/obs", frame, path, ("dataframe",))
    if obs is None:
        return  # anndata counts the rows of X
    index = obs.attrs.get("_index")
    index = index.decode("utf-8", "replace") if isinstance(index, bytes) else index
    if not isinstance(index, str) or not index or "/" in index or index in (".", ".."):
        raise InputError(f"{path}:/obs: its '_index' attribute ({index!r}) does not name its row names; expected "
                         f"{frame}; write the file again with anndata")
    where = f"/obs/{index}"
    ds = _node(obs, index, where, "the dataset of row names", path)
    if not isinstance(ds, h5py.Dataset) or ds.shape != (n_rows,):
        what = ("absent" if ds is None else "a group" if not isinstance(ds, h5py.Dataset)
                else f"a dataset of shape {ds.shape}")
        raise InputError(f"{path}:{where}: the row names (obs index) are {what}; expected one name for each of the "
                         f"{n_rows:,} rows, so obsm can hold their features; write the file again with anndata")
