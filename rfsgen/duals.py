"""Exact duals of piecewise-smooth functions (kinks and jumps), beyond the truncated series.

The HermiteE series of a function with a jump decays like a_i ~ i^-1.5 (a kink: i^-2.5), so
the series cut at degree K = 1024 misses 1e-2 (1e-6) of the dual.  Here the function f is
split at its breakpoints t (where f or a derivative jumps) into a smooth remainder and
*singular pieces* ``c (sigma (x - t))_+^n / n!`` (``n = 0 .. ORDERS - 1``, ``sigma = +1`` right
of t >= 0, ``-1`` left of t < 0, ``c`` the jump of the n-th derivative, signed), whose Hermite
coefficients are closed forms::

    E[(Z - a)_+^n / n! He_i(Z)] = M_{n-i}(a)              (i <= n, M_k the Gaussian partial moments)
                                = phi(a) He_{i-n-1}(a)     (i > n)

and whose pair sums are one-dimensional integrals (Mehler's formula, differentiated d = n - n'
times in the second point)::

    sum_{i > n} beta_i beta'_i rho^i = int_0^rho (rho - r)^n / n! He_d((b - r a)/s) phi2(a, b; r) / s^d dr

with ``s = sqrt(1 - r^2)`` and phi2 the bivariate normal density (computed with r = sin(phi) on
panels graded towards the end, where the integrand may vary on a tiny scale).  The dual is then

    sigma_hat(rho) = (sum_{i <= K} b_i^2 rho^i + T(rho)) / N,   T(rho) = sum_{i > K} beta_i^2 rho^i

with b_i the quadrature coefficients of f itself (the sampler's table), beta_i those of the
pieces' sum, ``T = E[s(X) s(Y)] - sum_{i <= K} beta_i^2 rho^i`` and N = sum b_i^2 + T(1).  What is
left out is ``sum_{i > K} g_i (g_i + 2 beta_i) rho^i`` with g = b - beta the remainder's coefficients,
which decay like i^-3.25 or faster once five orders are removed: estimated from the last
degrees and reported (:attr:`ExactTail.error`).  T is negligible for |rho| <= R0 (R0^K < 1e-18)
and tabulated elsewhere as a Chebyshev series in theta = arccos(rho), in which it is smooth.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

#: Orders of the singular pieces removed at each breakpoint (jump, kink, ... 4th derivative).
ORDERS = 5
#: Breakpoints farther from 0 weigh phi(t)^2 < 1e-31 and are ignored.
REACH = 12.0
#: Most breakpoints handled exactly; beyond, the truncated series stays (error reported).
MAX_BREAKPOINTS = 16
#: |rho| <= R0: the tail beyond degree K is below R0^1025 < 1e-18 of its mass.
R0 = 0.96
#: Chebyshev degree of the tabulated tail on each side.
CHEB_DEGREE = 160


def _partial_moments(a: float, top: int) -> list[float]:
    """``M_k(a) = E[(Z - a)_+^k / k!]`` for k = -1 .. top (M_-1 = phi(a)), by k M_k = M_{k-2} - a M_{k-1}."""
    phi = math.exp(-a * a / 2) / math.sqrt(2 * math.pi)
    m = [phi, 0.5 * math.erfc(a / math.sqrt(2))]
    for k in range(1, top + 1):
        m.append((m[k - 1] - a * m[k]) / k)
    return m  # m[k + 1] = M_k


def piece_coefficients(a: float, n: int, degree: int) -> np.ndarray:
    """``E[(Z - a)_+^n / n! He_i(Z)] / sqrt(i!)`` for i = 0 .. degree (float64)."""
    out = np.zeros(degree + 1)
    m = _partial_moments(a, n)
    for i in range(min(n, degree) + 1):
        out[i] = m[n - i + 1] / math.sqrt(math.factorial(i))
    phi = m[0]
    h_prev, h = 0.0, 1.0  # He_j(a) / sqrt(j!)
    for i in range(n + 1, degree + 1):
        j = i - n - 1
        # He_j / sqrt(i!) = h_j sqrt(j! / i!)
        scale = 1.0
        for q in range(j + 1, i + 1):
            scale /= math.sqrt(q)
        out[i] = phi * h * scale
        h_prev, h = h, (a * h - math.sqrt(j) * h_prev) / math.sqrt(j + 1)
    return out


def _hermite_e(d: int, v: np.ndarray) -> np.ndarray:
    h_prev, h = np.zeros_like(v), np.ones_like(v)
    for j in range(d):
        h_prev, h = h, v * h - j * h_prev
    return h


@functools.lru_cache(maxsize=1)
def _graded_nodes():
    """Nodes and weights on [0, 1] with panels halving towards 1 (down to 2^-44)."""
    x, w = np.polynomial.legendre.leggauss(10)
    edges = [0.0] + [1.0 - 2.0 ** -k for k in range(1, 45)] + [1.0]
    nodes, weights = [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        nodes.append(lo + (hi - lo) * (x + 1) / 2)
        weights.append((hi - lo) * w / 2)
    return np.concatenate(nodes), np.concatenate(weights)


def pair_sum(a: float, n: int, b: float, m: int, rho: np.ndarray) -> np.ndarray:
    """``E[(X - a)_+^n / n! (Y - b)_+^m / m!]`` for standard normals X, Y with correlation
    ``rho`` (float64 array in [-1, 1])."""
    rho = np.asarray(rho, dtype=np.float64)
    if n < m:
        a, n, b, m = b, m, a, n
    top = max(n, m)
    ca, cb = piece_coefficients(a, n, top), piece_coefficients(b, m, top)
    out = np.polynomial.polynomial.polyval(rho, ca * cb)  # degrees i <= n
    d = n - m
    u, wu = _graded_nodes()
    big = np.arcsin(np.clip(rho, -1.0, 1.0))[..., None]
    phi = big * u
    sin, cos = np.sin(phi), np.cos(phi)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        expo = np.exp(-(a * a - 2 * a * b * sin + b * b) / (2 * cos * cos)) / (2 * math.pi)
        f = (rho[..., None] - sin) ** n / math.factorial(n) * expo
        if d:
            f = f * _hermite_e(d, (b - a * sin) / cos) / cos ** d
        f = np.where(np.isfinite(f), f, 0.0)
    return out + (f * wu).sum(axis=-1) * big[..., 0]


@dataclass(frozen=True)
class Piece:
    t: float
    n: int
    side: int  # +1: (x - t)_+^n / n!;  -1: (t - x)_+^n / n!
    c: float


def pieces_from_jumps(t: float, jumps) -> list[Piece]:
    """Singular pieces at ``t`` removing ``jumps[n]`` = f^(n)(t+) - f^(n)(t-)."""
    side = 1 if t >= 0 else -1
    out = []
    for n, j in enumerate(jumps):
        if j != 0.0:
            c = j if side == 1 else j * (-1) ** (n + 1)
            out.append(Piece(t, n, side, c))
    return out


def pieces_series(pieces, degree: int) -> np.ndarray:
    """Hermite coefficients (normalised, as b_i) of the sum of ``pieces`` up to ``degree``."""
    out = np.zeros(degree + 1)
    sign = (-1.0) ** np.arange(degree + 1)
    for p in pieces:
        beta = p.c * piece_coefficients(p.side * p.t, p.n, degree)
        out += beta * (sign if p.side < 0 else 1.0)
    return out


def pieces_dual(pieces, rho: np.ndarray) -> np.ndarray:
    """``E[s(X) s(Y)]`` for the sum s of ``pieces`` (unnormalised)."""
    rho = np.asarray(rho, dtype=np.float64)
    out = np.zeros(rho.shape)
    for i, p in enumerate(pieces):
        for q in pieces[i:]:
            v = pair_sum(p.side * p.t, p.n, q.side * q.t, q.n, p.side * q.side * rho)
            out += (1.0 if q is p else 2.0) * p.c * q.c * v
    return out


def one_sided_jumps(fn_vec, t: float, half_width: float, orders: int = ORDERS) -> list[float]:
    """``f^(n)(t+) - f^(n)(t-)`` for n < orders from Chebyshev fits of ``fn_vec`` (float64 array
    -> array) on [t - h, t] and [t, t + h] (never evaluated at t itself)."""
    from numpy.polynomial import Chebyshev

    right = Chebyshev.interpolate(fn_vec, 24, domain=[t, t + half_width])
    left = Chebyshev.interpolate(fn_vec, 24, domain=[t - half_width, t])
    out = []
    for n in range(orders):
        out.append(float(right.deriv(n)(t) - left.deriv(n)(t)) if n else float(right(t) - left(t)))
    return out


@dataclass(frozen=True, eq=False)
class ExactTail:
    """The dual of a piecewise-smooth function: its series to degree K plus the closed-form tail.

    ``series``: b_i^2 / N (i = 0 .. K, unnormalised: sums to 1 - tail_mass);
    ``tail_mass``: T(1) / N, what the series misses; ``error``: the estimated bound on
    |dual - exact| (the remainder's tail, and the agreement of N with E[f(Z)^2])."""

    series: np.ndarray = field(repr=False)
    tail_mass: float
    error: float
    plus: np.ndarray = field(repr=False)  # Chebyshev coefficients of T / N in theta on [0, theta0]
    minus: np.ndarray = field(repr=False)  # the same on [pi - theta0, pi]

    def tail(self, theta: np.ndarray) -> np.ndarray:
        """T(cos theta) / N for theta in [0, pi] (0 where |cos theta| <= R0)."""
        theta = np.asarray(theta, dtype=np.float64)
        th0 = math.acos(R0)
        out = np.zeros(theta.shape)
        lo = theta < th0
        hi = theta > math.pi - th0
        if lo.any():
            out[lo] = np.polynomial.chebyshev.chebval(2 * theta[lo] / th0 - 1, self.plus)
        if hi.any():
            out[hi] = np.polynomial.chebyshev.chebval(2 * (theta[hi] - (math.pi - th0)) / th0 - 1, self.minus)
        return out

    def dual(self, rho: np.ndarray) -> np.ndarray:
        rho = np.asarray(rho, dtype=np.float64)
        return np.polynomial.polynomial.polyval(rho, self.series) + self.tail(np.arccos(rho))

    def gap(self, tails: np.ndarray, rho: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """1 - dual from delta = 1 - rho; ``tails[j] = sum_{i > j} series_i``."""
        theta = 2.0 * np.arcsin(np.sqrt(np.clip(delta, 0.0, 2.0) / 2.0))
        base = delta * np.polynomial.polynomial.polyval(rho, tails) + self.tail_mass
        return base - self.tail(theta)


def exact_tail(b: np.ndarray, second: float, pieces) -> ExactTail:
    """The :class:`ExactTail` of a function with quadrature coefficients ``b`` (degrees 0 .. K,
    accurate: the grid split at every breakpoint), second moment ``second`` and singular
    ``pieces`` (all its jumps of orders below ORDERS)."""
    k = b.size - 1
    beta = pieces_series(pieces, 2 * k)
    th0 = math.acos(R0)
    cheb = np.polynomial.chebyshev.chebpts1(CHEB_DEGREE + 1)
    side = []
    for start in (0.0, math.pi - th0):
        theta = start + (cheb + 1) * th0 / 2
        rho = np.cos(theta)
        t = pieces_dual(pieces, rho) - np.polynomial.polynomial.polyval(rho, beta[: k + 1] ** 2)
        side.append(np.polynomial.chebyshev.chebfit(cheb, t, CHEB_DEGREE))
    ends = pieces_dual(pieces, np.array([1.0, -1.0])) - np.polynomial.polynomial.polyval(
        np.array([1.0, -1.0]), beta[: k + 1] ** 2)
    t1 = float(ends[0])
    # the interpolants meet T(1) and T(-1) exactly at theta = 0 and pi (so the dual is 1 at rho = 1)
    side[0][0] += t1 - np.polynomial.chebyshev.chebval(-1.0, side[0])
    side[1][0] += float(ends[1]) - np.polynomial.chebyshev.chebval(1.0, side[1])
    total = math.fsum(b * b) + t1
    g = b - beta[: k + 1]
    half = slice(k // 2 + 1, k + 1)
    block = float(np.abs(g[half] * (g[half] + 2 * beta[half])).sum())
    error = (block + abs(total - second)) / total
    return ExactTail(series=b * b / total, tail_mass=t1 / total, error=error,
                     plus=side[0] / total, minus=side[1] / total)
