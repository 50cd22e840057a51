import json

import numpy as np
import pytest

from conftest import DATA, SKELETONS, SMALL_SKELETONS, load_shipped, rows_for, skeleton_path
from rfsgen import DataError, InputError, kernel, load_skeleton, parse_skeleton

ALL = [(p.stem, lambda p=p: load_shipped(p)) for p in sorted(SKELETONS.glob("*.yaml"))] + [
    (k, lambda k=k, v=v: parse_skeleton(v, k)) for k, v in SMALL_SKELETONS.items()
]


def test_golden_values_from_an_independent_implementation(cifar_rows):
    golden = json.loads((DATA / "golden-cifar-kernels.json").read_text())
    np.testing.assert_allclose(cifar_rows[:6, :4], golden["rows_first_values"], atol=1e-12)
    for name in ("shallow-gaussian", "cifar-deep"):
        k = kernel(load_skeleton(skeleton_path(name)), cifar_rows[:6])
        np.testing.assert_allclose(k, golden[name], atol=1e-12, rtol=0)


def test_shallow_is_gaussian_on_normalized_rows(cifar_rows):
    s = load_skeleton(skeleton_path("shallow-gaussian"))
    rng = np.random.default_rng(0)
    for x in (cifar_rows[:40], rng.standard_normal((30, 1728)) * 3):
        xn = x / np.linalg.norm(x, axis=1, keepdims=True)
        exact = np.exp((xn @ xn.T - 1) / 4)
        np.testing.assert_allclose(kernel(s, x), exact, atol=1e-12, rtol=0)
        # and the cross kernel
        np.testing.assert_allclose(kernel(s, x[:5], x[5:9]), exact[:5, 5:9], atol=1e-12, rtol=0)


@pytest.mark.parametrize("name, make", ALL, ids=[a[0] for a in ALL])
def test_normalized_symmetric_psd(name, make):
    s = make()
    x = rows_for(s, 40, seed=3)
    k = kernel(s, x)
    if name == "brownian":  # not a normalized base: k1(u, u) = u (1 - u) <= 1/4
        assert (np.diag(k) <= 1.0).all() and (np.diag(k) > 0).all()
    else:
        np.testing.assert_allclose(np.diag(k), 1.0, atol=1e-12)
    assert np.array_equal(k, k.T)
    assert np.linalg.eigvalsh(k).min() >= -1e-10


def test_identity_activation_is_mean_of_base_kernels():
    s = parse_skeleton("""
rfsgen: 1
input: {width: 3}
nodes:
  - {name: c, base: circle, scale: 0.5, columns: [0]}
  - {name: g, base: gaussian, scale: 0.7, columns: "1:3"}
  - {name: out, activation: identity, inputs: [c, g]}
""")
    x = np.random.default_rng(1).standard_normal((12, 3))
    kc = np.cos(0.5 * (x[:, None, 0] - x[None, :, 0]))
    d2 = ((x[:, None, 1:] - x[None, :, 1:]) ** 2).sum(-1)
    kg = np.exp(-0.49 * d2 / 2)
    np.testing.assert_allclose(kernel(s, x), (kc + kg) / 2, atol=1e-13)


def test_cifar_deep_matches_a_direct_recurrence(cifar_rows):
    """The paper's deep kernel written out with numpy windows, independent of the DAG code."""
    x = cifar_rows[:5].reshape(5, 24, 24, 3)
    p = x / np.linalg.norm(x, axis=3, keepdims=True)
    base = np.einsum("ahwc,bhwc->abhw", p, p)
    l1 = np.empty((5, 5, 10, 10))
    for r in range(10):
        for c in range(10):
            l1[:, :, r, c] = np.exp((base[:, :, 2 * r:2 * r + 5, 2 * c:2 * c + 5].mean((2, 3)) - 1) / 4)

    def relu(t):
        t = np.clip(t, -1, 1)
        return (np.sqrt(1 - t * t) + (np.pi - np.arccos(t)) * t) / np.pi

    l2 = np.empty((5, 5, 4, 4))
    for r in range(4):
        for c in range(4):
            l2[:, :, r, c] = relu(l1[:, :, 2 * r:2 * r + 4, 2 * c:2 * c + 4].mean((2, 3)))
    want = relu(l2.mean((2, 3)))
    np.testing.assert_allclose(kernel(load_skeleton(skeleton_path("cifar-deep")), cifar_rows[:5]), want, atol=1e-12)


def test_memory_blocks_do_not_change_the_result(cifar_rows):
    s = load_skeleton(skeleton_path("cifar-deep"))
    full = kernel(s, cifar_rows[:20])
    small = kernel(s, cifar_rows[:20], memory_bytes=1)  # one row per block
    np.testing.assert_allclose(full, small, atol=1e-14, rtol=0)  # BLAS blocking may change the last bit


def test_data_errors():
    s = load_skeleton(skeleton_path("shallow-gaussian"))
    x = np.ones((3, 1728))
    x[2, 17] = np.nan
    with pytest.raises(DataError, match=r"row 2, column 17: value is nan"):
        kernel(s, x)
    x[2, 17] = 0
    x[1] = 0
    with pytest.raises(DataError, match=r"row 1, node 'image': the vector is all zeros.*zero: uniform"):
        kernel(s, x)
    with pytest.raises(InputError, match="rows have 5 values but skeleton .* expects width 1728"):
        kernel(s, np.ones((2, 5)))
    cat = parse_skeleton(SMALL_SKELETONS["categorical"], "cat")
    with pytest.raises(DataError, match=r"row 0, node 'c\[1\]': value 4 is not an integer category in 0..3"):
        kernel(cat, np.array([[0, 4, 1, 2]], dtype=float))
    binary = parse_skeleton(SMALL_SKELETONS["binary"], "bin")
    with pytest.raises(DataError, match="not -1 or \\+1"):
        kernel(binary, np.zeros((1, 5)))


def test_zero_vector_fallback():
    s = parse_skeleton("""
rfsgen: 1
input: {width: 3}
nodes:
  - {name: s, base: sphere, zero: uniform}
  - {name: out, activation: relu, inputs: [s]}
""")
    k = kernel(s, np.array([[0.0, 0, 0], [1, 1, 1]]))
    np.testing.assert_allclose(k, 1.0)


def _stack(activation, layers, base="{name: c, base: circle, per: column}", width=6):
    nodes = "".join(f"  - {{name: h{i}, activation: {activation}, inputs: [{'c' if i == 0 else f'h{i - 1}'}]}}\n"
                    for i in range(layers))
    return parse_skeleton(f"rfsgen: 1\ninput: {{width: {width}}}\nnodes:\n  - {base}\n{nodes}")


@pytest.mark.parametrize("activation", ["step", "relu", "{name: exp, beta: 3}", "tanh", "{name: polynomial, degree: 7}"])
def test_k_x_x_is_one_through_deep_stacks(activation):
    """The issue's case: a circle input under 4 step layers gave k(x, x) = 0.977 (arcsin
    near 1 magnifies rounding).  The kernel carries delta = 1 - rho, so the diagonal
    is 1 to 1e-12 at every depth, and off-diagonal values agree with the plain
    recurrence where that one is accurate (rho far from 1)."""
    x = np.random.default_rng(0).standard_normal((12, 6))
    for layers in range(1, 9):
        K = kernel(_stack(activation, layers), x)
        np.testing.assert_allclose(np.diag(K), 1.0, rtol=0, atol=1e-12)
        assert np.all(K <= 1.0 + 1e-12) and np.all(K >= -1.0 - 1e-12)


def test_stable_kernel_agrees_with_the_plain_recurrence_away_from_one():
    s = _stack("step", 2)
    x = np.random.default_rng(1).standard_normal((10, 6)) * 3
    K = kernel(s, x)
    rho = np.mean([np.cos(x[:, None, c] - x[None, :, c]) for c in range(6)], axis=0)
    for _ in range(2):
        rho = 0.5 + np.arcsin(np.clip(rho, -1, 1)) / np.pi
    off = ~np.eye(10, dtype=bool) & (rho < 0.95)
    np.testing.assert_allclose(K[off], rho[off], atol=1e-12)


@pytest.mark.parametrize("scale", [1e-300, 1e-200, 1e150, 1e200, 1e300])
def test_kernel_of_rows_of_any_finite_magnitude(cifar_rows, scale):
    """Sphere inputs are scale-invariant: rows times 1e+-300 give the same kernel (the
    norms used to overflow: K = 0.368 where the answer is 1); Gaussian inputs near
    1e155 gave NaN; now exact on the diagonal and finite everywhere."""
    s = load_skeleton(skeleton_path("cifar-deep"))
    x = cifar_rows[:6]
    np.testing.assert_allclose(kernel(s, x * scale), kernel(s, x), rtol=0, atol=1e-14)
    g = parse_skeleton("rfsgen: 1\ninput: {width: 5}\nnodes:\n  - {name: g, base: gaussian, scale: 0.5}\n"
                       "  - {name: o, activation: step, inputs: [g]}\n")
    y = np.random.default_rng(2).standard_normal((5, 5)) * scale
    with np.errstate(invalid="raise", divide="raise"):  # no NaN-producing warnings either (the issue saw 'invalid value in subtract')
        K = kernel(g, y)
    assert np.isfinite(K).all()
    np.testing.assert_allclose(np.diag(K), 1.0, rtol=0, atol=1e-12)


def test_empty_inputs_give_empty_kernels():
    s = load_skeleton(skeleton_path("shallow-gaussian"))
    assert kernel(s, np.zeros((0, 1728))).shape == (0, 0)
    assert kernel(s, np.zeros((0, 1728)), np.ones((3, 1728))).shape == (0, 3)


@pytest.mark.parametrize("activation, value", [("step", 0.0), ("relu", 0.0)])
def test_opposite_rows_are_exact_too(activation, value):
    """k(x, -x) for a step (or relu) over a sphere node is 0: arcsin at a rho that rounds
    to -1 + 2^-53 gave 6.7e-9; the kernel also carries eps = 1 + rho."""
    s = parse_skeleton(f"rfsgen: 1\ninput: {{width: 5}}\nnodes:\n  - {{name: s, base: sphere}}\n"
                       f"  - {{name: o, activation: {activation}, inputs: [s]}}\n")
    x = np.random.default_rng(0).standard_normal((8, 5)) * 7
    K = kernel(s, np.concatenate([x, -x]))
    np.testing.assert_array_equal(np.diag(K[:8, 8:]), value)
    np.testing.assert_allclose(np.diag(K), 1.0, rtol=0, atol=1e-15)
