"""Skeleton cases: valid random skeletons (every base, activation and wiring), then mutated:
YAML that cannot be constructed (bad tags, impossible dates, huge integers), alias and merge-key
cycles, alias bombs, deep nesting, bad bytes; huge template parameters (conv/patch/group sizes,
widths, degrees, betas, categories, stacked layers); wrong types and out-of-range values.

The case holds the skeleton's text itself (small), so it replays without its generator.
"""

from __future__ import annotations

import json

import numpy as np

BASES = ["binary", "circle", "categorical", "gaussian", "laplace", "sphere"]
ACTIVATIONS = ["identity", "exp", "relu", "step", "polynomial", "coefficients", "tanh", "erf", "sigmoid", "gelu",
               "silu", "softplus", "sin", "cos", "abs", "leaky_relu", "elu", "arccos", "function"]
#: expressions for {name: function}: valid ones, and ones the parser or the projection must refuse
EXPRESSIONS = ["where(x > 0, x, 0.1 * x)", "tanh(x) + 0.5 * x", "maximum(x, 0) ** 2", "exp(x ** 2)", "0 * x",
               "__import__('os').system('true')", "x.__class__", "(" * 30 + "x" + ")" * 30, "x +" * 300 + " x",
               "1 / x", "log(x)", "sin(x) if x else 0", "[x]", "x ** 1e9", "lambda: x", "abs(x) * 1e308"]
RAW_TOKENS = ["2001-02-30", "!!int six", "!!bool maybe", "1" + "0" * 5000, "-" + "9" * 4400, "!!float inf", ".nan",
              "-.inf", "!!python/name:os.system", "!!python/object/apply:os.getcwd []", "!!binary AAAA", "~", "[]",
              "{}", "!!set {a, b}", "!!timestamp 2001-13-45", "0x7fffffffffffffffffffff", "0o777", "1_000",
              "!!str 5", "*undefined", "!!omap [a: 1]", "1e400", "-1e400", "\"\\0\"", "2001-02-29 25:61:00",
              "!!int 0b102", "!!float abc", "true", "-0", "9223372036854775808", "-9223372036854775809",
              "18446744073709551616", "0.1", "-1", "0", "2147483648", "4294967297", "1e308", "5e-324", "\"1\"",
              "[1, 2]", "{a: 1}", "!!null ''", "!<tag:yaml.org,2002:int> 12a", "!!merge <<", "?"]


def _activation(rng):
    name = ACTIVATIONS[rng.integers(len(ACTIVATIONS))]
    if name == "exp":
        return {"name": "exp", "beta": float(np.round(rng.uniform(0.01, 3), 3))}
    if name == "polynomial":
        return {"name": "polynomial", "degree": int(rng.integers(1, 8)), "c": float(np.round(rng.uniform(0, 2), 2))}
    if name == "coefficients":
        return {"name": "coefficients", "values": [float(np.round(v, 3)) for v in rng.uniform(0, 1, rng.integers(1, 6))]}
    if name == "leaky_relu":
        return {"name": name, "slope": float(np.round(rng.uniform(-0.5, 1.5), 2))}
    if name == "elu":
        return {"name": name, "alpha": float(np.round(rng.uniform(-0.5, 3), 2))}
    if name == "arccos":
        return {"name": name, "degree": int(rng.integers(-1, 5))}
    if name == "function":
        return {"name": name, "expr": EXPRESSIONS[rng.integers(len(EXPRESSIONS))]}
    return name if rng.random() < 0.7 else {"name": name}


def _base(rng, base, flat_ok=True):
    e = {"base": base}
    if base in ("circle", "gaussian", "laplace") and rng.random() < 0.8:
        e["scale"] = float(np.round(rng.uniform(0.05, 2), 3))
    if base == "categorical":
        e["categories"] = int(rng.integers(2, 6))
    if base == "sphere":
        e["scheme"] = str(rng.choice(["pair", "coordinate"]))
        e["zero"] = "uniform"
    return e


def valid(rng):
    """(skeleton dict, width or None for auto, rows mode, bind width)."""
    kind = rng.choice(["flat", "flat", "image", "auto"])
    discrete = rng.choice(["none", "none", "none", "binary", "categorical"])
    pool = ["circle", "gaussian", "laplace", "sphere"]
    if discrete == "binary":
        pool = ["binary"]
    elif discrete == "categorical":
        pool = ["categorical"]
    nodes = []
    if kind == "image":
        h, w, c = (int(v) for v in (rng.integers(2, 9), rng.integers(2, 9), rng.integers(1, 4)))
        inp = {"shape": [h, w, c]}
        width = h * w * c
        base = str(rng.choice([b for b in pool if b not in ("circle",)] or ["gaussian"]))
        if base in ("binary", "categorical", "circle"):
            base = "gaussian"
            discrete = "none"
        per = rng.choice(["pixel", "patch", "all"])
        e = {"name": "px", **_base(rng, base), "per": str(per)}
        gh, gw = (h, w) if per == "pixel" else (1, 1)
        if per == "patch":
            k = int(rng.integers(1, min(h, w) + 1))
            s = int(rng.integers(1, 3))
            e["patch"] = {"size": k, "stride": s}
            gh, gw = (h - k) // s + 1, (w - k) // s + 1
        nodes.append(e)
        prev = "px"
        if gh * gw > 1 and rng.random() < 0.8:
            k = int(rng.integers(1, min(gh, gw) + 1))
            s = int(rng.integers(1, 3))
            if rng.random() < 0.3:
                nodes.append({"name": "pool", "pool": {"size": k, "stride": s}})
            else:
                nodes.append({"name": "conv", "activation": _activation(rng), "conv": {"size": k, "stride": s}})
            prev = nodes[-1]["name"]
        nodes.append({"name": "out", "activation": _activation(rng), "dense": True, "from": prev})
        return {"rfsgen": 1, "input": inp, "nodes": nodes}, width, discrete, None
    if kind == "auto":
        inp = {"width": "auto"}
        width = None
        bind = int(rng.integers(1, 13))
    else:
        width = int(rng.integers(1, 13))
        inp = {"width": width}
        bind = None
    names = []
    for i in range(int(rng.integers(1, 4))):
        base = str(rng.choice(pool))
        e = {"name": f"in{i}", **_base(rng, base)}
        per = rng.choice(["all", "column", "column", "group"])
        if base in ("circle", "binary", "categorical"):
            per = "column"
        if per == "group":
            wd = width or bind
            divisors = [g for g in range(1, wd + 1) if wd % g == 0]
            e["per"], e["group"] = "group", int(rng.choice(divisors))
        else:
            e["per"] = str(per)
        if width and width > 1 and rng.random() < 0.3:
            a = int(rng.integers(0, width - 1))
            e["columns"] = f"{a}:{int(rng.integers(a + 1, width + 1))}"
        nodes.append(e)
        names.append(e["name"])
    depth = int(rng.integers(1, 4))
    prev = names
    for j in range(depth):
        name = "out" if j == depth - 1 else f"h{j}"
        if j > 0 and rng.random() < 0.2 and j < depth - 1:
            nodes.append({"name": name, "activation": _activation(rng), "each": prev[0]})
        else:
            nodes.append({"name": name, "activation": _activation(rng), "inputs": list(prev)})
        prev = [name]
    return {"rfsgen": 1, "input": inp, "nodes": nodes}, width, discrete, bind


def render(sk: dict, desc: str = "fuzz", raw: dict | None = None) -> str:
    """YAML text: flow-style (JSON) nodes; ``raw`` maps placeholder strings to raw YAML tokens."""
    lines = ["rfsgen: " + json.dumps(sk.get("rfsgen", 1)), "description: " + desc,
             "input: " + json.dumps(sk.get("input")), "nodes:"]
    for n in sk.get("nodes", []):
        lines.append("  - " + json.dumps(n))
    if "output" in sk:
        lines.append("output: " + json.dumps(sk["output"]))
    if "params" in sk:
        lines.append("params: " + json.dumps(sk["params"]))
    text = "\n".join(lines) + "\n"
    for k, v in (raw or {}).items():
        text = text.replace(json.dumps(k), v)
    return text


def _huge(rng, sk, bind):
    """A template parameter near or past its limit, or one of the issue's blow-ups."""
    nodes = sk["nodes"]
    which = rng.integers(12)
    if which == 0:  # polynomial degree at the float overflow (issue 23.4) and the documented limit
        d = int(rng.choice([1029, 1030, 1031, 5000, 99999, 100000, 100001, 10**6]))
        nodes[-1]["activation"] = {"name": "polynomial", "degree": d, "c": float(rng.choice([0, 1]))}
    elif which == 1:  # exp beta at and past 1,000; stacked exp (issue 23.5)
        beta = float(rng.choice([5, 50, 999.9, 1000, 1000.001, 1e4, 1e308]))
        layers = int(rng.choice([1, 4, 8]))
        first = nodes[0]["name"]
        nodes[:] = [nodes[0]] + [{"name": f"e{i}", "activation": {"name": "exp", "beta": beta},
                                  "inputs": [first if i == 0 else f"e{i - 1}"]} for i in range(layers)]
    elif which == 2:  # huge conv over a huge image (issue 23.3)
        size = int(rng.choice([100, 200, 300]))
        side = int(rng.choice([400, 500, 1000]))
        sk["input"] = {"shape": [side, side, 1]}
        sk["nodes"] = [{"name": "px", "base": "gaussian", "per": "pixel"},
                       {"name": "c", "activation": "relu", "conv": {"size": size, "stride": 1}},
                       {"name": "out", "activation": "relu", "dense": True}]
    elif which == 3:  # per: patch over big images (issue 23.3, 23.5)
        side, c, k = (int(v) for v in rng.choice([[500, 3, 25], [100, 100, 99], [300, 3, 50], [64, 3, 64]]))
        sk["input"] = {"shape": [side, side, c]}
        sk["nodes"] = [{"name": "p", "base": "gaussian", "per": "patch", "patch": {"size": k, "stride": 1}},
                       {"name": "out", "activation": "relu", "dense": True}]
    elif which == 4:  # width: auto with a huge group; or huge fixed widths (issue 23.3, 23.5)
        g = int(rng.choice([10**7, 10**8, 10**9]))
        sk["input"] = {"width": "auto"} if rng.random() < 0.5 else {"width": g}
        sk["nodes"] = [{"name": "g", "base": str(rng.choice(["gaussian", "laplace", "sphere"])), "per": "group",
                        "group": g}, {"name": "out", "activation": "relu", "inputs": ["g"]}]
        return g
    elif which == 5:  # a width at / past the 10^7 limit with a gaussian over all of it
        sk["input"] = {"width": int(rng.choice([10**7, 10**7 + 1, 2**31, 10**12]))}
        sk["nodes"] = [{"name": "g", "base": str(rng.choice(["gaussian", "laplace"]))},
                       {"name": "out", "activation": "relu", "inputs": ["g"]}]
    elif which == 6:  # categories at and past 2^31
        sk["nodes"][0] = {"name": sk["nodes"][0]["name"], "base": "categorical", "per": "column",
                          "categories": int(rng.choice([2**31, 2**31 + 1, 2**63, 10**30]))}
    elif which == 7:  # coefficient lists at the 100,001 limit
        k = int(rng.choice([1000, 100001, 100002]))
        nodes[-1]["activation"] = {"name": "coefficients", "values": [1] * k}
    elif which == 8:  # deep chains at the 1,000 depth limit
        k = int(rng.choice([999, 1000, 1001, 3000]))
        first = nodes[0]["name"]
        nodes[:] = [nodes[0]] + [{"name": f"d{i}", "activation": "relu", "inputs": [first if i == 0 else f"d{i - 1}"]}
                                 for i in range(k)]
    elif which == 9:  # scales that overflow features
        for n in nodes:
            if "base" in n and n["base"] in ("circle", "gaussian", "laplace"):
                n["scale"] = float(rng.choice([1e300, 1e155, 1e-300, 0.0, -1.0, 1e308]))
    elif which == 10:  # huge images per pixel at the node limit
        side = int(rng.choice([500, 501, 1000]))
        sk["input"] = {"shape": [side, side, 1]}
        sk["nodes"] = [{"name": "px", "base": "sphere", "per": "pixel", "zero": "uniform"},
                       {"name": "out", "activation": "relu", "dense": True}]
    else:  # stacked step / relu layers (heavy-tailed degrees)
        first = nodes[0]["name"]
        k = int(rng.integers(2, 9))
        nodes[:] = [nodes[0]] + [{"name": f"s{i}", "activation": "step", "inputs": [first if i == 0 else f"s{i - 1}"]}
                                 for i in range(k)]
    return bind


def _wrong(rng, sk):
    """A wrong type or an out-of-range value at a random key, or a raw YAML token there."""
    nodes = sk["nodes"]
    n = nodes[rng.integers(len(nodes))]
    key = str(rng.choice(list(n) + ["columns", "per", "scale", "categories", "group", "patch", "conv", "from",
                                    "inputs", "activation", "name"]))
    if rng.random() < 0.5:
        return {key: n, "raw": RAW_TOKENS[rng.integers(len(RAW_TOKENS))]}
    n[key] = [None, "abc", [1, 2], {"a": 1}, True, -1, 0, 1e308, -0.5, "", "x" * 300, [[]], "0:0", "5:1",
              "-1", 10**20, {"size": 0}, {"size": -3, "stride": 0}, {"size": [1, 2, 3]}][rng.integers(19)]
    return None


def _document_mutation(rng, text):
    """Whole-document YAML tricks."""
    k = rng.integers(14)
    desc_line = text.split("\n")[1]
    if k == 0:
        return text.replace(desc_line, "description: &a [1, *a]")
    if k == 1:  # a merge key inside its own anchor
        return text.replace("nodes:\n", "nodes:\n  - &m {<<: *m, name: loop}\n", 1)
    if k == 2:  # alias bomb (billion laughs) under the value limit's radar
        lines = ["x0: &x0 [a, a, a, a, a, a, a, a, a, a]"]
        for i in range(1, 9):
            lines.append(f"  x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * 10) + "]")
        return text.replace(desc_line, "description:\n  " + "\n".join(lines))
    if k == 3:  # deep nesting
        d = int(rng.choice([500, 1000, 5000, 50000]))
        return text.replace(desc_line, "description: " + "[" * d + "]" * d)
    if k == 4:  # over the 256 KiB size limit
        return text.replace(desc_line, "description: " + "x" * int(rng.choice([262000, 262145, 300000])))
    if k == 5:  # bad bytes: invalid UTF-8 (written as raw bytes), NUL, BOM
        return text.replace(desc_line, "description: " + str(rng.choice(["\udcff\udcfe", "\x00", "\ufeff", "\udc80"])))
    if k == 6:
        return text + "---\nrfsgen: 1\n"
    if k == 7:
        return "? [a, b]\n: 1\n" + text
    if k == 8:
        return text.replace("rfsgen: 1", "rfsgen: 1\nrfsgen: 1")
    if k == 9:
        return text.replace("rfsgen: 1", "rfsgen: " + str(rng.choice(["2", "!!float 1e999", "'1'", "[1]", "1.0",
                                                                     "true", "2001-02-30"])))
    if k == 10:
        return ""
    if k == 11:
        return text.replace("\n  - ", "\n\t- ", 1)
    if k == 12:  # an anchor reused for the whole nodes list
        return text.replace("nodes:\n", "nodes: &n\n", 1) + "extra: *n\n"
    return text[: int(len(text) * rng.random())]


#: Values a ``--set NAME=VALUE`` may carry (valid ones among hostile ones).
SET_VALUES = ["0.3", "2", "1e-300", "-1", "0", "nan", "inf", "1e400", "abc", "", "0x10", "1" + "0" * 5000, "[1]"]


def _parametrise(rng, sk) -> list:
    """Turn some of the nodes' numbers into ``$name`` references with a ``params:`` block
    (sometimes a hostile one); returns ``--set`` options for the command line."""
    params = {}
    for n in sk.get("nodes", []):
        if "scale" in n and rng.random() < 0.7:
            name = f"p{len(params)}"
            params[name] = n["scale"]
            n["scale"] = "$" + name
    if not params:
        return []
    k = rng.integers(8)
    if k == 0:  # a reference nobody declares
        sk["nodes"][0]["scale" if "scale" in sk["nodes"][0] else "name"] = "$nobody"
    elif k == 1:  # a declaration without a usable default
        params[next(iter(params))] = str(rng.choice(["", "x", "[1, 2]", "null"]))
    elif k == 2:
        params[next(iter(params))] = {"default": 0.5, "min": 1.0, "max": 0.1}
    sk["params"] = params
    sets = []
    for _ in range(int(rng.integers(0, 3))):
        name = str(rng.choice(list(params) + ["unknown"]))
        sets += ["--set", f"{name}={rng.choice(SET_VALUES)}"]
    return sets


def generate(rng: np.random.Generator, cid: str) -> dict:
    sk, width, discrete, bind = valid(rng)
    raw = {}
    mutated = []
    sets = []
    if rng.random() < 0.2:
        sets = _parametrise(rng, sk)
        mutated.append("params")
    r = rng.random()
    if r < 0.3:
        bind = _huge(rng, sk, bind)
        mutated.append("huge")
        width = sk["input"].get("width") if isinstance(sk["input"].get("width"), int) else (
            int(np.prod(sk["input"]["shape"])) if "shape" in sk["input"] else None)
    elif r < 0.55:
        w = _wrong(rng, sk)
        if w:
            key, node = next((k, v) for k, v in w.items() if k != "raw")
            node[key] = "@@RAW@@"
            raw["@@RAW@@"] = w["raw"]
        mutated.append("wrong")
    text = render(sk, raw=raw)
    if rng.random() < 0.15 or (r >= 0.55 and rng.random() < 0.25):
        text = _document_mutation(rng, text)
        mutated.append("document")
    cmd = rng.choice(["skeleton", "skeleton", "sample", "sample", "kernel"])
    files = {"s.yaml": {"text": text}}
    seed = int(rng.integers(0, 2**31))
    if cmd == "skeleton":
        argv, out, check = ["skeleton", "s.yaml"] + sets, None, {"type": "skeleton"}
    elif cmd == "sample" or not width and not bind:
        n = int(rng.choice([1, 2, 8, 32, 64, 256]))
        argv = ["sample", "s.yaml", "-n", str(n), "--seed", str(seed), "-o", "f.h5", "-q"] + sets
        if rng.random() < 0.3:
            argv += ["--scheme", str(rng.choice(["strat", "rr", "orf", "exact"]))]
        if bind:
            argv += ["--width", str(bind)]
        out, check = "f.h5", {"type": "sample", "columns": n}
    else:
        w = width or bind
        n = int(rng.integers(1, 6))
        mode = {"binary": "pm1", "categorical": "int01"}.get(str(discrete), "normal")
        if w > 50000:
            files["rows.npy"] = {"rows": {"fmt": "crafted-npy", "declared_rows": n, "width": w, "seed": seed}}
        else:
            files["rows.npy"] = {"rows": {"seed": seed, "n": n, "width": w, "mode": mode, "fmt": "npy"}}
        argv, out, check = ["kernel", "s.yaml", "rows.npy", "-o", "K.npy", "-q"] + sets, "K.npy", \
            {"type": "kernel", "shape": [n, n], "square": True}
    return {"kind": "skeletons", "id": cid, "files": files, "ops": [], "argv": argv, "output": out,
            "check": check, "note": "+".join(mutated) or "valid"}


def shrink(case):
    """Smaller variants: drop one node line, or the description."""
    text = case["files"]["s.yaml"].get("text")
    if text is None or len(text) > 20000:
        return
    lines = text.split("\n")
    for i, ln in enumerate(lines):
        if ln.startswith("  - ") or ln.startswith("description:"):
            c = json.loads(json.dumps(case))
            c["files"]["s.yaml"]["text"] = "\n".join(lines[:i] + lines[i + 1:])
            yield c
