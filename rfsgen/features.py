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

File layout (format ``rfsgen-features``, version 4; EOF files 5), every dataset fletcher32-
checksummed and written with ``track_times=False`` so files are byte-identical::

    /                attrs: format, format_version, tool_version, seed, columns, draws,
                            scheme, skeleton_path, skeleton_sha256, nodes, command, stats (JSON)
    /skeleton        string   the skeleton's source text: one fixed-length UTF-8 HDF5 string
                              (h5dump shows it as text; versions 1-3: a uint8 array of its bytes);
                              re-parsed on load
    /column_count    uint     draws that produced each column
    /column_kind     uint8    0 real, 1 cos (b = 0), 2 sin (b = pi/2)
    /column_terms    uint     number of terms of each column (ptr = cumsum)
    /term_node       uint     input node id of each term
    /term_code       int      code (continuous: offset into /omega)
    /term_power      int      power
    /omega           float64  continuous omegas, flat
    /column_weight   float64  optional: each column's weight (a float, e.g. LKRF's learned weights,
                              rfsgen.select); present only when set, with the root attribute
                              column_weights = "float".  Without it a column's weight is count/draws.

Integer datasets use the narrowest dtype that holds their values (a few bytes
per term) and are shuffled and gzip-compressed.
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np

from .errors import FeatureFileError, LimitError, RfsgenError
# The feature set and the dataset helpers every column kind shares live below the kinds
# (rfsgen.featureset); they are still importable from here.
from .featureset import (ALLOWED_FILTERS, CHUNK, FORMAT, FORMAT_VERSION, GZIP_LEVEL,  # noqa: F401
                         STRING_SKELETON_VERSIONS, FeatureSet, _attr, _bad, _check_dataset, _is_int, _narrow, _plain,
                         _read_data)
from .kinds import ATTRIBUTES as KIND_ATTRIBUTES, KINDS, VERSIONS, of as kind_of, owner_of_version
from .skeleton import InputNode, parse_skeleton


# ----------------------------------------------------------------------------- writing

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
            _write_header(sink, kind_of(fs).format_version)
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

    kind = kind_of(fs)
    src = fs.skeleton.source.encode("utf-8")
    attrs = {
        "format": FORMAT,
        "format_version": kind.format_version,
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
    if fs.skeleton.params:  # the values of the skeleton's parameters, re-applied on load
        attrs["params"] = json.dumps(dict(fs.skeleton.params))
    attrs.update(kind.attrs(fs))  # (EOF: its grid and domain, JSON)
    if fs.column_weight is not None:
        problem = weight_problem(fs.column_weight, fs.columns, not kind.weights_add_up)
        if problem:
            raise ValueError(f"FeatureSet.column_weight: {problem}")
        attrs["column_weights"] = "float"
    for k, v in attrs.items():
        f.attrs[k] = v
    _put_text(f, "skeleton", src)
    datasets = [
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
    if fs.column_weight is not None:  # absent otherwise: files without weights keep their bytes
        datasets.append(("column_weight", np.asarray(fs.column_weight, dtype=np.float64), False))
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
    kind.write(f, fs)  # the kind's own datasets (EOF: level and index vectors)
    _seal(f)


def _put_text(f, name, raw: bytes):
    """Write ``raw`` (UTF-8) as dataset ``name``: one fixed-length UTF-8 string, chunked,
    gzip-compressed and fletcher32-checksummed as the other datasets are."""
    import h5py

    data = np.array([raw], dtype=h5py.string_dtype("utf-8", max(len(raw), 1)))
    f.create_dataset(name, data=data, chunks=(1,), fletcher32=True, track_times=False, compression="gzip",
                     compression_opts=GZIP_LEVEL)


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
#: params: JSON ``{name: value}`` in the file's order, written only when the skeleton declares parameters.
OPTIONAL_ATTRS = ("input_width",) + KIND_ATTRIBUTES + ("params", "column_weights")  # the column kinds' own
# attributes (rfsgen.kinds; EOF's 'eof': JSON of its grid and domain); column_weights: "float" when the file has
# the /column_weight dataset (so the seal covers whether a file is weighted, and the dataset cannot be removed or
# added unnoticed)


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


def _seal(f):
    enc = f["term_node"].attrs["encoding"]
    keys = ATTRS + tuple(k for k in OPTIONAL_ATTRS if k in f.attrs)
    f.attrs["attrs_sha256"] = _attrs_digest({k: f.attrs[k] for k in keys}, enc if isinstance(enc, str) else enc.decode())


# ----------------------------------------------------------------------------- reading
REQUIRED = ("skeleton", "column_count", "column_kind", "column_terms", "term_node", "term_code", "term_power", "omega")
COLUMN_DATASETS = ("column_count", "column_kind", "column_terms")
TERM_DATASETS = ("term_node", "term_code", "term_power")

# A feature file may come from elsewhere, and a forger can recompute every checksum and
# the seal: what protects the reader is what it checks about the *meaning* of the file.
# The bounds below keep every value the transform computes finite for finite inputs and
# every allocation within the memory budget; a file the sampler writes never reaches them.

#: Most draws a file may record (the sampler's counters and sums of counts stay exact in int64).
MAX_DRAWS = 2**62
#: Bound on the sum, over one column, of |power| of its unit-modulus terms (circle,
#: categorical, sphere 'pair' over 2 values: factors whose value has modulus 1).  The
#: transform raises such a factor z (computed |z| = 1 + d, |d| <= 2u with u = 2^-53)
#: to its power by repeated squaring, each complex product adding a relative error of at
#: most sqrt(5) u, so |z^p| <= exp((2 + sqrt(5)) u |p|) and a column's modulus drifts by
#: at most exp(4.3 u sum|p|) <= exp(4.3 * 2^50 / 2^53) = e^0.54.  That stays inside the
#: transform's overflow margin (a factor e, see Transformer._plan_huge), so outputs stay
#: finite and within 1.7x of their true modulus; at 2^54..2^60 the drift reaches 1e156
#: and then inf.  The sampler's circle powers are +-1 random walks (|p| ~ sqrt(draws) <=
#: 2^31), categorical ones are below 'categories' <= 2^31; only a sphere 'pair' node over
#: 2 values under a heavy-tailed activation (step) could legitimately come near, after a
#: single draw of degree >= 2^52 (probability ~1e-8 per draw).
MAX_UNIT_POWER = 2**50
#: Bound on |omega| of gaussian/laplace terms.  The transform's angle is
#: sum_c x_c * (scale * omega_c): with |omega| <= 2^160 the scaled table stays finite for
#: any scale below 2^863 (1e259) and the angle for any row with |x| * width * scale <= 2^863;
#: rows beyond that overflow in the mathematics itself (the transform reports them).
#: Sampled omegas are sqrt(count) * N(0, 1) (< 2^40) or count * Cauchy (count <= 2^62;
#: |Cauchy| > 2^98 has probability 2e-30 per draw).  omega = 1e308 used to give NaN.
MAX_OMEGA = 2.0**160
#: Bound on the sum of float column weights (/column_weight).  A column's output scale is
#: sqrt(weight) (times sqrt(2) for cos/sin columns), so weights summing to at most 2^20 keep
#: every scale at most 2^10.5 (~1448): each output value is at most 2^10.5 times its value
#: under weight 1, and the transform's overflow plan (Transformer._plan_huge) accounts for the
#: scale, so finite inputs give finite outputs as for count weights.  Selection's weights
#: (rfsgen.select) sum to 1.
MAX_WEIGHT_SUM = 2.0**20
#: Most entries of the 'output_degree_histogram' statistic (degrees are capped at 2^62).
MAX_HISTOGRAM = 1 << 16
#: Largest stored size of one root attribute (a command line is at most a few MB).
MAX_ATTRIBUTE_BYTES = 16 << 20
#: Bytes of memory per column and per term while loading (the datasets as stored, their
#: int64 copies and the pointer/decoding temporaries), for the budget check before reading.
BYTES_PER_COLUMN = 64
BYTES_PER_TERM = 80
#: The omega table is held once, as read (float64), with small temporaries of its checks.
BYTES_PER_OMEGA = 8
#: Omegas whose range is checked at once (:func:`_check_omega`).
OMEGA_CHECK_SLICE = 1 << 17


def weight_problem(w, columns: int, eof: bool = False) -> str | None:
    """What is wrong with ``w`` as float column weights of ``columns`` columns (None if nothing):
    float64 of shape (columns,), finite, >= 0, summing to at most :data:`MAX_WEIGHT_SUM`
    (``eof``, for a kind whose weights do not add up, :attr:`ColumnKind.weights_add_up`: each
    at most :data:`MAX_WEIGHT_SUM`; an EOF column's weight multiplies its feature's square, 1
    without weights, so they do not sum to 1).  Either bound keeps a
    column's scale sqrt(weight) at most 2^10."""
    w = np.asarray(w)
    if w.dtype != np.float64:
        return f"dtype {w.dtype}; expected float64"
    if w.shape != (columns,):
        return f"shape {w.shape}; expected ({columns},), one weight per column"
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        return f"column {j} has weight {float(w[j])!r}; weights are finite and >= 0"
    if eof:
        if w.size and float(w.max()) > MAX_WEIGHT_SUM:
            j = int(np.argmax(w))
            return f"column {j} has weight {float(w[j]):.6g}, over 2^20"
        return None
    with np.errstate(over="ignore"):  # 1e308 + 1e308: inf, over the bound
        total = float(w.sum())
    if total > MAX_WEIGHT_SUM:
        return f"the weights add up to {total:.6g}, over 2^20"
    return None


def is_feature_file(path) -> bool:
    """Whether ``path`` looks like a feature file (the rfsgen header, or a version-1 HDF5
    file whose ``format`` attribute is rfsgen's); never raises.  Used to recognise swapped
    arguments, not to validate: :func:`load` does that."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(MAGIC))
        if head == MAGIC:
            return True
        if not head.startswith(b"\x89HDF\r\n\x1a\n"):
            return False
        import h5py

        with h5py.File(path, "r") as f:
            fmt = f.attrs.get("format")
        return (fmt.decode("utf-8", "replace") if isinstance(fmt, bytes) else fmt) == FORMAT
    except Exception:
        return False


def load(path) -> FeatureSet:
    """Read and validate a feature file; raises :class:`FeatureFileError` with a clear message.

    A feature file may come from elsewhere: every attribute and dataset is checked
    for type, shape and range (node indices, codes, powers, omega offsets, counts)
    before anything uses it, and the root attributes against their seal.  Nothing is
    read from outside the file: external storage, external or soft links, virtual
    datasets and filters other than gzip/shuffle/fletcher32 are refused, and each
    dataset's declared size is checked against the header's counts and the memory
    budget (:mod:`rfsgen.budget`, :class:`~rfsgen.errors.LimitError`) before it is read.
    """
    import os
    import stat

    import h5py

    p = str(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise FeatureFileError(f"{p}: no such feature file; create one with 'rfsgen sample'") from None
    except PermissionError:
        raise FeatureFileError(f"{p}: permission denied; make the feature file readable") from None
    except (OSError, ValueError) as e:
        raise FeatureFileError(f"{p}: cannot read the feature file ({type(e).__name__}); pass a feature file made by "
                               "'rfsgen sample'") from None
    if stat.S_ISDIR(st.st_mode):
        raise FeatureFileError(f"{p}: is a directory, not a feature file")
    if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
        raise FeatureFileError(f"{p}: not a regular file (a pipe, socket or device); save the feature file to disk "
                               "first")
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
            return _load(p, f)
    except RfsgenError:  # FeatureFileError, and LimitError for a file larger than the memory budget
        raise
    except RecursionError:
        raise _bad(p, "nested too deeply to read") from None
    except Exception as e:  # damaged metadata surfaces as KeyError, RuntimeError, OSError, ...
        raise FeatureFileError(
            f"{p}: corrupted feature file ({type(e).__name__} while reading it); re-create it with 'rfsgen sample'"
        ) from None


def _get_attr(p, obj, key, where="attribute"):
    """The value of attribute ``key`` of ``obj`` (None if absent), after checking, without
    reading it, that it is a single value of a plain type and of bounded size."""
    import h5py

    if key not in obj.attrs:
        return None
    aid = h5py.h5a.open(obj.id, key.encode())
    if aid.shape != ():
        raise _bad(p, f"{where} '{key}' has shape {aid.shape}; expected a single value")
    cls = aid.get_type().get_class()
    if cls not in (h5py.h5t.INTEGER, h5py.h5t.FLOAT, h5py.h5t.STRING):
        raise _bad(p, f"{where} '{key}' is not a number or a string (HDF5 type class {cls})")
    if aid.get_storage_size() > MAX_ATTRIBUTE_BYTES:
        raise _bad(p, f"{where} '{key}' is {aid.get_storage_size()} bytes, over {MAX_ATTRIBUTE_BYTES}")
    return obj.attrs[key]


def _params_attr(p, attrs) -> dict | None:
    """The skeleton parameter values the file records (attribute ``params``), or None."""
    if "params" not in attrs:
        return None
    raw = _plain(attrs["params"])
    try:
        params = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        params = None
    if not isinstance(params, dict) or not params or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in params.items()):
        raise _bad(p, "attribute 'params' is not a JSON mapping of parameter names to numbers")
    return params


def _load(p, f) -> FeatureSet:
    from .skeleton import MAX_SOURCE_BYTES

    try:
        fmt = _get_attr(p, f, "format")
    except FeatureFileError:  # not a single string: not ours
        fmt = None
    if isinstance(fmt, bytes):
        fmt = fmt.decode("utf-8", "replace")
    if not isinstance(fmt, str) or fmt != FORMAT:
        shown = fmt if isinstance(fmt, str) else type(fmt).__name__
        raise FeatureFileError(f"{p}: not an rfsgen feature file (format attribute is {shown!r}); "
                               "pass a file made by 'rfsgen sample'")
    version = _get_attr(p, f, "format_version")
    readable = VERSIONS
    if not _is_int(version) or int(version) not in readable:
        raise FeatureFileError(
            f"{p}: feature file format version {_plain(version)!r} is not supported (this rfsgen reads versions "
            f"{', '.join(map(str, readable[:-1]))} and {readable[-1]}); re-create it with this rfsgen's 'rfsgen sample'"
        )
    attrs = {}
    for k in ATTRS + (("attrs_sha256",) if int(version) >= 2 else ()):
        v = _get_attr(p, f, k)
        if v is None:
            raise _bad(p, f"missing attribute '{k}'")
        attrs[k] = v
    for k in OPTIONAL_ATTRS:
        v = _get_attr(p, f, k)
        if v is not None:
            attrs[k] = v
    text = int(version) in STRING_SKELETON_VERSIONS
    sizes = {k: _check_dataset(p, f, k, text=text and k == "skeleton") for k in REQUIRED}
    enc = _get_attr(p, f["term_node"], "encoding", "term_node's attribute")
    enc = "plain" if enc is None else enc
    if isinstance(enc, bytes):
        enc = enc.decode("utf-8", "replace")
    if not isinstance(enc, str):
        raise _bad(p, "term_node's encoding attribute is not a string")
    if int(version) >= 2:
        seal = attrs["attrs_sha256"]
        seal = seal.decode("utf-8", "replace") if isinstance(seal, bytes) else seal
        if not isinstance(seal, str) or seal != _attrs_digest(attrs, enc):
            raise FeatureFileError(f"{p}: the file's attributes do not match their checksum: the file is corrupted; "
                                   "re-create it with 'rfsgen sample'")
    if enc not in ("plain", "delta-within-column"):
        raise _bad(p, f"unknown term_node encoding {enc!r}")
    weighted = "column_weight" in f
    if weighted != ("column_weights" in attrs):
        raise _bad(p, "a 'column_weight' dataset without the 'column_weights' attribute" if weighted
                   else "attribute 'column_weights' without the 'column_weight' dataset")
    if weighted:
        sizes["column_weight"] = _check_dataset(p, f, "column_weight")
        if _attr(p, attrs, "column_weights") != "float":
            raise _bad(p, f"attribute 'column_weights' is {_plain(attrs['column_weights'])!r}; expected 'float'")
    owner = owner_of_version(int(version))  # the column kind whose files have this version
    for other in KINDS.values():
        a = other.attribute
        if a is not None and (a in attrs) != (other is owner):
            raise _bad(p, f"format version {int(version)} with{'' if a in attrs else 'out'} an '{a}' attribute")

    # The header's counts, then every declared size against them and the budget, before
    # a byte of data is read: a gzip "bomb" (kilobytes declaring gigabytes) stops here.
    columns = _attr(p, attrs, "columns", int)
    draws = _attr(p, attrs, "draws", int)
    seed = _attr(p, attrs, "seed", int)
    scheme = _attr(p, attrs, "scheme")
    nodes = _attr(p, attrs, "nodes", int)
    width = _attr(p, attrs, "input_width", int) if "input_width" in attrs else None
    if columns < 1:
        raise _bad(p, f"attribute 'columns' is {columns}; a feature file has at least one column")
    if not 1 <= draws <= MAX_DRAWS:
        raise _bad(p, f"attribute 'draws' is {draws}, outside 1..2^62")
    if scheme not in KINDS:
        raise _bad(p, f"unknown scheme {scheme!r} in attribute 'scheme' (one of {', '.join(KINDS)})")
    if KINDS[scheme] is not owner:
        raise _bad(p, f"scheme {scheme!r} in a file of {owner.name} columns (format version {int(version)})")
    stats = _stats(p, _attr(p, attrs, "stats"))
    command, tool_version = _attr(p, attrs, "command"), _attr(p, attrs, "tool_version")
    skeleton_path, skeleton_sha = _attr(p, attrs, "skeleton_path"), _attr(p, attrs, "skeleton_sha256")
    if sizes["skeleton"] > 4 * MAX_SOURCE_BYTES:  # UTF-8: at most 4 bytes per character
        raise _bad(p, f"dataset 'skeleton' declares {sizes['skeleton']} bytes, over the skeleton limit of "
                      f"{MAX_SOURCE_BYTES} characters")
    for k in COLUMN_DATASETS + (("column_weight",) if weighted else ()):
        if sizes[k] != columns:
            raise _bad(p, f"dataset '{k}' declares {sizes[k]} values for {columns} columns (attribute 'columns')")
    terms = sizes["term_node"]
    if not sizes["term_code"] == sizes["term_power"] == terms:
        raise _bad(p, "term arrays of different lengths (" + ", ".join(f"'{k}' {sizes[k]}" for k in TERM_DATASETS) + ")")
    # The budget is checked in stages, each before its datasets are read, so that a size
    # that contradicts what was already read is named as such rather than as too large.
    _budget(p, columns, 0, 0)

    raw = _read_data(p, f, "skeleton", 1 if text else sizes["skeleton"])
    try:
        src = bytes(raw[0]).decode("utf-8") if text else bytes(raw.astype(np.uint8)).decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(p, "the embedded skeleton is not UTF-8 text") from None
    if hashlib.sha256(src.encode()).hexdigest() != skeleton_sha:
        raise FeatureFileError(f"{p}: the embedded skeleton does not match its recorded hash: the file is corrupted; "
                               "re-create it with 'rfsgen sample'")
    params = _params_attr(p, attrs)
    try:  # the guarded YAML loader of every skeleton (alias bombs, size limits)
        skel = parse_skeleton(src, skeleton_path, width=width, params=params, warn=False)
    except LimitError:  # a valid skeleton over this run's memory budget: the budget's message
        raise
    except RfsgenError as e:
        raise FeatureFileError(f"{p}: the embedded skeleton no longer parses ({e})") from None
    if skel.auto != (width is not None):
        raise _bad(p, "the embedded skeleton says 'width: auto' but the file records no input width" if skel.auto
                   else "the file records an input width for a fixed-width skeleton")
    if nodes != len(skel.nodes):
        raise _bad(p, f"attribute 'nodes' is {nodes} but the embedded skeleton has {len(skel.nodes)} nodes")
    if bool(skel.params) != (params is not None) or (params is not None and dict(skel.params) != params):
        raise _bad(p, "attribute 'params' does not match the parameters the embedded skeleton declares")

    data = {k: _read_data(p, f, k, sizes[k]) for k in COLUMN_DATASETS}
    count = data["column_count"].astype(np.int64)
    kind = data["column_kind"].astype(np.int64)
    lengths = data["column_terms"].astype(np.int64)
    if count.min() < 1:  # (a uint64 count beyond 2^63 reads as negative here)
        raise _bad(p, f"column counts do not add up: column {int(np.argmin(count))} of dataset 'column_count' has "
                      f"count {int(count.min())}; counts are >= 1")
    # Counts are >= 1 and their float sum (relative error < 1e-9) at most 2^62 (1 + 1e-9), so
    # the int64 sum cannot wrap around.
    if float(count.sum(dtype=np.float64)) > MAX_DRAWS * (1 + 1e-9) or int(count.sum()) != draws or draws < columns:
        raise _bad(p, f"column counts do not add up to the number of draws ({draws}, attribute 'draws')")
    if kind.min() < 0 or kind.max() > 2:
        j = int(np.flatnonzero((kind < 0) | (kind > 2))[0])
        raise _bad(p, f"unknown column kind {int(kind[j])} at column {j} of dataset 'column_kind' (0, 1 or 2)")
    if lengths.min() < 0 or lengths.max() > terms or float(lengths.sum(dtype=np.float64)) > 2.0**62 \
            or int(lengths.sum()) != terms:
        raise _bad(p, f"term arrays of different lengths: 'column_terms' adds up to "
                      f"{float(lengths.sum(dtype=np.float64)):.0f} terms, 'term_node' has {terms}")
    ptr = np.zeros(columns + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    _budget(p, columns, terms, 0)

    data.update({k: _read_data(p, f, k, terms) for k in TERM_DATASETS})
    for k in TERM_DATASETS:
        d = data[k]
        if d.size and d.dtype.kind == "u" and d.dtype.itemsize == 8 and int(d.max()) > 2**62:
            raise _bad(p, f"dataset '{k}' holds {int(d.max())}, beyond 2^62")
        if d.size and d.dtype.kind == "i" and d.dtype.itemsize == 8 and (int(d.min()) < -(2**62) or int(d.max()) > 2**62):
            raise _bad(p, f"dataset '{k}' holds values beyond +-2^62")
    node = data["term_node"].astype(np.int64)
    if enc == "delta-within-column":
        node = _node_from_deltas(node, ptr)
    fs = FeatureSet(
        skeleton=skel, scheme=scheme, seed=seed, draws=draws, count=count, kind=kind.astype(np.uint8),
        ptr=ptr, node=node, code=data["term_code"].astype(np.int64), power=data["term_power"].astype(np.int64),
        omega=np.zeros(0), stats=stats, command=command, tool_version=tool_version,
    )
    try:
        walk = fs.walk_skeleton
    except RfsgenError as e:
        raise _bad(p, f"its scheme does not apply to the embedded skeleton: {e}") from None
    omega_need = _check_terms(p, fs, walk)
    if sizes["omega"] > omega_need:
        raise _bad(p, f"dataset 'omega' declares {sizes['omega']} values; its terms use at most {omega_need}")
    _budget(p, columns, terms, sizes["omega"])
    # read once: a table of float64 values is used as read (no second copy of the largest array)
    omega = _read_data(p, f, "omega", sizes["omega"]).astype(np.float64, copy=False)
    _check_omega(p, fs, walk, omega)
    fs.omega = omega
    owner.read(p, f, fs, attrs)  # the kind's own attribute and datasets (EOF: its grid)
    if weighted:
        w = _read_data(p, f, "column_weight", columns)
        problem = weight_problem(w, columns, not owner.weights_add_up)
        if problem:
            raise _bad(p, f"dataset 'column_weight': {problem}")
        fs.column_weight = w
    return fs


def _budget(p, columns, terms, omegas):
    from . import budget

    budget.check(BYTES_PER_COLUMN * columns + BYTES_PER_TERM * terms + BYTES_PER_OMEGA * omegas,
                 f"feature file '{p}': loading its {columns} columns, {terms} terms and {omegas} omegas",
                 "use a feature file with fewer columns")


def _stats(p, text):
    """The 'stats' attribute: a JSON object; the statistics commands show, where present,
    of the right types (the sampler writes all three; a FeatureSet made in code may have none)."""
    try:
        stats = json.loads(text)
    except (ValueError, RecursionError):
        raise _bad(p, "the 'stats' attribute is not JSON") from None
    if not isinstance(stats, dict):
        raise _bad(p, "the 'stats' attribute is not a JSON object")
    for key in ("mean_factors_per_draw", "var_factors_per_draw"):
        v = stats.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise _bad(p, f"the 'stats' attribute's '{key}' is {v!r}; expected a finite number")
    if "mean_factors_per_draw" in stats and stats["mean_factors_per_draw"] < 0:
        raise _bad(p, f"the 'stats' attribute's 'mean_factors_per_draw' is {stats['mean_factors_per_draw']!r} < 0")
    hist = stats.get("output_degree_histogram")
    if hist is not None and (not isinstance(hist, list) or len(hist) > MAX_HISTOGRAM or any(
            isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= MAX_DRAWS for c in hist)):
        shown = f"a list of {len(hist)} values" if isinstance(hist, list) else repr(hist)[:40]
        raise _bad(p, f"the 'stats' attribute's 'output_degree_histogram' is {shown}; expected at most "
                      f"{MAX_HISTOGRAM} counts in 0..2^62")
    return stats


def _unit_modulus(base) -> bool:
    """Whether the factors of ``base`` have modulus exactly 1 in exact arithmetic while their
    powers may be large (see :data:`MAX_UNIT_POWER`)."""
    return base.name in ("circle", "categorical") or (
        base.name == "sphere" and base.param("scheme") == "pair" and base.width <= 2)


def _check_terms(p, fs: FeatureSet, skel) -> int:
    """Range-check node ids, codes and powers (see :func:`_code_ranges`, :data:`MAX_UNIT_POWER`);
    return the number of omega values the continuous terms may use."""
    def bad(what):
        return _bad(p, what)

    if not fs.node.size:
        return 0
    n_nodes = len(skel.nodes)
    if fs.node.min() < 0 or fs.node.max() >= n_nodes:
        t = int(np.flatnonzero((fs.node < 0) | (fs.node >= n_nodes))[0])
        raise bad(f"dataset 'term_node': term {t} refers to node {int(fs.node[t])}, a node the skeleton does not "
                  f"have (0..{n_nodes - 1})")
    is_input = np.array([isinstance(n, InputNode) for n in skel.nodes])
    if not is_input[fs.node].all():
        t = int(np.flatnonzero(~is_input[fs.node])[0])
        raise bad(f"dataset 'term_node': term {t} refers to an internal node ({skel.nodes[int(fs.node[t])].label})")
    group_of = np.full(n_nodes, -1)
    for g, (_, ids, _) in enumerate(skel.input_groups):
        group_of[ids] = g
    tg = group_of[fs.node]
    unit = np.zeros(fs.node.size, dtype=bool)
    omega_need = 0
    for g, (base, _, _) in enumerate(skel.input_groups):
        sel = tg == g
        if not sel.any():
            continue
        code, power = fs.code[sel], fs.power[sel]
        lo, hi, plo, phi = _code_ranges(base)
        if base.continuous:
            omega_need += int(sel.sum()) * base.width
            if code.min() < 0:
                raise bad(f"dataset 'term_code': a {base.name} term has omega offset {int(code.min())} < 0")
        elif code.min() < lo or code.max() > hi:
            bad_code = int(code[(code < lo) | (code > hi)][0])
            raise bad(f"dataset 'term_code': a {base.name} term has code outside {lo}..{hi}: {bad_code}")
        if power.min() < plo or power.max() > phi or (plo < 0 and not power.all()):
            bad_power = int(power[(power < plo) | (power > phi) | ((power == 0) & (plo < 0))][0])
            raise bad(f"dataset 'term_power': a {base.name} term has power outside {plo}..{phi}"
                      + (" or zero" if plo < 0 else "") + f": {bad_power}")
        if _unit_modulus(base):
            unit |= sel
    if unit.any():
        col = np.repeat(np.arange(fs.columns), np.diff(fs.ptr))
        total = np.bincount(col[unit], np.abs(fs.power[unit]).astype(np.float64), fs.columns)
        if total.max() > MAX_UNIT_POWER:
            j = int(np.argmax(total))
            raise bad(f"dataset 'term_power': column {j}'s powers of unit-modulus factors add up to {total[j]:.0f}, "
                      f"over 2^50 (beyond it the transform's values drift away from modulus 1, to 1e156 and inf)")
    return omega_need


def _check_omega(p, fs: FeatureSet, skel, omega: np.ndarray) -> None:
    """The omega table: finite, |omega| <= :data:`MAX_OMEGA`, each continuous term's
    ``width`` values inside it."""
    for a in range(0, omega.size, OMEGA_CHECK_SLICE):  # slices: temporaries of 1 MB, not of the table's size
        big = ~(np.abs(omega[a:a + OMEGA_CHECK_SLICE]) <= MAX_OMEGA)  # NaN too
        if big.any():
            i = a + int(np.flatnonzero(big)[0])
            raise _bad(p, f"dataset 'omega': value {i} is {float(omega[i])!r}; omegas must be finite with |omega| <= 2^160")
    if not fs.node.size:
        return
    cont = [(base, ids) for base, ids, _ in skel.input_groups if base.continuous]
    if not cont:
        return
    width = np.zeros(len(skel.nodes), dtype=np.int64)
    for base, ids in cont:
        width[ids] = base.width
    tw = width[fs.node]
    sel = tw > 0
    if (fs.code[sel] + tw[sel]).max(initial=0) > omega.size:
        t = int(np.flatnonzero(sel & (fs.code + tw > omega.size))[0])
        raise _bad(p, f"dataset 'term_code': {skel.nodes[int(fs.node[t])].base.name} term {t} points at omega "
                      f"{int(fs.code[t])}..{int(fs.code[t] + tw[t]) - 1}, outside the omega table of {omega.size}")


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
    bytes_per_column, file_bytes, kinds, tool_version, command, column_weights ("counts":
    count / draws; "float": the file's /column_weight).
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
        "column_weights": "counts" if fs.column_weight is None else "float",
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
        **({"params": dict(fs.skeleton.params)} if fs.skeleton.params else {}),  # the skeleton's parameter values
        **kind_of(fs).summary(fs),  # the kind's own (EOF: its grid, and no terms to count)
    }
