import pytest

from conftest import ROOT, SKELETONS, SMALL_SKELETONS, load_shipped, skeleton_path
from rfsgen import SkeletonError, load_skeleton, parse_skeleton
from rfsgen.skeleton import InputNode, InternalNode

HEAD = "rfsgen: 1\ninput: {width: 4}\n"


def test_cifar_deep_structure():
    s = load_skeleton(skeleton_path("cifar-deep"))
    assert s.width == 1728 and s.shape == (24, 24, 3)
    counts = {layer.name: len(layer.ids) for layer in s.layers}
    assert counts == {"pixels": 529, "conv1": 100, "conv2": 16, "out": 1}
    assert s.depth == 3 and s.complexity == pytest.approx(0.25)
    # conv1[r, c] averages the 5x5 pixel window starting at (2r, 2c)
    conv1 = s.node("conv1[3, 7]")
    rows_cols = sorted({(s.nodes[k].columns[0] // 3) for k in conv1.children})
    expect = sorted((2 * 3 + i) * 24 + (2 * 7 + j) for i in range(5) for j in range(5))
    assert rows_cols == expect
    px = s.node("pixels[6, 14]")
    assert px.columns == tuple(range((6 * 24 + 14) * 3, (6 * 24 + 14) * 3 + 3))
    assert px.base.name == "sphere" and px.base.param("scheme") == "pair"
    conv2 = s.node("conv2[1, 2]")
    assert sorted(s.nodes[k].label for k in conv2.children)[0] == "conv1[2, 4]"
    assert len(conv2.children) == 16
    out = s.nodes[s.output]
    assert out.activation.name == "relu" and len(out.children) == 16
    assert len(s.unused_inputs) == 24 * 24 - 23 * 23


def test_shallow_structure():
    s = load_skeleton(skeleton_path("shallow-gaussian"))
    assert len(s.nodes) == 2 and s.input_nodes[0].base.width == 1728
    assert s.nodes[s.output].activation.label == "exp(beta=0.25)"


@pytest.mark.parametrize("path", sorted(SKELETONS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_skeletons_parse_and_say_what_they_are(path):
    s = load_shipped(path)
    assert path.read_text().startswith("# "), "each shipped skeleton starts with a comment block"
    assert s.nodes[s.output].id == s.output
    # topological order: children before parents
    for n in s.internal_nodes:
        assert max(n.children) < n.id


@pytest.mark.parametrize("name", sorted(SMALL_SKELETONS))
def test_small_skeletons_parse(name):
    parse_skeleton(SMALL_SKELETONS[name], name)


def test_node_arrays_references_and_forward_refs():
    s = parse_skeleton(HEAD + """
nodes:
  - {name: out, activation: identity, inputs: [a, "x[3]"]}
  - {name: a, activation: relu, inputs: ["x[0:3]"]}
  - {name: x, base: circle, per: column}
""")
    out = s.nodes[s.output]
    labels = sorted(s.nodes[c].label for c in out.children)
    assert labels == ["a", "x[3]"]
    assert sorted(s.nodes[c].label for c in s.node("a").children) == ["x[0]", "x[1]", "x[2]"]


def test_group_and_pool_and_each():
    s = parse_skeleton("""
rfsgen: 1
input: {width: 8}
nodes:
  - {name: g, base: gaussian, per: group, group: 2}
  - {name: e, activation: tanh, each: g}
  - {name: p, pool: {size: 2}}
  - {name: out, activation: relu, dense: true}
""")
    assert [len(layer.ids) for layer in s.layers] == [4, 4, 2, 1]
    assert s.node("g[1]").columns == (2, 3)
    assert s.node("p[1]").activation.name == "identity"


ERRORS = [
    ("rfsgen: 1\ninput: {width: 4\nnodes: []\n", r"<s>:\d+: malformed YAML"),
    (HEAD + "nodes:\n  - {name: x, base: circle, per: column, colour: red}\n",
     r"<s>:4: unknown key 'colour' in input node 'x' \(base circle\) \(allowed: name, description, base, columns, per, group, patch, scale\)"),
    (HEAD + "nodes:\n  - {name: x, base: circle, per: column}\n  - {name: o, activation: sigmoidal, inputs: [x]}\n",
     r"<s>:5: unknown activation 'sigmoidal' in node 'o' \(allowed: abs, coefficients, cos, erf, exp"),
    (HEAD + "nodes:\n  - {name: x, base: circel, per: column}\n", r"unknown base 'circel' in node 'x' \(allowed: binary, brownian, categorical, circle"),
    (HEAD + "nodes:\n  - {name: x, base: circle, per: column}\n  - {name: a, activation: relu, inputs: [x, b]}\n  - {name: b, activation: relu, inputs: [a]}\n",
     r"cycle in the skeleton: .*a -> b|cycle in the skeleton: .*b -> a"),
    (HEAD + "nodes:\n  - {name: x, base: circle, per: column}\n  - {name: a, activation: relu, inputs: [x]}\n  - {name: b, activation: relu, inputs: [x]}\n",
     r"the skeleton has 2 output nodes \(a, b\); exactly one node may feed nothing"),
    (HEAD + "nodes:\n  - {name: x, base: circle, per: column}\n  - {name: a, activation: relu, inputs: [y]}\n",
     r"<s>:5: node 'a' refers to 'y', which is not defined"),
    ("rfsgen: 1\ninput: {shape: [4, 4, 1]}\nnodes:\n  - {name: x, base: circle, per: pixel}\n  - {name: c, activation: relu, conv: {size: 5}}\n",
     r"<s>:5: conv window 5x5 of node 'c' does not fit the 4x4 array 'x'; use a smaller size"),
    (HEAD + "nodes:\n  - {name: x, base: circle, per: column}\n  - {name: o, activation: {name: coefficients, values: [0.5, -0.1]}, inputs: [x]}\n",
     r"<s>:5: node 'o': coefficient a_1 = -0.1 is negative"),
    (HEAD + "nodes:\n  - {name: x, base: circle, per: column}\n  - {name: o, activation: relu, inputs: [x[1]]}\n",
     r"<s>:5: malformed YAML: .*quote node references with indices"),
    ("rfsgen: 2\ninput: {width: 1}\nnodes: []\n", r"<s>:1: schema version 2 is not supported"),
    ("input: {width: 1}\nnodes: []\n", r"missing 'rfsgen: 1'"),
    (HEAD + "nodes:\n  - {name: x, base: circle}\n", r"base 'circle' takes exactly 1 column per node but the node has 4; use 'per: column'"),
    (HEAD + "nodes:\n  - {name: x, base: circle, per: column, columns: [0, 9]}\n", r"column 9 of node 'x' is outside the input row \(0..3\)"),
    (HEAD + "nodes:\n  - {name: x, base: circle, per: column}\n  - {name: x, activation: relu, inputs: [x]}\n", r"node name 'x' is already used"),
    (HEAD + "nodes:\n  - {name: x, base: circle, per: column}\n  - {name: o, activation: relu, inputs: [x], dense: true}\n",
     r"needs exactly one of inputs, conv, pool, dense, each .*\(it has inputs, dense\)"),
    (HEAD + "nodes:\n  - {name: x, base: circle, per: column}\n  - {name: o, activation: {name: exp, beta: -1}, inputs: [x]}\n",
     r"'beta' must be a finite number >= 0"),
    (HEAD + "nodes:\n  - {name: x, base: circle, per: column}\n  - {name: o, activation: relu, inputs: [\"x[7]\"]}\n",
     r"reference 'x\[7\]' in node 'o' is out of range"),
    (HEAD + "nodes:\n  - {name: x, base: circle, per: column}\noutput: y\n", r"'output' names 'y', which is not a node"),
    (HEAD + "nodes:\n  - {name: x, base: circle, per: column, per: all}\n", r"<s>:4: duplicate key 'per'"),
]


@pytest.mark.parametrize("text, pattern", ERRORS, ids=range(len(ERRORS)))
def test_errors_name_file_line_and_fix(text, pattern):
    with pytest.raises(SkeletonError, match=pattern) as info:
        parse_skeleton(text, "<s>")
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(SkeletonError, match="no such skeleton file"):
        load_skeleton(tmp_path / "nope.yaml")


def test_skeleton_objects_are_immutable():
    s = load_skeleton(skeleton_path("shallow-gaussian"))
    with pytest.raises(Exception):
        s.width = 3
    with pytest.raises(Exception):
        s.nodes[0].columns = (1,)
    assert isinstance(s.nodes[0], InputNode) and isinstance(s.nodes[1], InternalNode)
    with pytest.raises(ValueError):
        s.nodes[1].activation.coefficients[0] = 1.0


def test_each_honours_its_name():
    """`each: NAME` reads NAME, not the previous entry (it used to, silently pruning NAME)."""
    s = parse_skeleton("rfsgen: 1\ninput: {width: 4}\nnodes:\n  - {name: a, base: circle, per: column}\n"
                       "  - {name: b, base: binary, per: column}\n  - {name: e, activation: relu, each: a}\n"
                       "  - {name: o, activation: relu, inputs: [e, b]}\n")
    e = [n for n in s.nodes if n.layer == "e"]
    assert len(e) == 4 and all(s.nodes[n.children[0]].layer == "a" for n in e)
    assert not s.unused_inputs
    with pytest.raises(SkeletonError, match=r"refers to 'nosuchnode', which is not defined .*defined: a, b"):
        parse_skeleton("rfsgen: 1\ninput: {width: 4}\nnodes:\n  - {name: a, base: circle, per: column}\n"
                       "  - {name: b, base: binary, per: column}\n  - {name: e, activation: relu, each: nosuchnode}\n")


def test_every_limit_is_a_one_line_error_naming_it():
    """Skeleton files are user input: each hostile construction that used to run for
    minutes, use gigabytes or end in a traceback is refused quickly, naming its limit."""
    import sys
    import time

    sys.path.insert(0, str(ROOT / "tests" / "tools"))
    from fuzz_skeletons import hostile

    expected = {
        "alias-bomb": "expands to more than", "alias-bomb-inputs": "expands to more than",
        "deep-nesting": "nested too deeply", "deep-mapping": "nested too deeply",
        "huge-pixel-image": "over the limit of 250000", "huge-image": "over the limit of 10000000",
        "width-1e9": "over the limit of 10000000", "chain-3000": "over the limit of 1000",
        "fan-in-1e6": "over the limit of 250000", "degree-1e9": "over the limit of 100000",
        "coefficients-1e6": "over the limit of 262144", "beta-1e9": "over the limit of 1000",
        "columns-range-1e12": "go past the input row", "categories-1e18": "over the limit of 2147483648",
        "name-newline": "must start with a letter", "binary-bytes": "not a readable YAML skeleton",
        "empty": "the file is empty", "python-object": "malformed YAML",
    }
    for label, text in hostile():
        if label not in expected:
            continue
        t = time.time()
        with pytest.raises(SkeletonError) as e:
            parse_skeleton(text, label)
        assert expected[label] in str(e.value) and "\n" not in str(e.value), (label, str(e.value))
        assert time.time() - t < 5, label


def test_fuzzed_skeletons_succeed_or_fail_cleanly():
    """A few thousand seeded mutations of the shipped skeletons, corrupted texts and
    hostile constructions: every outcome is a skeleton (which then samples and
    evaluates) or an RfsgenError with a one-line message -- never a traceback."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "tools"))
    from conftest import rows_for
    from fuzz_skeletons import cases
    from rfsgen import RfsgenError, kernel, sample

    counts = {"ok": 0, "error": 0}
    for label, text in cases(seed=2026, n=2500):
        try:
            s = parse_skeleton(text, label)
            s.describe()
            if not s.bound:  # width: auto
                s = s.bind(7)
                s.describe()
            if s.width <= 4000 and len(s.nodes) <= 4000:
                sample(s, 8, seed=1)
                kernel(s, rows_for(s, 2, seed=1))
            counts["ok"] += 1
        except RfsgenError as e:
            assert "\n" not in str(e), (label, str(e))
            counts["error"] += 1
    assert counts["ok"] > 100 and counts["error"] > 1000, counts


def test_per_patch_input_nodes_take_image_windows():
    """'per: patch' makes one input node per K x K window of the image (all channels),
    in (row, column, channel) order; the kernel is the windows' base kernel averaged."""
    import numpy as np

    from rfsgen import kernel

    text = """
rfsgen: 1
input: {shape: [4, 5, 2]}
nodes:
  - {name: p, base: gaussian, scale: 0.7, per: patch, patch: {size: 2, stride: [2, 1]}}
  - {name: out, activation: identity, dense: true}
"""
    s = parse_skeleton(text, "patch.yaml")
    layer = next(layer for layer in s.layers if layer.name == "p")
    assert layer.shape == (2, 4) and len(s.input_nodes) == 8
    first = s.nodes[layer.ids[0]].columns
    assert first == (0, 1, 2, 3, 10, 11, 12, 13)  # pixels (0,0), (0,1), (1,0), (1,1), two channels each
    last = s.nodes[layer.ids[-1]].columns
    assert last == (26, 27, 28, 29, 36, 37, 38, 39)  # pixels (2,3), (2,4), (3,3), (3,4)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((3, 40)), rng.standard_normal((2, 40))
    img = lambda r: r.reshape(4, 5, 2)  # noqa: E731
    want = np.zeros((3, 2))
    for i in range(3):
        for j in range(2):
            d = [np.sum((img(x[i])[a:a + 2, b:b + 2] - img(y[j])[a:a + 2, b:b + 2]) ** 2)
                 for a in (0, 2) for b in range(4)]
            want[i, j] = np.mean(np.exp(-0.49 * np.array(d) / 2))
    np.testing.assert_allclose(kernel(s, x, y), want, rtol=0, atol=1e-13)


@pytest.mark.parametrize("body, msg", [
    ("{name: p, base: gaussian, per: patch}", r"'per: patch' needs 'patch: \{size: K, stride: S\}'"),
    ("{name: p, base: gaussian, per: pixel, patch: {size: 2}}", "'patch' needs 'per: patch'"),
    ("{name: p, base: gaussian, per: patch, patch: {size: 5}}", "patch 5x5 of node 'p' does not fit the 4x4 image"),
    ("{name: p, base: gaussian, per: patch, patch: {size: 0}}", "'size' of 'patch' in node 'p' must be a positive"),
])
def test_per_patch_errors(body, msg):
    text = f"rfsgen: 1\ninput: {{shape: [4, 4, 1]}}\nnodes:\n  - {body}\n  - {{name: o, activation: relu, dense: true}}\n"
    with pytest.raises(SkeletonError, match=msg):
        parse_skeleton(text, "t.yaml")
