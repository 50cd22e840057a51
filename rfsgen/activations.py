"""Conjugate activations: the registry of internal-node kernels.

A conjugate activation is ``sigma_hat(rho) = sum_i a_i rho**i`` with ``a_i >= 0``
and ``sum_i a_i = 1``.  Each :class:`Activation` carries everything the rest of
rfsgen needs about one of them:

* ``coefficients``: the table ``a_0 .. a_K`` (float64, read-only);
* ``tail_mass``: the probability of a degree above ``K``.  When the entry has an
  exact tail sampler (relu, step) those degrees *are* sampled, so nothing is
  truncated; otherwise the series was cut where the dropped mass fell below
  :data:`TOLERANCE` and both the sampler and the exact kernel use the same
  renormalised, truncated series (``truncation`` reports what was dropped);
* ``dual(rho)``: ``sigma_hat`` evaluated elementwise (closed form where one
  exists, otherwise the truncated series);
* ``derivative_at_one``: ``sigma_hat'(1)``, possibly ``inf``;
* ``sample_degrees(rng, n)`` and ``sum_degrees(rng, m)``: the degree sampler.

Adding an activation means adding one entry to :data:`REGISTRY`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from .errors import SamplerError


#: Tail mass below which an infinite series is truncated (when it has no exact tail sampler).
TOLERANCE = 1e-9
#: Highest degree kept for quadrature activations whose series converges slowly.
MAX_QUADRATURE_DEGREE = 1024
#: Size of the tabulated part of the relu/step series; larger degrees come from the tail sampler.
ARCSIN_TABLE_TERMS = 1 << 14


# --------------------------------------------------------------------------- tails
@dataclass(frozen=True)
class ArcsinTail:
    """Exact sampler for the tail of the arcsin-type series of relu and step.

    Degrees are ``offset + 2k`` for ``k >= k0`` with weight
    ``w(k) = c_k / (pi * g(k))`` where ``c_k = binom(2k, k) / (4**k (2k+1))`` and
    ``g(k) = 2k + 2`` (relu) or ``1`` (step).  Proposal: ``k = floor(X)`` with
    ``X ~ Pareto(x_m = k0, shape s)`` where ``s = alpha - 1``; accepted with
    probability ``w(k) / (M P(k))`` -- exact rejection sampling, no cap.
    """

    k0: int
    offset: int  # degree = offset + 2k
    relu: bool  # True: g(k) = 2k+2 (w ~ k^-2.5); False: g(k) = 1 (w ~ k^-1.5)
    mass: float

    @property
    def alpha(self) -> float:
        return 2.5 if self.relu else 1.5

    def log_weight(self, k: np.ndarray) -> np.ndarray:
        """log w(k) elementwise (float64 ``k >= 1``)."""
        from ._compiled import arcsin_tail_log_weight

        k = np.asarray(k, dtype=np.float64)
        return np.array([arcsin_tail_log_weight(float(v), self.relu) for v in k.ravel()]).reshape(k.shape)

    def _log_envelope(self) -> float:
        # w(k) <= A k^-alpha with A from binom(2k,k)/4^k <= 1/sqrt(pi k) and
        # (2k+1)(2k+2) >= 4k^2; P(k) >= s x_m^s (k+1)^-alpha.
        s = self.alpha - 1.0
        a = 1.0 / (4 * math.pi**1.5) if self.relu else 1.0 / (2 * math.pi**1.5)
        xm = float(self.k0)
        return math.log(a) - math.log(s) - s * math.log(xm) + self.alpha * math.log1p(1.0 / xm)

    def overflow_probability(self) -> float:
        """Probability that one tail draw's proposal reaches :data:`DEGREE_LIMIT`."""
        return (self.k0 / (DEGREE_LIMIT / 2)) ** (self.alpha - 1.0)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Return ``n`` int64 degrees from the tail distribution.

        Raises :class:`~rfsgen.errors.SamplerError` if a proposal reaches
        :data:`DEGREE_LIMIT` (it could not be represented); the message gives the
        exact probability of that per tail draw.
        """
        out = np.empty(n, dtype=np.int64)
        todo = np.arange(n)
        s = self.alpha - 1.0
        log_m = self._log_envelope()
        limit = float(DEGREE_LIMIT // 2)
        from ._compiled import arcsin_tail_propose

        while todo.size:
            u = rng.random(todo.size)
            v = rng.random(todo.size)
            k = np.empty(todo.size)
            ok = np.empty(todo.size, dtype=np.bool_)
            if arcsin_tail_propose(u, v, float(self.k0), s, self.relu, log_m, limit, k, ok) >= 0:
                from .errors import SamplerError

                raise SamplerError(
                    f"a {'relu' if self.relu else 'step'} degree above 2**{DEGREE_LIMIT.bit_length() - 1} was "
                    f"drawn, which cannot be represented (probability {self.overflow_probability():.2g} per "
                    "heavy-tail degree; stacked step layers draw millions of them per feature); "
                    "use fewer stacked step layers, or relu, whose tail is far lighter"
                )
            out[todo[ok]] = self.offset + 2 * k[ok].astype(np.int64)
            todo = todo[~ok]
        return out


#: Degrees (and sums of degrees) must stay below this to be represented exactly.
DEGREE_LIMIT = 2**62


def _libm(fn, x) -> np.ndarray:
    """``fn`` (a :mod:`math` function) elementwise through the C library.

    numpy's own float64 exp/log/power take CPU-specific SIMD paths whose last bits
    differ between AVX2 and AVX-512; the sampler's tables and accept/reject tests
    must not, or a seed would draw different features on another machine.
    """
    x = np.asarray(x, dtype=np.float64)
    return np.fromiter(map(fn, x.ravel().tolist()), dtype=np.float64, count=x.size).reshape(x.shape)


def _arcsin_c(kmax: int) -> np.ndarray:
    """``c_k = (2k)! / (4^k (k!)^2 (2k+1))`` for ``k = 0 .. kmax-1`` (float64)."""
    k = np.arange(kmax, dtype=np.float64)
    ratio = np.ones(kmax)
    ratio[1:] = np.cumprod((2 * k[1:] - 1) / (2 * k[1:]))
    return ratio / (2 * k + 1)


# --------------------------------------------------------------------------- activation
GUIDE = 1 << 12  # buckets of the degree samplers' guide tables


@dataclass(frozen=True, eq=False)
class Activation:
    """An immutable conjugate activation (see module docstring)."""

    name: str
    params: tuple  # sorted ((key, value), ...) as given by the user, for display and identity
    coefficients: np.ndarray = field(repr=False)
    dual_fn: Callable[[np.ndarray], np.ndarray] = field(repr=False)
    derivative_at_one: float
    tail: ArcsinTail | None = field(default=None, repr=False)
    truncation: float = 0.0
    sum_fn: Callable[[np.random.Generator, np.ndarray], np.ndarray] | None = field(
        default=None, repr=False
    )
    degree_fn: Callable[[np.random.Generator, int], np.ndarray] | None = field(
        default=None, repr=False
    )
    gap_fn: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = field(default=None, repr=False)
    near_minus_one_fn: Callable[[np.ndarray], np.ndarray] | None = field(default=None, repr=False)
    #: Bound on |dual - true dual| (rfsgen.duals: the estimated remainder of an exact tail;
    #: 2t/(1-t) for a series cut at dropped mass t; 0 for closed forms).
    dual_error: float = 0.0

    def __post_init__(self):
        self.coefficients.setflags(write=False)
        cdf = np.cumsum(self.coefficients)
        cdf.setflags(write=False)
        object.__setattr__(self, "_cdf", cdf)
        # Guide table for inverse-CDF lookups: values in [g/G, (g+1)/G) have their answer
        # in guide[g]..guide[g+1], usually one or two steps instead of a 15-step search.
        object.__setattr__(self, "_guide", np.searchsorted(cdf, np.arange(GUIDE + 1) / GUIDE, side="right"))

    @property
    def tail_mass(self) -> float:
        """Probability of a degree above the table (0 when there is no tail)."""
        return self.tail.mass if self.tail is not None else 0.0

    @property
    def label(self) -> str:
        if not self.params:
            return self.name
        inner = ", ".join(f"{k}={_fmt(v)}" for k, v in self.params)
        return f"{self.name}({inner})"

    def dual(self, rho: np.ndarray) -> np.ndarray:
        """``sigma_hat(rho)`` elementwise; ``rho`` float64 in [-1, 1] (clipped)."""
        return self.dual_fn(np.clip(rho, -1.0, 1.0))

    def gap(self, rho: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """``1 - sigma_hat(rho)`` from ``delta = 1 - rho`` (both float64, same shape),
        accurate where ``rho`` is near 1; see the exact kernel."""
        return np.clip(self.gap_fn(np.clip(rho, -1.0, 1.0), np.clip(delta, 0.0, 2.0)), 0.0, 2.0)

    def dual_and_lift(self, rho: np.ndarray, eps: np.ndarray):
        """``(sigma_hat(rho), 1 + sigma_hat(rho))`` given also ``eps = 1 + rho``, accurate
        near rho = -1 for the activations whose dual vanishes there (relu, step):
        k(x, -x) = 0 exactly, not arcsin's 1e-8 of rounding."""
        rho = np.clip(rho, -1.0, 1.0)
        value = self.dual_fn(rho)
        if self.near_minus_one_fn is not None:
            near = rho < -0.5
            if near.any():
                value = np.array(value, dtype=np.float64, copy=True)
                value[near] = self.near_minus_one_fn(np.clip(eps[near], 0.0, 2.0))
        return value, 1.0 + value

    def sample_degrees(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` iid degrees (int64) with ``P(l = i) = a_i``."""
        if self.degree_fn is not None:
            return self.degree_fn(rng, n)
        return self.degrees_at(rng, rng.random(n))

    def degrees_at(self, rng: np.random.Generator, u: np.ndarray) -> np.ndarray:
        """Degrees (int64) at the quantiles ``u`` (float64 in [0, 1)) of ``P(l = i) = a_i``:
        a uniform ``u`` gives an exact draw.  Degrees beyond the table come from the exact
        tail sampler (relu, step; ``rng`` is used only there).  For activations with their
        own degree sampler (exp: Poisson) the table is the distribution truncated where
        its tail is below TOLERANCE and renormalised, so quantiles are off by at most
        TOLERANCE in total variation (a kernel bias below 2 TOLERANCE)."""
        total = self._cdf[-1]
        if self.tail is None:
            # The table is the whole (renormalised) distribution.
            idx = self._search(u * total)
            return np.minimum(idx, self.coefficients.size - 1)
        idx = self._search(u)
        in_tail = u >= total
        if np.any(in_tail):
            idx[in_tail] = self.tail.sample(rng, int(in_tail.sum()))
        return idx

    def _search(self, v: np.ndarray) -> np.ndarray:
        """``np.searchsorted(cdf, v, side="right")`` (int64) for ``v`` in [0, 1], via the guide table."""
        from ._compiled import search_right

        idx = np.empty(v.size, dtype=np.int64)
        search_right(self._cdf, self._guide, np.ascontiguousarray(v, dtype=np.float64).reshape(-1), idx)
        return idx.reshape(np.shape(v))

    def sum_degrees(self, rng: np.random.Generator, m: np.ndarray) -> np.ndarray:
        """For each entry of ``m`` (int64 counts), the sum of that many iid degrees.

        Memory stays bounded whatever ``m`` holds: single degrees are drawn at most
        :data:`SUM_BATCH` at a time, and huge counts go through one multinomial
        over the table plus tail degrees summed in batches.  A sum that would
        reach :data:`DEGREE_LIMIT`, or a count needing more than
        :data:`MAX_TAIL_DRAWS` tail degrees, is a :class:`SamplerError`.
        """
        m = np.asarray(m, dtype=np.int64)
        if self.sum_fn is not None:
            return self.sum_fn(rng, m)
        out = np.zeros(m.size, dtype=np.int64)
        big = m > 100_000
        small = np.flatnonzero(~big & (m > 0))
        if small.size:
            ends = np.cumsum(m[small])
            lo = 0
            while lo < small.size:  # slices of at most SUM_BATCH single degrees
                base = ends[lo - 1] if lo else 0
                hi = max(lo + 1, int(np.searchsorted(ends, base + SUM_BATCH, side="right")))
                sel = small[lo:hi]
                counts = m[sel]
                deg = self.sample_degrees(rng, int(counts.sum()))
                starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
                out[sel] = _checked_sums(deg, starts, self.name)
                lo = hi
        for i in np.flatnonzero(big):  # rare: one multinomial per huge multiplicity
            out[i] = self._sum_many(rng, int(m[i]))
        return out

    def _sum_many(self, rng: np.random.Generator, count: int) -> int:
        p = np.append(self.coefficients, self.tail_mass)
        p = p / p.sum()
        counts = rng.multinomial(count, p)
        degrees = np.arange(counts.size - 1)
        if float(np.dot(counts[:-1].astype(np.float64), degrees)) >= DEGREE_LIMIT / 2:
            raise _overflow(self.name)
        total = int(np.dot(counts[:-1], degrees))  # exact: below 2**61, no int64 overflow
        n_tail = int(counts[-1])
        if n_tail > MAX_TAIL_DRAWS:
            raise SamplerError(
                f"one draw needs the sum of {count} {self.name} degrees ({n_tail} from the heavy tail, more than "
                f"the limit of {MAX_TAIL_DRAWS}); stacked step layers make such sums: use fewer of them"
            )
        while n_tail:
            k = min(n_tail, SUM_BATCH)
            total += int(_checked_sums(self.tail.sample(rng, k), np.zeros(1, np.int64), self.name)[0])
            n_tail -= k
            if total >= DEGREE_LIMIT:
                raise _overflow(self.name)
        return total


#: Most single degrees drawn at once when summing multiplicities (bounds memory).
SUM_BATCH = 1 << 22
#: Most heavy-tail degrees one summed multiplicity may need.
MAX_TAIL_DRAWS = 1 << 22


def _overflow(name):
    return SamplerError(
        f"a sum of {name} degrees in one draw reached 2**62 and cannot be represented; stacked step layers "
        "have infinite mean degree: use fewer of them, or relu"
    )


def _checked_sums(deg, starts, name):
    """``np.add.reduceat(deg, starts)`` that refuses sums at or above DEGREE_LIMIT."""
    if deg.size and int(deg.max()) >= 2**40 and np.add.reduceat(deg.astype(np.float64), starts).max() >= DEGREE_LIMIT / 2:
        raise _overflow(name)
    return np.add.reduceat(deg, starts)


def _fmt(v) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return f"{v:g}" if isinstance(v, float) else str(v)


# --------------------------------------------------------------------------- duals and gaps
# Module-level functions (bound with functools.partial) rather than closures, so that
# activations pickle and travel to worker processes.  A "gap" is 1 - sigma_hat(rho)
# computed from delta = 1 - rho without cancellation: the exact kernel carries both,
# so k(x, x) = 1 stays exact through any number of layers (arcsin-type duals
# magnify a rounding error of 1e-16 in rho near 1 to 1e-8 per layer).
def _poly_value(coef, rho):
    return np.polynomial.polynomial.polyval(rho, coef)


def _series_gap(tails, rho, delta):
    # 1 - sum_i a_i rho^i = sum_i a_i (1 - rho^i) = delta * sum_j A_j rho^j, A_j = sum_{i>j} a_i >= 0:
    # no cancellation near rho = 1.
    return delta * np.polynomial.polynomial.polyval(rho, tails)


def _copy(rho):
    return np.array(rho, dtype=np.float64, copy=True)


def _identity_gap(rho, delta):
    return np.array(delta, dtype=np.float64, copy=True)


def _identity_sum(rng, m):
    return np.asarray(m, np.int64).copy()


def _exp_dual(beta, rho):
    return np.exp(beta * (rho - 1.0))


def _exp_gap(beta, rho, delta):
    return -np.expm1(-beta * delta)


def _poisson_sum(beta, rng, m):
    lam = beta * np.asarray(m, np.float64)
    # Stacked exp layers multiply the mean degree by beta per layer: past 2**61 a draw's
    # degree is neither representable downstream nor a Poisson numpy can draw.
    if lam.size and float(lam.max()) >= DEGREE_LIMIT / 2:
        raise SamplerError(
            f"a sum of exp degrees in one draw would reach 2**61 (mean {float(lam.max()):.3g}): stacked exp layers "
            f"multiply the mean degree by beta (here {beta:g}) at each layer; use fewer layers or a smaller beta")
    return rng.poisson(lam).astype(np.int64)


def _poisson_degrees(beta, rng, n):
    return rng.poisson(beta, n).astype(np.int64, copy=False)


def _angle(delta):
    """The angle theta = arccos(1 - delta) in [0, pi], accurate for small delta."""
    return 2.0 * np.arcsin(np.sqrt(np.clip(delta, 0.0, 2.0) / 2.0))


def _relu_dual(rho):
    return (np.sqrt(np.maximum(0.0, 1 - rho * rho)) + (math.pi - np.arccos(rho)) * rho) / math.pi


def _sin_minus_t_cos(t):
    """sin t - t cos t for t in [0, pi], by its Taylor series t^3/3 - t^5/30 + ... where
    the direct difference cancels (small t)."""
    t2 = t * t
    series = t * t2 * (1 / 3 - t2 * (1 / 30 - t2 * (1 / 840 - t2 * (1 / 45360 - t2 / 3991680))))
    return np.where(t < 0.1, series, np.sin(t) - t * np.cos(t))


def _relu_gap(rho, delta):
    # 1 - sigma = (pi delta - (sin t - t cos t)) / pi with t = arccos(1 - delta)
    return (math.pi * np.clip(delta, 0.0, 2.0) - _sin_minus_t_cos(_angle(delta))) / math.pi


def _relu_near_minus_one(eps):
    # sigma(-1 + eps) = (sin s - s cos s) / pi with s = arccos(1 - eps)
    return _sin_minus_t_cos(_angle(eps)) / math.pi


def _step_near_minus_one(eps):
    return _angle(eps) / math.pi  # 1/2 + arcsin(-1 + eps)/pi = arccos(1 - eps)/pi


def _step_dual(rho):
    return 0.5 + np.arcsin(rho) / math.pi


def _step_gap(rho, delta):
    return _angle(delta) / math.pi


def _polynomial_dual(degree, c, rho):
    return ((rho + c) / (1 + c)) ** degree


def _polynomial_gap(degree, c, rho, delta):
    u = np.clip(delta, 0.0, 2.0) / (1 + c)
    with np.errstate(divide="ignore", invalid="ignore"):
        stable = -np.expm1(degree * np.log1p(-np.minimum(u, 1.0)))
    return np.where(u < 1.0, stable, 1.0 - _polynomial_dual(degree, c, rho))


def _binomial_sum(degree, prob, rng, m):
    m = np.asarray(m, np.int64)
    # Stacked polynomial layers multiply the trials by the degree per layer: checked in
    # float64 before the int64 product could wrap.
    if m.size and float(m.max()) * degree >= DEGREE_LIMIT / 2:
        raise SamplerError(
            f"a sum of polynomial degrees in one draw would reach 2**61 ({float(m.max()) * degree:.3g} trials): "
            f"stacked polynomial layers multiply the degree by {degree} at each layer; use fewer layers or lower degrees")
    return rng.binomial(m * degree, prob).astype(np.int64)


def _series_activation(name, params, a, truncation=0.0, sum_fn=None, dual=None, gap=None) -> Activation:
    a = np.asarray(a, dtype=np.float64)
    try:
        total = math.fsum(a)
    except OverflowError:  # coefficients near the float maximum: scale down first (same ratios)
        a = a / a.max()
        total = math.fsum(a)
    a = a / total
    deriv = math.fsum(np.arange(a.size) * a)
    tails = np.maximum(np.cumsum(a[::-1])[::-1][1:], 0.0)  # A_j = sum_{i > j} a_i
    return Activation(
        name=name,
        params=params,
        coefficients=a,
        dual_fn=dual or functools.partial(_poly_value, a),
        gap_fn=gap or functools.partial(_series_gap, tails if tails.size else np.zeros(1)),
        derivative_at_one=deriv,
        truncation=truncation,
        sum_fn=sum_fn,
    )


# --------------------------------------------------------------------------- builders
def _identity(params) -> Activation:
    return _series_activation("identity", params, [0.0, 1.0], sum_fn=_identity_sum, dual=_copy, gap=_identity_gap)


def _exp(params) -> Activation:
    from scipy import special

    beta = float(dict(params).get("beta", 1.0))
    if beta == 0:
        kmax = 1
    else:
        kmax = int(special.pdtrik(1 - TOLERANCE, beta)) + 2
        kmax = max(kmax, 2)
        while special.pdtrc(kmax - 1, beta) > TOLERANCE:  # P(X > kmax-1)
            kmax += 1
    i = np.arange(kmax)
    # math.exp (the C library), not np.exp: see _libm
    a = _libm(math.exp, -beta + i * math.log(beta) - special.gammaln(i + 1)) if beta > 0 else np.array([1.0])
    # Poisson has a closed-form tail sampler via its additivity, so nothing is truncated:
    # the table serves the degree search; degrees beyond it come from numpy's Poisson.
    return Activation(
        name="exp",
        params=params,
        coefficients=a / a.sum(),
        dual_fn=functools.partial(_exp_dual, beta),
        gap_fn=functools.partial(_exp_gap, beta),
        derivative_at_one=beta,
        sum_fn=functools.partial(_poisson_sum, beta),
        degree_fn=functools.partial(_poisson_degrees, beta),
    )


def _relu(params) -> Activation:
    c = _arcsin_c(ARCSIN_TABLE_TERMS)
    kmax = 2 * ARCSIN_TABLE_TERMS + 2
    a = np.zeros(kmax)
    a[0] = 1 / math.pi
    a[1] = 0.5
    k = np.arange(ARCSIN_TABLE_TERMS)
    a[2 * k + 2] = c / ((2 * k + 2) * math.pi)
    a = a[: 2 * ARCSIN_TABLE_TERMS + 1]
    tail = ArcsinTail(k0=ARCSIN_TABLE_TERMS, offset=2, relu=True, mass=max(0.0, 1.0 - math.fsum(a)))
    return Activation("relu", params, a, _relu_dual, 1.0, tail=tail, gap_fn=_relu_gap,
                      near_minus_one_fn=_relu_near_minus_one)


def _step(params) -> Activation:
    c = _arcsin_c(ARCSIN_TABLE_TERMS)
    a = np.zeros(2 * ARCSIN_TABLE_TERMS)
    a[0] = 0.5
    k = np.arange(ARCSIN_TABLE_TERMS)
    a[2 * k + 1] = c / math.pi
    tail = ArcsinTail(k0=ARCSIN_TABLE_TERMS, offset=1, relu=False, mass=max(0.0, 1.0 - math.fsum(a)))
    return Activation("step", params, a, _step_dual, math.inf, tail=tail, gap_fn=_step_gap,
                      near_minus_one_fn=_step_near_minus_one)


def _polynomial(params) -> Activation:
    p = dict(params)
    degree = p.get("degree")
    c = float(p.get("c", 0.0))
    a = _binomial_coefficients(degree, c)
    prob = 1.0 / (1.0 + c)
    return _series_activation(
        "polynomial", params, a,
        sum_fn=functools.partial(_binomial_sum, degree, prob),
        dual=functools.partial(_polynomial_dual, degree, c),
        gap=functools.partial(_polynomial_gap, degree, c),
    )


def _binomial_coefficients(degree: int, c: float) -> np.ndarray:
    """``a_i = binom(degree, i) c^(degree-i) / (1+c)^degree`` for i = 0..degree (float64,
    length degree + 1): the Binomial(degree, 1/(1+c)) probabilities, the coefficients
    of ``((rho + c)/(1 + c))^degree``.

    Computed directly where no intermediate overflows (degree up to ~1,000, the
    values of earlier versions, bit for bit); else in the log domain, where every
    degree up to MAX_DEGREE and every finite c >= 0 works (relative error ~1e-11)."""
    from scipy import special

    i = np.arange(degree + 1)
    try:
        a = _libm(math.exp, special.gammaln(degree + 1) - special.gammaln(i + 1) - special.gammaln(degree - i + 1))
        a = a * np.array([math.pow(c, degree - j) if degree > j else 1.0 for j in range(degree + 1)])
        return a / math.pow(1 + c, degree)
    except OverflowError:  # binom(degree, i) > 1.8e308 from degree 1030, or (1 + c)^degree
        pass
    if c == 0.0:  # rho^degree: all the mass on the top degree
        a = np.zeros(degree + 1)
        a[degree] = 1.0
        return a
    log_binom = special.gammaln(degree + 1) - special.gammaln(i + 1) - special.gammaln(degree - i + 1)
    # log(c^(p-i) / (1+c)^p) = (p-i) log c - p log1p(c); C-library logs (see _libm)
    return _libm(math.exp, log_binom + (degree - i) * math.log(c) - degree * math.log1p(c))


def _coefficients(params) -> Activation:
    a = np.asarray(dict(params)["values"], dtype=np.float64)
    return _series_activation("coefficients", params, a)


# --------------------------------------------------------------------------- quadrature
# Evaluated with the C library's scalar functions (see _libm): the coefficients feed
# the sampler's degree tables and must have the same bits on every CPU.
def _softplus(z):
    return max(z, 0.0) + math.log1p(math.exp(-abs(z)))


def _sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def _gelu(z):
    return 0.5 * z * (1.0 + math.erf(z / math.sqrt(2.0)))


def _silu(z):
    return z * _sigmoid(z)


def _relu_scalar(z):
    return max(z, 0.0)


def _step_scalar(z):
    return 1.0 if z > 0 else 0.0


_NAMED: dict[str, Callable[[float], float]] = {
    "tanh": math.tanh,
    "erf": math.erf,
    "sigmoid": _sigmoid,
    "gelu": _gelu,
    "silu": _silu,
    "softplus": _softplus,
    "sin": math.sin,
    "cos": math.cos,
    "abs": abs,
    "relu": _relu_scalar,
    "step": _step_scalar,
}


#: Work counters for tests (the parse cost is bounded by counts, not clocks): points at which a
#: user function was evaluated, and Hermite recurrences run (projections).
COUNTS = {"evaluations": 0, "projections": 0}


@functools.lru_cache(maxsize=1)
def _grid() -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The quadrature of :func:`_hermite`: nodes ``z``, weights ``w``, ``sqrt(phi(z))`` and the
    number of nodes per panel (read-only arrays, built once)."""
    return _panels(np.linspace(-40.0, 40.0, 1601))  # 1600 panels: 0 is a panel boundary


def _split_grid(breaks) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """:func:`_grid` with a panel boundary added at each of ``breaks`` that is not within 1e-12
    of one already (the same grid, bit for bit, when none is added): Gauss-Legendre panels
    then never straddle a kink or a jump."""
    edges = np.linspace(-40.0, 40.0, 1601)
    extra = [t for t in breaks if -40.0 < t < 40.0 and np.abs(edges - t).min() > 1e-12]
    if not extra:
        return _grid()
    return _panels(np.sort(np.concatenate((edges, extra))))


def _panels(edges):
    nodes, weights = np.polynomial.legendre.leggauss(24)
    mid = 0.5 * (edges[1:] + edges[:-1])[:, None]
    half = 0.5 * (edges[1:] - edges[:-1])[:, None]
    z = (mid + half * nodes[None, :]).ravel()
    w = (half * weights[None, :]).ravel()
    root_phi = _libm(math.exp, -z * z / 4) / (2 * math.pi) ** 0.25
    for arr in (z, w, root_phi):
        arr.setflags(write=False)
    return z, w, root_phi, nodes.size


def _moments(f: np.ndarray, grid=None) -> tuple[float, tuple]:
    """``(second_moment, (outer, total))`` of the values ``f`` at the nodes (see :func:`_hermite`)."""
    z, w, root_phi, per_panel = grid or _grid()
    second = float(np.sum((w * f * f) * (root_phi * root_phi)))  # as ever: the named tables' bits
    mass = w * np.square(f * root_phi)  # for the checks: root_phi^2 alone underflows at |z| near 40
    outer = float(np.sum(mass[: 2 * per_panel]) + np.sum(mass[-2 * per_panel:]))  # two panels each side
    return second, (outer, float(np.sum(mass)))


def _recurrence(f: np.ndarray, degree: int, second: float | None = None, grid=None) -> np.ndarray:
    """``b[i] = E[f(Z) He_i(Z)] / sqrt(i!)`` for ``i = 0 .. degree`` from the values ``f`` at the
    nodes.  With ``second``, stops early once the dropped mass ``1 - sum b_i^2 / second`` is at
    most TOLERANCE (checked every 32 degrees), returning the prefix computed so far: the same
    bits as the full run's prefix, and :func:`_cut` finds the same cut in it.  ``grid``:
    another quadrature (:func:`_split_grid`), ``f`` given at its nodes."""
    z, w, root_phi, _ = grid or _grid()
    COUNTS["projections"] += 1
    g = w * f * root_phi
    b = np.empty(degree + 1)
    h_prev = np.zeros_like(z)
    h = root_phi.copy()
    for i in range(degree + 1):  # recurrence over degree, vectorised over nodes
        b[i] = np.sum(g * h)
        if second is not None and i % 32 == 31 and (1.0 - np.cumsum(b[: i + 1] * b[: i + 1] / second) <= TOLERANCE).any():
            return b[: i + 1]
        h_next = (z * h - math.sqrt(i) * h_prev) / math.sqrt(i + 1)
        h_prev, h = h, h_next
    return b


def _hermite(fn: Callable[[float], float], degree: int) -> tuple[np.ndarray, float, tuple]:
    """HermiteE coefficients of the scalar function ``fn`` under the standard normal weight.

    Returns ``(b, second_moment, (outer, total))`` where ``outer`` is the part of the second
    moment in the two outermost panels on each side and ``total`` the second moment, both
    computed without underflow (for :func:`project`'s checks), and ``b[i] = E[fn(Z) He_i(Z)] / sqrt(i!)`` for
    ``i = 0 .. degree`` and ``second_moment = E[fn(Z)**2]`` (so ``sum b_i^2`` tends to
    it).  Integrals use composite Gauss-Legendre panels on [-40, 40] with a break
    at 0, because plain Gauss-HermiteE nodes converge slowly for activations with
    a kink at 0 (relu, step, abs); the Hermite functions are built by the
    normalised three-term recurrence, which stays bounded for high degrees.  Sums
    are numpy's pairwise sums of elementwise products, never a BLAS dot product,
    so the result is the same on every CPU.
    """
    f = _libm(fn, _grid()[0])
    second, outer = _moments(f)
    return _recurrence(f, degree), second, outer


def hermite_coefficients(fn: Callable[[float], float], degree: int) -> tuple[np.ndarray, float]:
    """HermiteE coefficients of the scalar function ``fn`` under the standard normal weight:
    ``(b, second_moment)`` with ``b[i] = E[fn(Z) He_i(Z)] / sqrt(i!)`` for ``i = 0 .. degree``
    and ``second_moment = E[fn(Z)**2]`` (see :func:`_hermite`)."""
    b, second, _ = _hermite(fn, degree)
    return b, second


@functools.lru_cache(maxsize=None)
def _named_series(name: str) -> tuple[np.ndarray, float]:
    b, second = hermite_coefficients(_NAMED[name], MAX_QUADRATURE_DEGREE)
    a = b * b / second
    # Floating-point noise makes tiny negative cumulative tails; clip before searching.
    tails = np.maximum(1.0 - np.cumsum(a), 0.0)
    ok = np.flatnonzero(tails <= TOLERANCE)
    k = int(ok[0]) if ok.size else a.size - 1
    a = a[: k + 1]
    return a, float(max(0.0, 1.0 - math.fsum(a)))


def quadrature_activation(name: str, params=()) -> Activation:
    """The conjugate activation of a named elementwise function, by HermiteE projection
    (``abs``, kinked at 0, with the exact tail of :func:`project_exact`)."""
    import dataclasses

    if name == "abs":
        return projected_activation(name, params, abs, "abs", key=("named", name), breaks=[0.0])
    a, truncation = _named_series(name)
    act = _series_activation(name, params, a, truncation=truncation)
    return dataclasses.replace(act, dual_error=2 * truncation / (1 - truncation))


# --------------------------------------------------------------------------- user functions
#: The outermost Gauss-Legendre panels (|z| near 40) may carry at most this share of
#: E[f(Z)^2]: more means f(z)^2 exp(-z^2/2) does not decay (not square-integrable).
OUTER_SHARE = 1e-12


class ProjectionError(ValueError):
    """A function whose HermiteE projection does not exist (not finite, not square-
    integrable under the Gaussian, identically zero); one line, for the parser to place."""


class _Checked:
    """``fn`` (float -> float) that raises :class:`ProjectionError` where it fails or is not finite."""

    def __init__(self, fn, what):
        self.fn, self.what = fn, what

    def __call__(self, z):
        try:
            v = float(self.fn(z))
        except (ArithmeticError, ValueError, TypeError) as ex:
            raise ProjectionError(f"{self.what} cannot be evaluated at x = {z:.4g} ({type(ex).__name__}: {ex}); "
                                  "it must be finite for every real x and square-integrable under the standard normal") from None
        if not math.isfinite(v):
            raise ProjectionError(f"{self.what} is {v} at x = {z:.4g}; it must be finite for every real x "
                                  "and square-integrable under the standard normal")
        return v


def _values(fn: Callable[[float], float], what: str, grid=None) -> np.ndarray:
    """``fn`` at the quadrature nodes (float64), or :class:`ProjectionError` naming ``what``.
    A compiled expression is evaluated a whole array at a time (the same bits); where that
    fails, the scalar path finds the first bad node for the message."""
    from .expression import Expr, evaluate

    checked = _Checked(fn, what)
    for z in (0.0, -1.0, 1.0):  # kinks sit at panel edges, which the quadrature nodes skip (1/x)
        checked(z)
    z = (grid or _grid())[0]
    COUNTS["evaluations"] += z.size
    if isinstance(fn, Expr):
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                f = evaluate(fn, z)
            if np.isfinite(f).all():
                return f
        except (ArithmeticError, ValueError, TypeError):
            pass
    return _libm(checked, z)


def check_function(fn: Callable[[float], float], what: str) -> tuple[np.ndarray, float]:
    """The checks of :func:`project` without the projection (cheap: one evaluation of ``fn``
    at the quadrature nodes): ``(values, second_moment)``, or :class:`ProjectionError` when
    ``fn`` raises or is not finite at a node, is not square-integrable under the Gaussian, or
    is zero."""
    f = _values(fn, what)
    with np.errstate(over="ignore", invalid="ignore"):
        second, (outer, total) = _moments(f)
    if not math.isfinite(second) or second > 1e300:
        raise ProjectionError(f"{what} is not square-integrable under the standard normal (E[f(Z)^2] overflows)")
    if total <= 0.0:
        raise ProjectionError(f"{what} is identically zero (E[f(Z)^2] = 0); its kernel would be 0/0")
    if not outer <= OUTER_SHARE * total:
        raise ProjectionError(f"{what} is not square-integrable under the standard normal: f(x)^2 exp(-x^2/2) "
                              f"does not decay by |x| = 40 ({outer / total:.2g} of E[f(Z)^2] lies there)")
    if not second > 1e-300:
        raise ProjectionError(f"{what} is too small (E[f(Z)^2] = {total:.2g} underflows); scale it up (the kernel "
                              "does not depend on the scale)")
    return f, second


def project(fn: Callable[[float], float], what: str) -> tuple[np.ndarray, float]:
    """The conjugate series of the scalar function ``fn`` (float -> float) by HermiteE
    projection: ``(a, truncation)`` with ``a`` float64 (the normalised squared Hermite
    coefficients ``b_i^2 / E[f(Z)^2]``, cut where the dropped mass falls below
    :data:`TOLERANCE` or at :data:`MAX_QUADRATURE_DEGREE`) and ``truncation`` the dropped
    mass.  Raises :class:`ProjectionError` (naming ``what``) when ``fn`` raises or is not
    finite at a quadrature node (|x| <= 40), is not square-integrable under the Gaussian,
    or is zero (:func:`check_function`)."""
    f, second = check_function(fn, what)
    with np.errstate(over="ignore", invalid="ignore"):
        b = _recurrence(f, MAX_QUADRATURE_DEGREE, second)
    return _cut(b * b / second)


def _cut(a: np.ndarray) -> tuple[np.ndarray, float]:
    """Truncate the series ``a`` where its dropped mass falls below TOLERANCE (as _named_series)."""
    tails = np.maximum(1.0 - np.cumsum(a), 0.0)
    ok = np.flatnonzero(tails <= TOLERANCE)
    k = int(ok[0]) if ok.size else a.size - 1
    a = a[: k + 1]
    return a, float(max(0.0, 1.0 - math.fsum(a)))


def project_exact(fn: Callable[[float], float], what: str, breaks) -> tuple[np.ndarray, float, object]:
    """:func:`project` for a function whose kinks and jumps are at ``breaks`` (floats), with the
    exact dual of :mod:`rfsgen.duals`: ``(a, truncation, tail)``.  The quadrature grid gets a
    panel boundary at each breakpoint (the grid and so the series' bits are unchanged where
    they all lie on boundaries already, such as 0); ``a`` is cut as :func:`project` cuts it (the
    sampler's table) and ``tail`` is an :class:`rfsgen.duals.ExactTail` (None when there is no
    breakpoint within duals.REACH or more than duals.MAX_BREAKPOINTS: the truncated series)."""
    from . import duals
    from .expression import Expr, evaluate

    breaks = [t for t in breaks if abs(t) <= duals.REACH]
    if not breaks or len(breaks) > duals.MAX_BREAKPOINTS:
        return project(fn, what) + (None,)
    f, second = check_function(fn, what)
    grid = _split_grid(breaks)
    if grid is not _grid():
        f = _values(fn, what, grid)
        second = _moments(f, grid)[0]
    with np.errstate(over="ignore", invalid="ignore"):
        b = _recurrence(f, MAX_QUADRATURE_DEGREE, None, grid)
    a, truncation = _cut(b * b / second)

    def vec(z):
        if isinstance(fn, Expr):
            with np.errstate(all="ignore"):
                return evaluate(fn, z)
        return _libm(fn, z)

    pieces = []
    for t in breaks:
        near = min([abs(t - u) for u in breaks if u != t] + [1.0])
        pieces += duals.pieces_from_jumps(t, duals.one_sided_jumps(vec, t, near / 2))
    return a, truncation, duals.exact_tail(b, second, pieces)


_SERIES: dict = {}  # key -> (a, truncation, tail): projections take 0.1-1 s; a skeleton repeats them


def _projected_series(key, fn, what, breaks=None):
    if key not in _SERIES:
        if len(_SERIES) >= 256:
            _SERIES.clear()
        _SERIES[key] = project(fn, what) + (None,) if breaks is None else project_exact(fn, what, breaks)
    return _SERIES[key]


def _exact_dual(tail, rho):
    return tail.dual(rho)


def _exact_gap(tail, tails, rho, delta):
    return tail.gap(tails, rho, delta)


def projected_activation(name: str, params: tuple, fn: Callable[[float], float], what: str, key=None,
                         breaks=None) -> Activation:
    """The conjugate activation of the scalar function ``fn`` by HermiteE projection
    (the series cached per ``key``, default ``(name, params)``); see :func:`project`.  With
    ``breaks`` (where ``fn`` has kinks or jumps; see :func:`project_exact`) the dual is exact to
    ``dual_error`` while the sampler's table stays the cut series."""
    import dataclasses

    a, truncation, tail = _projected_series(key or (name, params), fn, what, breaks)
    act = _series_activation(name, params, a, truncation=truncation)
    if tail is None:
        return dataclasses.replace(act, dual_error=2 * truncation / (1 - truncation))
    tails = np.maximum(np.cumsum(tail.series[::-1])[::-1][1:], 0.0)
    return dataclasses.replace(act, dual_fn=functools.partial(_exact_dual, tail),
                               gap_fn=functools.partial(_exact_gap, tail, tails), dual_error=tail.error)


def _elu_scalar(alpha, z):
    return z if z > 0 else alpha * math.expm1(z)


def _elu(params) -> Activation:
    alpha = dict(params)["alpha"]
    return projected_activation("elu", params, functools.partial(_elu_scalar, alpha), f"elu(alpha={alpha:g})",
                                breaks=[0.0])


# ---- leaky_relu = (1+s)/2 x + (1-s)/2 |x|: its dual mixes rho and abs's arc-cosine dual
def _leaky_weights(slope):
    """``(w1, w2)``: the dual is ``w1 rho + w2 abs_dual(rho)`` with
    ``abs_dual(rho) = (2/pi)(sqrt(1 - rho^2) + rho arcsin rho)``; ``w1 + w2 = 1``."""
    norm = (1.0 + slope * slope) / 2.0  # E[f(Z)^2]
    return ((1.0 + slope) / 2.0) ** 2 / norm, ((1.0 - slope) / 2.0) ** 2 / norm


def _leaky_dual(slope, rho):
    w1, w2 = _leaky_weights(slope)
    return w1 * rho + w2 * (2.0 / math.pi) * (np.sqrt(np.maximum(0.0, 1 - rho * rho)) + rho * np.arcsin(rho))


def _leaky_gap(slope, rho, delta):
    # 1 - abs_dual = 2 (1 - relu_dual) - delta, since relu_dual = rho/2 + abs_dual/2
    w1, w2 = _leaky_weights(slope)
    delta = np.clip(delta, 0.0, 2.0)
    return w1 * delta + w2 * (2.0 * _relu_gap(rho, delta) - delta)


def _leaky_relu(params) -> Activation:
    slope = dict(params)["slope"]
    w1, w2 = _leaky_weights(slope)
    c = _arcsin_c(ARCSIN_TABLE_TERMS)
    a = np.zeros(2 * ARCSIN_TABLE_TERMS + 1)
    k = np.arange(ARCSIN_TABLE_TERMS)
    a[0] = w2 * 2.0 / math.pi
    a[1] = w1
    a[2 * k + 2] = w2 * 2.0 * c / ((2 * k + 2) * math.pi)
    tail = None
    if w2 > 0:  # the same heavy tail as relu's, scaled by 2 w2
        tail = ArcsinTail(k0=ARCSIN_TABLE_TERMS, offset=2, relu=True, mass=max(0.0, 1.0 - math.fsum(a)))
    # sigma_hat'(1) = w1 + w2 abs_dual'(1) = 1, as abs_dual' = (2/pi) arcsin
    return Activation("leaky_relu", params, a, functools.partial(_leaky_dual, slope), 1.0, tail=tail,
                      gap_fn=functools.partial(_leaky_gap, slope))


# ---- arc-cosine kernels of degree n (Cho and Saul 2009): the duals of step(x) x^n
#: Highest arc-cosine degree (the closed forms below).
MAX_ARCCOS_DEGREE = 3


def arccos_j(n: int, theta: np.ndarray) -> np.ndarray:
    """Cho and Saul's ``J_n(theta)`` for n = 0..3 (float64, elementwise; theta in [0, pi])."""
    s, c, r = np.sin(theta), np.cos(theta), math.pi - theta
    if n == 0:
        return r
    if n == 1:
        return s + r * c
    if n == 2:
        return 3 * s * c + r * (1 + 2 * c * c)
    return 15 * s - 11 * s ** 3 + r * (9 * s * s * c + 15 * c ** 3)


def arccos_dual(n: int, rho: np.ndarray) -> np.ndarray:
    """The normalised arc-cosine dual ``J_n(arccos rho) / J_n(0)`` (``J_n(0) = pi (2n-1)!!``),
    float64 elementwise; n = 0 is step's dual and n = 1 relu's."""
    theta = np.arccos(np.clip(np.asarray(rho, dtype=np.float64), -1.0, 1.0))
    return arccos_j(n, theta) / float(arccos_j(n, np.zeros(1))[0])


def _step_power_scalar(n, z):
    return z ** n if z > 0 else 0.0


def _arccos(params) -> Activation:
    import dataclasses

    n = dict(params)["degree"]
    if n <= 1:  # step and relu, with their exact tails and closed forms
        base = _step(()) if n == 0 else _relu(())
        return dataclasses.replace(base, name="arccos", params=params, coefficients=np.array(base.coefficients))
    # n >= 2: a_i ~ i^-(n + 3/2); the series is cut like the other projected activations
    # and the sampler and kernel share it (its closed form is arccos_dual).
    return projected_activation("arccos", params, functools.partial(_step_power_scalar, n), f"arccos(degree={n})",
                                breaks=[0.0])


# --------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class ActivationKind:
    """A registry entry: parameter names with defaults/validators, and a builder."""

    name: str
    doc: str
    params: Mapping[str, tuple]  # name -> (default or REQUIRED, validator(value) -> value)
    build: Callable[[tuple], Activation]


REQUIRED = object()


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


#: Largest beta of exp (its Poisson table grows with beta).
MAX_BETA = 1000.0


def _nonneg_float(name, limit=math.inf):
    return functools.partial(_check_nonneg_float, name, limit)


def _finite(v) -> bool:
    """A finite int or float (an int too large for a float is not: float() overflows)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _check_nonneg_float(name, limit, v):
    if not _finite(v) or v < 0:
        raise ValueError(f"'{name}' must be a finite number >= 0, got {_short(v)}")
    if v > limit:
        raise ValueError(f"'{name}' {_short(v)} is over the limit of {limit:g}")
    return float(v)


#: Largest polynomial degree and longest coefficient list (tables are held in memory).
MAX_DEGREE = 100_000


def _pos_int(name):
    return functools.partial(_check_pos_int, name)


def _check_pos_int(name, v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"'{name}' must be an integer >= 1, got {_short(v)}")
    if v > MAX_DEGREE:
        raise ValueError(f"'{name}' {_short(v)} is over the limit of {MAX_DEGREE}")
    return int(v)


def _coef_list(v):
    if not isinstance(v, (list, tuple)) or not v:
        raise ValueError(f"'values' must be a non-empty list of numbers, got {_short(v)}")
    if len(v) > MAX_DEGREE + 1:
        raise ValueError(f"'values' has {len(v)} coefficients, over the limit of {MAX_DEGREE + 1}")
    out = []
    for i, x in enumerate(v):
        if not _finite(x):
            raise ValueError(f"coefficient a_{i} must be a finite number, got {_short(x)}")
        if x < 0:
            raise ValueError(
                f"coefficient a_{i} = {x} is negative; conjugate activations need a_i >= 0"
            )
        out.append(float(x))
    if sum(out) <= 0:
        raise ValueError("coefficients must not all be zero")
    return tuple(out)


#: Largest |slope| of leaky_relu and alpha of elu.
MAX_PARAM = 1e6


def _finite_float(name):
    return functools.partial(_check_finite_float, name)


def _check_finite_float(name, v):
    if not _finite(v):
        raise ValueError(f"'{name}' must be a finite number, got {_short(v)}")
    if abs(v) > MAX_PARAM:
        raise ValueError(f"'{name}' {_short(v)} is over the limit of {MAX_PARAM:g} in size")
    return float(v)


def _arccos_degree(v):
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_ARCCOS_DEGREE:
        raise ValueError(f"'degree' of arccos must be an integer from 0 to {MAX_ARCCOS_DEGREE}, got {_short(v)}")
    return int(v)


def _expression(v):
    """Check an ``expr`` (compiling it, so that errors come at parse time); keep the text."""
    check_expression(v)
    return v


def check_expression(text) -> None:
    """Refuse at parse time, in one line, an expression that is not a conjugate activation:
    outside the whitelist (ExpressionError), not a finite real number somewhere on the real
    line (a pole, tan, log / sqrt / ** outside their domains: found by interval arithmetic,
    whatever the quadrature nodes see), not square-integrable under the standard normal,
    or zero (ProjectionError; both are ValueErrors, so the parser adds file, line and node).
    Costs one interval analysis and one evaluation at the quadrature nodes; the projection
    itself waits for the sampler or the kernel."""
    from .expression import compile_expression, render, singular_point

    fn = compile_expression(text)
    what = f"expression '{_short_text(text)}'"
    bad = singular_point(fn)
    if bad is not None:
        x, why, operand = bad
        raise ProjectionError(f"{what} is not a finite real number near x = {x:.6g}: {why} (of '{render(operand)}'); "
                              "an activation must be finite for every real x and square-integrable under the "
                              "standard normal")
    check_function(fn, what)


#: Most distinct expressions (``activation: {name: function, expr: ...}``) in one skeleton,
#: checked before any is compiled: each costs about 40 ms to check at parse time and up to
#: 0.2-0.5 s to project when sampling or computing the kernel.
MAX_EXPRESSIONS = 64


def heavy_tailed(act) -> bool:
    """Whether ``act``'s degree series is infinite with radius of convergence 1 and is sampled
    exactly (relu, step, leaky_relu with slope != 1, arccos of degree 0 and 1): then
    sum_i a_i m^i is infinite for every m > 1, and a feature above an input with C > 1 has
    infinite variance.  Truncated series (tanh, elu, expressions, ...) and entire ones (exp,
    polynomials) are finite at every m.  Decided from the name where it can be, without
    building the series."""
    name, params = act.name, dict(act.params)
    if name in ("relu", "step"):
        return True
    if name == "arccos":
        return params.get("degree", 2) <= 1
    if name == "leaky_relu":
        return params.get("slope") != 1.0
    if name in ("identity", "exp", "polynomial", "coefficients", "elu", "function", "python") or name in _NAMED:
        return False  # entire, finite, or cut at TOLERANCE / MAX_QUADRATURE_DEGREE
    return act.tail is not None


def _short_text(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _function(params) -> Activation:
    from .expression import compile_expression

    from .duals import REACH
    from .expression import breakpoints

    text = dict(params)["expr"]
    fn = compile_expression(text)
    return projected_activation("function", params, fn, f"expression '{text}'", breaks=breakpoints(fn, REACH))


def _python(params) -> Activation:
    p = dict(params)
    # the series is cached per function object (projected_activation's cache keys on fn too)
    return projected_activation(p["name"], (), p["fn"], f"function '{p['name']}'", key=("python",) + params)


REGISTRY: dict[str, ActivationKind] = {}


def _register(kind: ActivationKind) -> None:
    REGISTRY[kind.name] = kind


_register(ActivationKind("identity", "sigma_hat(rho) = rho", {}, _identity))
_register(ActivationKind("exp", "exp(beta (rho - 1)); Poisson(beta) degrees",
                         {"beta": (1.0, _nonneg_float("beta", MAX_BETA))}, _exp))
_register(ActivationKind("relu", "normalized ReLU dual (arc-cosine kernel of degree 1)", {}, _relu))
_register(ActivationKind("step", "1/2 + arcsin(rho)/pi (arc-cosine kernel of degree 0)", {}, _step))
_register(ActivationKind("polynomial", "((rho + c)/(1 + c))^degree",
                         {"degree": (REQUIRED, _pos_int("degree")), "c": (0.0, _nonneg_float("c"))},
                         _polynomial))
_register(ActivationKind("coefficients", "sum_i a_i rho^i with the given a_i, normalized",
                         {"values": (REQUIRED, _coef_list)}, _coefficients))
_register(ActivationKind("leaky_relu", "dual of max(x, 0) + slope min(x, 0) (relu's arc-cosine series and rho)",
                         {"slope": (0.01, _finite_float("slope"))}, _leaky_relu))
_register(ActivationKind("elu", "dual of x (x > 0), alpha (e^x - 1) (x <= 0) by HermiteE projection",
                         {"alpha": (1.0, _nonneg_float("alpha", MAX_PARAM))}, _elu))
_register(ActivationKind("arccos", "arc-cosine kernel of degree n (Cho and Saul): dual of step(x) x^n, normalized",
                         {"degree": (REQUIRED, _arccos_degree)}, _arccos))
_register(ActivationKind("function", "dual of an expression in x by HermiteE projection",
                         {"expr": (REQUIRED, _expression)}, _function))
for _name in ("tanh", "erf", "sigmoid", "gelu", "silu", "softplus", "sin", "cos", "abs"):
    _register(ActivationKind(
        _name, f"dual of {_name} by HermiteE projection", {},
        functools.partial(quadrature_activation, _name),
    ))


def make_activation(spec, params: Mapping | None = None, **keywords) -> "ActivationRef":
    """An activation from its registry name ``spec`` and parameters, built when first used.

    Raises :class:`ValueError` with a precise message (the skeleton parser adds
    file and line) for unknown names or parameters and for invalid values.

    ``make_activation(fn, name="mine")`` instead takes a Python function ``fn``
    (float -> float, called once per quadrature node) and gives the activation of its
    dual by HermiteE projection, as for ``tanh``; pass it to a skeleton with
    ``parse_skeleton(text, activations={"mine": act})`` / ``load_skeleton(path,
    activations=...)`` and write ``activation: mine``.  It pickles when ``fn`` does
    (a module-level function, not a lambda).  A function that fails or is not finite
    for some x, is not square-integrable under the standard normal, or is zero raises
    :class:`ValueError` (a ProjectionError) at once.
    """
    name = spec
    if callable(spec):
        label = keywords.pop("name", None) or getattr(spec, "__name__", "function")
        if params or keywords:
            raise TypeError("make_activation(fn, name=...) takes no other parameters")
        if not isinstance(label, str) or not label.isidentifier() or label in REGISTRY:
            raise ValueError(f"name {label!r} of a Python activation must be an identifier that is not a "
                             f"registered activation ({allowed_names()})")
        ref = _cached_ref("python", (("fn", spec), ("name", label)))
        ref.built  # project now: a function without a projection fails here, not in the sampler
        return ref
    if keywords:
        raise TypeError(f"make_activation(name, params) takes no keywords {sorted(keywords)}")
    params = dict(params or {})
    if name not in REGISTRY:
        raise KeyError(name)
    kind = REGISTRY[name]
    unknown = sorted(set(params) - set(kind.params))
    if unknown:
        allowed = ", ".join(sorted(kind.params)) or "none"
        raise ValueError(f"unknown parameter '{unknown[0]}' for activation '{name}' (allowed: {allowed})")
    clean = {}
    for key, (default, check) in kind.params.items():
        if key in params:
            clean[key] = check(params[key])
        elif default is REQUIRED:
            raise ValueError(f"activation '{name}' needs parameter '{key}'")
        else:
            clean[key] = default
    return _cached_ref(name, tuple(sorted(clean.items())))


@functools.lru_cache(maxsize=256)
def _cached_build(name: str, params: tuple) -> Activation:
    if name == "python":  # make_activation(fn, name=...): not a registry name a skeleton can spell
        return _python(params)
    return REGISTRY[name].build(params)


class ActivationRef:
    """An :class:`Activation` named by its registry entry and checked parameters, built
    (series, tables, tail sampler) on first use of anything but ``name`` and ``params``.

    Parsing a skeleton then costs nothing per activation: ``rfsgen transform`` never
    needs the series, and building exp's imports scipy.special (0.12-0.14 s).  Equal
    names and parameters give the same object, as the sampler and the kernel group
    nodes by activation identity; it pickles as its name and parameters.
    """

    __slots__ = ("name", "params", "_built")

    def __init__(self, name: str, params: tuple):
        self.name = name
        self.params = params
        self._built = None

    @property
    def built(self) -> Activation:
        if self._built is None:
            self._built = _cached_build(self.name, self.params)
        return self._built

    def __getattr__(self, attr):  # only for what the slots do not hold
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self.built, attr)

    def __reduce__(self):
        if self.name == "python":
            p = dict(self.params)
            return _python_ref, (p["fn"], p["name"])
        return make_activation, (self.name, dict(self.params))

    def __repr__(self) -> str:
        return repr(self.built)


@functools.lru_cache(maxsize=256)
def _cached_ref(name: str, params: tuple) -> ActivationRef:
    return ActivationRef(name, params)


def _python_ref(fn, name):
    return make_activation(fn, name=name)



def allowed_names() -> str:
    return ", ".join(sorted(REGISTRY))
