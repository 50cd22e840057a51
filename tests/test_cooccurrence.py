"""Co-occurrence of pixels in sampled features (the paper's Figure 4): uniform for a
flat kernel, tiered by shared windows for convolutional ones."""

import numpy as np
import pytest

from rfsgen import parse_skeleton, sample
from rfsgen.cooccurrence import cooccurrence, occurrence

HEAD = "rfsgen: 1\ninput: {shape: [12, 12, 1]}\nnodes:\n  - {name: px, base: gaussian, per: pixel}\n"
FLAT = HEAD + "  - {name: out, activation: relu, dense: true}\n"
DEEP = HEAD + ("  - {name: c1, activation: relu, conv: {size: 3, stride: 3}}\n"
               "  - {name: c2, activation: relu, conv: {size: 2, stride: 2}}\n"
               "  - {name: out, activation: relu, dense: true}\n")


def test_occurrence_matches_the_terms():
    fs = sample(parse_skeleton(DEEP), 300, seed=1)
    o = occurrence(fs)
    assert o.shape == (300, 144)
    for j in (0, 17, 299):
        want = sorted({fs.walk_skeleton.nodes[n].columns[0] for n, _, _ in fs.terms_of(j)})
        assert sorted(o[j].indices.tolist()) == want


def test_flat_kernel_correlations_are_uniform():
    c = cooccurrence(sample(parse_skeleton(FLAT), 20_000, seed=2))
    off = c[~np.eye(144, dtype=bool)]
    # Pixels are picked without regard to place, so every pair has the same correlation
    # (slightly positive: features with many terms hold many pixels).  With 2e4 features
    # one correlation's standard error is about 1/sqrt(2e4) = 0.007.
    assert off.std() < 0.012 and np.abs(off - off.mean()).max() < 0.06


def test_convolutional_kernels_show_locality_tiers():
    """Two relu conv layers (3x3/3, then 2x2/2 over the 4x4 grid): pixels in one first-layer
    window co-occur most, pixels sharing only a second-layer window less, others least."""
    c = cooccurrence(sample(parse_skeleton(DEEP), 20_000, seed=3))
    r, q = np.divmod(np.arange(144), 12)
    w1 = (r // 3) * 4 + q // 3  # first-layer window of each pixel (non-overlapping 3x3)
    w2 = (r // 6) * 2 + q // 6  # second-layer window (2x2 of the first layer's 4x4)
    same1 = w1[:, None] == w1[None, :]
    same2 = (w2[:, None] == w2[None, :]) & ~same1
    other = ~same1 & ~same2
    np.fill_diagonal(same1, False)
    t1, t2, t3 = c[same1].mean(), c[same2].mean(), c[other].mean()
    assert t1 > t2 + 0.05 and t2 > t3 + 0.02, (t1, t2, t3)
    # and each tier is level: a pair's tier, not its distance, sets its correlation
    for tier in (same1, same2, other):
        assert c[tier].std() < 0.03


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from rfsgen.cooccurrence import plot_cooccurrence

    plot_cooccurrence(sample(parse_skeleton(DEEP), 2000, seed=1), tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from rfsgen.cli import main
    from rfsgen.features import save

    save(sample(parse_skeleton(DEEP), 500, seed=1), tmp_path / "f.h5")
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "f.h5"), "--plot-cooccurrence", str(tmp_path / "c.png")])
    assert r.exit_code == 0 and (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "f.h5"), "--plot-cooccurrence", str(tmp_path / "c.png")])
    assert r.exit_code == 2 and "--overwrite" in r.output
    flat = parse_skeleton("rfsgen: 1\ninput: {width: 4}\nnodes:\n  - {name: x, base: circle, per: column}\n"
                          "  - {name: o, activation: relu, dense: true}\n")
    save(sample(flat, 50, seed=1), tmp_path / "g.h5")
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "g.h5"), "--plot-cooccurrence", str(tmp_path / "g.png")])
    assert r.exit_code == 2 and "need an image skeleton" in r.output and not (tmp_path / "g.png").exists()
