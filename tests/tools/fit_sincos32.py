"""Where rfsgen._sincos32's numbers come from (output definition 3); not run by the tests.

``python tests/tools/fit_sincos32.py fit``: the polynomial coefficients, a weighted
minimax fit by Lawson's iteration (reweighted least squares) of sin r = r + r^3 p(z)
and cos r = 1 + z q(z), z = r^2, on [0, pi/4 + 1e-3], against numpy's long double
sin and cos; prints the coefficients and their relative error (2^-37.5 and 2^-33.8).

``python tests/tools/fit_sincos32.py all``: every positive float32 angle up to
FAST_LIMIT (about 1.2e9 values; the negative ones are symmetric) through
rfsgen._sincos32.sincos_into against rfsgen._sincos's float64 cos and sin (under 1
ulp of float64): prints the largest error in units of the float32 ulp of the value
and the largest difference of the float32 roundings from the reference's, in ulps.
"""

import sys

import numpy as np

R = np.pi / 4 + 1e-3
NS, NC = 5, 5  # coefficients of p and q


def _lawson(basis, target, weight, iters=200):
    a = basis * weight[:, None]
    b = target * weight
    u = np.full(b.size, 1.0 / b.size)
    for _ in range(iters):
        sw = np.sqrt(u)
        c, *_ = np.linalg.lstsq(a * sw[:, None], b * sw, rcond=None)
        e = np.abs(a @ c - b)
        u = u * e
        u /= u.sum()
    return c, float(np.abs(a @ c - b).max())


def fit():
    x = np.cos(np.linspace(0, np.pi, 4001)) * 0.5 * R + 0.5 * R
    x = x[x > 1e-4].astype(np.longdouble)
    s, c = np.sin(x), np.cos(x)
    bs = np.stack([x ** 3 * (x * x) ** j for j in range(NS)], 1).astype(np.float64)
    cs, es = _lawson(bs, (s - x).astype(np.float64), (1 / s).astype(np.float64))
    bc = np.stack([(x * x) ** (j + 1) for j in range(NC)], 1).astype(np.float64)
    cc, ec = _lawson(bc, (c - 1).astype(np.float64), (1 / c).astype(np.float64))
    print("S1..S4 =", ", ".join(repr(float(v)) for v in cs), f"  relative error 2^{np.log2(es):.1f}")
    print("C1..C4 =", ", ".join(repr(float(v)) for v in cc), f"  relative error 2^{np.log2(ec):.1f}")


def every_float32():
    import numba

    from rfsgen import _sincos, _sincos32

    @numba.njit(nogil=True)
    def worst(th, re, im, rr, ri):
        e = 0.0
        d = 0
        for i in range(th.size):
            for v, ref in ((re[i], rr[i]), (im[i], ri[i])):
                r32 = np.float32(ref)
                u = np.float64(np.abs(np.nextafter(np.abs(r32), np.float32(np.inf)) - np.abs(r32)))
                e = max(e, abs(v - ref) / u)
                d = max(d, abs(np.int64(np.array(np.float32(v)).view(np.int32)[()])
                               - np.int64(np.array(r32).view(np.int32)[()])))
        return e, d

    hi = int(np.array(np.float32(_sincos.FAST_LIMIT)).view(np.int32))
    step = 1 << 24
    e, d = 0.0, 0
    for lo in range(1, hi + 1, step):
        th = np.arange(lo, min(hi + 1, lo + step), dtype=np.int32).view(np.float32)
        re, im = np.empty(th.size), np.empty(th.size)
        rr, ri = np.empty(th.size), np.empty(th.size)
        _sincos32.sincos_into(th, th.size, re, im)
        _sincos.sincos_into(th.astype(np.float64), th.size, rr, ri)
        a, b = worst(th, re, im, rr, ri)
        e, d = max(e, a), max(d, b)
    print(f"every float32 in (0, {float(np.float32(_sincos.FAST_LIMIT))}]: largest error {e:.2g} float32 ulp, "
          f"float32 roundings differ from the reference's by at most {d} ulp")


if __name__ == "__main__":
    {"fit": fit, "all": every_float32}[sys.argv[1] if len(sys.argv) > 1 else "fit"]()
