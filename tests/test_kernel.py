import json

import numpy as np
import pytest

from conftest import DATA, SKELETONS, SMALL_SKELETONS, rows_for, skeleton_path
from rfsgen import DataError, InputError, kernel, load_skeleton, parse_skeleton

ALL = [(p.stem, lambda p=p: load_skeleton(p)) for p in sorted(SKELETONS.glob("*.yaml"))] + [
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
