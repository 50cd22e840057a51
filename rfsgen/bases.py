"""Base spaces: the registry of input-node kernels and their random feature schemes.

Every base factor is written as ``R * exp(i * theta)``.  A factor is identified by
an integer ``code`` and an integer ``power`` (the factor raised to that power):

============  =====================  ===============================  ===========
base          code                   power                            combine
============  =====================  ===============================  ===========
binary        0                      1 (x itself)                     mod 2
circle        0                      exponent k of e^{i k t}          add
categorical   0                      frequency w of e^{2 pi i w x/n}  add mod n
sphere/pair   2 j + (s < 0)          multiplicity                     add
sphere/coord  j                      multiplicity                     add
gaussian      row of the omega table 1                                vectors add
laplace       row of the omega table 1                                vectors add
brownian      (m - 1) width + j      multiplicity                     multiset
============  =====================  ===============================  ===========

Each :class:`Base` knows its exact kernel (batched over nodes of one group), how
to validate and prepare input values, how to draw ``count`` factors at once, how
to conjugate a factor, and the complex value of a factor on input rows
(the transform's "atoms").  Adding a base means adding one entry to
:data:`REGISTRY`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from .errors import DataError, UsageError, article

REQUIRED = object()
#: Default of a parameter that is simply absent when not given (the base's params, label
#: and so every existing file stay as they were).
OPTIONAL = object()


@dataclass(frozen=True)
class Base:
    """An immutable base-kernel description for input nodes with ``width`` columns each."""

    name: str
    params: tuple  # sorted ((key, value), ...)
    width: int  # columns per node

    # ------------------------------------------------------------------ helpers
    def param(self, key):
        return dict(self.params)[key]

    @property
    def kind(self) -> "BaseKind":
        return REGISTRY[self.name]

    @property
    def label(self) -> str:
        defaults = {"zero": "error", "normalize_blocks": 0, "orthogonal": False, "domain": None, "boundary": "pinned"}
        shown = [(k, v) for k, v in self.params if defaults.get(k, object()) != v]
        inner = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown)
        return f"{self.name}({inner})" if inner else self.name

    @property
    def continuous(self) -> bool:
        return self.kind.continuous

    @property
    def modulus(self) -> int:
        """Powers are reduced modulo this (0: no reduction)."""
        return self.kind.modulus(self)

    @property
    def uniform_codes(self) -> int:
        """For bases whose single draw is one code uniform in [0, n) with power 1 (sphere):
        n; 0 otherwise.  The ``strat`` scheme stratifies such codes."""
        return self.kind.uniform_codes(self)

    @property
    def norm_bound(self) -> float:
        """C = sup |psi| of the base scheme."""
        return self.kind.norm_bound(self)

    @property
    def walk_problem(self) -> str | None:
        """Why nodes of this base have no compositional features or exact kernel (a
        message with its fix), or None."""
        return self.kind.walk_problem(self)

    # ------------------------------------------------------------------ numerics
    def prepare(self, x: np.ndarray, nodes: list[str], row0: int, source: str, overwrite: bool = False) -> np.ndarray:
        """Validate and transform raw values.

        ``x`` is float64 ``(m, G, width)``: m rows, G nodes of this base.  Returns
        the prepared float64 array of the same shape (normalised for sphere,
        scaled angle for circle, ...), which may be ``x`` itself, overwritten, when
        ``overwrite`` is true.  Raises :class:`DataError` naming the row
        (0-based, offset by ``row0``), the node and ``source``.
        """
        if not overwrite:
            x = x.copy()
        return self.kind.prepare(self, x, nodes, row0, source)

    def prepare_columns(self, x: np.ndarray, cols: np.ndarray, nodes: list[str], row0: int,
                        source: str) -> np.ndarray:
        """:meth:`prepare` of the values ``x[:, cols]``: ``x`` checked rows, float32 or float64
        ``(m, w)`` C order with finite values; ``cols`` int64 ``(G, width)``, each in ``[0, w)``.
        Returns the prepared float64 ``(m, G, width)``.  Bases whose preparation can run as
        the values are gathered (sphere) do both in one pass, with the same bits."""
        m, (g, width) = x.shape[0], cols.shape
        flat = np.ascontiguousarray(cols, dtype=np.int64).reshape(-1)
        if self.kind.prepare_columns is not None:
            return self.kind.prepare_columns(self, x, flat, g, nodes, row0, source)
        from ._compiled import gather_columns

        gathered = np.empty((m, g, width))
        if m:
            gather_columns(x, flat, gathered.reshape(m, -1))
        return self.kind.prepare(self, gathered, nodes, row0, source)

    def gram(self, xp: np.ndarray, yp: np.ndarray):
        """Exact base kernel between prepared ``(m, G, w)`` and ``(n, G, w)`` rows:
        ``(rho, delta, eps)``, float64 ``(G, m, n)`` each, where ``delta = 1 - rho`` and
        ``eps = 1 + rho`` are computed without cancellation (exactly 0 for equal or
        opposite rows)."""
        return self.kind.gram(self, xp, yp)

    def sample(self, rng: np.random.Generator, counts: np.ndarray):
        """Draw ``counts[t]`` iid base factors for each item t and combine them.

        Returns ``(item, code, power)`` int64 arrays (item indexes ``counts``) and,
        for continuous bases, a float64 ``(len(item), width)`` table of combined
        omegas (``code`` then indexes its rows).
        """
        return self.kind.sample(self, rng, np.asarray(counts, dtype=np.int64))

    def conjugate(self, code: np.ndarray, power: np.ndarray):
        """Codes and powers of the complex-conjugate factors (integer bases)."""
        return self.kind.conjugate(self, code, power)

    def values(self, xp: np.ndarray, gi: np.ndarray, codes: np.ndarray, out=None, where=None, device="cpu"):
        """Complex values of factors (power 1) on prepared rows.

        ``xp`` is the prepared group, float64 ``(m, G, width)``; ``gi`` int64 ``(a,)``
        the node of each factor within the group, ``codes`` its code (continuous
        bases: the ``(a, width)`` omega rows).  Returns float64 ``(m, a)`` real and
        imaginary parts (imaginary ``None`` for real factors).  ``out``, if given, is a
        pair of float64 ``(m, a)`` arrays (strided views allowed) that receive the real
        and imaginary parts (zeros for real factors) and is returned; continuous bases
        compute straight into it.

        ``where`` = ``(row0, source, node labels of the group)`` names the place in the
        :class:`DataError` raised when a continuous factor's angle
        ``scale * <omega, x>`` is beyond the floats (default: rows from 0 of
        ``<array>``, nodes by number).

        ``device`` (``cpu`` or ``cuda``, resolved: :func:`rfsgen._cuda.resolve`): where the
        continuous bases' angles and their cos and sin are computed (the same bits).
        """
        if self.kind.continuous:
            return self.kind.values(self, xp, gi, codes, out=out, where=where, device=device)
        re, im = self.kind.values(self, xp, gi, codes)
        if out is None:
            return re, im
        out[0][...] = re
        out[1][...] = 0.0 if im is None else im
        return out

    def linear(self, gi: np.ndarray, codes: np.ndarray):
        """For bases whose factors are linear in the prepared values (sphere), how
        to read them: int64 ``ir, ii`` and float64 ``cr, ci``, each ``(a,)``, with
        factor ``k = cr[k] x[ir[k]] + 1j ci[k] x[ii[k]]`` on a row ``x`` of the group
        flattened to ``G * width`` values (``ii[k] = -1``: real).  ``None`` otherwise.
        """
        rule = self.kind.linear
        return None if rule is None else rule(self, np.asarray(gi, dtype=np.int64), np.asarray(codes, dtype=np.int64))


@dataclass(frozen=True)
class BaseKind:
    """A registry entry: everything about one base space."""

    name: str
    doc: str
    params: Mapping[str, tuple]  # key -> (default or REQUIRED, validator)
    fixed_width: int | None  # 1 for scalar bases, None for vector bases
    continuous: bool
    prepare: Callable
    gram: Callable
    sample: Callable
    conjugate: Callable
    values: Callable
    linear: Callable | None = None
    modulus: Callable = lambda base: 0
    uniform_codes: Callable = lambda base: 0
    norm_bound: Callable = lambda base: 1.0
    min_width: int = 1
    #: whether each node's prepared values are a unit vector (sphere): the factors a column
    #: takes from one node are then bounded together (rfsgen.paths' overflow check)
    unit_rows: bool = False
    #: prepare_columns(base, x, cols, G, nodes, row0, source): the preparation of rows' columns
    #: ``cols`` (int64, flat) done as they are gathered (:meth:`Base.prepare_columns`), or None
    prepare_columns: Callable | None = None
    #: why a node of this base has no compositional features or exact kernel (the walked schemes,
    #: ``rfsgen kernel`` without ``--eof``): a message with its fix, or None where it has them
    walk_problem: Callable = lambda base: None


# ---------------------------------------------------------------------- validation
def _prepare_binary(base, x, nodes, row0, source):
    bad = (x != 1.0) & (x != -1.0)
    if bad.any():
        r, g, _ = np.argwhere(bad)[0]
        raise DataError(
            f"{source}: row {row0 + int(r)}, node '{nodes[int(g)]}': value {x[r, g, 0]:g} is not -1 or +1; "
            "binary inputs must be coded as -1/+1"
        )
    return x


def _prepare_circle(base, x, nodes, row0, source):
    scale = base.param("scale")
    with np.errstate(over="ignore"):
        t = x * scale
    bad = ~np.isfinite(t)
    if bad.any():  # the angle scale * v itself is beyond the floats: no finite feature exists
        r, g, _ = np.argwhere(bad)[0]
        raise DataError(
            f"{source}: row {row0 + int(r)}, node '{nodes[int(g)]}': the angle scale * value = {scale:g} * "
            f"{x[r, g, 0]:g} overflows; rescale that column or lower the node's 'scale'"
        )
    return t


def _prepare_categorical(base, x, nodes, row0, source):
    n = base.param("categories")
    bad = (x != np.floor(x)) | (x < 0) | (x >= n)
    if bad.any():
        r, g, _ = np.argwhere(bad)[0]
        raise DataError(
            f"{source}: row {row0 + int(r)}, node '{nodes[int(g)]}': value {x[r, g, 0]:g} is not an "
            f"integer category in 0..{n - 1}; recode the column or raise 'categories'"
        )
    return x


def _prepare_vector(base, x, nodes, row0, source):
    block = dict(base.params).get("normalize_blocks", 0)
    if not block:
        return x
    # Normalise each consecutive block of ``block`` columns (the RR rewrite of an exp
    # node over sphere inputs: its window is the concatenation of unit vectors).
    from ._compiled import normalize

    m, g, w = x.shape
    xb = np.ascontiguousarray(x).reshape(m, g * (w // block), block)
    norms = np.empty(xb.shape[:2])
    normalize(xb, norms)  # the same compiled, fixed-order loop as sphere nodes
    if (norms == 0).any():
        r, k = np.argwhere(norms == 0)[0]
        raise DataError(
            f"{source}: row {row0 + int(r)}, node '{nodes[int(k) // (w // block)]}': {article(block)} {block}-value block is all "
            "zeros and cannot be normalized; remove or perturb such rows"
        )
    return xb.reshape(m, g, w)


def _prepare_sphere(base, x, nodes, row0, source):
    from ._compiled import normalize

    x = np.ascontiguousarray(x)
    norms = np.empty(x.shape[:-1])
    normalize(x, norms)  # in place; a row's values never depend on the rest of its chunk
    return _sphere_zeros(base, x, norms, nodes, row0, source)


def _prepare_sphere_columns(base, x, cols, g, nodes, row0, source):
    from ._compiled import gather_normalize

    m = x.shape[0]
    out = np.empty((m, g, base.width))
    norms = np.empty((m, g))
    if m:
        gather_normalize(x, cols, out, norms)  # what gather_columns then normalize give, in one pass
    return _sphere_zeros(base, out, norms, nodes, row0, source)


def _sphere_zeros(base, x, norms, nodes, row0, source):
    """The normalised vectors ``x`` (float64 ``(m, G, width)``) with their zero vectors
    (``norms`` 0) refused or mapped to the uniform unit vector, as the node says."""
    zero = norms == 0
    if zero.any():
        if base.param("zero") == "error":
            r, g = np.argwhere(zero)[0]
            raise DataError(
                f"{source}: row {row0 + int(r)}, node '{nodes[int(g)]}': the vector is all zeros and "
                "cannot be normalized; add 'zero: uniform' to the node to map it to (1,...,1)/sqrt(d)"
            )
        x[zero] = 1.0 / math.sqrt(base.width)
    return x


# ---------------------------------------------------------------------- exact kernels
# gram(base, xp, yp) -> (rho, delta, eps), float64 (G, m, n) each: the base kernel,
# delta = 1 - rho and eps = 1 + rho, computed without cancellation (see rfsgen.kernel).
#: Pairs whose gap from 1 falls below this get their gap recomputed from differences.
NEAR = 1e-4


def _gram_product(base, xp, yp):
    rho = np.einsum("mgc,ngc->gmn", xp, yp, optimize=True)
    return rho, 1.0 - rho, 1.0 + rho


def _gram_sphere(base, xp, yp):
    # Prepared rows are unit vectors: 1 - <x, y> = |x - y|^2 / 2 and 1 + <x, y> = |x + y|^2 / 2,
    # exact from differences and sums (0 for equal or opposite rows), recomputed where
    # 1 -+ rho would cancel.
    rho, delta, eps = _gram_product(base, xp, yp)
    for gap, sign in ((delta, -1.0), (eps, 1.0)):
        g, i, j = np.nonzero(gap < NEAR)
        if g.size:
            d = xp[i, g] + sign * yp[j, g]
            gap[g, i, j] = 0.5 * np.sum(d * d, axis=-1)
    return np.clip(rho, -1.0, 1.0, out=rho), np.clip(delta, 0.0, 2.0, out=delta), np.clip(eps, 0.0, 2.0, out=eps)


def _gram_circle(base, xp, yp):
    c = np.cos(xp[..., 0]).T
    s = np.sin(xp[..., 0]).T
    c2 = np.cos(yp[..., 0]).T
    s2 = np.sin(yp[..., 0]).T
    rho = c[:, :, None] * c2[:, None, :] + s[:, :, None] * s2[:, None, :]
    d = 0.5 * (xp[..., 0].T[:, :, None] - yp[..., 0].T[:, None, :])
    half, co = np.sin(d), np.cos(d)
    return rho, 2.0 * half * half, 2.0 * co * co  # 1 -+ cos(t - t') = 2 sin^2, 2 cos^2 of the half angle


def _gram_categorical(base, xp, yp):
    rho = (xp[..., 0].T[:, :, None] == yp[..., 0].T[:, None, :]).astype(np.float64)
    return rho, 1.0 - rho, 1.0 + rho


def _pow2_scale(xp, yp):
    """Per node, the power of two at or above the largest magnitude in xp and yp: (G,) float64.

    At most 2^1023 (the largest finite power of two): values up to the largest float
    then scale into [0, 2)."""
    mx = np.maximum(np.abs(xp).max(axis=(0, 2), initial=0.0), np.abs(yp).max(axis=(0, 2), initial=0.0))
    return np.ldexp(1.0, np.minimum(np.frexp(np.where(mx > 0, mx, 1.0))[1], 1023))


def _gram_gaussian(base, xp, yp):
    # Squared distances of rows scaled by a power of two (so 1e300 neither overflows nor
    # loses the difference), by the expansion |x|^2 + |y|^2 - 2<x, y> where that is
    # accurate and from the differences where it would cancel (near and equal rows).
    s = base.param("scale")
    f = _pow2_scale(xp, yp)
    xs, ys = xp / f[None, :, None], yp / f[None, :, None]
    xx = np.einsum("mgc,mgc->gm", xs, xs)
    yy = np.einsum("ngc,ngc->gn", ys, ys)
    d2 = np.maximum(xx[:, :, None] + yy[:, None, :] - 2 * np.einsum("mgc,ngc->gmn", xs, ys, optimize=True), 0.0)
    g, i, j = np.nonzero(d2 <= 1e-6 * (xx[:, :, None] + yy[:, None, :]))
    if g.size:
        d = xs[i, g] - ys[j, g]
        d2[g, i, j] = np.sum(d * d, axis=-1)
    with np.errstate(over="ignore"):
        t = np.sqrt(d2) * f[:, None, None] * s  # scale * |x - y|, inf when it overflows
        g, i, j = np.nonzero(np.isinf(t))
        if g.size:  # |x - y| beyond the floats but scale * |x - y| perhaps not: scale first
            t[g, i, j] = np.sqrt(d2[g, i, j]) * s * f[g]
        e = -0.5 * t * t
    rho = np.exp(e)
    return rho, -np.expm1(e), 1.0 + rho


def _gram_laplace(base, xp, yp):
    s = base.param("scale")
    out = np.empty((xp.shape[1], xp.shape[0], yp.shape[0]))
    with np.errstate(over="ignore"):  # a distance beyond the floats is inf, handled below
        for c in range(xp.shape[2]):  # loop over columns of a node, vectorised over rows and nodes
            d = np.abs(xp[:, None, :, c] - yp[None, :, :, c]).transpose(2, 0, 1)
            if c == 0:
                out[...] = d
            else:
                out += d
        e = -s * out
        g, i, j = np.nonzero(np.isinf(out))
        if g.size:  # |x - y|_1 beyond the floats but scale * |x - y|_1 perhaps not: scale first,
            f = _pow2_scale(xp, yp)[g]  # from rows scaled by a power of two
            d = np.abs(xp[i, g] / f[:, None] - yp[j, g] / f[:, None]).sum(axis=-1)
            e[g, i, j] = -(d * s) * f
    rho = np.exp(e)
    return rho, -np.expm1(e), 1.0 + rho


# ---------------------------------------------------------------------- samplers
def _items(counts):
    return np.flatnonzero(counts > 0)


def _sample_binary(base, rng, counts):
    item = np.flatnonzero(counts % 2 == 1)
    z = np.zeros(item.size, dtype=np.int64)
    return item, z, z + 1, None


def _sample_circle(base, rng, counts):
    item = _items(counts)
    c = counts[item]
    power = 2 * rng.binomial(c, 0.5) - c
    keep = power != 0
    return item[keep], np.zeros(keep.sum(), np.int64), power[keep].astype(np.int64), None


def _sample_categorical(base, rng, counts):
    # The sum of c >= 1 iid uniform frequencies mod n is itself uniform.
    item = _items(counts)
    power = rng.integers(0, base.param("categories"), item.size)
    keep = power != 0
    return item[keep], np.zeros(keep.sum(), np.int64), power[keep].astype(np.int64), None


def _sample_codes(rng, counts, ncodes):
    """Multiset of ``counts[t]`` uniform codes in [0, ncodes) per item, as (item, code, power)."""
    item = _items(counts)
    c = counts[item]
    big = c > 4 * ncodes
    parts_item, parts_code, parts_pow = [], [], []
    small = item[~big]
    if small.size:
        rep = np.repeat(small, counts[small])
        codes = rng.integers(0, ncodes, rep.size)
        key = rep * ncodes + codes
        uniq, mult = np.unique(key, return_counts=True)
        parts_item.append(uniq // ncodes)
        parts_code.append(uniq % ncodes)
        parts_pow.append(mult.astype(np.int64))
    if big.any():
        bi = item[big]
        mult = rng.multinomial(counts[bi], np.full(ncodes, 1.0 / ncodes))
        t, code = np.nonzero(mult)
        parts_item.append(bi[t])
        parts_code.append(code.astype(np.int64))
        parts_pow.append(mult[t, code].astype(np.int64))
    if not parts_item:
        e = np.zeros(0, np.int64)
        return e, e, e, None
    if len(parts_item) == 1 and small.size:  # np.unique's keys come sorted by (item, code)
        return parts_item[0], parts_code[0], parts_pow[0], None
    it = np.concatenate(parts_item)
    co = np.concatenate(parts_code)
    pw = np.concatenate(parts_pow)
    order = np.lexsort((co, it))
    return it[order], co[order], pw[order], None


def _sphere_codes(base):
    return 2 * base.width if base.param("scheme") == "pair" else base.width


def _sample_sphere(base, rng, counts):
    return _sample_codes(rng, counts, _sphere_codes(base))


def _sample_gaussian(base, rng, counts):
    item = _items(counts)
    omega = rng.standard_normal((item.size, base.width))
    if np.any(counts[item] != 1):
        omega *= np.sqrt(counts[item])[:, None]
    return item, np.arange(item.size, dtype=np.int64), np.ones(item.size, np.int64), omega


def _sample_gaussian_any(base, rng, counts):
    if not base.param("orthogonal"):
        return _sample_gaussian(base, rng, counts)
    # Orthogonal random features (Yu et al. 2016): rows of stacked random orthogonal
    # d x d blocks, each row rescaled by an independent chi(d) norm, so every row is
    # marginally N(0, I) (unbiased) while rows within a block are orthogonal.
    item = _items(counts)
    d = base.width
    n = item.size
    blocks = -(-n // d) if n else 0
    from ._compiled import orthonormal_rows

    rows = []
    for b in range(blocks):  # one orthogonal block per d draws of this node
        # The Q of a QR of a Gaussian block (made unique by a positive R diagonal):
        # the Gram-Schmidt of its columns, only as many as this block needs, in a
        # fixed-order compiled loop (LAPACK's blocked QR rounds differently per CPU).
        q = np.ascontiguousarray(rng.standard_normal((d, d)).T[:min(d, n - b * d)])
        orthonormal_rows(q)
        rows.append(q * np.sqrt(rng.chisquare(d, d))[:q.shape[0], None])
    omega = np.concatenate(rows)[:n] if rows else np.zeros((0, d))
    omega = omega * np.sqrt(counts[item])[:, None]
    return item, np.arange(n, dtype=np.int64), np.ones(n, np.int64), omega


def _sample_laplace(base, rng, counts):
    # The sum of c iid standard Cauchy variables is c times a standard Cauchy.
    item = _items(counts)
    omega = rng.standard_cauchy((item.size, base.width)) * counts[item][:, None].astype(np.float64)
    return item, np.arange(item.size, dtype=np.int64), np.ones(item.size, np.int64), omega


# ---------------------------------------------------------------------- conjugation
def _conj_identity(base, code, power):
    return code, power


def _conj_negate(base, code, power):
    return code, -power


def _conj_categorical(base, code, power):
    return code, (-power) % base.param("categories")


def _conj_sphere(base, code, power):
    if base.param("scheme") == "pair":
        return code ^ 1, power
    return code, power


# ---------------------------------------------------------------------- transform values
# values(base, xp, gi, codes): xp is the prepared group, float64 (m, G, width); gi (a,)
# the node of each atom within the group and codes (a,) its code (continuous bases:
# the (a, width) omega rows).  Returns the factors' real and imaginary parts, float64
# (m, a) each, row-major (imaginary None for real-valued factors).
#
# linear(base, gi, codes), for bases whose factors are linear in the prepared values:
# (ir, cr, ii, ci) such that factor k is cr[k] x[ir[k]] + i ci[k] x[ii[k]] on a row x of
# the group flattened to G * width values (ii[k] = -1: real).  The transform then
# reads the prepared rows directly and never materialises the factor values.
def _values_binary(base, xp, gi, codes):
    return xp[:, gi, 0], None


def _cis(theta):
    from ._compiled import cis

    theta = np.ascontiguousarray(theta, dtype=np.float64)
    re, im = np.empty_like(theta), np.empty_like(theta)
    cis(theta, re, im)
    return re, im


def _values_circle(base, xp, gi, codes):
    return _cis(xp[:, gi, 0])


def _values_categorical(base, xp, gi, codes):
    return _cis(xp[:, gi, 0] * (2 * math.pi / base.param("categories")))


def _linear_sphere(base, gi, codes):
    d = base.width
    if base.param("scheme") == "pair":
        j = codes // 2
        c = math.sqrt(d / 2)
        return gi * d + j, np.full(gi.size, c), gi * d + (j + 1) % d, np.where(codes % 2 == 1, -c, c)
    return gi * d + codes, np.full(gi.size, math.sqrt(d)), np.full(gi.size, -1), np.zeros(gi.size)


def _values_linear(base, xp, gi, codes):
    ir, cr, ii, ci = base.kind.linear(base, gi, codes)
    flat = xp.reshape(xp.shape[0], -1)
    return cr * flat[:, ir], (ci * flat[:, ii] if (ii >= 0).any() else None)


#: Below this bound on |theta| (and with every prepared value within float32) no
#: partial float32 sum of an angle can overflow: w terms, each fma rounding by at most
#: 2^-24, stay under the largest float32, F32_MAX (about 3.4e38).
SAFE_ANGLE = 1e37
F32_MAX = float(np.finfo(np.float32).max)


def _angles_fit(top, l1):
    """Whether the rows whose largest |value| is ``top`` (float64, an array or a number)
    keep every partial float32 sum of their angles finite: ``top * l1`` (``l1`` the
    plan's largest L1 norm of a frequency row) under :data:`SAFE_ANGLE`, and every value
    within float32.  Elementwise, NaN and overflow read as False."""
    with np.errstate(over="ignore", invalid="ignore"):
        return (top * l1 < SAFE_ANGLE) & (top <= F32_MAX)


def _values_continuous(base, xp, gi, omega, out=None, where=None, device="cpu"):
    # A fixed-order compiled sum of float32 fused multiply-adds (output definition 3,
    # rfsgen._sincos32), not a BLAS product: BLAS rounds differently with the number of
    # rows and with the CPU's kernel, and the bytes must not.
    xp = np.ascontiguousarray(xp, dtype=np.float64)
    omega = _float64_frequencies(omega)
    scale = base.param("scale")
    plan = _phase_plan(gi, omega, scale)
    re, im = phases_of(xp, gi, None, out=out, plan=plan, device=device)
    if xp.shape[0] and gi.size:
        # |theta| <= max|x| * max_k |om_k|_1 bounds every partial sum: when that is
        # small and every value fits float32 (always, for ordinary rows) no angle
        # overflowed.  Otherwise the rows over the bound whose values came out NaN (an
        # angle that overflowed float32: cos of a finite angle is never NaN) are
        # recomputed in float64 with scaling; the other values keep their bits.
        with np.errstate(over="ignore", invalid="ignore"):
            row_max = np.maximum(xp.max(axis=(1, 2)), -xp.min(axis=(1, 2)))  # max |x|, without an |x| copy
        over = np.flatnonzero(~_angles_fit(row_max, plan.l1))
        if over.size:
            _careful_angles(xp, gi, omega, scale, re, im, over, where)
    return re, im


def gpu_phases_job(base, xp, gi, omega):
    """What the GPU needs to put a continuous group's cos and sin straight into the chunk's
    source values on the device (:func:`rfsgen._cuda.columns_resident`): ``(x2, width, plan)``,
    the float32 rows and the phase plan :func:`phases_of` would use, or None where the
    host's path must run (atoms not in node order, which :func:`phases_of` scatters; an
    infinite frequency, or rows whose angles could overflow float32: the scaled redo of
    :func:`_values_continuous`)."""
    xp = np.ascontiguousarray(xp, dtype=np.float64)
    omega = _float64_frequencies(omega)
    plan = _phase_plan(gi, omega, base.param("scale"))
    m = xp.shape[0]
    if not plan.in_order or not (m and gi.size):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        row_max = np.maximum(xp.max(axis=(1, 2)), -xp.min(axis=(1, 2)))
        if not _angles_fit(row_max, plan.l1).all():
            return None
        x2 = np.ascontiguousarray(xp, dtype=np.float32).reshape(m, -1)
    return x2, xp.shape[2], plan


def fused_values(base, xp, gi, omega, col, sc, imag, out, second=None) -> bool:
    """Output columns of one factor each, straight from the angles: atom k (nodes ``gi``,
    frequencies ``omega``, on the prepared group ``xp`` ``(m, G, width)``) is output column
    ``col[k]``, ``out[:, col[k]] = sc[k] * (sin if imag[k] else cos)`` of its angle in
    ``out``'s dtype (:func:`rfsgen._sincos32.phases_out`): the bits of
    :func:`_values_continuous` followed by the product loop for such columns.
    :func:`fused_gathered` over the prepared values in their order; False, with nothing
    written, where it declines."""
    m = xp.shape[0]
    flat = np.ascontiguousarray(xp, dtype=np.float64).reshape(m, -1)
    cols = np.arange(flat.shape[1], dtype=np.int64)
    return fused_gathered(base, flat, cols, gi, omega, col, sc, imag, out, second, ucols=cols)


#: Rows of a chunk whose zeros decide whether a single node's angles are summed over the
#: nonzero values only (the CSR rows' loop): a choice of speed, the bits are the same.
SPARSE_SAMPLE = 64


def fused_gathered(base, x, cols, gi, omega, col, sc, imag, out, second=None, ucols=None, buf=None) -> bool:
    """:func:`fused_values`' columns from checked rows ``x`` (float32 or float64 ``(m, width)``, C
    order, finite) of a group whose preparation leaves the values alone, the group's
    values ``x[:, cols]`` (int64 ``(G * width,)``; ``ucols``, if given, their distinct
    values) gathered straight into float32 with each row's largest magnitude, in one pass
    on every thread (:func:`rfsgen._compiled.gather_columns32`), where the float64 gather,
    its float32 copy, the chunk's maximum and minimum and its count of nonzeros took five
    passes, four on one thread.  The same values, so the same bits.  ``buf``, if given, a
    float32 array of at least ``m * cols.size`` values to gather into.  Whether a single
    node's rows are mostly zeros (then False: the CSR rows' loop) is judged on the first
    :data:`SPARSE_SAMPLE` rows."""
    from ._compiled import gather_columns32
    from ._sincos32 import SPARSE_RATIO, phases_out

    m, a = x.shape[0], gi.size
    if not (m and a) or col.size != a or sc.size != a or imag.size != a:
        return False
    plan = _phase_plan(gi, _float64_frequencies(omega), base.param("scale"))
    if not plan.in_order or not np.isfinite(plan.l1):
        return False
    n = m * cols.size
    x2 = (buf[:n] if buf is not None else np.empty(n, np.float32)).reshape(m, cols.size)
    top = np.empty(m)
    gather_columns32(x, cols, np.unique(cols) if ucols is None else ucols, x2, top)
    if not _angles_fit(top, plan.l1).all():
        return False
    w = base.width
    head = x2[:SPARSE_SAMPLE]
    if cols.size == w and np.count_nonzero(head) * SPARSE_RATIO < head.size:
        return False
    phases_out(x2, w, plan.starts, plan.ends, plan.nodes, plan.tile0, plan.pan, col, sc, imag, out, *(second or ()))
    return True


def gathered_phases(base, x, cols, gi, omega, out, where=None, buf=None, ucols=None):
    """:func:`_values_continuous` of a group whose preparation leaves the values alone
    (gaussian and laplace nodes without ``normalize_blocks``) on checked rows ``x``
    (float32 or float64 ``(m, width)``, C order, finite), the group's values being
    ``x[:, cols]`` (int64 ``(G * base.width,)``): gathered straight into the float32 rows
    that the angle loop reads, each value rounded once as the float64 gather's float32 copy
    rounds it, so the same bits, without the float64 gather and its copy.  ``out = (re,
    im)`` float64 ``(m, a)`` (strided views allowed); ``buf``, if given, a float32 array of
    at least ``m * cols.size`` values to gather into; ``ucols``, if given, ``np.unique(cols)``."""
    from ._compiled import gather_columns32

    omega = _float64_frequencies(omega)
    scale = base.param("scale")
    plan = _phase_plan(gi, omega, scale)
    m, a = x.shape[0], plan.order.size
    if not (m and a):
        return _phases32(None, m, base.width, plan, out)
    n = m * cols.size
    x2 = (buf[:n] if buf is not None else np.empty(n, np.float32)).reshape(m, cols.size)
    row_max = np.empty(m)
    gather_columns32(x, cols, np.unique(cols) if ucols is None else ucols, x2, row_max)
    re, im = _phases32(x2, m, base.width, plan, out)
    over = np.flatnonzero(~_angles_fit(row_max, plan.l1))
    if over.size:
        xp = x[:, cols].astype(np.float64).reshape(m, -1, base.width)  # the float64 gather (rare rows)
        _careful_angles(xp, gi, omega, scale, re, im, over, where)
    return re, im


def gathered_columns(base, x, cols, gi, omega, static, out, ucols=None, buf=None) -> bool:
    """Output columns of a transformer whose atoms are one such group's, in node order
    (:func:`rfsgen._sincos32.phase_columns`): :func:`gathered_phases` and the product loop
    in one pass, each patch's values read where they sit in the row, the same bits.  ``x``
    checked rows (float32 or float64 ``(m, width)``, C order, finite), ``cols`` and
    ``ucols`` as for :func:`gathered_phases`; ``static`` the product loop's arrays
    ``(xatom, xpow, fidx, fptr, sc, imag, pos, real)`` (:func:`rfsgen._compiled.columns`);
    ``out`` float32 or float64 ``(m, D)`` C order; ``buf``, if given, a float32 array of at
    least ``m * width`` values for float64 rows rounded to float32.  False, with ``out``
    not written, where the rows need :func:`gathered_phases`' other paths: atoms not in
    node order, an infinite frequency, a row whose angles could overflow float32 (the
    scaled float64 redo), rows mostly zeros (the CSR rows' loop)."""
    from ._compiled import row_peaks
    from ._sincos32 import SPARSE_RATIO, phase_columns

    omega = _float64_frequencies(omega)
    plan = _phase_plan(gi, omega, base.param("scale"))
    m, a = x.shape[0], plan.order.size
    if not (m and a) or not plan.in_order or not np.isfinite(plan.l1):
        return False
    row_max = np.empty(m)
    row_peaks(x, np.unique(cols) if ucols is None else ucols, row_max)
    if not _angles_fit(row_max, plan.l1).all():
        return False
    w = base.width
    if cols.size == w and np.count_nonzero(x[:, cols]) * SPARSE_RATIO < m * w:
        return False
    if x.dtype != np.float32:  # rounded once, as the float64 gather's float32 copy rounds them
        x32 = (buf[:x.size] if buf is not None else np.empty(x.size, np.float32)).reshape(x.shape)
        with np.errstate(over="ignore"):  # (columns of other groups: never read)
            np.copyto(x32, x, casting="unsafe")
        x = x32
    phase_columns(x, cols, w, plan.starts, plan.ends, plan.nodes, plan.tile0, plan.pan, a, *static, out)
    return True


def csr_phases(base, ptr, pos, vals, gi, omega, out) -> bool:
    """The values of a continuous base's atoms (nodes ``gi``, frequencies ``omega``) on rows
    given in CSR form (:func:`rfsgen._sincos32.phases_csr`: ``ptr``, ``pos`` positions in
    the group's flattened ``(G, width)`` values, sorted and unique within each row,
    ``vals`` float32 or float64), written into ``out = (re, im)``, float64 ``(m, a)`` each:
    the bits of :func:`_values_continuous` on the densified rows (a base whose
    preparation leaves the values alone: no ``normalize_blocks``).  False, with nothing
    written, where only the dense path gives those bits: an infinite frequency (``0 * inf``
    is NaN there), or a value so large that an angle could overflow float32 (such rows
    are recomputed with scaling there)."""
    from ._sincos32 import phases_csr

    omega = _float64_frequencies(omega)
    plan = _phase_plan(gi, omega, base.param("scale"))
    if not np.isfinite(plan.l1):
        return False
    top = float(np.abs(vals).max()) if vals.size else 0.0
    if not _angles_fit(top, plan.l1):
        return False
    m, a = ptr.size - 1, plan.order.size
    re, im = out
    re_s, im_s = (re, im) if plan.in_order else (np.empty((m, a)), np.empty((m, a)))
    if m and a:
        phases_csr(ptr, pos, vals.astype(np.float32), base.width, *_csr_tiles(plan, base.width), re_s, im_s)
    if not plan.in_order:
        re[:, plan.order], im[:, plan.order] = re_s, im_s
    return True


def _csr_tiles(plan, width):
    """``plan.csr``, the frequencies tile-major for rows read as CSR
    (:func:`rfsgen._sincos32.pack_csr_tiles`), made once per plan on first use."""
    if plan.csr is None:
        from . import budget
        from ._sincos32 import pack_csr_tiles

        a = plan.order.size
        budget.check(4.0 * width * (a + 64 * plan.starts.size),
                     f"the CSR-ordered frequencies of {a} atoms of width {width}",
                     "sample fewer features (-n), split the columns into several feature files, or pass "
                     "dense rows")
        plan.csr = pack_csr_tiles(plan.pan, plan.loc, plan.starts, plan.ends, plan.nodes)
    return plan.csr


@dataclass
class _PhasePlan:
    """What :func:`phases_of` needs besides the rows, built once per (atoms, frequencies)."""
    order: np.ndarray  # int64 (a,): atoms sorted by node (stable)
    in_order: bool  # order is the identity
    starts: np.ndarray  # int64: blocks of atoms (of one node each), in sorted order
    ends: np.ndarray
    nodes: np.ndarray
    tile0: np.ndarray  # tiles and float32 scaled frequencies, packed tile by tile (rfsgen._sincos32.pack_panels)
    pan: np.ndarray
    loc: np.ndarray  # where each sorted atom's frequencies sit in pan
    l1: float  # the largest L1 norm of a float32 scaled frequency row (inf when one is inf)
    csr: tuple | None = None  # the frequencies tile-major for CSR rows (rfsgen._sincos32.pack_csr_tiles), on first use
    gpu: object = None  # device == "cuda": the frequencies on the GPU and its buffers (rfsgen._cuda), on first use


_PLANS: dict = {}  # (id(owner), where omega sits in it, scale) -> (weakref(owner), gi, plan)


def _float64_frequencies(omega) -> np.ndarray:
    """``omega`` as float64, its layout kept: a strided view of a feature set's frequencies
    (the atoms of ``--scheme orf``'s pairs, every other row) stays a view, for which
    :func:`_phase_plan` finds its cached plan on every chunk (a copy per chunk would pack
    the plan anew each time); :func:`_build_plan` makes its own packed copy."""
    return omega if omega.dtype == np.float64 else omega.astype(np.float64)


def _phase_plan(gi, omega, scale=None):
    """The :class:`_PhasePlan` of atoms on nodes ``gi`` with frequencies ``omega`` (a, w)
    times ``scale``; cached while the array that owns ``omega``'s memory lives, for the
    same place in it and the same ``gi`` values (the transform passes the same ones for
    every chunk, and a feature set's own frequencies as a view on every transform:
    packing them costs about as much as a chunk of a few rows).  Frequencies are not
    expected to change in place (a feature set's never do); the plan lives as long as
    their owner, at most 16 plans."""
    import weakref

    owner = omega if omega.base is None else omega.base
    gi = np.asarray(gi, dtype=np.int64)
    key = (id(owner), omega.__array_interface__["data"][0], omega.shape, omega.strides, omega.dtype.str, scale)
    hit = _PLANS.get(key)
    if hit is not None and hit[0]() is owner and np.array_equal(hit[1], gi):
        return hit[2]
    plan = _build_plan(gi, omega, scale)
    try:
        ref = weakref.ref(owner, lambda _, k=key: _PLANS.pop(k, None))
    except TypeError:  # not weak-referenceable: no caching
        return plan
    if len(_PLANS) >= 16:
        _PLANS.pop(next(iter(_PLANS)))
    _PLANS[key] = (ref, gi.copy(), plan)
    return plan


def _build_plan(gi, omega, scale):
    from . import budget
    from ._sincos32 import TILE, atom_block, pack_panels, tile_count

    omega = np.ascontiguousarray(omega, dtype=np.float64)
    a, w = omega.shape
    in_order = bool(np.all(gi[1:] >= gi[:-1]))  # atoms come sorted by node from the transform
    order = np.arange(a) if in_order else np.argsort(gi, kind="stable")
    sg = gi[order]
    step = atom_block(w)
    starts = []
    for lo, hi in zip(*_runs(sg)):
        starts.extend(range(lo, hi, step))
    starts = np.array(starts, dtype=np.int64)
    ends = np.minimum(starts + step, np.searchsorted(sg, sg[starts], side="right")).astype(np.int64)
    # the float32 scaled copy, packed in tiles of TILE atoms (a block's last one padded),
    # next to the frequencies
    budget.check(4.0 * w * TILE * tile_count(starts, ends),
                 f"the packed frequencies of {a} atoms of width {w}",
                 "sample fewer features (-n) or split the columns into several feature files")
    tile0, pan, loc, l1 = pack_panels(omega, order.astype(np.int64), 1.0 if scale is None else scale, starts, ends)
    return _PhasePlan(order, in_order, starts, ends, sg[starts], tile0, pan, loc, l1)


def _careful_angles(xp, gi, omega, scale, re, im, rows, where):
    """Recompute the NaN values of ``rows`` with each (row, node) vector scaled by a power
    of two and ``scale`` split into mantissa and exponent, so that only an angle that
    is itself beyond the floats overflows; such an angle is a :class:`DataError`."""
    row0, source, labels = where if where is not None else (0, "<array>", None)
    sm, se = math.frexp(scale)
    for r in rows:
        bad = np.flatnonzero(np.isnan(re[r]) | np.isnan(im[r]))
        if not bad.size:
            continue
        v = xp[r, gi[bad]]  # (b, w): each bad atom's node vector
        mx = np.abs(v).max(axis=1)
        ex = np.frexp(np.where(mx > 0, mx, 1.0))[1]
        vs = np.ldexp(v, -ex[:, None])  # exact: |vs| < 1
        acc = np.zeros(bad.size)
        for c in range(v.shape[1]):  # the compiled loop's order
            acc = acc + vs[:, c] * omega[bad, c]
        with np.errstate(over="ignore"):
            theta = np.ldexp(acc * sm, ex + se)
        inf = np.flatnonzero(~np.isfinite(theta))
        if inf.size:
            k = int(inf[0])
            g = int(gi[bad[k]])
            node = f"node '{labels[g]}'" if labels is not None else f"node {g} of the group"
            raise DataError(
                f"{source}: row {row0 + int(r)}, {node}: a feature's angle scale * <omega, x> overflows (the row's "
                f"largest value there is {mx[k]:g}, scale {scale:g}); rescale the row's columns or lower the "
                "node's 'scale'"
            )
        c, s = _cis(theta[None, :])
        re[r, bad] = c[0]
        im[r, bad] = s[0]


def phases_of(xp, gi, om, out=None, plan=None, sparse=None, device="cpu"):
    """cos and sin of ``theta[r, k] = sum_c xp[r, gi[k], c] * om[k, c]`` as float32 fused
    multiply-adds in a fixed order, ``xp`` and ``om`` rounded once to float32 (see
    :mod:`rfsgen._sincos32`): float64 ``(m, a)`` each, written into ``out``
    (a pair of ``(m, a)`` float64 arrays, strided views allowed) if given.  ``plan``
    (from :func:`_phase_plan`) replaces ``om``; ``sparse`` forces the sums over nonzero
    values only (True) or over every value (False), the same bits either way.  ``device``
    ``cuda``: the angles and their cos and sin on the GPU (:func:`rfsgen._cuda.phases`), the
    same bits."""
    if plan is None:
        plan = _build_plan(np.asarray(gi, dtype=np.int64), np.ascontiguousarray(om, dtype=np.float64), None)
    m, a = xp.shape[0], plan.order.size
    x2 = None
    if m and a:
        with np.errstate(over="ignore"):  # a value beyond float32 gives inf: such rows are redone (above)
            x2 = np.ascontiguousarray(xp, dtype=np.float32).reshape(m, -1)
    return _phases32(x2, m, xp.shape[2], plan, out, sparse, device)


def _phases32(x2, m, width, plan, out=None, sparse=None, device="cpu"):
    """:func:`phases_of` on rows already rounded to float32: ``x2`` float32 ``(m, G * width)``
    C order (None when there are no rows or atoms)."""
    from ._sincos32 import phases

    a = plan.order.size
    re, im = out if out is not None else (np.empty((m, a)), np.empty((m, a)))
    # In node order (as the transform builds its atoms) the values go straight into the
    # result; otherwise into node-ordered temporaries, scattered back below.
    re_s, im_s = (re, im) if plan.in_order else (np.empty((m, a)), np.empty((m, a)))
    if m and a:
        if device == "cuda":
            from . import _cuda

            _cuda.phases(x2, width, plan, re_s, im_s)
        else:
            phases(x2, width, plan.starts, plan.ends, plan.nodes, plan.tile0, plan.pan,
                   re_s, im_s, finite=bool(np.isfinite(plan.l1)), sparse=sparse,
                   csr=lambda: _csr_tiles(plan, width))
    if not plan.in_order:
        re[:, plan.order], im[:, plan.order] = re_s, im_s
    return re, im


def _runs(sorted_values):
    """(starts, ends) of the runs of equal values in a sorted int array."""
    if not sorted_values.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cut = np.flatnonzero(np.diff(sorted_values)) + 1
    return np.concatenate(([0], cut)), np.concatenate((cut, [sorted_values.size]))


# ---------------------------------------------------------------------- brownian
# k(x, x') = prod_j k1(u_j, u'_j), k1(u, v) = min(u, v) - u v, with u = (x - lo) / (hi - lo)
# the node's box mapped to the unit cube (DESIGN 9).  Its random features: per column j
# an integer frequency m >= 1 with P(m) = 6 / (pi^2 m^2) (numpy's zipf(2)) and
# psi_m(u) = sin(m pi u) / sqrt(3), so that E psi_m(u) psi_m(v) = sum_m 2 sin(m pi u)
# sin(m pi v) / (pi^2 m^2) = k1(u, v) exactly (the Brownian bridge's Karhunen-Loeve
# expansion).  One draw at a node of width w is w terms, code (m - 1) w + j; c draws
# at one node are the multiset of their c w terms (equal codes add their powers).
#: Largest frequency kept: m is drawn from zipf(2) conditioned on m <= this, so
#: that codes fit int64 (P(m > 2^52) = 6 / (pi^2 2^52), about 1.4e-16: a bias far below
#: any Monte-Carlo error) and m is exact in float64.
BROWNIAN_MAX_M = 1 << 52


def brownian_max_m(width: int) -> int:
    """Largest frequency of a brownian node of ``width`` columns (codes stay below 2^62)."""
    return min(BROWNIAN_MAX_M, (1 << 62) // width)


def box_of(base):
    """The node's box as float64 ``(lo, hi)``, each ``(width,)`` (``domain`` unset: the unit cube)."""
    dom = dict(base.params).get("domain")
    if dom is None:
        return np.zeros(base.width), np.ones(base.width)
    lo, hi = dom
    return (np.broadcast_to(np.asarray(lo, dtype=np.float64), (base.width,)).copy(),
            np.broadcast_to(np.asarray(hi, dtype=np.float64), (base.width,)).copy())


def _prepare_box(base, x, nodes, row0, source):
    lo, hi = box_of(base)
    x -= lo
    x /= hi - lo
    bad = ~((x >= 0.0) & (x <= 1.0))  # NaN included
    if bad.any():
        r, g, c = np.argwhere(bad)[0]
        v = x[r, g, c] * (hi[c] - lo[c]) + lo[c]
        raise DataError(
            f"{source}: row {row0 + int(r)}, node '{nodes[int(g)]}', column {int(c)}: value {v:g} is outside the "
            f"node's domain [{lo[c]:g}, {hi[c]:g}]; widen 'domain:' in the skeleton"
        )
    return x


def _free_brownian_problem(base):
    if boundary_of(base) == "free":
        return ("a brownian node with 'boundary: free' has features only under --scheme eof (and its kernel only as "
                "'rfsgen kernel --eof'); use --scheme eof, or drop 'boundary: free'")
    return None


def _free_brownian_elsewhere(base):
    problem = _free_brownian_problem(base)
    if problem:  # callers name the node first (Skeleton.walk_problem); this guards direct use of the base
        raise UsageError(problem)


def _gram_brownian(base, xp, yp):
    _free_brownian_elsewhere(base)
    rho = None
    for c in range(xp.shape[2]):
        u = xp[:, :, c].T[:, :, None]
        v = yp[:, :, c].T[:, None, :]
        k = np.minimum(u, v) - u * v
        rho = k if rho is None else rho * k
    return rho, 1.0 - rho, 1.0 + rho  # rho <= 1/4: no cancellation


def _sample_brownian(base, rng, counts):
    _free_brownian_elsewhere(base)
    w = base.width
    item = _items(counts)
    rep = np.repeat(item, counts[item] * w)
    col = np.tile(np.arange(w, dtype=np.int64), rep.size // w) if w > 1 else np.zeros(rep.size, np.int64)
    m = rng.zipf(2.0, rep.size).astype(np.int64)
    top = brownian_max_m(w)
    far = np.flatnonzero(m > top)
    while far.size:  # condition on m <= top (redraw the rare far ones)
        m[far] = rng.zipf(2.0, far.size)
        far = far[m[far] > top]
    code = (m - 1) * w + col
    order = np.lexsort((code, rep))
    rep, code = rep[order], code[order]
    if not rep.size:
        e = np.zeros(0, np.int64)
        return e, e, e, None
    new = np.empty(rep.size, dtype=bool)
    new[0] = True
    new[1:] = (rep[1:] != rep[:-1]) | (code[1:] != code[:-1])
    start = np.flatnonzero(new)
    power = np.diff(np.append(start, rep.size)).astype(np.int64)
    return rep[start], code[start], power, None


def _values_brownian(base, xp, gi, codes):
    w = base.width
    codes = np.asarray(codes, dtype=np.int64)
    m = (codes // w + 1).astype(np.float64)
    u = xp[:, gi, codes % w]
    return _cis((m * np.pi) * u)[1] * (1.0 / math.sqrt(3.0)), None  # sin from rfsgen._sincos, as circle


#: ``boundary:`` of a laplace or brownian node: the kernel ``--scheme eof`` builds its features
#: of (rfsgen.eof): ``pinned`` (the default, the seed's: zero on the box's faces) or ``free``.
BOUNDARIES = ("pinned", "free")


def _boundary(v):
    if v not in BOUNDARIES:
        raise ValueError(f"'boundary' must be pinned or free, got {v!r}; write 'boundary: pinned' (the default, "
                         "zero on the box's faces) or 'boundary: free'")
    return v


def boundary_of(base) -> str:
    """The node's ``boundary:`` (``pinned`` when unset)."""
    return dict(base.params).get("boundary", "pinned")


def _domain(v):
    """``domain: [lo, hi]``: lo and hi numbers or per-column lists; stored as a tuple of two
    floats or of two tuples (the width is checked by :func:`make_base`)."""
    msg = f"'domain' must be [lo, hi] with numbers or per-column lists of numbers and lo < hi, got {v!r}"
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        raise ValueError(msg)

    def num(a):
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a):
            raise ValueError(msg)
        return float(a)

    lo, hi = v
    out = _domain_pairs(lo, hi, num, msg)
    problem = box_problem(*(np.atleast_1d(np.asarray(a, dtype=np.float64)) for a in out))
    if problem is not None:
        c, why = problem
        raise ValueError(f"'domain' {'column ' + str(c) + ' ' if isinstance(out[0], tuple) else ''}{why}; "
                         "state a box the rows fill (e.g. standardise the columns first)")
    return out


#: A box must hold at least this many float64 values per column: mapped to [0, 1] its rows
#: keep at least 20 bits of resolution (EOF's cells and the brownian kernel see them).
MIN_BOX_STEPS = 1 << 20


def box_problem(lo, hi):
    """``(column, why)`` for the first column of the box ``[lo, hi]`` (float64 arrays) that
    cannot be mapped to [0, 1] safely -- a bound that is not finite, a width ``hi - lo``
    that is not finite and positive (it overflows float64), or fewer than
    :data:`MIN_BOX_STEPS` float64 values between the bounds (the map loses the rows'
    resolution) -- or None.  Every accepted box has a finite width, so ``(x - lo) / (hi - lo)``
    is finite (or +-inf, clipped or refused) for every finite x, never NaN."""
    with np.errstate(over="ignore", invalid="ignore"):
        width = hi - lo
        steps = width / np.spacing(np.maximum(np.abs(lo), np.abs(hi)))
    for c in range(lo.size):
        if not (np.isfinite(lo[c]) and np.isfinite(hi[c]) and np.isfinite(width[c]) and width[c] > 0):
            return c, (f"[{lo[c]:g}, {hi[c]:g}] has width {width[c]:g}: not a finite positive float64 "
                       "(hi - lo overflows)" if np.isfinite(lo[c]) and np.isfinite(hi[c]) else
                       f"[{lo[c]:g}, {hi[c]:g}] is not finite")
        if not steps[c] >= MIN_BOX_STEPS:
            return c, (f"[{float(lo[c])!r}, {float(hi[c])!r}] holds only {int(steps[c]):,} float64 values (fewer than 2^20): "
                       "mapped to [0, 1] the rows would lose their resolution")
    return None


def _domain_pairs(lo, hi, num, msg):
    if isinstance(lo, (list, tuple)) or isinstance(hi, (list, tuple)):
        lo = tuple(num(a) for a in (lo if isinstance(lo, (list, tuple)) else [lo]))
        hi = tuple(num(a) for a in (hi if isinstance(hi, (list, tuple)) else [hi]))
        if len(lo) == 1:
            lo = lo * len(hi)
        if len(hi) == 1:
            hi = hi * len(lo)
        if len(lo) != len(hi) or not lo or any(a >= b for a, b in zip(lo, hi)):
            raise ValueError(msg + " (equal or reversed bounds: a constant column has no box)")
        return (lo, hi)
    lo, hi = num(lo), num(hi)
    if not lo < hi:
        raise ValueError(msg + " (equal or reversed bounds: a constant column has no box)")
    return (lo, hi)


# ---------------------------------------------------------------------- registry
def _pos_float(name):
    def check(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"'{name}' must be a finite number > 0, got {v!r}")
        return float(v)

    return check


#: Most categories of a categorical node (codes and frequencies stay exact integers).
MAX_CATEGORIES = 2**31


def _categories(v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 2:
        raise ValueError(f"'categories' must be an integer >= 2, got {v!r}")
    if v > MAX_CATEGORIES:
        raise ValueError(f"'categories' {v} is over the limit of {MAX_CATEGORIES}")
    return int(v)


def _choice(name, options):
    def check(v):
        if v not in options:
            raise ValueError(f"'{name}' must be one of {', '.join(options)}, got {v!r}")
        return v

    return check


REGISTRY: dict[str, BaseKind] = {}


def _register(kind: BaseKind) -> None:
    REGISTRY[kind.name] = kind


_register(BaseKind(
    "binary", "x x' on values in {-1, +1}", {}, 1, False,
    _prepare_binary, _gram_product, _sample_binary, _conj_identity, _values_binary,
    modulus=lambda b: 2,
))
_register(BaseKind(
    "circle", "cos(scale (v - v'))", {"scale": (1.0, _pos_float("scale"))}, 1, False,
    _prepare_circle, _gram_circle, _sample_circle, _conj_negate, _values_circle,
))
_register(BaseKind(
    "categorical", "[x = x'] on integers 0..categories-1", {"categories": (REQUIRED, _categories)},
    1, False, _prepare_categorical, _gram_categorical, _sample_categorical, _conj_categorical,
    _values_categorical, modulus=lambda b: b.param("categories"),
))
def _block_size(v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"'normalize_blocks' must be an integer >= 0, got {v!r}")
    return int(v)


def _flag(name):
    def check(v):
        if not isinstance(v, bool):
            raise ValueError(f"'{name}' must be true or false, got {v!r}")
        return v

    return check


_register(BaseKind(
    "gaussian", "exp(-scale^2 |x - x'|^2 / 2) = exp(-gamma |x - x'|^2)", {
        "scale": (1.0, _pos_float("scale")),
        "gamma": (OPTIONAL, _pos_float("gamma")),  # scikit-learn's: scale = sqrt(2 gamma), see make_base
        "normalize_blocks": (0, _block_size),
        "orthogonal": (False, _flag("orthogonal")),
    }, None, True,
    _prepare_vector, _gram_gaussian, _sample_gaussian_any, _conj_negate, _values_continuous,
))
_register(BaseKind(
    "laplace", "exp(-scale |x - x'|_1)", {"scale": (1.0, _pos_float("scale")), "domain": (OPTIONAL, _domain),
                                          "boundary": (OPTIONAL, _boundary)}, None, True,
    _prepare_vector, _gram_laplace, _sample_laplace, _conj_negate, _values_continuous,
))
_register(BaseKind(
    "sphere", "<x/|x|, x'/|x'|>", {
        "scheme": ("pair", _choice("scheme", ("pair", "coordinate"))),
        "zero": ("error", _choice("zero", ("error", "uniform"))),
    }, None, False,
    _prepare_sphere, _gram_sphere, _sample_sphere, _conj_sphere, _values_linear, linear=_linear_sphere,
    uniform_codes=_sphere_codes, prepare_columns=_prepare_sphere_columns, unit_rows=True,
    norm_bound=lambda b: math.sqrt(b.width / 2) if b.param("scheme") == "pair" else math.sqrt(b.width),
    min_width=2,
))


_register(BaseKind(
    "brownian", "prod_j (min(u_j, u'_j) - u_j u'_j), u = (x - lo) / (hi - lo) on the node's domain (default [0, 1])",
    {"domain": (OPTIONAL, _domain), "boundary": (OPTIONAL, _boundary)}, None, False,
    _prepare_box, _gram_brownian, _sample_brownian, _conj_identity, _values_brownian,
    norm_bound=lambda b: 3.0 ** (-b.width / 2), walk_problem=_free_brownian_problem,
))


def make_base(name: str, params: Mapping | None, width: int) -> Base:
    """Build a base from its registry name, parameters and per-node column count.

    Raises ``KeyError`` for an unknown name and ``ValueError`` (with a precise
    message) for bad parameters or widths; the skeleton parser adds file and line.
    """
    params = dict(params or {})
    kind = REGISTRY[name]
    unknown = sorted(set(params) - set(kind.params))
    if unknown:
        allowed = ", ".join(sorted(kind.params)) or "none"
        raise ValueError(f"unknown parameter '{unknown[0]}' for base '{name}' (allowed: {allowed})")
    clean = {}
    for key, (default, check) in kind.params.items():
        if key in params:
            clean[key] = check(params[key])
        elif default is REQUIRED:
            raise ValueError(f"base '{name}' needs parameter '{key}'")
        elif default is OPTIONAL:
            continue
        else:
            clean[key] = default
    if kind.fixed_width is not None and width != kind.fixed_width:
        raise ValueError(
            f"base '{name}' takes exactly {kind.fixed_width} column per node but the node has {width}; "
            "use 'per: column'"
        )
    if "gamma" in clean:  # the gaussian base's other spelling, RBFSampler's: exp(-gamma |x - x'|^2)
        if "scale" in params:
            raise ValueError("give 'scale' or 'gamma', not both (gamma = scale^2 / 2)")
        gamma = clean.pop("gamma")
        clean["scale"] = math.sqrt(2.0 * gamma)
        if not math.isfinite(clean["scale"]) or clean["scale"] <= 0:
            raise ValueError(f"'gamma' {gamma!r} is out of range (scale = sqrt(2 gamma) must be a finite number > 0)")
    block = clean.get("normalize_blocks", 0)
    if block and width % block:
        raise ValueError(f"'normalize_blocks: {block}' does not divide the node's {width} columns")
    dom = clean.get("domain")
    if dom is not None and isinstance(dom[0], tuple) and len(dom[0]) != width:
        raise ValueError(f"'domain' lists {len(dom[0])} bounds per side but the node has {width} columns; "
                         "give one per column or single numbers")
    if width < kind.min_width:
        raise ValueError(f"base '{name}' needs at least {kind.min_width} columns per node, got {width}")
    return Base(name, tuple(sorted(clean.items())), width)


def allowed_names() -> str:
    return ", ".join(sorted(REGISTRY))
