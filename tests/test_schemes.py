"""rfsgen.schemes: ``--scheme orf`` on ``gaussian`` input nodes over raw inputs (issue 25,
the seed 002's ORF baseline), beside the exp-over-sphere rewrite tested in test_approx.py."""

import math

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from rfsgen import kernel, parse_skeleton, sample, transform
from rfsgen.cli import main
from rfsgen.errors import UsageError
from rfsgen.features import load, save
from rfsgen.schemes import apply_scheme, gaussian_nodes, rr_nodes


def gaussian(d, scale=0.8):
    return parse_skeleton(f"rfsgen: 1\ninput: {{width: {d}}}\nnodes:\n  - {{name: x, base: gaussian, scale: {scale}}}\n",
                          "gaussian.yaml")


COMPOSED = """rfsgen: 1
input: {width: 6}
nodes:
  - {name: a, base: gaussian, scale: 0.5, columns: '0:3'}
  - {name: b, base: gaussian, scale: 0.5, columns: '3:6'}
  - {name: out, activation: {name: exp, beta: 0.7}, inputs: [a, b]}
output: out
"""

MIXED = """rfsgen: 1
input: {width: 6}
nodes:
  - {name: v, base: sphere, columns: '0:3'}
  - {name: g, base: gaussian, columns: '3:6'}
  - {name: e, activation: {name: exp, beta: 1.0}, inputs: [v]}
  - {name: out, activation: {name: coefficients, values: [0, 0.5, 0.5]}, inputs: [e, g]}
output: out
"""


def gram(fs, x):
    z = transform(fs, x, layout="dense", dtype="float64")
    return z @ z.T


def test_orf_gaussian_node_is_unbiased_and_no_worse_than_rks():
    """200 seeds, D = 64, d = 4, 8 rows.  Unbiased: every off-diagonal entry's mean within
    4 standard errors of the exact Gaussian kernel; the diagonal exact (whole [cos, sin]
    pairs: cos^2 + sin^2 = 1) to 1e-12.  Variance: the mean squared error of orf at most
    that of the default scheme (Rahimi-Recht's iid N(0, I) frequencies with a random phase, cos or sin,
    'rks') at the same D (measured: 0.0080 against 0.0146)."""
    s = gaussian(4)
    x = np.random.default_rng(0).normal(size=(8, 4))
    exact = kernel(s, x)
    off = ~np.eye(8, dtype=bool)
    mse = {}
    for scheme in ("rfs", "orf"):
        g = np.array([gram(sample(s, 64, seed=k, scheme=scheme), x) for k in range(200)])
        mean, se = g.mean(0), g.std(0, ddof=1) / math.sqrt(len(g))
        assert np.all(np.abs(mean - exact)[off] <= 4 * se[off] + 1e-12), scheme
        mse[scheme] = float(np.mean((g - exact)[:, off] ** 2))
        if scheme == "orf":
            np.testing.assert_allclose(np.diagonal(g, axis1=1, axis2=2), 1.0, rtol=0, atol=1e-12)
    assert mse["orf"] <= mse["rfs"], mse


def test_orf_gaussian_frequencies_are_orthogonal_blocks_with_chi_norms():
    """Frequencies come in blocks of d mutually orthogonal rows (Q of a Haar QR), each row's
    norm an independent chi(d) (so each row is marginally N(0, I)); the columns are [cos, sin]
    pairs of one frequency, the two halves sharing it."""
    from scipy import stats

    d, blocks = 5, 120
    fs = sample(gaussian(d), 2 * d * blocks, seed=7, scheme="orf")
    assert fs.columns == 2 * d * blocks and np.array_equal(fs.kind, np.tile([1, 2], d * blocks))
    om = fs.omega.reshape(-1, d)
    assert np.array_equal(om[0::2], om[1::2])
    w = om[0::2].reshape(blocks, d, d)
    norms = np.linalg.norm(w, axis=2)
    u = w / norms[:, :, None]
    assert np.abs(u @ u.transpose(0, 2, 1) - np.eye(d)).max() < 1e-12
    assert stats.kstest(norms.ravel(), stats.chi(d).cdf).pvalue > 1e-3
    # the directions are uniform: the first coordinate of a uniform unit vector in R^d has
    # mean 0 and variance 1 / d
    assert abs(u[:, :, 0].mean()) < 4 / math.sqrt(d * blocks * d)
    assert abs(u[:, :, 0].var() - 1 / d) < 0.03


def test_orf_gaussian_is_reproducible(tmp_path):
    """Same seed: the same bytes on 1 or 2 threads, and after save / load the same values;
    another seed: other frequencies."""
    s = gaussian(6, scale=1.3)
    a = sample(s, 301, seed=11, scheme="orf", threads=1)
    b = sample(s, 301, seed=11, scheme="orf", threads=2)
    assert a.columns == 302  # whole pairs: an odd -n gives -n + 1 columns
    for f in ("omega", "kind", "count", "ptr", "node", "code", "power"):
        assert getattr(a, f).tobytes() == getattr(b, f).tobytes(), f
    assert a.draws == b.draws
    c = sample(s, 301, seed=12, scheme="orf")
    assert not np.array_equal(a.omega, c.omega)
    save(a, tmp_path / "f.h5")
    back = load(tmp_path / "f.h5")
    assert back.scheme == "orf"
    x = np.random.default_rng(1).normal(size=(17, 6))
    assert transform(back, x, layout="dense").tobytes() == transform(a, x, layout="dense").tobytes()


def test_orf_on_composed_gaussian_nodes_keeps_the_kernel():
    """Gaussian nodes under an internal node: the rewrite flags them orthogonal and changes
    nothing else (same exact kernel); the sample is unbiased on average."""
    s = parse_skeleton(COMPOSED, "composed.yaml")
    assert rr_nodes(s) == [] and gaussian_nodes(s) == [0, 1]
    w = apply_scheme(s, "orf")
    assert [n.base.param("orthogonal") for n in w.nodes[:2]] == [True, True]
    assert [n.base.param("orthogonal") for n in s.nodes[:2]] == [False, False]
    x = np.random.default_rng(2).normal(size=(5, 6))
    np.testing.assert_array_equal(kernel(w, x), kernel(s, x))
    g = np.mean([gram(sample(s, 256, seed=k, scheme="orf"), x) for k in range(40)], axis=0)
    np.testing.assert_allclose(g, kernel(s, x), atol=0.06)


def test_orf_on_a_skeleton_with_exp_over_sphere_is_unchanged():
    """A skeleton that has exp-over-sphere nodes is rewritten as before: its other gaussian
    nodes keep iid frequencies (files sampled before the extension keep their bytes)."""
    s = parse_skeleton(MIXED, "mixed.yaml")
    w = apply_scheme(s, "orf")
    g = [n for n in w.input_nodes if n.label == "g"][0]
    assert g.base.param("orthogonal") is False
    assert any(n.base.param("orthogonal") for n in w.input_nodes if n.base.name == "gaussian" and n.label != "g")


@settings(max_examples=12, derandomize=True, deadline=None)
@given(base=st.sampled_from(["laplace", "circle", "binary", "sphere", "brownian"]), width=st.integers(2, 4))
def test_orf_without_a_gaussian_kernel_is_a_one_line_error(base, width):
    per = ", per: column" if base in ("circle", "binary") else ""
    extra = ", domain: [0, 1]" if base == "brownian" else ""
    s = parse_skeleton(f"rfsgen: 1\ninput: {{width: {width}}}\nnodes:\n  - {{name: x, base: {base}{per}{extra}}}\n"
                       + ("  - {name: out, activation: {name: coefficients, values: [0, 1]}, inputs: [x]}\n"
                          if per else ""), "no-gaussian.yaml")
    with pytest.raises(UsageError) as e:
        sample(s, 8, seed=0, scheme="orf")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("scheme 'orf' applies to no node of 'no-gaussian.yaml'") and "use --scheme rfs" in msg


def test_orf_error_from_the_command_line(tmp_path):
    sk = tmp_path / "lap.yaml"
    sk.write_text("rfsgen: 1\ninput: {width: 3}\nnodes:\n  - {name: x, base: laplace}\n")
    res = CliRunner().invoke(main, ["sample", str(sk), "-n", "8", "--scheme", "orf", "-o", str(tmp_path / "f.h5")])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        f"rfsgen: error: scheme 'orf' applies to no node of '{sk}': it needs a gaussian input node or an exp node "
        "whose inputs are all sphere input nodes (a Gaussian kernel); use --scheme rfs"]
    ok = tmp_path / "g.yaml"
    ok.write_text("rfsgen: 1\ninput: {width: 3}\nnodes:\n  - {name: x, base: gaussian, scale: 2}\n")
    res = CliRunner().invoke(main, ["sample", str(ok), "-n", "8", "--scheme", "orf", "-o", str(tmp_path / "g.h5")])
    assert res.exit_code == 0, res.stderr
    assert load(tmp_path / "g.h5").columns == 8
