"""Feature sets and the feature file (HDF5).

A :class:`FeatureSet` holds D columns.  Column ``j`` has a draw ``count[j]``
(weight ``count[j] / draws``), a ``kind`` (0: real feature, used as is;
1: complex, phase b = 0; 2: complex, b = pi/2) and terms
``(node[t], code[t], power[t])`` for ``t`` in ``ptr[j]:ptr[j+1]`` (see
:mod:`rfsgen.bases` for what code and power mean per base).  Continuous
terms' ``code`` is an offset into the float64 ``omega`` table (``width``
values per term).  The column's value on a row is::

    sqrt(count/draws) * { prod psi                      kind 0
                        { sqrt(2) R cos(theta + b)      kind 1, 2   (prod psi = R e^{i theta})

File layout (format ``rfsgen-features``, version 1), every dataset fletcher32-
checksummed and written with ``track_times=False`` so files are byte-identical::

    /                attrs: format, format_version, tool_version, seed, columns, draws,
                            scheme, skeleton_path, skeleton_sha256, nodes, command, stats (JSON)
    /skeleton        uint8    the skeleton's source text (UTF-8); re-parsed on load
    /column_count    uint     draws that produced each column
    /column_kind     uint8    0 real, 1 cos (b = 0), 2 sin (b = pi/2)
    /column_terms    uint     number of terms of each column (ptr = cumsum)
    /term_node       uint     input node id of each term
    /term_code       int      code (continuous: offset into /omega)
    /term_power      int      power
    /omega           float64  continuous omegas, flat

Integer datasets use the narrowest dtype that holds their values (a few bytes
per term) and are shuffled and gzip-compressed.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .errors import FeatureFileError, RfsgenError
from .skeleton import InputNode, Skeleton, parse_skeleton

FORMAT = "rfsgen-features"
FORMAT_VERSION = 1


@dataclass(eq=False)
class FeatureSet:
    """D sampled columns for a skeleton (see module docstring for the fields)."""

    skeleton: Skeleton
    scheme: str
    seed: int
    draws: int
    count: np.ndarray
    kind: np.ndarray
    ptr: np.ndarray
    node: np.ndarray
    code: np.ndarray
    power: np.ndarray
    omega: np.ndarray
    stats: dict = field(default_factory=dict)
    command: str = ""
    tool_version: str = ""

    @property
    def columns(self) -> int:
        return int(self.count.size)

    @property
    def weight(self) -> np.ndarray:
        """float64 (D,): count / draws; sums to 1."""
        return self.count / float(self.draws)

    @property
    def scale(self) -> np.ndarray:
        """float64 (D,): the factor each column's cos/product is multiplied by."""
        return np.sqrt(self.weight) * np.where(self.kind == 0, 1.0, math.sqrt(2.0))

    @cached_property
    def walk_skeleton(self) -> Skeleton:
        """The skeleton whose input nodes the terms refer to (rewritten by baseline schemes)."""
        if self.scheme == "rfs":
            return self.skeleton
        from .schemes import apply_scheme

        return apply_scheme(self.skeleton, self.scheme)

    def terms_of(self, j: int):
        """``[(node, code, power), ...]`` of column ``j`` (for inspection and tests)."""
        a, b = self.ptr[j], self.ptr[j + 1]
        return list(zip(self.node[a:b].tolist(), self.code[a:b].tolist(), self.power[a:b].tolist()))

    def omega_of(self, term_index: int) -> np.ndarray:
        node = self.walk_skeleton.nodes[int(self.node[term_index])]
        off = int(self.code[term_index])
        return self.omega[off: off + node.base.width]


# ----------------------------------------------------------------------------- writing
def _narrow(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.size == 0:
        return a.astype(np.uint8)
    lo, hi = int(a.min()), int(a.max())
    for dt in (np.uint8, np.uint16, np.uint32, np.uint64) if lo >= 0 else (np.int8, np.int16, np.int32, np.int64):
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return a.astype(dt)
    raise ValueError("value out of int64 range")


def _put(f, name, data, compress=True):
    data = np.ascontiguousarray(data)
    kw = dict(fletcher32=True, track_times=False)
    if data.size == 0:
        f.create_dataset(name, shape=(0,), dtype=data.dtype, chunks=(1,), maxshape=(None,), **kw)
        return
    chunk = (int(min(data.size, 1 << 18)),)
    if compress:
        kw.update(compression="gzip", compression_opts=9, shuffle=True)
    f.create_dataset(name, data=data, chunks=chunk, **kw)


def save(fs: FeatureSet, path, overwrite: bool = False) -> None:
    """Write ``fs`` to ``path`` atomically (temporary file + rename)."""
    import h5py

    from .io import atomic_path

    with atomic_path(path, overwrite) as tmp:
        with h5py.File(tmp, "w", libver="earliest", track_order=False) as f:
            _write(f, fs)


def _write(f, fs: FeatureSet):
    src = fs.skeleton.source.encode("utf-8")
    attrs = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tool_version": fs.tool_version,
        "seed": int(fs.seed),
        "columns": fs.columns,
        "draws": int(fs.draws),
        "scheme": fs.scheme,
        "skeleton_path": fs.skeleton.path,
        "skeleton_sha256": hashlib.sha256(src).hexdigest(),
        "nodes": len(fs.skeleton.nodes),
        "command": fs.command,
        "stats": json.dumps(fs.stats, sort_keys=True),
    }
    for k, v in attrs.items():
        f.attrs[k] = v
    _put(f, "skeleton", np.frombuffer(src, dtype=np.uint8))
    _put(f, "column_count", _narrow(fs.count))
    _put(f, "column_kind", fs.kind.astype(np.uint8))
    _put(f, "column_terms", _narrow(np.diff(fs.ptr)))
    # Terms are sorted within a column, so node ids are stored as differences from the
    # previous term of the same column: small numbers that compress ~10% better.
    _put(f, "term_node", _narrow(_node_deltas(fs.node, fs.ptr)))
    f["term_node"].attrs["encoding"] = "delta-within-column"
    _put(f, "term_code", _narrow(fs.code))
    _put(f, "term_power", _narrow(fs.power))
    _put(f, "omega", fs.omega.astype(np.float64), compress=False)


def _node_deltas(node: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    d = np.diff(np.asarray(node, dtype=np.int64), prepend=0)
    lengths = np.diff(ptr)
    starts = ptr[:-1][lengths > 0]
    d[starts] = node[starts]
    return d


def _node_from_deltas(d: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    lengths = np.diff(ptr)
    cs = np.cumsum(d)
    starts = ptr[:-1][lengths > 0]
    return cs - np.repeat(cs[starts] - d[starts], lengths[lengths > 0])


# ----------------------------------------------------------------------------- reading
REQUIRED = ("skeleton", "column_count", "column_kind", "column_terms", "term_node", "term_code", "term_power", "omega")


def load(path) -> FeatureSet:
    """Read and validate a feature file; raises :class:`FeatureFileError` with a clear message."""
    import h5py

    p = str(path)
    try:
        f = h5py.File(p, "r")
    except FileNotFoundError:
        raise FeatureFileError(f"{p}: no such feature file; create one with 'rfsgen sample'") from None
    except IsADirectoryError:
        raise FeatureFileError(f"{p}: is a directory, not a feature file") from None
    except OSError:
        raise FeatureFileError(
            f"{p}: not a readable HDF5 file (truncated, corrupted or another format); re-create it with 'rfsgen sample'"
        ) from None
    with f:
        fmt = f.attrs.get("format")
        if isinstance(fmt, bytes):
            fmt = fmt.decode()
        if fmt != FORMAT:
            raise FeatureFileError(f"{p}: not an rfsgen feature file (format attribute is {fmt!r}); pass a file made by 'rfsgen sample'")
        version = int(f.attrs.get("format_version", -1))
        if version != FORMAT_VERSION:
            raise FeatureFileError(
                f"{p}: feature file format version {version} is not supported (this rfsgen reads version {FORMAT_VERSION}); "
                "re-create it with this rfsgen's 'rfsgen sample'"
            )
        missing = [k for k in REQUIRED if k not in f]
        if missing:
            raise FeatureFileError(f"{p}: incomplete feature file (missing dataset '{missing[0]}'); re-create it")
        try:
            data = {k: f[k][()] for k in REQUIRED}
            enc = f["term_node"].attrs.get("encoding", "plain")
            data["term_node_encoding"] = enc.decode() if isinstance(enc, bytes) else str(enc)
        except OSError:
            raise FeatureFileError(f"{p}: checksum mismatch while reading: the file is corrupted; re-create it") from None
        attrs = {k: f.attrs[k] for k in f.attrs}
    return _from_arrays(p, attrs, data)


def _attr(attrs, key, kind=str):
    v = attrs[key]
    if isinstance(v, bytes):
        v = v.decode()
    return kind(v)


def _from_arrays(p, attrs, data) -> FeatureSet:
    try:
        src = bytes(data["skeleton"].astype(np.uint8)).decode("utf-8")
        if hashlib.sha256(src.encode()).hexdigest() != _attr(attrs, "skeleton_sha256"):
            raise FeatureFileError(f"{p}: the embedded skeleton does not match its recorded hash: the file is corrupted")
        try:
            skel = parse_skeleton(src, _attr(attrs, "skeleton_path"))
        except RfsgenError as e:
            raise FeatureFileError(f"{p}: the embedded skeleton no longer parses ({e})") from None
        columns = _attr(attrs, "columns", int)
        draws = _attr(attrs, "draws", int)
        count = data["column_count"].astype(np.int64)
        kind = data["column_kind"].astype(np.uint8)
        lengths = data["column_terms"].astype(np.int64)
        node = data["term_node"].astype(np.int64)
        if data["term_node_encoding"] not in ("plain", "delta-within-column"):
            raise FeatureFileError(f"{p}: unknown term_node encoding {data['term_node_encoding']!r}; "
                                   "re-create the file with this rfsgen")
        if data["term_node_encoding"] == "delta-within-column":
            ptr = np.zeros(lengths.size + 1, dtype=np.int64)
            np.cumsum(lengths, out=ptr[1:])
            if ptr[-1] != node.size:
                raise FeatureFileError(f"{p}: column_terms and term_node disagree (file is inconsistent); re-create it")
            node = _node_from_deltas(node, ptr)
        code = data["term_code"].astype(np.int64)
        power = data["term_power"].astype(np.int64)
        omega = data["omega"].astype(np.float64)
        stats = json.loads(_attr(attrs, "stats"))
        fs = FeatureSet(
            skeleton=skel, scheme=_attr(attrs, "scheme"), seed=_attr(attrs, "seed", int), draws=draws,
            count=count, kind=kind, ptr=np.concatenate(([0], np.cumsum(lengths))), node=node, code=code,
            power=power, omega=omega, stats=stats, command=_attr(attrs, "command"),
            tool_version=_attr(attrs, "tool_version"),
        )
    except (KeyError, ValueError, UnicodeDecodeError) as e:
        raise FeatureFileError(f"{p}: malformed feature file ({e}); re-create it with 'rfsgen sample'") from None
    _validate(p, fs, columns)
    return fs


def _validate(p, fs: FeatureSet, columns: int):
    def bad(what):
        return FeatureFileError(f"{p}: inconsistent feature file ({what}); re-create it with 'rfsgen sample'")

    if not (fs.count.size == fs.kind.size == columns):
        raise bad(f"{fs.count.size} column counts for {columns} columns")
    if fs.ptr[-1] != fs.node.size or not (fs.node.size == fs.code.size == fs.power.size):
        raise bad("term arrays of different lengths")
    if fs.count.min(initial=1) < 1 or int(fs.count.sum()) != fs.draws:
        raise bad("column counts do not add up to the number of draws")
    if np.any(fs.kind > 2):
        raise bad("unknown column kind")
    skel = fs.walk_skeleton
    if fs.node.size:
        if fs.node.min() < 0 or fs.node.max() >= len(skel.nodes):
            raise bad("a term refers to a node the skeleton does not have")
        is_input = np.array([isinstance(n, InputNode) for n in skel.nodes])
        if not is_input[fs.node].all():
            raise bad("a term refers to an internal node")
        widths = np.array([n.base.width if isinstance(n, InputNode) else 0 for n in skel.nodes])
        cont = np.array([isinstance(n, InputNode) and n.base.continuous for n in skel.nodes])[fs.node]
        if cont.any():
            ends = fs.code[cont] + widths[fs.node[cont]]
            if fs.code[cont].min() < 0 or ends.max() > fs.omega.size:
                raise bad("a continuous term points outside the omega table")


# ----------------------------------------------------------------------------- inspection
def describe(fs: FeatureSet, path=None) -> dict:
    """A JSON-ready summary of a feature set (``rfsgen inspect``).

    Stable keys: columns, draws, features, seed, scheme, dedup_ratio, constant_weight,
    mean_terms, max_terms, terms_histogram, mean_factors_per_draw, complexity,
    output_degree_histogram, input_nodes_used, input_nodes, top_input_nodes,
    bytes_per_column, file_bytes, kinds, tool_version, command.
    """
    import os

    lengths = np.diff(fs.ptr)
    skel = fs.walk_skeleton
    const = np.flatnonzero(lengths == 0)
    # Columns that differ only in their phase bit share one feature.
    cont_node = np.array([isinstance(n, InputNode) and n.base.continuous for n in skel.nodes])
    has_cont = np.zeros(fs.columns, dtype=bool)
    if fs.node.size:
        np.logical_or.at(has_cont, np.repeat(np.arange(fs.columns), lengths), cont_node[fs.node])
    from .sampler import term_keys

    keys = term_keys(np.zeros(fs.columns, np.uint8), fs.ptr, fs.node, fs.code, fs.power, has_cont)
    n_features = int(np.unique(keys, axis=0).shape[0]) if fs.columns else 0
    usage = np.bincount(fs.node, minlength=len(skel.nodes)) if fs.node.size else np.zeros(len(skel.nodes), int)
    top = np.argsort(-usage, kind="stable")[:5]
    file_bytes = os.path.getsize(path) if path and os.path.exists(str(path)) else None
    return {
        "path": str(path) if path else None,
        "columns": fs.columns,
        "draws": fs.draws,
        "features": n_features,
        "seed": fs.seed,
        "scheme": fs.scheme,
        "dedup_ratio": fs.draws / max(fs.columns, 1),
        "constant_weight": float(fs.weight[const].sum()) if const.size else 0.0,
        "kinds": {"real": int((fs.kind == 0).sum()), "cos": int((fs.kind == 1).sum()), "sin": int((fs.kind == 2).sum())},
        "mean_terms": float(lengths.mean()) if fs.columns else 0.0,
        "max_terms": int(lengths.max()) if fs.columns else 0,
        "terms_histogram": np.bincount(np.minimum(lengths, 16)).tolist() if fs.columns else [],
        "mean_factors_per_draw": fs.stats.get("mean_factors_per_draw"),
        "complexity": skel.complexity if fs.scheme == "rfs" else fs.skeleton.complexity,
        "output_degree_histogram": fs.stats.get("output_degree_histogram"),
        "input_nodes_used": int((usage > 0).sum()),
        "input_nodes": len(skel.input_nodes),
        "top_input_nodes": [{"node": skel.nodes[i].label, "terms": int(usage[i])} for i in top if usage[i] > 0],
        "bytes_per_column": (file_bytes / fs.columns) if file_bytes and fs.columns else None,
        "file_bytes": file_bytes,
        "tool_version": fs.tool_version,
        "command": fs.command,
        "skeleton": fs.skeleton.path,
    }
