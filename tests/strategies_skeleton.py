"""Hypothesis strategies for skeleton texts, valid and hostile, and the oracle that
judges what :func:`rfsgen.parse_skeleton` does with them.

Importable from any test (``tests/`` is on pytest's path, see conftest.py) and from
the fuzz harness::

    from strategies_skeleton import skeleton_texts, check_parse
    @given(skeleton_texts())
    def test_x(case): check_parse(*case)

``valid_skeletons()`` draws ``(label, text)`` of skeletons that parse;
``hostile_skeletons()`` draws texts built to break the parser: YAML that cannot be
constructed (dates, long integers, bad ``!!int``/``!!bool``/``!!float``, foreign
tags), recursive aliases and alias fan-out, templates whose expansion is far over
the limits (conv, pool, per: patch, per: group with width: auto, inputs fan-out,
column ranges), out-of-range numbers and wrongly typed values; ``skeleton_texts()``
draws from both.  :func:`check_parse` is the oracle: a valid :class:`Skeleton`, or a
:class:`SkeletonError`/:class:`LimitError` whose message is one line naming the
file, within a bound on its work (function calls); never another exception.
"""

from __future__ import annotations

import yaml
from hypothesis import strategies as st

from rfsgen import parse_skeleton
from rfsgen.errors import LimitError, SkeletonError
from rfsgen.skeleton import MAX_EDGES, MAX_WIDTH, Skeleton

#: Function calls (Python and C, counted by :func:`calls`) one parse may make: work
#: bounded by a count, so that a slow or loaded machine cannot fail a test (issue 37,
#: item 11).  A refused hostile skeleton makes at most ~5 million (chain-3000, refused
#: at its 1,001st layer; most make under 100,000); what these limits stop (alias
#: bombs, 1e9-node templates) made billions.
CALL_LIMIT = 50_000_000
#: For skeletons built to be refused: 4 times chain-3000's count.  The generated hostile
#: cases make at most ~800,000 (a refused 'inputs' fan-out).
HOSTILE_CALL_LIMIT = 20_000_000


class TooMuchWork(AssertionError):
    """Raised inside the measured code once it makes more calls than allowed."""


def calls(fn, limit: int = CALL_LIMIT):
    """``(fn(), n)``: what ``fn()`` returns and the function calls (Python and C) it
    made, counted with :func:`sys.setprofile` in this thread.  Past ``limit`` calls the
    work is stopped with :class:`TooMuchWork` (an AssertionError naming the count), so a
    runaway parse fails the test at once instead of running for minutes.  The count
    does not depend on the machine's speed or load, unlike a wall-clock time."""
    import sys

    n = 0

    def hook(frame, event, arg):
        nonlocal n
        if event == "call" or event == "c_call":
            n += 1
            if n > limit:
                sys.setprofile(None)
                raise TooMuchWork(f"more than {limit:,} function calls")

    old = sys.getprofile()
    sys.setprofile(hook)
    try:
        out = fn()
    finally:
        sys.setprofile(old)
    if n > limit:  # stopped, though the code caught TooMuchWork and went on
        raise TooMuchWork(f"more than {limit:,} function calls")
    return out, n

ACTIVATIONS = st.one_of(
    st.sampled_from(["relu", "step", "identity", "tanh", "erf", "sigmoid", "gelu", "silu", "softplus", "sin",
                     "cos", "abs"]),
    st.builds(lambda b: {"name": "exp", "beta": b}, st.floats(0, 1000, allow_nan=False)),
    st.builds(lambda d, c: {"name": "polynomial", "degree": d, "c": c},
              st.one_of(st.integers(1, 40), st.integers(1000, 1100), st.just(100_000)),
              st.one_of(st.just(0.0), st.floats(0, 10), st.floats(0, 1e300))),
    st.builds(lambda v: {"name": "coefficients", "values": v},
              st.lists(st.floats(0, 1e300), min_size=1, max_size=6).filter(lambda v: sum(v) > 0)),
)


def _dump(doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=10**6)


@st.composite
def valid_docs(draw):
    """A skeleton document (a dict) that parses: a vector input (fixed or auto
    width) with column/group/all input nodes, or an image with pixel/patch input
    nodes and conv/pool/each layers; internal layers over them to one output."""
    nodes = []
    image = draw(st.booleans())
    if image:
        h, w, c = draw(st.integers(2, 12)), draw(st.integers(2, 12)), draw(st.integers(1, 3))
        doc = {"rfsgen": 1, "input": {"shape": [h, w, c]}}
        if draw(st.booleans()):
            nodes.append({"name": "px", "base": "sphere", "per": "pixel"} if c > 1 else
                         {"name": "px", "base": "circle", "per": "pixel"})
            oh, ow = h, w
        else:
            k = draw(st.integers(1, min(h, w)))
            s = draw(st.integers(1, 3))
            nodes.append({"name": "px", "base": draw(st.sampled_from(["gaussian", "laplace"])), "per": "patch",
                          "patch": {"size": k, "stride": s}})
            oh, ow = (h - k) // s + 1, (w - k) // s + 1
        for i in range(draw(st.integers(0, 2))):
            kind = draw(st.sampled_from(["conv", "pool", "each"]))
            name = f"l{i}"
            if kind == "each":
                nodes.append({"name": name, "activation": draw(ACTIVATIONS), "each": nodes[-1]["name"]})
                continue
            k = draw(st.integers(1, min(oh, ow)))
            # strides that tile the array exactly: a window left out would leave internal nodes feeding nothing
            s = draw(st.sampled_from([d for d in range(1, k + 1) if (oh - k) % d == 0 and (ow - k) % d == 0]))
            entry = {"name": name, kind: {"size": k, "stride": s}}
            if kind == "conv":
                entry["activation"] = draw(ACTIVATIONS)
            nodes.append(entry)
            oh, ow = (oh - k) // s + 1, (ow - k) // s + 1
        nodes.append({"name": "out", "activation": draw(ACTIVATIONS), "dense": True})
    else:
        auto = draw(st.booleans())
        width = draw(st.integers(1, 40))
        per = draw(st.sampled_from(["all", "column", "group"]))
        entry = {"name": "x", "base": {"all": "gaussian", "column": "circle", "group": "laplace"}[per], "per": per}
        if per == "group":
            g = draw(st.sampled_from([d for d in range(1, width + 1) if width % d == 0]))
            entry["group"] = g
            if auto:
                width = g * draw(st.integers(1, 5))
        doc = {"rfsgen": 1, "input": {"width": "auto" if auto else width}}
        nodes.append(entry)
        for i in range(draw(st.integers(0, 3))):
            nodes.append({"name": f"h{i}", "activation": draw(ACTIVATIONS),
                          draw(st.sampled_from(["dense", "inputs"])): True})
            if "inputs" in nodes[-1]:
                nodes[-1]["inputs"] = [nodes[-2]["name"]]
        nodes.append({"name": "out", "activation": draw(ACTIVATIONS), "inputs": [nodes[-1]["name"]]})
    if draw(st.booleans()):
        doc["description"] = draw(st.text(max_size=30))
    doc["nodes"] = nodes
    return doc


def valid_skeletons():
    """``(label, text)`` of skeletons that parse (see :func:`valid_docs`)."""
    return valid_docs().map(lambda d: ("valid", _dump(d)))


# ----------------------------------------------------------------------------- hostile
HEAD = "rfsgen: 1\ninput: {width: 4}\nnodes:\n  - {name: a, base: circle, per: column}\n"
TAIL = "  - {name: o, activation: relu, inputs: [a]}\n"

#: YAML scalars that cannot be built into a skeleton value, or are foreign tags.
BAD_SCALARS = ["2001-02-30", "2001-02-29 10:00:00", "!!int six", "!!int 0x", "!!bool maybe", "!!bool 2",
               "!!float x", "!!float [1]", "!!null [1]", "!!str {a: 1}", "!!timestamp 2001-01-01", "!!binary aGk=",
               "!!binary '*'", "!!set {a, b}", "!!omap [a: 1]", "!!pairs [a: 1]", "!!python/object/apply:os.system [ls]",
               "!!python/name:os.system", "!foo 1", "!<tag:example.com,2000:x> 1", "!!merge x", "!!value x",
               "!!seq {a: 1}", "!!map [1]", "="]


@st.composite
def bad_yaml_values(draw):
    """A valid skeleton with one value replaced by an unconstructable YAML scalar."""
    value = draw(st.one_of(
        st.sampled_from(BAD_SCALARS),
        st.builds(lambda n: "9" * n, st.integers(90, 6000)),  # long integers (Python refuses > 4,300 digits)
        st.builds(lambda n: ":".join(["1"] * n), st.integers(30, 3000)),  # base-60 integers
        st.builds(lambda n, s: f"!!int {'-' if s else ''}0x{'f' * n}", st.integers(50, 5000), st.booleans()),
    ))
    where = draw(st.sampled_from(["rfsgen", "width", "description", "base", "scale", "beta", "name", "key"]))
    if where == "rfsgen":
        return "bad-yaml", f"rfsgen: {value}\ninput: {{width: 4}}\nnodes: []\n"
    if where == "width":
        return "bad-yaml", f"rfsgen: 1\ninput: {{width: {value}}}\nnodes:\n  - {{name: a, base: gaussian}}\n"
    if where == "description":
        return "bad-yaml", f"rfsgen: 1\ndescription: {value}\n" + HEAD[10:] + TAIL
    if where == "key":
        return "bad-yaml", HEAD + f"  - {{name: o, activation: relu, inputs: [a], {value}: 1}}\n"
    if where == "beta":
        return "bad-yaml", HEAD + f"  - {{name: o, activation: {{name: exp, beta: {value}}}, inputs: [a]}}\n"
    if where == "scale":
        return "bad-yaml", f"rfsgen: 1\ninput: {{width: 4}}\nnodes:\n  - {{name: a, base: circle, scale: {value}, per: column}}\n" + TAIL
    if where == "base":
        return "bad-yaml", f"rfsgen: 1\ninput: {{width: 4}}\nnodes:\n  - {{name: a, base: {value}, per: column}}\n" + TAIL
    return "bad-yaml", f"rfsgen: 1\ninput: {{width: 4}}\nnodes:\n  - {{name: {value}, base: circle, per: column}}\n" + TAIL


@st.composite
def alias_cycles(draw):
    """Recursive aliases at any depth: ``&a [1, *a]``, merges of a mapping into
    itself, cycles through nested lists and mappings, anywhere in the document."""
    depth = draw(st.integers(0, 6))
    inner = "*a"
    for _ in range(depth):
        inner = draw(st.sampled_from(["[{x}]", "[1, {x}]", "{{k: {x}}}", "{{k: [{x}, 2]}}"])).format(x=inner)
    kind = draw(st.sampled_from(["seq", "map", "merge"]))
    value = {"seq": f"&a [1, {inner}]", "map": f"&a {{k: {inner}}}", "merge": "&a {x: 1, <<: *a}"}[kind]
    where = draw(st.sampled_from(["description", "input", "nodes", "extra"]))
    if where == "description":
        return "alias-cycle", f"rfsgen: 1\ndescription: {value}\n" + HEAD[10:] + TAIL
    if where == "input":
        return "alias-cycle", f"rfsgen: 1\ninput: {value}\nnodes: []\n"
    if where == "nodes":
        return "alias-cycle", f"rfsgen: 1\ninput: {{width: 4}}\nnodes: {value}\n"
    return "alias-cycle", HEAD + f"  - {{name: o, activation: relu, inputs: [a], x: {value}}}\n"


@st.composite
def alias_fanout(draw):
    """Billion-laughs documents: each level lists the previous one ``fan`` times."""
    fan, levels = draw(st.integers(2, 12)), draw(st.integers(2, 12))
    lines = [f"l0: &l0 [{', '.join(['x'] * fan)}]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fan)}]")
    anchors = "description:\n" + "".join(f"  {ln}\n" for ln in lines)
    if draw(st.booleans()):
        return "alias-fanout", "rfsgen: 1\n" + anchors + HEAD[10:] + TAIL
    # the expanded list feeds 'inputs' (a node may take the same child many times)
    return "alias-fanout", ("rfsgen: 1\n" + anchors.replace("[x", "[a").replace(", x", ", a") + HEAD[10:]
                            + f"  - {{name: o, activation: relu, inputs: *l{levels - 1}}}\n")


@st.composite
def huge_templates(draw):
    """Templates whose parameters are each legal but whose expansion is over the
    limits (each case is, so it is refused from the arithmetic): conv/pool windows over large pixel arrays, overlapping patches, width:
    auto groups, references to a large array repeated, long column ranges."""
    kind = draw(st.sampled_from(["conv", "pool", "patch", "group", "fanout", "columns"]))
    if kind in ("conv", "pool"):
        # The pixel layer below is legal and is built (side^2 nodes, ~1 s); windows of a third
        # to two thirds of the side give (side - size + 1)^2 size^2 > 2.5e7 child references.
        side = draw(st.integers(150, 250))
        size = draw(st.integers(side // 3 + 1, 2 * side // 3))
        entry = (f"{{name: c, activation: relu, conv: {{size: {size}, stride: 1}}}}" if kind == "conv"
                 else f"{{name: c, pool: {{size: {size}, stride: 1}}}}")
        return "huge-" + kind, (f"rfsgen: 1\ninput: {{shape: [{side}, {side}, 1]}}\nnodes:\n"
                                f"  - {{name: p, base: circle, per: pixel}}\n  - {entry}\n"
                                "  - {name: o, activation: relu, dense: true}\n")
    if kind == "patch":
        side, c = draw(st.integers(100, 1000)), draw(st.integers(1, 10))
        side = max(300, min(side, int((MAX_WIDTH // c) ** 0.5)))
        size = draw(st.integers(side // 3 + 1, 2 * side // 3))
        return "huge-patch", (f"rfsgen: 1\ninput: {{shape: [{side}, {side}, {c}]}}\nnodes:\n"
                              f"  - {{name: p, base: gaussian, per: patch, patch: {{size: {size}, stride: 1}}}}\n"
                              "  - {name: o, activation: relu, dense: true}\n")
    if kind == "group":
        g1, g2 = draw(st.integers(MAX_WIDTH // 4, 10**12)), draw(st.integers(2, 10**9))
        return "huge-group", ("rfsgen: 1\ninput: {width: auto}\nnodes:\n"
                              f"  - {{name: p, base: gaussian, per: group, group: {g1}}}\n"
                              f"  - {{name: q, base: gaussian, per: group, group: {g2}}}\n"
                              "  - {name: o, activation: relu, inputs: [p, q]}\n")
    if kind == "fanout":
        side = draw(st.integers(60, 100))
        reps = draw(st.integers(MAX_EDGES // side**2 + 1, 2 * MAX_EDGES // side**2))
        return "huge-fanout", (f"rfsgen: 1\ninput: {{shape: [{side}, {side}, 1]}}\nnodes:\n"
                               "  - {name: p, base: circle, per: pixel}\n"
                               f"  - {{name: o, activation: relu, inputs: [{', '.join(['p'] * reps)}]}}\n")
    if kind == "columns":
        width, reps = draw(st.integers(10**6, MAX_WIDTH)), draw(st.integers(MAX_EDGES // 10**6 + 1, 5000))
        cols = ", ".join([f'"0:{width}"'] * reps)
        return "huge-columns", (f"rfsgen: 1\ninput: {{width: {width}}}\nnodes:\n"
                                f"  - {{name: p, base: gaussian, columns: [{cols}]}}\n")
    raise AssertionError(kind)


OUT_OF_RANGE = {
    "width": ["0", "-1", str(MAX_WIDTH + 1), "1.5", "1e400", "true", "null", "[1]", "'4'", "{a: 1}"],
    "degree": ["0", "-3", "100001", "1.0", "10000000000000000000000", "true", "'2'", "[2]"],
    "beta": ["-1", "1000.0000001", "1e400", ".nan", ".inf", "-.inf", "'1'", "null", "[1]"],
    "c": ["-1e-300", ".nan", ".inf", "1e400", "'x'", "[0]"],
    "values": ["[]", "[-1]", "[0, 0]", "[.nan]", "[1e400]", "'x'", "[[1]]", "[1e308, 1e308, 1e308]"],
    "size": ["0", "-1", "[1, 2, 3]", "1.5", "100000000000000000000", "true", "[0, 1]"],
    "stride": ["0", "-2", "[1, 0]", "'2'", "null"],
    "categories": ["0", "1", "2147483649", "1.5", "'3'"],
    "scale": ["0", "-1", ".nan", ".inf", "1e400", "'x'"],
    "group": ["0", "3", "-1", "1.5", "true", "100000000"],
}


@st.composite
def out_of_range(draw):
    """One number or typed value replaced by an out-of-range or wrongly typed one."""
    key = draw(st.sampled_from(sorted(OUT_OF_RANGE)))
    v = draw(st.sampled_from(OUT_OF_RANGE[key]))
    texts = {
        "width": f"rfsgen: 1\ninput: {{width: {v}}}\nnodes:\n  - {{name: a, base: gaussian}}\n",
        "degree": HEAD + f"  - {{name: o, activation: {{name: polynomial, degree: {v}}}, inputs: [a]}}\n",
        "beta": HEAD + f"  - {{name: o, activation: {{name: exp, beta: {v}}}, inputs: [a]}}\n",
        "c": HEAD + f"  - {{name: o, activation: {{name: polynomial, degree: 2, c: {v}}}, inputs: [a]}}\n",
        "values": HEAD + f"  - {{name: o, activation: {{name: coefficients, values: {v}}}, inputs: [a]}}\n",
        "size": "rfsgen: 1\ninput: {shape: [6, 6, 1]}\nnodes:\n  - {name: p, base: circle, per: pixel}\n"
                f"  - {{name: c, activation: relu, conv: {{size: {v}}}}}\n  - {{name: o, activation: relu, dense: true}}\n",
        "stride": "rfsgen: 1\ninput: {shape: [6, 6, 1]}\nnodes:\n  - {name: p, base: circle, per: pixel}\n"
                  f"  - {{name: c, pool: {{size: 2, stride: {v}}}}}\n  - {{name: o, activation: relu, dense: true}}\n",
        "categories": f"rfsgen: 1\ninput: {{width: 3}}\nnodes:\n  - {{name: a, base: categorical, categories: {v}, "
                      "per: column}\n" + TAIL,
        "scale": f"rfsgen: 1\ninput: {{width: 3}}\nnodes:\n  - {{name: a, base: circle, scale: {v}, per: column}}\n" + TAIL,
        "group": f"rfsgen: 1\ninput: {{width: {draw(st.sampled_from(['4', 'auto']))}}}\nnodes:\n"
                 f"  - {{name: a, base: sphere, per: group, group: {v}}}\n" + TAIL,
    }
    return "out-of-range-" + key, texts[key]


@st.composite
def mutated_texts(draw):
    """A valid skeleton's text cut, with characters inserted, deleted or replaced."""
    text = _dump(draw(valid_docs()))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["insert", "delete", "replace", "truncate"]))
        i = draw(st.integers(0, len(text)))
        junk = draw(st.sampled_from(["&a ", "*a", "*b", "<<: *a", "!!int ", "!foo ", "[", "]", "{", "}", ":", "-",
                                     "\n", "\t", "'", '"', "|", "%", "@", "\x00", "\ufeff", "é", "2001-02-30", "9" * 200]))
        if op == "insert":
            text = text[:i] + junk + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 8)):]
        elif op == "replace":
            text = text[:i] + junk + text[i + len(junk):]
        else:
            text = text[:i]
    return "mutated", text


def hostile_skeletons():
    """``(label, text)`` of skeleton texts built to break the parser (see module docstring)."""
    return st.one_of(bad_yaml_values(), alias_cycles(), alias_fanout(), huge_templates(), out_of_range(),
                     mutated_texts())


def skeleton_texts():
    """Valid and hostile ``(label, text)`` pairs."""
    return st.one_of(valid_skeletons(), hostile_skeletons())


# ----------------------------------------------------------------------------- oracle
def check_parse(label: str, text: str, call_limit: int = CALL_LIMIT):
    """The oracle: ``parse_skeleton`` returns a valid :class:`Skeleton` (which
    describes itself) or raises SkeletonError/LimitError with a one-line message
    naming the file, within ``call_limit`` function calls (:func:`calls`); any other
    exception propagates (a test failure).  Returns the Skeleton, or the error."""
    path = f"{label}.yaml"

    def parse():
        try:
            skel = parse_skeleton(text, path)
            assert isinstance(skel, Skeleton)
            skel.describe()
            return skel
        except (SkeletonError, LimitError) as e:
            return e

    outcome, _ = calls(parse, call_limit)
    if isinstance(outcome, (SkeletonError, LimitError)):
        msg = str(outcome)
        assert "\n" not in msg and "\r" not in msg, (label, msg)
        assert path in msg, (label, msg)
        assert "Traceback" not in msg, (label, msg)
    return outcome
