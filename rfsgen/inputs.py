"""Reading inputs: every command's rows, streamed in chunks from files or standard input.

Input specs: ``data.npy`` (memory-mapped), ``data.npz[:key]``, ``data.h5[:/path]``,
``data.csv`` / ``data.tsv`` / ``data.txt`` (comma-, tab- or whitespace-separated, detected
from the first line; a first line of non-numbers is a header, skipped), and ``-`` for
standard input (``.npy`` bytes or text, detected).  Arrays with more than two dimensions are flattened per row
(row-major), so ``(N, H, W, C)`` images become rows of ``H*W*C`` values.

Every source streams float chunks ``(m, width)`` (float32 and float64 data as
stored, anything else as float64): memory is bounded by the
chunk, never by the input size (except ``.npz`` members, which numpy cannot
memory-map and are loaded whole).
"""

from __future__ import annotations

import io as _io
import math
import os
import re
import sys
from pathlib import Path
from typing import Iterator

import numpy as np

from . import budget
from .errors import DataError, InputError, UsageError, article, count
from .specs import _split_spec

TEXT_SUFFIXES = (".csv", ".tsv", ".txt")  # read alike: delimiter and header detected (TextSource)
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".h5ad")


class InputSource:
    """A table of rows read in chunks.  ``n_rows`` is ``None`` for streams."""

    name: str
    width: int
    n_rows: int | None
    #: True when ``n_rows`` is only a stream's header, which nothing can check against
    #: the data before it is read: writers must not reserve space for it up front.
    declared_only: bool = False

    def chunks(self, chunk_rows: int, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(row0, float32 or float64 array (m, width))`` for rows ``start:stop``."""
        raise NotImplementedError

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """All rows ``start:stop`` as one float64 array.  The size (declared by the
        input, or counted as a stream arrives) is checked against the memory budget
        before it is read."""
        fix = "read fewer rows with --rows START:STOP"
        if self.n_rows is not None:
            n = max(0, (self.n_rows if stop is None else min(stop, self.n_rows)) - start)
            budget.check(2 * n * self.width * 8, f"{self.name}: {n} rows of {self.width} values read at once", fix)
        parts, total = [], 0
        for _, c in self.chunks(65536, start, stop):
            total += c.shape[0]
            budget.check(2 * total * self.width * 8, f"{self.name}: {total} rows of {self.width} values read at once", fix)
            parts.append(c)
        if not parts:
            return np.zeros((0, self.width))
        return np.concatenate(parts).astype(np.float64, copy=False)

    _row_names = None  # a reader (start, stop) -> list of str, for inputs with row names
    #: The input's obs columns (:class:`rfsgen.obs.ObsColumns`; an ``.h5ad``'s X or
    #: layers), which an output carries; None for other inputs.
    obs_columns = None

    def row_names(self, start: int, stop: int):
        """Names of rows ``start:stop`` (list of str) when the input has them (the
        ``obs`` index of an ``.h5ad``), else None."""
        return None if self._row_names is None else self._row_names(start, stop)

    def column_extremes(self, cols):
        """Per-column ``(lo, hi)`` over every row of columns ``cols``, when the source can
        give them without streaming its rows (a COO matrix: from its stored values), else
        None (then the caller streams the rows)."""
        return None

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def check_chunk(src: InputSource, chunk_rows: int, start: int, stop) -> None:
    """Budget check of one chunk of ``src`` (float64 ``(chunk_rows, width)`` and a
    copy) before any is read: a forged width cannot allocate past the budget."""
    rows = chunk_rows if stop is None else max(0, min(chunk_rows, stop - start))
    budget.check(2 * rows * src.width * 8, f"{src.name}: a chunk of {rows} rows of {src.width} values",
                 "pass fewer rows per chunk with --chunk-rows, or check the input's declared shape")


def declared_bytes(shape, itemsize: int) -> int:
    """Bytes an array of ``shape`` declares (exact Python integers: never overflows)."""
    n = int(itemsize)
    for v in shape:
        n *= int(v)
    return n


def check_declared(name: str, shape, itemsize: int, available=None, what: str = "the array") -> None:
    """Validate a declared shape before anything is allocated: no negative extents, and
    (``available`` not None) at most ``available`` bytes, what the file can hold."""
    if any(int(v) < 0 for v in shape):
        raise InputError(f"{name}: {what} declares shape {tuple(int(v) for v in shape)}; the file is damaged")
    nbytes = declared_bytes(shape, itemsize)
    if available is not None and nbytes > available:
        raise InputError(f"{name}: {what} declares shape {tuple(int(v) for v in shape)} ({nbytes} bytes) but the "
                         f"file holds only {available} bytes; the file is damaged, truncated or crafted")


def _float(a: np.ndarray) -> np.ndarray:
    """float32 and float64 as they are (the transform reads both); other numbers as float64."""
    return a if a.dtype in (np.float32, np.float64) else a.astype(np.float64)


class ArraySource(InputSource):
    """Rows of an array-like (numpy array, memmap or h5py dataset)."""

    def __init__(self, array, name: str, closer=None, row_names=None):
        if array.ndim == 0:
            raise InputError(f"{name}: holds a scalar, not a table of rows")
        self.array = array
        self.name = name
        self.n_rows = int(array.shape[0])
        self.width = int(np.prod(array.shape[1:])) if array.ndim > 1 else 1
        self._closer = closer
        self._row_names = row_names
        kind = getattr(array.dtype, "kind", "f")
        if kind == "b":
            raise InputError(f"{name}: holds booleans; convert to numbers (binary inputs are coded -1/+1)")
        if kind not in "iuf":
            raise InputError(f"{name}: has dtype {array.dtype}, not numbers; convert it to a numeric array")

    def chunks(self, chunk_rows, start=0, stop=None):
        stop = self.n_rows if stop is None else min(stop, self.n_rows)
        check_chunk(self, chunk_rows, start, stop)
        read = self._file_reader()
        for a in range(start, stop, chunk_rows):
            b = min(a + chunk_rows, stop)
            block = read(a, b) if read else _float(np.asarray(self.array[a:b]))
            yield a, block.reshape(b - a, self.width)

    def _file_reader(self):
        """For a C-ordered memory-mapped ``.npy``: read rows with ``pread`` instead of
        touching the map, whose pages would count towards resident memory and grow
        with the number of rows read."""
        arr = self.array
        if not isinstance(arr, np.memmap) or not arr.flags.c_contiguous or arr.filename is None:
            return None
        import os

        fd = os.open(arr.filename, os.O_RDONLY)
        prev = self._closer
        self._closer = lambda: (os.close(fd), prev and prev())
        row_bytes = self.width * arr.dtype.itemsize

        def read(a, b):
            buf = np.empty((b - a) * self.width, dtype=arr.dtype)
            view = memoryview(buf).cast("B")
            pos, got = arr.offset + a * row_bytes, 0
            while got < view.nbytes:
                k = os.preadv(fd, [view[got:]], pos + got)
                if k == 0:
                    raise InputError(f"{self.name}: file ended early (truncated?); re-create it")
                got += k
            return _float(buf)

        return read

    def close(self):
        if self._closer:
            self._closer()
            self._closer = None


#: Bytes one character of a text line may take while the line is read, split into
#: fields and parsed ("1,1,1,...": a str object and a list slot per field, a float64 per
#: value): a line longer than the budget over this is refused before it is read whole.
TEXT_LINE_BYTES = 32


class TextSource(InputSource):
    """Delimited text (CSV/TSV/whitespace), parsed chunk by chunk with numpy's C parser."""

    def __init__(self, stream, name: str, delimiter, closer=None):
        self.stream = stream
        self.name = name
        self.n_rows = None
        self._closer = closer
        self._line = 0
        first = self._next_nonempty()
        if first is None:
            raise InputError(f"{name}: is empty; expected rows of numbers")
        self.delimiter = detect_delimiter(first) if delimiter is None else delimiter
        fields = self._split(first)
        header = not any(_is_number(f.replace("_", "")) for f in fields)  # ('1_0' is a bad number, not a name)
        self.detected = f"{DELIMITER_NAMES[self.delimiter]}, {'a header line' if header else 'no header line'}"
        if header:
            self.header = fields
            first = self._next_nonempty()
            if first is None:
                raise InputError(f"{name}: has a header line but no rows (read as {self.detected})")
        self._pending = [(self._line, first)]
        self.width = len(self._split(first))
        self._consumed = 0

    def _split(self, line):
        return [f.strip() for f in (line.split(self.delimiter) if self.delimiter else line.split())]

    def _next_nonempty(self):
        # A line is read at most budget / TEXT_LINE_BYTES characters at a time (the room
        # read again for each chunk): one very long line is refused, never read whole.
        most = getattr(self, "_most", None) or budget.room(TEXT_LINE_BYTES)
        self._most = most
        try:
            for line in iter(lambda: self.stream.readline(most + 1), ""):
                self._line += 1
                if len(line) > most and line[-1:] != "\n":
                    budget.refuse(TEXT_LINE_BYTES * len(line), f"{self.name}:{self._line}: a line of more than {most} "
                                  "characters (its text and fields)", "put one row on each line")
                if line.strip():
                    return line
        except UnicodeDecodeError:
            raise InputError(f"{self.name}:{self._line + 1}: is not UTF-8 text; text input must be UTF-8 "
                             "(or pass .npy bytes)") from None
        return None

    def _read_lines(self, n):
        self._most = None  # the longest line the budget allows, read again for this chunk
        out = self._pending[:n]
        self._pending = self._pending[n:]
        while len(out) < n:
            line = self._next_nonempty()
            if line is None:
                break
            out.append((self._line, line))
        return out

    def chunks(self, chunk_rows, start=0, stop=None):
        # Text streams go forward only: skip rows up to start, stop at stop.
        while self._consumed < start:
            got = self._read_lines(min(chunk_rows, start - self._consumed))
            if not got:
                return
            self._consumed += len(got)
        while stop is None or self._consumed < stop:
            want = chunk_rows if stop is None else min(chunk_rows, stop - self._consumed)
            got = self._read_lines(want)
            if not got:
                return
            row0 = self._consumed
            self._consumed += len(got)
            yield row0, self._parse(got)

    def _parse(self, got):
        try:  # comments=None: '1,2 # note' is an error, not silently the row 1,2
            arr = np.loadtxt([g[1] for g in got], delimiter=self.delimiter, dtype=np.float64, ndmin=2, comments=None)
        except ValueError as e:
            raise self._explain(got, e) from None
        if arr.shape[1] != self.width:
            raise self._explain(got, None)
        return arr

    def _explain(self, got, exc):
        for lineno, text in got:
            fields = self._split(text)
            if len(fields) != self.width:
                return InputError(
                    f"{self.name}:{lineno}: has {len(fields)} fields but the first row has {self.width} (read as "
                    f"{self.detected}); every row needs the same number of columns"
                )
            for col, f in enumerate(fields):
                if not _is_number(f):
                    return DataError(f"{self.name}:{lineno}: column {col}: {f!r} is not a number (read as "
                                     f"{self.detected}); fix or drop that row")
        return DataError(f"{self.name}:{got[0][0]}-{got[-1][0]}: cannot parse these lines (read as {self.detected}): "
                         f"{exc}; fix or drop the row that holds it")

    def close(self):
        if self._closer:
            self._closer()
            self._closer = None


#: How :func:`detect_delimiter`'s results are named in messages.
DELIMITER_NAMES = {",": "comma-separated", "\t": "tab-separated", None: "whitespace-separated"}


def detect_delimiter(line: str):
    """The delimiter of a text input, from its first non-empty line (a header or a row),
    the same way for every text input (.csv, .tsv, .txt, standard input; the suffix is
    not trusted): the more frequent of comma and tab, else ``None`` (runs of whitespace).
    A one-column file reads the same whichever it is."""
    commas, tabs = line.count(","), line.count("\t")
    if commas == tabs == 0:
        return None
    return "," if commas >= tabs else "\t"


def _is_number(s: str) -> bool:
    """Whether numpy's text reader takes ``s`` as a number: Python's float() does, except
    for digits grouped with underscores ('1_000'), which numpy refuses."""
    if "_" in s:
        return False
    try:
        float(s)
        return True
    except ValueError:
        return False


class SparseRows:
    """A chunk of rows in canonical CSR form, as :meth:`CsrRowsSource.sparse_chunks` yields
    it: ``indptr`` int64 ``(m + 1,)`` from 0, ``indices`` int64 sorted and unique within each
    row (every one within ``0..width - 1``), ``data`` of ``dtype`` (float32 or float64, the
    dense chunk's dtype).  The values are the dense chunk's, bit for bit: duplicates added
    up in their stored order from +0.0 (as the dense chunk adds them), explicit zeros and
    -0.0 kept as stored.  :meth:`toarray` gives the dense chunk."""

    ndim = 2

    def __init__(self, indptr, indices, data, width: int):
        self.indptr, self.indices, self.data = indptr, indices, data
        self.shape = (int(indptr.size) - 1, int(width))
        self.dtype = data.dtype

    @classmethod
    def canonical(cls, ptr, cols, vals, dtype, width: int) -> "SparseRows":
        """From a validated chunk (``ptr`` from 0, columns within the width) in any order,
        with duplicates: the dense chunk's values at its stored positions."""
        vals = vals.astype(dtype, copy=False)
        if not _has_duplicates(ptr, cols):
            if cols.size > 1:
                d = np.diff(cols)
                inner = np.ones(cols.size - 1, dtype=bool)
                cut = ptr[1:-1]
                cut = cut[(cut > 0) & (cut < cols.size)]
                inner[cut - 1] = False
                if not (d[inner] > 0).all():  # unsorted: sort each row (no ties)
                    rows = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
                    order = np.lexsort((cols, rows))
                    cols, vals = cols[order], vals[order]
            return cls(ptr, cols, vals, width)
        # Duplicates: the dense chunk adds every stored value into zeros, in stored order.
        rows = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
        order = np.lexsort((cols, rows))  # stable: equal (row, column) keep their stored order
        r, c = rows[order], cols[order]
        new = np.ones(r.size, dtype=bool)
        new[1:] = (r[1:] != r[:-1]) | (c[1:] != c[:-1])
        sums = np.zeros(int(new.sum()), dtype=dtype)
        np.add.at(sums, np.cumsum(new) - 1, vals[order])
        r, c = r[new], c[new]
        indptr = np.zeros(ptr.size, dtype=np.int64)
        np.cumsum(np.bincount(r, minlength=ptr.size - 1), out=indptr[1:])
        return cls(indptr, c, sums, width)

    def toarray(self, rows=None) -> np.ndarray:
        """The dense chunk (or its rows ``rows``, an int array), the bits the dense path reads."""
        ptr = self.indptr
        if rows is None:
            rows = np.arange(self.shape[0])
        rows = np.asarray(rows, dtype=np.int64)
        out = np.zeros((rows.size, self.shape[1]), dtype=self.dtype)
        counts = ptr[rows + 1] - ptr[rows]
        take = np.repeat(ptr[rows] - np.concatenate(([0], np.cumsum(counts)[:-1])), counts) + np.arange(counts.sum())
        out[np.repeat(np.arange(rows.size), counts), self.indices[take]] = self.data[take]
        return out


def chunk_row_bytes(tr, src: InputSource) -> int:
    """Bytes one row of ``src``'s chunks takes in transformer ``tr`` (for
    :func:`rfsgen.output.default_chunk_rows`): ``tr.row_bytes``, or where the rows stay CSR
    (:func:`chunks_for`) ``tr.sparse_row_bytes(stored)`` for twice the input's mean
    stored values a row (no dense row is made: chunks of more rows fit the same bytes)."""
    rb = int(getattr(tr, "row_bytes", 0))
    if getattr(src, "sparse_chunks", None) is None or not getattr(tr, "reads_sparse", False):
        return rb
    return min(rb, int(tr.sparse_row_bytes(2 * src.stored_per_row())))


def chunks_for(src: InputSource, tr, chunk_rows: int, start: int = 0, stop: int | None = None):
    """``src``'s chunks for transformer ``tr``: :class:`SparseRows` where ``tr`` reads them
    (``tr.reads_sparse``) and ``src`` gives them (``src.sparse_chunks``), else dense rows."""
    sparse = getattr(src, "sparse_chunks", None)
    if sparse is not None and getattr(tr, "reads_sparse", False):
        return sparse(chunk_rows, start, stop)
    return src.chunks(chunk_rows, start, stop)


class CsrRowsSource(InputSource):
    """Rows of a CSR matrix held as three sliceable parts (numpy arrays, h5py datasets,
    or members of a ``.npz`` read in order): each chunk reads its slice of ``indptr``,
    ``data`` and ``indices`` and is densified alone, so memory follows the chunk,
    never the whole matrix.  Duplicate entries add up, as in scipy."""

    def __init__(self, name: str, shape, indptr, data, indices, closer=None, row_names=None):
        self.name = name
        self.n_rows, self.width = (int(v) for v in shape)
        self.indptr, self.data, self.indices = indptr, data, indices
        self._closer = closer
        self._row_names = row_names
        for part, what in ((data, "data"), (indices, "indices"), (indptr, "indptr")):
            if part.ndim != 1:
                raise InputError(f"{name}: the sparse matrix's '{what}' is not 1-D; rewrite it with scipy or anndata")
        if data.dtype.kind not in "iuf":
            raise InputError(f"{name}: the sparse matrix has dtype {data.dtype}, not real numbers; convert it")
        if indices.dtype.kind not in "iu" or indptr.dtype.kind not in "iu":
            raise InputError(f"{name}: the sparse matrix's indices are not integers; rewrite it with scipy or anndata")
        if self.n_rows < 0 or self.width < 0:
            raise InputError(f"{name}: the sparse matrix declares shape ({self.n_rows}, {self.width}); the file is damaged")
        if indptr.shape[0] != self.n_rows + 1:
            raise InputError(f"{name}: the sparse matrix's indptr has {indptr.shape[0]} entries for {self.n_rows} rows "
                             "(a CSR matrix has rows + 1); the file is damaged or not CSR")
        if data.shape[0] != indices.shape[0]:
            raise InputError(f"{name}: the sparse matrix has {data.shape[0]} values but {indices.shape[0]} column "
                             "indices; the file is damaged")
        n_ptr = int(indptr.shape[0])
        first = np.asarray(indptr[0:1], dtype=np.int64) if n_ptr else np.zeros(0)
        ends = np.asarray(indptr[n_ptr - 1:n_ptr], dtype=np.int64) if n_ptr else np.zeros(0)
        if (first.size and first[0] != 0) or (ends.size and not 0 <= ends[0] <= data.shape[0]):
            raise InputError(f"{name}: the sparse matrix's indptr is not increasing from 0 or points past its data "
                             f"(it runs {int(first[0])}..{int(ends[0])} over {data.shape[0]} values); the file is damaged")
        self._stored = int(ends[0]) if ends.size else 0

    def stored_per_row(self) -> float:
        """The mean number of stored values a row holds (from ``indptr``'s last entry)."""
        return self._stored / max(self.n_rows, 1)

    def _parts(self, chunk_rows, start, stop, dense=True):
        """``(a, b, ptr, cols, vals, dtype)`` for each chunk of rows ``a:b``: its slice of
        ``indptr`` (int64, absolute), column indices (int64) and stored values, validated
        (indptr increasing and within the data, every column index within the width)."""
        stop = self.n_rows if stop is None else min(stop, self.n_rows)
        if dense:  # (CSR chunks: their stored values are checked below, chunk by chunk)
            check_chunk(self, chunk_rows, start, stop)
        dtype = np.float32 if self.data.dtype == np.float32 else np.float64
        for a in range(start, stop, chunk_rows):
            b = min(a + chunk_rows, stop)
            ptr = np.asarray(self.indptr[a:b + 1], dtype=np.int64)
            lo, hi = int(ptr[0]), int(ptr[-1])
            if np.any(np.diff(ptr) < 0) or lo < 0 or hi > self.data.shape[0] or hi > self.indices.shape[0]:
                raise InputError(f"{self.name}: rows {a}:{b}: the sparse matrix's indptr is not increasing or points "
                                 "past its data; the file is damaged")
            budget.check(3 * (hi - lo) * 8, f"{self.name}: rows {a}:{b}: {hi - lo} stored values read at once",
                         "pass fewer rows per chunk with --chunk-rows")
            cols = np.asarray(self.indices[lo:hi], dtype=np.int64)
            vals = np.asarray(self.data[lo:hi])
            if cols.size and (cols.min() < 0 or cols.max() >= self.width):
                r = a + int(np.searchsorted(ptr, lo + int(np.argmax((cols < 0) | (cols >= self.width))), "right")) - 1
                raise InputError(f"{self.name}: row {r}: a column index is outside 0..{self.width - 1}; "
                                 "the file is damaged")
            yield a, b, ptr, cols, vals, dtype

    def chunks(self, chunk_rows, start=0, stop=None):
        for a, b, ptr, cols, vals, dtype in self._parts(chunk_rows, start, stop):
            block = np.zeros((b - a, self.width), dtype=dtype)
            rows = np.repeat(np.arange(b - a), np.diff(ptr))
            if _has_duplicates(ptr, cols):
                np.add.at(block, (rows, cols), vals.astype(dtype, copy=False))
            else:
                block[rows, cols] = vals
            yield a, block

    def sparse_chunks(self, chunk_rows, start=0, stop=None):
        """The chunks of :meth:`chunks` as :class:`SparseRows`, never densified: the same
        values (``SparseRows.toarray`` gives the dense chunk's bits)."""
        for a, b, ptr, cols, vals, dtype in self._parts(chunk_rows, start, stop, dense=False):
            yield a, SparseRows.canonical(ptr - ptr[0], cols, vals, dtype, self.width)

    def close(self):
        if self._closer:
            self._closer()
            self._closer = None


def _has_duplicates(ptr, cols) -> bool:
    """True if some row lists a column twice (then values must add up, not overwrite)."""
    if cols.size < 2:
        return False
    d = np.diff(cols)
    inner = np.ones(cols.size - 1, dtype=bool)
    starts = (ptr[1:-1] - ptr[0]).astype(np.int64)  # a row boundary between k-1 and k
    starts = starts[(starts > 0) & (starts < cols.size)]
    inner[starts - 1] = False
    if (d[inner] > 0).all():
        return False  # sorted and unique within every row: the common case
    keyed = np.repeat(np.arange(ptr.size - 1), np.diff(ptr)) * (cols.max() + 1) + cols
    return np.unique(keyed).size != keyed.size


class SparseSource(InputSource):
    """Rows of an in-memory ``scipy.sparse`` matrix or array.  CSR is read through
    :class:`CsrRowsSource`; other formats that slice by rows (CSC, LIL, DOK) are
    converted one chunk of rows at a time, and COO, DIA and BSR, which do not, to
    coordinates sorted by row once (a copy of the nonzeros, never dense, and nothing
    per declared row: a 1 KB archive may declare 10^9 rows), each chunk's entries then
    converted to CSR alone."""

    def __init__(self, matrix, name: str):
        if matrix.ndim != 2:
            raise InputError(f"{name}: a sparse input must be 2-D, got shape {matrix.shape}")
        if matrix.dtype.kind not in "iuf":
            raise InputError(f"{name}: has dtype {matrix.dtype}, not real numbers; convert it")
        self._coo = None
        if matrix.format not in ("csr", "csc", "lil", "dok"):  # coo, dia, bsr do not slice rows
            stored = int(matrix.nnz) if matrix.format != "dia" else int(np.prod(matrix.data.shape, dtype=np.float64))
            # row and column (int64), their order, the values and a converted copy of each
            budget.check(8.0 * 6 * stored,
                         f"{name}: sorting the {stored} stored values of a {matrix.format.upper()} matrix by row",
                         "save it as CSR (scipy: m.tocsr()) or with fewer stored values")
            coo = matrix.tocoo(copy=False)
            row = np.asarray(coo.row, dtype=np.int64)
            order = np.argsort(row, kind="stable")  # within a row, the stored order (as scipy's tocsr)
            self._coo = (row[order], np.asarray(coo.col, dtype=np.int64)[order], np.asarray(coo.data)[order])
        self.matrix = matrix
        self.name = name
        self.n_rows, self.width = (int(v) for v in matrix.shape)
        if self._coo is not None:
            row, col, _ = self._coo
            bad = (row < 0) | (row >= self.n_rows) | (col < 0) | (col >= self.width)
            if bad.any():  # (scipy checks this when a matrix is made, not after its arrays change)
                i = int(np.flatnonzero(bad)[0])
                raise InputError(f"{name}: a stored value at row {int(row[i])}, column {int(col[i])} lies outside the "
                                 f"declared shape ({self.n_rows}, {self.width}); the file is damaged")
        self._csr = CsrRowsSource(name, matrix.shape, matrix.indptr, matrix.data, matrix.indices) \
            if matrix.format == "csr" else None

    def chunks(self, chunk_rows, start=0, stop=None):
        if self._csr is not None:
            yield from self._csr.chunks(chunk_rows, start, stop)
            return
        if self._coo is not None:
            yield from self._coo_chunks(chunk_rows, start, stop)
            return
        stop = self.n_rows if stop is None else min(stop, self.n_rows)
        for a in range(start, stop, chunk_rows):
            b = min(a + chunk_rows, stop)
            yield a, _float(self.matrix[a:b].toarray())

    @property
    def sparse_chunks(self):
        """:meth:`CsrRowsSource.sparse_chunks` for CSR and COO-like matrices (None for the
        formats converted a chunk at a time)."""
        if self._csr is not None:
            return self._csr.sparse_chunks
        if self._coo is not None:
            return self._coo_sparse_chunks
        return None

    def stored_per_row(self) -> float:
        return int(self.matrix.nnz) / max(self.n_rows, 1)

    def _coo_sparse_chunks(self, chunk_rows, start=0, stop=None):
        for a, piece in self._coo_pieces(chunk_rows, start, stop):
            for _, rows in piece.sparse_chunks(piece.n_rows):
                yield a, rows

    def _coo_chunks(self, chunk_rows, start, stop):
        """Chunks of the row-sorted coordinates: each chunk's entries, in their stored
        order, made CSR by scipy (duplicates summed as a whole-matrix conversion sums
        them) and densified as every CSR chunk is."""
        for a, piece in self._coo_pieces(chunk_rows, start, stop):
            for _, block in piece.chunks(piece.n_rows):
                yield a, block

    def _coo_pieces(self, chunk_rows, start, stop):
        import scipy.sparse as sp

        stop = self.n_rows if stop is None else min(stop, self.n_rows)
        check_chunk(self, chunk_rows, start, stop)
        row, col, val = self._coo
        self._check_stored(start, stop)  # before the first chunk: a bad value is not 10^18 empty rows away
        for a in range(start, stop, chunk_rows):
            b = min(a + chunk_rows, stop)
            lo, hi = (int(i) for i in np.searchsorted(row, [a, b]))
            part = sp.coo_matrix((val[lo:hi], (row[lo:hi] - a, col[lo:hi])), shape=(b - a, self.width)).tocsr()
            yield a, CsrRowsSource(self.name, part.shape, part.indptr, part.data, part.indices)

    def _check_stored(self, start, stop):
        """Every stored value of rows ``start:stop`` finite (:class:`DataError` naming the
        first bad row and column, as :func:`check_finite` would once its chunk came)."""
        row, col, val = self._coo
        lo, hi = (int(i) for i in np.searchsorted(row, [start, stop]))
        _first_nonfinite(self.name, row[lo:hi], col[lo:hi], val[lo:hi])

    def column_extremes(self, cols):
        """``(lo, hi)`` of each column of ``cols`` over all rows, from the stored values
        (duplicates added up in their stored order, as the chunks add them) and 0 for a
        column some row stores nothing in: no row is streamed, so a few bytes declaring
        2^62 rows are measured at once."""
        if self._coo is None:
            return None
        row, col, val = self._coo
        cols = np.asarray(cols, dtype=np.int64)
        pos = np.full(self.width, -1, dtype=np.int64)
        pos[cols] = np.arange(cols.size)
        keep = pos[col] >= 0  # (a value in another column is not measured, as when rows stream)
        _first_nonfinite(self.name, row[keep], col[keep], val[keep])
        r, c, v = row[keep], pos[col[keep]], np.asarray(val[keep], dtype=np.float64)
        order = np.lexsort((r, c))  # by column, then row; stable: duplicates in stored order
        r, c, v = r[order], c[order], v[order]
        new = np.ones(r.size, dtype=bool)
        new[1:] = (r[1:] != r[:-1]) | (c[1:] != c[:-1])
        group = np.cumsum(new) - 1
        sums = np.zeros(int(new.sum()))
        np.add.at(sums, group, v)  # one at a time, in order
        r, c = r[new], c[new]
        _first_nonfinite(self.name, r, cols[c], sums)  # duplicates that add up past the floats
        lo, hi = np.full(cols.size, np.inf), np.full(cols.size, -np.inf)
        np.minimum.at(lo, c, sums)
        np.maximum.at(hi, c, sums)
        rows_with = np.bincount(c, minlength=cols.size)  # distinct rows storing each column
        if self.n_rows:
            zero = rows_with < self.n_rows
            lo[zero], hi[zero] = np.minimum(lo[zero], 0.0), np.maximum(hi[zero], 0.0)
        return lo, hi


def _first_nonfinite(name, row, col, val) -> None:
    """:class:`DataError` for the first (by row, then column) of the stored values ``val``
    at ``(row, col)`` that is NaN or infinite; nothing when all are finite."""
    if val.dtype.kind != "f":
        return
    bad = np.flatnonzero(~np.isfinite(val))
    if bad.size:
        i = bad[np.lexsort((col[bad], row[bad]))[0]]
        raise DataError(f"{name}: row {int(row[i])}, column {int(col[i])}: value is {val[i]}; "
                        "remove or impute non-finite values before using rfsgen")


def is_scipy_sparse(obj) -> bool:
    """True for a ``scipy.sparse`` matrix or array.  Such an object exists only once its
    module is imported, so scipy.sparse is not imported to ask (19 MiB of a dense
    transform's peak memory, measured: docs/performance.md)."""
    sp = sys.modules.get("scipy.sparse")
    return sp is not None and sp.issparse(obj)


def is_anndata(obj) -> bool:
    """True for an ``anndata.AnnData`` (in memory or backed), recognised by what it has
    (X, layers, obs, obs_names, var_names): rfsgen's core never imports anndata."""
    return not isinstance(obj, (str, os.PathLike, np.ndarray)) and all(
        hasattr(obj, a) for a in ("X", "layers", "obs", "obs_names", "var_names"))


def anndata_matrix(adata, layer: str | None = None):
    """The matrix of ``adata`` rows are read from: ``X``, or ``layers[layer]``; backed
    (``backed="r"``) it is an h5py dataset or anndata's backed CSR dataset, read as
    they are.  Returns ``(matrix, name)``; a missing layer or an empty X is an
    :class:`InputError`."""
    if layer is not None:
        keys = list(adata.layers.keys())
        if layer not in keys:
            raise InputError(f"<AnnData>: has no layer {layer!r} (layers: {', '.join(map(repr, keys)) or 'none'}); "
                             "pass one of them as layer=, or layer=None for X")
        return adata.layers[layer], f"<AnnData layers[{layer!r}]>"
    if adata.X is None:
        raise InputError("<AnnData>: has no X (it is None); pass the rows as a layer with layer=NAME")
    return adata.X, "<AnnData X>"


def _from_anndata(adata, layer) -> InputSource:
    """Rows of an AnnData's X or layer, named by its ``obs_names`` (an output file
    carries them)."""
    import h5py

    matrix, name = anndata_matrix(adata, layer)
    group = getattr(matrix, "group", None)
    if isinstance(group, h5py.Group) and hasattr(matrix, "format"):  # backed sparse (anndata's CSRDataset)
        if matrix.format != "csr":
            raise InputError(f"{name}: is a backed {str(matrix.format).upper()} matrix; rfsgen reads rows, so it "
                             "needs CSR (adata.X = adata.X.tocsr() in memory, then write it again)")
        src = CsrRowsSource(name, matrix.shape, group["indptr"], group["data"], group["indices"])
    else:
        src = _from_memory(matrix)
        src.name = name
        if isinstance(src, SparseSource) and src._csr is not None:
            src._csr.name = name
    names = adata.obs_names
    if len(names) == src.n_rows:
        def read(a, b):
            out = [str(v) for v in names[a:b]]
            for i, v in enumerate(out):
                if "\x00" in v:  # HDF5 strings end at NUL: an output could not carry the name
                    raise InputError(f"{name}: row {a + i}: the row name {v!r} contains a NUL character; rename "
                                     "that row (obs_names) without it")
            return out

        src._row_names = read
    return src


def _from_memory(spec, layer: str | None = None) -> InputSource:
    """Wrap an in-memory object, or raise InputError saying what is accepted."""
    if is_anndata(spec):
        return _from_anndata(spec, layer)
    if layer is not None:
        raise UsageError(f"layer={layer!r} is for AnnData inputs (or an .h5ad path), not {type(spec).__name__}; "
                         "pass the rows themselves without layer=")
    what = type(spec).__name__
    accepted = ("pass a 2-D array (numpy, dask, h5py or zarr), a scipy.sparse matrix, a pandas DataFrame, "
                "a list of rows, or a path")
    if is_scipy_sparse(spec):
        return SparseSource(spec, f"<{what}>")
    if hasattr(spec, "to_numpy") and not hasattr(spec, "__array_function__"):  # pandas
        spec = spec.to_numpy()
    elif isinstance(spec, (list, tuple)):
        try:
            spec = np.asarray(spec, dtype=np.float64)
        except (ValueError, TypeError):
            raise InputError(f"<{what}>: cannot read rows from this {what} (ragged or not numbers); {accepted}") from None
    if not all(hasattr(spec, a) for a in ("shape", "dtype", "ndim", "__getitem__")):
        raise InputError(f"<{what}>: cannot read rows from {article(what)} {what}; {accepted}")
    if spec.ndim == 1:
        raise InputError(f"<{what}>: a 1-D array of {count(spec.shape[0], 'value')} is ambiguous: pass one row as "
                         "x.reshape(1, -1), or one column as x.reshape(-1, 1)")
    return ArraySource(spec, "<array>" if isinstance(spec, np.ndarray) else f"<{what}>")


def open_input(spec, stdin=None, layer: str | None = None) -> InputSource:
    """Open an input spec (see module docstring) or wrap an in-memory object.

    A ``str`` or ``os.PathLike`` is a path (or ``-``); anything else must be rows in
    memory: a 2-D array-like (numpy, dask, h5py, zarr), a ``scipy.sparse`` matrix,
    a pandas DataFrame, a list of rows, or an ``anndata.AnnData`` (its X, or the
    layer named ``layer``; backed too).  ``layer`` with an ``.h5ad`` path means its
    ``/layers/LAYER``.  Other objects are an :class:`InputError`.
    """
    if not isinstance(spec, (str, os.PathLike)):
        return _from_memory(spec, layer)
    spec = os.fspath(spec)
    if layer is not None:
        if _split_spec(spec)[1] is not None or not spec.lower().endswith(".h5ad"):
            raise UsageError(f"layer={layer!r} is for AnnData inputs (or an .h5ad path without ':/KEY'), not "
                             f"{spec!r}; give the path as FILE.h5ad:/layers/NAME instead")
        spec = f"{spec}:/layers/{layer}"
    if spec == "-":
        if stdin is None:
            stdin = getattr(sys.stdin, "buffer", None) if sys.stdin is not None else None
        return _open_stdin(stdin)
    path, key = _split_spec(spec)
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such input file; check the path")
    if p.is_dir():
        raise InputError(f"{path}: is a directory, not an input file")
    suffix = p.suffix.lower()
    try:
        if suffix == ".npy":
            _check_npy_file(p)
            try:
                arr = np.load(p, mmap_mode="r", allow_pickle=False)
            except Exception as e:  # a damaged header raises ValueError, SyntaxError, TypeError, ...
                detail = " ".join(str(e).split())[:160]
                raise InputError(f"{path}: not a readable .npy array ({detail}); rewrite it with numpy.save") from None
            return ArraySource(arr, str(p))
        if suffix == ".npz":
            return _open_npz(p, key)
        if suffix in HDF5_SUFFIXES:
            return _open_h5(p, key)
        if suffix in TEXT_SUFFIXES:
            f = open(p, "r", encoding="utf-8", errors="strict")
            try:
                return TextSource(f, str(p), None, closer=f.close)  # the delimiter is detected
            except (UsageError, DataError):
                f.close()
                raise
            except UnicodeDecodeError:
                f.close()
                raise InputError(f"{path}: is not UTF-8 text; a {suffix} input must be text") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read input ({e.strerror or e})") from None
    raise InputError(
        f"{path}: unknown input format '{suffix or '(no suffix)'}'; use .npy, .npz[:key], .h5[:/dataset], .csv, .tsv, .txt or -"
    )


def _npy_header(stream):
    """``(shape, fortran, dtype)`` from a ``.npy`` header on ``stream`` (then at its data)."""
    from numpy.lib import format as npformat

    version = npformat.read_magic(stream)
    reader = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
    return reader(stream)


def _check_npy_file(p: Path) -> None:
    """A ``.npy`` file's declared shape must fit in the file (before numpy maps it)."""
    try:
        with open(p, "rb") as fh:
            shape, _fortran, dtype = _npy_header(fh)
            offset = fh.tell()
    except OSError:
        raise
    except Exception:
        return  # an unreadable header: np.load says why below
    if not dtype.hasobject and all(int(v) >= 0 for v in shape):  # numpy reports the rest
        check_declared(str(p), shape, dtype.itemsize, p.stat().st_size - offset)


def _check_npz_member(p: Path, zf, member: str, what: str) -> None:
    """Before a member of an archive is loaded whole: its declared shape must fit in its
    uncompressed size, and that in the memory budget."""
    try:
        info = zf.getinfo(member)
        with zf.open(member) as fh:
            shape, _fortran, dtype = _npy_header(fh)
    except KeyError:
        return
    except Exception as e:
        raise InputError(f"{p}: member {member} is not a readable .npy array "
                         f"({' '.join(str(e).split())[:120]})") from None
    if dtype.hasobject:  # loading it is refused below (allow_pickle=False), with its message
        return
    check_declared(f"{p}:{member}", shape, dtype.itemsize, info.file_size, what)
    budget.check(declared_bytes(shape, dtype.itemsize) + info.file_size, f"{p}: loading {what} ({member})",
                 "save the rows as .npy or .h5, which are read in chunks")


def _archive(p: Path):
    import zipfile

    try:
        return zipfile.ZipFile(p)
    except Exception as e:
        raise InputError(f"{p}: not a readable .npz archive ({' '.join(str(e).split())[:120]})") from None


#: Members of a ``scipy.sparse.save_npz`` archive holding a CSR matrix.
SCIPY_CSR_KEYS = {"format", "shape", "data", "indices", "indptr"}


def _open_npz(p: Path, key):
    try:
        z = np.load(p, allow_pickle=False)
    except Exception as e:  # zipfile/pickle errors vary
        raise InputError(f"{p}: not a readable .npz archive ({e})") from None
    keys = list(z.files)
    if key is None and {"format", "shape", "data"} <= set(keys):  # scipy.sparse.save_npz
        try:
            return _open_scipy_npz(p, z)
        finally:
            z.close()
    if key is None:
        if len(keys) != 1:
            z.close()
            raise InputError(f"{p}: holds {len(keys)} arrays ({', '.join(keys)}); choose one as {p}:KEY")
        key = keys[0]
    if key not in keys:
        z.close()
        raise InputError(f"{p}: has no array '{key}' (available: {', '.join(keys)})")
    try:
        with _archive(p) as zf:
            _check_npz_member(p, zf, key + ".npy", f"array '{key}'")
    except BaseException:
        z.close()
        raise
    try:
        arr = z[key]
    except Exception as e:  # object arrays (pickles), damaged members
        detail = " ".join(str(e).split())[:160]
        raise InputError(f"{p}:{key}: not a readable numeric array ({detail}); save numbers with numpy.savez") from None
    finally:
        z.close()
    return ArraySource(arr, f"{p}:{key}")


def _open_scipy_npz(p: Path, z):
    """A matrix written by ``scipy.sparse.save_npz``.  CSR is streamed: ``indptr`` is
    read whole (8 bytes a row), ``data`` and ``indices`` a chunk at a time from the
    archive; other formats are loaded as they are (their nonzeros, never dense)."""
    import zipfile

    try:
        fmt = z["format"].item()
        fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
        shape = tuple(int(v) for v in z["shape"])
    except Exception:
        raise InputError(f"{p}: looks like a scipy.sparse archive but its 'format'/'shape' are unreadable; "
                         "rewrite it with scipy.sparse.save_npz") from None
    if len(shape) != 2:
        raise InputError(f"{p}: holds a sparse matrix of shape {shape}; rows need a 2-D matrix")
    if shape[0] < 0 or shape[1] < 0:
        raise InputError(f"{p}: the sparse matrix declares shape {shape}; the file is damaged")
    with _archive(p) as zf:
        for member in zf.namelist():  # members loaded whole (CSR's data and indices stream)
            if member not in ("format.npy", "shape.npy") and (fmt != "csr" or member == "indptr.npy"):
                _check_npz_member(p, zf, member, f"the {fmt.upper()} matrix's {member[:-4]}")
    if fmt != "csr":
        import scipy.sparse as sp

        try:
            m = sp.load_npz(p)
        except Exception as e:
            raise InputError(f"{p}: not a readable scipy.sparse archive ({' '.join(str(e).split())[:160]})") from None
        return SparseSource(m, str(p))
    if not SCIPY_CSR_KEYS <= set(z.files):
        raise InputError(f"{p}: a CSR archive needs {', '.join(sorted(SCIPY_CSR_KEYS))}; rewrite it with "
                         "scipy.sparse.save_npz")
    indptr = z["indptr"]
    zf = zipfile.ZipFile(p)
    try:
        data = _NpyMember(zf, "data.npy", p)
        indices = _NpyMember(zf, "indices.npy", p)
    except BaseException:
        zf.close()
        raise
    return CsrRowsSource(str(p), shape, indptr, data, indices, closer=zf.close)


class _NpyMember:
    """A 1-D ``.npy`` member of a zip archive read forwards in slices, so that a
    compressed member is never decompressed whole.  Slices must not go backwards."""

    def __init__(self, zf, member: str, path):
        from numpy.lib import format as npformat

        self.path = path
        try:
            self.stream = zf.open(member)
            version = npformat.read_magic(self.stream)
            reader = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
            shape, _fortran, self.dtype = reader(self.stream)
        except Exception as e:
            raise InputError(f"{path}: member {member} is not a readable .npy array "
                             f"({' '.join(str(e).split())[:120]})") from None
        if self.dtype.hasobject:
            raise InputError(f"{path}: member {member} holds Python objects, not numbers")
        check_declared(f"{path}:{member}", shape, self.dtype.itemsize, zf.getinfo(member).file_size)
        self.shape = tuple(shape)
        self.ndim = len(shape)
        self.pos = 0

    def __getitem__(self, sl: slice) -> np.ndarray:
        a, b = sl.start, sl.stop
        if a < self.pos:
            raise InputError(f"{self.path}: a compressed archive is read forwards only")
        size = self.dtype.itemsize
        if a > self.pos:
            self.stream.seek((a - self.pos) * size, 1)
        buf = self.stream.read((b - a) * size)
        if len(buf) != (b - a) * size:
            raise InputError(f"{self.path}: the archive ended early (truncated?); re-create it")
        self.pos = b
        return np.frombuffer(buf, dtype=self.dtype)


def _encoding(obj) -> str:
    v = obj.attrs.get("encoding-type", "")
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


#: Soft links followed at most this deep (HDF5's own limit is 16); deeper is a loop.
MAX_LINK_HOPS = 16


def _h5_get(f, key: str, p: Path, hops: int = 0, asked: str | None = None):
    """``f[key]`` resolved one link at a time, inside the file only: a soft link is
    followed (at most :data:`MAX_LINK_HOPS` deep, so a loop is an error, not a hang);
    an external link is refused.  None when a component does not exist."""
    import h5py

    asked = key if asked is None else asked  # the dataset the user named, for messages
    obj = f["/"] if key.startswith("/") else f
    parts = [q for q in key.split("/") if q]
    for i, part in enumerate(parts):
        here = "/" + "/".join(parts[:i + 1])
        if not isinstance(obj, h5py.Group):
            return None
        try:
            link = obj.get(part, getlink=True)
        except Exception:
            link = None
        if link is None:
            return None
        if isinstance(link, h5py.ExternalLink):
            raise InputError(f"{p}:{asked}: '{here}' is an external link (to {link.filename}:{link.path}); rfsgen reads "
                             "only data inside the file: copy the data in")
        if isinstance(link, h5py.SoftLink):
            if hops >= MAX_LINK_HOPS:
                raise InputError(f"{p}:{asked}: soft links nest more than {MAX_LINK_HOPS} deep at '{here}' (a loop?); "
                                 "the file is damaged or crafted")
            target = link.path if link.path.startswith("/") else obj.name.rstrip("/") + "/" + link.path
            obj = _h5_get(f, target, p, hops + 1, asked)
            if obj is None:
                return None
            continue
        try:
            obj = obj[part]
        except Exception as e:
            raise InputError(f"{p}:{asked}: cannot open '{here}' ({' '.join(str(e).split())[:120]}); the file is "
                             "damaged") from None
    return obj


def _check_dataset(ds, p: Path, key: str, what: str = "the dataset") -> None:
    """A dataset from a file that came from elsewhere, before a byte of it is read:
    stored inside the file (no external storage, no virtual dataset), a declared shape
    that an uncompressed contiguous dataset's file can hold, HDF5 chunks that fit in
    the memory budget."""
    name = f"{p}:{key}"
    try:
        external = ds.external
        virtual = ds.is_virtual
        chunks = ds.chunks
        shape, itemsize = ds.shape, ds.dtype.itemsize
    except Exception as e:
        raise InputError(f"{name}: cannot read {what}'s layout ({' '.join(str(e).split())[:120]}); the file is damaged") from None
    if external:
        raise InputError(f"{name}: {what} keeps its data in external files ({external[0][0]!s}); rfsgen reads only "
                         "data inside the file: copy it in (h5py: write the array to a new dataset)")
    if virtual:
        raise InputError(f"{name}: {what} is a virtual dataset (data from other files); rfsgen reads only data "
                         "inside the file: copy it in")
    if shape is None:
        raise InputError(f"{name}: {what} has no shape (an empty HDF5 dataspace); the file is damaged")
    if chunks is None:  # contiguous or compact: unfiltered, every byte inside the file
        check_declared(name, shape, itemsize, p.stat().st_size, what)
    else:
        check_declared(name, shape, itemsize, None, what)
    if chunks is not None:
        budget.check(declared_bytes(chunks, itemsize), f"{name}: one HDF5 chunk of {what} (shape {tuple(chunks)})",
                     "rewrite the file with smaller chunks")
        # HDF5 stores a chunk when any of it is written; chunks never written read as the
        # fill value.  Rows that were never written are a writer that stopped early (or a
        # forged header declaring 10^9 rows in a kilobyte), never data.
        want = math.prod(-(-n // c) for n, c in zip(shape, chunks))
        try:
            have = ds.id.get_num_chunks()
        except Exception as e:
            raise InputError(f"{name}: cannot read {what}'s chunk index ({' '.join(str(e).split())[:120]}); the "
                             "file is damaged") from None
        if have < want:
            raise InputError(f"{name}: only {have:,} of the {want:,} HDF5 chunks of {what} (shape {tuple(shape)}) "
                             "were ever written, and the rest would read as the fill value; the file is "
                             "incomplete (its writer stopped early?): write it again")


def _open_h5(p: Path, key):
    """An HDF5 dataset, or a CSR group in the anndata encoding (``encoding-type:
    csr_matrix`` with data, indices, indptr).  ``file.h5ad`` alone means its ``X``."""
    import h5py

    try:
        f = h5py.File(p, "r")
    except OSError:
        raise InputError(f"{p}: not a readable HDF5 file") from None
    try:
        if key is None and p.suffix.lower() == ".h5ad":
            key = "/X"
        names = []

        def visit(n, o):
            if isinstance(o, h5py.Group) and _encoding(o).endswith("_matrix"):
                names.append("/" + n)
            elif isinstance(o, h5py.Dataset) and not _encoding(o.parent).endswith("_matrix"):
                names.append("/" + n)

        if key is None:
            try:
                f.visititems(visit)
            except InputError:
                raise
            except Exception as e:
                raise InputError(f"{p}: cannot list its datasets ({' '.join(str(e).split())[:120]}); the file is "
                                 "damaged") from None
            if len(names) != 1:
                raise InputError(f"{p}: holds {len(names)} datasets ({', '.join(names[:6])}); choose one as {p}:/PATH")
            key = names[0]
        obj = _h5_get(f, key, p)
        if isinstance(obj, h5py.Group) and _encoding(obj) == "csr_matrix":
            src = _h5_csr(f, obj, p, key)
        elif isinstance(obj, h5py.Group) and _encoding(obj).endswith("_matrix"):
            raise InputError(f"{p}:{key}: is a {_encoding(obj)}; rfsgen reads rows, so it needs CSR (in Python: "
                             "adata.X = adata.X.tocsr(), then write it again)")
        elif isinstance(obj, h5py.Dataset):
            _check_dataset(obj, p, key)
            src = ArraySource(obj, f"{p}:{key}", closer=f.close,
                              row_names=_obs_names(f, p, key, obj.shape[0] if obj.ndim else 0))
            src.obs_columns = _obs_columns(f, p, key, src.n_rows)
        else:
            if not names:
                try:
                    f.visititems(visit)
                except Exception:
                    pass
            raise InputError(f"{p}: has no dataset or CSR group '{key}' (available: {', '.join(names[:6]) or 'none'})")
        return src
    except BaseException:
        f.close()
        raise


def _h5_csr(f, g, p, key):
    import h5py

    parts = {}
    for part in ("data", "indices", "indptr"):
        ds = _h5_get(f, g.name.rstrip("/") + "/" + part, p)
        if not isinstance(ds, h5py.Dataset):
            raise InputError(f"{p}:{key}: the CSR group has no '{part}' dataset; the file is damaged")
        _check_dataset(ds, p, ds.name, f"the CSR matrix's {part}")
        parts[part] = ds
    try:
        shape = g.attrs.get("shape")
        shape = None if shape is None else tuple(int(v) for v in np.asarray(shape).ravel())
    except Exception:
        shape = ()
    if shape is None or len(shape) != 2:
        raise InputError(f"{p}:{key}: the CSR group has no 2-D 'shape' attribute; rewrite it with anndata")
    names = _obs_names(f, p, key, shape[0])
    src = CsrRowsSource(f"{p}:{key}", shape, parts["indptr"], parts["data"], parts["indices"], closer=f.close,
                        row_names=names)
    src.obs_columns = _obs_columns(f, p, key, shape[0])
    return src


def _obs_columns(f, p, key, n_rows):
    """For an AnnData file's X or layers: its ``obs`` columns (:class:`rfsgen.obs.ObsColumns`),
    checked now, before any output exists; None when there are none."""
    if not (key in ("/X", "X") or key.lstrip("/").startswith("layers/")):
        return None
    import h5py

    from . import obs as obs_mod

    g = _h5_get(f, "/obs", p)
    if not isinstance(g, h5py.Group) or _encoding(g) != "dataframe":
        return None

    def get(group, name, where):
        return _h5_get(f, group.name.rstrip("/") + "/" + name, p)

    def fail(where, what):
        fix = "" if "drop" in what else "; the file is damaged: drop that obs column or write the file again with anndata"
        return InputError(f"{p}:/{where}: {what}{fix}")

    def check(ds, where):
        _check_dataset(ds, p, "/" + where, "the obs column")

    try:
        columns = obs_mod.describe(g, n_rows, get, fail, check)
    except InputError:
        raise
    except Exception as e:  # h5py's own errors on damaged metadata
        raise InputError(f"{p}:/obs: cannot read its columns ({' '.join(str(e).split())[:120]}); the file is "
                         "damaged") from None
    return obs_mod.from_file(g, columns) if columns else None


def _obs_names(f, p, key, n_rows):
    """For an AnnData file's X or layers: a reader of the ``obs`` index (row names),
    ``(start, stop) -> list[str]``; None when the file has none that fits."""
    if not (key in ("/X", "X") or key.lstrip("/").startswith("layers/")):
        return None
    import h5py

    obs = _h5_get(f, "/obs", p)
    if not isinstance(obs, h5py.Group) or _encoding(obs) != "dataframe":
        return None
    index = obs.attrs.get("_index")
    index = index.decode("utf-8", "replace") if isinstance(index, bytes) else index
    if not isinstance(index, str) or not index or "\x00" in index:
        return None
    ds = _h5_get(f, "/obs/" + index.strip("/"), p)
    if not isinstance(ds, h5py.Dataset) or ds.shape != (n_rows,) or ds.dtype.kind not in "OSU":
        return None
    _check_dataset(ds, p, ds.name, "the row names (obs index)")

    def read(start, stop):
        try:
            raw = ds[start:stop]
        except Exception as e:
            raise InputError(f"{p}:{ds.name}: rows {start}:{stop}: cannot read the row names "
                             f"({' '.join(str(e).split())[:120]}); the file is damaged") from None
        out = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in raw]
        for i, v in enumerate(out):
            if "\x00" in v:  # HDF5 strings end at NUL: the output could not carry the name
                raise InputError(f"{p}:{ds.name}: row {start + i}: the row name {v!r} contains a NUL character; "
                                 "rename that row (obs index) without it")
        return out

    return read


def _open_stdin(stream) -> InputSource:
    if stream is None or getattr(stream, "closed", False):
        raise InputError("<stdin>: standard input is closed; pipe rows into rfsgen or give a file")
    if not hasattr(stream, "peek"):  # buffered here, never read whole: memory follows the chunk
        stream = _io.BufferedReader(_Unbuffered(stream))
    head = stream.peek(6)[:6]
    if head == b"\x93NUMPY":
        return _npy_stream(stream)
    text = _io.TextIOWrapper(stream, encoding="utf-8")
    return TextSource(text, "<stdin>", None)


class _Unbuffered(_io.RawIOBase):
    """A byte stream with only ``read(n)`` as a raw stream that ``io.BufferedReader``
    can buffer (for ``peek``)."""

    def __init__(self, stream):
        self.stream = stream

    def readable(self):
        return True

    def readinto(self, b):
        data = self.stream.read(len(b))
        n = len(data)
        b[:n] = data
        return n


def _npy_stream(stream) -> InputSource:
    from numpy.lib import format as npformat

    try:
        version = npformat.read_magic(stream)
        reader = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
        shape, fortran, dtype = reader(stream)
    except Exception as e:  # damaged headers raise ValueError, SyntaxError, ...
        raise InputError(f"<stdin>: not a readable .npy stream ({' '.join(str(e).split())[:160]})") from None
    if fortran and len(shape) > 1:
        raise InputError("<stdin>: Fortran-ordered .npy cannot be streamed; save it C-ordered")
    if dtype.hasobject:
        raise InputError("<stdin>: the .npy stream holds Python objects, not numbers")
    check_declared("<stdin>", shape, dtype.itemsize)

    class _Rows:
        def __init__(self):
            self.shape = shape
            self.ndim = len(shape)
            self.dtype = dtype
            self.pos = 0
            self.row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize

        def __getitem__(self, sl):
            a, b = sl.start, sl.stop
            if a < self.pos:
                raise InputError("<stdin>: a stream cannot be read backwards")
            if a > self.pos:
                _skip(stream, (a - self.pos) * self.row_bytes, f"<stdin>: the .npy stream ended before row {a} "
                      f"(its header declares {shape[0]} rows; truncated input)")
            buf = stream.read((b - a) * self.row_bytes)
            if len(buf) != (b - a) * self.row_bytes:
                raise InputError("<stdin>: the .npy stream ended early (truncated input)")
            self.pos = b
            return np.frombuffer(buf, dtype=dtype).reshape((b - a,) + tuple(shape[1:]))

    src = ArraySource(_Rows(), "<stdin>")
    src.declared_only = True
    return src


#: Bytes read at a time when a stream is skipped forwards (the rows before --rows START).
SKIP_PIECE = 1 << 20


def _skip(stream, nbytes: int, ended: str) -> None:
    """Read and drop ``nbytes`` of ``stream`` in pieces of at most :data:`SKIP_PIECE`
    bytes (memory never follows the gap); a stream that ends first is an
    :class:`InputError` with the message ``ended``."""
    left = int(nbytes)
    while left > 0:
        got = stream.read(min(left, SKIP_PIECE))
        if not got:
            raise InputError(ended)
        left -= len(got)


# ----------------------------------------------------------------------------- row ranges
def parse_rows(spec: str | None):
    """``'START:STOP'`` (either side optional) -> (start, stop or None)."""
    if spec is None:
        return 0, None
    m = re.fullmatch(r"\s*(\d*)\s*:\s*(\d*)\s*", spec)
    if not m:
        raise UsageError(f"--rows '{spec}' must look like START:STOP, e.g. 0:1000 or 5000:")
    start = int(m.group(1)) if m.group(1) else 0
    stop = int(m.group(2)) if m.group(2) else None
    if stop is not None and stop < start:
        raise UsageError(f"--rows '{spec}': STOP is before START")
    return start, stop


def resolve_rows(spec, n_rows: int | None, source: str):
    """``--rows START:STOP`` against an input of ``n_rows`` rows (None: a stream of
    unknown length).  A range past the end is an error naming the row count, never a
    silent clamp.  Returns ``(start, stop or None)``."""
    start, stop = parse_rows(spec)
    if n_rows is None:
        return start, stop
    if start > n_rows or (stop is not None and stop > n_rows):
        raise UsageError(f"--rows {spec}: {source} has {n_rows} rows (0:{n_rows}); choose a range inside it")
    return start, n_rows if stop is None else stop


def shard_rows(spec: str, n_rows: int | None, source: str):
    """``--shard K/N``: the K-th (0-based) of N nearly equal contiguous row ranges of an
    input of ``n_rows`` rows, ``(K n // N, (K + 1) n // N)``, so a job array's tasks
    cover every row exactly once.  Returns ``(start, stop)``."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(spec))
    if not m:
        raise UsageError(f"--shard '{spec}' must look like K/N, e.g. 0/4 (K counts from 0)")
    k, n = int(m.group(1)), int(m.group(2))
    if n < 1 or k >= n:
        raise UsageError(f"--shard {spec}: K must be 0 to N - 1 and N at least 1")
    if n_rows is None:
        raise UsageError(f"--shard needs an input of known length, but {source} is a stream; use --rows START:STOP")
    return k * n_rows // n, (k + 1) * n_rows // n


def check_finite(x: np.ndarray, row0: int, source: str):
    """Raise :class:`DataError` naming the first row/column holding NaN or inf."""
    bad = ~np.isfinite(x)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise DataError(
            f"{source}: row {row0 + int(r)}, column {int(c)}: value is {x[r, c]}; "
            "remove or impute non-finite values before using rfsgen"
        )


def check_width(src: InputSource, width: int, skeleton_path: str, shape=None, *, origin: str | None = None,
                fix: str | None = None):
    """Raise :func:`width_error` unless ``src``'s rows have ``width`` values."""
    if src.width != width:
        detected = getattr(src, "detected", None)  # text: the delimiter and header it was read with
        name = f"{src.name} (read as {detected})" if detected else src.name
        raise width_error(name, src.width, width, skeleton_path, shape, origin=origin, fix=fix)


def width_error(name: str, got, width: int, skeleton_path: str, shape=None, *, origin: str | None = None,
                fix: str | None = None) -> InputError:
    """The one line for rows of ``got`` values where ``width`` are expected.

    ``origin`` says where ``width`` came from when the skeleton says ``width: auto`` (a
    feature file sampled with ``--width``, the first input of a kernel), so that the
    message does not ask to fix the skeleton's input; ``fix`` then says what to do."""
    have = count(got, "value") if isinstance(got, int) else f"shape {got}"
    if origin is not None:
        fix = fix or f"pass rows of {count(width, 'value')}"
        return InputError(f"{name}: rows have {have} but the width {width} comes from {origin}, not from skeleton "
                          f"'{skeleton_path}' (it says 'width: auto'); {fix}")
    want = f"width {width}" + (f" (shape {list(shape)})" if shape else "")
    return InputError(f"{name}: rows have {have} but skeleton '{skeleton_path}' expects {want}; "
                      "pass matching rows or fix the skeleton's input")
