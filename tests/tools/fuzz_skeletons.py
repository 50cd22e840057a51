"""A seeded generator of hostile and mutated skeleton texts (used by tests/test_fuzz.py).

``cases(seed, n)`` yields ``(label, text)``: structural mutations of the shipped and
test skeletons (values replaced by hostile ones, keys dropped or added, entries
duplicated, reordered or renamed), text-level corruption (characters inserted,
deleted, replaced, lines duplicated or dropped, odd Unicode and control bytes), and
constructions known to be dangerous (alias bombs, deep nesting, huge shapes and
widths, long chains, huge fan-in and degrees).
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]

HOSTILE = [None, True, False, -1, 0, 1, 2, 3, 7, 10**9, 10**18, 2**70, -(2**63), 1.5, -0.0, 1e308, float("nan"),
           float("inf"), "", "x", "all", "0:5", "5:0", "0:99999999999", ":", "a[0]", "pixels[0, 0]", "nosuch",
           "out\n", "é", "\x00", "x" * 300, [], {}, [1, 2], ["a", "b"], {"name": "x"}, {"size": 2},
           {"size": 0}, {"size": [2, 2], "stride": [1, 0]}, {"name": "exp", "beta": -1}, "relu", "step",
           {"name": "polynomial", "degree": 10**9}, {"name": "coefficients", "values": [1] * 5},
           {"name": "coefficients", "values": [-1, 2]}, [[[[1]]]], "gaussian", "sphere", "categorical", "pixel",
           "column", "group", [24, 24, 3], [10**5, 10**5, 1], [2, 2, 0]]
KEYS = ["name", "base", "activation", "inputs", "conv", "pool", "dense", "each", "from", "per", "columns", "group",
        "scale", "categories", "scheme", "zero", "width", "shape", "output", "rfsgen", "nodes", "input", "bogus"]
CHARS = ["\t", "\n", " ", ":", "-", "[", "]", "{", "}", ",", "&a", "*a", "!!python/object", "#", "'", '"', "|",
         ">", "%", "@", "`", "\x07", "\x1b", "\ufeff", "\u2028", "é", "\U0001F600", "\x85", "\ud800", "\x00"]


def _sources() -> list[str]:
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import SMALL_SKELETONS

    shipped = [p.read_text() for p in sorted((ROOT / "skeletons").glob("*.yaml"))]
    return shipped + list(SMALL_SKELETONS.values())


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _set(obj, path, value):
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


def _structural(rng: random.Random, doc):
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = rng.choice(paths)
        op = rng.random()
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        if op < 0.5:
            _set(doc, path, copy.deepcopy(rng.choice(HOSTILE)))
        elif op < 0.65 and isinstance(parent, dict):
            parent.pop(path[-1], None)
        elif op < 0.8 and isinstance(parent, dict):
            parent[rng.choice(KEYS)] = copy.deepcopy(rng.choice(HOSTILE))
        elif isinstance(parent, list) and parent:
            i = rng.randrange(len(parent))
            choice = rng.random()
            if choice < 0.4:
                parent.insert(rng.randrange(len(parent) + 1), copy.deepcopy(parent[i]))
            elif choice < 0.7:
                parent.pop(i)
            else:
                rng.shuffle(parent)
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)


def _textual(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 6)):
        op = rng.random()
        i = rng.randrange(len(chars) + 1)
        if op < 0.35:
            chars[i:i] = list(rng.choice(CHARS))
        elif op < 0.6 and chars:
            del chars[min(i, len(chars) - 1)]
        elif op < 0.8 and chars:
            chars[min(i, len(chars) - 1)] = rng.choice(CHARS)
        else:
            lines = "".join(chars).split("\n")
            j = rng.randrange(len(lines))
            if rng.random() < 0.5:
                lines.insert(j, lines[j])
            else:
                lines.pop(j)
            chars = list("\n".join(lines))
    return "".join(chars)


def hostile() -> list[tuple[str, str]]:
    """Constructions that used to run for minutes, eat gigabytes or crash."""
    head = "rfsgen: 1\ninput: {width: 4}\nnodes:\n  - {name: c, base: circle, per: column}\n"
    bomb = "rfsgen: 1\na0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]\n"
        for i in range(1, 9)) + "input: {width: 2}\nnodes: *a8\n"
    chain = head + "".join(f"  - {{name: h{i}, activation: relu, inputs: [{'c' if i == 0 else f'h{i - 1}'}]}}\n"
                           for i in range(3000))
    return [
        ("alias-bomb", bomb),
        ("alias-bomb-inputs", bomb.replace("nodes: *a8", "nodes:\n  - {name: c, base: circle, per: column}\n"
                                                     "  - {name: o, activation: relu, inputs: *a8}")),
        ("deep-nesting", "rfsgen: 1\ninput: " + "[" * 5000 + "]" * 5000 + "\n"),
        ("deep-mapping", "rfsgen: 1\ninput: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n"),
        ("huge-pixel-image", "rfsgen: 1\ninput: {shape: [2000, 2000, 1]}\nnodes:\n"
                             "  - {name: p, base: sphere, per: pixel, scheme: pair}\n"
                             "  - {name: o, activation: relu, dense: true}\n"),
        ("huge-image", "rfsgen: 1\ninput: {shape: [10000, 10000, 3]}\nnodes:\n  - {name: p, base: sphere}\n"
                       "  - {name: o, activation: relu, inputs: [p]}\n"),
        ("width-1e9", "rfsgen: 1\ninput: {width: 1000000000}\nnodes:\n  - {name: p, base: sphere}\n"
                      "  - {name: o, activation: relu, inputs: [p]}\n"),
        ("chain-3000", chain),
        ("fan-in-1e6", "rfsgen: 1\ninput: {width: 1000000}\nnodes:\n  - {name: c, base: circle, per: column}\n"
                       "  - {name: o, activation: relu, dense: true}\n"),
        ("degree-1e9", head + "  - {name: o, activation: {name: polynomial, degree: 1000000000}, inputs: [c]}\n"),
        ("coefficients-1e6", head + "  - {name: o, activation: {name: coefficients, values: ["
                              + ", ".join(["1"] * 1_000_000) + "]}, inputs: [c]}\n"),
        ("beta-1e9", head + "  - {name: o, activation: {name: exp, beta: 1.0e+9}, inputs: [c]}\n"),
        ("columns-range-1e12", "rfsgen: 1\ninput: {width: 4}\nnodes:\n"
                               "  - {name: c, base: circle, per: column, columns: '0:1000000000000'}\n"
                               "  - {name: o, activation: relu, inputs: [c]}\n"),
        ("categories-1e18", "rfsgen: 1\ninput: {width: 1}\nnodes:\n  - {name: c, base: categorical, categories: "
                            "1000000000000000000}\n  - {name: o, activation: relu, inputs: [c]}\n"),
        ("name-newline", 'rfsgen: 1\ninput: {width: 2}\nnodes:\n  - {name: "c\\n", base: circle, per: column}\n'
                         '  - {name: o, activation: relu, inputs: ["c\\n"]}\n'),
        ("step-stack", head + "".join(f"  - {{name: s{i}, activation: step, inputs: [{'c' if i == 0 else f's{i - 1}'}]}}\n"
                                      for i in range(6))),
        ("exp-stack", head + "".join(f"  - {{name: s{i}, activation: {{name: exp, beta: 50}}, inputs: "
                                     f"[{'c' if i == 0 else f's{i - 1}'}]}}\n" for i in range(6))),
        ("binary-bytes", "rfsgen: 1\n\x00\x01\x02\xff\xfe"),
        ("empty", ""),
        ("python-object", "!!python/object/apply:os.system ['true']\n"),
    ]


def cases(seed: int, n: int):
    rng = random.Random(seed)
    sources = _sources()
    docs = [yaml.safe_load(t) for t in sources]
    yield from hostile()
    for k in range(n):
        i = rng.randrange(len(sources))
        if rng.random() < 0.55:
            yield f"structural-{k}", _structural(rng, docs[i])
        else:
            yield f"textual-{k}", _textual(rng, sources[i])
