"""Skeleton parameters (``params:``, ``$name``, ``--set``, ``SkeletonFeatures(params=)``) and
the warning for step-like nodes above inputs with C > 1."""

import json
import re
import warnings

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rfsgen
from conftest import skeleton_path
from rfsgen import SkeletonError, load_features, parse_skeleton, sample, save_features, transform
from rfsgen.errors import VarianceWarning
from test_cli import run, runner  # noqa: F401  (the fixture)

SKEL = """\
rfsgen: 1
params:
  gamma: 0.5
  beta: {default: 1.0, min: 0, max: 8, description: exp's beta}
  degree: 2
input: {width: 4}
nodes:
  - {name: cols, base: circle, scale: $gamma, per: column}
  - name: hidden
    activation: {name: exp, beta: $beta}
    inputs: [cols]
  - {name: out, activation: {name: polynomial, degree: $degree, c: 1.0}, inputs: [hidden]}
"""


def literal(gamma=0.5, beta=1.0, degree=2):
    """SKEL with the values written in (no parameters)."""
    text = SKEL.replace("$gamma", repr(gamma)).replace("$beta", repr(beta)).replace("$degree", repr(degree))
    return "\n".join(line for line in text.splitlines() if not line.startswith(("params:", "  gamma", "  beta:",
                                                                                 "  degree"))) + "\n"


def one_line(fn, *a, **k):
    with pytest.raises(SkeletonError) as e:
        fn(*a, **k)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# ----------------------------------------------------------------------------- substitution
def test_defaults_and_set_values_build_the_skeleton_with_those_values_written_in():
    s = parse_skeleton(SKEL, "p.yaml")
    assert s.params == (("gamma", 0.5), ("beta", 1.0), ("degree", 2))
    t = parse_skeleton(SKEL, "p.yaml", params={"gamma": "0.3", "beta": 2, "degree": np.int64(3)})
    assert t.params == (("gamma", 0.3), ("beta", 2.0), ("degree", 3))
    ref = parse_skeleton(literal(0.3, 2.0, 3), "l.yaml")
    assert [n.base for n in t.input_nodes] == [n.base for n in ref.input_nodes]
    assert [n.activation for n in t.internal_nodes] == [n.activation for n in ref.internal_nodes]
    x = np.random.default_rng(0).standard_normal((6, 4))
    a, b = sample(t, 50, seed=3), sample(ref, 50, seed=3)
    assert transform(a, x, layout="dense").tobytes() == transform(b, x, layout="dense").tobytes()


@settings(max_examples=25, derandomize=True, deadline=None)
@given(gamma=st.floats(0.01, 10), beta=st.floats(0, 8), degree=st.integers(1, 6))
def test_generated_values_equal_the_literal_skeleton(gamma, beta, degree):
    t = parse_skeleton(SKEL, "p.yaml", params={"gamma": gamma, "beta": beta, "degree": degree})
    ref = parse_skeleton(literal(gamma, beta, degree), "l.yaml")
    assert [n.base for n in t.input_nodes] == [n.base for n in ref.input_nodes]
    assert [n.activation for n in t.internal_nodes] == [n.activation for n in ref.internal_nodes]


def test_width_auto_skeleton_keeps_its_values_when_bound():
    s = rfsgen.load_skeleton("tabular-auto", params={"scale": 0.2})
    assert not s.bound and s.params == (("scale", 0.2), ("beta", 1.0))
    b = s.bind(3)
    assert b.params == (("scale", 0.2), ("beta", 1.0)) and b.input_nodes[0].base.param("scale") == 0.2
    assert rfsgen.load_skeleton("tabular-auto").bind(3).input_nodes[0].base.param("scale") == 0.5


# ----------------------------------------------------------------------------- errors
BAD_FILES = [
    ("params: [1, 2]\n", r"p.yaml:2: 'params' must be a mapping"),
    ("params: {g: }\n", r"p.yaml:2: parameter 'g' has no default"),
    ("params: {g: {min: 0}}\n", r"p.yaml:2: parameter 'g' has no default"),
    ("params: {g: abc}\n", r"p.yaml:2: the default of parameter 'g' must be a finite number"),
    ("params: {g: true}\n", r"p.yaml:2: the default of parameter 'g' must be a finite number"),
    ("params: {g: .nan}\n", r"p.yaml:2: the default of parameter 'g' must be a finite number"),
    ("params: {g: $h, h: 1}\n", r"p.yaml:2: the default of parameter 'g' refers to '\$h'"),
    ("params: {g: {default: 1, step: 2}}\n", r"p.yaml:2: unknown key 'step' in parameter 'g'"),
    ("params: {g: {default: 5, max: 2}}\n", r"p.yaml:2: parameter 'g' is 5 \(its default\), above its max 2"),
    ("params: {g: {default: 1, min: 3, max: 2}}\n", r"p.yaml:2: parameter 'g' has min 3 above max 2"),
    ("params: {9g: 1}\n", r"p.yaml:2: parameter name '9g' must start with a letter"),
]


@pytest.mark.parametrize("block, pattern", BAD_FILES)
def test_bad_declarations_are_one_line_errors_naming_file_line_and_parameter(block, pattern):
    text = "rfsgen: 1\n" + block + "input: {width: 2}\nnodes:\n  - {name: x, base: circle, per: column}\n" \
           "  - {name: o, activation: relu, inputs: [x]}\n"
    assert re.search(pattern, one_line(parse_skeleton, text, "p.yaml"))


USE = "rfsgen: 1\nparams: {g: 0.5}\ninput: {width: 2}\nnodes:\n  - {name: x, base: circle, per: column, scale: SCALE}\n" \
      "  - {name: o, activation: ACT, inputs: [x]}\n"


@pytest.mark.parametrize("scale, act, pattern", [
    ("$gg", "relu", r"p.yaml:5: unknown parameter '\$gg' \(declared: g\)"),
    ("0.5", "$g", r"p.yaml:6: parameter '\$g' stands for a number, but 'activation' takes a name"),
    ("0.5", "{name: $g}", r"p.yaml:6: parameter '\$g' stands for a number, but 'name' takes a name"),
    ("0.5", "{name: function, expr: $g}", r"p.yaml:6: parameter '\$g' stands for a number, but 'expr'"),
])
def test_bad_references_are_one_line_errors(scale, act, pattern):
    text = USE.replace("SCALE", scale).replace("ACT", act)
    assert re.search(pattern, one_line(parse_skeleton, text, "p.yaml"))


def test_a_name_place_and_an_undeclared_file():
    text = USE.replace("SCALE", "0.5").replace("ACT", "relu").replace("{name: x, base: circle", "{name: $g, base: circle")
    assert re.search(r"p.yaml:5: parameter '\$g' stands for a number, but 'name'", one_line(parse_skeleton, text, "p.yaml"))
    plain = USE.replace("params: {g: 0.5}\n", "").replace("SCALE", "$g").replace("ACT", "relu")
    assert "the skeleton declares no parameters" in one_line(parse_skeleton, plain, "p.yaml")


@pytest.mark.parametrize("given, pattern", [
    ({"gama": 1}, r"p.yaml:2: unknown parameter 'gama' \(declared: gamma, beta, degree\)"),
    ({"gamma": "abc"}, r"p.yaml:3: parameter 'gamma' must be a number, got 'abc'"),
    ({"gamma": [1]}, r"p.yaml:3: parameter 'gamma' must be a number"),
    ({"gamma": True}, r"p.yaml:3: parameter 'gamma' must be a number"),
    ({"gamma": "inf"}, r"p.yaml:3: parameter 'gamma' must be finite"),
    ({"beta": 9}, r"p.yaml:4: parameter 'beta' is 9.0 \(as set\), above its max 8"),
    ({"degree": 2.5}, r"p.yaml:5: parameter 'degree' takes an integer \(its default is 2\), got 2.5"),
    ({"gamma": -1}, r"p.yaml:8: node 'cols': 'scale' must be .* \(with parameter 'gamma' = -1.0: set another value"),
    ({"degree": -1}, r"p.yaml:\d+: .*degree.*\(with parameter 'degree' = -1"),
])
def test_bad_values_are_one_line_errors_naming_the_parameter(given, pattern):
    assert re.search(pattern, one_line(parse_skeleton, SKEL, "p.yaml", params=given))


@settings(max_examples=30, derandomize=True, deadline=None)
@given(value=st.one_of(st.text(max_size=8), st.floats(allow_nan=True, allow_infinity=True), st.none(),
                       st.lists(st.integers(), max_size=2)))
def test_generated_values_give_a_skeleton_or_one_line_naming_the_parameter(value):
    try:
        s = parse_skeleton(SKEL, "p.yaml", params={"gamma": value})
    except SkeletonError as e:
        assert "\n" not in str(e) and "gamma" in str(e) and str(e).startswith("p.yaml:")
    else:
        assert dict(s.params)["gamma"] > 0


def test_files_without_parameters_are_unchanged_and_a_dollar_in_description_is_text():
    text = USE.replace("params: {g: 0.5}\n", "description: costs $5\n").replace("SCALE", "0.5").replace("ACT", "relu")
    s = parse_skeleton(text, "p.yaml")
    assert s.params == () and s.description == "costs $5" and "params" not in s.describe()


# ----------------------------------------------------------------------------- feature file
def test_feature_file_records_values_and_reloads_the_same_kernel(tmp_path):
    s = parse_skeleton(SKEL, "p.yaml", params={"gamma": 0.3, "degree": 3})
    fs = sample(s, 80, seed=1)
    save_features(fs, tmp_path / "f.h5")
    with h5py.File(tmp_path / "f.h5") as f:
        assert json.loads(f.attrs["params"]) == {"gamma": 0.3, "beta": 1.0, "degree": 3}
    back = load_features(tmp_path / "f.h5")
    assert back.skeleton.params == s.params and back.skeleton.source == SKEL
    x = np.random.default_rng(1).standard_normal((7, 4))
    assert transform(back, x, layout="dense").tobytes() == transform(fs, x, layout="dense").tobytes()


def test_files_of_skeletons_without_parameters_have_no_params_attribute(tmp_path):
    fs = sample(parse_skeleton(literal(), "l.yaml"), 40, seed=1)
    save_features(fs, tmp_path / "f.h5")
    with h5py.File(tmp_path / "f.h5") as f:
        assert "params" not in f.attrs


# ----------------------------------------------------------------------------- command line
def test_cli_set_on_every_skeleton_command(runner, tmp_path):  # noqa: F811
    p = tmp_path / "p.yaml"
    p.write_text(SKEL)
    x = np.random.default_rng(2).standard_normal((5, 4))
    np.save(tmp_path / "x.npy", x)
    res = run(runner, ["skeleton", p, "--set", "gamma=0.25", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["params"] == {"gamma": 0.25, "beta": 1.0, "degree": 2}
    res = run(runner, ["sample", p, "-n", 32, "--seed", 4, "--set", "gamma=0.25", "--set", "degree=3",
                       "-o", tmp_path / "f.h5", "-q"])
    assert res.exit_code == 0, res.output
    fs = load_features(tmp_path / "f.h5")
    assert fs.skeleton.params == (("gamma", 0.25), ("beta", 1.0), ("degree", 3))
    assert fs.command.endswith("--set gamma=0.25 --set degree=3")
    ref = sample(parse_skeleton(SKEL, "p.yaml", params={"gamma": 0.25, "degree": 3}), 32, seed=4)
    assert transform(fs, x, layout="dense").tobytes() == transform(ref, x, layout="dense").tobytes()
    res = run(runner, ["kernel", p, tmp_path / "x.npy", "--set", "gamma=0.25", "-o", tmp_path / "K.npy"])
    assert res.exit_code == 0
    want = rfsgen.kernel(parse_skeleton(SKEL, params={"gamma": 0.25}), x)
    assert np.array_equal(np.load(tmp_path / "K.npy"), want)
    res = run(runner, ["approx", p, tmp_path / "x.npy", "-n", 16, "--trials", 1, "--subset", 4, "--set", "beta=2",
                       "--json", "-q"])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("sets, pattern", [
    (["--set", "gamma"], r"Invalid value for '--set': expected NAME=VALUE, got 'gamma'"),
    (["--set", "gamma="], r"expected NAME=VALUE"),
    (["--set", "gamma=1", "--set", "gamma=2"], r"parameter 'gamma' is set twice"),
    (["--set", "zeta=1"], r"p.yaml:2: unknown parameter 'zeta'"),
    (["--set", "gamma=x"], r"p.yaml:3: parameter 'gamma' must be a number, got 'x'"),
    (["--set", "gamma=0"], r"p.yaml:8: node 'cols': .*\(with parameter 'gamma' = 0.0"),
])
def test_cli_set_errors_exit_2_with_one_line(runner, tmp_path, sets, pattern):  # noqa: F811
    p = tmp_path / "p.yaml"
    p.write_text(SKEL)
    for cmd in (["skeleton", p], ["sample", p, "-n", 8, "-o", tmp_path / "f.h5"]):
        res = run(runner, cmd + sets)
        assert res.exit_code == 2
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("rfsgen: error: ")
        assert re.search(pattern, res.stderr), res.stderr
    assert not (tmp_path / "f.h5").exists()


def test_tabular_auto_scale_parameter(runner, tmp_path):  # noqa: F811
    res = run(runner, ["sample", "tabular-auto", "--width", 3, "-n", 16, "--set", "scale=0.2", "-o", tmp_path / "f.h5",
                       "-q"])
    assert res.exit_code == 0
    assert load_features(tmp_path / "f.h5").skeleton.input_nodes[0].base.param("scale") == 0.2


# ----------------------------------------------------------------------------- scikit-learn
def test_sklearn_params_grid_search_and_clone():
    from sklearn.base import clone
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import Pipeline

    from rfsgen.sklearn import SkeletonFeatures

    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 3))
    y = (x[:, 0] * x[:, 1] > 0).astype(int)
    est = SkeletonFeatures("tabular-auto", n_components=32, random_state=0, params={"scale": 0.2})
    assert est.get_params()["params"] == {"scale": 0.2}
    c = clone(est)
    assert c.get_params() == est.get_params()
    given = {"scale": 0.2}
    e2 = SkeletonFeatures("tabular-auto", params=given).set_params(params__scale=0.7)
    assert e2.params == {"scale": 0.7} and given == {"scale": 0.2}
    assert est.fit(x).skeleton_.params == (("scale", 0.2), ("beta", 1.0))
    with pytest.raises(SkeletonError, match="unknown parameter 'gamma'"):
        SkeletonFeatures("tabular-auto", params={"gamma": 1}).fit(x)
    with pytest.raises(ValueError, match="params must be a dict"):
        SkeletonFeatures("tabular-auto", params=[("scale", 1)]).fit(x)
    pipe = Pipeline([("features", SkeletonFeatures("tabular-auto", n_components=32, random_state=0)),
                     ("linear", LogisticRegression(max_iter=200))])
    grid = GridSearchCV(pipe, {"features__params__scale": [0.1, 1.0]}, cv=2).fit(x, y)
    assert grid.best_params_["features__params__scale"] in (0.1, 1.0)
    assert grid.best_estimator_.named_steps["features"].skeleton_.params[0][1] == grid.best_params_[
        "features__params__scale"]
    grid = GridSearchCV(pipe, {"features__params": [{"scale": 0.1}, {"scale": 1.0}]}, cv=2).fit(x, y)
    assert grid.best_params_["features__params"] in ({"scale": 0.1}, {"scale": 1.0})


def test_sklearn_params_on_a_parsed_skeleton():
    from rfsgen.sklearn import SkeletonFeatures

    s = parse_skeleton(SKEL, "p.yaml")
    est = SkeletonFeatures(s, n_components=16, random_state=1, params={"gamma": 0.3}).fit(np.ones((4, 4)))
    assert dict(est.skeleton_.params)["gamma"] == 0.3


# ----------------------------------------------------------------------------- variance warning
STEP = "rfsgen: 1\ninput: {width: W}\nnodes:\n  - {name: x, base: sphere, SCHEME}\n" \
       "  - {name: out, activation: ACT, inputs: [x]}\n"


@pytest.mark.parametrize("width, scheme, act, warns", [
    (8, "scheme: pair", "step", True),  # sphere patches: C = 2
    (3, "scheme: coordinate", "step", True),
    (3, "scheme: pair", "{name: arccos, degree: 0}", True),  # step by another name
    (2, "scheme: pair", "step", False),  # the circle: C = 1
    (8, "scheme: pair", "relu", True),  # infinite variance too (issue 42.12)
    (2, "scheme: pair", "relu", False),  # C = 1: every factor has modulus 1
    (8, "scheme: pair", "{name: exp, beta: 0.5}", False),  # entire: finite at every m
    (8, "scheme: pair", "tanh", False),  # converges fast: moderate
    (8, "scheme: pair", "{name: polynomial, degree: 3}", False),
    (8, "scheme: pair", "{name: function, expr: 'maximum(x, 0)'}", True),  # cut at degree 1024: astronomical
])
def test_step_above_an_input_with_c_above_1_warns(width, scheme, act, warns):
    """Said when sampling, not when parsing (tests/test_variance.py covers the registry)."""
    text = STEP.replace("W", str(width)).replace("SCHEME", scheme).replace("ACT", act)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        skel = parse_skeleton(text, "s.yaml")
    assert not [w for w in got if issubclass(w.category, VarianceWarning)]
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        sample(skel, 4, seed=1)
    ours = [w for w in got if issubclass(w.category, VarianceWarning)]
    assert bool(ours) == warns
    if warns:
        msg = str(ours[0].message)
        assert "\n" not in msg and msg.startswith("s.yaml:5: node 'out'") and "variance" in msg
        assert "use inputs with C = 1" in msg


def test_step_warning_deep_and_on_the_command_line(runner, tmp_path):  # noqa: F811
    text = ("rfsgen: 1\ninput: {shape: [4, 4, 3]}\nnodes:\n  - {name: p, base: sphere, per: patch, patch: {size: 2, "
            "stride: 2}}\n  - {name: h, activation: step, conv: {size: 2, stride: 2}}\n"
            "  - {name: out, activation: relu, dense: true}\n")
    (tmp_path / "s.yaml").write_text(text)
    res = run(runner, ["sample", tmp_path / "s.yaml", "-n", 8, "-o", tmp_path / "f.h5", "-q"])
    assert res.exit_code == 0
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rfsgen: warning: ") and "node 'h[0, 0]' (step)" in lines[0]
    assert "C = 2.45 > 1" in lines[0] and "infinite variance" in lines[0]


def test_tabular_auto_defaults_give_the_features_it_gave_before_it_had_parameters():
    before = ("rfsgen: 1\ninput:\n  width: auto\nnodes:\n  - {name: cols, base: circle, scale: 0.5, per: column}\n"
              "  - {name: hidden, activation: {name: exp, beta: 1.0}, inputs: [cols]}\n"
              "  - {name: out, activation: relu, inputs: [hidden]}\n")
    x = np.random.default_rng(3).standard_normal((9, 5))
    old = sample(parse_skeleton(before, "old.yaml").bind(5), 64, seed=2)
    new = sample(rfsgen.load_skeleton("tabular-auto").bind(5), 64, seed=2)
    assert transform(new, x, layout="dense").tobytes() == transform(old, x, layout="dense").tobytes()
    assert new.draws == old.draws


@pytest.mark.parametrize("edit, pattern", [
    ("drop", r"attribute 'params' does not match the parameters the embedded skeleton declares"),
    ('{"gamma": 0.3}', r"attribute 'params' does not match"),
    ('{"gamma": "x"}', r"attribute 'params' is not a JSON mapping of parameter names to numbers"),
    ("[1, 2]", r"attribute 'params' is not a JSON mapping"),
    ('{"zeta": 1, "gamma": 0.3, "beta": 1.0, "degree": 2}', r"the embedded skeleton no longer parses .*unknown "
                                                            r"parameter 'zeta'"),
    ('{"gamma": -1, "beta": 1.0, "degree": 2}', r"no longer parses .*with parameter 'gamma' = -1"),
])
def test_a_resealed_file_with_wrong_params_is_refused_in_one_line(tmp_path, edit, pattern):
    import forge

    save_features(sample(parse_skeleton(SKEL, "p.yaml", params={"gamma": 0.3}), 16, seed=1), tmp_path / "f.h5")
    step = forge.del_attr("params") if edit == "drop" else forge.set_attr("params", edit)
    forge.forge(tmp_path / "f.h5", tmp_path / "g.h5", step)
    with pytest.raises(rfsgen.FeatureFileError) as e:
        load_features(tmp_path / "g.h5")
    assert "\n" not in str(e.value) and re.search(pattern, str(e.value)), str(e.value)


def test_a_params_attribute_on_a_file_without_parameters_is_refused(tmp_path):
    import forge

    save_features(sample(parse_skeleton(literal(), "l.yaml"), 16, seed=1), tmp_path / "f.h5")
    forge.forge(tmp_path / "f.h5", tmp_path / "g.h5", forge.set_attr("params", '{"gamma": 0.3}'))
    with pytest.raises(rfsgen.FeatureFileError, match="no longer parses .*unknown parameter 'gamma'"):
        load_features(tmp_path / "g.h5")


def test_heavy_tailed_activations_are_those_with_infinite_variance_over_c_above_1():
    """Issue 42.12: relu's series has radius 1 and an infinite tail like step's, so over inputs with
    C > 1 its variance is infinite too (sum_i a_i m^i = inf for m > 1); entire and truncated series
    are finite at every m."""
    from rfsgen.activations import heavy_tailed, make_activation

    for name, params, heavy in [("relu", {}, True), ("step", {}, True), ("leaky_relu", {"slope": 0.1}, True),
                                ("leaky_relu", {"slope": 1.0}, False), ("arccos", {"degree": 0}, True),
                                ("arccos", {"degree": 1}, True), ("arccos", {"degree": 2}, False),
                                ("exp", {}, False), ("tanh", {}, False), ("polynomial", {"degree": 3}, False),
                                ("elu", {"alpha": 0.5}, False), ("function", {"expr": "maximum(x, 0)"}, False)]:
        act = make_activation(name, params)
        assert heavy_tailed(act) == heavy, name
        if heavy:  # the series diverges at m = 1.01: its partial sums grow without bound
            a = act.coefficients
            assert act.tail is not None and float(np.sum(a * 1.01 ** np.arange(a.size))) > 1e10
        elif name not in ("exp", "polynomial"):
            assert act.tail is None


@pytest.mark.parametrize("text, value", [("1e-06", 1e-06), ("2E0", 2.0), ("1.5e0", 1.5), (".5e1", 5.0),
                                         ("+3e-1", 0.3), ("1.5", 1.5)])
def test_numbers_with_an_exponent_are_numbers(text, value):
    """YAML 1.1 reads 1e-06 (Python's repr of 0.000001) as a string: a skeleton reads it as
    the number, as YAML 1.2 does (the generated-values test met beta = 1e-06)."""
    t = parse_skeleton(literal(0.5, 1.0, 2).replace("beta: 1.0", f"beta: {text}"), "l.yaml")
    ref = parse_skeleton(literal(0.5, value, 2), "r.yaml")
    assert [n.activation for n in t.internal_nodes] == [n.activation for n in ref.internal_nodes]
