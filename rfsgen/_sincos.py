"""rfsgen's own cos and sin of float64 angles (from output definition 2; under definition 3 the
circle, categorical, brownian and log-domain values, and rfsgen._sincos32's slow path), compiled with numba.

Why not the C library: its results differ between libraries and versions, and
glibc picks FMA-compiled variants of sin/cos at run time on CPUs that have FMA, so
the bits of an output could depend on the machine.  Here every operation is a
plain IEEE float64 add, subtract, multiply or an exact integer operation, written
out in a fixed order (numba compiles without fast-math, so LLVM never contracts a
multiply and an add into an FMA nor reorders them): the bits are the same on every
x86-64 CPU, whatever the vector width the loops are compiled for.

Method (the scheme of fdlibm/FreeBSD's ``sin``/``cos``):

* argument reduction ``x = n pi/2 + r``, ``|r| <= pi/4`` (slightly more at the
  rounding boundary), with ``r`` as a double-double ``r_hi + r_lo``:
  for ``|x| <= FAST_LIMIT`` (2^19 pi/2, about 8.2e5) by Cody-Waite: n = x 2/pi
  rounded to nearest by the 1.5 * 2^52 trick, then ``x - n P1`` (exact by Sterbenz),
  ``- n P2 - n P3`` with error-free two-sums and ``- n P3t`` (P1, P2, P3 are 33-bit
  pieces of pi/2 so that each ``n Pi`` is exact for |n| < 2^20; about 150 bits of
  pi/2 in all); beyond it (the documented slow path, scalar) by Payne-Hanek: x's
  53-bit integer mantissa times the needed 24-bit chunks of 2/pi in exact integer
  arithmetic, the fraction then scaled by pi/2 in double-double;
* polynomials on ``[-pi/4, pi/4]``: FreeBSD's ``__kernel_sin``/``__kernel_cos``
  (degree 13 and 14 minimax, using the tail ``r_lo``), each under 1 ulp;
* quadrant ``n mod 4`` selects +-sin or +-cos of r.

Accuracy (tests/test_sincos.py, against a 400-digit ``decimal`` reference over
random angles in every binade up to 1e300 and the worst cases for reduction): the
error stays below 1 ulp of float64, so the float32 value of an output column
(``scale * cos`` rounded once to float32) is the correctly rounded one except when
the exact value lies within about 2^-29 of a float32 rounding boundary.
NaN and +-inf give NaN.
"""

from __future__ import annotations

import math

import numpy as np

from ._signals import deferred

with deferred():
    import numba


def _pi_bits(bits: int) -> int:
    """floor(pi 2^bits) by Machin's formula in integer arithmetic (guard bits added)."""
    g = bits + 32
    one = 1 << g

    def atan_inv(k):
        total, term, n, sign = 0, one // k, 1, 1
        while term:
            total += sign * (term // n)
            term //= k * k
            n += 2
            sign = -sign
        return total

    return (16 * atan_inv(5) - 4 * atan_inv(239)) >> 32


_BITS = 1600
_PI = _pi_bits(_BITS)  # floor(pi 2^1600), exact to the last few bits
_TWO_OVER_PI = (1 << (2 * _BITS + 1)) // _PI  # 2/pi 2^1600
_CHUNKS = 64  # 24-bit chunks of 2/pi: 1536 bits, enough for |x| up to 2^1024
#: TWO_OVER_PI_24[j] = bits 24 j + 1 ... 24 (j + 1) after the binary point of 2/pi.
TWO_OVER_PI_24 = np.array([(_TWO_OVER_PI >> (_BITS - 24 * (j + 1))) & 0xFFFFFF for j in range(_CHUNKS)],
                          dtype=np.int64)


def _piece(value_scaled: int, scale_bits: int, keep: int) -> tuple[float, int]:
    """The leading ``keep`` significant bits of value_scaled 2^-scale_bits, as a float
    (exact) and the remainder (same scaling)."""
    shift = value_scaled.bit_length() - keep
    head = (value_scaled >> shift) << shift
    return math.ldexp(head >> shift, shift - scale_bits), value_scaled - head


_half_pi = _PI >> 1  # pi/2 2^1600 (floor)
P1, _rest = _piece(_half_pi, _BITS, 33)
P2, _rest = _piece(_rest, _BITS, 33)
P3, _rest = _piece(_rest, _BITS, 33)
P3T, _ = _piece(_rest, _BITS, 53)
PIO2_HI, _rest = _piece(_half_pi, _BITS, 53)
PIO2_LO, _ = _piece(_rest, _BITS, 53)
INV_PIO2 = float(_TWO_OVER_PI >> (_TWO_OVER_PI.bit_length() - 64)) * 2.0 ** (_TWO_OVER_PI.bit_length() - 64 - _BITS)
# fdlibm's constants, checked: the pieces are the same bits.
assert INV_PIO2 == float.fromhex("0x1.45f306dc9c883p-1")
assert (P1, P2, P3, P3T) == (float.fromhex("0x1.921fb544p+0"), float.fromhex("0x1.0b4611a6p-34"),
                             float.fromhex("0x1.3198a2ep-69"), float.fromhex("0x1.b839a252049c1p-104"))
del _rest

FAST_LIMIT = 823549.6  # 2^19 pi/2: n < 2^19 + 1, so n P1, n P2, n P3 stay exact
_ROUND = 6755399441055744.0  # 1.5 * 2^52: adding and subtracting it rounds to an integer
_SPLIT = 134217729.0  # 2^27 + 1 (Veltkamp)

# FreeBSD k_sin.c / k_cos.c
S1, S2, S3 = -1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04
S4, S5, S6 = 2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10
C1, C2, C3 = 4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05
C4, C5, C6 = -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11


@numba.njit(cache=True, nogil=True, inline="always")
def _kernels(x, y):  # pragma: no cover - compiled
    """(sin(x + y), cos(x + y)) for |x + y| <= pi/4 + a little, y the tail of x."""
    z = x * x
    w = z * z
    r = S2 + z * (S3 + z * S4) + z * w * (S5 + z * S6)
    v = z * x
    s = x - ((z * (0.5 * y - v * r) - y) - v * S1)
    rc = z * (C1 + z * (C2 + z * C3)) + w * w * (C4 + z * (C5 + z * C6))
    hz = 0.5 * z
    wc = 1.0 - hz
    c = wc + (((1.0 - wc) - hz) + (z * rc - x * y))
    return s, c


@numba.njit(cache=True, nogil=True, inline="always")
def _quadrant(q, s, c):  # pragma: no cover - compiled
    """(sin, cos) of n pi/2 + r from s = sin r, c = cos r and q = n mod 4."""
    sw = (q & 1) != 0
    ss = s
    cc = c
    if sw:
        ss = c
        cc = -s
    if (q & 2) != 0:
        ss = -ss
        cc = -cc
    return ss, cc


@numba.njit(cache=True, nogil=True, inline="always")
def _two_sum(a, b):  # pragma: no cover - compiled
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def sincos_into(theta, n, re, im):  # pragma: no cover - compiled
    """``re[i] = cos(theta[i])``, ``im[i] = sin(theta[i])`` for i < n (float64 1-D
    arrays).  Branch-free over the fast range (vectorised by LLVM); angles beyond
    it, inf and NaN are then redone one by one by :func:`slow_sincos`."""
    slow = 0
    for i in range(n):
        x = theta[i]
        big = not (abs(x) <= FAST_LIMIT)
        slow += big
        if big:
            x = 0.0
        t = x * INV_PIO2
        fn = (t + _ROUND) - _ROUND
        q = np.int32(fn)  # |n| < 2^20: a 32-bit conversion (64-bit ones do not vectorise on AVX2)
        a = x - fn * P1  # exact (Sterbenz)
        s1, e1 = _two_sum(a, -(fn * P2))
        s2, e2 = _two_sum(s1, -(fn * P3))
        lo = (e1 + e2) - fn * P3T
        hi = s2 + lo
        lo = lo - (hi - s2)
        s, c = _kernels(hi, lo)
        ss, cc = _quadrant(q, s, c)
        re[i] = cc
        im[i] = ss
    if slow:
        redo_slow(theta, n, re, im)


@numba.njit(cache=True, nogil=True)
def redo_slow(theta, n, re, im):  # pragma: no cover - compiled
    """Redo ``re[i], im[i]`` (cos, sin) by :func:`slow_sincos` where ``|theta[i]|`` is
    beyond FAST_LIMIT, inf or NaN (``theta`` float64 or float32, widened exactly)."""
    for i in range(n):
        x = np.float64(theta[i])
        if not (abs(x) <= FAST_LIMIT):
            s, c = slow_sincos(x)
            re[i] = c
            im[i] = s


@numba.njit(cache=True, nogil=True)
def sincos(x):  # pragma: no cover - compiled
    """(sin x, cos x) of one float64: the same bits as :func:`sincos_into`."""
    if not (abs(x) <= FAST_LIMIT):
        return slow_sincos(x)
    t = x * INV_PIO2
    fn = (t + _ROUND) - _ROUND
    q = np.int64(fn)
    a = x - fn * P1
    s1, e1 = _two_sum(a, -(fn * P2))
    s2, e2 = _two_sum(s1, -(fn * P3))
    lo = (e1 + e2) - fn * P3T
    hi = s2 + lo
    lo = lo - (hi - s2)
    s, c = _kernels(hi, lo)
    return _quadrant(q, s, c)


@numba.njit(cache=True, nogil=True)
def _split(a):  # pragma: no cover - compiled
    t = _SPLIT * a
    hi = t - (t - a)
    return hi, a - hi


@numba.njit(cache=True, nogil=True)
def _two_prod(a, b):  # pragma: no cover - compiled
    """a b = p + e exactly (Dekker, no FMA)."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


@numba.njit(cache=True, nogil=True)
def _bits(acc, pos, nbits):  # pragma: no cover - compiled
    """floor(T / 2^pos) mod 2^nbits (nbits <= 24) for T held in 24-bit limbs ``acc``,
    limb L of weight 2^(24 (3 - L)); missing limbs are 0."""
    lo = 3 - pos // 24  # the limb holding weight 2^pos
    off = pos % 24
    v = 0
    if 0 <= lo < acc.size:
        v = acc[lo] >> np.int64(off)
    if 0 <= lo - 1 < acc.size:
        v |= acc[lo - 1] << np.int64(24 - off)
    return v & ((np.int64(1) << np.int64(nbits)) - 1)


_NL = 17  # limbs of T: weights 2^72 (carries only) ... 2^-312
_NF = 10  # 24-bit limbs of the fraction kept


@numba.njit(cache=True, nogil=True)
def slow_sincos(x):  # pragma: no cover - compiled
    """(sin x, cos x) for any float64 x by Payne-Hanek reduction (NaN for inf/NaN).

    x = m 2^e (m the 53-bit integer mantissa); x 2/pi = sum_j m c_j 2^(e - 24 (j + 1))
    with c_j the 24-bit chunks of 2/pi; the chunks before j0 give multiples of 4 and
    are skipped.  T = sum_{j < 13} m c_(j0 + j) 2^(-24 j) is summed exactly in 24-bit
    limbs, so x 2/pi = T 2^(e - 24 (j0 + 1)) modulo 4 up to about 2^-200: its integer
    part mod 4 is the quadrant, its fraction (rounded to the nearest integer, so
    |fraction| <= 1/2) times pi/2 in double-double is r."""
    if not (abs(x) < math.inf):
        return math.nan, math.nan
    sign = 1.0
    if x < 0:
        sign = -1.0
        x = -x
    if x == 0.0:
        return sign * 0.0, 1.0
    mant, ex = math.frexp(x)
    m = np.int64(math.ldexp(mant, 53))
    e = ex - 53
    j0 = (e - 2) // 24
    if j0 < 0:
        j0 = 0
    point = 24 * (j0 + 1) - e  # x 2/pi = T 2^-point
    acc = np.zeros(_NL, np.int64)
    for j in range(_NL - 4):
        jj = j0 + j
        if jj >= TWO_OVER_PI_24.size:
            break
        cj = TWO_OVER_PI_24[jj]
        for u in range(3):
            acc[3 - u + j] += ((m >> np.int64(24 * u)) & 0xFFFFFF) * cj
    for L in range(_NL - 1, 0, -1):  # carries (every term is non-negative)
        acc[L - 1] += acc[L] >> np.int64(24)
        acc[L] &= 0xFFFFFF
    q = _bits(acc, point, 2)
    fl = np.zeros(_NF, np.int64)  # fraction = sum_k fl[k] 2^(-24 (k + 1))
    for k in range(_NF):
        fl[k] = _bits(acc, point - 24 * (k + 1), 24)
    neg = fl[0] >= 0x800000
    if neg:  # round up: n + 1, and r from 1 - fraction, negated
        q = (q + 1) & 3
        borrow = 0
        for k in range(_NF - 1, -1, -1):
            v = -fl[k] - borrow
            borrow = 0
            if v < 0:
                v += 0x1000000
                borrow = 1
            fl[k] = v
    k0 = 0
    while k0 < _NF - 4 and fl[k0] == 0:
        k0 += 1
    g_hi = math.ldexp(float(fl[k0] * 0x1000000 + fl[k0 + 1]), -24 * (k0 + 2))  # exact
    g_lo = math.ldexp(float(fl[k0 + 2] * 0x1000000 + fl[k0 + 3]), -24 * (k0 + 4))  # exact
    gh = g_hi + g_lo
    gl = g_lo - (gh - g_hi)
    p, pe = _two_prod(gh, PIO2_HI)
    pe = pe + (gh * PIO2_LO + gl * PIO2_HI)
    r_hi = p + pe
    r_lo = pe - (r_hi - p)
    if neg:
        r_hi = -r_hi
        r_lo = -r_lo
    s, c = _kernels(r_hi, r_lo)
    ss, cc = _quadrant(q, s, c)
    return sign * ss, cc
