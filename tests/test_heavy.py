"""The fast paths for heavy-tailed columns (step, relu, leaky_relu, arccos of degree 0
over sphere nodes) give the bytes of the general paths they shortcut:

* the product loop's real-factor path (one multiply a factor, rfsgen._vector.product_real)
  against the complex product of every column;
* the log domain's signed zeros (no exp, sin or cos where the value rounds to a zero of
  a certain sign) and its easy columns (real atoms: the sign from the parity of the
  negative atoms' odd powers, phases summed only for the rows that need them) against
  the definition, one row and one term at a time;
* the compiled check of the columns that may overflow against numpy's."""

import math
import warnings

import numpy as np
import pytest

from rfsgen import parse_skeleton
from rfsgen.sampler import sample

HEAVY = ["step", "relu", "{name: leaky_relu, slope: 0.2}", "{name: arccos, degree: 0}"]


def _skeleton(d, act, scheme="coordinate"):
    return parse_skeleton(f"rfsgen: 1\ninput: {{width: {d}}}\nnodes:\n  - {{name: x, base: sphere, scheme: {scheme}}}\n"
                          f"  - {{name: y, activation: {act}, inputs: [x]}}\noutput: y\n")


def _features(d, act, columns, seed, scheme="coordinate"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # step over a sphere: the infinite-variance warning
        return sample(_skeleton(d, act, scheme), columns, seed=seed)


def _rows(d, m, seed):
    """Gaussian rows, rows near an axis (large factors: values of the huge columns that
    are not zero), rows exactly on an axis and with exact zeros (zero factors), rows whose
    other coordinates are tiny (products that underflow to zeros of either sign)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, d))
    near = np.arange(1, m, 4)
    x[near] *= rng.uniform(0.02, 0.5, (near.size, 1))
    x[near, rng.integers(0, d, near.size)] = rng.choice([-1.0, 1.0], near.size)
    x[2::9, 1:] = 0.0
    x[2::9, 0] = -0.8
    x[3::7, d // 2] = 0.0
    tiny = np.arange(5, m, 11)
    x[tiny] *= 1e-150
    x[tiny, 0] = rng.choice([-1.0, 1.0], tiny.size)
    x[6::13, d - 1] = rng.choice([-3e-310, 3e-310])  # subnormal factors
    return x


def _hypot(x, y):
    """The compiled loops' hypot (CPython's math.hypot is its own, not the C library's)."""
    global _HYPOT
    if _HYPOT is None:
        import numba

        _HYPOT = numba.njit(lambda a, b: math.hypot(a, b))
    return _HYPOT(x, y)


_HYPOT = None


def _log_reference(tr, fs, src, j):
    """Column ``j`` as the log domain defines it, one row and one term at a time."""
    from rfsgen._sincos import sincos

    out = np.empty(src.shape[0])
    lg0 = float(tr.huge_log_sc[np.searchsorted(tr.huge, j)])  # numpy's log of the scale, as the transformer takes it
    for r in range(src.shape[0]):
        lg, ph, zero = lg0, 0.0, False
        for q in range(int(fs.ptr[j]), int(fs.ptr[j + 1])):
            k = int(tr.term_atom[q])
            zr = tr.cr[k] * src[r, tr.ir[k]]
            zi = tr.ci[k] * src[r, tr.ii[k]] if tr.ii[k] >= 0 else 0.0
            a = _hypot(zr, zi)
            if a == 0.0:
                zero = True
                break
            lg += float(fs.power[q]) * math.log(a)
            ph += float(fs.power[q]) * math.atan2(zi, zr)
        sp_, cp = sincos(ph)
        out[r] = 0.0 if zero else (-1.0 if fs.kind[j] == 2 else 1.0) * math.exp(lg) * (sp_ if fs.kind[j] == 2 else cp)
    return out


@pytest.mark.parametrize("act", HEAVY)
@pytest.mark.parametrize("scheme", ["coordinate", "pair"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_real_factor_products_have_the_complex_products_bits(act, scheme, dtype):
    """Every column of the product loop, real-factor path on and off: the same bytes,
    including zeros of either sign from underflowing products and zero factors."""
    from rfsgen._compiled import columns
    from rfsgen.transform import Transformer

    d = 8
    fs = _features(d, act, 512, seed=2, scheme=scheme)
    x = _rows(d, 203, seed=1)  # a partial last tile
    tr = Transformer(fs, dtype)
    src = tr.source(x)
    assert (tr.real & (np.diff(tr.fptr) > 0)).any() == (scheme == "coordinate")  # (a column without terms is real)
    fast = np.empty((x.shape[0], fs.columns), dtype)
    slow = np.empty_like(fast)
    columns(src, tr.ir, tr.cr, tr.ii, tr.ci, tr.xatom, tr.xpow, tr.fidx, tr.fptr, tr.sc, tr.imag, tr.pos, fast, tr.real)
    columns(src, tr.ir, tr.cr, tr.ii, tr.ci, tr.xatom, tr.xpow, tr.fidx, tr.fptr, tr.sc, tr.imag, tr.pos, slow)
    loop = np.setdiff1d(np.arange(fs.columns), tr.huge)
    assert fast[:, loop].tobytes() == slow[:, loop].tobytes()
    if scheme == "coordinate":
        real_cols = loop[tr.real[tr.pos[loop]]]
        vals = slow[:, real_cols]
        assert ((vals == 0) & np.signbit(vals)).any() and ((vals == 0) & ~np.signbit(vals)).any()


@pytest.mark.parametrize("act", HEAVY)
@pytest.mark.parametrize("scheme", ["coordinate", "pair"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_log_domain_shortcuts_have_the_bits_of_the_definition(act, scheme, dtype):
    """Every huge column (forced: every column of the feature set through the log domain,
    so that values that are not zeros are many) against the per-row, per-term definition,
    with the easy columns on and off."""
    from rfsgen._compiled import log_domain_columns
    from rfsgen.transform import Transformer

    d = 6
    fs = _features(d, act, 96, seed=4, scheme=scheme)
    x = _rows(d, 75, seed=3)
    tr = Transformer(fs, dtype)
    tr.log_domain(fs, np.arange(fs.columns), tr.term_atom, fs.power.astype(np.int64), fs.kind == 2)
    src = tr.source(x)
    assert (tr.huge_easy & (np.diff(tr.huge_ptr) > 0)).any() == (scheme == "coordinate")
    # the bounds first where every column is easy (coordinate), then without them
    assert (tr.huge_easy.all() and (tr.huge_power >= 0).all()) == (scheme == "coordinate")
    got = {}
    for easy, bound in ((True, True), (True, False), (False, True)):
        o = np.full((x.shape[0], fs.columns), np.nan, dtype)
        extra = (tr.huge_odd, tr.huge_easy) if easy else ()
        log_domain_columns(src, tr.ir, tr.cr, tr.ii, tr.ci, tr.huge_uatom, tr.huge, tr.huge_ptr, tr.huge_local,
                           tr.huge_power, tr.huge_log_sc, tr.huge_sign, tr.huge_imag, o, *extra, bound=bound)
        got[easy, bound] = o
    ref = np.stack([_log_reference(tr, fs, src, j) for j in range(fs.columns)], axis=1)
    with np.errstate(over="ignore"):
        ref = ref.astype(dtype)
    for key, o in got.items():
        assert o.tobytes() == ref.tobytes(), key
    assert (ref != 0).any() and ((ref == 0) & np.signbit(ref)).any()


@pytest.mark.parametrize("act", ["step", "{name: arccos, degree: 0}"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_heavy_columns_of_a_wide_sphere_have_the_bits_of_the_definition(act, dtype):
    """Columns of tens of terms and powers in the thousands to millions (the log domain's
    own choice of columns), whose values round to zeros almost everywhere: the signed
    zeros without exp and cos, the easy columns' parity, a zero factor's +0.0."""
    from rfsgen.transform import Transformer

    d = 32
    fs = _features(d, act, 1024, seed=1)
    x = _rows(d, 70, seed=5)
    tr = Transformer(fs, dtype)
    assert tr.huge.size and tr.huge_easy.all()
    z = tr.chunk(x)
    src = tr.source(x)
    for j in tr.huge:
        assert z[:, j].tobytes() == _log_reference(tr, fs, src, j).astype(dtype).tobytes(), j
    h = z[:, tr.huge]
    assert ((h == 0) & np.signbit(h)).any() and ((h == 0) & ~np.signbit(h)).any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shift", [0.0, -300.0])
def test_the_bounds_settle_only_values_that_round_to_zeros(dtype, shift):
    """Easy columns whose log-moduli straddle the dtype's zero threshold (each column's
    scale puts its median row on it), or lie far below it (``shift``: every row but those
    with a zero or subnormal factor settled by the bounds, whole blocks of rows without
    the exact pass): every value, a zero the bounds settled or not, has the bits of the
    loop without the bounds (a zero factor's +0.0 among them)."""
    from rfsgen._compiled import log_domain_columns, zero_below
    from rfsgen.paths import easy_columns

    rng = np.random.default_rng(7)
    m, na, nc = 203, 90, 40
    src = rng.standard_normal((m, na))
    ir, ii = np.arange(na), np.full(na, -1)
    cr, ci = rng.uniform(0.5, 2.0, na), np.zeros(na)
    ptr = np.concatenate([[0], np.cumsum(rng.integers(1, 9, nc))])
    local = rng.integers(0, na, ptr[-1])
    power = rng.integers(1, 6, ptr[-1]).astype(np.float64)
    busy = np.argsort(np.bincount(local, minlength=na))[::-1]  # the atoms most terms use
    src[3, busy[0]] = 0.0
    src[10, busy[1]] = -0.0
    src[40, busy[2]] = -3e-310
    with np.errstate(divide="ignore"):
        logs = np.log(np.abs(cr * src))
    sums = np.stack([logs[:, local[ptr[c]:ptr[c + 1]]] @ power[ptr[c]:ptr[c + 1]] for c in range(nc)], axis=1)
    below = zero_below(dtype)
    log_sc = below - np.median(sums, axis=0) + shift
    imag, sign = np.zeros(nc, np.bool_), np.ones(nc)
    odd, easy = easy_columns(ii, np.arange(na), ptr, local, power, imag)
    assert easy.all()
    got = {}
    for bound in (True, False):
        o = np.full((m, nc), np.nan, dtype)
        log_domain_columns(src, ir, cr, ii, ci, np.arange(na), np.arange(nc), ptr, local, power, log_sc, sign, imag,
                           o, odd, easy, bound=bound)
        got[bound] = o
    assert got[True].tobytes() == got[False].tobytes()
    z = got[False]
    if shift == 0.0:
        near = np.abs(log_sc + sums - below) < 10
        assert near.mean() > 0.2 and (z[near] != 0).any() and (z[near] == 0).any()
    else:
        assert (z == 0).all() and np.signbit(z).mean() > 0.2
        with_zero = [c for c in range(nc) if busy[0] in local[ptr[c]:ptr[c + 1]]]
        assert with_zero and not np.signbit(z[3, with_zero]).any()


def test_the_log_bound_is_above_the_c_librarys_log():
    """_log_upper(bits, m) is at least math.log(|z|) as the compiled loops compute it (the
    C library's), and at most 1.6e-4 above it, for normal z of every exponent, of either
    sign, with significands at and next to 0.5 and 1 and random in between."""
    import numba

    from rfsgen._compiled import _log_upper

    log = numba.njit(lambda z: math.log(abs(z)))
    rng = np.random.default_rng(0)
    m = np.concatenate([[0.5, np.nextafter(0.5, 1), np.nextafter(1.0, 0), 0.75, 2 ** -0.5],
                        rng.uniform(0.5, 1.0, 400), np.nextafter(1.0, 0) - rng.uniform(0, 1e-9, 40)])
    e = np.concatenate([np.arange(-1021, 1025), rng.integers(-1021, 1025, m.size - 2046 % m.size)])
    z = np.ldexp(np.resize(m, e.size) * rng.choice([-1.0, 1.0], e.size), e)
    assert np.isfinite(z).all() and (np.abs(z) >= np.finfo(np.float64).tiny).all()
    for v in z:
        bits = int(np.float64(v).view(np.int64))
        mant = np.frexp(abs(v))[0]
        up, exact = _log_upper(bits, mant), log(v)
        assert exact <= up <= exact + 1.6e-4 + 1e-11, (v, exact, up)


def test_certain_signs_are_the_sign_of_rfsgen_cos_and_sin():
    """_certain_sign answers only where rfsgen's cos (sin) has that sign; near the zeros
    of cos (sin), for NaN and for angles of 2^30 and more, it does not answer."""
    from rfsgen._compiled import _certain_sign
    from rfsgen._sincos import sincos

    rng = np.random.default_rng(0)
    k = rng.integers(-10**8, 10**8, 4000).astype(np.float64)
    angles = np.concatenate([rng.uniform(-1e4, 1e4, 4000), k * math.pi, k * math.pi + 1e-9, k * math.pi + math.pi / 2,
                             rng.uniform(-2e9, 2e9, 200), [0.0, -0.0, 1e-300, math.pi / 2, math.nan, math.inf]])
    answered = {False: 0, True: 0}
    for ph in angles:
        s, c = sincos(float(ph))
        for imag in (False, True):
            sign = _certain_sign(float(ph), imag)
            v = s if imag else c
            if sign != 0.0:
                answered[imag] += 1
                assert v != 0.0 and math.copysign(1.0, v) == sign, (ph, imag)
    assert _certain_sign(math.nan, False) == 0.0 and _certain_sign(2.0**31, False) == 0.0
    assert _certain_sign(math.pi / 2, False) == 0.0 and _certain_sign(1e-9, True) == 0.0
    assert answered[False] > 10000 and answered[True] > 7000


def test_easy_columns_need_real_atoms_a_cosine_and_a_small_phase():
    """A column is easy only with real atoms, the cosine, and powers whose phase sum stays
    within 0.5 of a multiple of pi; the odd-power masks are the XOR of the terms' bits."""
    from rfsgen.paths import easy_columns

    ii = np.array([-1, -1, 3, -1])
    uatom = np.array([0, 1, 2, 3])
    ptr = np.array([0, 2, 4, 5, 6, 7])
    local = np.array([0, 1, 0, 2, 3, 1, 3])
    power = np.array([3.0, 2.0, 1.0, 1.0, 5.0, 2.0**52, 7.0])
    imag = np.array([False, False, False, False, True])
    odd, easy = easy_columns(ii, uatom, ptr, local, power, imag)
    assert easy.tolist() == [True, False, True, False, False]
    assert odd[:, 0].tolist() == [0b0001, 0b0001, 0b1000, 0, 0b1000]


def test_first_nonfinite_finds_what_numpy_finds():
    from rfsgen._compiled import first_nonfinite_rows as first_nonfinite

    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        out = rng.standard_normal((50, 40)).astype(dtype)
        cols = np.array([3, 17, 5, 39], np.int64)
        assert first_nonfinite(out, cols) == (-1, -1)
        out[30, 5] = np.inf
        out[30, 17] = np.nan
        out[41, 3] = -np.inf
        out[10, 6] = np.nan  # not a checked column
        want = tuple(np.argwhere(~np.isfinite(out[:, cols]))[0])
        assert first_nonfinite(out, cols) == want == (30, 1)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_first_nonfinite_over_row_parts_is_the_first_row(threads, monkeypatch):
    """Rows split over threads (parts of at least 16,384 rows for 4 columns): the first bad row
    wins whichever part finishes first, and a column outside the row is never read."""
    from rfsgen import _compiled
    from rfsgen._compiled import first_nonfinite_rows, nonfinite_rows

    monkeypatch.setattr(_compiled, "threads", lambda: threads)
    assert len(_compiled.row_parts(40_000, min_rows=16_384)) - 1 == min(threads, 2)
    out = np.ones((40_000, 12), np.float32)
    cols = np.array([3, 11, 5, 0], np.int64)
    assert first_nonfinite_rows(out, cols) == (-1, -1)
    out[39_000, 0] = np.inf  # the last part
    assert first_nonfinite_rows(out, cols) == (39_000, 3)
    out[20_000, 5] = np.nan  # the second part
    out[20_000, 7] = np.inf  # not checked
    assert first_nonfinite_rows(out, cols) == (20_000, 2)
    out[5, 11] = -np.inf  # the first part
    assert first_nonfinite_rows(out, cols) == (5, 1)
    bad = np.zeros(10, np.bool_)
    nonfinite_rows(out, np.array([-1, 12, 99, 11], np.int64), bad, 0, 10)
    assert np.flatnonzero(bad).tolist() == [5]  # columns outside the row are skipped, not read
    bad[:] = False
    nonfinite_rows(out, np.array([-1, 12, 99], np.int64), bad, 0, 10)
    assert not bad.any()


def test_faint_rows_are_the_rows_without_a_normal_value(monkeypatch):
    """faint_rows against numpy's peak test: zero rows, subnormal-only rows and rows with one
    normal value anywhere (the scan stops at it), float32 and float64, one and four parts."""
    from rfsgen import _compiled
    from rfsgen._compiled import faint_rows, on_rows

    monkeypatch.setattr(_compiled, "threads", lambda: 4)

    rng = np.random.default_rng(1)
    for dtype in (np.float32, np.float64):
        tiny = np.finfo(dtype).tiny
        out = (rng.uniform(-0.99, 0.99, (9000, 33)) * tiny).astype(dtype)  # subnormal (or zero) values
        out[::3] = rng.standard_normal((3000, 33))  # every third row normal
        out[1::3, 32] = tiny  # ... and these by their last value alone
        out[7] = 0.0
        out[8, 0] = -np.finfo(dtype).max
        want = ~(np.abs(out).max(axis=1) >= tiny)
        for parts in (1, 4):
            faint = np.zeros(out.shape[0], np.bool_)
            on_rows(faint_rows, out.shape[0], out, float(tiny), faint, min_rows=out.shape[0] // parts)
            assert faint.tolist() == want.tolist()
        assert want[7] and not want[8] and want[2] and not want[1]


def test_powers_of_lane_rows_have_the_scalar_powers_bits():
    """power_row (8 lanes at once, in registers) against _power (lane by lane), negative
    powers, zeros of either sign, tiny and large values, powers up to 2^62."""
    import numba

    from rfsgen._compiled import _power
    from rfsgen._vector import power_row

    @numba.njit
    def raise_row(fr, fi, k, p, dst):
        power_row(fr, fi, k, p, dst)

    rng = np.random.default_rng(0)
    vals = np.concatenate([rng.standard_normal(64), [0.0, -0.0, 1e-200, -1e-200, 1e200, 3.0, -1.5, 1.0]])
    unit = np.exp(1j * rng.uniform(-np.pi, np.pi, 8))
    for p in [0, 1, 2, 3, 5, 8, 13, 64, 1001, 2**40 + 3, 2**62 - 1, -1, -2, -7, -64, -(2**33)]:
        fr = rng.choice(vals, (4, 8))
        fi = rng.choice(vals, (4, 8))
        fi[1] = 0.0  # a real atom
        fr[3], fi[3] = unit.real, unit.imag  # unit modulus: large powers stay finite
        for k in (0, 1, 3):
            before = fr.copy(), fi.copy()
            raise_row(fr, fi, k, p, 2)
            wr, wi = np.empty(8), np.empty(8)
            _power(fr[k].copy(), fi[k].copy(), p, wr, wi)
            assert fr[2].tobytes() == wr.tobytes() and fi[2].tobytes() == wi.tobytes(), (p, k)
            keep = [0, 1, 3]  # only the destination row is written
            assert fr[keep].tobytes() == before[0][keep].tobytes() and fi[keep].tobytes() == before[1][keep].tobytes()
