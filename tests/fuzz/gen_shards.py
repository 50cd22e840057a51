"""Shard cases: 3 transform shards of one input (dense or CSR, float32 or float64), damaged or
lied about (bit flips, swapped or overlapping row ranges, missing or repeated shards, wrong
attributes, other dtypes, narrower X, NaN, external links, CSR chunks placed elsewhere), merged with ``rfsgen merge``.

The oracle is exact: a merge that exits 0 must equal the whole-range transform bit for bit.
"""

from __future__ import annotations


import numpy as np

from . import fixtures


def _op(rng, layout, shards):
    s = shards[rng.integers(len(shards))]
    xname = "X" if layout == "dense" else "X/data"
    k = rng.integers(11)
    if k == 0:
        return {"op": "bitflip", "file": s, "pos": float(rng.random()), "bit": int(rng.integers(8))}
    if k == 1:
        return {"op": "flip_in_dataset", "file": s, "name": xname, "pos": float(rng.random()),
                "bit": int(rng.integers(8))}
    if k == 2:
        others = [t for t in shards if t != s] or [s]
        return {"op": "swap_attrs", "file": s, "other": str(rng.choice(others)),
                "keys": ["rows_start", "rows_stop"] if rng.random() < 0.7 else ["rows_start"]}
    if k == 3:
        key = str(rng.choice(["rows_start", "rows_stop", "columns", "features_sha256", "layout", "input",
                              "rfsgen_version", "clipped_values"]))  # clipped_values: EOF outputs' count
        val = [{"t": "str", "v": "abc"}, {"t": "int", "v": -1}, {"t": "int", "v": 10**15}, {"t": "float", "v": 2.5},
               {"t": "int", "v": 5}, {"t": "str", "v": "dense"}, {"t": "str", "v": "csr"}, {"t": "int", "v": 47},
               {"t": "str", "v": "0" * 64}, {"t": "array", "v": [0, 10]}][rng.integers(10)]
        return {"op": "set_attr", "file": s, "key": key, "value": val, "delete": bool(rng.random() < 0.1)}
    if k == 4:
        return {"op": "dataset", "file": s, "name": xname, "how": "dtype",
                "dtype": str(rng.choice(["<i4", "<f2", "<f8", "<f4", ">f4", "<i8"]))}
    if k == 5 and layout == "dense":
        return {"op": "dataset", "file": s, "name": "X", "how": "narrow"}
    if k == 6:
        return {"op": "dataset", "file": s, "name": xname, "how": "values", "values": [float("nan")],
                "index": [int(rng.integers(0, 10))]}
    if k == 7 and layout == "dense":
        return {"op": "dataset", "file": s, "name": "X", "how": str(rng.choice(["extlink", "virtual", "softlink"])),
                "other": "elsewhere.h5"}
    if k == 8:
        return {"op": "truncate", "file": s, "keep": float(rng.choice([0.5, 0.9, 0.99]))}
    if k == 10 and layout == "csr":  # a chunk's place in the file, as merge reads it in place
        return {"op": "chunk_place", "file": s, "name": str(rng.choice(["X/data", "X/indices"])),
                "where": str(rng.choice(["past end", "across end", "other dataset", "file start"]))}
    return {"op": "dataset", "file": s, "name": xname, "how": "values",
            # -0.0: a stored zero by its sign bit alone; -2^31: a column that int32 differences wrap
            "values": [float(rng.choice([1e30, -2.0, 0.0, -0.0, 1e-45, -2.0**31]))],
            "index": [int(rng.integers(0, 10))]}


def generate(rng: np.random.Generator, cid: str) -> dict:
    layout = str(rng.choice(["dense", "csr"]))
    dtype = str(rng.choice(["float32", "float64"]))
    shards = [f"sh{k}.h5" for k in range(3)]
    files = {s: {"fixture": f"shard:{layout}-{dtype}-{k}"} for k, s in enumerate(shards)}
    ops = [_op(rng, layout, shards) for _ in range(int(rng.choice([0, 1, 1, 1, 2])))]
    args = list(shards)
    r = rng.random()
    if r < 0.1:
        args.pop(int(rng.integers(3)))  # a gap
    elif r < 0.2:
        args.append(str(rng.choice(shards)))  # a repeated shard
    elif r < 0.25:  # a shard of another dtype or layout
        files["other.h5"] = {"fixture": f"shard:{'csr' if layout == 'dense' else 'dense'}-{dtype}-1"}
        args[1] = "other.h5"
    rng.shuffle(args)
    argv = ["merge", *args, "-o", "out.h5", "-q"]
    if layout == "dense" and rng.random() < 0.3:
        argv.append("--virtual")
    check = {"type": "merge", "reference_fixture": f"full:{layout}-{dtype}"}
    if any(op.get("how") == "extlink" and op["file"] in args for op in ops):  # a link in a shard left out harms nothing
        check["must_fail"] = "an external link as X"
    return {"kind": "shards", "id": cid, "files": files, "ops": ops, "argv": argv, "output": "out.h5",
            "check": check}


def shrink(case):
    return fixtures.without_one_op(case)
