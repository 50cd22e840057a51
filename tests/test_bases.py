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
            assert vals[item[t]] == pytest.approx(ref.real, abs=1e-10)


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
