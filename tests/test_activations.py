import math
import re

import numpy as np
import pytest
from scipy import stats

from rfsgen import SamplerError
from rfsgen.activations import REGISTRY, TOLERANCE, hermite_coefficients, make_activation

PARAMS = {"polynomial": {"degree": 4, "c": 0.7}, "coefficients": {"values": [0.1, 0.0, 2.0, 1.0]}, "exp": {"beta": 1.3},
          "leaky_relu": {"slope": 0.2}, "elu": {"alpha": 0.7}, "arccos": {"degree": 2},
          "function": {"expr": "tanh(x) + 0.3 * x"}}
#: Kinked functions whose projected series is cut at degree 1024 above TOLERANCE (reported).
SLOW_SERIES = ("abs", "elu", "arccos")


def every_activation():
    return [make_activation(name, PARAMS.get(name)) for name in sorted(REGISTRY)]


def relu_closed(r):
    return (np.sqrt(1 - r * r) + (math.pi - np.arccos(r)) * r) / math.pi


@pytest.mark.parametrize("act", every_activation(), ids=lambda a: a.name)
def test_coefficients_are_a_distribution(act):
    a = act.coefficients
    assert np.all(a >= 0)
    # The table plus the exactly-sampled tail is the whole distribution.
    assert abs(math.fsum(a) + act.tail_mass - 1.0) < 1e-12
    # Truncated series dropped less than the documented tolerance (abs converges too slowly: reported).
    if act.name not in SLOW_SERIES:
        assert act.truncation <= TOLERANCE
    assert act.dual(np.array([1.0]))[0] == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("act", every_activation(), ids=lambda a: a.name)
def test_dual_equals_its_series(act):
    """The dual is the sampler's series, up to what the series dropped (kinked activations have
    an exact dual while their table is cut: 2t / (1 - t) apart, issue 42.11)."""
    rho = np.linspace(-0.95, 0.95, 41)
    series = np.polynomial.polynomial.polyval(rho, act.coefficients)
    t = act.truncation
    np.testing.assert_allclose(act.dual(rho), series, atol=1e-8 + 2 * t / (1 - t))


def test_relu_dual_is_its_closed_form():
    relu = make_activation("relu")
    rho = np.linspace(-1, 1, 201)
    np.testing.assert_allclose(relu.dual(rho), relu_closed(rho), atol=1e-15)
    # sigma_hat'(1) = 1 and sigma_hat(0) = a_0 = 1/pi
    assert relu.derivative_at_one == 1.0
    assert relu.coefficients[0] == pytest.approx(1 / math.pi)
    assert relu.coefficients[1] == pytest.approx(0.5)


def test_quadrature_relu_and_step_match_closed_form_coefficients():
    b, second = hermite_coefficients(lambda z: np.maximum(z, 0.0), 300)
    np.testing.assert_allclose(b * b / second, make_activation("relu").coefficients[:301], atol=1e-8)
    b, second = hermite_coefficients(lambda z: (z > 0) * 1.0, 300)
    np.testing.assert_allclose(b * b / second, make_activation("step").coefficients[:301], atol=1e-8)


@pytest.mark.parametrize(
    "name, closed",
    [
        ("erf", lambda r: np.arcsin(2 * r / 3) / np.arcsin(2 / 3)),
        ("sin", lambda r: np.sinh(r) / np.sinh(1.0)),
        ("cos", lambda r: np.cosh(r) / np.cosh(1.0)),
    ],
)
def test_quadrature_duals_match_closed_forms(name, closed):
    rho = np.linspace(-1, 1, 201)
    np.testing.assert_allclose(make_activation(name).dual(rho), closed(rho), atol=1e-8)


def test_exp_and_polynomial_closed_forms():
    rho = np.linspace(-1, 1, 51)
    e = make_activation("exp", {"beta": 0.25})
    np.testing.assert_allclose(e.dual(rho), np.exp(0.25 * (rho - 1)))
    assert e.derivative_at_one == 0.25
    p = make_activation("polynomial", {"degree": 3, "c": 1.0})
    np.testing.assert_allclose(p.coefficients, [0.125, 0.375, 0.375, 0.125])
    assert p.derivative_at_one == pytest.approx(1.5)
    assert make_activation("step").derivative_at_one == math.inf


@pytest.mark.parametrize("act", every_activation(), ids=lambda a: a.name)
def test_degree_sampler_matches_coefficients(act):
    """Chi-square goodness of fit of 200k sampled degrees at a fixed seed (p > 1e-4)."""
    n = 200_000
    deg = act.sample_degrees(np.random.default_rng(7), n)
    p = np.append(act.coefficients, act.tail_mass)
    p = p / p.sum()
    expected = n * p
    keep = np.flatnonzero(expected >= 20)
    table = act.coefficients.size  # index ``table`` stands for every degree beyond the table
    binned = np.minimum(deg, table)
    observed = np.bincount(binned, minlength=table + 1)[keep].astype(float)
    exp_keep = expected[keep]
    rest_obs = n - observed.sum()
    rest_exp = n - exp_keep.sum()
    # Everything outside the well-populated bins forms one more bin.
    observed = np.append(observed, rest_obs)
    exp_keep = np.append(exp_keep, rest_exp)
    if rest_exp < 20:  # too sparse for chi-square: merge into the last bin
        observed[-2] += observed[-1]
        exp_keep[-2] += exp_keep[-1]
        observed, exp_keep = observed[:-1], exp_keep[:-1]
    if len(observed) < 2:
        assert observed[0] == n
        return
    assert stats.chisquare(observed, exp_keep).pvalue > 1e-4


@pytest.mark.parametrize("name", ["relu", "step"])
def test_heavy_tails_are_sampled_not_capped(name):
    act = make_activation(name)
    table_max = act.coefficients.size - 1
    deg = act.sample_degrees(np.random.default_rng(3), 2_000_000)
    tail = deg > table_max
    # Tail frequency matches the tail mass within 5 binomial standard errors, and
    # degrees do go beyond the table (step's tail mass is ~1.4e-3: ~2800 draws).
    se = math.sqrt(act.tail_mass * (1 - act.tail_mass) / deg.size)
    assert abs(tail.mean() - act.tail_mass) < 5 * se + 1e-9
    if name == "step":
        assert tail.sum() > 1000
        assert np.all(deg[tail] % 2 == 1)  # step has only odd degrees beyond a_0


def test_tail_sampler_follows_the_series_shape():
    """P(k >= 4 k0 | tail) for step's tail: sum_{k >= 4k0} c_k / sum_{k >= k0} c_k ~ 1/2 (c_k ~ k^-1.5)."""
    act = make_activation("step")
    t = act.tail
    rng = np.random.default_rng(5)
    ks = (t.sample(rng, 40_000) - 1) // 2
    k = np.arange(t.k0, 64 * t.k0, dtype=float)
    w = np.exp(t.log_weight(k))
    # tail beyond 64 k0: integral of k^-1.5 approximation
    beyond = w[-1] * k[-1] * 2
    expected = (w[3 * t.k0:].sum() + beyond) / (w.sum() + beyond)
    observed = (ks >= 4 * t.k0).mean()
    se = math.sqrt(expected * (1 - expected) / ks.size)
    assert abs(observed - expected) < 5 * se


@pytest.mark.parametrize("act", every_activation(), ids=lambda a: a.name)
def test_sum_of_degrees(act):
    """sum_degrees(m) has the law of the sum of m iid degrees (compared by mean for finite-mean laws)."""
    rng = np.random.default_rng(11)
    m = np.array([0, 1, 3, 250_000])
    s = act.sum_degrees(rng, m)
    assert s[0] == 0 and s.dtype == np.int64
    if math.isfinite(act.derivative_at_one) and act.name != "relu":
        mean = act.derivative_at_one
        var = float(np.dot((np.arange(act.coefficients.size) - mean) ** 2, act.coefficients))
        assert abs(s[3] - m[3] * mean) < 6 * math.sqrt(m[3] * var) + 1e-9


def test_parameter_errors():
    with pytest.raises(ValueError, match="a_1 = -0.5 is negative"):
        make_activation("coefficients", {"values": [0.5, -0.5]})
    with pytest.raises(ValueError, match="unknown parameter 'gamma'.*allowed: beta"):
        make_activation("exp", {"gamma": 1})
    with pytest.raises(ValueError, match="needs parameter 'degree'"):
        make_activation("polynomial", {})


@pytest.mark.parametrize("name", ["relu", "step", "tanh", "gelu"])
def test_guide_table_search_equals_binary_search(name):
    act = make_activation(name, {})
    cdf = act._cdf
    v = np.concatenate([
        np.random.default_rng(4).random(200_000),
        [0.0, 1.0, cdf[0], cdf[-1], np.nextafter(cdf[-1], 0.0), np.nextafter(cdf[1], 1.0)],
        cdf[::97], 1.0 - np.logspace(-16, -1, 200),  # exact table values and the fine far tail
    ])
    np.testing.assert_array_equal(act._search(v), np.searchsorted(cdf, v, side="right"))


def test_huge_multiplicity_sums_are_exact_integers(monkeypatch):
    """Sums of heavy-tail degrees above 2**53 stay exact (a float64 sum would round)."""
    from rfsgen.activations import DEGREE_LIMIT, make_activation

    act = make_activation("step")
    big = 2**55 + 1  # odd and above 2**53: float64 cannot hold 3 * big exactly
    monkeypatch.setattr(type(act.tail), "sample", lambda self, rng, n: np.full(n, big, dtype=np.int64))

    class AllFromTheTail:  # the multinomial puts all 3 degrees in the tail
        def multinomial(self, n, p):
            return np.concatenate([np.zeros(len(p) - 1, np.int64), [n]])

    assert act._sum_many(AllFromTheTail(), 3) == 3 * big
    monkeypatch.setattr(type(act.tail), "sample", lambda self, rng, n: np.full(n, DEGREE_LIMIT // 2, dtype=np.int64))
    with pytest.raises(SamplerError, match=r"reached 2\*\*62"):
        act._sum_many(AllFromTheTail(), 3)


def test_activations_are_built_on_first_use_and_keep_their_identity():
    """make_activation checks parameters at once but builds the series only when used;
    equal names and parameters are one object, also after a pickle round trip."""
    import pickle

    from rfsgen.activations import _cached_build

    _cached_build.cache_clear()
    a = make_activation("exp", {"beta": 0.375})
    assert a is make_activation("exp", {"beta": 0.375})
    assert a.name == "exp" and a.params == (("beta", 0.375),)
    assert _cached_build.cache_info().currsize == 0  # nothing built yet
    assert a.derivative_at_one == 0.375
    assert _cached_build.cache_info().currsize == 1
    assert pickle.loads(pickle.dumps(a)) is a
    np.testing.assert_array_equal(a.coefficients, _cached_build("exp", (("beta", 0.375),)).coefficients)
    with pytest.raises(ValueError, match="'beta' must be a finite number"):
        make_activation("exp", {"beta": -1})


# ----------------------------------------------------------------------------- polynomial of any degree (issue 23)
def _exact_binomial(p, c):
    """binom(p, i) c^(p-i) / (1+c)^p in exact rational arithmetic (c as the float's exact value)."""
    from fractions import Fraction

    c = Fraction(c)
    den = (1 + c) ** p
    return np.array([float(math.comb(p, i) * c ** (p - i) / den) for i in range(p + 1)])


@pytest.mark.parametrize("p, c", [(1, 0.0), (2, 0.5), (7, 3.0), (40, 0.1), (300, 1.0), (1029, 0.0), (1000, 0.25),
                                  (1023, 1.0), (1024, 1.0), (1030, 0.0), (1030, 1.0), (1500, 0.7), (2000, 4.0)])
def test_polynomial_coefficients_match_exact_rationals(p, c):
    """Below ~1,030 the direct formula (unchanged bits); from there the log domain,
    where it used to overflow (OverflowError in every command)."""
    from rfsgen.activations import _binomial_coefficients

    got = _binomial_coefficients(p, c)
    want = _exact_binomial(p, c)
    assert np.isfinite(got).all()
    big = want > 1e-100
    np.testing.assert_allclose(got[big], want[big], rtol=5e-11)
    # the direct formula's c^(p-i) underflows to 0 for tiny c^(p-i) (p = 1000, c = 0.25:
    # entries below 1e-122 are 0); kept for the same bits, as that mass is negligible
    assert np.abs(got[~big] - want[~big]).sum() < 1e-100


@pytest.mark.parametrize("c", [0.0, 5e-324, 1e-3, 0.5, 2.0, 1e5, 1e308])
def test_polynomial_of_the_largest_degree_is_a_distribution(c):
    act = make_activation("polynomial", {"degree": 100_000, "c": c})
    a = act.coefficients
    assert a.size == 100_001 and np.isfinite(a).all() and (a >= 0).all()
    assert math.fsum(a) == pytest.approx(1.0, abs=1e-12)
    assert act.derivative_at_one == pytest.approx(100_000 / (1 + c), rel=1e-9, abs=1e-300)
    rho = np.linspace(-1, 1, 9)
    assert np.isfinite(act.dual(rho)).all() and np.isfinite(act.gap(rho, 1 - rho)).all()


@pytest.mark.parametrize("name, ok, bad, msg", [
    ("polynomial", {"degree": 100_000}, {"degree": 100_001}, "'degree' 100001 is over the limit of 100000"),
    ("exp", {"beta": 1000}, {"beta": 1000.0000001}, "'beta' 1000.0000001 is over the limit of 1000"),
    ("coefficients", {"values": [1.0] * 100_001}, {"values": [1.0] * 100_002},
     "'values' has 100002 coefficients, over the limit of 100001"),
])
def test_activation_limits_at_and_just_past(name, ok, bad, msg):
    act = make_activation(name, ok)
    assert np.isfinite(act.coefficients).all() and math.fsum(act.coefficients) == pytest.approx(1.0)
    with pytest.raises(ValueError, match=re.escape(msg)):
        make_activation(name, bad)


@pytest.mark.parametrize("name, params", [
    ("exp", {"beta": 10**400}), ("polynomial", {"degree": 3, "c": 10**400}), ("coefficients", {"values": [10**400]}),
    ("polynomial", {"degree": 10**400}),
])
def test_huge_integers_are_refused_with_a_short_message(name, params):
    with pytest.raises(ValueError) as e:
        make_activation(name, params)
    assert len(str(e.value)) < 200


def test_coefficients_near_the_float_maximum_are_normalised():
    act = make_activation("coefficients", {"values": [1e308, 1e308, 1.7e308]})
    np.testing.assert_allclose(act.coefficients, np.array([1, 1, 1.7]) / 3.7, rtol=1e-15)
    np.testing.assert_array_equal(make_activation("coefficients", {"values": [0.2, 0.5, 0.3]}).coefficients,
                                  np.array([0.2, 0.5, 0.3]) / math.fsum([0.2, 0.5, 0.3]))


# --------------------------------------------------------------------------- issue 28: new activations
import pickle  # noqa: E402

from hypothesis import given, settings, strategies as st  # noqa: E402

from rfsgen import SkeletonError, parse_skeleton  # noqa: E402
from rfsgen.activations import MAX_ARCCOS_DEGREE, ProjectionError, arccos_dual, project  # noqa: E402
from rfsgen.expression import ExpressionError, compile_expression  # noqa: E402

RHO = np.linspace(-1, 1, 201)


def _quadrature_dual(fn, rho):
    """E[f(X) f(Y)] / E[f(X)^2] for standard normals with correlation rho (|rho| <= 0.9), from
    the HermiteE coefficients by 1-D composite Gauss-Legendre quadrature (exact to ~1e-15
    per coefficient, kinks included): sum_i b_i^2 rho^i / E[f^2], 400 terms."""
    b, second = hermite_coefficients(fn, 400)
    return np.polynomial.polynomial.polyval(rho, b * b / second)


QRHO = np.linspace(-0.9, 0.9, 19)


@pytest.mark.parametrize("slope", [0.01, 0.2, -0.5, -1.0, 1.0, 3.0])
def test_leaky_relu_dual_is_exact_and_matches_quadrature(slope):
    act = make_activation("leaky_relu", {"slope": slope})
    f = lambda v: v if v > 0 else slope * v  # noqa: E731
    np.testing.assert_allclose(act.dual(QRHO), _quadrature_dual(f, QRHO), atol=1e-12)
    # the series (table + exactly sampled tail) against the closed form
    np.testing.assert_allclose(np.polynomial.polynomial.polyval(RHO[10:-10], act.coefficients), act.dual(RHO[10:-10]),
                               atol=1e-8)
    assert abs(math.fsum(act.coefficients) + act.tail_mass - 1) < 1e-12
    # the gap is 1 - dual, accurate near rho = 1
    d = np.array([1e-12, 1e-6, 0.3, 1.0, 2.0])
    np.testing.assert_allclose(act.gap(1 - d, d), 1 - act.dual(1 - d), atol=1e-14)
    if slope == 0.01:
        assert act.label == "leaky_relu(slope=0.01)" and make_activation("leaky_relu") is act


def test_leaky_relu_with_slope_zero_is_relu():
    rho = np.linspace(-1, 1, 101)
    np.testing.assert_allclose(make_activation("leaky_relu", {"slope": 0.0}).dual(rho), relu_closed(rho), atol=1e-15)


@pytest.mark.parametrize("n", range(MAX_ARCCOS_DEGREE + 1))
def test_arccos_duals_are_cho_and_saul_and_match_quadrature(n):
    f = lambda v: v ** n if v > 0 else 0.0  # noqa: E731
    np.testing.assert_allclose(arccos_dual(n, QRHO), _quadrature_dual(f, QRHO), atol=1e-12)
    act = make_activation("arccos", {"degree": n})
    # the sampler's and kernel's dual (closed form for n <= 1, the cut series beyond) is the
    # closed form up to the reported truncation
    np.testing.assert_allclose(act.dual(RHO), arccos_dual(n, RHO), atol=2 * act.truncation + 1e-13)
    assert act.label == f"arccos(degree={n})"
    if n >= 2:  # sigma_hat'(1) = n^2 / (2n - 1) (Cho and Saul's J_n'(0) / J_n(0))
        assert act.derivative_at_one == pytest.approx(n * n / (2 * n - 1), rel=1e-5)


def test_arccos_0_and_1_are_step_and_relu():
    np.testing.assert_allclose(arccos_dual(0, RHO), make_activation("step").dual(RHO), atol=1e-15)
    np.testing.assert_allclose(arccos_dual(1, RHO), relu_closed(RHO), atol=1e-15)
    assert make_activation("arccos", {"degree": 1}).tail_mass == make_activation("relu").tail_mass


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 2.0])
def test_elu_matches_quadrature(alpha):
    act = make_activation("elu", {"alpha": alpha})
    f = lambda v: v if v > 0 else alpha * math.expm1(v)  # noqa: E731
    # a kink in the derivative at 0 unless alpha = 1: the series is cut at degree 1024 (reported)
    np.testing.assert_allclose(act.dual(QRHO), _quadrature_dual(f, QRHO), atol=2 * act.truncation + 1e-12)
    assert act.truncation < (1e-8 if alpha == 1.0 else 1e-5)


@pytest.mark.parametrize("expr, name, params", [
    ("maximum(x, 0)", "relu", {}), ("where(x > 0, x, 0.1 * x)", "leaky_relu", {"slope": 0.1}),
    ("heaviside(x, 0.5)", "step", {}), ("tanh(x)", "tanh", {}), ("abs(x)", "abs", {}),
    ("where(x > 0, x ** 2, 0)", "arccos", {"degree": 2}), ("where(x > 0, x, expm1(x))", "elu", {}),
])
def test_an_expression_equals_the_activation_it_spells(expr, name, params):
    """The projected series before renormalising equals the named activation's table to
    1e-10; the duals agree to the dropped mass (relu's series converges slowly: 2.6e-6
    dropped at degree 1024, which the kernel renormalises)."""
    a, truncation = project(compile_expression(expr), expr)
    named = make_activation(name, params)
    k = min(a.size, named.coefficients.size)
    ref = named.coefficients[:k] * (1 - named.truncation)  # the named table before renormalising
    np.testing.assert_allclose(a[:k], ref, atol=1e-10)
    act = make_activation("function", {"expr": expr})
    assert act.truncation == truncation
    np.testing.assert_allclose(act.dual(RHO), named.dual(RHO), atol=2 * (truncation + named.truncation) + 1e-12)


def test_expression_and_python_activations_pickle():
    act = make_activation("function", {"expr": "where(x > 0, x, 0.1 * x)"})
    assert pickle.loads(pickle.dumps(act)) is act
    fn = compile_expression("clip(x, -1, 2) * sin(pi * x) + e")
    back = pickle.loads(pickle.dumps(fn))
    assert [back(v) for v in (-3.0, 0.25, 1.5)] == [fn(v) for v in (-3.0, 0.25, 1.5)]
    py = make_activation(math.tanh, name="mytanh")
    assert pickle.loads(pickle.dumps(py)) is py and py.label == "mytanh"
    np.testing.assert_allclose(py.dual(RHO), make_activation("tanh").dual(RHO), atol=1e-15)


SKEL = """rfsgen: 1
input: {width: 3}
nodes:
  - {name: v, base: sphere, scheme: pair}
  - {name: out, activation: ACT, inputs: [v, v]}
output: out
"""


def test_python_activation_in_a_skeleton():
    import rfsgen
    from rfsgen import kernel

    def leaky(z):
        return z if z > 0 else 0.2 * z

    act = rfsgen.make_activation(leaky, name="leaky")
    s = parse_skeleton(SKEL.replace("ACT", "leaky"), activations={"leaky": act})
    ref = parse_skeleton(SKEL.replace("ACT", "{name: leaky_relu, slope: 0.2}"))
    x = np.random.default_rng(0).normal(size=(6, 3))
    np.testing.assert_allclose(kernel(s, x), kernel(ref, x), atol=5e-6)  # leaky's series cut at 1024
    assert s.bind(3) is s
    with pytest.raises(SkeletonError, match=r"<skeleton>:5: unknown activation 'leaky'"):
        parse_skeleton(SKEL.replace("ACT", "leaky"))


@pytest.mark.parametrize("expr, says", [
    ("exp(x**2)", "cannot be evaluated at x = -40"), ("exp(x**2 / 3)", "not square-integrable"),
    ("exp(x**2 / 4)", "not square-integrable"), ("1e-150 * exp(x**2 / 4)", "does not decay by |x| = 40"), ("x * 0", "identically zero"), ("where(x > 50, 1, 0)", "identically zero"),
    ("log(x)", "the log of zero or of a negative number (of 'x')"), ("1 / x", "near x = 0: a division by zero (of 'x')"),
    ("sqrt(x)", "the square root of a negative number"),
    # issue 37.7: poles the quadrature nodes never hit, found on the whole line
    ("1/(x-0.3)", "not a finite real number near x = 0.3: a division by zero (of 'x - 0.3')"),
    ("tan(x)", "near x = -1.5708: tan at one of its poles"), ("1/(x-1e6)", "near x = 1e+06: a division by zero"),
    ("1/(x - 0.3)**2", "a division by zero (of '(x - 0.3) ** 2')"), ("log(abs(x - 2))", "near x = 2: the log of zero"),
    ("x ** 0.5", "a negative number raised to a non-integer power"), ("x ** -2", "zero raised to a negative power"),
    ("tan(x / 100)", "near x = -157.08: tan"), ("log1p(x)", "log1p of a number <= -1"),
    ("1" + "0" * 400 + " * x", "not a finite real number (a float holds magnitudes up to 1.798e+308)"),
    ("__import__('os').system('true')", "only calls of the listed functions"), ("__import__('os')", "unknown function: '__import__'"), ("x.real", "not allowed: 'x.real'"),
    ("y + 1", "unknown name: 'y'"), ("lambda: 1", "not allowed"), ("where(x > 0, x)", "where takes 3 arguments"),
    ("maximum(x, 0, 1)", "maximum takes 2 arguments"), ("'a'", "not a finite real number"), ("True", "not a finite real number"),
    ("1e999", "not a finite real number"), ("x if x > 0 else 0", "not allowed"), ("x @ x", "operator not allowed"),
    ("x // 2", "operator not allowed"), ("0 < x < 1", "not allowed"), ("", "'expr' is empty"), ("x +", "is not valid"),
    ("(" * 30 + "x" + ")" * 30, "nests 30 brackets deep"), ("+".join(["x"] * 300), "syntax nodes, over the limit"),
    ("x" * 1001, "1001 characters, over the limit"), ("exp(x)(1)", "only calls of the listed functions"), ("exp(x=1)", "keyword arguments are not allowed"),
])
def test_bad_expressions_are_one_line_skeleton_errors(expr, says):
    text = SKEL.replace("ACT", "{name: function, expr: " + repr(expr).replace("\\'", "''") + "}")
    if expr.startswith("'") or "'" in expr:
        text = SKEL.replace("ACT", '{name: function, expr: "' + expr + '"}')
    with pytest.raises(SkeletonError) as e:
        parse_skeleton(text, "f.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("f.yaml:5: node 'out': ") and says in msg, msg


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.lists(st.sampled_from(list("x()+-*/<>=.,_ 0123456789eapi") + ["exp", "where", "maximum", "os", "import",
                                                                         "lambda", "**", "[", "]"]),
                max_size=30).map("".join))
def test_generated_expressions_compile_or_fail_in_one_line(expr):
    """Arbitrary token soup: either an Expr that evaluates to a float (or raises an
    arithmetic error, which projection turns into a one-line error), or one ExpressionError line."""
    try:
        fn = compile_expression(expr)
    except ExpressionError as e:
        assert "\n" not in str(e) and str(e)
        return
    for z in (-2.0, 0.5, 3.0):
        try:
            assert isinstance(fn(z), float)
        except (ArithmeticError, ValueError, TypeError):
            pass


@settings(max_examples=25, derandomize=True, deadline=None)
@given(st.text(min_size=1, max_size=30))
def test_generated_expressions_through_the_parser_are_one_line_errors_or_activations(expr):
    import json

    text = SKEL.replace("ACT", "{name: function, expr: " + json.dumps(expr) + "}")
    try:
        parse_skeleton(text, "g.yaml")
    except SkeletonError as e:
        assert "\n" not in str(e) and str(e).startswith("g.yaml:")


def test_make_activation_rejects_bad_functions_at_once():
    def blows_up(z):
        return math.exp(z * z)

    with pytest.raises(ProjectionError, match="function 'bad'.*square-integrable"):
        make_activation(blows_up, name="bad")
    with pytest.raises(ValueError, match="must be an identifier that is not a registered activation"):
        make_activation(math.tanh, name="relu")


@pytest.mark.parametrize("name, params, says", [
    ("leaky_relu", {"slope": float("nan")}, "'slope' must be a finite number"),
    ("leaky_relu", {"slope": 1e7}, "over the limit"), ("elu", {"alpha": -1}, "'alpha' must be a finite number >= 0"),
    ("arccos", {"degree": 4}, "from 0 to 3"), ("arccos", {}, "needs parameter 'degree'"),
    ("function", {}, "needs parameter 'expr'"), ("function", {"expr": 3}, "'expr' must be a string"),
])
def test_bad_parameters(name, params, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        make_activation(name, params)


# ----------------------------------------------------------------------------- issue 37.7: the class
from rfsgen import activations as _A  # noqa: E402
from rfsgen.expression import evaluate, singular_point  # noqa: E402


@pytest.mark.parametrize("expr", [
    "1/(1 + x*x)", "x/(1 + abs(x))", "exp(x)/(1 + exp(x))", "1/exp(x)", "sin(x)/(2 + cos(x))", "tan(arctan(x)/2)",
    "sqrt(x*x + 1)", "abs(x) ** 0.5", "log1p(x*x)", "1/(1 + x*x - x)", "1/(x - x + 1)", "tan(x / (4 + x*x))",
    "where(x > 0, x, 0.5 * expm1(x))", "clip(x, -1, 2) * sin(pi * x) + e", "heaviside(x, 0.5)", "log(1 + exp(x))",
])
def test_legal_expressions_have_no_singular_point(expr):
    assert singular_point(compile_expression(expr)) is None
    _A.check_expression(expr)


def _random_pole_expression(rng):
    """A finite smooth body divided by (or with tan/log/sqrt of) something that vanishes at c."""
    c = round(float(rng.uniform(-5, 5)), 3)
    body = rng.choice(["x", "tanh(x)", "1", "exp(-x*x)", "sin(x) + 2", "x*x + 1"])
    bad = rng.choice([f"({body}) / (x - {c})", f"({body}) / (x - {c}) ** 2", f"({body}) / sin(x - {c})",
                      f"log(abs(x - {c})) * ({body})", f"sqrt(x - {c})", f"tan(x - {c} + pi/2)",
                      f"({body}) / ((x - {c}) * (x + 100))", f"({body}) * (x - {c}) ** -1"])
    return bad, c


def test_generated_poles_and_domain_errors_are_refused_at_parse_time():
    """Fixed seed: 60 expressions with a pole, a log singularity or a square root of negatives
    somewhere on the line; each is one line naming the node, the expression and why."""
    rng = np.random.default_rng(3707)
    for _ in range(60):
        expr, c = _random_pole_expression(rng)
        text = SKEL.replace("ACT", "{name: function, expr: '" + expr + "'}")
        with pytest.raises(SkeletonError) as e:
            parse_skeleton(text, "p.yaml")
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("p.yaml:5: node 'out': expression '") and "not a finite real number" in msg, msg
        x = singular_point(compile_expression(expr))[0]
        if "sqrt" in expr:
            assert x < c + 1e-6, (expr, x)
        else:  # the point named is one of the poles: c + k pi (tan, sin) or -100
            poles = [c + k * math.pi for k in range(-4, 5)] + [-100.0]
            assert min(abs(x - p) for p in poles) < 1e-6, (expr, x)


@pytest.mark.parametrize("expr, says", [
    ("exp(x**2)", "cannot be evaluated"), ("exp(x**2 / 4)", "not square-integrable"),
    ("exp(x**2 / 3)", "not square-integrable"), ("1e300 * x * x * x * x", "not square-integrable"),
    ("1e308 * x * 10", "is -inf at x = -1"), ("x ** 1000", "cannot be evaluated"), ("1e-300 * 1e-300 * x", "identically zero"),
    ("(" * 20 + "x" + ")" * 20, None), ("+".join(["sin(x)"] * 25), None), ("-(-(-(-(-(-(-(-(x))))))))", None),
])
def test_growth_huge_constants_and_deep_nesting(expr, says):
    if says is None:
        _A.check_expression(expr)
        return
    with pytest.raises(ValueError, match=re.escape(says)) as e:
        _A.check_expression(expr)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("seed", [0, 1])
def test_vector_evaluation_has_the_scalar_bits(seed):
    """The parse-time check evaluates a whole array at once; the values (and so the series) are
    bit for bit the scalar evaluation's."""
    rng = np.random.default_rng(seed)
    z = np.concatenate([rng.normal(size=200) * 3, [0.0, -0.0, 1.0, -1.0]])
    for expr in ["where(x > 0, x, 0.5 * expm1(x)) + 0.1 * tanh(x)", "maximum(x, 0) - minimum(x, 0.5) * sign(x)",
                 "clip(x, -1, 2) * sin(pi * x) + e", "heaviside(x, 0.5) * exp(-x*x/3) + abs(x) ** 1.5",
                 "x ** 3 / (1 + x * x) - arcsinh(x) + erf(x) * erfc(x) + cosh(x / 4) + arctan(x)",
                 "sqrt(abs(x)) + log1p(x * x) + (x >= 0.5) - (x != 0) + where(x <= -1, 2, -x)"]:
        fn = compile_expression(expr)
        assert evaluate(fn, z).tobytes() == np.array([fn(float(v)) for v in z]).tobytes(), expr


def test_parse_cost_is_bounded_by_counts_and_projection_waits():
    """Issue 37.7: 100 distinct legal expressions took 45 s to parse (a full projection each).
    Parsing now evaluates each distinct expression once at the quadrature nodes and projects
    none; the projection (one Hermite recurrence) comes when the kernel needs the series."""
    nodes = _A._grid()[0].size
    exprs = [f"tanh({0.5 + i / 64:.4f} * x) + {i / 100:.2f} * x" for i in range(60)]
    lines = ["rfsgen: 1", "input: {width: 3}", "nodes:", "  - {name: v, base: sphere, scheme: pair}"]
    lines += [f"  - {{name: h{i}, activation: {{name: function, expr: '{e}'}}, inputs: [v]}}" for i, e in enumerate(exprs)]
    lines += ["  - {name: out, activation: relu, inputs: [" + ", ".join(f"h{i}" for i in range(60)) + "]}"]
    before = dict(_A.COUNTS)
    skel = parse_skeleton("\n".join(lines), "many.yaml")
    assert _A.COUNTS["projections"] == before["projections"]
    assert _A.COUNTS["evaluations"] - before["evaluations"] <= 60 * nodes
    act = next(n.activation for n in skel.internal_nodes if n.label.startswith("h"))
    assert act.coefficients.size < 200  # smooth: the recurrence stops early
    assert _A.COUNTS["projections"] == before["projections"] + 1


def test_too_many_expressions_are_refused_before_any_work():
    n = _A.MAX_EXPRESSIONS + 1
    lines = ["rfsgen: 1", "input: {width: 3}", "nodes:", "  - {name: v, base: sphere, scheme: pair}"]
    lines += [f"  - {{name: h{i}, activation: {{name: function, expr: 'tanh(x) + {i}'}}, inputs: [v]}}" for i in range(n)]
    lines += ["  - {name: out, activation: relu, inputs: [" + ", ".join(f"h{i}" for i in range(n)) + "]}"]
    before = dict(_A.COUNTS)
    with pytest.raises(SkeletonError, match=rf"many.yaml:{4 + n}: node 'h{n - 1}': more than {n - 1} distinct expressions"):
        parse_skeleton("\n".join(lines), "many.yaml")
    assert _A.COUNTS == before


def test_early_stopping_keeps_the_series_bits():
    """The recurrence stops once the dropped mass is below TOLERANCE: the series is the prefix
    the full run gives, bit for bit."""
    for expr in ["tanh(x) + 0.2 * x", "erf(x / 2) - sin(x)", "maximum(x, 0)"]:
        fn = compile_expression(expr)
        a, t = _A.project(fn, expr)
        f, second = _A.check_function(fn, expr)
        full = _A._recurrence(f, _A.MAX_QUADRATURE_DEGREE)
        a_full, t_full = _A._cut(full * full / second)
        assert a.tobytes() == a_full.tobytes() and t == t_full


def test_truncation_bounds_stated_in_the_docs():
    """Issue 42.12 and 42.11: docs/skeletons.md states each truncated series' cut degree, its
    dropped mass t (the sampler's) and the error of the dual (the kernel's); recompute every row,
    check the stated dual error against the closed forms where there are some (arccos 2 and 3,
    relu, step, abs), and that kinked and jumping duals are within 1e-8."""
    from conftest import ROOT

    text = (ROOT / "docs" / "skeletons.md").read_text()
    rows = re.findall(r"^\| `(\w+)`(?:, (?:degree (\d)|alpha = ([\d.]+)|`expr: \"([^\"]+)\"`)[^|]*)? \| (\d+) \| ([\d.e-]+) \| ([\d.e-]+) \|$",
                      text, re.M)
    assert len(rows) == 11, rows
    closed = {("arccos", "2"): lambda r: arccos_dual(2, r), ("arccos", "3"): lambda r: arccos_dual(3, r),
              ("abs", ""): _abs_closed,
              ("function", "maximum(x, 0)"): make_activation("relu").dual,
              ("function", "heaviside(x, 0.5)"): make_activation("step").dual}
    for name, degree, alpha, expr, cut, t, err in rows:
        params = {"degree": int(degree)} if degree else {"alpha": float(alpha)} if alpha else {"expr": expr} if expr else {}
        act = make_activation(name, params)
        assert act.coefficients.size - 1 == int(cut) and f"{act.truncation:.2g}" == t, (name, params)
        assert f"{act.dual_error:.2g}" == err, (name, params, act.dual_error)
        assert float(err) <= max(1e-8, 2 * act.truncation / (1 - act.truncation) + 1e-15)
        ref = closed.get((name, degree or expr))
        if ref is not None:
            assert np.abs(act.dual(RHO) - ref(RHO)).max() <= max(float(err), 1e-13), (name, params)


# --------------------------------------------------------------------------- issue 42.11: exact duals
from rfsgen import duals as _D  # noqa: E402

EDGE_RHO = np.concatenate([np.linspace(-1, 1, 401), 1 - np.logspace(-12, -1, 23), -1 + np.logspace(-12, -1, 23)])


def _abs_closed(r):
    return (2 / math.pi) * (np.sqrt(1 - r * r) + r * np.arcsin(r))


@pytest.mark.parametrize("name, params, exact", [
    ("function", {"expr": "maximum(x, 0)"}, lambda r: make_activation("relu").dual(r)),
    ("function", {"expr": "abs(x)"}, _abs_closed),
    ("abs", {}, _abs_closed),
    ("function", {"expr": "heaviside(x, 1)"}, lambda r: make_activation("step").dual(r)),
    ("function", {"expr": "sign(x)"}, lambda r: 2 * np.arcsin(r) / math.pi),
    ("function", {"expr": "maximum(x, 0.1 * x)"}, lambda r: make_activation("leaky_relu", {"slope": 0.1}).dual(r)),
    ("arccos", {"degree": 2}, lambda r: arccos_dual(2, r)),
    ("arccos", {"degree": 3}, lambda r: arccos_dual(3, r)),
])
def test_kinked_and_jumping_duals_are_exact_to_1e_8(name, params, exact):
    """Issue 42.11: the dual of a function with kinks or jumps is within 1e-8 of its closed form
    uniformly on [-1, 1] (ends included), and so is 1 - dual from delta; the stated bound
    (dual_error) is below 1e-8 too, while the sampler's table still drops its tail."""
    act = make_activation(name, params)
    ref = exact(EDGE_RHO)
    assert np.abs(act.dual(EDGE_RHO) - ref).max() < 1e-8
    assert np.abs(act.gap(EDGE_RHO, 1 - EDGE_RHO) - (1 - ref)).max() < 1e-8
    assert act.dual_error < 1e-8
    assert act.dual(np.ones(1))[0] == pytest.approx(1.0, abs=1e-14)


def _shifted_relu_reference(t, rho):
    """E[(X - t)_+ (Y - t)_+] / E[(X - t)_+^2] for correlation rho: a 1-D adaptive integral over x
    of the closed-form conditional mean E[(rho x + s W - t)_+], independent of rfsgen.duals."""
    from scipy import integrate

    s = math.sqrt(1 - rho * rho)

    def inner(x):
        mu = rho * x - t
        if s == 0:
            return max(mu, 0.0)
        u = mu / s
        return s * stats.norm.pdf(u) + mu * stats.norm.cdf(u)

    num = integrate.quad(lambda x: (x - t) * stats.norm.pdf(x) * inner(x), t, 40, epsabs=1e-15, epsrel=1e-13, limit=200)[0]
    den = (1 + t * t) * stats.norm.sf(t) - t * stats.norm.pdf(t)  # E[(Z - t)_+^2]
    return num / den


@pytest.mark.parametrize("t", [0.5, 1 / 3, -0.7])
def test_shifted_kinks_match_direct_integration(t):
    act = make_activation("function", {"expr": f"maximum(x - {t!r}, 0)"})
    rho = np.array([-1.0, -0.999, -0.5, 0.0, 0.6, 0.99, 0.9999, 1.0])
    ref = np.array([_shifted_relu_reference(t, r) for r in rho])
    assert np.abs(act.dual(rho) - ref).max() < 1e-8
    assert act.truncation > 1e-7  # the table alone would miss that much


def _elu_reference(alpha, rho):
    """E[f(X) f(Y)] / E[f(X)^2] for elu: a 1-D adaptive integral over x of the closed-form
    conditional mean E[f(rho x + s W)] (Y ~ N(mu, s^2): E[Y_+] + alpha (E[e^Y; Y <= 0] - P(Y <= 0)))."""
    from scipy import integrate

    s = math.sqrt(1 - rho * rho)
    f = lambda v: v if v > 0 else alpha * math.expm1(v)  # noqa: E731

    def inner(x):
        mu = rho * x
        pos = s * stats.norm.pdf(mu / s) + mu * stats.norm.cdf(mu / s)
        neg = math.exp(mu + s * s / 2) * stats.norm.cdf((-mu - s * s) / s) - stats.norm.cdf(-mu / s)
        return pos + alpha * neg

    g = lambda x: f(x) * stats.norm.pdf(x) * inner(x)  # noqa: E731
    num = sum(integrate.quad(g, lo, hi, epsabs=1e-15, epsrel=1e-13, limit=200)[0] for lo, hi in ((-40, 0), (0, 40)))
    den = sum(integrate.quad(lambda x: f(x) ** 2 * stats.norm.pdf(x), lo, hi, epsabs=1e-14, epsrel=1e-13)[0]
              for lo, hi in ((-40, 0), (0, 40)))
    return num / den


@pytest.mark.parametrize("alpha", [0.5, 2.0])
def test_elu_dual_matches_direct_integration(alpha):
    act = make_activation("elu", {"alpha": alpha})
    for rho in (-0.99, -0.9, 0.5, 0.97, 0.999):
        assert abs(act.dual(np.array([rho]))[0] - _elu_reference(alpha, rho)) < 1e-8, rho
    assert act.dual_error < 1e-8 and act.truncation > 1e-7


def test_pair_sums_match_direct_integration():
    """The Mehler pair sums of singular pieces of different orders and points (rfsgen.duals)."""
    from scipy import integrate

    for a, n, b, m_, rho in [(0.5, 1, -0.3, 0, 0.9), (0.2, 2, 0.7, 1, -0.8), (-0.4, 3, 0.1, 1, 0.3)]:
        s = math.sqrt(1 - rho * rho)

        def f(w, x):
            y = rho * x + s * w
            return (x - a) ** n / math.factorial(n) * (y - b) ** m_ / math.factorial(m_) * stats.norm.pdf(x) * stats.norm.pdf(w)

        ref = integrate.dblquad(f, a, 12, lambda x: (b - rho * x) / s, lambda x: 12, epsabs=1e-13, epsrel=1e-13)[0]
        assert abs(_D.pair_sum(a, n, b, m_, np.array([rho]))[0] - ref) < 1e-12


def test_breakpoints_of_expressions():
    from rfsgen.expression import breakpoints

    cases = {"maximum(x, 0)": [0.0], "maximum(x - 0.5, 0)": [0.5], "tanh(x) + x": [], "clip(x, -1, 2) * x": [-1.0, 2.0],
             "where(x > 0.25, x, 0.1 * x)": [0.25], "heaviside(x, 0.5) + abs(x + 1)": [-1.0, 0.0]}
    for expr, want in cases.items():
        got = breakpoints(compile_expression(expr), _D.REACH)
        assert len(got) == len(want) and np.allclose(got, want, atol=1e-15), (expr, got)


def test_smooth_and_kinked_at_zero_tables_keep_their_bits():
    """The sampler's tables of expressions and activations whose breakpoints lie on the grid's
    panel boundaries (0 here) are those of the plain projection, bit for bit."""
    for expr in ["maximum(x, 0)", "heaviside(x, 0.5)", "where(x > 0, x, 0.5 * expm1(x))", "tanh(x) + 0.3 * x"]:
        fn = compile_expression(expr)
        a, t = _A.project(fn, expr)
        act = make_activation("function", {"expr": expr})
        ref = _A._series_activation("function", (), a, truncation=t)
        assert act.coefficients.tobytes() == ref.coefficients.tobytes(), expr
