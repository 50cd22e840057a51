"""The ``obs`` columns of an ``.h5ad`` input (cell_type, batch, ...), carried into outputs.

A transform of an AnnData file's ``X`` (or a layer) writes the input's ``obs``
columns beside the row names, sliced to the rows written (``--rows``, ``--shard``),
so an output opened with anndata keeps its annotations; ``rfsgen merge`` verifies and
concatenates them.  Columns are copied as anndata encodes them, without anndata:

* ``array`` (numbers or booleans) and ``string-array``: one dataset, one value a row;
* ``categorical``: ``codes`` (a row each) and ``categories`` (copied whole, so every
  shard holds all of them) and the ``ordered`` attribute;
* ``nullable-integer``, ``nullable-boolean``, ``nullable-string-array``: ``values``
  and ``mask`` (a row each).

A column of any other encoding is an :class:`~rfsgen.errors.InputError` naming it.
What an output holds is sealed in its integrity record as ``obs_columns_sha256``
(:meth:`ObsColumns.write`), present only when there are columns.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

#: Column encodings stored as one dataset: encoding -> version.
DATASET_ENCODINGS = {"array": "0.2.0", "string-array": "0.2.0"}
#: Column encodings stored as a group: encoding -> (version, members a row each, members copied whole).
GROUP_ENCODINGS = {
    "categorical": ("0.2.0", ("codes",), ("categories",)),
    "nullable-integer": ("0.1.0", ("values", "mask"), ()),
    "nullable-boolean": ("0.1.0", ("values", "mask"), ()),
    "nullable-string-array": ("0.1.0", ("values", "mask"), ()),
}
_ROW = 1 << 16  # rows copied at once


@dataclass
class Part:
    """One dataset of a column: ``name`` ("" for a dataset column, else its member),
    its encoding (``array`` or ``string-array``) and dtype (``"str"`` for strings)."""

    name: str
    encoding: str
    dtype: str


@dataclass
class Column:
    name: str
    encoding: str
    version: str
    ordered: bool | None = None  # categorical only
    parts: list = field(default_factory=list)  # Part, a value per row each
    whole: dict = field(default_factory=dict)  # member -> (Part, values): copied whole (categories)

    def meta(self) -> dict:
        """What must agree between shards (everything but the per-row values)."""
        return {"name": self.name, "encoding": self.encoding, "version": self.version, "ordered": self.ordered,
                "parts": [[p.name, p.encoding, p.dtype] for p in self.parts],
                "whole": {k: [p.name, p.encoding, p.dtype, _digest(p, [v])] for k, (p, v) in self.whole.items()}}


def _text(v) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _encoding_of(obj) -> tuple:
    return _text(obj.attrs.get("encoding-type", "")), _text(obj.attrs.get("encoding-version", ""))


def _digest(part: Part, blocks) -> str:
    """SHA-256 of a part's values fed in blocks: strings as :class:`rfsgen.checksums.NamesChecksum`
    (their JSON), numbers as the dtype's name then their little-endian bytes."""
    from .checksums import NamesChecksum

    if part.dtype == "str":
        c = NamesChecksum()
        for b in blocks:
            c.update(list(b))
        return c.hexdigest()
    sha = hashlib.sha256(part.dtype.encode("ascii"))
    for b in blocks:
        sha.update(np.ascontiguousarray(b, dtype=np.dtype(part.dtype).newbyteorder("<")).tobytes())
    return sha.hexdigest()


class ObsColumns:
    """The obs columns of a source: :attr:`columns` (:class:`Column`) and :meth:`read`
    of one part's values over rows ``a:b`` (numpy array; strings as a list of str)."""

    def __init__(self, columns: list, reader):
        self.columns = columns
        self._reader = reader  # (column index, part name, a, b) -> values

    def read(self, c: int, part: str, a: int, b: int):
        return self._reader(c, part, a, b)

    def write(self, g, start: int, n_rows: int) -> str:
        """Write the columns into the dataframe group ``g`` (``obs``), rows
        ``start:start + n_rows``; return their digest (``obs_columns_sha256``): SHA-256
        of the canonical JSON of each column's :meth:`Column.meta` with every part's
        :func:`_digest`."""
        import h5py

        from .checksums import canonical_json

        described = []
        for c, col in enumerate(self.columns):
            if col.encoding in DATASET_ENCODINGS:
                target, members = g, {col.name: col.parts[0]}
            else:
                target = g.create_group(col.name)
                _enc(target, col.encoding, col.version)
                if col.ordered is not None:
                    target.attrs["ordered"] = np.bool_(col.ordered)
                for k, (p, values) in col.whole.items():
                    ds = target.create_dataset(k, data=_stored(p, values), track_times=False)
                    _enc(ds, p.encoding, "0.2.0")
                members = {p.name: p for p in col.parts}
            sums = {}
            for member, p in members.items():
                dtype = h5py.string_dtype("utf-8") if p.dtype == "str" else np.dtype(p.dtype)
                ds = target.create_dataset(member, shape=(n_rows,), dtype=dtype, track_times=False)
                _enc(ds, p.encoding, "0.2.0")

                def fill(ds=ds, p=p):
                    for a in range(0, n_rows, _ROW):
                        b = min(n_rows, a + _ROW)
                        values = self.read(c, p.name, start + a, start + b)
                        ds[a:b] = _stored(p, values)
                        yield values

                sums[p.name] = _digest(p, fill())
            described.append(col.meta() | {"sha256": sums})
        return hashlib.sha256(canonical_json(described).encode("ascii")).hexdigest()

    def digest(self, start: int, n_rows: int) -> str:
        """The digest :meth:`write` returns for rows ``start:start + n_rows``, computed
        from :meth:`read` alone (``rfsgen merge`` checks a shard's columns with it)."""
        from .checksums import canonical_json

        described = []
        for c, col in enumerate(self.columns):
            sums = {p.name: _digest(p, (self.read(c, p.name, start + a, start + min(n_rows, a + _ROW))
                                        for a in range(0, n_rows, _ROW))) for p in col.parts}
            described.append(col.meta() | {"sha256": sums})
        return hashlib.sha256(canonical_json(described).encode("ascii")).hexdigest()


def _stored(p: Part, values):
    return np.array(list(values), dtype=object) if p.dtype == "str" else np.asarray(values, dtype=np.dtype(p.dtype))


def _enc(obj, kind: str, version: str) -> None:
    obj.attrs["encoding-type"] = kind
    obj.attrs["encoding-version"] = version


def column_order(obs) -> list | None:
    """The ``column-order`` attribute of a dataframe group as a list of str (None when
    it is not a 1-D array of strings; an empty array of any dtype is ``[]``)."""
    order = obs.attrs.get("column-order")
    if order is None:
        return []
    order = np.asarray(order)
    if order.ndim != 1:
        return None
    if order.size == 0:
        return []
    if order.dtype.kind not in "OSU":
        return None
    return [_text(v) for v in order]


def describe(obs, n_rows: int, get, fail, check=None) -> list:
    """The :class:`Column` list of the dataframe group ``obs`` with ``n_rows`` rows.

    ``get(group, name, where)`` opens a member (the caller's rules about links);
    ``fail(where, what)`` makes the error to raise; ``check(ds, where)``, if given,
    vets a dataset before it is read (storage inside the file, sizes).  Whole parts
    (categories) are read here."""
    import h5py

    order = column_order(obs)
    if order is None:
        raise fail("obs", "its 'column-order' attribute is not a list of column names")
    columns = []
    for name in order:
        where = f"obs/{name}"
        if name == "_index" or not name or "/" in name or name in (c.name for c in columns):
            raise fail(where, f"the obs column name {name!r} cannot be carried (reserved, empty or repeated)")
        obj = get(obs, name, where)
        if obj is None:
            raise fail(where, f"the obs column {name!r} listed in 'column-order' is missing")
        encoding, version = _encoding_of(obj)
        if isinstance(obj, h5py.Dataset) and encoding in DATASET_ENCODINGS:
            columns.append(Column(name, encoding, version, parts=[_part(obj, "", encoding, n_rows, where, fail, check)]))
            continue
        if isinstance(obj, h5py.Group) and encoding in GROUP_ENCODINGS:
            _, rowwise, whole = GROUP_ENCODINGS[encoding]
            have = set(obj.keys())
            if have != set(rowwise) | set(whole):
                raise fail(where, f"the {encoding} obs column {name!r} has members {sorted(have)}, expected "
                                  f"{sorted(set(rowwise) | set(whole))}")
            col = Column(name, encoding, version)
            if encoding == "categorical":
                ordered = obj.attrs.get("ordered", False)
                if not isinstance(ordered, (bool, np.bool_)):
                    raise fail(where, f"the categorical obs column {name!r} has a non-boolean 'ordered' attribute")
                col.ordered = bool(ordered)
            for member in rowwise:
                sub = get(obj, member, f"{where}/{member}")
                col.parts.append(_part(sub, member, _encoding_of(sub)[0], n_rows, f"{where}/{member}", fail, check))
            for member in whole:
                sub = get(obj, member, f"{where}/{member}")
                p = _part(sub, member, _encoding_of(sub)[0], None, f"{where}/{member}", fail, check)
                col.whole[member] = (p, _read(sub, p, 0, sub.shape[0]))
            columns.append(col)
            continue
        raise fail(where, f"the obs column {name!r} is encoded as {encoding or 'nothing'!r}, which rfsgen does not "
                          "carry into outputs (it carries numbers, strings, categoricals and nullable columns); "
                          "drop or convert it (del adata.obs[...]) and write the input again")
    return columns


def _part(ds, name, encoding, n_rows, where, fail, check) -> Part:
    import h5py

    if not isinstance(ds, h5py.Dataset) or encoding not in DATASET_ENCODINGS or len(ds.shape or ()) != 1 \
            or (n_rows is not None and ds.shape[0] != n_rows):
        rows = f"{n_rows} " if n_rows is not None else ""
        raise fail(where, f"is not a 1-D array or string-array of {rows}values as an obs column needs")
    if encoding == "string-array":
        if h5py.check_string_dtype(ds.dtype) is None:
            raise fail(where, f"is a string-array of dtype {ds.dtype}, not strings")
        dtype = "str"
    else:
        if ds.dtype.kind not in "iufb" or ds.dtype.fields is not None:
            raise fail(where, f"has dtype {ds.dtype}, not numbers or booleans")
        dtype = ds.dtype.str
    if check is not None:
        check(ds, where)
    return Part(name, encoding, dtype)


def _read(ds, p: Part, a: int, b: int):
    if p.dtype == "str":
        return [_text(v) for v in ds[a:b]]
    return np.asarray(ds[a:b], dtype=np.dtype(p.dtype))


def from_file(obs, columns: list) -> ObsColumns:
    """Columns read from an open file's ``obs`` group as rows are asked for."""

    def read(c, part, a, b):
        col = columns[c]
        ds = obs[col.name] if not part else obs[col.name][part]
        p = next(q for q in col.parts if q.name == part)
        return _read(ds, p, a, b)

    return ObsColumns(columns, read)


def in_memory(obs, columns: list, n_rows: int) -> ObsColumns:
    """Every part of ``columns`` read from the ``obs`` group now (the caller checked
    the memory: :func:`nbytes`), then served from memory."""
    data = {}
    for c, col in enumerate(columns):
        for p in col.parts:
            ds = obs[col.name] if not p.name else obs[col.name][p.name]
            data[c, p.name] = _read(ds, p, 0, n_rows)
    return ObsColumns(columns, lambda c, part, a, b: data[c, part][a:b])


def nbytes(columns: list, n_rows: int) -> int:
    """An estimate of the memory :func:`in_memory` takes (strings: 100 bytes each)."""
    return sum(n_rows * (100 if p.dtype == "str" else np.dtype(p.dtype).itemsize) for col in columns for p in col.parts)


def concatenated(parts: list) -> ObsColumns:
    """Columns of consecutive row ranges as one: ``parts`` holds ``(first row, rows,
    ObsColumns)`` in order, all with the same columns."""
    def read(c, part, a, b):
        out = []
        for first, n, cols in parts:
            lo, hi = max(a, first), min(b, first + n)
            if lo < hi:
                out.append(cols.read(c, part, lo - first, hi - first))
        if not out:
            return []
        if isinstance(out[0], list):
            return [v for piece in out for v in piece]
        return np.concatenate(out)

    return ObsColumns(parts[0][2].columns, read)
