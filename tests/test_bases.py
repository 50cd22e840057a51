import numpy as np
import pytest

from rfsgen.bases import make_base
from reference import factor

CASES = [
    ("binary", {}, 1),
    ("circle", {"scale": 0.8}, 1),
    ("categorical", {"categories": 5}, 1),
    ("gaussian", {"scale": 0.6}, 4),
    ("laplace", {"scale": 0.4}, 3),
    ("sphere", {"scheme": "pair"}, 5),
    ("sphere", {"scheme": "coordinate"}, 5),
    ("sphere", {"scheme": "pair"}, 2),
]


def pairs_for(base, rng, k=4):
    w = base.width
    if base.name == "binary":
        xs = rng.choice([-1.0, 1.0], size=(k, 2, 1))
    elif base.name == "categorical":
        xs = rng.integers(0, base.param("categories"), size=(k, 2, 1)).astype(float)
    else:
        xs = rng.standard_normal((k, 2, w))
    xs[0, 1] = xs[0, 0]  # include an identical pair: k(x, x) = 1
    return xs


def complex_values(base, xp, gi, codes):
    """The library's vectorised factor values for one prepared row (1, 1, w), as complex (a,)."""
    re, im = base.values(xp, gi, codes)
    return re[0] + 1j * (im[0] if im is not None else 0.0)


@pytest.mark.parametrize("name, params, width", CASES, ids=lambda c: str(c))
def test_base_scheme_is_unbiased(name, params, width):
    """Mean of Re(psi(x) conj psi(x')) over 1e5 omegas is within 5 standard errors of k(x, x')."""
    base = make_base(name, params, width)
    rng = np.random.default_rng(2024)
    n = 100_000
    item, code, power, omega = base.sample(rng, np.ones(n, dtype=np.int64))
    for x, y in pairs_for(base, rng):
        xp = base.prepare(x.reshape(1, 1, -1), ["u"], 0, "t")
        yp = base.prepare(y.reshape(1, 1, -1), ["u"], 0, "t")
        exact = base.gram(xp, yp)[0][0, 0, 0]
        # vectorised atoms of the library ...
        codes = omega if base.continuous else code
        gi = np.zeros(item.size, dtype=np.int64)
        zx = complex_values(base, xp, gi, codes) ** power
        zy = complex_values(base, yp, gi, codes) ** power
        prod = (zx * np.conj(zy)).real
        vals = np.zeros(n)
        vals[item] = prod
        # items whose factor cancelled are the constant 1 (e.g. circle exponent 0 never occurs for count 1)
        vals[np.setdiff1d(np.arange(n), item)] = 1.0
        se = vals.std() / np.sqrt(n)
        assert abs(vals.mean() - exact) < 5 * se + 1e-12, (vals.mean(), exact, se)
        # ... agree with the literal formula on a few draws
        for t in range(5):
            om = omega[t] if base.continuous else None
            ref = factor(base, x, int(code[t]), int(power[t]), om) * np.conj(factor(base, y, int(code[t]), int(power[t]), om))
            tol = 1e-10
            if base.continuous:  # output definition 3: float32 fma angles, within (w + 2) 2^-24 sum|x w| each
                sw = abs(base.param("scale")) * np.abs(om)
                tol += int(power[t]) * (width + 2) * 2.0 ** -24 * (np.abs(xp[0, 0]) @ sw + np.abs(yp[0, 0]) @ sw)
            assert vals[item[t]] == pytest.approx(ref.real, abs=tol)


@pytest.mark.parametrize("name, params, width", CASES, ids=lambda c: str(c))
def test_base_kernel_is_normalized_and_psd(name, params, width):
    base = make_base(name, params, width)
    rng = np.random.default_rng(1)
    xs = np.concatenate([pairs_for(base, rng, 10)[:, 0, :]])
    xp = base.prepare(xs[:, None, :], ["u"], 0, "t")
    k = base.gram(xp, xp)[0][0]
    np.testing.assert_allclose(np.diag(k), 1.0, atol=1e-12)
    np.testing.assert_allclose(k, k.T, atol=1e-14)
    assert np.linalg.eigvalsh(k).min() > -1e-10


def test_aggregated_counts_have_the_law_of_repeated_draws():
    """Drawing count c at once equals c separate draws combined: circle exponent mean 0, variance c."""
    base = make_base("circle", {"scale": 1.0}, 1)
    rng = np.random.default_rng(0)
    _, _, power, _ = base.sample(rng, np.full(200_000, 9))
    # exponent 0 cancels and is dropped; P(exponent = 0) = 0 for odd c
    assert power.size == 200_000
    assert abs(power.mean()) < 5 * 3 / np.sqrt(power.size)
    assert abs(power.var() - 9) < 0.1
    sph = make_base("sphere", {"scheme": "pair"}, 3)
    item, code, power, _ = sph.sample(rng, np.array([1, 0, 5, 10**9]))
    assert np.bincount(item, weights=power).tolist() == [1, 0, 5, 10**9]


def test_norm_bounds():
    assert make_base("sphere", {"scheme": "pair"}, 6).norm_bound == pytest.approx(np.sqrt(3))
    assert make_base("sphere", {"scheme": "coordinate"}, 6).norm_bound == pytest.approx(np.sqrt(6))
    assert make_base("gaussian", {}, 6).norm_bound == 1.0


def test_base_parameter_errors():
    with pytest.raises(ValueError, match="exactly 1 column"):
        make_base("circle", {}, 3)
    with pytest.raises(ValueError, match="needs parameter 'categories'"):
        make_base("categorical", {}, 1)
    with pytest.raises(ValueError, match="'scheme' must be one of pair, coordinate"):
        make_base("sphere", {"scheme": "diag"}, 3)
    with pytest.raises(ValueError, match="at least 2 columns"):
        make_base("sphere", {}, 1)


# ----------------------------------------------------------------------------- extreme finite values (issue 23, item 10)
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rfsgen.errors import DataError  # noqa: E402


@settings(max_examples=40, derandomize=True, deadline=None)
@given(exponent=st.integers(-1074, 1020), w=st.integers(2, 40), seed=st.integers(0, 5))
def test_sphere_prepare_is_exact_under_power_of_two_scaling(exponent, w, seed):
    """Any power-of-two scaling that loses no bit (subnormal rows included) gives the
    same unit vectors, bit for bit; rows of subnormals give finite unit vectors."""
    base = make_base("sphere", {}, w)
    x = np.random.default_rng(seed).standard_normal((2, 1, w))
    scaled = np.ldexp(x, exponent)
    if (scaled == 0).all(axis=-1).any():  # underflowed to a zero vector: the zero rule applies
        with pytest.raises(DataError, match="all zeros"):
            base.prepare(scaled, ["n"], 0, "<t>")
        return
    got = base.prepare(scaled, ["n"], 0, "<t>")
    assert np.isfinite(got).all()
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, rtol=1e-14)
    if np.array_equal(np.ldexp(scaled, -exponent), x):
        np.testing.assert_array_equal(got, base.prepare(x, ["n"], 0, "<t>"))


@pytest.mark.parametrize("name", ["gaussian", "laplace"])
@given(a=st.floats(-1.79e308, 1.79e308), b=st.floats(-1.79e308, 1.79e308),
       scale=st.sampled_from([1e-308, 1e-200, 1.0, 1e200]))
@settings(max_examples=30, derandomize=True, deadline=None)
def test_gram_of_extreme_values_is_finite_and_right(name, a, b, scale):
    """exp(-scale^2 d^2 / 2) and exp(-scale d) for any finite values, compared with the
    same kernel computed in logarithms of the distance."""
    import math

    base = make_base(name, {"scale": scale}, 1)
    xp, yp = np.array([[[a]]]), np.array([[[b]]])
    rho, delta, eps = base.gram(xp, yp)
    assert np.isfinite(rho).all() and np.isfinite(delta).all() and np.isfinite(eps).all()
    d = abs(a / 2 - b / 2)  # half the distance: never overflows
    log_t = (math.log(d) + math.log(2) + math.log(scale)) if d > 0 else -math.inf
    want = math.exp(-0.5 * math.exp(2 * log_t)) if name == "gaussian" and log_t < 300 else (
        math.exp(-math.exp(log_t)) if log_t < 600 else 0.0)
    if name == "gaussian" and log_t >= 300:
        want = 0.0
    assert rho[0, 0, 0] == pytest.approx(want, rel=1e-9, abs=1e-300)


def test_circle_angle_that_overflows_is_a_data_error():
    base = make_base("circle", {"scale": 1e300}, 1)
    np.testing.assert_array_equal(base.prepare(np.array([[[1e8]]]), ["c"], 0, "<t>"), [[[1e308]]])
    with pytest.raises(DataError, match=r"<t>: row 7, node 'c': the angle scale \* value = 1e\+300 \* 1e\+100 overflows"):
        base.prepare(np.array([[[1.0]], [[1e100]]]), ["c"], 6, "<t>")


# ---------------------------------------------------------------------- brownian
def brownian_exact(u, v):
    """prod_j (min(u_j, v_j) - u_j v_j) on unit-cube coordinates, by the formula."""
    return float(np.prod(np.minimum(u, v) - u * v))


@pytest.mark.parametrize("width, domain", [(1, None), (3, None), (2, [-1.0, [2.0, 5.0]])])
def test_brownian_scheme_is_unbiased(width, domain):
    """Mean of psi(x) psi(x') over 2e5 draws (w sin terms each) is within 5 standard errors of k."""
    base = make_base("brownian", {} if domain is None else {"domain": domain}, width)
    lo, hi = (np.zeros(width), np.ones(width)) if domain is None else (np.full(width, -1.0), np.array([2.0, 5.0]))
    rng = np.random.default_rng(7)
    n = 200_000
    item, code, power, omega = base.sample(rng, np.ones(n, dtype=np.int64))
    assert omega is None and (power >= 1).all()
    assert np.bincount(item, weights=power, minlength=n).tolist() == [width] * n  # w terms per draw
    us = rng.random((4, 2, width))
    us[0, 1] = us[0, 0]
    us[1, 0, 0] = 0.0  # a face: k = 0
    for u, v in us:
        x, y = lo + u * (hi - lo), lo + v * (hi - lo)
        xp = base.prepare(x.reshape(1, 1, -1), ["b"], 0, "t")
        yp = base.prepare(y.reshape(1, 1, -1), ["b"], 0, "t")
        exact = base.gram(xp, yp)[0][0, 0, 0]
        assert exact == pytest.approx(brownian_exact(u, v), rel=1e-12, abs=1e-15)
        gi = np.zeros(item.size, dtype=np.int64)
        fx = base.values(xp, gi, code)[0][0] ** power
        fy = base.values(yp, gi, code)[0][0] ** power
        vals = np.ones(n)
        np.multiply.at(vals, item, fx * fy)
        se = vals.std() / np.sqrt(n)
        assert abs(vals.mean() - exact) < 5 * se + 1e-12, (vals.mean(), exact, se)
        # the literal formula on a few terms: code (m - 1) w + j is sin(m pi u_j) / sqrt(3)
        for t in range(5):
            m, j = code[t] // width + 1, code[t] % width
            assert fx[t] == pytest.approx((np.sin(m * np.pi * u[j]) / np.sqrt(3)) ** power[t], abs=1e-9)


def test_brownian_frequencies_follow_the_zeta_law_and_dedup():
    """P(m) = 6 / (pi^2 m^2): the frequencies of m = 1, 2, 3 within 5 standard errors."""
    base = make_base("brownian", {}, 1)
    rng = np.random.default_rng(3)
    n = 100_000
    _, code, power, _ = base.sample(rng, np.ones(n, dtype=np.int64))
    m = code + 1
    for k in (1, 2, 3):
        p = 6 / (np.pi**2 * k**2)
        assert abs(np.mean(m == k) - p) < 5 * np.sqrt(p * (1 - p) / n)
    # 3 draws at one node: a multiset of codes, equal codes merged into powers
    item, code, power, _ = base.sample(rng, np.array([3] * 1000))
    assert np.bincount(item, weights=power).tolist() == [3] * 1000
    key = item * (1 << 40) + code
    assert np.unique(key).size == key.size


def test_brownian_kernel_is_psd_and_vanishes_on_faces():
    base = make_base("brownian", {"domain": [2.0, 4.0]}, 2)
    rng = np.random.default_rng(1)
    x = 2.0 + 2.0 * rng.random((12, 1, 2))
    x[0, 0, 1] = 4.0
    x[1, 0, 0] = 2.0
    xp = base.prepare(x, ["b"], 0, "t")
    k = base.gram(xp, xp)[0][0]
    assert np.all(k[0] == 0) and np.all(k[1] == 0)
    np.testing.assert_allclose(k, k.T, atol=0)
    assert np.linalg.eigvalsh(k).min() > -1e-14
    assert (np.diag(k) <= 1 / 16).all()


def test_brownian_domain_errors():
    with pytest.raises(ValueError, match="lo < hi"):
        make_base("brownian", {"domain": [1, 1]}, 1)
    with pytest.raises(ValueError, match="lo < hi"):
        make_base("brownian", {"domain": [0, [1, 0]]}, 2)
    with pytest.raises(ValueError, match="2 bounds per side but the node has 3"):
        make_base("brownian", {"domain": [[0, 0], [1, 1]]}, 3)
    with pytest.raises(ValueError, match="'domain' must be"):
        make_base("laplace", {"domain": "wide"}, 3)
    from rfsgen.errors import DataError
    base = make_base("brownian", {}, 2)
    with pytest.raises(DataError, match=r"row 5, node 'b', column 1: value 1.5 is outside the node's domain \[0, 1\]"):
        base.prepare(np.array([[[0.5, 1.5]]]), ["b"], 5, "t")
    # laplace without 'domain' is the same base as before
    assert make_base("laplace", {"scale": 2.0}, 3).params == (("scale", 2.0),)


def _normalize_reference(x):
    """rfsgen._compiled.normalize's definition in numpy (elementwise IEEE operations, so the
    same bits): scale by 2^-e (e: frexp's exponent of the largest magnitude, at least -1023),
    sum the squares left to right (w <= 16) or in 8 running sums, square root, divide."""
    x = x.copy()
    w = x.shape[2]
    mx = np.abs(x).max(axis=2)
    e = np.maximum(np.frexp(mx)[1], -1023)
    t = x * np.ldexp(1.0, -e)[..., None]
    if w <= 16:
        acc = t[..., 0] * t[..., 0]
        for k in range(1, w):
            acc = acc + t[..., k] * t[..., k]
    else:
        s = [np.zeros(x.shape[:2]) for _ in range(8)]
        n8 = w - w % 8
        for k in range(n8):
            s[k % 8] = s[k % 8] + t[..., k] * t[..., k]
        for k in range(n8, w):
            s[0] = s[0] + t[..., k] * t[..., k]
        acc = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
    nrm = np.sqrt(acc)
    zero = mx == 0
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(zero[..., None], x, t / nrm[..., None])
    return out, np.where(zero, 0.0, nrm)


@pytest.mark.parametrize("w", [1, 2, 3, 5, 16, 17, 40])
def test_normalize_has_the_bits_of_its_definition(w):
    """The compiled normalisation (short vectors many at once from the bits, longer ones in
    8 running sums) against the definition in numpy: ordinary, zero and signed-zero vectors,
    subnormal ones on both sides of 2^-1023, ones near the largest float64 and exponents
    spread over the whole range, on one and several row parts."""
    from rfsgen import _compiled
    from rfsgen._compiled import normalize

    rng = np.random.default_rng(w)
    x = rng.standard_normal((64, 37, w))
    x[0] = 0.0
    x[1, :, 0] = -0.0
    x[2] *= 1e-310
    x[3] *= 1e300
    x[4] *= 5e-324
    x[5] = rng.uniform(-1, 1, x[5].shape) * np.finfo(float).max
    x[6, 0] = 0.0
    x[6, 0, -1] = np.finfo(float).max
    x[7, 0] = 0.0
    x[7, 0, 0] = 2.0**-1023
    x[7, 1] = 0.0
    x[7, 1, 0] = -(2.0**-1024)
    x[7, 2] = 0.0
    x[7, 2, -1] = 2.0**1023
    x[8] *= 2.0 ** rng.integers(-1074, 1023, x[8].shape)
    x[9] = rng.choice([0.0, -0.0, 1e-320, -3.0, 2.0**-1022], x[9].shape)
    want, want_norms = _normalize_reference(x)
    for parts in (1, 3):
        got, norms = x.copy(), np.empty(x.shape[:2])
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_compiled, "threads", lambda: parts)
            mp.setattr(_compiled, "_rows_for", lambda n: 1)
            normalize(got, norms)
        assert got.tobytes() == want.tobytes()
        assert norms.tobytes() == want_norms.tobytes()
    with pytest.raises(ValueError, match="C-ordered float64"):
        normalize(x[::2], np.empty((32, 37)))
    empty, norms = np.zeros((4, 3, 0)), np.full((4, 3), np.nan)
    normalize(empty, norms)  # no value to read or write: zero vectors
    assert not norms.any()


def _special_vectors(rng, m, g, w):
    """Rows of ``g`` vectors of ``w`` values with every case the normalisation treats apart:
    zero, signed-zero, subnormal, huge and spread-exponent vectors."""
    x = rng.standard_normal((m, g, w))
    x[0] = 0.0
    x[1, :, 0] = -0.0
    x[2] *= 1e-310
    x[3] *= 1e300
    x[4] *= 5e-324
    x[5, 0] = 0.0
    x[5, 0, -1] = np.finfo(float).max
    x[6, 0] = 0.0
    x[6, 0, 0] = 2.0**-1023
    x[7] *= 2.0 ** rng.integers(-1074, 1023, x[7].shape)
    x[8] = rng.choice([0.0, -0.0, 1e-320, -3.0, 2.0**-1022], x[8].shape)
    return x


@pytest.mark.parametrize("w", [1, 3, 16, 17, 40])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gather_normalize_has_the_bits_of_gather_then_normalize(w, dtype):
    """The sphere's one-pass preparation (coordinate-major rows for w <= 16, a few rows at a
    time for longer vectors) gives the bytes of gather_columns then normalize: columns read
    in any order and more than once, float32 and float64 rows, every special vector, on one
    and several row parts; shapes it cannot index are refused before any row is read."""
    from rfsgen import _compiled
    from rfsgen._compiled import gather_columns, gather_normalize, normalize

    rng = np.random.default_rng(w)
    g, width = 5, 7 * w
    x = _special_vectors(rng, 40, 7, w).reshape(40, width)
    x = np.clip(x, -3e38, 3e38).astype(dtype) if dtype == np.float32 else x
    cols = rng.integers(0, width, g * w).astype(np.int64)
    cols[:w] = np.arange(w)  # a whole vector of row 0..8's special cases
    want = np.empty((40, g, w))
    gather_columns(x, cols, want.reshape(40, -1))
    want_norms = np.empty((40, g))
    normalize(want, want_norms)
    for parts in (1, 3):
        got, norms = np.full((40, g, w), np.nan), np.full((40, g), np.nan)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_compiled, "threads", lambda: parts)
            mp.setattr(_compiled, "_rows_for", lambda n: 1)
            gather_normalize(x, cols, got, norms)
        assert got.tobytes() == want.tobytes()
        assert norms.tobytes() == want_norms.tobytes()
    out, norms = np.empty((40, g, w)), np.empty((40, g))
    bad = cols.copy()
    bad[-1] = width
    with pytest.raises(ValueError, match=r"cols must lie in \[0, x.shape\[1\]\)"):
        gather_normalize(x, bad, out, norms)
    bad[-1] = -1
    with pytest.raises(ValueError, match="cols must lie"):
        gather_normalize(x, bad, out, norms)
    for args in ((x[:, ::2], cols // 2, out, norms), (x, cols[:-1], out, norms),
                 (x, cols, out[:39], norms), (x, cols, out, norms[:, :1]), (x, cols.astype(np.int32), out, norms),
                 (x, cols, out.astype(np.float32), norms)):
        with pytest.raises(ValueError, match="gather_normalize: x"):
            gather_normalize(*args)


def test_sphere_nodes_prepare_as_they_gather():
    """A sphere group's preparation runs in the gather (Base.prepare_columns), with the
    bits of gathering then preparing, its zero vectors refused or mapped as the node says;
    bases without a one-pass preparation gather, then prepare."""
    from rfsgen.errors import DataError

    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 12))
    x[2, 3:6] = 0.0
    cols = np.arange(12).reshape(4, 3)[::-1].copy()
    for base in (make_base("sphere", {"zero": "uniform"}, 3), make_base("gaussian", {}, 3),
                 make_base("brownian", {"domain": [-9, 9]}, 3)):
        want = base.prepare(x[:, cols.ravel()].reshape(6, 4, 3), ["a"] * 4, 0, "t")
        assert base.prepare_columns(x, cols, ["a"] * 4, 0, "t").tobytes() == want.tobytes()
    assert base.prepare_columns(x[:0], cols, ["a"] * 4, 0, "t").shape == (0, 4, 3)
    strict = make_base("sphere", {}, 3)
    with pytest.raises(DataError, match="row 12, node 'c': the vector is all zeros"):
        strict.prepare_columns(x, cols, ["a", "b", "c", "d"], 10, "t")
