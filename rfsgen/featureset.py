"""The feature set and what every column kind shares (below the kinds, :mod:`rfsgen.kinds`).

A feature file holds columns of one *kind*: compositional paths (:mod:`rfsgen.paths`: the
``rfs``, ``strat``, ``exact``, ``rr`` and ``orf`` schemes and subsets of them) or EOF grid
cells (:mod:`rfsgen.eof`).  Each kind implements :class:`ColumnKind`; the generic modules
(:mod:`rfsgen.features`, :mod:`rfsgen.output`, :mod:`rfsgen.transform`, :mod:`rfsgen.kernel`, ...)
find a set's kind in the registry :mod:`rfsgen.kinds` and talk only to this interface.

Here: :class:`FeatureSet` (the columns, see :mod:`rfsgen.features` for the fields and the
file), :class:`ColumnKind`, and the helpers both kinds use to read and write their datasets
(:func:`_check_dataset`, :func:`_read_data`, :func:`_bad`, :func:`_narrow`, :data:`CHUNK`,
:data:`GZIP_LEVEL`) and to run their transformers (:func:`buffered_chunks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .errors import FeatureFileError
from .schemes import SCHEMES, WALK_AS_WRITTEN
from .skeleton import Skeleton

FORMAT = "rfsgen-features"
#: 2: a checksummed rfsgen header in the user block, root attributes sealed; 4: the skeleton an
#: HDF5 string, not uint8 bytes (1 and 2 still read); the version compositional-path files are
#: written with (rfsgen.paths; each kind has its own: EOF files 5 and 3, rfsgen.eof.FORMAT_VERSION).
FORMAT_VERSION = 4
#: Versions whose /skeleton is an HDF5 string (the others: a uint8 array of its UTF-8 bytes).
STRING_SKELETON_VERSIONS = (4, 5)


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
    #: The column kind's own data (rfsgen.eof.Columns for scheme 'eof': level and index vectors),
    #: None for compositional paths; only the kind (rfsgen.kinds) reads it.
    extra: object = None
    #: Optional float64 (D,): each column's weight, replacing count / draws (float column
    #: weights: finite, >= 0, summing to at most MAX_WEIGHT_SUM; None for sampled files).
    column_weight: np.ndarray | None = None

    @property
    def columns(self) -> int:
        return int(self.count.size)

    @property
    def eof(self):
        """The EOF columns (:class:`rfsgen.eof.Columns`) of an EOF feature set, else None: kept
        for users; rfsgen's generic code asks the set's column kind (:mod:`rfsgen.kinds`) instead."""
        return self.extra if getattr(self.extra, "attribute", None) == "eof" else None

    @eof.setter
    def eof(self, value) -> None:
        self.extra = value

    def __repr__(self) -> str:
        """One line with the essentials: columns D, scheme, seed, draws, the skeleton."""
        return (f"FeatureSet(D={self.columns}, scheme={self.scheme!r}, seed={self.seed}, draws={self.draws}, "
                f"skeleton=Skeleton({self.skeleton._summary(short=True)}))")

    @property
    def weight(self) -> np.ndarray:
        """float64 (D,): ``column_weight`` when set, else count / draws (which sums to 1)."""
        if self.column_weight is not None:
            return np.asarray(self.column_weight, dtype=np.float64)
        return self.count / float(self.draws)

    @property
    def scale(self) -> np.ndarray:
        """float64 (D,): the factor each column's cos/product is multiplied by."""
        return np.sqrt(self.weight) * np.where(self.kind == 0, 1.0, math.sqrt(2.0))

    @cached_property
    def walk_skeleton(self) -> Skeleton:
        """The skeleton whose input nodes the terms refer to (rewritten by baseline schemes)."""
        if self.scheme in WALK_AS_WRITTEN or self.scheme not in SCHEMES:  # (a kind without terms: as written)
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


class ColumnKind:
    """One kind of feature-file columns (compositional paths, EOF grid cells, ...).

    A kind is registered in :data:`rfsgen.kinds.KINDS` under the ``scheme`` attribute values
    its files record; the generic modules reach it with :func:`rfsgen.kinds.of` and never ask
    which kind they hold.  Instances are module-level singletons (they pickle by reference).
    Sampling asks the kind of a *scheme* (:func:`rfsgen.kinds.for_scheme`): its columns are the
    compositional walk's (:attr:`walked`) or its own (:meth:`fit`, :meth:`sample`,
    :meth:`sample_file`); ``rfsgen approx`` asks it for its kernel, :meth:`unscale` and its own
    record keys (docs/architecture.md lists the members).
    """

    #: The kind's name (``inspect``, messages).
    name: str = ""
    #: The ``scheme`` attribute values of its files (the registry's keys).
    schemes: tuple = ()
    #: The format version it writes, and the versions it reads.
    format_version: int = 0
    versions: tuple = ()
    #: The root attribute that holds its own JSON (sealed with the others), or None.
    attribute: str | None = None
    #: Whether float column weights add up (to at most 2^20; each column's share of the
    #: kernel), or each weight multiplies its column's own feature (each at most 2^20).
    weights_add_up: bool = True
    #: Whether its transformers clip rows to a box, and count the values clipped (``clipped``,
    #: ``clipped_in``), instead of refusing rows outside a domain (scikit-learn's ``fit`` then
    #: skips its domain check).
    counts_clipped: bool = False

    # ---- sampling (rfsgen.sampler.sample_scheme: rfsgen sample, select's pool, scikit-learn, approx)
    #: Its schemes in the order ``--scheme`` lists them (None: :attr:`schemes`).
    listed: tuple | None = None
    #: Whether its columns are the compositional walk's (:func:`rfsgen.sampler.sample` over the
    #: skeleton its scheme rewrites; the sampler sits above the kinds), or its own :meth:`sample`'s.
    walked: bool = True
    #: The sampling options its schemes take beside ``-n`` (keywords of
    #: :func:`rfsgen.sampler.sample_file`, ``rfsgen sample``'s ``--level``, ...).
    options: tuple = ()
    #: Whether ``rfsgen sample`` needs ``-n D`` (EOF: or ``--level N``, its own message).
    needs_columns: bool = True

    # ---- the feature file
    def attrs(self, fs: FeatureSet) -> dict:
        """Its root attributes to write (name: text), beside the common ones."""
        return {}

    def write(self, f, fs: FeatureSet) -> None:
        """Write its datasets into the open file ``f``, after the common ones."""

    def read(self, p: str, f, fs: FeatureSet, attrs: dict) -> None:
        """Validate and read its part of the open (untrusted) file ``f`` at ``p`` into ``fs``
        (``fs.extra``); ``attrs``: the root attributes, checked against their seal."""

    # ---- describing itself
    def summary(self, fs: FeatureSet) -> dict:
        """Entries of :func:`rfsgen.features.describe` (``inspect``) it adds or replaces."""
        return {}

    def inspect_rows(self, info: dict) -> list:
        """``(label, text)`` lines of ``rfsgen inspect`` for the description ``info``."""
        return []

    def expected_density(self, fs: FeatureSet) -> tuple:
        """``(density, nonzero_columns)`` expected of its output (:func:`rfsgen.output.expected_density`)."""
        raise NotImplementedError

    def density_text(self, dens: dict) -> str:
        """What ``rfsgen inspect`` says of :func:`rfsgen.output.expected_density`'s ``dens``."""
        return f"{dens['density']:.3f} expected"

    # ---- computing
    def transformer(self, fs: FeatureSet, dtype=np.float32, device="cpu"):
        """Its transformer of ``fs`` (``columns``, ``dtype``, ``row_bytes``, ``what``, ``chunk``,
        ``chunks``; with :attr:`counts_clipped`, ``clipped`` and ``clipped_in``).  ``device``
        (``cpu`` or ``cuda``, resolved): where it may compute what it can on a GPU with the
        CPU's bits (a kind without GPU code computes on the CPU)."""
        raise NotImplementedError

    def kernel(self, skel, x, y=None, *, options=None, x_source="<array>", y_source="<array>", copies=0,
               progress=None) -> np.ndarray:
        """The kernel its features estimate between rows ``x`` and ``y`` of ``skel`` (float64);
        ``options``: the kind's own (EOF: ``domain_from``, ``margin``; or :meth:`fit`'s)."""
        raise NotImplementedError

    # ---- sampling (kinds that are not :attr:`walked`)
    def fit(self, skel, rows=None) -> dict:
        """Its sampling options fitted to training rows, for :meth:`sample` and :meth:`kernel`
        (EOF: the box of the rows unless the node states a domain); ``rows``: a function
        returning them, called only by kinds that fit (None: no rows)."""
        return {}

    def sample(self, skel, columns, seed, *, scheme, **options) -> FeatureSet:
        """``columns`` columns of ``scheme`` for ``skel`` with ``seed``; ``options``: :meth:`fit`'s."""
        raise NotImplementedError

    def sample_file(self, skel, columns, seed, *, scheme, **options) -> tuple:
        """``rfsgen sample``'s columns with :attr:`options` (checked here): ``(fs, size, more,
        inputs)``, the feature set, the command's ``-n D`` (or ``--level N``), its options after
        ``--width`` (each with a leading space), and the files read besides the skeleton."""
        raise NotImplementedError

    # ---- rfsgen approx (its kernel is :meth:`kernel` with :meth:`fit`'s options)
    #: The keys its approx records add (means over trials; their ``_std`` unless in :attr:`approx_counts`).
    approx_keys: tuple = ()
    approx_counts: tuple = ()

    def unscale(self, fs: FeatureSet) -> float:
        """The factor that takes its transformed features of ``fs`` to the kernel's scale (EOF:
        2^-e of a recorded scale exponent e)."""
        return 1.0

    def approx_extra(self, skel, fs: FeatureSet, options: dict, cache: dict, errors) -> dict:
        """Its :attr:`approx_keys` of the record of the map ``fs``; ``errors(fs2)``: approx's
        measures of another set ``fs2`` against the kernel, ``cache``: its own, per run."""
        return {}

    def approx_lines(self, records: list) -> list:
        """Its lines after approx's table, for its schemes' ``records``."""
        return []

    # ---- subsets and weights (rfsgen.select)
    def unit_weight(self, fs: FeatureSet):
        """The ``column_weight`` that gives every column of ``fs`` weight 1 (None: as it is)."""
        return np.ones(fs.columns)

    def subset(self, fs: FeatureSet, keep: np.ndarray):
        """Its data (``fs.extra``) for the columns ``keep`` of ``fs``."""
        return fs.extra

    def digest(self, fs: FeatureSet, h) -> None:
        """Feed its data of ``fs`` to the hash ``h`` (a pool's identity)."""


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


def _plain(v):
    """An attribute value as a plain Python value (str, int, float, list) for hashing and messages."""
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v.item() if hasattr(v, "item") else v


#: Dataset filters a feature file may use: anything else (szip, lzf, scale-offset, n-bit,
#: a user-defined plugin) is refused before HDF5 would run it.
ALLOWED_FILTERS = {1: "gzip", 2: "shuffle", 3: "fletcher32"}


def _bad(p, what) -> FeatureFileError:
    return FeatureFileError(f"{p}: invalid feature file ({what}); re-create it with 'rfsgen sample'")


def _check_dataset(p, f, name, matrix=False, text=False):
    """The dataset ``name`` of ``f``, checked without reading its data: a hard link to a
    1-D integer (omega: float) dataset, stored in this file (no external storage, no
    virtual layout), with no filter but gzip/shuffle/fletcher32 and chunks no larger than
    the data (HDF5 decompresses whole chunks).  Returns its declared length; with
    ``matrix``, a 2-D unsigned dataset (EOF's vectors), and its declared shape; with
    ``text``, one fixed-length string (the skeleton of format 4), and its length in bytes."""
    import h5py
    from h5py import h5d, h5t

    link = f.get(name, getlink=True)
    if link is None:
        raise FeatureFileError(f"{p}: incomplete feature file (missing dataset '{name}'); re-create it with "
                               "'rfsgen sample'")
    if not isinstance(link, h5py.HardLink):
        what = "an external link" if isinstance(link, h5py.ExternalLink) else "a soft link"
        raise _bad(p, f"'{name}' is a link ({what}), not a dataset")
    ds = f[name]
    if not isinstance(ds, h5py.Dataset):
        raise _bad(p, f"'{name}' is not a dataset")
    float_ = name in ("omega", "column_weight")
    dcpl = ds.id.get_create_plist()
    layout = dcpl.get_layout()
    if layout == h5d.VIRTUAL:
        raise _bad(p, f"dataset '{name}' is a virtual dataset (its data would come from other files)")
    if dcpl.get_external_count():
        raise _bad(p, f"dataset '{name}' has external storage (its data would be read from "
                      f"{_plain(dcpl.get_external(0)[0])!r}, outside the file)")
    for i in range(dcpl.get_nfilters()):
        code = dcpl.get_filter(i)[0]
        if code not in ALLOWED_FILTERS:
            raise _bad(p, f"dataset '{name}' uses HDF5 filter {code}; only gzip, shuffle and fletcher32 are allowed")
    cls = ds.id.get_type().get_class()
    shape = ds.id.shape
    want = h5t.FLOAT if float_ else h5t.INTEGER
    if text:
        if shape != (1,) or cls != h5t.STRING or ds.id.get_type().is_variable_str() or ds.dtype.kind != "S":
            raise _bad(p, f"dataset '{name}' has shape {shape} and dtype {ds.dtype}; expected one fixed-length string")
        return int(ds.dtype.itemsize)
    if matrix:
        if len(shape) != 2 or cls != h5t.INTEGER or ds.dtype.itemsize > 8 or ds.dtype.kind != "u":
            raise _bad(p, f"dataset '{name}' has shape {shape} and dtype {ds.dtype}; expected a 2-D unsigned array")
    elif len(shape) != 1 or cls != want or ds.dtype.itemsize > 8 or ds.dtype.kind not in ("f" if float_ else "iu"):
        raise _bad(p, f"dataset '{name}' has shape {shape} and dtype {ds.dtype}; expected a 1-D "
                      + ("float" if float_ else "integer") + " array")
    if layout == h5d.CHUNKED and math.prod(dcpl.get_chunk()) > max(math.prod(shape), CHUNK):
        raise _bad(p, f"dataset '{name}' has chunks of {math.prod(dcpl.get_chunk())} values for "
                      f"{math.prod(shape)} values")
    return tuple(int(n) for n in shape) if matrix else int(shape[0])


def _read_data(p, f, name, n):
    """Dataset ``name`` (declared length ``n``, already checked) as an array."""
    try:
        data = f[name][()]
    except OSError:
        raise FeatureFileError(f"{p}: checksum mismatch while reading '{name}': the file is corrupted; "
                               "re-create it with 'rfsgen sample'") from None
    if data.shape != (n if isinstance(n, tuple) else (n,)):
        raise _bad(p, f"dataset '{name}' read {data.shape} values for a declared {n}")
    return data


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
    try:  # h5py hands invalid UTF-8 over as lone surrogates, which no output can print
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(p, f"attribute '{key}' is not UTF-8 text") from None
    return str(v)


def buffered_chunks(tr, src, chunk_rows: int, start: int = 0, stop: int | None = None, buffers: int = 1):
    """``tr.chunk`` over the chunks of ``src`` into ``buffers`` reused arrays (the
    ``chunks`` of every kind's transformer); CSR rows stay CSR where ``tr`` reads them
    (:func:`rfsgen.inputs.chunks_for`)."""
    bufs = [None] * buffers
    from .inputs import chunks_for

    for i, (row0, block) in enumerate(chunks_for(src, tr, chunk_rows, start, stop)):
        m = block.shape[0]
        k = i % buffers
        if bufs[k] is None or bufs[k].shape[0] < m:
            bufs[k] = np.empty((m, tr.columns), dtype=tr.dtype)
        yield row0, tr.chunk(block, row0, src.name, out=bufs[k][:m])
