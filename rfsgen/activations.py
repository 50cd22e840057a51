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
from scipy import special


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
        k = np.asarray(k, dtype=np.float64)
        log_c = _log_central_ratio(k) - np.log(2 * k + 1)
        if self.relu:
            log_c = log_c - np.log(2 * k + 2)
        return log_c - math.log(math.pi)

    def _log_envelope(self) -> float:
        # w(k) <= A k^-alpha with A from binom(2k,k)/4^k <= 1/sqrt(pi k) and
        # (2k+1)(2k+2) >= 4k^2; P(k) >= s x_m^s (k+1)^-alpha.
        s = self.alpha - 1.0
        a = 1.0 / (4 * math.pi**1.5) if self.relu else 1.0 / (2 * math.pi**1.5)
        xm = float(self.k0)
        return math.log(a) - math.log(s) - s * math.log(xm) + self.alpha * math.log1p(1.0 / xm)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Return ``n`` int64 degrees from the tail distribution."""
        out = np.empty(n, dtype=np.int64)
        todo = np.arange(n)
        s = self.alpha - 1.0
        log_m = self._log_envelope()
        limit = float(2**61)
        while todo.size:
            u = rng.random(todo.size)
            v = rng.random(todo.size)
            x = self.k0 * (1.0 - u) ** (-1.0 / s)
            if np.any(x >= limit):
                from .errors import SamplerError

                raise SamplerError(
                    "a heavy-tailed degree exceeded 2**62 and cannot be represented; "
                    "this happens with probability < 1e-12 per draw -- try another --seed"
                )
            k = np.floor(x)
            p_k = (k / self.k0) ** (-s) - ((k + 1) / self.k0) ** (-s)
            log_accept = self.log_weight(k) - log_m - np.log(p_k)
            ok = np.log(v) <= log_accept
            out[todo[ok]] = self.offset + 2 * k[ok].astype(np.int64)
            todo = todo[~ok]
        return out


def _log_central_ratio(k: np.ndarray) -> np.ndarray:
    """``log(binom(2k, k) / 4**k)`` for float arrays ``k >= 0``, accurate for huge k."""
    k = np.asarray(k, dtype=np.float64)
    out = np.empty_like(k)
    small = k < 1e4
    ks = k[small]
    out[small] = special.gammaln(ks + 0.5) - special.gammaln(ks + 1.0) - 0.5 * math.log(math.pi)
    kb = k[~small]
    # Gamma(k+1/2)/Gamma(k+1) = k^-1/2 (1 - 1/(8k) + 1/(128k^2) + 5/(1024k^3) - 21/(32768k^4))
    series = 1 - 1 / (8 * kb) + 1 / (128 * kb**2) + 5 / (1024 * kb**3) - 21 / (32768 * kb**4)
    out[~small] = -0.5 * np.log(kb) + np.log(series) - 0.5 * math.log(math.pi)
    return out


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

    def sample_degrees(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` iid degrees (int64) with ``P(l = i) = a_i``."""
        if self.degree_fn is not None:
            return self.degree_fn(rng, n)
        u = rng.random(n)
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
        cdf, guide = self._cdf, self._guide
        g = np.minimum((v * GUIDE).astype(np.int64), GUIDE - 1)  # exact: GUIDE is a power of two
        idx = guide[g]
        hi = guide[g + 1]
        todo = np.flatnonzero(idx < hi)
        for _ in range(4):  # a few linear steps settle almost every value...
            if not todo.size:
                return idx
            step = cdf[np.minimum(idx[todo], cdf.size - 1)] <= v[todo]
            idx[todo] += step
            todo = todo[step & (idx[todo] < hi[todo])]
        if todo.size:  # ...the rest (fine-grained far tail of the table) by binary search
            idx[todo] = np.searchsorted(cdf, v[todo], side="right")
        return idx

    def sum_degrees(self, rng: np.random.Generator, m: np.ndarray) -> np.ndarray:
        """For each entry of ``m`` (int64 counts), the sum of that many iid degrees."""
        m = np.asarray(m, dtype=np.int64)
        if self.sum_fn is not None:
            return self.sum_fn(rng, m)
        out = np.zeros(m.size, dtype=np.int64)
        big = m > 100_000
        small = np.flatnonzero(~big & (m > 0))
        if small.size:
            counts = m[small]
            deg = self.sample_degrees(rng, int(counts.sum()))
            starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
            out[small] = np.add.reduceat(deg, starts)
        for i in np.flatnonzero(big):  # rare: one multinomial per huge multiplicity
            out[i] = self._sum_many(rng, int(m[i]))
        return out

    def _sum_many(self, rng: np.random.Generator, count: int) -> int:
        p = np.append(self.coefficients, self.tail_mass)
        p = p / p.sum()
        counts = rng.multinomial(count, p)
        total = int(np.dot(counts[:-1], np.arange(counts.size - 1)))
        if counts[-1]:
            total += int(self.tail.sample(rng, int(counts[-1])).sum())
        return total


def _fmt(v) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _poly_dual(a: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    coef = np.array(a, dtype=np.float64)

    def dual(rho):
        return np.polynomial.polynomial.polyval(rho, coef)

    return dual


def _series_activation(name, params, a, truncation=0.0, sum_fn=None, dual=None) -> Activation:
    a = np.asarray(a, dtype=np.float64)
    a = a / math.fsum(a)
    deriv = float(np.dot(np.arange(a.size), a))
    return Activation(
        name=name,
        params=params,
        coefficients=a,
        dual_fn=dual or _poly_dual(a),
        derivative_at_one=deriv,
        truncation=truncation,
        sum_fn=sum_fn,
    )


# --------------------------------------------------------------------------- builders
def _identity(params) -> Activation:
    return _series_activation(
        "identity", params, [0.0, 1.0], sum_fn=lambda rng, m: np.asarray(m, np.int64).copy(),
        dual=lambda r: np.array(r, dtype=np.float64, copy=True),
    )


def _exp(params) -> Activation:
    beta = float(dict(params).get("beta", 1.0))
    if beta == 0:
        kmax = 1
    else:
        kmax = int(special.pdtrik(1 - TOLERANCE, beta)) + 2
        kmax = max(kmax, 2)
        while special.pdtrc(kmax - 1, beta) > TOLERANCE:  # P(X > kmax-1)
            kmax += 1
    i = np.arange(kmax)
    a = np.exp(-beta + i * math.log(beta) - special.gammaln(i + 1)) if beta > 0 else np.array([1.0])
    # Poisson has a closed-form tail sampler via its additivity, so nothing is truncated:
    # the table serves the degree search; degrees beyond it come from numpy's Poisson.
    return Activation(
        name="exp",
        params=params,
        coefficients=a / a.sum(),
        dual_fn=lambda r: np.exp(beta * (r - 1.0)),
        derivative_at_one=beta,
        sum_fn=lambda rng, m: rng.poisson(beta * np.asarray(m, np.float64)).astype(np.int64),
        degree_fn=lambda rng, n: rng.poisson(beta, n).astype(np.int64),
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

    def dual(r):
        return (np.sqrt(np.maximum(0.0, 1 - r * r)) + (math.pi - np.arccos(r)) * r) / math.pi

    return Activation("relu", params, a, dual, 1.0, tail=tail)


def _step(params) -> Activation:
    c = _arcsin_c(ARCSIN_TABLE_TERMS)
    a = np.zeros(2 * ARCSIN_TABLE_TERMS)
    a[0] = 0.5
    k = np.arange(ARCSIN_TABLE_TERMS)
    a[2 * k + 1] = c / math.pi
    tail = ArcsinTail(k0=ARCSIN_TABLE_TERMS, offset=1, relu=False, mass=max(0.0, 1.0 - math.fsum(a)))
    return Activation(
        "step", params, a, lambda r: 0.5 + np.arcsin(r) / math.pi, math.inf, tail=tail
    )


def _polynomial(params) -> Activation:
    p = dict(params)
    degree = p.get("degree")
    c = float(p.get("c", 0.0))
    i = np.arange(degree + 1)
    a = np.exp(special.gammaln(degree + 1) - special.gammaln(i + 1) - special.gammaln(degree - i + 1))
    with np.errstate(divide="ignore"):
        a = a * np.where(degree - i > 0, c ** (degree - i), 1.0) / (1 + c) ** degree
    prob = 1.0 / (1.0 + c)
    return _series_activation(
        "polynomial", params, a,
        sum_fn=lambda rng, m: rng.binomial(np.asarray(m, np.int64) * degree, prob).astype(np.int64),
        dual=lambda r: ((r + c) / (1 + c)) ** degree,
    )


def _coefficients(params) -> Activation:
    a = np.asarray(dict(params)["values"], dtype=np.float64)
    return _series_activation("coefficients", params, a)


# --------------------------------------------------------------------------- quadrature
_NAMED: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": np.tanh,
    "erf": special.erf,
    "sigmoid": special.expit,
    "gelu": lambda z: 0.5 * z * (1 + special.erf(z / math.sqrt(2))),
    "silu": lambda z: z * special.expit(z),
    "softplus": lambda z: np.logaddexp(0.0, z),
    "sin": np.sin,
    "cos": np.cos,
    "abs": np.abs,
    "relu": lambda z: np.maximum(z, 0.0),
    "step": lambda z: (z > 0).astype(np.float64),
}


def hermite_coefficients(fn: Callable[[np.ndarray], np.ndarray], degree: int) -> tuple[np.ndarray, float]:
    """HermiteE coefficients of ``fn`` under the standard normal weight.

    Returns ``(b, second_moment)`` where ``b[i] = E[fn(Z) He_i(Z)] / sqrt(i!)`` for
    ``i = 0 .. degree`` and ``second_moment = E[fn(Z)**2]`` (so ``sum b_i^2`` tends to
    it).  Integrals use composite Gauss-Legendre panels on [-40, 40] with a break
    at 0, because plain Gauss-HermiteE nodes converge slowly for activations with
    a kink at 0 (relu, step, abs); the Hermite functions are built by the
    normalised three-term recurrence, which stays bounded for high degrees.
    """
    nodes, weights = np.polynomial.legendre.leggauss(24)
    half_width = 40.0
    panels = 1600  # even, so 0 is a panel boundary
    edges = np.linspace(-half_width, half_width, panels + 1)
    mid = 0.5 * (edges[1:] + edges[:-1])[:, None]
    half = 0.5 * (edges[1:] - edges[:-1])[:, None]
    z = (mid + half * nodes[None, :]).ravel()
    w = (half * weights[None, :]).ravel()
    root_phi = np.exp(-z * z / 4) / (2 * math.pi) ** 0.25
    f = fn(z)
    g = w * f * root_phi
    second = float(np.dot(w * f * f, root_phi * root_phi))
    b = np.empty(degree + 1)
    h_prev = np.zeros_like(z)
    h = root_phi.copy()
    for i in range(degree + 1):  # recurrence over degree, vectorised over nodes
        b[i] = np.dot(g, h)
        h_next = (z * h - math.sqrt(i) * h_prev) / math.sqrt(i + 1)
        h_prev, h = h, h_next
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
    """The conjugate activation of a named elementwise function, by HermiteE projection."""
    a, truncation = _named_series(name)
    return _series_activation(name, params, a, truncation=truncation)


# --------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class ActivationKind:
    """A registry entry: parameter names with defaults/validators, and a builder."""

    name: str
    doc: str
    params: Mapping[str, tuple]  # name -> (default or REQUIRED, validator(value) -> value)
    build: Callable[[tuple], Activation]


REQUIRED = object()


def _nonneg_float(name):
    def check(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"'{name}' must be a finite number >= 0, got {v!r}")
        return float(v)

    return check


def _pos_int(name):
    def check(v):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"'{name}' must be an integer >= 1, got {v!r}")
        return int(v)

    return check


def _coef_list(v):
    if not isinstance(v, (list, tuple)) or not v:
        raise ValueError(f"'values' must be a non-empty list of numbers, got {v!r}")
    out = []
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ValueError(f"coefficient a_{i} must be a finite number, got {x!r}")
        if x < 0:
            raise ValueError(
                f"coefficient a_{i} = {x} is negative; conjugate activations need a_i >= 0"
            )
        out.append(float(x))
    if sum(out) <= 0:
        raise ValueError("coefficients must not all be zero")
    return tuple(out)


REGISTRY: dict[str, ActivationKind] = {}


def _register(kind: ActivationKind) -> None:
    REGISTRY[kind.name] = kind


_register(ActivationKind("identity", "sigma_hat(rho) = rho", {}, _identity))
_register(ActivationKind("exp", "exp(beta (rho - 1)); Poisson(beta) degrees",
                         {"beta": (1.0, _nonneg_float("beta"))}, _exp))
_register(ActivationKind("relu", "normalized ReLU dual (arc-cosine kernel of degree 1)", {}, _relu))
_register(ActivationKind("step", "1/2 + arcsin(rho)/pi (arc-cosine kernel of degree 0)", {}, _step))
_register(ActivationKind("polynomial", "((rho + c)/(1 + c))^degree",
                         {"degree": (REQUIRED, _pos_int("degree")), "c": (0.0, _nonneg_float("c"))},
                         _polynomial))
_register(ActivationKind("coefficients", "sum_i a_i rho^i with the given a_i, normalized",
                         {"values": (REQUIRED, _coef_list)}, _coefficients))
for _name in ("tanh", "erf", "sigmoid", "gelu", "silu", "softplus", "sin", "cos", "abs"):
    _register(ActivationKind(
        _name, f"dual of {_name} by HermiteE projection", {},
        functools.partial(lambda n, params: quadrature_activation(n, params), _name),
    ))


def make_activation(name: str, params: Mapping | None = None) -> Activation:
    """Build an activation from its registry name and parameters.

    Raises :class:`ValueError` with a precise message (the skeleton parser adds
    file and line) for unknown names or parameters and for invalid values.
    """
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
    return _cached_build(name, tuple(sorted(clean.items())))


@functools.lru_cache(maxsize=256)
def _cached_build(name: str, params: tuple) -> Activation:
    return REGISTRY[name].build(params)


def allowed_names() -> str:
    return ", ".join(sorted(REGISTRY))
