"""rfsgen's own cos/sin (rfsgen._sincos) against a high-precision reference.

mpmath is not a dependency: the reference is Python's ``decimal`` at 400 digits
(the double converts to Decimal exactly; pi comes from the module's own 1600-bit
integer, checked here against a known prefix), reduced modulo 2 pi and summed as a
Taylor series at 60 digits.  Errors are measured in ulps of the exact value.
"""

import math
from decimal import Decimal, localcontext

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfsgen import _sincos as S

PI_PREFIX = "3.14159265358979323846264338327950288419716939937510582097494459230781640628620899862803482534211706"


def _pi():
    with localcontext() as ctx:
        ctx.prec = 420
        return Decimal(S._PI) / (Decimal(2) ** S._BITS)


PI = _pi()


def reference(x: float):
    """(sin x, cos x) as Decimals, good to about 50 digits for any finite double."""
    with localcontext() as ctx:
        ctx.prec = 420
        d = Decimal(x)
        k = (d / (2 * PI)).to_integral_value()
        r = d - k * 2 * PI
        ctx.prec = 60
        r = +r
        s = c = Decimal(0)
        term, n = Decimal(1), 0
        while n < 6 or abs(term) > Decimal(10) ** -58:
            sign = 1 if (n // 2) % 2 == 0 else -1
            if n % 2:
                s += sign * term
            else:
                c += sign * term
            n += 1
            term = term * r / n
        return s, c


def ulps(got: float, exact: Decimal) -> float:
    f = float(exact)
    return float(abs(Decimal(got) - exact) / Decimal(math.ulp(f) if f else 5e-324))


def _both(x):
    x = np.asarray(x, dtype=np.float64)
    re, im = np.empty_like(x), np.empty_like(x)
    S.sincos_into(x, x.size, re, im)
    return im, re


def test_pi_bits_and_constants():
    assert str(PI)[:len(PI_PREFIX)] == PI_PREFIX
    assert S.PIO2_HI == math.pi / 2
    assert S.INV_PIO2 == 2 / math.pi


# every binade from 2^-30 to 2^1023, both signs; the rounding boundary of the fast
# range; angles closest to multiples of pi/2 (the worst cancellation in the reduction)
_rng = np.random.default_rng(7)
CASES = [float(v) for v in np.concatenate([
    _rng.uniform(1, 2, 160) * 2.0 ** np.arange(-30, 1023, 6.6).astype(int)[:160] * _rng.choice([-1, 1], 160),
    [S.FAST_LIMIT, np.nextafter(S.FAST_LIMIT, np.inf), -S.FAST_LIMIT, 1e300, 1.7976931348623157e308, 1e22,
     6381956970095103 * 2.0 ** 797, 2.0 ** 1023, 0.5, math.pi / 4, 5e-324, 2.2e-308],
])]
with localcontext() as _ctx:
    _ctx.prec = 420
    CASES += [float(Decimal(k) * PI / 2) for k in list(range(1, 40)) + [355, 710, 104348, 2 ** 19, 2 ** 19 + 1,
                                                                     10 ** 8 + 7, 2 ** 40 + 5, 10 ** 30]]


def test_error_below_one_ulp_over_the_whole_range():
    s, c = _both(CASES)
    worst = 0.0
    for x, si, co in zip(CASES, s, c):
        rs, rc = reference(x)
        e = max(ulps(si, rs), ulps(co, rc))
        assert e < 1.0, (x, si, co, e)
        worst = max(worst, e)
    assert worst > 0.0  # the check measured something


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, width=64))
def test_error_below_one_ulp_for_any_double(x):
    si, co = (v[0] for v in _both([x]))
    rs, rc = reference(x)
    assert ulps(si, rs) < 1.0 and ulps(co, rc) < 1.0


def test_fast_and_slow_paths_agree_bit_for_bit():
    """The Payne-Hanek path (used beyond FAST_LIMIT) gives the fast path's bits on its
    range: both reduce to the same double-double within far below an ulp."""
    x = np.concatenate([np.random.default_rng(3).uniform(-S.FAST_LIMIT, S.FAST_LIMIT, 3000),
                        np.random.default_rng(4).standard_normal(1000) * 30])
    s, c = _both(x)
    slow = np.array([S.slow_sincos(v) for v in x])
    assert s.tobytes() == slow[:, 0].tobytes() and c.tobytes() == slow[:, 1].tobytes()
    scalar = np.array([S.sincos(v) for v in x])
    assert s.tobytes() == scalar[:, 0].tobytes() and c.tobytes() == scalar[:, 1].tobytes()


def test_float32_rounds_like_the_reference():
    """The float32 of the float64 result is the correctly rounded float32 of the exact
    value (for these angles: no case within 2^-29 of a float32 rounding boundary)."""
    x = np.random.default_rng(5).standard_normal(2000) * 50
    s, c = _both(x)
    for v, si, co in zip(x[:400], s, c):
        rs, rc = reference(float(v))
        assert np.float32(si) == np.float32(float(rs)) and np.float32(co) == np.float32(float(rc))


@pytest.mark.parametrize("x", [math.inf, -math.inf, math.nan])
def test_non_finite_angles_give_nan(x):
    s, c = _both([x])
    assert math.isnan(s[0]) and math.isnan(c[0])


def test_same_bits_for_any_length_and_position():
    """The vector loop's tail and its lanes compute what one value alone computes."""
    x = np.random.default_rng(6).standard_normal(37) * 1e3
    x[5] = 1e7  # a slow-path value among fast ones
    s, c = _both(x)
    for n in (1, 3, 8, 13):
        for i in range(0, 37 - n, 5):
            s2, c2 = _both(x[i:i + n])
            assert s2.tobytes() == s[i:i + n].tobytes() and c2.tobytes() == c[i:i + n].tobytes()
