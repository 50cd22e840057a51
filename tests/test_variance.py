"""Issue 42 item 12: the VarianceWarning for every activation whose features have infinite (or,
cut at degree 1024, astronomically large) variance over inputs with C > 1, said where features
are made (sample, SkeletonFeatures.fit, rfsgen sample), not on loading a skeleton or a feature
file; rfsgen skeleton shows it as a report line; docs/skeletons.md's table matches the code."""

import json
import re
import warnings

import numpy as np
import pytest
import yaml

from conftest import ROOT, skeleton_path, without_variance_warning
from rfsgen import load_features, parse_skeleton, sample, save_features
from rfsgen.activations import REGISTRY, heavy_tailed, make_activation
from rfsgen.errors import VarianceWarning
from rfsgen.skeleton import variance_series
from test_cli import run, runner  # noqa: F401  (the fixture)

#: Parameters that generate each registry entry's cases: the defaults, plus the values that change
#: the series' kind (leaky_relu's slope 1 is the identity; arccos's degree; kinked and smooth
#: expressions).  Every registry entry a skeleton can name must be here.
VARIANTS = {
    "leaky_relu": [{"slope": 0.1}, {"slope": 1.0}],
    "arccos": [{"degree": d} for d in range(4)],
    "elu": [{"alpha": 1.0}, {"alpha": 0.5}],
    "polynomial": [{"degree": 3}],
    "coefficients": [{"values": [0.5, 0.3, 0.2]}],
    "function": [{"expr": "maximum(x, 0)"}, {"expr": "tanh(x)"}, {"expr": "heaviside(x, 0.5)"}],
}


def _cases():
    out = []
    for name in sorted(REGISTRY):
        if name == "python":  # make_activation(fn, name=...): not spelled in a skeleton
            continue
        for params in VARIANTS.get(name, [{}]):
            out.append((name, params))
    return out


CASES = _cases()


def _blows_up(act) -> bool:
    """The maths, independently of the code under test: the degree series evaluated at a point
    m > 1 (the fourth-moment recursion's point above an input with C > 1), here m = 1.05, is
    infinite (a radius-1 series with an infinite tail: its table alone is astronomical there) or
    astronomically large (a series cut at degree 1024), where entire and fast-converging series
    stay below 2 (tanh 1.06, polynomial of degree 3 1.16)."""
    a = np.asarray(act.coefficients, dtype=np.float64)
    i = np.flatnonzero(a)  # a table may end in zeros (leaky_relu with slope 1 is the identity)
    with np.errstate(over="ignore"):
        total = float(np.sum(a[i] * 1.05 ** i))
    return not np.isfinite(total) or total > 1e6 or act.tail is not None


def _spec(name, params) -> str:
    return yaml.safe_dump({"name": name, **params}, default_flow_style=True, width=1000).strip()


def _skeleton(name, params, width):
    return (f"rfsgen: 1\ninput: {{width: {width}}}\nnodes:\n  - {{name: x, base: sphere, scheme: pair}}\n"
            f"  - {{name: out, activation: {_spec(name, params)}, inputs: [x]}}\noutput: out\n")


def _sampled(text):
    """(the skeleton, the VarianceWarnings of parsing it, those of sampling it)."""
    with warnings.catch_warnings(record=True) as parsing:
        warnings.simplefilter("always")
        skel = parse_skeleton(text, "s.yaml")
    with warnings.catch_warnings(record=True) as sampling:
        warnings.simplefilter("always")
        fs = sample(skel, 4, seed=1)
    return fs, [w for w in parsing if issubclass(w.category, VarianceWarning)], \
        [w for w in sampling if issubclass(w.category, VarianceWarning)]


def test_the_cases_cover_the_registry():
    assert {name for name, _ in CASES} == set(REGISTRY) - {"python"}
    assert any(_blows_up(make_activation(n, p)) for n, p in CASES)
    assert not all(_blows_up(make_activation(n, p)) for n, p in CASES)


@pytest.mark.parametrize("name, params", CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_sampling_warns_exactly_for_the_activations_whose_variance_blows_up_over_c_above_1(name, params, tmp_path):
    act = make_activation(name, params)
    blows = _blows_up(act)
    assert (variance_series(act) is not None) == blows
    if heavy_tailed(act):
        assert variance_series(act) == "infinite"
    # sphere over 8 values (pair): C = 2 > 1
    fs, parsing, sampling = _sampled(_skeleton(name, params, 8))
    assert not parsing  # loading a skeleton does not warn: making features from it does
    assert len(sampling) == (1 if blows else 0), [str(w.message) for w in sampling]
    if blows:
        msg = str(sampling[0].message)
        assert "\n" not in msg and msg.startswith("s.yaml:5: node 'out'") and "input node 'x'" in msg
        assert ("infinite variance" if heavy_tailed(act) else "astronomically large variance") in msg
        for advice in ("--scheme strat or exact do not remove it", "inputs with C = 1", "exp, polynomial, tanh"):
            assert advice in msg
        assert sampling[0].filename == __file__  # points at the caller of sample
    # loading the feature file made from it does not warn
    save_features(fs, tmp_path / "f.h5")
    with warnings.catch_warnings(record=True) as loading:
        warnings.simplefilter("always")
        load_features(tmp_path / "f.h5")
    assert not [w for w in loading if issubclass(w.category, VarianceWarning)]
    # over the circle (sphere over 2 values, C = 1) every series is fine
    assert not _sampled(_skeleton(name, params, 2))[2]


def test_a_heavy_tailed_node_above_an_exp_layer_over_c_above_1_warns_and_below_c_1_does_not():
    """m > 1 goes through any activation (exp maps it to exp(beta (m - 1)) > 1): cifar-deep's case."""
    text = ("rfsgen: 1\ninput: {width: 6}\nnodes:\n  - {name: x, base: sphere, scheme: pair, per: group, group: 3}\n"
            "  - {name: h, activation: {name: exp, beta: 0.25}, inputs: [x]}\n"
            "  - {name: out, activation: relu, inputs: [h]}\noutput: out\n")
    assert len(_sampled(text)[2]) == 1
    assert not _sampled(text.replace("group: 3", "group: 2"))[2]  # pairs of values: C = 1


def test_sklearn_fit_warns_and_transform_does_not(cifar_rows):
    pytest.importorskip("sklearn")
    from rfsgen.sklearn import SkeletonFeatures

    est = SkeletonFeatures("cifar-deep", n_components=32, random_state=1)
    with pytest.warns(VarianceWarning, match=r"cifar-deep.*\(relu\).*infinite variance"):
        est.fit(cifar_rows[:4])
    with warnings.catch_warnings():
        warnings.simplefilter("error", VarianceWarning)
        est.transform(cifar_rows[:4])


def test_cli_sample_warns_once_skeleton_reports_a_line_and_loading_commands_stay_quiet(runner, tmp_path):
    out = tmp_path / "f.h5"
    res = run(runner, ["sample", "cifar-deep", "-n", 64, "--seed", 1, "-o", out])
    assert res.exit_code == 0, res.output
    rest = without_variance_warning(res.stderr.splitlines())  # exactly one warning line
    assert len(rest) == 1 and rest[0].startswith("wrote 64 columns")
    # rfsgen skeleton: a line of the report (stdout), no warning on stderr
    res = run(runner, ["skeleton", "cifar-deep"])
    assert res.exit_code == 0 and res.stderr == ""
    assert re.search(r"^variance   infinite: node 'conv2\[0, 0\]' \(relu\) is above input node 'pixels\[0, 0\]' "
                     r"\(C = 1.22 > 1\)$", res.stdout, re.M), res.stdout
    info = json.loads(run(runner, ["skeleton", "cifar-deep", "--json"]).stdout)
    assert info["infinite_variance"]["series"] == "infinite" and info["infinite_variance"]["node"] == "conv2[0, 0]"
    res = run(runner, ["skeleton", "cifar-patches"])
    assert "variance" not in res.stdout and res.stderr == ""
    # a feature file made from it: no warning, whatever the command
    np.save(tmp_path / "rows.npy", np.random.default_rng(0).standard_normal((3, 1728)))
    for args in (["inspect", out], ["transform", out, tmp_path / "rows.npy", "-o", tmp_path / "o.h5", "-q"]):
        res = run(runner, args)
        assert res.exit_code == 0 and "warning" not in res.stderr, (args, res.stderr)


def test_cifar_deep_says_so_in_its_own_comments():
    text = (ROOT / "skeletons" / "cifar-deep.yaml").read_text()
    assert "infinite variance" in " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    assert skeleton_path("cifar-deep")


# ----------------------------------------------------------------------------- the docs' table
def _doc_table():
    """docs/skeletons.md's variance table: {(name, params): kind} from rows like
    | `relu`, `leaky_relu(slope=0.1)` | infinite | ... |."""
    text = (ROOT / "docs" / "skeletons.md").read_text()
    start = text.index("| activations | over inputs with C > 1 |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        kind = {"infinite": "infinite", "astronomically large": "cut", "finite": None}[cells[1]]
        for item in re.findall(r"`([^`]+)`", cells[0]):
            m = re.fullmatch(r"(\w+)(?:\((.*)\))?", item)
            params = {}
            if m.group(2):
                for part in re.findall(r"(\w+)=('[^']*'|[^,]+)", m.group(2)):
                    params[part[0]] = yaml.safe_load(part[1])
            rows[(m.group(1), json.dumps(params, sort_keys=True))] = kind
    return rows


def test_the_docs_table_matches_the_code():
    rows = _doc_table()
    for (name, params), kind in rows.items():
        act = make_activation(name, json.loads(params))
        assert variance_series(act) == kind, (name, params)
        assert heavy_tailed(act) == (kind == "infinite"), (name, params)
    # every activation a skeleton can name is in the table, and every case above
    assert {name for name, _ in rows} == set(REGISTRY) - {"python"}
    for name, params in CASES:
        act = make_activation(name, params)
        key = (name, json.dumps(params, sort_keys=True))
        if key in rows:
            assert rows[key] == variance_series(act)
