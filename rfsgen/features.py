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
from .schemes import SCHEMES, WALK_AS_WRITTEN
from .skeleton import InputNode, Skeleton, parse_skeleton

FORMAT = "rfsgen-features"
FORMAT_VERSION = 2  # 2: a checksummed rfsgen header in the user block, root attributes sealed (1 is still read)


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
    eof: object = None  # rfsgen.eof.Columns for scheme 'eof' (level and index vectors), else None

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
        if self.scheme in WALK_AS_WRITTEN or self.scheme == "eof":
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


#: gzip level 4: measured at 10^6 columns, 0.23 s against 7.8 s for level 9, for a file
#: 4.8% larger (2.5% at 10^4); lzf was faster still but 50% larger.
GZIP_LEVEL = 4
#: Values per chunk of every dataset.
CHUNK = 1 << 18


def _put(f, name, data, compress=True, pool=None):
    """Write ``data`` (1-d) as dataset ``name``, chunked, fletcher32-checksummed and, if
    ``compress``, shuffled and gzip-compressed.  With a thread pool ``pool``, the chunks
    of a multi-chunk compressed dataset are filtered on its threads (:func:`_filtered_chunk`,
    byte-identical to HDF5's own filter pipeline) and written as they are."""
    data = np.ascontiguousarray(data)
    kw = dict(fletcher32=True, track_times=False)
    if data.size == 0:
        f.create_dataset(name, shape=(0,), dtype=data.dtype, chunks=(1,), maxshape=(None,), **kw)
        return
    n = int(min(data.size, CHUNK))
    if compress:
        kw.update(compression="gzip", compression_opts=GZIP_LEVEL, shuffle=True)
    if not compress or pool is None or data.size <= n:
        f.create_dataset(name, data=data, chunks=(n,), **kw)
        return
    dset = f.create_dataset(name, shape=data.shape, dtype=data.dtype, chunks=(n,), **kw)
    starts = range(0, data.size, n)
    for start, payload in zip(starts, pool.map(lambda a: _filtered_chunk(data, a, n), starts)):
        dset.id.write_direct_chunk((start,), payload)


def _filtered_chunk(data: np.ndarray, start: int, n: int) -> bytes:
    """The chunk of ``n`` values of ``data`` at ``start`` (the last one padded with zeros,
    HDF5's fill value) through HDF5's filters for a shuffled, gzip-compressed,
    fletcher32-checksummed dataset: the bytes HDF5 itself would store."""
    import zlib

    from ._compiled import fletcher32

    part = data[start:start + n]
    if part.size < n:
        part = np.concatenate([part, np.zeros(n - part.size, dtype=data.dtype)])
    raw = np.frombuffer(part.tobytes(), dtype=np.uint8)
    if data.dtype.itemsize > 1:  # shuffle: byte k of every value together, k = 0, 1, ...
        raw = raw.reshape(n, data.dtype.itemsize).T
    packed = zlib.compress(raw.tobytes(), GZIP_LEVEL)
    return packed + int(fletcher32(np.frombuffer(packed, dtype=np.uint8))).to_bytes(4, "little")


def save(fs: FeatureSet, path, overwrite: bool = False, *, inputs=(), progress=None) -> None:
    """Write ``fs`` to ``path`` atomically (temporary file + rename).

    ``inputs``: files the caller read (the output may not replace one of them).
    ``progress``, if given, is called with the number of columns' worth of data
    written after each dataset; if it has a ``phase(name, total)`` method, that is
    called first with ``("write", fs.columns)``.  SIGINT/SIGTERM/SIGHUP during the
    write take effect between datasets (h5py would swallow an exception raised
    inside its own cleanup).
    """
    import h5py

    from ._signals import deferred
    from .atomic import SafeFile, atomic_path

    with atomic_path(path, overwrite, inputs) as tmp, SafeFile(tmp) as sink:
        if progress is not None and hasattr(progress, "phase"):
            progress.phase("write", fs.columns)
        with deferred():  # HDF5 writes through SafeFile: a full disk surfaces in sink.check()
            with h5py.File(sink, "w", libver="earliest", track_order=False, userblock_size=USERBLOCK) as f:
                _write(f, fs, progress, sink)
            _write_header(sink, FORMAT_VERSION if fs.eof is None else _eof().FORMAT_VERSION)
        sink.check()


#: The HDF5 user block (which HDF5 skips) holds rfsgen's own header: a magic line and
#: the SHA-256 of everything after it, checked before HDF5 parses a byte.  HDF5 can
#: hang or crash on damaged metadata; this way a damaged file never reaches it.
USERBLOCK = 512
MAGIC = b"rfsgen-features\n"


def _digest_rest(fh) -> str:
    """SHA-256 of what remains of the binary file ``fh`` from its current position."""
    digest = hashlib.sha256()
    while True:
        block = fh.read(1 << 20)
        if not block:
            return digest.hexdigest()
        digest.update(block)


def _write_header(sink, version=FORMAT_VERSION) -> None:
    sink.seek(USERBLOCK)
    header = MAGIC + f"format_version {version}\nsha256 {_digest_rest(sink)}\n".encode()
    sink.seek(0)
    sink.write(header.ljust(USERBLOCK, b"\0"))


def _check_header(p: str) -> None:
    """Verify a version-2 file's header and checksum before HDF5 opens it (version-1
    files, which start with the HDF5 signature, have none)."""
    with open(p, "rb") as fh:
        head = fh.read(USERBLOCK)
        if head.startswith(b"\x89HDF\r\n\x1a\n"):
            return  # format version 1: no rfsgen header
        if not head.startswith(MAGIC):
            raise FeatureFileError(f"{p}: not a readable HDF5 file (truncated, corrupted or another format); "
                                   "re-create it with 'rfsgen sample'")
        fields = dict(line.split(" ", 1) for line in head[len(MAGIC):].split(b"\0", 1)[0].decode("ascii", "replace")
                      .splitlines() if " " in line)
        digest = _digest_rest(fh)
    if fields.get("sha256") != digest:
        raise FeatureFileError(f"{p}: checksum mismatch: the file is corrupted or truncated; re-create it with "
                               "'rfsgen sample'")


def _write(f, fs: FeatureSet, progress=None, sink=None):
    from concurrent.futures import ThreadPoolExecutor

    from ._compiled import threads
    from ._signals import checkpoint

    src = fs.skeleton.source.encode("utf-8")
    attrs = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION if fs.eof is None else _eof().FORMAT_VERSION,
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
    if fs.skeleton.auto:
        attrs["input_width"] = int(fs.skeleton.width)
    if fs.eof is not None:
        attrs["eof"] = json.dumps(fs.eof.meta, sort_keys=True)
    for k, v in attrs.items():
        f.attrs[k] = v
    datasets = [
        ("skeleton", np.frombuffer(src, dtype=np.uint8), True),
        ("column_count", _narrow(fs.count), True),
        ("column_kind", fs.kind.astype(np.uint8), True),
        ("column_terms", _narrow(np.diff(fs.ptr)), True),
        # Terms are sorted within a column, so node ids are stored as differences from the
        # previous term of the same column: small numbers that compress ~10% better.
        ("term_node", _narrow(_node_deltas(fs.node, fs.ptr)), True),
        ("term_code", _narrow(fs.code), True),
        ("term_power", _narrow(fs.power), True),
        ("omega", fs.omega.astype(np.float64), False),
    ]
    total = sum(d.nbytes for _, d, _ in datasets) or 1
    done = 0
    with ThreadPoolExecutor(max_workers=threads(), thread_name_prefix="rfsgen-write") as pool:
        for name, data, compress in datasets:
            checkpoint()
            if sink is not None:
                sink.check()
            _put(f, name, data, compress, pool)
            if name == "term_node":
                f["term_node"].attrs["encoding"] = "delta-within-column"
            if progress is not None:
                new = (done + data.nbytes) * fs.columns // total
                progress(new - done * fs.columns // total)
            done += data.nbytes
    if fs.eof is not None:
        _eof().write(f, fs.eof)
    _seal(f)


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


# ----------------------------------------------------------------------------- attribute seal
ATTRS = ("format", "format_version", "tool_version", "seed", "columns", "draws", "scheme", "skeleton_path",
         "skeleton_sha256", "nodes", "command", "stats")
#: Written only for a 'width: auto' skeleton: the width it was bound to when sampled.
OPTIONAL_ATTRS = ("input_width", "eof")  # eof: JSON of an EOF file's grid and domain (rfsgen.eof)


def _attrs_digest(attrs: dict, encoding: str) -> str:
    """SHA-256 of the root attributes (and term_node's encoding): fletcher32 covers the
    datasets only, so without this a flipped bit in an attribute would go unnoticed."""
    items = []
    for k in ATTRS + tuple(k for k in OPTIONAL_ATTRS if k in attrs):
        v = attrs[k]
        v = _plain(v)
        items.append([k, v if isinstance(v, (int, str)) else repr(v)])
    items.append(["term_node.encoding", encoding])
    return hashlib.sha256(json.dumps(items, sort_keys=False).encode()).hexdigest()


def _plain(v):
    """An attribute value as a plain Python value (str, int, float, list) for hashing and messages."""
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v.item() if hasattr(v, "item") else v


def _seal(f):
    enc = f["term_node"].attrs["encoding"]
    keys = ATTRS + tuple(k for k in OPTIONAL_ATTRS if k in f.attrs)
    f.attrs["attrs_sha256"] = _attrs_digest({k: f.attrs[k] for k in keys}, enc if isinstance(enc, str) else enc.decode())


# ----------------------------------------------------------------------------- reading
REQUIRED = ("skeleton", "column_count", "column_kind", "column_terms", "term_node", "term_code", "term_power", "omega")


def load(path) -> FeatureSet:
    """Read and validate a feature file; raises :class:`FeatureFileError` with a clear message.

    A feature file may come from elsewhere: every attribute and dataset is checked
    for type, shape and range (node indices, codes, powers, omega offsets, counts)
    before anything uses it, and the root attributes against their seal.
    """
    import h5py

    p = str(path)
    try:
        _check_header(p)
        f = h5py.File(p, "r")
    except FeatureFileError:
        raise
    except FileNotFoundError:
        raise FeatureFileError(f"{p}: no such feature file; create one with 'rfsgen sample'") from None
    except IsADirectoryError:
        raise FeatureFileError(f"{p}: is a directory, not a feature file") from None
    except PermissionError:
        raise FeatureFileError(f"{p}: permission denied; make the feature file readable") from None
    except Exception:  # h5py raises OSError and, for some damage, other types
        raise FeatureFileError(
            f"{p}: not a readable HDF5 file (truncated, corrupted or another format); re-create it with 'rfsgen sample'"
        ) from None
    try:
        with f:
            attrs, data = _read(p, f)
        return _from_arrays(p, attrs, data)
    except FeatureFileError:
        raise
    except Exception as e:  # damaged metadata surfaces as KeyError, RuntimeError, OSError, ...
        raise FeatureFileError(
            f"{p}: corrupted feature file ({type(e).__name__} while reading it); re-create it with 'rfsgen sample'"
        ) from None


def _bad(p, what) -> FeatureFileError:
    return FeatureFileError(f"{p}: invalid feature file ({what}); re-create it with 'rfsgen sample'")


def _read(p, f):
    import h5py

    fmt = f.attrs.get("format")
    if isinstance(fmt, bytes):
        fmt = fmt.decode("utf-8", "replace")
    if not isinstance(fmt, str) or fmt != FORMAT:
        shown = fmt if isinstance(fmt, str) else type(fmt).__name__
        raise FeatureFileError(f"{p}: not an rfsgen feature file (format attribute is {shown!r}); "
                               "pass a file made by 'rfsgen sample'")
    version = f.attrs.get("format_version")
    if not _is_int(version) or int(version) not in (1, FORMAT_VERSION, _eof().FORMAT_VERSION):
        raise FeatureFileError(
            f"{p}: feature file format version {_plain(version)!r} is not supported (this rfsgen reads versions 1, "
            f"{FORMAT_VERSION} and {_eof().FORMAT_VERSION}); re-create it with this rfsgen's 'rfsgen sample'"
        )
    attrs = {}
    for k in ATTRS + (("attrs_sha256",) if int(version) >= 2 else ()):
        if k not in f.attrs:
            raise _bad(p, f"missing attribute '{k}'")
        attrs[k] = f.attrs[k]
    attrs.update({k: f.attrs[k] for k in OPTIONAL_ATTRS if k in f.attrs})
    for k in REQUIRED:
        obj = f.get(k, getlink=True)
        if obj is None:
            raise FeatureFileError(f"{p}: incomplete feature file (missing dataset '{k}'); re-create it")
        if not isinstance(obj, h5py.HardLink):
            raise _bad(p, f"'{k}' is a link, not a dataset")
        if not isinstance(f[k], h5py.Dataset):
            raise _bad(p, f"'{k}' is not a dataset")
    data = {}
    for k in REQUIRED:
        ds = f[k]
        kind = "f" if k == "omega" else "iu"
        if ds.ndim != 1 or ds.dtype.kind not in kind or ds.dtype.itemsize > 8:
            raise _bad(p, f"dataset '{k}' has shape {ds.shape} and dtype {ds.dtype}; expected a 1-D "
                          + ("float" if k == "omega" else "integer") + " array")
        try:
            data[k] = ds[()]
        except OSError:
            raise FeatureFileError(f"{p}: checksum mismatch while reading '{k}': the file is corrupted; re-create it") from None
    enc = f["term_node"].attrs.get("encoding", "plain")
    if isinstance(enc, bytes):
        enc = enc.decode("utf-8", "replace")
    if not isinstance(enc, str):
        raise _bad(p, "term_node's encoding attribute is not a string")
    data["term_node_encoding"] = enc
    if ("eof" in attrs) != (int(version) == _eof().FORMAT_VERSION):
        raise _bad(p, f"format version {int(version)} with{'' if 'eof' in attrs else 'out'} an 'eof' attribute")
    if "eof" in attrs:
        data.update(_eof().read(p, f, attrs))
    if int(version) >= 2:
        seal = attrs["attrs_sha256"]
        seal = seal.decode("utf-8", "replace") if isinstance(seal, bytes) else seal
        if not isinstance(seal, str) or seal != _attrs_digest(attrs, enc):
            raise FeatureFileError(f"{p}: the file's attributes do not match their checksum: the file is corrupted; "
                                   "re-create it with 'rfsgen sample'")
    return attrs, data


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _attr(p, attrs, key, kind=str):
    v = attrs[key]
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if kind is int:
        if not _is_int(v):
            raise _bad(p, f"attribute '{key}' must be an integer, not {type(v).__name__}")
        return int(v)
    if not isinstance(v, str):
        raise _bad(p, f"attribute '{key}' must be a string, not {type(v).__name__}")
    return str(v)


def _from_arrays(p, attrs, data) -> FeatureSet:
    try:
        src = bytes(data["skeleton"].astype(np.uint8)).decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(p, "the embedded skeleton is not UTF-8 text") from None
    if hashlib.sha256(src.encode()).hexdigest() != _attr(p, attrs, "skeleton_sha256"):
        raise FeatureFileError(f"{p}: the embedded skeleton does not match its recorded hash: the file is corrupted")
    width = _attr(p, attrs, "input_width", int) if "input_width" in attrs else None
    try:
        skel = parse_skeleton(src, _attr(p, attrs, "skeleton_path"), width=width)
    except RfsgenError as e:
        raise FeatureFileError(f"{p}: the embedded skeleton no longer parses ({e})") from None
    if skel.auto != (width is not None):
        raise _bad(p, "the embedded skeleton says 'width: auto' but the file records no input width" if skel.auto
                   else "the file records an input width for a fixed-width skeleton")
    columns = _attr(p, attrs, "columns", int)
    draws = _attr(p, attrs, "draws", int)
    seed = _attr(p, attrs, "seed", int)
    scheme = _attr(p, attrs, "scheme")
    if scheme not in SCHEMES and scheme != "eof":
        raise _bad(p, f"unknown scheme {scheme!r}")
    if (scheme == "eof") != ("eof" in attrs):
        raise _bad(p, "scheme 'eof' without EOF columns, or EOF columns under another scheme")
    if _attr(p, attrs, "nodes", int) != len(skel.nodes):
        raise _bad(p, "the node count does not match the embedded skeleton")
    try:
        stats = json.loads(_attr(p, attrs, "stats"))
    except ValueError:
        raise _bad(p, "the 'stats' attribute is not JSON") from None
    if not isinstance(stats, dict):
        raise _bad(p, "the 'stats' attribute is not a JSON object")
    enc = data["term_node_encoding"]
    if enc not in ("plain", "delta-within-column"):
        raise _bad(p, f"unknown term_node encoding {enc!r}")
    if any(int(data[k].min(initial=0)) < -(2**62) or int(data[k].max(initial=0)) > 2**62
           for k in ("column_count", "column_terms", "term_node", "term_code", "term_power")):
        raise _bad(p, "an integer dataset holds values beyond 2**62")
    count = data["column_count"].astype(np.int64)
    kind = data["column_kind"].astype(np.int64)
    lengths = data["column_terms"].astype(np.int64)
    if columns < 1 or not (count.size == kind.size == lengths.size == columns):
        raise _bad(p, f"{count.size} column counts, {kind.size} kinds and {lengths.size} term counts "
                      f"for {columns} columns")
    if lengths.min(initial=0) < 0:
        raise _bad(p, "a negative term count")
    ptr = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    node = data["term_node"].astype(np.int64)
    if ptr[-1] != node.size or not (node.size == data["term_code"].size == data["term_power"].size):
        raise _bad(p, "term arrays of different lengths")
    if enc == "delta-within-column":
        node = _node_from_deltas(node, ptr)
    omega = data["omega"].astype(np.float64)
    fs = FeatureSet(
        skeleton=skel, scheme=scheme, seed=seed, draws=draws, count=count, kind=kind.astype(np.uint8),
        ptr=ptr, node=node, code=data["term_code"].astype(np.int64), power=data["term_power"].astype(np.int64),
        omega=omega, stats=stats, command=_attr(p, attrs, "command"), tool_version=_attr(p, attrs, "tool_version"),
    )
    _validate(p, fs, kind)
    if "eof" in attrs:
        fs.eof = _eof().from_file(p, fs, _plain(attrs["eof"]), data)
    return fs


def _eof():
    from . import eof

    return eof


def _validate(p, fs: FeatureSet, kind):
    def bad(what):
        return _bad(p, what)

    if fs.count.min(initial=1) < 1 or fs.draws < fs.columns or math.fsum(fs.count.astype(np.float64)) != fs.draws \
            or int(fs.count.sum()) != fs.draws:
        raise bad("column counts do not add up to the number of draws")
    if kind.min(initial=0) < 0 or kind.max(initial=0) > 2:
        raise bad("unknown column kind")
    try:
        skel = fs.walk_skeleton
    except RfsgenError as e:
        raise bad(f"its scheme does not apply to the embedded skeleton: {e}") from None
    if not fs.node.size:
        return
    if fs.node.min() < 0 or fs.node.max() >= len(skel.nodes):
        raise bad("a term refers to a node the skeleton does not have")
    is_input = np.array([isinstance(n, InputNode) for n in skel.nodes])
    if not is_input[fs.node].all():
        raise bad("a term refers to an internal node")
    if not np.isfinite(fs.omega).all():
        raise bad("the omega table holds NaN or inf")
    group_of = np.full(len(skel.nodes), -1)
    for g, (_, ids, _) in enumerate(skel.input_groups):
        group_of[ids] = g
    tg = group_of[fs.node]
    for g, (base, _, _) in enumerate(skel.input_groups):
        sel = tg == g
        if not sel.any():
            continue
        code, power = fs.code[sel], fs.power[sel]
        lo, hi, plo, phi = _code_ranges(base)
        if base.continuous:
            if code.min() < 0 or (code + base.width).max() > fs.omega.size:
                raise bad(f"a {base.name} term points outside the omega table")
        elif code.min() < lo or code.max() > hi:
            raise bad(f"a {base.name} term has code outside {lo}..{hi}")
        if power.min() < plo or power.max() > phi or (plo < 0 and not power.all()):
            raise bad(f"a {base.name} term has power outside {plo}..{phi}" + (" or zero" if plo < 0 else ""))


def _code_ranges(base):
    """(lowest code, highest code, lowest power, highest power) a base's terms may have."""
    from .activations import DEGREE_LIMIT

    if base.name == "binary":
        return 0, 0, 1, 1
    if base.name == "circle":
        return 0, 0, -DEGREE_LIMIT, DEGREE_LIMIT
    if base.name == "categorical":
        return 0, 0, 1, base.param("categories") - 1
    if base.name == "sphere":
        d = base.width
        return 0, (2 * d if base.param("scheme") == "pair" else d) - 1, 1, DEGREE_LIMIT
    if base.name == "brownian":
        from .bases import brownian_max_m

        return 0, brownian_max_m(base.width) * base.width - 1, 1, DEGREE_LIMIT
    return 0, 0, 1, 1  # continuous: codes are omega offsets, checked separately


# ----------------------------------------------------------------------------- inspection
def term_keys(kind, ptr, node, code, power, continuous, first_draw: int = 0) -> np.ndarray:
    """A 128-bit identity per draw (numpy void16): two independent hashes of (kind, sorted terms).

    Terms are in canonical order, so equal features get equal keys; the chance that
    two different features share both 64-bit halves is about n^2 / 2^129.  Draws with
    a continuous term are unique by construction and get a key made from their index.
    """
    from ._compiled import draw_keys

    n = kind.size
    out = np.empty((n, 2), dtype=np.uint64)
    draw_keys(np.ascontiguousarray(kind), np.ascontiguousarray(ptr, dtype=np.int64), np.ascontiguousarray(node, dtype=np.int64),
              np.ascontiguousarray(code, dtype=np.int64), np.ascontiguousarray(power, dtype=np.int64),
              np.ascontiguousarray(continuous, dtype=np.bool_), int(first_draw), out)
    return out


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
        **(_eof().summary(fs) if fs.eof is not None else {}),  # EOF: its grid, and no terms to count
    }
