"""Data-dependent selection of feature columns (DESIGN 9): EERF, LKRF and a normalised score.

From a *pool* of N0 columns (a feature file, usually sampled with ``pool_factor * D``
columns), keep the D whose per-draw feature z_m aligns best with the labels on training
rows, and write them as an ordinary feature file.  z_m is the column's value at weight 1
(``sqrt(2) R cos(theta + b)`` for cos/sin columns, the product itself for real ones), so
that a column that stands for several identical draws scores as one draw.

Scores (Y: the centred one-hot class matrix (n, C) for classification, the centred
label (n, 1) for regression; means over the n training rows):

* ``eerf`` (Shahrampour et al. 2018): v_m = sum_c (mean_i Y_ic z_m(x_i))^2; keep the top D.
  Kept columns keep their draw counts: weight count_m / (sum of the kept counts), so a
  kept column that stood for k draws still counts k times.
* ``lkrf`` (Sinha and Duchi 2016): weights q on the pool maximising sum_m q_m v_m subject
  to q in the simplex and the chi-square divergence D(q || p) = sum_m q_m^2 / p_m - 1 <= rho,
  where p_m = count_m / draws is the pool's own weight (uniform over the N0 draws).  The
  optimum is q_m = p_m (v_m - nu)_+ / sum_k p_k (v_k - nu)_+ for the multiplier nu at which
  the divergence equals rho (found by bisection; closed form while every q_m > 0); keep
  the top D by q, each with the float column weight q_m / (sum of the kept q).  Default
  rho: N0 / D - 1, the divergence of the uniform distribution over D of the N0 columns.
* ``corr`` (rfsgen's own, for standardised features): the fraction of z_m's variance that
  the labels explain, v_m = sum_c p_c (mu_cm - mu_m)^2 / var_m (the correlation ratio eta^2
  of z_m with the classes: between-class over total variance; for regression the squared
  correlation of z_m with y).  A linear model on standardised features sees neither a
  column's mean nor its scale; EERF's score grows with both (for balanced classes it is
  the between-class variance, proportional to the column's mean square, whatever its
  alignment).  Kept columns keep their draw counts, as for eerf.
* ``eerf-norm``: EERF's score divided by the column's mean square, mean_i z_m(x_i)^2.
* ``greedy`` (rfsgen's own, for standardised features; accounts for redundancy between
  columns): forward selection (orthogonal least squares with the multi-output target Y)
  by pivoted Cholesky on the pool's Gram matrix of standardised columns, G = Zs^T Zs.
  At each step the column m with the largest ||Y^T z_m'||^2 / (||z_m'||^2 + g n) is
  kept, z_m' being its part orthogonal to the columns kept so far: the label residual's
  correlation with what the column adds.  g = :data:`GREEDY_RIDGE` damps columns nearly
  in the span already.  Needs G: N0^2 numbers, streamed (per block, Z_b^T Z_b).
  Kept columns keep their draw counts, as for eerf.

Rows are streamed: per block of :data:`BLOCK` rows the pool's columns are computed and
folded into sufficient statistics of (C + 2) x N0 numbers (per class the sum of z_m, the
sum of z_m and of z_m^2 over all rows), so memory is bounded by the pool's column count,
never by the rows.  Blocks are aligned to row numbers, so the statistics, the scores and
the selected file are the same bits whatever ``chunk_rows`` is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from pathlib import Path

import numpy as np

from .errors import DataError, FeatureFileError, InputError, UsageError, count
from .features import FeatureSet
from .kinds import of as kind_of

METHODS = ("eerf", "lkrf", "corr", "eerf-norm", "greedy")
TASKS = ("auto", "classification", "regression")
#: Rows per block of the sufficient statistics (the unit of their fixed summation order).
BLOCK = 256
#: Default pool size: this many times D columns (the papers' N0 = 10 D).
POOL_FACTOR = 10
#: ``greedy``'s damping g: a column's score is ||Y^T z'||^2 / (||z'||^2 + g n).
GREEDY_RIDGE = 0.1


@dataclasses.dataclass
class Stats:
    """Sufficient statistics of a pool on labelled rows.

    ``rows``: n; ``by_class``: float64 (C, N0), per class the sum of z_m over its rows
    (regression: C = 1, the sum of y_i z_m); ``total``: float64 (N0,), sum of z_m;
    ``squares``: float64 (N0,), sum of z_m^2; ``class_rows``: int64 (C,) rows per class
    (regression: the sum of y and of y^2 in ``y_sum``, ``y_squares``)."""

    rows: int
    by_class: np.ndarray
    total: np.ndarray
    squares: np.ndarray
    class_rows: np.ndarray | None = None
    y_sum: float = 0.0
    y_squares: float = 0.0
    gram: np.ndarray | None = None  # float64 (N0, N0), sum of z_m z_m' (method greedy only)


# ----------------------------------------------------------------------------- labels
def read_labels(spec, *, where: str = "labels") -> np.ndarray:
    """Labels from an array-like (1-D, or (n, 1)), or a path: ``.npy``, ``.csv``/``.tsv``/
    ``.txt`` (one label per line; a first line that is not a number above numeric labels is
    a header), ``.h5``/``.hdf5``[``:/dataset``] (a 1-D dataset; without a key, the only one).
    Returns a 1-D array (numbers, or str for class names; integers past 64 bits as
    Python ints in an object array, compared exactly)."""
    if isinstance(spec, (str, os.PathLike)):
        return _read_label_file(os.fspath(spec))
    a = np.asarray(spec)
    return _one_d(a, where)


def _one_d(a: np.ndarray, where: str) -> np.ndarray:
    if a.ndim == 2 and a.shape[1] == 1:
        a = a[:, 0]
    if a.ndim != 1:
        raise InputError(f"{where}: labels have shape {a.shape}; give one label per row (a 1-D array)")
    if a.dtype.kind == "O":
        a = a.astype(str)
    if a.dtype.kind == "S":
        a = np.char.decode(a, "utf-8", "replace")
    if a.dtype.kind not in "biufU":
        raise InputError(f"{where}: labels of dtype {a.dtype}; give numbers or class names")
    return a


def _read_label_file(spec: str) -> np.ndarray:
    path, key = spec, None
    low = spec.lower()
    for ext in (".h5", ".hdf5"):
        i = low.find(ext + ":")
        if i >= 0:
            path, key = spec[:i + len(ext)], spec[i + len(ext) + 1:]
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{path}: no such labels file; give a .npy, .csv or .h5 file with one label per row")
    suffix = p.suffix.lower()
    try:
        if suffix == ".npy":
            return _read_npy_labels(p)
        if suffix in (".h5", ".hdf5"):
            return _read_h5_labels(p, key)
        if suffix in (".csv", ".tsv", ".txt"):
            return _read_text_labels(p)
    except (InputError, DataError):
        raise
    except (OSError, ValueError, UnicodeDecodeError, RuntimeError, KeyError) as e:
        raise InputError(f"{path}: cannot read labels ({type(e).__name__}: {str(e)[:80]}); give a .npy, .csv or .h5 "
                         "file with one label per row") from None
    raise InputError(f"{path}: labels must be a .npy, .csv/.tsv/.txt or .h5 file, not '{suffix or p.name}'")


#: Bytes a labels file's line may take in memory beyond its text: its str object, a
#: list slot, and a parsed number (counted before the file is read).
LINE_BYTES = 160
_INTEGER = re.compile(r"^[+-]?[0-9]+$")


def _labels_size(labels: np.ndarray) -> float:
    """Bytes ``labels`` and what selection derives from them (decoded names, the class
    codes and np.unique's sort) take: counted before they are read."""
    itemsize = labels.dtype.itemsize * (4 if labels.dtype.kind == "S" else 1)  # bytes decode to str (UCS-4)
    return float(labels.size) * (2 * itemsize + 3 * 8)


def _read_npy_labels(p: Path) -> np.ndarray:
    """Labels from a ``.npy``: its declared shape checked against the file's size, then
    the labels' memory against the budget, before any is read (a 900-byte file may
    declare 10^11 labels)."""
    from . import budget
    from .inputs import _check_npy_file

    _check_npy_file(p)
    arr = np.load(p, mmap_mode="r", allow_pickle=False)
    budget.check(_labels_size(arr), f"labels file '{p}' ({arr.size} labels of dtype {arr.dtype})",
                 "give fewer labels")
    return _one_d(np.array(arr), str(p))


def _read_text_labels(p: Path) -> np.ndarray:
    from . import budget

    size = p.stat().st_size
    with open(p, "rb") as fh:  # lines counted in pieces: memory bounded before the budget says more
        n_lines = 1 + sum(piece.count(b"\n") for piece in iter(lambda: fh.read(1 << 20), b""))
    budget.check(3.0 * size + LINE_BYTES * n_lines, f"labels file '{p}' ({budget.fmt(size)}, {n_lines} lines)",
                 "give fewer labels")
    # utf-8-sig: a byte-order mark (as some editors write) is not part of the first label
    lines = [ln.strip() for ln in p.read_bytes().decode("utf-8-sig").splitlines()]
    lines = [ln for ln in lines if ln]
    if any("," in ln or "\t" in ln for ln in lines):
        raise InputError(f"{p}: a labels file has one label per line, without separators; for labels in a column of "
                         "the rows file use --label-column")

    def number(s):
        if _INTEGER.match(s):
            return int(s)  # exactly: 2^53 + 1 is not 2^53
        try:
            return float(s)
        except ValueError:
            return None

    values = [number(s) for s in lines]
    if len(lines) > 1 and values[0] is None and all(v is not None for v in values[1:]):
        lines, values = lines[1:], values[1:]  # a header above numbers
    if all(v is not None for v in values):
        if all(type(v) is int for v in values):
            if all(-2**63 <= v < 2**63 for v in values):
                return np.array(values, dtype=np.int64)
            return np.array(values, dtype=object)  # past 64 bits: Python's integers, still exact (2^64 + 1 is not 2^64)
        a = np.array(values, dtype=np.float64)
        if np.all(np.isfinite(a)) and np.all(a == np.round(a)) and np.all(np.abs(a) < 2**53):
            return a.astype(np.int64)
        return a
    # numpy's str array holds every name at the longest one's width (4 bytes a character)
    longest = max(len(ln) for ln in lines)
    budget.check(float(len(lines)) * (2 * 4 * longest + 24), f"labels file '{p}' ({len(lines)} class names of up to "
                 f"{longest} characters)", "use shorter class names")
    return np.array(lines, dtype=str)


def _read_h5_labels(p: Path, key) -> np.ndarray:
    import h5py

    with h5py.File(p, "r") as f:
        if not key:
            found = []
            f.visititems(lambda name, obj: found.append(name) if isinstance(obj, h5py.Dataset) and obj.ndim == 1
                         else None)
            if len(found) != 1:
                raise InputError(f"{p}: {count(len(found), '1-D dataset')}; name the labels' dataset, "
                                 f"e.g. {p}:/{found[0] if found else 'y'}")
            key = found[0]
        from .inputs import _check_dataset, _h5_get

        ds = _h5_get(f, key, p)  # soft links followed one at a time: a loop is an error
        if not isinstance(ds, h5py.Dataset):
            raise InputError(f"{p}: no dataset '{key}'; name the labels' dataset as {p}:/PATH")
        _check_dataset(ds, p, key, "the labels' dataset")
        from . import budget

        if ds.dtype.kind == "O":  # variable-length: the dtype's size is a pointer's, not the labels'
            return _read_h5_vlen_labels(ds, p, key)
        itemsize = ds.dtype.itemsize * (4 if ds.dtype.kind == "S" else 1)  # bytes decode to str (UCS-4)
        budget.check(float(ds.size) * (2 * max(itemsize, 8) + 24), f"labels dataset '{key}' of '{p}'",
                     "give fewer labels")
        try:
            data = ds[()]
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as e:
            raise InputError(f"{p}:{key}: cannot read the labels ({' '.join(str(e).split())[:120]}); the file is "
                             "damaged") from None
        return _one_d(data, f"{p}:{key}")


#: Bytes a variable-length label takes in memory beyond its characters: its HDF5
#: reference, a bytes and a str object, a list slot, and its class code.
VLEN_LABEL_BYTES = 160


def _read_h5_vlen_labels(ds, p: Path, key) -> np.ndarray:
    """Variable-length string labels, measured as they are read: a few at a time (a
    slice is at most an eighth of the budget even if every label in it were as long as
    the file, or all pointed at one such string), the labels' final memory (numpy's str
    array holds every name at the longest one's width, 4 bytes a character) checked
    after every slice, before the next is read."""
    import h5py

    from . import budget

    name = f"labels dataset '{key}' of '{p}'"
    if h5py.check_string_dtype(ds.dtype) is None:
        raise InputError(f"{p}:{key}: labels of a variable-length non-string type; give numbers or class names")
    if ds.ndim != 1 and not (ds.ndim == 2 and ds.shape[1] == 1):
        raise InputError(f"{p}:{key}: labels have shape {ds.shape}; give one label per row (a 1-D array)")
    n = int(ds.shape[0])
    fix = "give fewer labels or shorter class names"
    budget.check(float(n) * VLEN_LABEL_BYTES, f"{name} ({n} labels of variable length)", fix)
    biggest = max(p.stat().st_size, 1)  # no string inside the file is longer than the file
    step = int(min(1 << 16, max(1, budget.limit() // 8 // (biggest + VLEN_LABEL_BYTES))))
    names, chars, longest = [], 0, 0
    for a in range(0, n, step):
        try:
            got = ds[a:a + step]
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as e:
            raise InputError(f"{p}:{key}: cannot read the labels ({' '.join(str(e).split())[:120]}); the file is "
                             "damaged") from None
        for v in got.reshape(-1):
            text = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            names.append(text)
            chars += len(text)
            longest = max(longest, len(text))
        del got
        budget.check(float(n) * (VLEN_LABEL_BYTES + 2 * 4 * longest) + 4.0 * chars,
                     f"{name} ({n} class names of up to {longest} characters)", fix)
    return np.array(names, dtype=str) if names else np.array([], dtype=str)


def encode_labels(labels: np.ndarray, task: str = "auto", *, where: str = "labels"):
    """``(task, classes, codes_or_values)``: for classification the sorted class values and
    each row's class index (int64); for regression ``None`` and the float64 labels.  NaN (or
    inf) labels, fewer than two classes and constant regression labels are a
    :class:`DataError`; ``auto`` means classification unless the labels are floats that are
    not all whole numbers."""
    if task not in TASKS:
        raise UsageError(f"task must be one of {', '.join(TASKS)}, not {task!r}")
    if labels.size == 0:
        raise DataError(f"{where}: no labels; give one label per training row")
    if labels.dtype.kind == "f":
        bad = ~np.isfinite(labels)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(f"{where}: label {i} is {float(labels[i])!r}; every label must be a finite number or a class name "
                            "(drop the unlabelled rows)")
    if task == "auto":
        task = "regression" if labels.dtype.kind == "f" and not np.all(labels == np.round(labels)) else "classification"
    if task == "regression":
        if labels.dtype.kind == "U":
            raise InputError(f"{where}: class names (e.g. {labels[0]!r}) with --task regression; give numbers or use "
                             "--task classification")
        y = labels.astype(np.float64)
        if y.min() == y.max():
            raise DataError(f"{where}: every label is {float(y[0])!r}; regression needs labels that vary")
        return "regression", None, y
    classes, codes = np.unique(labels, return_inverse=True)
    if classes.size < 2:
        only = classes[0].item() if isinstance(classes[0], np.generic) else classes[0]
        raise DataError(f"{where}: every label is class {only!r}: selection needs at least two classes "
                        "(or --task regression for numeric labels)")
    return "classification", classes, codes.astype(np.int64)


# ----------------------------------------------------------------------------- statistics
def _unit(fs: FeatureSet) -> FeatureSet:
    """The pool with every column at weight 1: its transform gives z_m (the column kind's
    :meth:`~rfsgen.featureset.ColumnKind.unit_weight`; EOF: its features as they are,
    without any weights of their own)."""
    return dataclasses.replace(fs, column_weight=kind_of(fs).unit_weight(fs))


def pool_statistics(fs: FeatureSet, rows, task: str, codes: np.ndarray, n_classes: int, *, chunk_rows=None,
                    progress=None, label_column: int | None = None, gram: bool = False) -> Stats:
    """Stream ``rows`` through the pool ``fs`` once and return its :class:`Stats`.

    ``codes``: int64 class index per row (classification) or float64 labels (regression),
    one per row.  Memory: (C + 2) x N0 float64 for the statistics plus one chunk of rows
    by N0 columns; the rows themselves are never all held.  Rows are folded in blocks of
    :data:`BLOCK` aligned to row numbers, so the result does not depend on ``chunk_rows``.
    ``gram``: also the sums of z_m z_m' (``Stats.gram``, N0 x N0 float64; method greedy).
    """
    from . import budget
    from .inputs import check_width, open_input
    from .output import default_chunk_rows
    from .transform import Transformer, _bound_by

    N0 = fs.columns
    C = n_classes if task == "classification" else 1
    # the (C + 2) x N0 statistics, and the scores' temporaries (C x N0 twice, a few N0)
    budget.check(8.0 * (3 * C + 8) * N0, f"the selection's statistics ({C + 2} x {N0} columns)",
                 "select from a smaller pool or with fewer classes")
    # greedy: the Gram's sums and one block's product (N0 x N0 each); after, greedy's Cholesky
    # factor (D x N0, D <= N0) in the product's place and its temporaries (256-row slices, scores).
    # Held beside every chunk, so the chunks' checks below count it too.
    gram_bytes = 8.0 * N0 * (2 * N0 + 2 * BLOCK + 3 * C + 16) if gram else 0.0
    if gram:
        budget.check(gram_bytes, f"the greedy selection's Gram matrix of a pool of {N0} columns ({N0} x {N0}, twice)",
                     "select from a smaller pool (fewer columns: 'rfsgen sample -n', or a smaller --pool-factor) "
                     "or with another --method")
    tr = Transformer(_unit(fs), np.float64)
    n = codes.size
    if chunk_rows is not None:  # a chunk never needs more rows than there are labels (= rows)
        chunk_rows = max(1, min(int(chunk_rows), -(-n // BLOCK) * BLOCK))
    # One row of a chunk: the transform's intermediates and its float64 values, the block's
    # one-hot row (C) and the per-column products folded into the statistics (N0).
    per_row = tr.row_bytes + 8 * (C + N0)
    # A chunk is whole blocks (the summation order is fixed), so one block must fit:
    # checked before the transformer's first chunk is made.
    beside = f" beside the Gram matrix ({budget.fmt(gram_bytes)})" if gram else ""
    budget.check(float(BLOCK) * per_row + gram_bytes, f"the selection from a pool of {N0} columns: one block of "
                 f"{BLOCK} rows at {budget.fmt(per_row)} a row{beside}",
                 "select from a smaller pool (fewer columns: 'rfsgen sample -n')")
    if chunk_rows is None:
        rows_per = default_chunk_rows(N0, per_row, tr.what, None)
        if gram:  # the default chunk fits in what the Gram matrix leaves
            rows_per = min(rows_per, int((budget.limit() - gram_bytes) // per_row))
    else:
        rows_per = max(1, int(chunk_rows))
    rows_per = max(BLOCK, rows_per // BLOCK * BLOCK)  # whole blocks: the summation order is fixed
    budget.check(float(rows_per) * per_row + gram_bytes, f"the selection from a pool of {N0} columns: a chunk of "
                 f"{rows_per} rows at {budget.fmt(per_row)} a row{beside}", "use a smaller --chunk-rows")
    by_class = np.zeros((C, N0))
    total = np.zeros(N0)
    squares = np.zeros(N0)
    G = np.zeros((N0, N0)) if gram else None
    prod = np.empty((N0, N0)) if gram else None
    with open_input(rows) as src:
        width = fs.skeleton.width + (label_column is not None)
        if label_column is not None:
            check_width(src, width, fs.skeleton.path, None,
                        origin=f"the feature file's width {fs.skeleton.width} plus the label column",
                        fix=f"pass rows of {width} values (the features' {fs.skeleton.width} and the label column)")
        else:
            check_width(src, fs.skeleton.width, fs.skeleton.path, fs.skeleton.shape,
                        **_bound_by(fs, "the pool", src))
        if src.n_rows is not None and src.n_rows != n:
            raise InputError(f"labels: {count(n, 'label')} for {count(src.n_rows, 'row')} of {src.name}; give one "
                             "label per row")
        seen = 0
        for row0, block in src.chunks(rows_per):
            m = block.shape[0]
            if row0 + m > n:
                raise InputError(f"labels: {count(n, 'label')} for more rows of {src.name}; give one label per row")
            if label_column is not None:
                block = np.delete(np.asarray(block), label_column, axis=1)
            z = tr.chunk(block, row0, src.name)
            for a in range(0, m, BLOCK):
                zb = z[a:a + BLOCK]
                lab = codes[row0 + a: row0 + a + zb.shape[0]]
                if task == "classification":
                    onehot = np.zeros((zb.shape[0], C))
                    onehot[np.arange(zb.shape[0]), lab] = 1.0
                    by_class += onehot.T @ zb
                else:
                    by_class += lab[None, :] @ zb
                total += zb.sum(axis=0)
                squares += np.einsum("ij,ij->j", zb, zb)
                if G is not None:
                    np.matmul(zb.T, zb, out=prod)
                    G += prod
            seen = row0 + m
            if progress:
                progress(m)
        if seen != n:
            raise InputError(f"labels: {count(n, 'label')} for {count(seen, 'row')} of {src.name}; give one label per "
                             "row")
    del prod
    st = Stats(rows=n, by_class=by_class, total=total, squares=squares, gram=G)
    if task == "classification":
        st.class_rows = np.bincount(codes, minlength=C).astype(np.int64)
    else:
        st.y_sum, st.y_squares = float(codes.sum()), float(codes @ codes)
    return st


def scores(st: Stats, method: str) -> np.ndarray:
    """float64 (N0,): each column's score under ``method`` (module docstring) from its statistics."""
    n = float(st.rows)
    mean = st.total / n
    if st.class_rows is not None:
        p = st.class_rows / n
        # mean_i Y_ic z_m = (sum over class c of z_m - p_c sum of z_m) / n = p_c (mu_cm - mu_m)
        align = (st.by_class - p[:, None] * st.total[None, :]) / n
    else:
        ybar = st.y_sum / n
        align = ((st.by_class - ybar * st.total[None, :]) / n)
    eerf = np.einsum("cm,cm->m", align, align)
    if method in ("eerf", "lkrf"):
        return eerf
    mean_square = st.squares / n
    if method == "eerf-norm":
        return np.divide(eerf, mean_square, out=np.zeros_like(eerf), where=mean_square > 0)
    if method == "corr":
        var = np.maximum(mean_square - mean * mean, 0.0)
        if st.class_rows is not None:
            between = np.einsum("cm,cm->m", align, align / np.maximum(p, 1e-300)[:, None])  # sum_c p_c (mu_c - mu)^2
        else:
            y_var = st.y_squares / n - (st.y_sum / n) ** 2
            between = eerf / y_var  # cov(y, z)^2 / var(y)
        # A column whose variance is rounding noise (a constant feature) explains nothing.
        ok = var > 1e-12 * np.maximum(mean_square, 1e-300)
        return np.divide(np.minimum(between, var), var, out=np.zeros_like(var), where=ok)
    raise UsageError(f"method must be one of {', '.join(METHODS)}, not {method!r}")


# ----------------------------------------------------------------------------- greedy
def greedy_order(st: Stats, k: int, ridge: float = GREEDY_RIDGE) -> np.ndarray:
    """int64 (k,): the pool's columns in the order forward selection keeps them (module
    docstring, ``greedy``), from statistics with ``st.gram`` (overwritten: it becomes the
    Gram matrix of the standardised columns, G = Zs^T Zs).

    Pivoted Cholesky on G: with L the factor's columns so far, d_m = ||z_m'||^2 and
    B = Zs'^T Y (N0 x C, the residual columns' correlations with the labels), keeping p
    adds l = (G[:, p] - L^T L[:, p]) / sqrt(d_p) to L, d -= l^2 and B -= l (B_p / sqrt(d_p)).
    Ties go to the lower column number.  A column of no variance, or one already in the
    span (d_m <= 1e-9 n), is never picked by the greedy step; if fewer than k columns
    are left that way, the rest are the others by ``corr``'s score."""
    G = st.gram
    if G is None:
        raise UsageError("greedy selection needs the pool's Gram matrix (pool_statistics(..., gram=True))")
    n = float(st.rows)
    N0 = G.shape[0]
    mean = st.total / n
    mean_square = st.squares / n
    var = np.maximum(mean_square - mean * mean, 0.0)
    live = var > 1e-12 * np.maximum(mean_square, 1e-300)
    inv = np.zeros(N0)
    inv[live] = 1.0 / np.sqrt(var[live])
    for a in range(0, N0, BLOCK):  # in place, a slice at a time: sum z z^T - n mu mu^T, scaled by 1 / (sd sd^T)
        b = min(N0, a + BLOCK)
        G[a:b] -= (n * mean[a:b])[:, None] * mean[None, :]
        G[a:b] *= inv[a:b, None] * inv[None, :]
    if st.class_rows is not None:
        p = st.class_rows / n
        B = ((st.by_class - p[:, None] * st.total[None, :]) * inv[None, :]).T.copy()
    else:
        B = ((st.by_class - (st.y_sum / n) * st.total[None, :]) * inv[None, :]).T.copy()
    d = np.diagonal(G).copy()
    L = np.zeros((k, N0))  # the factor's columns as rows: each step reads a contiguous j x N0 block
    picked = np.zeros(N0, dtype=bool)
    floor = 1e-9 * n
    lam = float(ridge) * n
    order = []
    for j in range(k):
        s = np.einsum("mc,mc->m", B, B) / (d + lam)
        s[picked | (d <= floor)] = -np.inf
        q = int(np.argmax(s))
        if s[q] == -np.inf:
            break
        order.append(q)
        picked[q] = True
        r = math.sqrt(d[q])
        col = (G[:, q] - L[:j, q] @ L[:j]) / r
        L[j] = col
        d -= col * col
        B -= np.outer(col, B[q] / r)
    if len(order) < k:  # the span is exhausted: the rest by corr's score
        v = scores(st, "corr")
        v[picked] = -np.inf
        order.extend(_top(v, k - len(order)).tolist())
    return np.asarray(order, dtype=np.int64)


# ----------------------------------------------------------------------------- LKRF
def chi2_divergence(q: np.ndarray, p: np.ndarray) -> float:
    """D(q || p) = sum_m q_m^2 / p_m - 1 (the chi-square divergence, f(t) = t^2 - 1)."""
    return float(np.sum(q * q / p) - 1.0)


def lkrf_weights(v: np.ndarray, p: np.ndarray, rho: float) -> np.ndarray:
    """argmax_q sum_m q_m v_m over the simplex with D(q || p) <= rho (Sinha and Duchi 2016).

    ``v``: float64 (N,) scores; ``p``: float64 (N,) base weights, > 0, summing to 1;
    ``rho`` >= 0.  The maximiser is q(nu) = p (v - nu)_+ / sum p (v - nu)_+ with nu the
    largest multiplier whose divergence is at most rho: D(q(nu)) increases with nu from 0
    (nu -> -inf, q = p) to 1 / P(argmax) - 1 at nu = max v.  While nu <= min v (every
    q_m > 0) D = Var_p(v) / (E_p v - nu)^2, so nu = E_p v - sqrt(Var_p(v) / rho); beyond it,
    bisection to the last representable nu.  Returns float64 (N,), summing to 1."""
    v = np.asarray(v, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    vmax, vmin = float(v.max()), float(v.min())
    top = v == vmax
    if vmax == vmin:
        return p.copy()

    def q_of(nu):
        w = p * np.maximum(v - nu, 0.0)
        return w / w.sum()

    if chi2_divergence(p * top / p[top].sum(), p) <= rho:  # the vertex(es) at max v are allowed
        return p * top / p[top].sum()
    mean = float(p @ v)
    var = float(p @ (v - mean) ** 2)
    if rho > 0 and var / (mean - vmin) ** 2 >= rho:  # every weight positive: closed form
        nu = mean - math.sqrt(var / rho) if var / rho < math.inf else -math.inf
        if math.isfinite(nu) and math.isfinite(vmax - nu):
            return q_of(min(nu, vmin))
        # rho so small that var / rho overflows (nu = -inf): the same q in a form that
        # cannot, q_m = p_m (1 + t (v_m - mean)) with t = 1 / (mean - nu) = sqrt(rho / var)
        t = math.sqrt(rho) / math.sqrt(var)
        w = p * (1.0 + t * (v - mean))
        return w / w.sum()
    if rho <= 0:
        return p.copy()
    lo, hi = vmin, vmax  # D(q(lo)) < rho < D(q(hi))
    for _ in range(2000):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if chi2_divergence(q_of(mid), p) <= rho:
            lo = mid
        else:
            hi = mid
    return q_of(lo)


# ----------------------------------------------------------------------------- subsets
def subset(fs: FeatureSet, keep: np.ndarray, *, column_weight: np.ndarray | None = None) -> FeatureSet:
    """The feature set of columns ``keep`` (int64, increasing) of ``fs``: terms and omegas
    copied (each continuous term's omegas renumbered), counts kept, draws = their sum;
    ``column_weight`` (float64, one per kept column) if given."""
    keep = np.asarray(keep, dtype=np.int64)
    lengths = np.diff(fs.ptr)[keep]
    ptr = np.zeros(keep.size + 1, np.int64)
    np.cumsum(lengths, out=ptr[1:])
    take = np.concatenate([np.arange(fs.ptr[j], fs.ptr[j + 1]) for j in keep]) if ptr[-1] else np.zeros(0, np.int64)
    node, code, power = fs.node[take], fs.code[take].copy(), fs.power[take]
    walk = fs.walk_skeleton
    width = np.array([n.base.width if getattr(n, "base", None) is not None and n.base.continuous else 0
                      for n in walk.nodes], dtype=np.int64)
    tw = width[node] if node.size else np.zeros(0, np.int64)
    cont = np.flatnonzero(tw > 0)
    if cont.size:
        starts = code[cont]
        omega = np.concatenate([fs.omega[s:s + w] for s, w in zip(starts.tolist(), tw[cont].tolist())])
        code[cont] = np.concatenate(([0], np.cumsum(tw[cont])[:-1]))
    else:
        omega = np.zeros(0)
    cnt = fs.count[keep].astype(np.int64)
    out = dataclasses.replace(fs, draws=int(cnt.sum()), count=cnt, kind=fs.kind[keep], ptr=ptr, node=node, code=code,
                              power=power, omega=omega, column_weight=column_weight, stats=dict(fs.stats))
    out.extra = kind_of(fs).subset(fs, keep)  # the kind's own data of the kept columns (EOF: their grid cells)
    return out


def pool_digest(fs: FeatureSet) -> str:
    """SHA-256 of a pool's content (skeleton, scheme, seed, columns, terms, omegas, weights):
    the pool's identity in a selected file's provenance."""
    h = hashlib.sha256()
    h.update(fs.skeleton.source.encode())
    h.update(f"{fs.scheme}\0{fs.seed}\0{fs.draws}\0".encode())
    for a in (fs.count, fs.kind, fs.ptr, fs.node, fs.code, fs.power):
        h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(fs.omega, dtype=np.float64).tobytes())
    if fs.column_weight is not None:
        h.update(np.ascontiguousarray(fs.column_weight, dtype=np.float64).tobytes())
    kind_of(fs).digest(fs, h)  # the kind's own data (EOF: level and index vectors)
    return h.hexdigest()


# ----------------------------------------------------------------------------- the operation
def _pool(pool, n_features: int, pool_factor: int, seed: int, scheme: str, rows, label_column):
    """(FeatureSet, provenance) of ``pool``: a FeatureSet, a feature file, or a skeleton
    (a :class:`Skeleton`, or a ``.yaml``/``.yml`` path or shipped name) from which
    ``pool_factor * n_features`` columns are sampled with ``seed``."""
    from .features import is_feature_file, load
    from .skeleton import Skeleton, load_skeleton, shipped_skeletons

    if isinstance(pool, FeatureSet):
        return pool, {"pool": "in memory"}
    skel = None
    if isinstance(pool, Skeleton):
        skel = pool
    elif isinstance(pool, (str, os.PathLike)):
        p = os.fspath(pool)
        if p.lower().endswith((".yaml", ".yml")) or (not os.path.exists(p) and p in shipped_skeletons()):
            skel = load_skeleton(p)
        elif os.path.isfile(p) and not is_feature_file(p):
            raise FeatureFileError(f"{p}: not a feature file (the pool); sample one with 'rfsgen sample SKELETON -n "
                                   f"{pool_factor * n_features}' ({pool_factor} x D columns) or give a skeleton")
        else:
            from .output import file_sha256

            return load(p), {"pool": p, "pool_sha256": file_sha256(p)}
    else:
        raise UsageError(f"pool must be a FeatureSet, a feature file, or a skeleton, not {type(pool).__name__}")
    if isinstance(pool_factor, bool) or not isinstance(pool_factor, (int, np.integer)) or pool_factor < 1:
        raise UsageError(f"pool_factor must be a positive integer, got {pool_factor!r}")
    if skel.auto:
        from .inputs import open_input

        with open_input(rows) as src:
            width = src.width - (label_column is not None)
        skel = skel.bind(width)
    from .sampler import sample_scheme

    # (a kind that fits its sampling to the rows reads them: EOF's box)
    fs = sample_scheme(skel, pool_factor * n_features, seed, scheme=scheme,
                       rows=lambda: _rows_array(rows, label_column))
    return fs, {"pool": f"sampled from {skel.path}", "pool_factor": int(pool_factor), "pool_scheme": scheme}


def _rows_array(rows, label_column):
    from .inputs import open_input

    with open_input(rows) as src:
        x = src.read()
    return np.delete(x, label_column, axis=1) if label_column is not None else x


def _label_column(rows, label_column: int):
    """The labels in column ``label_column`` of ``rows`` (one streamed pass), float64 (n,)."""
    from .inputs import open_input

    from . import budget

    what = f"{{}} labels in column {label_column} of the rows"
    fix = "give fewer rows"
    with open_input(rows) as src:
        if not -src.width <= label_column < src.width:
            raise InputError(f"{src.name}: --label-column {label_column} but the rows have {count(src.width, 'value')}")
        if src.n_rows is not None:  # the labels, their copy, and the class codes: before any row is read
            budget.check(8.0 * 4 * src.n_rows, what.format(src.n_rows), fix)
        parts, total = [], 0
        for row0, block in src.chunks(1 << 14):
            total += block.shape[0]
            budget.check(8.0 * 4 * total, what.format(total), fix)
            lab = np.asarray(block)[:, label_column].astype(np.float64)
            big = np.abs(lab) >= 2.0**53
            if big.any():  # rows are read as floats: a label this large may already be another
                i = int(np.flatnonzero(big)[0])
                raise InputError(f"{src.name}: row {row0 + i}: the label {lab[i]:.17g} in column {label_column} is "
                                 "too large to be read exactly (2^53 or more) from a column of numbers; give the "
                                 "labels as a separate labels file (integers are read exactly there)")
            parts.append(lab)
    return np.concatenate(parts) if parts else np.zeros(0)


def select(pool, rows, labels, n_features: int, *, method: str = "eerf", rho: float | None = None,
           task: str = "auto", seed: int = 0, chunk_rows: int | None = None, progress=None,
           pool_factor: int = POOL_FACTOR, scheme: str = "rfs", label_column: int | None = None,
           command: str = "") -> FeatureSet:
    """Keep ``n_features`` columns of ``pool`` chosen by their alignment with ``labels``.

    ``pool``: a :class:`FeatureSet`, a feature-file path, or a skeleton (a
    :class:`~rfsgen.Skeleton`, a ``.yaml`` path or a shipped name), from which
    ``pool_factor * n_features`` columns are sampled with ``seed`` and ``scheme``.
    ``rows``: training rows, float ``(n, width)`` or anything :func:`rfsgen.open_input` reads
    (streamed in chunks of ``chunk_rows``); ``labels``: one per row, an array-like or a
    labels file (:func:`read_labels`), or None with ``label_column`` (that column of
    ``rows``, removed from the features' input).  ``method``: ``eerf``, ``lkrf``, ``corr``,
    ``eerf-norm`` or ``greedy`` (module docstring); ``rho``: LKRF's divergence bound (default
    N0 / D - 1); ``task``: ``auto``, ``classification`` or ``regression``.
    Returns an ordinary :class:`FeatureSet` of ``n_features`` columns, in the pool's
    order, with the selection's provenance in ``stats["selection"]``.
    """
    if method not in METHODS:
        raise UsageError(f"unknown selection method {method!r}; one of {', '.join(METHODS)}")
    if isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer)) or n_features < 1:
        raise UsageError(f"the number of columns to keep (-n) must be a positive integer, got {n_features!r}")
    n_features = int(n_features)
    if rho is not None and (method != "lkrf"):
        raise UsageError(f"rho (--rho) applies to method lkrf, not {method}")
    if rho is not None and not (isinstance(rho, (int, float, np.floating)) and math.isfinite(rho) and rho >= 0):
        raise UsageError(f"rho (--rho) must be a finite number >= 0, got {rho!r}")
    if str(rows) == "-" and (label_column is not None or not isinstance(pool, (FeatureSet, str, os.PathLike))
                             or str(pool).lower().endswith((".yaml", ".yml"))):
        raise UsageError("rows from standard input ('-') are read once; with --label-column or a skeleton as the pool "
                         "give the rows as a file")
    if (labels is None) == (label_column is None):
        raise UsageError("give labels (a labels file or array) or a label column of the rows, not both or neither")
    if label_column is not None:
        lab = _label_column(rows, int(label_column))
        where = f"column {label_column} of the rows"
    else:
        lab = read_labels(labels)
        where = os.fspath(labels) if isinstance(labels, (str, os.PathLike)) else "labels"
    task, classes, codes = encode_labels(lab, task, where=where)
    fs, provenance = _pool(pool, n_features, pool_factor, seed, scheme, rows, label_column)
    N0 = fs.columns
    if n_features > N0:
        k = int(pool_factor) if isinstance(pool_factor, (int, np.integer)) and pool_factor >= 1 else POOL_FACTOR
        raise UsageError(f"the pool has {count(N0, 'column')}, fewer than the {n_features} to keep; sample a pool of "
                         f"{k} x D = {k * n_features} columns ('rfsgen sample SKELETON -n {k * n_features}')")
    st = pool_statistics(fs, rows, task, codes, classes.size if classes is not None else 1, chunk_rows=chunk_rows,
                         progress=progress, label_column=None if label_column is None else int(label_column),
                         gram=method == "greedy")
    v = scores(st, "corr" if method == "greedy" else method)
    weight = None
    record = {"method": method, "columns": n_features, "pool_columns": N0, "task": task, "rows": st.rows,
              "pool_digest": pool_digest(fs), **provenance}
    if classes is not None:
        record["classes"] = int(classes.size)
    if method == "lkrf":
        p = fs.weight / fs.weight.sum()
        r = float(N0 / n_features - 1.0) if rho is None else float(rho)
        q = lkrf_weights(v, p, r)
        keep = np.sort(_top(q, n_features))
        kept = q[keep]
        weight = kept / kept.sum() if kept.sum() > 0 else np.full(keep.size, 1.0 / keep.size)
        if not kind_of(fs).weights_add_up:  # an EOF column's weight multiplies its (unit) feature: mean 1, as unweighted
            weight = weight * keep.size
        record.update(rho=r, divergence=chi2_divergence(q, p), kept_mass=float(kept.sum()))
    elif method == "greedy":
        order = greedy_order(st, n_features)
        st.gram = None
        keep = np.sort(order)
        record.update(ridge=GREEDY_RIDGE, order=order.tolist())
    else:
        keep = np.sort(_top(v, n_features))
    record["kept"] = keep.tolist()  # the pool's column numbers, increasing
    record["score_kept_mean"] = float(v[keep].mean())
    record["score_pool_mean"] = float(v.mean())
    out = subset(fs, keep, column_weight=weight)
    # The pool's sampler statistics describe the pool's draws, not the kept columns: kept apart.
    out.stats = {"selection": record, **({"pool_stats": fs.stats} if fs.stats else {})}
    out.command = command or fs.command
    return out


def _top(v: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest values of ``v``; ties go to the lower index (stable)."""
    order = np.argsort(-v, kind="stable")
    return order[:k]


def select_file(features, rows, labels, output, n_features: int, *, method: str = "eerf", rho=None,
                task: str = "auto", seed: int = 0, pool_factor: int = POOL_FACTOR, scheme: str = "rfs",
                label_column: int | None = None, chunk_rows=None, overwrite: bool = False, progress=None,
                command: str = "") -> FeatureSet:
    """``rfsgen select``: :func:`select` from the feature file (or skeleton) ``features``,
    written atomically to the feature file ``output`` (checked before any work: an existing
    ``output`` without ``overwrite`` is an :class:`~rfsgen.errors.OutputExistsError`)."""
    from . import __version__
    from .errors import OutputExistsError
    from .features import save

    if Path(output).exists() and not overwrite:
        raise OutputExistsError(f"{output}: already exists; pass overwrite=True to replace it",
                                cli=f"{output}: already exists; pass --overwrite to replace it")
    fs = select(features, rows, labels, n_features, method=method, rho=rho, task=task, seed=seed,
                chunk_rows=chunk_rows, progress=progress, pool_factor=pool_factor, scheme=scheme,
                label_column=label_column, command=command)
    fs.tool_version = __version__
    fs.stats["selection"]["rows_file"] = os.fspath(rows) if isinstance(rows, (str, os.PathLike)) else "in memory"
    if isinstance(labels, (str, os.PathLike)):
        fs.stats["selection"]["labels_file"] = os.fspath(labels)
    save(fs, output, overwrite=overwrite, inputs=[features, rows] + ([labels] if labels is not None else []))
    return fs
