"""Scheme ``exact`` (issue 28, build item 2): degrees 0 and 1 enumerated with exact
probabilities as float column weights, the rest sampled conditionally."""

import math

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import SMALL_SKELETONS, rows_for, skeleton_path
from rfsgen import SamplerError, kernel, load_skeleton, parse_skeleton, transform
from rfsgen.cli import main
from rfsgen.exact import degree_probabilities, plan
from rfsgen.features import load, save
from rfsgen.sampler import _block_rng, _tables, _walk, sample

EXTRA = {
    "polynomial": """
rfsgen: 1
input: {width: 4}
nodes:
  - {name: c, base: circle, scale: 0.8, per: column}
  - {name: h, activation: {name: polynomial, degree: 3, c: 1.0}, inputs: [c]}
  - {name: out, activation: {name: exp, beta: 1.2}, inputs: [h, "c[0]"]}
""",
    "step-deep": """
rfsgen: 1
input: {width: 4}
nodes:
  - {name: c, base: circle, scale: 0.6, columns: [0, 1], per: column}
  - {name: b, base: binary, columns: [2, 3], per: column}
  - {name: h, activation: relu, inputs: [c, "b[0]"]}
  - {name: out, activation: step, inputs: [h, c, "b[1]"]}
""",
    "categorical-mixed": """
rfsgen: 1
input: {width: 4}
nodes:
  - {name: c, base: categorical, categories: 5, columns: [0, 1], per: column}
  - {name: d, base: categorical, categories: 4, columns: [2, 3], per: column}
  - {name: out, activation: relu, inputs: [c, d]}
""",
    "identity": """
rfsgen: 1
input: {width: 2}
nodes:
  - {name: c, base: circle, per: column}
  - {name: out, activation: identity, inputs: [c]}
""",
}


def skel(name):
    if name in SMALL_SKELETONS:
        return parse_skeleton(SMALL_SKELETONS[name], name)
    if name in EXTRA:
        return parse_skeleton(EXTRA[name], name)
    return load_skeleton(skeleton_path(name))


def rows(s, n=4, cifar_rows=None):
    return cifar_rows[:n] if s.width == 1728 else rows_for(s, n, seed=5)


ALL = ["shallow-gaussian", "cifar-deep", "tabular-circle", "categorical-poly", "relu-deep", "binary", "categorical",
       "circle-step", "gauss-laplace", "sphere-coordinate", "brownian", "polynomial", "step-deep", "categorical-mixed"]


def test_shallow_probabilities_are_poisson():
    """shallow-gaussian: exp(1/4) over one sphere node, so P0 = e^-1/4 and P1 = e^-1/4 / 4
    (to 1e-9: the table is the Poisson law truncated at a tail of 1e-9 and renormalised)."""
    s = skel("shallow-gaussian")
    p0, p1 = degree_probabilities(s, _tables(s))
    assert p0 == pytest.approx(math.exp(-0.25), abs=1e-9)
    assert p1.sum() == pytest.approx(0.25 * math.exp(-0.25), abs=1e-9)


@pytest.mark.parametrize("name", ALL)
def test_degree_probabilities_match_the_walk(name):
    """P(no factor) and P(one factor at node u) against 2^16 walked draws: within 5
    binomial standard errors (+1e-9) per node."""
    s = skel(name)
    t = _tables(s)
    p0, p1 = degree_probabilities(s, t)
    n = 1 << 16
    b = _walk(s, t, _block_rng(7, 0), n, track_single=True)
    mc0 = float((b.factors == 0).mean())
    assert abs(mc0 - p0) <= 5 * math.sqrt(p0 * (1 - p0) / n) + 1e-9, (mc0, p0)
    mc1 = np.bincount(b.single[b.single >= 0], minlength=len(s.nodes)) / n
    se = np.sqrt(p1 * (1 - p1) / n)
    assert np.all(np.abs(mc1 - p1) <= 5 * se + 1e-9), (mc1, p1)


@pytest.mark.parametrize("name", ALL)
def test_enumerated_columns_are_the_low_degree_kernel_exactly(name, cifar_rows):
    """The enumerated columns' weighted Gram is P0 + sum_u P1(u) k_u(x, x') to 1e-12, for
    every base with finitely many codes (gaussian, laplace, brownian nodes are not enumerated)."""
    s = skel(name)
    t = _tables(s)
    x = rows(s, 4, cifar_rows)
    p0, p1 = degree_probabilities(s, t)
    pl = plan(s, t, 10**6)
    assert pl.degrees == 1
    want = np.full((4, 4), p0)
    for base, ids, _ in s.input_groups:
        if not pl.enumerable[ids].any():
            continue
        cols = np.array([s.nodes[i].columns for i in ids])
        xp = base.prepare(x[:, cols], [s.nodes[i].label for i in ids], 0, "<test>")
        rho = base.gram(xp, xp)[0]
        want += np.tensordot(p1[ids], rho, axes=1)
    fs = _enumerated_featureset(s, pl)
    z = transform(fs, x, layout="dense", dtype="float64")
    np.testing.assert_allclose(z @ z.T, want, rtol=0, atol=1e-12)
    assert pl.weight.sum() + pl.p_high == pytest.approx(1.0, abs=1e-9)


def _enumerated_featureset(s, pl):
    from rfsgen.features import FeatureSet

    b = pl.batch
    fs = FeatureSet(skeleton=s, scheme="exact", seed=0, draws=pl.columns, count=np.ones(pl.columns, np.int64),
                    kind=b.kind, ptr=b.ptr, node=b.node, code=b.code, power=b.power, omega=np.zeros(0))
    fs.column_weight = pl.weight.copy()
    return fs


def _mean_gram(s, x, D, seeds):
    est = []
    for seed in range(seeds):
        z = transform(sample(s, D, seed, scheme="exact"), x, layout="dense", dtype="float64")
        est.append(z @ z.T)
    return np.array(est)


@pytest.mark.slow
@pytest.mark.parametrize("name, D", [("shallow-gaussian", 300), ("cifar-deep", 300), ("tabular-circle", 200),
                                     ("categorical-poly", 200), ("relu-deep", 200), ("binary", 24),
                                     ("categorical", 60), ("circle-step", 200), ("gauss-laplace", 200),
                                     ("sphere-coordinate", 20), ("polynomial", 200), ("step-deep", 200),
                                     ("categorical-mixed", 120)])
def test_exact_scheme_is_unbiased_over_seeds(name, D, cifar_rows):
    """Mean over 100 seeds within 4 standard errors (+1e-9: the exp table's truncation and
    the tail activations' numerical derivative) of the exact kernel, off the diagonal and on it."""
    s = skel(name)
    x = rows(s, 4, cifar_rows)
    exact = kernel(s, x)
    est = _mean_gram(s, x, D, 100)
    mean, se = est.mean(0), est.std(0, ddof=1) / math.sqrt(len(est))
    iu = np.triu_indices(4, 1)
    assert np.all(np.abs(mean - exact)[iu] <= 4 * se[iu] + 1e-9), (mean[iu], exact[iu], se[iu])
    np.testing.assert_allclose(np.diag(mean), 1.0, atol=1e-9 + 4 * se.diagonal().max())


def test_wide_inputs_take_a_pps_subset_of_degree_one():
    """cifar-deep has 1,587 degree-1 columns: at D = 1024 the constant and 511 of them
    (systematic PPS, weights divided by inclusion probabilities) fill half of D; over 1000
    generators the subset's Gram averages to the full low-degree Gram (4 standard errors),
    and its weights always add up to the full ones."""
    from rfsgen.exact import _pps

    s = skel("cifar-deep")
    t = _tables(s)
    full = plan(s, t, 10**6)
    assert full.columns == 1588
    pl = plan(s, t, 1024, 5)
    assert pl.degrees == 1 and pl.columns == 512 and pl.enumerable_columns == 1588
    assert pl.weight.sum() == pytest.approx(full.weight.sum(), abs=1e-12)
    x = rows_for(s, 3, seed=2)
    fs = _enumerated_featureset(s, full)
    fs.column_weight = np.ones(full.columns)
    z = transform(fs, x, layout="dense", dtype="float64")  # unweighted column values
    want = (z * full.weight) @ z.T
    grams = []
    for seed in range(1000):
        pick, w = _pps(full.weight[1:], 511, np.random.default_rng(seed))
        assert pick.size == 511 and w.sum() == pytest.approx(full.weight[1:].sum(), abs=1e-12)
        zz = z[:, np.concatenate(([0], 1 + pick))]
        grams.append((zz * np.concatenate((full.weight[:1], w))) @ zz.T)
    grams = np.array(grams)
    mean, se = grams.mean(0), grams.std(0, ddof=1) / math.sqrt(len(grams))
    assert np.all(np.abs(mean - want) <= 4 * se + 1e-12), (mean, want, se)
    fs = sample(s, 1024, 3, scheme="exact")
    assert fs.columns == 1024 and fs.stats["exact_columns"] == 512


def _gram(s, pl, x):
    z = transform(_enumerated_featureset(s, pl), x, layout="dense", dtype="float64")
    return z @ z.T


@pytest.mark.parametrize("D, degrees", [(1, -1), (2, 0), (3, 0), (38, 1)])
def test_small_budgets_enumerate_less(D, degrees):
    """tabular-circle: 17 low-degree columns (the constant, cos and sin of 8 circles).  D = 1
    enumerates nothing (the scheme is strat); D = 2, 3 the constant only (a PPS subset needs
    two columns of room); from D = 34 all of degree 0 and 1."""
    s = skel("tabular-circle")
    fs = sample(s, D, 1, scheme="exact")
    assert fs.columns == D and fs.stats["exact_degrees"] == degrees
    assert fs.weight.sum() == pytest.approx(1.0, abs=1e-9)


def test_a_skeleton_whose_features_are_all_enumerated():
    """identity over two circles: every feature has degree 1 (cos and sin of each circle, 4
    columns; the constant has weight 0 and is not listed).  With D = 8 they fit in half of D
    and nothing is left to sample: a one-line SamplerError at once.  With D = 4 they do not
    fit: degree 1 is sampled (strat), and the 4 columns are found."""
    s = skel("identity")
    with pytest.raises(SamplerError, match="has only 4 distinct features .*ask for at most 4"):
        sample(s, 8, 0, scheme="exact")
    fs = sample(s, 4, 0, scheme="exact")
    assert fs.columns == 4 and fs.stats["exact_degrees"] == 0 and fs.stats["exact_columns"] == 0


@settings(max_examples=12, deadline=None, derandomize=True)
@given(name=st.sampled_from(["tabular-circle", "categorical-mixed", "relu-deep", "gauss-laplace", "polynomial"]),
       D=st.integers(1, 80), seed=st.integers(0, 2**63 - 1))
def test_any_budget_and_seed_gives_d_columns_and_weights_summing_to_one(name, D, seed):
    s = skel(name)
    try:
        fs = sample(s, D, seed, scheme="exact")
    except SamplerError as e:  # only where the skeleton has fewer distinct features
        assert "\n" not in str(e) and "ask for at most" in str(e)
        return
    assert fs.columns == D
    w = fs.weight
    assert np.all(w >= 0) and np.isfinite(w).all()
    assert w.sum() == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("name, D", [("cifar-deep", 2048), ("tabular-circle", 300), ("gauss-laplace", 100)])
def test_bytes_do_not_depend_on_threads_and_weights_survive_save_load(tmp_path, name, D, cifar_rows):
    s = skel(name)
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    fa = sample(s, D, 11, scheme="exact", threads=1)
    save(fa, a)
    save(sample(s, D, 11, scheme="exact", threads=3), b)
    assert a.read_bytes() == b.read_bytes()
    back = load(a)
    assert back.scheme == "exact" and back.column_weight.tobytes() == fa.column_weight.tobytes()
    x = rows(s, 5, cifar_rows)
    assert transform(back, x, layout="dense").tobytes() == transform(fa, x, layout="dense").tobytes()
    assert fa.stats["exact_degrees"] == 1


def run(args, cwd):
    import os

    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    finally:
        os.chdir(old)


def test_cli_sample_transform_merge(tmp_path):
    """rfsgen sample --scheme exact; the transform applies the weights; shards merge to the
    unsharded output byte for byte."""
    x = np.random.default_rng(0).standard_normal((37, 8))
    np.save(tmp_path / "x.npy", x)
    r = run(["sample", skeleton_path("tabular-circle"), "-n", 200, "--scheme", "exact", "-o", "f.h5", "-q"], tmp_path)
    assert r.exit_code == 0, r.output
    fs = load(tmp_path / "f.h5")
    assert fs.column_weight is not None and fs.stats["exact_degrees"] == 1
    assert run(["transform", "f.h5", "x.npy", "-o", "all.h5", "-q", "--layout", "dense", "--dtype", "float64"],
               tmp_path).exit_code == 0
    import h5py

    with h5py.File(tmp_path / "all.h5") as f:
        np.testing.assert_array_equal(f["X"][...], transform(fs, x, layout="dense", dtype="float64"))
    parts = []
    for k in range(3):
        assert run(["transform", "f.h5", "x.npy", "-o", f"p{k}.h5", "--shard", f"{k}/3", "-q", "--layout", "dense",
                    "--dtype", "float64"], tmp_path).exit_code == 0
        parts.append(f"p{k}.h5")
    assert run(["merge", *parts, "-o", "m.h5", "-q"], tmp_path).exit_code == 0
    assert (tmp_path / "m.h5").read_bytes() == (tmp_path / "all.h5").read_bytes()


def test_dask_transform_applies_the_weights():
    da = pytest.importorskip("dask.array")
    from rfsgen import dask as rd

    s = skel("tabular-circle")
    fs = sample(s, 150, 4, scheme="exact")
    x = np.random.default_rng(1).standard_normal((29, 8))
    got = rd.transform(fs, da.from_array(x, chunks=(7, 8))).compute(scheduler="sync")
    assert got.tobytes() == transform(fs, x, layout="dense").tobytes()


@pytest.mark.parametrize("args, code, message", [
    (["--scheme", "exakt"], 2, "Invalid value for '--scheme': 'exakt' is not one of"),
    (["--scheme", "exact", "--level", "3"], 2, "--level is for --scheme eof"),
    (["--scheme", "exact", "-n", "0"], 2, "-n must be an integer from 1 to"),
])
def test_cli_bad_options_are_one_line(tmp_path, args, code, message):
    base = ["sample", skeleton_path("tabular-circle"), "-o", "f.h5"]
    if "-n" not in args and "--level" not in args:
        base += ["-n", "10"]
    r = run(base + args, tmp_path)
    assert r.exit_code == code
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("rfsgen: error: ") and message in lines[0], r.output
    assert not (tmp_path / "f.h5").exists()


def test_cli_too_many_columns_for_an_enumerated_skeleton(tmp_path):
    (tmp_path / "s.yaml").write_text(EXTRA["identity"])
    r = run(["sample", "s.yaml", "-n", 8, "--scheme", "exact", "-o", "f.h5"], tmp_path)
    assert r.exit_code == 1
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "ask for at most" in lines[0], r.output


def test_the_docs_page_blocks_run(tmp_path, cifar_rows):
    """docs/exact-degrees.md: every sh block runs, in order, in a stand-in for the repository
    root after ``make demo`` (skeletons/, demo-output/rows.npy, .venv/bin/activate), as every
    docs page's blocks do in tests/test_readme.py (the page's first block activates and copies
    the demo's rows, as the other pages' do)."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    from conftest import ROOT

    blocks = re.findall(r"^```sh\n(.*?)^```", (ROOT / "docs" / "exact-degrees.md").read_text(), re.S | re.M)
    assert blocks
    from test_readme import _post_demo

    _post_demo(tmp_path)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    for body in blocks:
        res = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=600)
        assert res.returncode == 0, f"{body}\n--- stderr:\n{res.stderr[-3000:]}"


def test_a_node_with_too_many_single_factor_columns_is_sampled_not_listed():
    """Found by the fuzzer: a categorical node of 2^31 categories made the plan list 2^32
    columns (16 GiB).  Nodes are listed while their columns fit in MAX_LISTED, counted from
    the base's parameters first; the rest are sampled, as gaussian nodes are."""
    from rfsgen import exact
    from rfsgen.sampler import _tables

    text = ("rfsgen: 1\ninput: {width: 5}\nnodes:\n"
            "  - {name: big, base: categorical, per: column, categories: 2147483648}\n"
            "  - {name: small, base: circle, per: column, columns: '0:4'}\n"
            "  - {name: out, activation: erf, inputs: [big, small]}\n")
    s = parse_skeleton(text)
    t = _tables(s)
    p = exact.plan(s, t, 64, seed=1)
    big = [v.id for v in s.input_nodes if v.layer == "big"]
    small = [v.id for v in s.input_nodes if v.layer == "small"]
    assert not p.enumerable[big].any() and p.enumerable[small].all()
    fs = sample(s, 64, seed=424822871, scheme="exact")
    assert fs.columns == 64 and np.isfinite(fs.column_weight).all()


def test_listed_column_counts_come_from_the_parameters_exactly():
    """plan() bounds the listing by one_factor_count before anything is built: it must be
    the number of columns one_factor_columns then lists, for every base (None: not finite)."""
    from rfsgen.exact import one_factor_columns, one_factor_count

    s = parse_skeleton("""
rfsgen: 1
input: {width: 13}
nodes:
  - {name: c, base: circle, scale: 0.6, columns: [0]}
  - {name: b, base: binary, columns: [1]}
  - {name: k, base: categorical, categories: 7, columns: [2]}
  - {name: p, base: sphere, scheme: pair, columns: [3, 4, 5, 6]}
  - {name: q, base: sphere, scheme: coordinate, columns: [7, 8, 9]}
  - {name: g, base: gaussian, scale: 1.0, columns: [10, 11, 12]}
  - {name: out, activation: exp, inputs: [c, b, k, p, q, g]}
""")
    bases = {v.label: v.base for v in s.nodes if hasattr(v, "base")}
    assert set(bases) >= {"c", "b", "k", "p", "q", "g"}
    for label, base in bases.items():
        table = one_factor_columns(base)
        assert one_factor_count(base) == (None if table is None else table[0].size), label


# Issue 37 item 9: exact counted the columns it kept (a subset of half of D), not the
# features.  Skeletons whose draws have degree 0 or 1 only have every feature listed.
THREE_BINARY = """
rfsgen: 1
input: {width: 3}
nodes:
  - {name: a, base: binary, columns: [0]}
  - {name: b, base: binary, columns: [1]}
  - {name: c, base: binary, columns: [2]}
  - {name: out, activation: {name: coefficients, values: [0.5, 0.5]}, inputs: [a, b, c]}
"""


def test_three_binary_inputs_have_four_exact_features(tmp_path):
    """The issue's example: the constant and x_a, x_b, x_c.  -n 4 was refused ("has only
    2"), -n 6 said 3; now -n 4 lists all four with their exact weights (the kernel
    itself), and -n 5, 6 are refused at once with the true number."""
    (tmp_path / "s.yaml").write_text(THREE_BINARY)
    r = run(["sample", "s.yaml", "-n", 4, "--scheme", "exact", "-o", "f.h5", "-q"], tmp_path)
    assert r.exit_code == 0, r.output
    fs = load(tmp_path / "f.h5")
    assert fs.columns == 4 and fs.stats["exact_columns"] == 4
    x = np.array([[1.0, -1, 1], [1, 1, -1], [-1, -1, -1]])
    z = transform(fs, x, layout="dense", dtype="float64")
    np.testing.assert_allclose(z @ z.T, kernel(fs.skeleton, x), atol=1e-12)
    for n in (5, 6):
        r = run(["sample", "s.yaml", "-n", n, "--scheme", "exact", "-o", f"g{n}.h5"], tmp_path)
        assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
        assert "has only 4 distinct features" in r.output and "ask for at most 4" in r.output, r.output
        assert not (tmp_path / f"g{n}.h5").exists()
    assert run(["sample", "s.yaml", "-n", 4, "-o", "r.h5", "-q"], tmp_path).exit_code == 0  # rfs agrees


def test_fewer_enumerated_features_than_d_are_refused_at_once():
    """identity over two circles (4 features, the constant of weight 0): D = 5 .. 7 left
    the sampler to find that out by stalling; now at once, naming the true number."""
    s = skel("identity")
    for D in (5, 7):
        with pytest.raises(SamplerError, match="has only 4 distinct features .*ask for at most 4"):
            sample(s, D, 0, scheme="exact")


_FINITE = st.one_of(
    st.just("{base: binary}"),
    st.just("{base: circle}"),
    st.builds("{{base: categorical, categories: {}}}".format, st.integers(2, 4)),
    st.builds("{{base: sphere, scheme: coordinate, width: {}}}".format, st.integers(2, 3)),
)
_LOW = st.sampled_from(["[0.5, 0.5]", "[0.25, 0.75]", "[0.7, 0.3]", "[0.0, 1.0]", "[1.0, 2.0]"])


_SMALL = st.one_of(st.just("{base: binary}"), st.builds("{{base: categorical, categories: {}}}".format, st.integers(2, 3)))
_HIGH = st.one_of(
    st.builds(lambda v: "{name: coefficients, values: [%s]}" % ", ".join(map(str, v)),
              st.lists(st.sampled_from([0.3, 0.5, 0.8, 1.0]), min_size=3, max_size=4)),
    st.builds("{{name: polynomial, degree: {}, c: {}}}".format, st.integers(2, 3), st.sampled_from([0.5, 1.0])),
)


@st.composite
def _degree_one_skeletons(draw, high=False):
    """Tiny skeletons whose every draw has degree 0 or 1 (activations of degree 1, an
    optional middle node), of input nodes with finitely many codes; ``high``: activations
    of degree 2 or 3 (coefficients of length 3 or 4, polynomial) over up to three binary
    or categorical inputs, whose every feature still has probability above 1/400."""
    bases = draw(st.lists(_SMALL if high else _FINITE, min_size=1, max_size=3))
    act = (lambda: draw(_HIGH)) if high else (lambda: "{name: coefficients, values: %s}" % draw(_LOW))
    lines, col = [], 0
    for i, b in enumerate(bases):
        width = int(b.split("width: ")[1].rstrip("}")) if "width" in b else 1
        cols = list(range(col, col + width))
        col += width
        b = b.replace(f", width: {width}", "")
        lines.append(f"  - {{name: u{i}, columns: {cols}, {b[1:-1]}}}")
    names = [f"u{i}" for i in range(len(bases))]
    if len(names) > 1 and draw(st.booleans()):
        lines.append(f"  - {{name: h, activation: {act() if not high else '{name: coefficients, values: [0.5, 0.5]}'}, "
                     f"inputs: {names[:2]}}}")
        names = ["h"] + names[2:]
    lines.append(f"  - {{name: out, activation: {act()}, inputs: {names}}}")
    return "rfsgen: 1\ninput: {width: %d}\nnodes:\n%s\n" % (col, "\n".join(lines))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(text=st.one_of(_degree_one_skeletons(), _degree_one_skeletons(high=True)), seed=st.integers(0, 2**32))
def test_exact_counts_the_features_rfs_draws(text, seed):
    """Generated: exact's features are the distinct keys of 2^15 rfs draws (every feature
    has probability >= 1/400, so none is missed but with probability < e^-80); D from
    half their number up to it gives D columns (where all are listed, the kernel
    exactly), one more a one-line refusal naming that number.  With degrees 2 and up
    (issue 37 item 9, fuzz: three binary inputs under a degree-2 activation have 7
    features, and -n 7 listed a PPS subset whose sampled part reached only 6) the listed
    columns are among the drawn ones, and every D up to their number is reached too."""
    from rfsgen.sampler import _keys

    s = parse_skeleton(text, "gen.yaml")
    t = _tables(s)
    b = _walk(s, t, _block_rng(seed, 0), 1 << 15)
    keys, hits = np.unique(_keys(b, 0), axis=0, return_counts=True)
    drawn = {tuple(k) for k in keys.tolist()}
    assert hits.min() >= 8, text  # no feature near the floor: none left undrawn
    pl = plan(s, t, 10**6)
    listed = {tuple(k) for k in _keys(pl.batch, 0).tolist()}
    assert listed <= drawn and (pl.p_high > 0.0 or listed == drawn), text
    n = len(drawn)
    for D in range(max(1, n // 2 + 1), n + 1):
        fs = sample(s, D, seed, scheme="exact")
        assert fs.columns == D and fs.weight.sum() == pytest.approx(1.0, abs=1e-9), (text, D)
    if fs.stats["exact_columns"] == n:  # all listed (not where D < 4 keeps degree 1 sampled): the kernel exactly
        x = rows_for(s, 4, seed=seed % 1000)
        z = transform(fs, x, layout="dense", dtype="float64")
        np.testing.assert_allclose(z @ z.T, kernel(s, x), atol=1e-9)
    with pytest.raises(SamplerError, match=f"(has only {n} distinct features|it can give at most {n} distinct|produced "
                                           f"only {n} distinct columns) .*ask for at most {n}(,|$)"):
        sample(s, n + 1, seed, scheme="exact")
    assert sample(s, n, seed).columns == n  # rfs gives as many


def test_a_degree_two_skeleton_fills_d_with_its_seven_features(tmp_path):
    """Issue 37 item 9, found by fuzz: three binary inputs under coefficients [0.953,
    0.84, 0.824] have 7 features (1, x_i, x_i x_j: x_i^2 = 1 is the constant).  -n 7 listed
    the constant and a PPS subset of 2 of the 3 x_i, whose sampled part (degree 2) reached
    only 6, refused with 'at most 8'; now the sample starts again with all 4 listed and
    gives 7, and -n 8 is refused at once naming 7, as for rfs."""
    text = ("rfsgen: 1\ninput: {width: 3}\nnodes:\n  - {name: b, base: binary, per: column}\n"
            "  - {name: out, activation: {name: coefficients, values: [0.953, 0.84, 0.824]}, inputs: [b]}\n")
    p = tmp_path / "s.yaml"
    p.write_text(text)
    res = CliRunner().invoke(main, ["sample", str(p), "-n", "7", "--scheme", "exact", "--seed", "638345540",
                                    "-o", str(tmp_path / "f.h5")])
    assert res.exit_code == 0, res.output
    fs = load(tmp_path / "f.h5")
    assert fs.columns == 7 and fs.stats["exact_columns"] == 4 and fs.weight.sum() == pytest.approx(1.0, abs=1e-12)
    s = parse_skeleton(text, "s.yaml")
    for scheme in ("exact", "rfs"):
        with pytest.raises(SamplerError, match="it can give at most 7 distinct columns .*ask for at most 7"):
            sample(s, 8, 0, scheme=scheme)


_COLLAPSING = ("rfsgen: 1\ninput: {width: 7}\nnodes:\n  - {name: a, base: binary, columns: [0]}\n"
               "  - {name: b, base: binary, columns: [1, 2, 3, 4, 5, 6], per: column}\n"
               "  - {name: h, activation: {name: coefficients, values: [0.3, 0.3, 0.4]}, inputs: [a]}\n"
               "  - {name: out, activation: {name: coefficients, values: [0.2, 0.8]}, inputs: [h, b]}\n")


def test_a_subset_whose_sampled_part_reaches_nothing_new_lists_the_heaviest_and_samples_the_rest():
    """Degree 2 here is a^2 = 1, the constant: the 8 features are 1 and the 7 inputs, and a
    PPS subset of half of D leaves the sampled part nothing new to find.  The retry lists
    the constant and the D/2 - 1 heaviest with their exact weights, and samples every
    other draw (the unlisted single factors too): D = 6 .. 8 are reached, 9 refused naming
    8; and the retry's law (listed weights + P_high x the accepted draws) is rfs's."""
    from rfsgen.sampler import _keys

    s = parse_skeleton(_COLLAPSING, "c.yaml")
    t = _tables(s)
    assert plan(s, t, 8, 0).restricted
    for D in (6, 8):
        fs = sample(s, D, 3, scheme="exact")
        assert fs.columns == D and fs.stats["exact_columns"] == D // 2 and fs.weight.sum() == pytest.approx(1.0)
    with pytest.raises(SamplerError, match="produced only 8 distinct columns .*ask for at most 8$"):
        sample(s, 9, 3, scheme="exact")
    pl = plan(s, t, 8, 0, reach_all=True)
    assert pl.listed_keys is not None and pl.columns == 4 and pl.min_out_degree == 1
    n = 1 << 17

    def law(keys, weight):
        u, inv = np.unique(keys, axis=0, return_inverse=True)
        return {tuple(k): w for k, w in zip(u.tolist(), np.bincount(inv.ravel(), weights=weight))}

    b = _walk(s, t, _block_rng(1, 0), n)
    want = law(_keys(b, 0), np.full(n, 1.0 / n))
    b = _walk(s, t, _block_rng(2, 0), n, stratify=True, min_degree=pl.min_out_degree)
    keys = _keys(b, 0)
    keep = pl.accept(b.factors, b.single) & ~((b.factors == 1) & pl.listed(keys))
    got = law(keys[keep], np.full(int(keep.sum()), pl.p_high / keep.sum()))
    for k, w in law(_keys(pl.batch, 0), pl.weight).items():
        got[k] = got.get(k, 0.0) + w
    assert got.keys() == want.keys()
    for k, w in want.items():
        assert got[k] == pytest.approx(w, abs=5 * math.sqrt(w / n) + 1e-3), k
