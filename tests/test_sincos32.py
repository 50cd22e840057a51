"""Output definition 3's arithmetic (rfsgen._sincos32): the float32 fused multiply-add
against exact rational arithmetic, and the float32-accurate cos/sin against the
400-digit ``decimal`` reference of tests/test_sincos.py."""

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfsgen import _sincos, _sincos32 as S
from test_sincos import reference

numba = pytest.importorskip("numba")


@numba.njit(cache=False)
def _fma_all(a, b, c, out):
    for i in range(a.size):
        out[i] = S.fma32(a[i], b[i], c[i])


def fma_reference(a, b, c):
    """a * b + c rounded once to float32 (round to nearest, ties to even), elementwise,
    in numpy: the float64 product of two float32 values is exact, the float64 sum
    ``s`` with its error ``e`` (two-sum) is exact, and ``float32(s)`` is the correctly
    rounded result unless ``s`` is a float32 midpoint and ``e`` is not 0 (a midpoint
    is a float64, so the exact sum lies on the side ``e`` says)."""
    a, b, c = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    bb = s - p
    e = (p - (s - bb)) + (c - bb)
    r = s.astype(np.float32)
    rd = r.astype(np.float64)
    toward = np.where(s > rd, np.float32(np.inf), np.float32(-np.inf)).astype(np.float32)
    other = np.nextafter(r, toward)
    mid = (rd + other.astype(np.float64)) * 0.5
    fix = (s != rd) & (s == mid) & (e != 0) & np.isfinite(s)
    up = np.maximum(r, other)
    down = np.minimum(r, other)
    return np.where(fix, np.where(e > 0, up, down), r).astype(np.float32)


def _exact(a, b, c):
    """The correctly rounded float32 of a * b + c, from the exact rational value."""
    ex = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    r = np.float32(float(ex))
    cands = [np.nextafter(r, np.float32(-np.inf)), r, np.nextafter(r, np.float32(np.inf))]
    return min(cands, key=lambda v: (abs(Fraction(float(v)) - ex), int(np.array(v).view(np.int32)) & 1))


def _triples():
    rng = np.random.default_rng(3)
    n = 3000
    a = (rng.standard_normal(n) * 2.0 ** rng.integers(-70, 60, n)).astype(np.float32)
    b = (rng.standard_normal(n) * 2.0 ** rng.integers(-70, 60, n)).astype(np.float32)
    c = (rng.standard_normal(n) * 2.0 ** rng.integers(-140, 120, n)).astype(np.float32)
    # c = -round(a b): the exact sum is the product's rounding error (cancellation)
    c[:500] = -(a[:500].astype(np.float64) * b[:500]).astype(np.float32)
    # double rounding traps: a b = 1 + 2^-24 + 2^-(24 + k), exactly a float32 midpoint in
    # float64 after adding c = 0 when the tail is lost: (1 + 2^-12)(1 + 2^-12 + ...) forms
    u = np.float32(1 + 2.0 ** -12)
    for k, i in enumerate(range(500, 560)):
        a[i] = u
        b[i] = np.float32(1 + 2.0 ** -12 - 2.0 ** -23 * (k % 3))
        c[i] = np.float32(-(2.0 ** -(40 + k % 20))) * (1 if k % 2 else -1)
    # subnormal results and signed zeros
    a[560:600] = np.float32(2.0 ** -75) * rng.choice([-1, 1], 40).astype(np.float32)
    b[560:600] = np.float32(2.0 ** -60)
    c[560:580] = np.float32(0.0)
    c[580:600] = np.float32(-0.0)
    return a, b, c


def test_fma32_is_one_rounding_and_the_reference_is_too():
    a, b, c = _triples()
    got = np.empty_like(a)
    _fma_all(a, b, c, got)
    ref = fma_reference(a, b, c)
    exact = np.array([_exact(*t) for t in zip(a, b, c)], dtype=np.float32)
    assert got.tobytes() == exact.tobytes()
    assert ref.tobytes() == exact.tobytes()
    # and it is not the product rounded and then added
    split = ((a.astype(np.float64) * b).astype(np.float32) + c).astype(np.float32)
    assert split.tobytes() != exact.tobytes()


def _ulp32(v: float) -> float:
    f = np.float32(abs(v))
    return float(np.nextafter(f, np.float32(np.inf)) - f) if f else float(np.float32(2.0 ** -149))


# every float32 binade from 2^-40 to 2^127, both signs; the fast range's edge; angles
# near multiples of pi/2 (the largest cancellation in the reduction); the largest float32
_rng = np.random.default_rng(11)
_e = np.arange(-40, 128)
ANGLES = np.concatenate([
    (_rng.uniform(1, 2, _e.size) * 2.0 ** _e * _rng.choice([-1, 1], _e.size)),
    (np.arange(1, 400) ** 2 * 2.0 ** 2 * math.pi),  # n pi / 2, n = 8 k^2, rounded to float32
    np.arange(1, 60) * (math.pi / 2),
    [_sincos.FAST_LIMIT, -_sincos.FAST_LIMIT, np.nextafter(np.float32(_sincos.FAST_LIMIT), np.float32(np.inf)),
     float(np.finfo(np.float32).max), 1e30, 0.5, math.pi / 4, 2.0 ** -149, 1e-45],
]).astype(np.float32)


def _both(t):
    t = np.asarray(t, dtype=np.float32)
    re, im = np.empty(t.size), np.empty(t.size)
    S.sincos_into(t, t.size, re, im)
    return im, re


def test_error_far_below_one_float32_ulp_over_the_whole_range():
    """The float64 values are within 1/50 of a float32 ulp of the exact ones, so their
    float32 rounding is within 1 ulp of the correctly rounded float32 value (and
    equal to it unless the exact value lies that close to a rounding boundary)."""
    s, c = _both(ANGLES)
    worst = 0.0
    for t, sv, cv in zip(ANGLES, s, c):
        rs, rc = reference(float(t))
        for got, ex in ((sv, rs), (cv, rc)):
            err = float(abs(Decimal(float(got)) - ex)) / _ulp32(float(ex))
            worst = max(worst, err)
            r32, g32 = np.float32(float(ex)), np.float32(got)
            assert abs(int(np.array(r32).view(np.int32)) - int(np.array(g32).view(np.int32))) <= 1, t
    assert worst < 0.02, worst


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_error_below_one_ulp_for_any_float32(t):
    s, c = _both([t])
    rs, rc = reference(float(t))
    for got, ex in ((s[0], rs), (c[0], rc)):
        assert float(abs(Decimal(float(got)) - ex)) / _ulp32(float(ex)) < 0.02


def test_the_exhaustive_check_s_inputs_agree_with_float64():
    """The float64 routine (under 1 ulp of float64) stands in for the exact values in
    tests/tools/fit_sincos32.py's check of every float32: on a sample they agree to
    1/50 of a float32 ulp."""
    t = (_rng.standard_normal(20000) * 10.0 ** _rng.uniform(-6, 6, 20000)).astype(np.float32)
    s, c = _both(t)
    r64c, r64s = np.empty(t.size), np.empty(t.size)
    _sincos.sincos_into(t.astype(np.float64), t.size, r64c, r64s)
    ulp = np.spacing(np.abs(np.vstack([r64s, r64c])).astype(np.float32)).astype(np.float64)
    ulp = np.maximum(ulp, 2.0 ** -149)
    assert (np.abs(np.vstack([s, c]) - np.vstack([r64s, r64c])) / ulp).max() < 0.02


def test_non_finite_angles_give_nan_and_zero_has_no_sign():
    s, c = _both([np.inf, -np.inf, np.nan, -0.0, 0.0])
    assert np.isnan(s[:3]).all() and np.isnan(c[:3]).all()
    assert s[3:].tobytes() == np.zeros(2).tobytes() and (c[3:] == 1.0).all()


def test_same_bits_for_any_length_position_and_one_at_a_time():
    t = ANGLES
    s, c = _both(t)
    for n in (1, 3, 7, 17):
        for i0 in range(0, 40, 13):
            ss, cc = _both(t[i0:i0 + n])
            assert ss.tobytes() == s[i0:i0 + n].tobytes() and cc.tobytes() == c[i0:i0 + n].tobytes()
    one = np.array([S.sincos(np.float32(v)) for v in t[:50]])
    assert one[:, 0].tobytes() == s[:50].tobytes() and one[:, 1].tobytes() == c[:50].tobytes()


def _scalar_sincos(t):
    """sincos_into's scalar steps (the loop's tail), one angle at a time in Python:
    _reduce, _kernels and _quadrant as compiled, then redo_slow's values beyond the fast
    range."""
    re, im = np.empty(t.size), np.empty(t.size)
    for i, v in enumerate(t):
        re[i:i + 1], im[i:i + 1] = np.nan, np.nan
        S.sincos_into(t[i:i + 1], 1, re[i:i + 1], im[i:i + 1])  # n = 1: the scalar tail only
    return re, im


_SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45], np.float32)
_BITS = np.concatenate([
    _SPECIAL,  # in vector lanes (first) and in the scalar tail (last)
    ANGLES,
    _rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32).view(np.float32),  # every class of float32
    (_rng.standard_cauchy(4000) * 1e3).astype(np.float32),
    _SPECIAL[:6],
])


def test_vector_lanes_have_the_scalar_loops_bits():
    """sincos_into runs SINCOS_LANES angles at once (sincos_lanes, explicit vectors) and
    the rest one at a time: every lane, whatever its place, has the scalar steps' bits,
    on C-ordered and strided arrays, and the lanes beyond the fast range are redone."""
    re0, im0 = _scalar_sincos(_BITS)
    for view in (lambda a: a, lambda a: a[1:], lambda a: a[5:-3]):
        t = view(_BITS)
        re, im = np.empty(t.size), np.empty(t.size)
        S.sincos_into(t, t.size, re, im)
        assert re.view(np.uint64).tolist() == view(re0).view(np.uint64).tolist()
        assert im.view(np.uint64).tolist() == view(im0).view(np.uint64).tolist()
    wide = np.empty(2 * _BITS.size, np.float32)
    wide[::2] = _BITS
    re, im = np.empty((_BITS.size, 2)), np.empty((_BITS.size, 2))
    S.sincos_into(wide[::2], _BITS.size, re[:, 1], im[:, 0])  # strided angles and values
    assert re[:, 1].tobytes() == re0.tobytes() and im[:, 0].tobytes() == im0.tobytes()


def test_sincos_into_never_writes_past_its_arrays():
    t = _BITS[:21]
    re, im = np.full(30, 7.0), np.full(30, 7.0)
    S.sincos_into(t, 1000, re[:19], im[:23])  # n beyond every array: the shortest decides
    assert (re[19:] == 7.0).all() and (im[19:] == 7.0).all() and not (im[19:23] != 7.0).any()
    re, im = np.full(30, 7.0), np.full(30, 7.0)
    for n in (-1, -9, -(2**62)):  # nothing at all (a negative index would wrap around)
        S.sincos_into(t[10:13], n, re[10:13], im[10:13])
        assert (re == 7.0).all() and (im == 7.0).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_value_lanes_are_the_product_of_sincos_into(dtype):
    """value_lanes computes one polynomial a lane (sin's or cos's, by the wanted value and
    the quadrant) and the scaled value: the bits of sincos_into's cos or sin times the
    scale, cast to the output's dtype; it counts the angles beyond the fast range (whose
    values the caller redoes)."""
    import numba

    @numba.njit
    def run(theta, sc, want, out, out2):
        slow = 0
        for i in range(0, theta.size - theta.size % S.SINCOS_LANES, S.SINCOS_LANES):
            k = i % sc.size
            slow += S.value_lanes(theta, i, sc, want, k, out)
            slow += S.value_lanes_at(theta, i, sc, want, k, out2, i // 16, i % 16)
        return slow

    n = (_BITS.size // 16) * 16
    t = _BITS[:n]
    sc = _rng.standard_normal(64) * 10.0 ** _rng.uniform(-5, 5, 64)
    sc[:4] = (0.0, -0.0, 1.0, -1.0)
    want = _rng.random(64) < 0.5
    out, out2 = np.empty(n, dtype), np.empty((n // 16, 16), dtype)
    slow = run(t, sc, want, out, out2)
    re, im = np.empty(n), np.empty(n)
    S.sincos_into(t, n, re, im)
    k = np.arange(n) % 8 + (np.arange(n) // 8 * 8) % 64
    expect = (sc[k] * np.where(want[k], im, re)).astype(dtype)
    with np.errstate(invalid="ignore"):  # signalling NaNs among the bit patterns
        fast = np.abs(t.astype(np.float64)) <= S.FAST_LIMIT
    assert slow == 2 * int((~fast).sum()) > 0
    assert out[fast].tobytes() == expect[fast].tobytes()
    assert out2.reshape(-1)[fast].tobytes() == expect[fast].tobytes()
