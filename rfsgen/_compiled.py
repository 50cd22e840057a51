"""rfsgen's compiled loops (numba): the transform's products of factor values into
columns and its input preparation, and the sampler's per-draw hashing and the
bookkeeping of its walk between random draws.

Kept apart so that the rest imports without compiling anything.  numba is a required
dependency (not optional) so that the output never depends on whether it is
installed; see docs/performance.md for the measurements behind it.

The row loops are compiled serial, over a range of rows, and :func:`on_rows` runs
parts of the rows on Python threads (the loops release the GIL): the calling thread and
a pool of worker threads started once per process (:class:`_Pool`).  numba's own
``parallel=True`` doubles a loop's compile time (the first run after installing
took 8 s instead of 4.4 s for the columns loop alone), and under numba's workqueue
threading layer (its fallback where neither TBB nor OpenMP is installed) a parallel
loop entered from two threads at once aborts the process; each row's values never
depend on how the rows are split, so the bytes are the same either way.  Inside
the loops, arrays are filled element by element rather than by slice assignment:
numba compiles a slice assignment into generic broadcasting code that took 3 s of
the columns loop's 4.3 s compile.
"""

from __future__ import annotations

import math
import os
import queue
import threading

import numpy as np

from ._signals import deferred, reached

with deferred():  # importing numba initialises LLVM under llvmlite's lock: no signal may unwind through it
    import numba

from ._vector import LANES as TILE  # rows per tile: one lane row = one 64-byte line of float64
from ._sincos import sincos, sincos_into
from ._vector import LOG_BLOCKS, gather, log_moduli, log_sums, power_row, product, product_real, transpose_out


def threads() -> int:
    """The number of threads the loops use: numba's (``NUMBA_NUM_THREADS``,
    ``numba.set_num_threads``)."""
    return int(numba.get_num_threads())


def _rows_for(values_per_row: int) -> int:
    """Rows worth a thread of their own: about 65,536 values of simple work (starting a
    thread costs tens of microseconds)."""
    return max(1, 65536 // max(1, values_per_row))


def row_parts(m: int, align: int = 1, min_rows: int = 1) -> list:
    """Where :func:`on_rows` cuts rows ``[0, m)``: ``[0, ..., m]``, one part per thread (at
    most :func:`threads`, each at least ``min_rows`` rows and starting at a multiple of ``align``)."""
    parts = max(1, min(threads(), m // max(min_rows, 1)))
    return [(m * i // parts) // align * align for i in range(parts)] + [m]


class _Job:
    """One :func:`run_parts` call: its parts, claimed one at a time by the calling thread and
    by pool workers (whoever is free), and the count of parts not yet finished."""

    __slots__ = ("kernel", "args", "cuts", "next", "left", "lock", "done", "error")

    def __init__(self, kernel, cuts, args):
        self.kernel, self.args, self.cuts = kernel, args, cuts
        self.next = 0
        self.left = len(cuts) - 1
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error = None

    def work(self) -> None:
        """Run unclaimed parts until none is left."""
        while True:
            with self.lock:
                i = self.next
                if i >= len(self.cuts) - 1:
                    return
                self.next = i + 1
            try:
                self.kernel(*self.args, self.cuts[i], self.cuts[i + 1])
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                with self.lock:
                    if self.error is None:
                        self.error = e
            finally:
                with self.lock:
                    self.left -= 1
                    if not self.left:
                        self.done.set()


class _Pool:
    """Worker threads started once per process and reused by every :func:`run_parts` call
    (starting threads on every call took up to 0.15 s of a 1.3 s transform under load).
    Jobs from several Python threads at once share the workers; each caller also works on
    its own job's parts, so that it finishes even when every worker is busy elsewhere."""

    def __init__(self):
        self.pid = os.getpid()
        self.tasks = queue.SimpleQueue()
        self.workers = []
        self.lock = threading.Lock()

    def grow(self, n: int) -> None:
        if len(self.workers) >= n:
            return
        with self.lock:
            while len(self.workers) < n:
                t = threading.Thread(target=self._serve, name=f"rfsgen-rows-{len(self.workers) + 1}", daemon=True)
                t.start()
                self.workers.append(t)

    def _serve(self) -> None:
        _local.worker = True
        while True:
            job = self.tasks.get()
            job.work()
            job = None  # (held while waiting, it would keep the last job's arrays, a file map among them, alive)


_local = threading.local()
_pool = None
_pool_lock = threading.Lock()


def _the_pool() -> _Pool:
    """This process's pool; a pool made before a fork is never used in the child (its
    threads do not exist there, and its locks may have been held at the fork)."""
    global _pool
    pool = _pool
    if pool is None or pool.pid != os.getpid():
        with _pool_lock:
            if _pool is None or _pool.pid != os.getpid():
                _pool = _Pool()
            pool = _pool
    return pool


def _forget_pool() -> None:
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def run_parts(kernel, cuts: list, *args) -> None:
    """Run ``kernel(*args, cuts[i], cuts[i + 1])`` for each part, on this thread and the
    process's pool of worker threads (:class:`_Pool`), and wait for all of them.  Each
    part's values depend only on its rows, so the bytes are the same whichever thread
    runs it.  Called from a pool worker, the parts run on that thread."""
    if len(cuts) <= 2 or getattr(_local, "worker", False):
        for a, b in zip(cuts[:-1], cuts[1:]):
            kernel(*args, a, b)
        return
    job = _Job(kernel, cuts, args)
    pool = _the_pool()
    helpers = len(cuts) - 2
    pool.grow(helpers)
    for _ in range(helpers):
        pool.tasks.put(job)
    try:
        job.work()
        job.done.wait()
    except BaseException:
        # A signal raised while waiting: the workers still write into the caller's arrays;
        # let them finish before the exception unwinds (as a thread pool's shutdown did).
        while not job.done.wait(0.05):
            pass
        raise
    if job.error is not None:
        raise job.error


def on_rows(kernel, m: int, *args, align: int = 1, min_rows: int = 1) -> None:
    """Run ``kernel(*args, r0, r1)`` over rows ``[0, m)`` split into contiguous parts,
    one per thread (at most :func:`threads`, each at least ``min_rows`` rows and
    starting at a multiple of ``align``), and wait for all of them."""
    run_parts(kernel, row_parts(m, align, min_rows), *args)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _columns(src, ir, cr, ii, ci, xatom, xpow, fidx, fptr, sc, imag, pos, real, out, start, stop):  # pragma: no cover - compiled
    """Products of factor values into output columns, for rows ``start:stop`` of ``src``.

    Inputs (the static ones built once by :class:`rfsgen.transform.Transformer`):

    * ``src`` float64 ``(m, s)`` C order: the rows' source values;
    * atom ``k`` is ``cr[k] * src[:, ir[k]] + 1j * ci[k] * src[:, ii[k]]`` (real when
      ``ii[k] < 0``); ``ir, ii`` int64 ``(a,)``, ``cr, ci`` float64 ``(a,)``;
    * factor ``f`` is atom ``f`` for ``f < a`` and atom ``xatom[e]`` raised to
      ``xpow[e]`` for ``f = a + e`` (int64 ``(e,)`` each);
    * columns are stored in an order of positions (by number of factors, so that the
      loop's branches are predictable): position ``p`` multiplies factors
      ``fidx[fptr[p]:fptr[p + 1]]`` in that order, then stores ``sc[p]`` times the
      real part, or the imaginary part when ``imag[p]``; ``pos[j]`` is the position
      of output column ``j``.  int64 ``fidx (nnz,)``, ``fptr (D + 1,)``, ``pos (D,)``;
      float64 ``sc (D,)``; bool ``imag (D,)``;
    * ``real`` bool ``(D,)`` by position: the column's factors are all real (their
      imaginary parts zeros: atoms with ``ii < 0`` and their powers) and it takes the
      real part; its product is then taken one multiply a factor
      (:func:`rfsgen._vector.product_real`), and again as a complex product in the rare
      tiles where a lane is zero, so the bits are the complex product's;
    * ``out`` float32 or float64 ``(m, D)`` C order, overwritten;
    * ``start, stop``: the rows to compute (``start`` a multiple of 8).

    Rows go in tiles of 8: a tile's atoms are gathered into lane rows (8 float64 per
    atom, one cache line), each column's complex product runs in 8-lane vector
    operations in float64 (:mod:`rfsgen._vector`), the scaled result goes into a
    column-major tile in the output dtype, and 8 x 8 blocks of the tile are
    transposed into the output rows.  Negative powers occur only for unit-modulus
    factors, where z^-k = conj(z)^k.  Each output value depends only on its own row
    and is computed the same way whatever the thread count or number of rows.
    """
    n_atoms = ir.size
    fr, fi, tile = tile_buffers(n_atoms + xatom.size, out)
    part = np.zeros((TILE, src.shape[1]))  # the last, partial tile's rows, zero-padded
    for r0 in range(start, stop, TILE):
        n = min(TILE, stop - r0)
        rows = src
        first = r0
        if n < TILE:
            for t in range(n):
                for c in range(src.shape[1]):
                    part[t, c] = src[r0 + t, c]
            rows = part
            first = 0
        for k in range(n_atoms):
            gather(rows, first, ir[k], cr[k], fr, k)
            if ii[k] >= 0:
                gather(rows, first, ii[k], ci[k], fi, k)
            else:
                for t in range(TILE):
                    fi[k, t] = 0.0
        tile_columns(fr, fi, n_atoms, xatom, xpow, fidx, fptr, sc, imag, pos, real, tile, out, r0, n)


@numba.njit(cache=True, nogil=True)
def tile_buffers(n_factors, out):  # pragma: no cover - compiled
    """The lane rows ``(fr, fi)`` (float64 ``(n_factors + 1, TILE)``: the factors, then the
    factor 1 for :func:`tile_columns`) and the column-major tile (``(D,
    TILE)`` of ``out``'s dtype) of one thread's product loop."""
    fr = np.empty((n_factors + 1, TILE))
    fi = np.empty((n_factors + 1, TILE))
    for t in range(TILE):
        fr[n_factors, t] = 1.0
        fi[n_factors, t] = 0.0
    return fr, fi, np.empty((out.shape[1], TILE), dtype=out.dtype)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def tile_columns(fr, fi, n_atoms, xatom, xpow, fidx, fptr, sc, imag, pos, real, tile, out, r0, n):  # pragma: no cover
    """The columns of one tile of rows ``r0:r0 + n`` (n <= TILE) whose atoms fill lane rows
    ``0:n_atoms`` of ``(fr, fi)`` (from :func:`tile_buffers`): the powers ``xatom, xpow``
    raised into the next lane rows, each column's product (:func:`_columns`' arrays), and
    the tile moved into ``out``'s rows (only its first ``n`` lanes)."""
    d = out.shape[1]
    n_factors = n_atoms + xatom.size
    one = n_factors  # the lane row holding the factor 1 (columns without terms)
    d8 = d - d % TILE
    for e in range(xatom.size):
        power_row(fr, fi, xatom[e], xpow[e], n_atoms + e)
    for p in range(d):
        q0 = fptr[p]
        q1 = fptr[p + 1]
        if q1 > q0:
            if real[p] and not product_real(fr, fidx[q0], fidx, q0 + 1, q1, sc[p], tile, p):
                continue
            product(fr, fi, fidx[q0], fidx, q0 + 1, q1, imag[p], sc[p], tile, p)
        else:
            product(fr, fi, one, fidx, q0, q0, imag[p], sc[p], tile, p)
    if n == TILE:
        for j in range(0, d8, TILE):
            transpose_out(tile, pos, j, out, r0)
        for t in range(TILE):
            for j in range(d8, d):
                out[r0 + t, j] = tile[pos[j], t]
    else:
        for t in range(n):
            for j in range(d):
                out[r0 + t, j] = tile[pos[j], t]


def check_products(n_atoms, xatom, xpow, fidx, fptr, sc, imag, pos, real, out, m) -> None:
    """Raise ValueError unless the product loop's arrays (:func:`_columns`) keep every read
    and write inside them for ``m`` rows of ``n_atoms`` atoms into ``out``: contiguous
    1-D arrays of their types and sizes, ``fptr`` non-decreasing from 0 into ``fidx``,
    factors below ``n_atoms + xatom.size``, powers of atoms below ``n_atoms``, ``pos`` a
    permutation's values below D, ``out`` C-ordered ``(m, D)`` float32 or float64.  Built
    from a checked feature file they always do; this keeps the compiled loop in bounds
    whatever a caller passes (O(D + nnz), against the loop's O(m nnz))."""
    def flat(a, kind):
        return isinstance(a, np.ndarray) and a.ndim == 1 and a.flags.c_contiguous and a.dtype.kind == kind

    D = fptr.size - 1 if isinstance(fptr, np.ndarray) else -1
    ok = (all(flat(a, "i") for a in (xatom, xpow, fidx, fptr, pos)) and flat(sc, "f") and flat(imag, "b")
          and flat(real, "b") and D >= 0 and xatom.size == xpow.size and sc.size == imag.size == pos.size == real.size == D
          and isinstance(out, np.ndarray) and out.ndim == 2 and out.flags.c_contiguous
          and out.dtype in (np.float32, np.float64) and out.shape == (m, D))
    if ok and fptr.size:
        ok = int(fptr[0]) == 0 and bool(np.all(np.diff(fptr) >= 0)) and int(fptr[-1]) <= fidx.size
    if ok and fidx.size:
        ok = 0 <= int(fidx.min()) and int(fidx.max()) < n_atoms + xatom.size
    if ok and xatom.size:
        ok = 0 <= int(xatom.min()) and int(xatom.max()) < n_atoms
    if ok and D:
        ok = 0 <= int(pos.min()) and int(pos.max()) < D
    if not ok:
        raise ValueError("the product loop's arrays do not fit one another or the output")


def columns(src, ir, cr, ii, ci, xatom, xpow, fidx, fptr, sc, imag, pos, out, real=None) -> None:
    """:func:`_columns` over all rows of ``src``, on :func:`threads` threads (``real``: by
    default no column takes the real-factor path)."""
    if real is None:
        real = np.zeros(fptr.size - 1, np.bool_)
    check_products(ir.size, xatom, xpow, fidx, fptr, sc, imag, pos, real, out, src.shape[0])
    if not (ir.size == ii.size == cr.size == ci.size and src.ndim == 2 and src.flags.c_contiguous
            and (not ir.size or (0 <= int(ir.min()) and int(max(ir.max(), ii.max())) < src.shape[1]
                                 and int(ii.min()) >= -1))):
        raise ValueError("the atoms must read within the rows' source values")
    on_rows(_columns, out.shape[0], src, ir, cr, ii, ci, xatom, xpow, fidx, fptr, sc, imag, pos, real, out,
            align=TILE, min_rows=TILE)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _power(zr, zi, p, fr, fi):  # pragma: no cover - compiled
    """(fr + i fi) = (zr + i zi) ** p for each lane, by repeated squaring."""
    sign = 1.0
    if p < 0:
        p = -p
        sign = -1.0
    for t in range(TILE):
        ar = zr[t]
        ai = sign * zi[t]
        rr = 1.0
        ri = 0.0
        e = p
        while e > 0:
            if e & 1:
                x = rr * ar - ri * ai
                ri = rr * ai + ri * ar
                rr = x
            e >>= 1
            if e > 0:
                x = ar * ar - ai * ai
                ai = 2.0 * ar * ai
                ar = x
        fr[t] = rr
        fi[t] = ri


@numba.njit(cache=True, nogil=True, boundscheck=False)
def compress_rows(vals, data, indices, counts):  # pragma: no cover - compiled
    """CSR pieces of ``vals`` (m, d) without its exact zeros, in row order: values into
    ``data`` and column numbers into ``indices`` (each at least m * d long), the count
    per row into ``counts`` (m,).  Returns the number of values kept."""
    m, d = vals.shape
    k = 0
    for r in range(m):
        start = k
        for j in range(d):
            v = vals[r, j]
            data[k] = v  # written always, kept only when nonzero: no branch to mispredict
            indices[k] = j
            k += v != 0
        counts[r] = k - start
    return k


@numba.njit(cache=True, nogil=True, boundscheck=False)
def nonfinite_rows(out, cols, bad, start, stop):  # pragma: no cover - compiled
    """``bad[r]`` for rows ``[start, stop)``: whether any ``out[r, cols[k]]`` is not finite, by a
    bit test per value (a float's exponent bits all ones), without the ``(m, cols.size)`` copy
    and mask of ``~np.isfinite(out[:, cols])``; one row part per thread
    (:func:`first_nonfinite_rows`).  ``out`` float32 or float64 ``(m, D)``, ``cols`` int64;
    ``bad`` bool ``(m,)``; rows past it or past ``out``, and columns outside ``[0, D)``, are not read."""
    d = out.shape[1]
    stop = min(stop, out.shape[0], bad.size)
    for r in range(start, stop):
        row = out[r]
        b = False
        for k in range(cols.size):
            c = cols[k]
            if c >= 0 and c < d:
                v = row[c]
                b |= (v - v) != 0.0  # inf - inf and NaN - NaN are NaN; finite v - v is 0
        bad[r] = b


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _nonfinite_in_rows(x, bad, start, stop):  # pragma: no cover - compiled
    # one flag per part (bad[part]), each row read whole: the loop vectorises, no branch per value
    stop = min(stop, x.shape[0])
    b = False
    for r in range(start, stop):
        row = x[r]
        for j in range(row.size):
            v = row[j]
            b |= (v - v) != 0.0  # inf - inf and NaN - NaN are NaN; finite v - v is 0
    if b:
        bad[0] = True


def all_finite(x) -> bool:
    """Whether every value of ``x`` (float32 or float64 ``(m, w)``, C order) is finite: one
    read of the rows on every thread, without numpy's ``(m, w)`` mask of ``np.isfinite``
    (the chunk's only serial pass over its rows).  The caller names the first bad value."""
    if not (x.ndim == 2 and x.flags.c_contiguous and x.dtype in (np.float32, np.float64)):
        raise ValueError("all_finite: x must be C-ordered float32 or float64 (m, w)")
    bad = np.zeros(1, dtype=np.bool_)
    on_rows(_nonfinite_in_rows, x.shape[0], x, bad, min_rows=_rows_for(x.shape[1]))
    return not bad[0]


def first_nonfinite_rows(out, cols) -> tuple:
    """The first ``(row, k)`` (rows in order, then ``k`` in order) where ``out[row, cols[k]]`` is
    not finite, or ``(-1, -1)``: what ``np.argwhere(~np.isfinite(out[:, cols]))[0]`` finds, the
    rows tested on every thread (:func:`nonfinite_rows`)."""
    m = out.shape[0]
    if not m or not cols.size:
        return -1, -1
    bad = np.zeros(m, dtype=np.bool_)
    on_rows(nonfinite_rows, m, out, cols, bad, min_rows=max(1, 65536 // cols.size))
    hit = np.flatnonzero(bad)
    if not hit.size:
        return -1, -1
    r = int(hit[0])
    k = int(np.flatnonzero(~np.isfinite(out[r, cols]))[0])
    return r, k


@numba.njit(cache=True, nogil=True, boundscheck=False)
def faint_rows(out, tiny, faint, start, stop):  # pragma: no cover - compiled
    """``faint[r]`` for rows ``[start, stop)``: whether no value of row ``r`` has modulus at
    least ``tiny`` (all zero, subnormal or NaN).  A row stops at its first value that does:
    nearly every row after a value or two, where a max and a min over the whole (m, D)
    chunk read it all twice.  ``faint`` bool ``(m,)``."""
    d = out.shape[1]
    stop = min(stop, out.shape[0], faint.size)
    for r in range(start, stop):
        row = out[r]
        f = True
        for c in range(d):
            if abs(row[c]) >= tiny:
                f = False
                break
        faint[r] = f


# ----------------------------------------------------------------------------- input preparation
@numba.njit(cache=True, nogil=True, boundscheck=False)
def _gather_columns(x, cols, out, start, stop):  # pragma: no cover - compiled
    for r in range(start, stop):
        for k in range(cols.size):
            out[r, k] = x[r, cols[k]]


def gather_columns(x, cols, out) -> None:
    """``out[r, k] = x[r, cols[k]]`` as float64: x float32/float64 ``(m, w)``, cols int64 ``(s,)``,
    out float64 ``(m, s)``.  One pass instead of numpy's fancy indexing plus a conversion."""
    on_rows(_gather_columns, x.shape[0], x, cols, out, min_rows=_rows_for(cols.size))


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _gather_columns32(x, cols, ucols, out, top, start, stop):  # pragma: no cover - compiled
    for r in range(start, stop):
        for k in range(cols.size):
            out[r, k] = np.float32(np.float64(x[r, cols[k]]))  # rounded once to nearest; beyond float32: inf
        top[r] = _peak(x, r, ucols)


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _peak(x, r, ucols):  # pragma: no cover - compiled
    hi = -np.inf
    lo = np.inf
    for k in range(ucols.size):
        v = np.float64(x[r, ucols[k]])
        hi = max(hi, v)
        lo = min(lo, v)
    return max(hi, -lo)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _row_peaks(x, ucols, top, start, stop):  # pragma: no cover - compiled
    for r in range(start, stop):
        top[r] = _peak(x, r, ucols)


def row_peaks(x, ucols, top) -> None:
    """:func:`gather_columns32`'s ``top`` alone: ``top[r]`` the largest ``|x[r, ucols[k]]|``
    (float64, ``max(max, -min)``); x float32/float64 ``(m, w)`` finite, ucols int64, each
    value in ``[0, w)``."""
    on_rows(_row_peaks, x.shape[0], x, ucols, top, min_rows=_rows_for(ucols.size))


def gather_columns32(x, cols, ucols, out, top) -> None:
    """``out[r, k] = float32(x[r, cols[k]])``, the value rounded once from float64 as
    ``np.asarray(gathered, np.float32)`` rounds it, and ``top[r]`` the largest ``|x[r, cols[k]]|``
    (float64, as the float64 gather's ``max(max, -min)``), read over ``ucols``, the distinct
    values of ``cols`` (overlapping patches read each column many times): x float32/float64
    ``(m, w)`` with finite values, cols and ucols int64, each value in ``[0, w)``, out float32
    ``(m, cols.size)``, top float64 ``(m,)``.  One pass where the float64 gather, its float32
    copy and the row maxima took three."""
    w = x.shape[1]
    if not (out.ndim == 2 and out.shape[0] >= x.shape[0] and top.shape[0] >= x.shape[0] and out.shape[1] >= cols.size) \
            or any(c.size and (c.min() < 0 or c.max() >= w) for c in (cols, ucols)):
        raise ValueError("gather_columns32: cols and ucols must lie in [0, x.shape[1]), out and top hold every row")
    on_rows(_gather_columns32, x.shape[0], x, cols, ucols, out, top, min_rows=_rows_for(cols.size))


def normalize(x, norms) -> None:
    """Divide each vector ``x[r, g, :]`` (float64 ``(m, G, w)``, C order, in place) by its
    Euclidean norm; ``norms`` float64 ``(m, G)`` receives the norm of the vector scaled
    by a power of two (0 exactly for zero vectors, which are left alone).

    Each vector is first multiplied by the power of two 2^-e that brings its largest
    magnitude into [0.5, 1): exact, so ordinary rows get the same bits as without it,
    while rows of magnitude 1e-300 or 1e300 neither underflow nor overflow when
    squared and give the features of the same rows unscaled.  Subnormal vectors
    (largest magnitude below 2^-1023, where 2^-e itself overflows) are multiplied
    by 2^1023 instead, also exact, into [2^-51, 0.5).  The sum of squares
    runs left to right for w <= 16; longer vectors use 8 running sums (element k of
    the first w - w mod 8 goes to sum k mod 8, the rest to sum 0) added as
    ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)), which vectorises and keeps the rounding
    error near log-depth.  Either way a vector's norm depends only on its own values.
    """
    if not (x.dtype == np.float64 and x.flags.c_contiguous and x.ndim == 3 and norms.shape == x.shape[:2]):
        raise ValueError("normalize: x must be C-ordered float64 (m, G, w) and norms (m, G)")
    if x.shape[2] == 0:  # empty vectors: zero vectors (norm 0), nothing to read
        norms[...] = 0.0
        return
    if x.shape[2] <= 16:  # short vectors (a pixel's channels): many at once, without C-library calls
        # each row gathered from itself (every value read before any is written back)
        flat = x.reshape(x.shape[0], -1)
        on_rows(_gather_normalize_short, x.shape[0], flat, np.arange(flat.shape[1], dtype=np.int64), x, norms,
                min_rows=_rows_for(flat.shape[1]))
        return
    on_rows(_normalize, x.shape[0], x, norms, min_rows=_rows_for(x.shape[1] * x.shape[2]))


_MAGNITUDE = np.uint64(0x7FFFFFFFFFFFFFFF)  # a float64's bits without its sign


@numba.njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _normalize_held(t, tb, top, fb, f, acc, norms, r):  # pragma: no cover - compiled
    # :func:`normalize` for w <= 16 on row r's G vectors held coordinate-major in ``t``
    # (t[k, j]: coordinate k of vector j; ``tb`` its bits), in place, the norms into
    # norms[r]: the same operations as :func:`_normalize` would do one vector at a time,
    # each pass over all G vectors with unit stride (the loops vectorise): the largest
    # magnitude as the largest of the magnitudes' bits (ordered as the values), frexp's
    # exponent and 2^-e from the bits (frexp and ldexp were C-library calls, half the time
    # at w = 3), the scaled squares summed left to right, the square root, the quotients.
    # Zero vectors are left alone (norm 0: divided by 1.0, which is exact).  Callers compile
    # with error_model "numpy": no test for a zero divisor, which would stop vectorising.
    w, g = t.shape
    for j in range(g):
        top[j] = 0
    for k in range(w):
        for j in range(g):
            b = tb[k, j] & _MAGNITUDE
            top[j] = b if b > top[j] else top[j]
    for j in range(g):
        m = top[j]
        field = np.int64(m >> np.uint64(52))
        # frexp(max)'s exponent e, at least -1023 (subnormal maxima: -1022 from 2^-1023 up)
        e = field - 1022 if field > 0 else (-1022 if m >= np.uint64(1 << 51) else -1023)
        p = 1023 - e  # 2^-e has biased exponent p: normal for p >= 1, else the subnormal 2^(51 + p) ulps
        fb[j] = (np.uint64(p) << np.uint64(52)) if p >= 1 else (np.uint64(1) << np.uint64(51 + p))
    for j in range(g):
        v = t[0, j] * f[j]
        t[0, j] = v
        acc[j] = v * v
    for k in range(1, w):
        for j in range(g):
            v = t[k, j] * f[j]
            t[k, j] = v
            acc[j] += v * v
    for j in range(g):
        nrm = np.sqrt(acc[j])
        nz = top[j] != 0
        norms[r, j] = nrm if nz else 0.0
        acc[j] = nrm if nz else 1.0
    for k in range(w):
        for j in range(g):
            t[k, j] = t[k, j] / acc[j]


#: Rows gathered at once by :func:`gather_normalize` before they are normalised, while they
#: are still in the core's cache (16 CIFAR rows of float64: 221 KB).
GATHER_ROWS = 16


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _gather_normalize(x, cols, flat, out, norms, start, stop):  # pragma: no cover - compiled
    # w > 16: a few rows gathered, then normalised while they are in the cache
    for r0 in range(start, stop, GATHER_ROWS):
        r1 = min(r0 + GATHER_ROWS, stop)
        _gather_columns(x, cols, flat, r0, r1)
        _normalize(out, norms, r0, r1)


@numba.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def _gather_normalize_short(x, cols, out, norms, start, stop):  # pragma: no cover - compiled
    # w <= 16 (normalize too, x gathered from itself): each row gathered coordinate-major, normalised
    g, w = out.shape[1], out.shape[2]
    t = np.empty((w, g))
    tb = t.view(np.uint64)
    top = np.empty(g, np.uint64)
    fb = np.empty(g, np.uint64)
    f = fb.view(np.float64)
    acc = np.empty(g)
    for r in range(start, stop):
        for j in range(g):
            for k in range(w):
                t[k, j] = x[r, cols[j * w + k]]
        _normalize_held(t, tb, top, fb, f, acc, norms, r)
        for j in range(g):
            for k in range(w):
                out[r, j, k] = t[k, j]


def gather_normalize(x, cols, out, norms) -> None:
    """:func:`gather_columns` then :func:`normalize` in one pass: ``out[r].ravel()[k] =
    x[r, cols[k]]`` as float64, each vector ``out[r, g, :]`` then divided by its norm, a
    few rows (:data:`GATHER_ROWS`) at a time while they are in the cache, by the same
    compiled operations, so the same bits as the two passes.  x float32/float64 ``(m, w)``
    C order with finite values; cols int64 ``(G w',)``, each in ``[0, w)``; out float64
    ``(m, G, w')`` C order; norms float64 ``(m, G)``."""
    m = x.shape[0]
    if not (x.ndim == 2 and x.flags.c_contiguous and out.dtype == np.float64 and out.flags.c_contiguous
            and out.ndim == 3 and out.shape[0] == m and out.shape[2] > 0 and cols.dtype == np.int64
            and cols.ndim == 1 and cols.size == out.shape[1] * out.shape[2] and norms.shape == out.shape[:2]):
        raise ValueError("gather_normalize: x (m, w) and out (m, G, w') C-ordered, cols int64 (G w',), norms (m, G)")
    if cols.size and (cols.min() < 0 or cols.max() >= x.shape[1]):
        raise ValueError("gather_normalize: cols must lie in [0, x.shape[1])")
    if out.shape[2] <= 16:
        on_rows(_gather_normalize_short, m, x, cols, out, norms, min_rows=_rows_for(cols.size))
    else:
        on_rows(_gather_normalize, m, x, cols, out.reshape(m, -1), out, norms, min_rows=_rows_for(cols.size))


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _normalize(x, norms, start, stop):  # pragma: no cover - compiled
    # :func:`normalize` for w > 16 (8 running sums; shorter vectors: _gather_normalize_short)
    g, w = x.shape[1], x.shape[2]
    for r in range(start, stop):
        for j in range(g):
            v = x[r, j]
            mx = 0.0
            for k in range(w):
                a = abs(v[k])
                if a > mx:
                    mx = a
            if mx == 0.0:
                norms[r, j] = 0.0
                continue
            # At most 2^1023: for subnormal vectors 2^-e would overflow; 2^1023 brings
            # them into [2^-51, 0.5), whose squares neither underflow nor overflow.
            e = max(math.frexp(mx)[1], -1023)
            f = math.ldexp(1.0, -e)
            for k in range(w):
                v[k] = v[k] * f
            s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
            n8 = w - w % 8
            for k in range(0, n8, 8):
                s0 += v[k] * v[k]
                s1 += v[k + 1] * v[k + 1]
                s2 += v[k + 2] * v[k + 2]
                s3 += v[k + 3] * v[k + 3]
                s4 += v[k + 4] * v[k + 4]
                s5 += v[k + 5] * v[k + 5]
                s6 += v[k + 6] * v[k + 6]
                s7 += v[k + 7] * v[k + 7]
            for k in range(n8, w):  # the last w mod 8 squares
                s0 += v[k] * v[k]
            acc = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
            nrm = np.sqrt(acc)
            norms[r, j] = nrm
            for k in range(w):
                v[k] = v[k] / nrm


# ----------------------------------------------------------------------------- sampler keys
_SALTS = (np.uint64(0x243F6A8885A308D3), np.uint64(0x13198A2E03707344))
_C0 = np.uint64(0x100000001B3)
_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


@numba.njit(cache=True, nogil=True, inline="always")
def _mix(x):  # pragma: no cover - compiled
    """splitmix64 finaliser (wrapping uint64 arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M2
    x = x ^ (x >> np.uint64(27))
    x = x * _M3
    return x ^ (x >> np.uint64(31))


@numba.njit(cache=True, nogil=True, boundscheck=False)
def draw_keys(kind, ptr, node, code, power, continuous, first_draw, out):  # pragma: no cover - compiled
    """Two 64-bit hashes per draw of (kind, its sorted terms) into ``out`` (n, 2) uint64.

    The same arithmetic as the numpy formulation it replaced (``rfsgen.features.term_keys``),
    bit for bit: term t of a draw contributes mix(base_t ^ mix(t + salt)) to a wrapping sum.
    Hashed keys get an even second half; a draw with a continuous term is unique by
    construction and gets (first_draw + i, all ones) instead.  A draw without terms (most
    draws of a deep skeleton: its constant columns) has a key that depends on its kind
    only: each kind's is hashed once a call and copied (the same arithmetic, so the same bits).
    """
    empty = np.zeros((256, 2), dtype=np.uint64)
    done = np.zeros(256, dtype=np.bool_)
    for i in range(kind.size):
        if continuous[i]:
            out[i, 0] = np.uint64(first_draw + i)
            out[i, 1] = np.uint64(0xFFFFFFFFFFFFFFFF)
            continue
        a = ptr[i]
        z = ptr[i + 1]
        k = np.int64(kind[i])
        memo = a == z and 0 <= k < 256  # (kind is uint8 from every caller; kept in bounds for any)
        if memo and done[k]:
            out[i, 0] = empty[k, 0]
            out[i, 1] = empty[k, 1]
            continue
        for half in range(2):
            salt = _SALTS[half]
            acc = np.uint64(0)
            for q in range(a, z):
                base = (np.uint64(node[q]) * _C0) ^ (np.uint64(code[q]) * _M1) ^ (np.uint64(power[q]) * _M3)
                acc += _mix(base ^ _mix(np.uint64(q - a) + salt))
            head = _mix(np.uint64(kind[i]) + np.uint64(z - a) * _M1 + salt)
            out[i, half] = _mix(acc ^ head)
        out[i, 1] &= np.uint64(0xFFFFFFFFFFFFFFFE)
        if memo:
            empty[k, 0] = out[i, 0]
            empty[k, 1] = out[i, 1]
            done[k] = True


# ----------------------------------------------------------------------------- file checksum
@numba.njit(cache=True, nogil=True, boundscheck=False)
def fletcher32(data):  # pragma: no cover - compiled
    """HDF5's Fletcher-32 checksum (``H5_checksum_fletcher32``) of the bytes ``data``
    (uint8): big-endian 16-bit words, sums folded every 360 words, an odd last byte
    as the high byte of a word.  Returns it as a uint32 value."""
    n = data.size
    words = n // 2
    sum1 = np.uint32(0)
    sum2 = np.uint32(0)
    m16 = np.uint32(0xFFFF)
    s16 = np.uint32(16)
    i = 0
    while words > 0:
        block = min(words, 360)
        words -= block
        for _ in range(block):
            sum1 += (np.uint32(data[i]) << np.uint32(8)) | np.uint32(data[i + 1])
            sum2 += sum1
            i += 2
        sum1 = (sum1 & m16) + (sum1 >> s16)
        sum2 = (sum2 & m16) + (sum2 >> s16)
    if n % 2:
        sum1 += np.uint32(data[i]) << np.uint32(8)
        sum2 += sum1
        sum1 = (sum1 & m16) + (sum1 >> s16)
        sum2 = (sum2 & m16) + (sum2 >> s16)
    sum1 = (sum1 & m16) + (sum1 >> s16)
    sum2 = (sum2 & m16) + (sum2 >> s16)
    return (sum2 << s16) | sum1


# XXH64 (https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md), the per-block
# hash of the data checksum of outputs' records of version 1 (rfsgen.output.BlockChecksum),
# which merge still verifies.
_XP1 = np.uint64(0x9E3779B185EBCA87)
_XP2 = np.uint64(0xC2B2AE3D27D4EB4F)
_XP3 = np.uint64(0x165667B19E3779F9)
_XP4 = np.uint64(0x85EBCA77C2B2AE63)
_XP5 = np.uint64(0x27D4EB2F165667C5)
_F32_EXP = np.uint64(0x7F8000007F800000)  # the exponent bits of two float32 in one word
_F32_LO = np.uint64(0x7F800000)
_F32_HI = np.uint64(0x7F80000000000000)
_F64_EXP = np.uint64(0x7FF0000000000000)


@numba.njit(cache=True, nogil=True, inline="always")
def _rotl(x, r):  # pragma: no cover - compiled
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@numba.njit(cache=True, nogil=True, inline="always")
def _xround(acc, w):  # pragma: no cover - compiled
    return _rotl(acc + w * _XP2, 31) * _XP1


@numba.njit(cache=True, nogil=True, inline="always")
def _nonfinite(w, kind):  # pragma: no cover - compiled
    """Whether the word ``w`` holds a NaN or an infinity: two float32 (``kind`` 4) or
    one float64 (``kind`` 8); never for ``kind`` 0."""
    if kind == 4:
        e = w & _F32_EXP
        return (e & _F32_LO) == _F32_LO or (e & _F32_HI) == _F32_HI
    if kind == 8:
        return (w & _F64_EXP) == _F64_EXP
    return False


@numba.njit(cache=True, nogil=True, boundscheck=False)
def xxh64(words, tail, seed, kind):  # pragma: no cover - compiled
    """XXH64 of the bytes of ``words`` (uint64, little-endian) followed by ``tail``
    (uint8, fewer than 8 bytes), with ``seed``.  Returns ``(hash, bad)``: ``bad`` is
    True when a word holds a non-finite float of size ``kind`` (see :func:`_nonfinite`;
    the tail is not checked)."""
    n = words.size
    seed = np.uint64(seed)
    bad = False
    i = 0
    if n >= 4:
        v1 = seed + _XP1 + _XP2
        v2 = seed + _XP2
        v3 = seed
        v4 = seed - _XP1
        while i + 4 <= n:
            w1, w2, w3, w4 = words[i], words[i + 1], words[i + 2], words[i + 3]
            if kind:
                bad |= _nonfinite(w1, kind) | _nonfinite(w2, kind) | _nonfinite(w3, kind) | _nonfinite(w4, kind)
            v1 = _xround(v1, w1)
            v2 = _xround(v2, w2)
            v3 = _xround(v3, w3)
            v4 = _xround(v4, w4)
            i += 4
        h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        for v in (v1, v2, v3, v4):
            h = (h ^ _xround(np.uint64(0), v)) * _XP1 + _XP4
    else:
        h = seed + _XP5
    h += np.uint64(n * 8 + tail.size)
    while i < n:
        if kind:
            bad |= _nonfinite(words[i], kind)
        h = _rotl(h ^ _xround(np.uint64(0), words[i]), 27) * _XP1 + _XP4
        i += 1
    j = 0
    if tail.size - j >= 4:
        v = (np.uint64(tail[0]) | (np.uint64(tail[1]) << np.uint64(8)) | (np.uint64(tail[2]) << np.uint64(16))
             | (np.uint64(tail[3]) << np.uint64(24)))
        h = _rotl(h ^ (v * _XP1), 23) * _XP2 + _XP3
        j = 4
    while j < tail.size:
        h = _rotl(h ^ (np.uint64(tail[j]) * _XP5), 11) * _XP1
        j += 1
    h ^= h >> np.uint64(33)
    h *= _XP2
    h ^= h >> np.uint64(29)
    h *= _XP3
    h ^= h >> np.uint64(32)
    return h, bad


@numba.njit(cache=True, nogil=True, boundscheck=False)
def xxh64_blocks(words, kind, out, bad, start, stop):  # pragma: no cover - compiled
    """XXH64 (seed 0) of rows ``start:stop`` of ``words`` (uint64 ``(blocks, w)``, one
    block a row) into ``out`` (uint64 ``(blocks,)``); ``bad[b]`` (bool) marks a block with
    a non-finite float of size ``kind`` (0: no check)."""
    tail = np.empty(0, dtype=np.uint8)
    for b in range(start, stop):
        out[b], bad[b] = xxh64(words[b], tail, 0, kind)


# ----------------------------------------------------------------------------- data checksum (record version 2)
# The outputs' data checksum (rfsgen.output.CHECKSUM; docs/integrity.md): sums over
# every stored value, taken in 64-bit words (two float32 values or column indices, or one
# float64), of a keyed mix H(dataset, global row, position in the row, word), in 32-bit
# lanes that LLVM's loop vectoriser turns into 8-lane AVX2 code.  A sum does
# not depend on the order, chunking, threads or sharding of the rows, so shards' sums
# add up to the merged file's.  Every integer step is wrapped in a uint32 cast: numba
# widens uint32 arithmetic to 64 bits, which is neither the definition nor vectorises.
_U32 = np.uint32
_MASK32 = np.uint64(0xFFFFFFFF)
_NO_CHECK = np.uint32(0)  # a finiteness mask that checks nothing


@numba.njit(cache=True, nogil=True, inline="always")
def _fmix_a(x):  # pragma: no cover - compiled
    """murmur3's fmix32: a bijection of uint32."""
    x = _U32(x ^ (x >> _U32(16)))
    x = _U32(x * _U32(0x85EBCA6B))
    x = _U32(x ^ (x >> _U32(13)))
    x = _U32(x * _U32(0xC2B2AE35))
    return _U32(x ^ (x >> _U32(16)))


@numba.njit(cache=True, nogil=True, inline="always")
def _fmix_b(x):  # pragma: no cover - compiled
    """C. Wellons' lowbias32: another bijection of uint32."""
    x = _U32(x ^ (x >> _U32(16)))
    x = _U32(x * _U32(0x7FEB352D))
    x = _U32(x ^ (x >> _U32(15)))
    x = _U32(x * _U32(0x846CA68B))
    return _U32(x ^ (x >> _U32(16)))


@numba.njit(cache=True, nogil=True, inline="always")
def _mix64(z):  # pragma: no cover - compiled
    """SplitMix64's finaliser: a bijection of uint64."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True, nogil=True, inline="always")
def row_key(seed, row, segment):  # pragma: no cover - compiled
    """The 64-bit key of positions ``segment * 2^32 ..`` of row ``row`` (global) of
    dataset ``seed``: ``mix64(mix64(row XOR seed << 56) + segment)``."""
    return _mix64(_mix64(np.uint64(row) ^ (np.uint64(seed) << np.uint64(56))) + np.uint64(segment))


@numba.njit(cache=True, nogil=True, inline="always")
def _value_mix(lo, hi, k1, k2, q):  # pragma: no cover - compiled
    """H of one word's 32-bit halves ``lo, hi`` at position ``q`` (mod 2^32) under the
    row keys ``k1, k2``: ``a = fmix_a((lo ^ k1) + q)``, ``b = fmix_b((hi ^ k2) + q + a)``
    (mod 2^32), a bijection of ``(lo, hi)`` (a Feistel step: ``a`` gives ``lo`` back,
    then ``b`` gives ``hi``), so that a changed value always changes ``(a, b)``."""
    a = _fmix_a(_U32((lo ^ k1) + q))
    b = _fmix_b(_U32(_U32(_U32(hi ^ k2) + q) + a))
    return a, b


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _segment(w, n, q, k1, k2, mlo, mhi):  # pragma: no cover - compiled
    """The hot loop of :func:`run_sums`: words ``j < n`` (``lo = w[2j]``, ``hi = w[2j + 1]``)
    at positions ``q + j`` (mod 2^32) under keys ``k1, k2``: contiguous loads, 32-bit
    lanes, reductions.  Returns ``(A, B, top)``: ``top`` the largest ``lo & mlo`` or
    ``hi & mhi`` (0, and no work for it, when both masks are 0).  A function of its
    own: inlined where ``q + j < 2^32`` is known, LLVM drops the truncations and runs
    the whole mix in 64-bit lanes (half the width, no vpmulld)."""
    A = _U32(0)
    B = _U32(0)
    top = _U32(0)
    if mlo == 0 and mhi == 0:  # two loops: the writers' (no check) does only the mix
        for j in range(n):
            a, b = _value_mix(w[2 * j], w[2 * j + 1], k1, k2, _U32(q + _U32(j)))
            A = _U32(A + a)
            B = _U32(B + b)
    else:
        for j in range(n):
            lo = w[2 * j]
            hi = w[2 * j + 1]
            a, b = _value_mix(lo, hi, k1, k2, _U32(q + _U32(j)))
            A = _U32(A + a)
            B = _U32(B + b)
            top = max(top, max(_U32(lo & mlo), _U32(hi & mhi)))
    return A, B, top


@numba.njit(cache=True, nogil=True, boundscheck=False)
def run_sums(w, seed, row, first, mlo, mhi, limit):  # pragma: no cover - compiled
    """The checksum's sums over one row's run of values, as 64-bit words at positions
    ``first, first + 1, ..`` of row ``row`` of dataset ``seed`` (docs/integrity.md).

    ``w`` (uint32, 1-D, contiguous) holds the values' bits, taken two 32-bit halves a
    word (``lo = w[2j]``, ``hi = w[2j + 1]``; an odd last half with ``hi = 0``): float32
    values and column indices two at a time, float64 values one a word (pass
    ``view(np.uint32)``: little-endian halves).  Returns ``(A, B, bad)``: the sums mod
    2^32 of :func:`_value_mix`'s ``a`` and ``b``, and whether some ``lo & mlo`` or ``hi &
    mhi`` reaches ``limit``: NaN or infinity with ``mlo = mhi = 0x7FFFFFFF``, ``limit =
    0x7F800000`` (float32) or ``mlo = 0, mhi = 0x7FFFFFFF, limit = 0x7FF00000``
    (float64); masks 0 check nothing (give ``limit`` 1)."""
    A = _U32(0)
    B = _U32(0)
    top = _U32(0)
    n = (w.size + 1) // 2  # words
    whole = w.size // 2  # words without an odd last half
    done = 0
    p = np.uint64(first)
    while done < n:
        q = _U32(p & _MASK32)
        take = min(n - done, (1 << 32) - int(q))
        key = row_key(seed, row, p >> np.uint64(32))
        k1 = _U32(key & _MASK32)
        k2 = _U32(key >> np.uint64(32))
        full = max(0, min(take, whole - done))
        a, b, t = _segment(w[2 * done:], full, q, k1, k2, mlo, mhi)
        A = _U32(A + a)
        B = _U32(B + b)
        top = max(top, t)
        if full < take:  # an odd last half: a word with a zero high half
            lo = w[w.size - 1]
            a, b = _value_mix(lo, _U32(0), k1, k2, _U32(q + _U32(full)))
            A = _U32(A + a)
            B = _U32(B + b)
            top = max(top, _U32(lo & mlo))
        done += take
        p += np.uint64(take)
    return A, B, top >= limit


@numba.njit(cache=True, nogil=True, boundscheck=False)
def dense_sums(w, row0, seed, mlo, mhi, limit, out, start, stop):  # pragma: no cover - compiled
    """:func:`run_sums` of rows ``start:stop`` of ``w`` (uint32 (m, k) C order: each
    row's values' bits; row ``r`` is the global row ``row0 + r``, its words at
    positions 0, 1, ..) into ``out`` (uint32 (m, 3): A, B, bad)."""
    for r in range(start, stop):
        a, b, bad = run_sums(w[r], seed, row0 + r, 0, mlo, mhi, limit)
        out[r, 0] = a
        out[r, 1] = b
        out[r, 2] = bad


@numba.njit(cache=True, nogil=True, boundscheck=False)
def csr_sums(data, dper, indices, ptr, width, row0, mlo, mhi, limit, verify, out, start, stop):  # pragma: no cover - compiled
    """The sums of CSR rows ``start:stop`` into ``out`` (uint32 (m, 8)): row ``r``
    (global ``row0 + r``) holds the values ``ptr[r] - ptr[0]`` up to ``ptr[r + 1] -
    ptr[0]`` of ``data`` (their bits as uint32, ``dper`` per value; dataset seed 2) and
    of ``indices`` (as uint32; seed 3; not for a full row, of ``width`` values: its
    columns can only be 0 .. width - 1, which merge checks); its
    length (``ptr[r + 1] - ptr[r]``) is one int64 word at position 0 (seed 4).  Columns:
    data A, B, indices A, B, length A, B, bad (data), and, with ``verify``, the row's
    structure faults (0 without): 1 when its columns are not strictly increasing within
    0 .. width - 1 (a full row's must be exactly 0 .. width - 1), 2 when it stores a
    zero (+0 or -0).  Checked while the row is still in cache from hashing it: the
    verifying merge's per-value checks all in this one pass."""
    base = ptr[0]
    for r in range(start, stop):
        a = ptr[r] - base
        b = ptr[r + 1] - base
        _csr_row_sums(data, dper, indices, a, b, width, row0 + r, mlo, mhi, limit, out[r])
        out[r, 7] = _csr_faults(data, dper, indices, a, b, width) if verify else _U32(0)


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _csr_row_sums(data, dper, indices, a, b, width, row, mlo, mhi, limit, out):  # pragma: no cover - compiled
    """:func:`csr_sums`'s columns 0-6 of one CSR row (values ``a:b``, global ``row``) into
    ``out`` (uint32 (8,)); its columns' sums are 0 for a full row of ``width`` values."""
    da, db, bad = run_sums(data[dper * a:dper * b], 2, row, 0, mlo, mhi, limit)
    ia, ib = _U32(0), _U32(0)
    if b - a != width:
        ia, ib, _ = run_sums(indices[a:b], 3, row, 0, _NO_CHECK, _NO_CHECK, _U32(1))
    la, lb = _length_sums(row, b - a)
    out[0] = da
    out[1] = db
    out[2] = ia
    out[3] = ib
    out[4] = la
    out[5] = lb
    out[6] = bad


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _csr_faults(data, dper, indices, a, b, width):  # pragma: no cover - compiled
    """:func:`csr_sums`'s structure faults of the CSR row of values ``a:b`` (branch-free
    reductions over slices, indexed from 0, so that the loops vectorise: a forged row
    is rare, a valid one is read whole anyway)."""
    faults = _U32(0)
    if b == a:
        return faults
    cols = indices[a:b]
    if b - a == width:
        off = _U32(0)
        for j in range(cols.size):
            off |= _U32(cols[j] ^ _U32(j))
        if off:
            faults |= _U32(1)
    else:
        down = _U32(0)
        for j in range(1, cols.size):
            down |= _U32(cols[j] <= cols[j - 1])
        # As uint32, a negative int32 column is above any width (< 2^31): strictly
        # increasing and a last column below width put every column in range.
        if down or cols[cols.size - 1] >= _U32(width):
            faults |= _U32(1)
    if _stores_zero(data[dper * a:dper * b], dper):
        faults |= _U32(2)
    return faults


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _stores_zero(vals, dper):  # pragma: no cover - compiled
    """Whether the values whose bits ``vals`` holds (uint32, ``dper`` per value) include
    +0 or -0."""
    return _stored(vals, dper) < vals.size // dper


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _stored(vals, dper):  # pragma: no cover - compiled
    """How many of the values whose bits ``vals`` holds (uint32, ``dper`` per value) are
    not zero (+0 or -0): a branch-free count that vectorises."""
    n = 0
    if dper == 1:
        for j in range(vals.size):
            n += (vals[j] & _U32(0x7FFFFFFF)) != 0
    else:
        for j in range(vals.size // 2):
            n += (vals[2 * j] | (vals[2 * j + 1] & _U32(0x7FFFFFFF))) != 0
    return n


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _length_sums(row, n):  # pragma: no cover - compiled
    """The sums of a CSR row's length ``n``: one word at position 0 of dataset 4."""
    key = row_key(4, row, 0)
    n = np.uint64(n)
    return _value_mix(_U32(n & _MASK32), _U32(n >> np.uint64(32)), _U32(key & _MASK32), _U32(key >> np.uint64(32)),
                      _U32(0))


@numba.njit(cache=True, nogil=True, boundscheck=False)
def stored_counts(w, dper, row0, hashing, mlo, mhi, limit, counts, out, start, stop):  # pragma: no cover - compiled
    """The first pass of a dense chunk's CSR pieces (rfsgen.output): for each row ``r``
    of ``start:stop`` of ``w`` (uint32 (m, dper * k), C order: the values' bits; global
    row ``row0 + r``), its count of values that are not zero into ``counts[r]`` (int64).
    With ``hashing``, a row storing all ``k`` values gets its :func:`csr_sums` columns
    into ``out[r]`` (uint32 (m, 8)) right after, while in cache: its CSR data is the row
    itself and its columns, 0 .. k - 1, are not hashed.  The other rows' are left to
    :func:`compress_hashed`."""
    k = w.shape[1] // dper
    for r in range(start, stop):
        n = _stored(w[r], dper)
        counts[r] = n
        if hashing and n == k:  # the row is its own CSR data (its columns, unused, not hashed)
            _csr_row_sums(w[r], dper, w[r], 0, k, k, row0 + r, mlo, mhi, limit, out[r])
            out[r, 7] = 0


@numba.njit(cache=True, nogil=True, boundscheck=False)
def compress_hashed(w, dper, ptr, data, indices, row0, hashing, mlo, mhi, limit, out, start, stop):  # pragma: no cover
    """The second pass: rows ``start:stop`` of ``w`` (as :func:`stored_counts`') without
    their zeros, the values' bits into ``data`` (uint32, ``dper`` a value) and their
    columns into ``indices`` (uint32), row ``r`` at ``ptr[r] .. ptr[r + 1]`` (int64, the
    first pass's counts summed).  With ``hashing``, a row not storing all ``k`` values
    gets its :func:`csr_sums` columns into ``out[r]`` right after it is written, while
    in cache.  Writes stay within a row's own range (a write past it could land in
    another thread's rows), a branch that is always predicted but at a row's end."""
    k = w.shape[1] // dper
    for r in range(start, stop):
        a = ptr[r]
        b = ptr[r + 1]
        src = w[r]
        p = a
        if dper == 1:
            for j in range(k):
                v = src[j]
                if p < b:
                    data[p] = v
                    indices[p] = j
                p += (v & _U32(0x7FFFFFFF)) != 0
        else:
            for j in range(k):
                lo = src[2 * j]
                hi = src[2 * j + 1]
                if p < b:
                    data[2 * p] = lo
                    data[2 * p + 1] = hi
                    indices[p] = j
                p += (lo | (hi & _U32(0x7FFFFFFF))) != 0
        if hashing and b - a != k:
            _csr_row_sums(data, dper, indices, a, b, k, row0 + r, mlo, mhi, limit, out[r])
            out[r, 7] = 0


# ----------------------------------------------------------------------------- sampler walk
# The walk's bookkeeping between its random draws: each loop computes exactly what the
# numpy expression in its docstring does (integers only), in one pass without temporaries.
@numba.njit(cache=True, nogil=True, boundscheck=False)
def search_right(cdf, guide, v, out):  # pragma: no cover - compiled
    """``out[i] = np.searchsorted(cdf, v[i], side="right")`` for ``v`` float64 in [0, 1].

    ``guide`` int64 ``(G + 1,)`` is ``np.searchsorted(cdf, np.arange(G + 1) / G, side="right")``
    with G a power of two, so the answer for ``v`` lies in ``guide[g]:guide[g + 1] + 1``,
    ``g = floor(v G)`` (in the last bucket, up to ``cdf.size``: a table summing to a hair
    above 1 has entries above 1): a few linear steps, then a binary search of the rest.
    The bucket is proved in range before it is cast or used: ``v`` below 0, NaN (bucket 0)
    or above 1 (the last bucket) cannot read outside ``guide`` or ``cdf``."""
    buckets = guide.size - 1
    for i in range(v.size):
        x = v[i]
        t = x * buckets
        if t >= 0.0:  # false for NaN
            g = buckets - 1 if t >= buckets - 1 else int(t)
        else:
            g = 0
        lo = guide[g]
        hi = guide[g + 1] if g < buckets - 1 else cdf.size
        steps = 0
        while lo < hi and steps < 4 and cdf[lo] <= x:
            lo += 1
            steps += 1
        if steps == 4:
            while lo < hi:
                mid = (lo + hi) // 2
                if cdf[mid] <= x:
                    lo = mid + 1
                else:
                    hi = mid
        out[i] = lo


@numba.njit(cache=True, nogil=True, boundscheck=False)
def child_plan(node, degree, fanin, small):  # pragma: no cover - compiled
    """How many children each item picks one by one: ``small = np.where(big, 0, degree)``
    with ``big = degree > 8 * fanin[node]`` (those draw multinomial counts instead).
    Returns ``(small.sum(), f0, same, big.any())``: ``f0`` is the fan-in of the first
    item with ``small > 0`` (0 if none) and ``same`` whether all such items share it."""
    total = 0
    f0 = 0
    same = True
    any_big = False
    for i in range(node.size):
        f = fanin[node[i]]
        d = degree[i]
        if d > 8 * f:
            any_big = True
            small[i] = 0
            continue
        small[i] = d
        if d > 0:
            if total == 0:
                f0 = f
            elif f != f0:
                same = False
            total += d
    return total, f0, same, any_big


@numba.njit(cache=True, nogil=True, boundscheck=False)
def expand_picks(draw, node, degree, pick, child_ptr, children, out_draw, out_child):  # pragma: no cover - compiled
    """Item ``i``'s ``degree[i]`` picks (consecutive in ``pick``) as
    ``out_draw = np.repeat(draw, degree)`` and
    ``out_child = children[np.repeat(child_ptr[node], degree) + pick]`` (int64 each).
    ``out_draw``/``out_child`` hold one slot more than the picks: each item writes its
    first pick unconditionally (overwritten by the next item when its degree is 0), so
    that the usual degrees 0 and 1 take no branch, which random degrees mispredict."""
    last = pick.size - 1
    top = children.size - 1
    k = 0
    for i in range(draw.size):
        first = child_ptr[node[i]]
        d = degree[i]
        out_draw[k] = draw[i]
        # (a degree-0 item reads the next item's pick: keep the index inside the table)
        out_child[k] = children[min(first + pick[min(k, last)], top)]
        if d >= 2:
            for j in range(1, d):
                out_draw[k + j] = draw[i]
                out_child[k + j] = children[first + pick[k + j]]
        k += d


@numba.njit(cache=True, nogil=True, boundscheck=False)
def level_census(node, is_input, act_index, per_act):  # pragma: no cover - compiled
    """One pass over a level's items: ``per_act[a]`` (int64, zeroed by the caller) += the
    internal items of activation ``a``; returns the input (leaf) items.  The same counts as
    ``np.bincount(act_index[node[~is_input[node]]])`` and ``is_input[node].sum()``, without
    the three temporaries (1.3 ms a 65,536-draw block of cifar-deep).  A node outside the
    tables, or an activation outside ``per_act``, returns -1 before anything is read there
    (and so do tables of two lengths)."""
    leaves = 0
    n_nodes = is_input.size
    if act_index.size != n_nodes:
        return -1
    for i in range(node.size):
        v = node[i]
        if v < 0 or v >= n_nodes:
            return -1
        if is_input[v]:
            leaves += 1
        else:
            a = act_index[v]
            if a < 0 or a >= per_act.size:
                return -1
            per_act[a] += 1
    return leaves


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _by_draw(draw, n_draws, start):  # pragma: no cover - compiled
    # start (int64 (n_draws + 1,)): where each draw's items begin once sorted by draw; returns
    # the stable order by draw (the identity when already sorted), or an empty array when a
    # draw is outside [0, n_draws).
    n = draw.size
    start[:] = 0
    ordered = True
    for i in range(n):
        d = draw[i]
        if d < 0 or d >= n_draws:
            return np.empty(0, np.int64)
        if i and d < draw[i - 1]:
            ordered = False
        start[d + 1] += 1
    for d in range(n_draws):
        start[d + 1] += start[d]
    order = np.empty(n, np.int64)
    if ordered:
        for i in range(n):
            order[i] = i
        return order
    for i in range(n):  # start[d] as draw d's cursor, then shifted back (no second array)
        d = draw[i]
        order[start[d]] = i
        start[d] += 1
    for d in range(n_draws, 0, -1):
        start[d] = start[d - 1]
    start[0] = 0
    return order


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _sort_run(idx, a, z, k1, k2):  # pragma: no cover - compiled
    # idx[a:z] stably sorted by (k1, k2) of its entries: insertion sort for the usual few
    # items of a draw, a stable merge sort of a combined key beyond 32.
    if z - a <= 32:
        for i in range(a + 1, z):
            e = idx[i]
            j = i - 1
            while j >= a and (k1[idx[j]] > k1[e] or (k1[idx[j]] == k1[e] and k2[idx[j]] > k2[e])):
                idx[j + 1] = idx[j]
                j -= 1
            idx[j + 1] = e
        return
    seg = idx[a:z].copy()
    o2 = np.argsort(k2[seg], kind="mergesort")
    seg = seg[o2]
    o1 = np.argsort(k1[seg], kind="mergesort")
    idx[a:z] = seg[o1]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def merge_leaves(draw, node, mult, n_draws, out_draw, out_node, out_mult):  # pragma: no cover - compiled
    """The leaf items sorted by (draw, node) with the multiplicities of equal (draw, node)
    summed (int64, wrapping as ``np.add.at`` does), in one counting pass by draw and a
    sort of each draw's few items (numpy's two radix sorts of (draw, node) keys took 0.9 ms
    a 65,536-draw block of cifar-deep).  Returns how many items there are (``out_*`` hold
    ``draw.size``), or -1 for a draw outside ``[0, n_draws)`` or arrays of other lengths,
    before anything is written.  Multiplicities are counts (>= 0), as the walk makes them."""
    n = draw.size
    if n_draws < 0 or node.size != n or mult.size != n or out_draw.size < n or out_node.size < n \
            or out_mult.size < n:
        return -1
    start = np.empty(n_draws + 1, np.int64)
    order = _by_draw(draw, n_draws, start)
    if order.size != draw.size:
        return -1
    k = 0
    a = 0
    while a < order.size:  # draw by draw, those with items only
        d = draw[order[a]]
        z = start[d + 1]
        if z - a > 1:
            _sort_run(order, a, z, node, node)
        for q in range(a, z):
            i = order[q]
            if k and out_draw[k - 1] == d and out_node[k - 1] == node[i]:
                out_mult[k - 1] += mult[i]
            else:
                out_draw[k] = d
                out_node[k] = node[i]
                out_mult[k] = mult[i]
                k += 1
        a = z
    return k


@numba.njit(cache=True, nogil=True, boundscheck=False)
def term_order(draw, node, code, n_draws, ptr):  # pragma: no cover - compiled
    """``np.lexsort((code, node, draw))`` (stable), and ``ptr`` (int64 ``(n_draws + 1,)``)
    the start of each draw's terms in that order.  The terms usually come sorted (one
    input group: items by (draw, node), codes in order), and then the order is the
    identity after one pass.  Returns ``(order, moved)``, ``moved`` False for the identity;
    an empty order for a draw outside ``[0, n_draws)`` or arrays of other lengths (``ptr``
    not ``n_draws + 1``), before anything is written."""
    if n_draws < 0 or node.size != draw.size or code.size != draw.size or ptr.size != n_draws + 1:
        return np.empty(0, np.int64), True
    order = _by_draw(draw, n_draws, ptr)
    if order.size != draw.size:
        return order, True
    moved = False
    for d in range(n_draws):
        a = ptr[d]
        z = ptr[d + 1]
        if z - a > 1:
            for q in range(a + 1, z):
                i, j = order[q - 1], order[q]
                if node[j] < node[i] or (node[j] == node[i] and code[j] < code[i]):
                    _sort_run(order, a, z, node, code)
                    break
    for i in range(order.size):
        if order[i] != i:
            moved = True
            break
    return order, moved


@numba.njit(cache=True, nogil=True, boundscheck=False)
def take_terms(ptr, node, code, power, rows, out_node, out_code, out_power, at):  # pragma: no cover - compiled
    """Copy the terms of draws ``rows`` (int64; repeats allowed), draw after draw,
    into ``out_*[at:]``: ``out[at:at + k] = x[idx]`` for x in node, code, power (int64),
    where ``idx`` concatenates ``arange(ptr[r], ptr[r + 1])`` for r in rows.  Returns
    ``at + k``; the caller makes the room."""
    k = at
    for r in rows:
        for q in range(ptr[r], ptr[r + 1]):
            out_node[k] = node[q]
            out_code[k] = code[q]
            out_power[k] = power[q]
            k += 1
    return k


@numba.njit(cache=True, nogil=True, boundscheck=False)
def canonical_forms(ptr, node, code, power, cc, cp, cont, out_code, out_power, real):  # pragma: no cover - compiled
    """Each draw's feature or its conjugate, whichever is smaller.

    Draw ``d`` has terms ``ptr[d]:ptr[d + 1]`` sorted by (node, code); ``cc, cp`` are
    each term's conjugate (code, power).  The conjugate's terms are sorted the same way
    (a stable sort by code within each node's run), and the two term lists are compared
    at the first term where (code, power) differ.  Writes into ``out_code, out_power``
    the conjugate's terms where they are smaller (never for draws with ``cont``), else
    the draw's own; ``real[d]`` is whether the draw equals its conjugate (never for
    ``cont``).  int64 arrays, bool ``cont``/``real``."""
    for d in range(ptr.size - 1):
        a = ptr[d]
        z = ptr[d + 1]
        r0 = a
        while r0 < z:  # the conjugate's terms, sorted by code within each node's run
            r1 = r0 + 1
            while r1 < z and node[r1] == node[r0]:
                r1 += 1
            if r1 - r0 <= 32:
                for i in range(r0, r1):  # insertion sort (stable)
                    c = cc[i]
                    q = cp[i]
                    j = i
                    while j > r0 and out_code[j - 1] > c:
                        out_code[j] = out_code[j - 1]
                        out_power[j] = out_power[j - 1]
                        j -= 1
                    out_code[j] = c
                    out_power[j] = q
            else:
                order = np.argsort(cc[r0:r1], kind="mergesort")
                for i in range(r1 - r0):
                    out_code[r0 + i] = cc[r0 + order[i]]
                    out_power[r0 + i] = cp[r0 + order[i]]
            r0 = r1
        first = -1
        for i in range(a, z):
            if out_code[i] != code[i] or out_power[i] != power[i]:
                first = i
                break
        use_conj = False
        if first < 0:
            real[d] = not cont[d]
        else:
            real[d] = False
            use_conj = (not cont[d]) and (out_code[first] < code[first] or (
                out_code[first] == code[first] and out_power[first] < power[first]))
        if not use_conj:
            for i in range(a, z):
                out_code[i] = code[i]
                out_power[i] = power[i]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def draw_kinds(phase, real, kind_real, kind_cos, kind_sin, out):  # pragma: no cover - compiled
    """``out = np.where(real, kind_real, np.where(phase == 1, kind_sin, kind_cos))`` (uint8):
    the same in one pass (numpy took 0.5 ms per 65,536 draws)."""
    for i in range(out.size):
        out[i] = kind_real if real[i] else (kind_sin if phase[i] == 1 else kind_cos)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def distinct_keys(k1, k2, first, inv):  # pragma: no cover - compiled
    """The distinct keys of a block by a hash table on the first (already hashed) halves:
    ``inv[i]`` (int64 ``(n,)``) is the number of draw ``i``'s key in order of first
    appearance, ``first[u]`` the draw where key ``u`` first appears.  Returns how many
    keys there are, or -1 if two keys share a first half but not a second (the caller
    then compares whole keys)."""
    n = k1.size
    size = 1
    while size < 2 * n:
        size *= 2
    mask = np.uint64(size - 1)
    slot_key = np.full(size, -1, dtype=np.int64)  # the distinct key number held, -1 for empty
    count = 0
    for i in range(n):
        h = k1[i] & mask
        while True:
            u = slot_key[h]
            if u < 0:
                slot_key[h] = count
                first[count] = i
                inv[i] = count
                count += 1
                break
            f = first[u]
            if k1[f] == k1[i]:
                if k2[f] != k2[i]:
                    return -1
                inv[i] = u
                break
            h = (h + np.uint64(1)) & mask
    return count


# The known columns' keys: an open-addressing table (linear probing) of uint64 records
# (k1, k2, id + 1), 0 in the id field marking an empty slot.  The slot is a hash of the
# first half: hashed keys are mixed already, but a continuous draw's key is its draw
# number, and runs of those would otherwise fill runs of slots.
_EMPTY = np.uint64(0)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def known_find(table, u1, u2, out):  # pragma: no cover - compiled
    """``out[i]`` (int64) = the id stored for key ``(u1[i], u2[i])`` in ``table``
    (uint64 ``(S, 3)``, S a power of two), -1 if absent."""
    mask = np.uint64(table.shape[0] - 1)
    for i in range(u1.size):
        a = u1[i]
        h = _mix(a) & mask
        while True:
            rec = table[h]
            if rec[2] == _EMPTY:
                out[i] = -1
                break
            if rec[0] == a and rec[1] == u2[i]:
                out[i] = np.int64(rec[2]) - 1
                break
            h = (h + np.uint64(1)) & mask


@numba.njit(cache=True, nogil=True, boundscheck=False)
def known_insert(table, u1, u2, ids):  # pragma: no cover - compiled
    """Store keys ``(u1[i], u2[i])`` (absent from ``table``, distinct) with int64 ``ids[i]``;
    the caller keeps the table at most three quarters full."""
    mask = np.uint64(table.shape[0] - 1)
    for i in range(u1.size):
        h = _mix(u1[i]) & mask
        while table[h, 2] != _EMPTY:
            h = (h + np.uint64(1)) & mask
        table[h, 0] = u1[i]
        table[h, 1] = u2[i]
        table[h, 2] = np.uint64(ids[i] + 1)


# ----------------------------------------------------------------------------- atom values
# numpy's matrix product goes through BLAS, whose summation order depends on the matrix
# shape and on the kernel OpenBLAS picks for the CPU; numpy's own float64 exp/log also
# differ between its AVX2 and AVX-512 paths.  These loops fix the order of every
# operation and take cos/sin from rfsgen._sincos, so the bytes are the same on every
# x86-64 CPU, for any chunk of rows.  The angles of gaussian and laplace atoms (float32
# fused multiply-adds, output definition 3) are in rfsgen._sincos32.
def cis(theta, re, im) -> None:
    """``re = cos(theta)``, ``im = sin(theta)`` elementwise (:mod:`rfsgen._sincos`), float64
    ``(m, a)`` C order."""
    on_rows(_cis, theta.shape[0], theta, re, im, min_rows=_rows_for(theta.shape[1]))


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _cis(theta, re, im, start, stop):  # pragma: no cover - compiled
    n = theta.shape[1]
    for r in range(start, stop):
        sincos_into(theta[r], n, re[r], im[r])


# ----------------------------------------------------------------------------- orthogonal rows
@numba.njit(cache=True, nogil=True, boundscheck=False)
def _dot8(a, b):  # pragma: no cover - compiled
    """sum_e a[e] b[e] in a fixed order: 8 running sums (element e to sum e mod 8) added as
    ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)); the same on every CPU."""
    n = a.size
    s = np.zeros(8)
    n8 = n - n % 8
    for e in range(0, n8, 8):
        for t in range(8):
            s[t] += a[e + t] * b[e + t]
    for e in range(n8, n):
        s[0] += a[e] * b[e]
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))


@numba.njit(cache=True, nogil=True, boundscheck=False)
def orthonormal_rows(g):  # pragma: no cover - compiled
    """Orthonormalise the rows of ``g`` (float64 ``(n, d)``, n <= d, C order) in place by
    modified Gram-Schmidt with one re-orthogonalisation pass, in a fixed order.

    For Gaussian ``g`` the result is the first n rows of a Haar-random orthogonal
    matrix (the Q of a QR factorisation, made unique by positive R diagonal), as
    LAPACK's QR would give up to rounding, but with bits that do not depend on the
    CPU or on a BLAS library.
    """
    n = g.shape[0]
    for i in range(n):
        v = g[i]
        for _ in range(2):
            for j in range(i):
                c = _dot8(g[j], v)
                q = g[j]
                for e in range(v.size):
                    v[e] = v[e] - c * q[e]
        nrm = np.sqrt(_dot8(v, v))
        for e in range(v.size):
            v[e] = v[e] / nrm


# ----------------------------------------------------------------------------- huge powers
#: Rows per block of the log-domain loop: a block's log-moduli and arguments of the
#: atoms it needs (2 x atoms x LOG_ROWS float64: 400 KiB at 784 atoms) stay in L2 while
#: every term of every huge column adds its power times them into accumulators held in
#: registers (:func:`rfsgen._vector.log_sums`).
LOG_ROWS = TILE * LOG_BLOCKS


def log_domain_columns(src, ir, cr, ii, ci, uatom, cols, ptr, local, power, log_sc, sign, imag, out,
                       odd=None, easy=None, bound=True) -> None:
    """Columns whose factors could overflow (high powers of sphere factors > 1), in the
    log domain: ``out[r, cols[c]] = sign * exp(log_sc + sum p log|z|) * cos/sin(sum p arg z)``.

    ``cols`` (int64) lists the columns of ``out`` to write, each once (the bounded pass
    below writes a column's settled rows before the exact pass, so a repeated column
    would not end with its last entry's values).  Column ``c`` has terms
    ``ptr[c]:ptr[c + 1]``: term ``q`` is atom ``uatom[local[q]]`` raised to ``power[q]``
    (float64); atom k is ``cr[k] src[r, ir[k]] + 1j ci[k] src[r, ii[k]]``
    (real when ``ii[k] < 0``).  ``uatom`` (int64) lists each atom the columns use once:
    its ``log|z|`` (``math.log(math.hypot(zr, zi))``) and ``arg z`` (``math.atan2(zi, zr)``)
    are computed once per row and shared by every term that uses it, and the terms' sums
    run over blocks of :data:`LOG_ROWS` rows at once (vector lanes over rows; each row's
    sums are still taken term by term from ``log_sc[c]`` and ``0.0``, the same operations
    in the same order as one row at a time).  A zero factor gives 0 (its argument is
    stored as NaN, which only a zero factor makes, so a NaN phase marks the row); a value
    too small for the dtype underflows to 0; one too large becomes inf, which the caller
    reports.  C-library hypot/log/atan2/exp and rfsgen's own sin/cos in a fixed order,
    without fused multiply-add, so the bits do not depend on the CPU, the block or the
    threads.

    Values that the dtype rounds to a signed zero (the log-modulus below
    :func:`zero_below`: almost every value of these columns) are written as that zero
    without exp, sin or cos, when the sign of the cosine (sine) is certain
    (:func:`_certain_sign`).  ``easy`` (bool per column, :func:`rfsgen.paths.easy_columns`) marks
    columns of real atoms whose phase is a multiple of pi to well within pi/2: their sign
    is the parity of ``sum p`` over the row's negative atoms (``odd``: uint64 bit masks
    over ``uatom`` of the atoms with odd powers, one row per column), so their phases are
    summed only for the rows (of a block) that need them.  Either way each value has the
    bits the definition above gives it.

    When every column is easy and no power is negative (``bound``: on unless turned off,
    for tests), each row's log-moduli are first bounded without the C library's log
    (:func:`_log_upper`): an atom's bound is at least its ``math.log(abs(z))``, rounding
    is monotonic and the powers are not negative, so a column's bounded sum, taken with
    the same operations in the same order, is at least its exact one.  Where that is
    below the zero threshold the value is the parity's signed zero, as above; only the
    rows where some column's bound is not (or with a zero, subnormal or non-finite atom)
    have their atoms' logs taken: at d = 784, one Gaussian row in 15 for ``step`` and one
    in 5,000 for ``relu`` over a sphere coordinate node.
    """
    na = uatom.size
    nw = (na + 63) // 64
    if odd is None or easy is None:
        odd = np.zeros((cols.size, nw), np.uint64)
        easy = np.zeros(cols.size, np.bool_)
    # Bounds first (below) where every column is easy and no power is negative: the
    # bounded sums are then above the exact ones, term by term.
    bounded = bool(bound and cols.size and easy.all() and not (power < 0).any())
    on_rows(_log_domain_columns, src.shape[0], src, ir, cr, ii, ci, uatom, cols, ptr, local, power, log_sc, sign,
            imag, out, odd, easy, zero_below(out.dtype), bounded, align=LOG_ROWS,
            min_rows=max(LOG_ROWS, _rows_for(4 * cols.size)))


def zero_below(dtype) -> float:
    """A log-modulus below which ``sign * exp(lg) * cos`` is a zero in ``dtype``: under
    ``exp(-105)`` (about 2.5e-46), below half float32's least subnormal 2^-150 (7.0e-46),
    rounds to a zero of that sign; float64: ``exp(-750)`` is 0 (its least subnormal is
    4.9e-324 = exp(-744.4))."""
    return -105.0 if np.dtype(dtype).itemsize == 4 else -750.0


@numba.njit(cache=True, nogil=True, inline="always")
def _parity(x):  # pragma: no cover - compiled
    """The parity (0 or 1) of the number of bits set in uint64 ``x``."""
    x ^= x >> np.uint64(32)
    x ^= x >> np.uint64(16)
    x ^= x >> np.uint64(8)
    x ^= x >> np.uint64(4)
    x ^= x >> np.uint64(2)
    x ^= x >> np.uint64(1)
    return int(x & np.uint64(1))


@numba.njit(cache=True, nogil=True, inline="always")
def _certain_sign(ph, imag):  # pragma: no cover - compiled
    """+1.0 or -1.0: the sign of rfsgen's cos(ph) (sin(ph) when ``imag``) where it is
    certain without computing it; 0.0 otherwise.  ``ph = k pi + r`` with ``k`` the nearest
    integer to ph/pi; for ``|ph| < 2^30``, ``r = ph - k pi`` is computed to within 1e-6, so
    ``|r| < pi/2 - 1e-3`` fixes cos's sign to (-1)^k and ``1e-3 < |r| < pi - 1e-3``
    fixes sin's to (-1)^k sign(r), at least 1e-3 in magnitude, where an error under an ulp
    cannot change it.  NaN gives 0.0."""
    if not (abs(ph) < 1073741824.0):
        return 0.0
    k = math.floor(ph / math.pi + 0.5)
    r = ph - k * math.pi
    s = -1.0 if int(k) & 1 else 1.0
    if imag:
        if 1e-3 < abs(r) < math.pi - 1e-3:
            return s if r > 0.0 else -s
        return 0.0
    if abs(r) < 0.5 * math.pi - 1e-3:
        return s
    return 0.0


#: Added to every bound of log|z| (:func:`_log_upper`): above the rounding of the bound's
#: own arithmetic (terms of at most 745 and 0.7: under 3e-13 in all) and the C library's
#: log (under an ulp of 745: 1.2e-13).
LOG_UPPER_SLACK = 1e-12


@numba.njit(cache=True, nogil=True, inline="always")
def _log_upper(bits, m):  # pragma: no cover - compiled
    """An upper bound of ``math.log(|z|)`` for a normal float64 ``z`` given as its bits
    (int64 ``bits``) and its significand ``m`` in [0.5, 1) (``z = ±m 2^e``): with ``u =
    (m - 1) / (m + 1)`` in [-1/3, 0], ``log m = 2 (u + u^3/3 + u^5/5 + ...)``, every term
    negative, so ``log|z| <= e ln 2 + 2 (u + u^3/3 + u^5/5)`` (at most 1.6e-4 above it, at
    m = 0.5), plus :data:`LOG_UPPER_SLACK` for the rounding."""
    e = float(((bits >> 52) & 2047) - 1022)
    u = (m - 1.0) / (m + 1.0)
    v = u * u
    return e * 0.6931471805599453 + u * (2.0 + v * (0.6666666666666666 + v * 0.4)) + LOG_UPPER_SLACK


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _log_domain_columns(src, ir, cr, ii, ci, uatom, cols, ptr, local, power, log_sc, sign, imag, out, odd, easy,
                        below, bounded, start, stop):  # pragma: no cover
    na = uatom.size
    nw = odd.shape[1]
    # log|z| and arg z of each used atom j for row r0 + 8 b + t at [j * LOG_BLOCKS + b, t]
    la = np.empty((na * LOG_BLOCKS, TILE))
    ag = np.empty((na * LOG_BLOCKS, TILE))
    ub = np.empty((na * LOG_BLOCKS, TILE) if bounded else (0, TILE))  # bounds of la, where bounded
    acc = np.empty((2 * LOG_BLOCKS, TILE))  # a column's sums: log-moduli, then phases
    neg = np.zeros((LOG_ROWS, max(nw, 1)), np.uint64)  # the block's rows' negative real atoms, a bit each
    zero = np.zeros(LOG_ROWS, np.bool_)  # rows with a zero atom
    todo = np.zeros(LOG_ROWS, np.bool_)  # rows of an easy column that need their phase
    exact = np.ones(LOG_ROWS, np.bool_)  # rows that need their atoms' logs
    special = np.zeros(LOG_ROWS, np.bool_)  # rows with an atom the bounds do not cover
    redo = np.ones(cols.size, np.bool_)  # columns with a row the bounds did not settle
    zb = np.empty(LOG_ROWS)  # one atom's values over the block's rows, and their significands
    mb = np.empty(LOG_ROWS)
    zbits = zb.view(np.int64)
    mbits = mb.view(np.int64)
    word = np.zeros(LOG_ROWS, np.uint64)  # the negative atoms among the last 64, a bit each
    any_easy = False
    for c in range(cols.size):
        any_easy |= easy[c]
    for r0 in range(start, stop, LOG_ROWS):
        n = min(LOG_ROWS, stop - r0)
        if bounded:
            for t in range(LOG_ROWS):
                special[t] = False
                word[t] = 0
            ubf = ub.reshape(na * LOG_ROWS)  # (ub[j * LOG_BLOCKS + t // TILE, t % TILE] is ubf[j * LOG_ROWS + t])
            for j in range(na):
                k = uatom[j]
                bit = np.uint64(1) << np.uint64(j & 63)
                ck, col = cr[k], ir[k]
                for t in range(n):
                    zb[t] = ck * src[r0 + t, col]
                for t in range(n, LOG_ROWS):
                    zb[t] = 1.0
                for t in range(LOG_ROWS):  # without branches, in vector lanes
                    b = zbits[t]
                    ex = (b >> 52) & 2047
                    special[t] |= (ex == 0) | (ex == 2047)  # zero, subnormal, inf or NaN: the exact path
                    mbits[t] = (b & 0x000FFFFFFFFFFFFF) | 0x3FE0000000000000
                    word[t] |= bit & (np.uint64(0) - np.uint64(b < 0))
                if (j & 63) == 63 or j == na - 1:  # a word of negative atoms is complete
                    for t in range(LOG_ROWS):
                        neg[t, j >> 6] = word[t]
                        word[t] = 0
                for t in range(LOG_ROWS):
                    ubf[j * LOG_ROWS + t] = _log_upper(zbits[t], mb[t])
            left = 0
            for t in range(LOG_ROWS):
                exact[t] = special[t]
            for c in range(cols.size):
                log_moduli(ub, local, power, ptr[c], ptr[c + 1], log_sc[c], acc)
                redo[c] = False
                for t in range(n):
                    if special[t] or not (acc[t // TILE, t % TILE] < below):
                        exact[t] = True
                        redo[c] = True
                        continue
                    x = np.uint64(0)
                    for w in range(nw):
                        x ^= neg[t, w] & odd[c, w]
                    out[r0 + t, cols[c]] = (-sign[c] if _parity(x) else sign[c]) * 0.0
            for t in range(n):
                left += exact[t]
            if left == 0:
                continue
        for j in range(na):
            k = uatom[j]
            for t in range(LOG_ROWS):
                i = j * LOG_BLOCKS + t // TILE
                if t >= n or not exact[t]:  # past the last row, or a row the bounds settled: any finite values
                    la[i, t % TILE] = 0.0
                    ag[i, t % TILE] = 0.0
                    continue
                zr = cr[k] * src[r0 + t, ir[k]]
                if ii[k] < 0:  # a real atom: hypot(zr, 0) = |zr| and atan2(+0, zr) = 0 or pi, exactly
                    if zr == 0.0:
                        la[i, t % TILE] = -math.inf
                        ag[i, t % TILE] = math.nan
                    else:
                        la[i, t % TILE] = math.log(abs(zr))
                        ag[i, t % TILE] = 0.0 if zr > 0.0 else math.pi
                    continue
                zi = ci[k] * src[r0 + t, ii[k]]
                a = math.hypot(zr, zi)
                if a == 0.0:
                    la[i, t % TILE] = -math.inf
                    ag[i, t % TILE] = math.nan
                else:
                    la[i, t % TILE] = math.log(a)
                    ag[i, t % TILE] = math.atan2(zi, zr)
        if any_easy:  # each row's negative atoms (an argument of pi; only real atoms' bits are read) and zero atoms
            for t in range(LOG_ROWS):
                zero[t] = False
                for w in range(nw):
                    neg[t, w] = 0
            for j in range(na):
                bit = np.uint64(1) << np.uint64(j & 63)
                w = j >> 6
                for t in range(n):  # without branches: the signs are random
                    a = ag[j * LOG_BLOCKS + t // TILE, t % TILE]
                    zero[t] |= a != a
                    neg[t, w] |= bit & (np.uint64(0) - np.uint64(a == math.pi))
        for c in range(cols.size):
            if not redo[c]:  # (its rows' values are written: the same as the exact path's)
                continue
            if easy[c]:
                log_moduli(la, local, power, ptr[c], ptr[c + 1], log_sc[c], acc)
                rest = False
                for t in range(n):
                    if not exact[t]:
                        todo[t] = False
                        continue
                    lg = acc[t // TILE, t % TILE]
                    if zero[t] or not (lg < below):
                        todo[t] = True
                        rest = True
                        continue
                    todo[t] = False
                    x = np.uint64(0)
                    for w in range(nw):
                        x ^= neg[t, w] & odd[c, w]
                    out[r0 + t, cols[c]] = (-sign[c] if _parity(x) else sign[c]) * 0.0
                if not rest:
                    continue
            log_sums(la, ag, local, power, ptr[c], ptr[c + 1], log_sc[c], acc)
            for t in range(n):
                if not exact[t] or (easy[c] and not todo[t]):
                    continue
                lg = acc[t // TILE, t % TILE]
                ph = acc[LOG_BLOCKS + t // TILE, t % TILE]
                if ph != ph:  # a zero factor
                    v = 0.0
                else:
                    s = _certain_sign(ph, imag[c]) if lg < below else 0.0
                    if s != 0.0:
                        v = (sign[c] * s) * 0.0
                    else:
                        sp, cp = sincos(ph)
                        v = sign[c] * math.exp(lg) * (sp if imag[c] else cp)
                out[r0 + t, cols[c]] = v


# ----------------------------------------------------------------------------- heavy-tail degrees
@numba.njit(cache=True, nogil=True)
def _log_central_ratio(k):  # pragma: no cover - compiled
    """log(binom(2k, k) / 4^k) for k >= 0, accurate for huge k."""
    if k < 1e4:
        return math.lgamma(k + 0.5) - math.lgamma(k + 1.0) - 0.5 * math.log(math.pi)
    series = 1 - 1 / (8 * k) + 1 / (128 * k * k) + 5 / (1024 * k**3) - 21 / (32768 * k**4)
    return -0.5 * math.log(k) + math.log(series) - 0.5 * math.log(math.pi)


@numba.njit(cache=True, nogil=True)
def arcsin_tail_log_weight(k, relu):  # pragma: no cover - compiled
    """log w(k), the tail weight of relu (w ~ k^-2.5) or step (w ~ k^-1.5) at float k >= 1."""
    lw = _log_central_ratio(k) - math.log(2 * k + 1)
    if relu:
        lw -= math.log(2 * k + 2)
    return lw - math.log(math.pi)


@numba.njit(cache=True, nogil=True)
def arcsin_tail_propose(u, v, k0, s, relu, log_m, limit, k_out, ok_out):  # pragma: no cover - compiled
    """One round of rejection sampling for rfsgen.activations.ArcsinTail, in a scalar
    loop of C-library calls (the same bits on every CPU).  Proposal k = floor(k0 (1 -
    u)^(-1/s)), accepted when log v <= log w(k) - log_m - log P(k).  Returns the index
    of the first proposal at or above ``limit`` (not representable), or -1."""
    for i in range(u.size):
        x = k0 * math.pow(1.0 - u[i], -1.0 / s)
        if x >= limit:
            return i
        k = math.floor(x)
        p_k = math.pow(k / k0, -s) - math.pow((k + 1) / k0, -s)
        log_p = math.log(p_k) if p_k > 0 else -math.inf
        k_out[i] = k
        ok_out[i] = math.log(v[i]) <= arcsin_tail_log_weight(k, relu) - log_m - log_p if v[i] > 0 else True
    return -1


def _hold_signals_while_compiling(dispatcher) -> None:
    """Compile (or load from numba's cache) with SIGINT/SIGTERM/SIGHUP held, raised when
    the compilation is done.  An exception raised inside llvmlite's lock (its
    ``__enter__`` acquires, then calls back) leaves the lock held, and the next
    compilation, in a worker thread of :func:`on_rows` or in the clean-up, waits for it
    forever.  Numba's dispatcher looks ``_compile_for_args`` up on the instance only
    when no compiled version fits the arguments, so calls of compiled code cost nothing
    more."""
    compile_for_args = dispatcher._compile_for_args

    def compile_held(*args, **kws):
        with deferred():
            reached("compile")
            return compile_for_args(*args, **kws)

    dispatcher._compile_for_args = compile_held


for _dispatcher in [v for v in globals().values() if isinstance(v, numba.core.dispatcher.Dispatcher)]:
    _hold_signals_while_compiling(_dispatcher)
del _dispatcher
