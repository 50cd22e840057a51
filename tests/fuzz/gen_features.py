"""Feature-file cases: bit flips, forged attributes and datasets with every checksum and the seal
recomputed, huge powers and omegas, gzip bombs (tiny files declaring huge datasets), external
storage, external links, virtual datasets, and embedded skeletons that are themselves hostile.
"""

from __future__ import annotations

import numpy as np

from . import fixtures

BASE = ["tabular-circle", "gauss8", "laplace8", "categorical-poly", "sphere8", "tabular-auto5", "shallow-gaussian",
        "eof-brownian3", "eof-laplace3", "exact-circle", "params8", "eof-brownian3-free", "eof-laplace3-free",
        "rbf8-orf"]
#: EOF files: their own attribute and datasets (level and index vectors, int (D, d))
EOF_DATASETS = ["eof_level", "eof_index"]
EOF_ATTR_VALUES = ['{}', '[]', 'null', '{"level": 99}',
                   '{"kernel": "laplace", "node": "l", "level": 60, "level_vectors": 1, "grid_features": 1, '
                   '"lo": [0, 0, 0], "hi": [1, 1, 1], "margin": null, "domain_source": "skeleton"}',
                   '{"kernel": "brownian", "node": "b", "level": 3, "level_vectors": 10, "grid_features": 31, '
                   '"lo": [2, 2, 2], "hi": [-2, -2, -2], "margin": null, "domain_source": "skeleton"}',
                   '{"kernel": "brownian", "node": "b", "level": 3, "level_vectors": 10, "grid_features": 31, '
                   '"lo": [-1e308, -2, -2], "hi": [1e308, 2, 2], "margin": -5, "domain_source": "rows"}']
ATTR_KEYS = ["format", "format_version", "tool_version", "seed", "columns", "draws", "scheme", "skeleton_path",
             "skeleton_sha256", "nodes", "command", "stats", "input_width"]
ATTR_VALUES = [{"t": "str", "v": "{}"}, {"t": "str", "v": "[]"}, {"t": "str", "v": "null"}, {"t": "str", "v": ""},
               {"t": "str", "v": "{\"x\": 1e999}"}, {"t": "int", "v": -1}, {"t": "int", "v": 0},
               {"t": "int", "v": 2**62}, {"t": "int", "v": 2**63 - 1}, {"t": "uint", "v": 2**64 - 1},
               {"t": "float", "v": 1.5}, {"t": "float", "v": "nan"}, {"t": "bytes", "v": "abc"},
               {"t": "array", "v": [1, 2, 3]}, {"t": "bool", "v": True}, {"t": "int", "v": 3},
               {"t": "str", "v": "x" * 100000}, {"t": "int", "v": 10**9}]
DATASETS = ["column_count", "column_kind", "column_terms", "term_node", "term_code", "term_power", "omega",
            "skeleton"]
HOSTILE_SKELETONS = [
    "rfsgen: 1\ndescription: &a [1, *a]\ninput: {width: 8}\nnodes:\n  - {name: c, base: circle, per: column}\n"
    "  - {name: out, activation: relu, inputs: [c]}\n",
    "rfsgen: 1\ninput: {width: 8}\nnodes:\n  - &m {<<: *m, name: c, base: circle, per: column}\n"
    "  - {name: out, activation: relu, inputs: [c]}\n",
    "rfsgen: 1\ninput: {width: 8}\nnodes:\n  - {name: c, base: circle, per: column}\n"
    "  - {name: out, activation: {name: polynomial, degree: 5000}, inputs: [c]}\n",
    "rfsgen: 1\ndescription: 2001-02-30\ninput: {width: 8}\nnodes:\n  - {name: c, base: circle, per: column}\n"
    "  - {name: out, activation: relu, inputs: [c]}\n",
    "rfsgen: 1\ninput: {width: 9}\nnodes:\n  - {name: c, base: circle, per: column}\n"
    "  - {name: out, activation: relu, inputs: [c]}\n",
    "rfsgen: 1\ninput: {shape: [400, 400, 1]}\nnodes:\n  - {name: p, base: gaussian, per: pixel}\n"
    "  - {name: c, activation: relu, conv: {size: 200, stride: 1}}\n  - {name: out, activation: relu, dense: true}\n",
    "",
    "rfsgen: 1\ndescription: !!int six\n",
]


#: Values forged into an ``exact`` file's float column weights, and into a file's ``params``.
WEIGHT_VALUES = [float("nan"), float("inf"), -1.0, -0.0, 0.0, 1e308, 2.0**20, 2.0**21, 5e-324]
PARAMS_VALUES = ['{}', '[]', 'null', '{"s": 0.4}', '{"s": -1}', '{"s": "x"}', '{"t": 0.4}', '{"s": 1e999}',
                 '{"s": 0.4, "t": 1}', '"s"']


def _own_op(rng, skel):
    """Forgeries of the fields only some files have (every checksum and the seal recomputed)."""
    if skel == "exact-circle":
        k = rng.integers(4)
        if k == 0:
            return [{"op": "dataset", "file": "f.h5", "name": "column_weight", "how": "values", "reseal": True,
                     "values": [float(rng.choice(WEIGHT_VALUES))],
                     "index": "all" if rng.random() < 0.3 else [int(v) for v in rng.integers(0, 48, 3)]}]
        if k == 1:
            return [{"op": "dataset", "file": "f.h5", "name": "column_weight", "reseal": True,
                     "how": str(rng.choice(["dtype", "reshape2d", "empty", "bomb", "external", "softlink"])),
                     "dtype": str(rng.choice(["<f4", "<i8", "<f2"])), "shape": [10**9], "target": "/etc/passwd"}]
        return [{"op": "set_attr", "file": "f.h5", "key": "column_weights", "reseal": True,
                 "value": {"t": "str", "v": str(rng.choice(["float", "counts", "", "int"]))},
                 "delete": bool(rng.random() < 0.5)}]
    return [{"op": "set_attr", "file": "f.h5", "key": "params", "reseal": True,
             "value": {"t": "str", "v": PARAMS_VALUES[rng.integers(len(PARAMS_VALUES))]},
             "delete": bool(rng.random() < 0.3)}]


def _op(rng, skel):
    if skel.startswith("eof-") and rng.random() < 0.5:
        return _eof_op(rng)
    if skel in ("exact-circle", "params8") and rng.random() < 0.6:
        return _own_op(rng, skel)
    k = rng.integers(10)
    if k == 0:
        return [{"op": "bitflip", "file": "f.h5", "pos": float(rng.random()), "bit": int(rng.integers(8)),
                 "reseal": bool(rng.random() < 0.5)}]
    if k == 1:
        keys = ATTR_KEYS if skel == "tabular-auto5" else ATTR_KEYS[:-1]
        return [{"op": "set_attr", "file": "f.h5", "key": str(rng.choice(keys)),
                 "value": ATTR_VALUES[rng.integers(len(ATTR_VALUES))], "reseal": True,
                 "delete": bool(rng.random() < 0.1)}]
    if k in (2, 3):
        name = str(rng.choice(["term_power", "omega", "column_count", "term_node", "term_code", "column_kind",
                               "column_terms"]))
        if name == "omega":
            vals = [float(rng.choice([1e308, -1e308, 1e200, 1e154, np.nan, np.inf, 0.0, 5e-324]))]
        elif name == "term_power":
            vals = [int(2 ** rng.integers(20, 63)) * int(rng.choice([1, -1]))]
        elif name == "column_count":
            vals = [int(rng.choice([0, -1, 2**31, 2**40, 2**62]))]
        else:
            vals = [int(rng.choice([-1, 2, 3, 255, 2**15, 2**31, 2**62]))]
        dt = None
        if name == "term_power" and abs(vals[0]) >= 2**31 or name == "column_count" and vals[0] >= 2**31:
            dt = "<i8"
        if name in ("term_node", "term_code", "column_kind", "column_terms"):
            dt = "<i8"
        op = {"op": "dataset", "file": "f.h5", "name": name, "how": "values", "values": vals, "reseal": True,
              "index": "all" if rng.random() < 0.3 else [int(v) for v in rng.integers(0, 1000, 3)]}
        if dt:
            op["dtype"] = dt
        return [op]
    if k == 4:
        name = str(rng.choice(DATASETS[:-1]))
        return [{"op": "dataset", "file": "f.h5", "name": name, "how": str(rng.choice(["dtype", "reshape2d", "empty"])),
                 "dtype": str(rng.choice(["<f2", "<i4", "<u8", "<f8", "|b1", "<c16"])), "reseal": True}]
    if k == 5:  # gzip bomb
        name = str(rng.choice(DATASETS))
        n = int(rng.choice([10**8, 10**9, 2 * 10**9, 10**10]))
        return [{"op": "dataset", "file": "f.h5", "name": name, "how": "bomb", "shape": [n], "reseal": True}]
    if k == 6:  # external storage: any path of the machine, or a FIFO (hangs a reader)
        name = str(rng.choice(DATASETS))
        if rng.random() < 0.5:
            return [{"op": "mkfifo", "file": "fifo"},
                    {"op": "dataset", "file": "f.h5", "name": name, "how": "external", "target": "fifo", "reseal": True}]
        return [{"op": "dataset", "file": "f.h5", "name": name, "how": "external",
                 "target": str(rng.choice(["/etc/passwd", "/proc/self/environ", "/dev/zero"])), "reseal": True}]
    if k == 7:
        name = str(rng.choice(DATASETS))
        return [{"op": "dataset", "file": "f.h5", "name": name, "how": str(rng.choice(["softlink", "extlink", "loop",
                                                                                      "virtual"])), "reseal": True}]
    if k == 8:
        return [{"op": "skeleton_text", "file": "f.h5", "text": HOSTILE_SKELETONS[rng.integers(len(HOSTILE_SKELETONS))]}]
    return [{"op": "truncate", "file": "f.h5", "keep": float(rng.choice([0.0, 0.1, 0.5, 0.9, 0.999]))}]


def _eof_op(rng):
    """Forgeries of an EOF file's own parts (every checksum and the seal recomputed)."""
    name = str(rng.choice(EOF_DATASETS))
    k = rng.integers(5)
    if k == 0:
        return [{"op": "set_attr", "file": "f.h5", "key": "eof", "reseal": True,
                 "value": {"t": "str", "v": EOF_ATTR_VALUES[rng.integers(len(EOF_ATTR_VALUES))]},
                 "delete": bool(rng.random() < 0.2)}]
    if k == 1:
        vals = [int(rng.choice([0, 2, 60, 2**31, 2**62, 2**63 + 5]))]
        return [{"op": "dataset", "file": "f.h5", "name": name, "how": "values", "values": vals, "reseal": True,
                 "dtype": "<u8", "index": "all" if rng.random() < 0.3 else [int(v) for v in rng.integers(0, 100, 3)]}]
    if k == 2:
        return [{"op": "dataset", "file": "f.h5", "name": name, "how": str(rng.choice(["dtype", "reshape2d", "empty",
                                                                                      "narrow"])),
                 "dtype": str(rng.choice(["<f8", "<i8", "<u1", "|b1"])), "reseal": True}]
    if k == 3:
        return [{"op": "dataset", "file": "f.h5", "name": name, "how": "bomb", "reseal": True,
                 "shape": [int(rng.choice([10**6, 10**8, 10**9])), int(rng.choice([3, 1000]))]}]
    return [{"op": "dataset", "file": "f.h5", "name": name, "how": str(rng.choice(["external", "extlink", "virtual",
                                                                                  "softlink"])),
             "target": "/etc/passwd", "reseal": True}]


#: Dataset operations that leave the dataset's data outside the file.
OUTSIDE = ("external", "extlink", "virtual")


def outside(ops) -> list:
    """The datasets that reach outside the file once every op is applied: the last op on a
    dataset decides, since each dataset op replaces the dataset (a later "empty" or
    "dtype" rewrites an external dataset's data inside the file).  A "values" op that
    finds nothing to overwrite leaves the dataset as it was; counted as a replacement, it
    can only fail to require a refusal, never require a wrong one."""
    last = {}
    for op in ops:
        if op["op"] == "dataset":
            last[(op["file"], op["name"])] = op["how"]
        elif op["op"] == "skeleton_text":  # rewrites the skeleton dataset inside the file
            last[(op["file"], "skeleton")] = "skeleton_text"
    return sorted(name for (_, name), how in last.items() if how in OUTSIDE)


def generate(rng: np.random.Generator, cid: str) -> dict:
    skel = BASE[rng.integers(len(BASE))]
    ops = _op(rng, skel)
    if rng.random() < 0.15:
        ops += _op(rng, skel)
    must_fail = unless_unchanged = None
    for k, op in enumerate(ops):
        # (a later op that reseals recomputes the header's checksum over the flipped bit)
        if op["op"] == "bitflip" and not op["reseal"] and op["pos"] * 1 > 0.0 \
                and not any(o.get("reseal") for o in ops[k + 1:]):
            # A bit of a byte no HDF5 reader uses (free space, padding) changes nothing
            # that any check could see: the run must then give the unforged file's output.
            unless_unchanged = "a flipped bit under the header's checksum"
        if op["op"] == "truncate" and op["keep"] < 0.999:
            must_fail = "a truncated file"
    if must_fail is None and outside(ops):
        must_fail = "a dataset reaching outside the file"
    files = {"f.h5": {"fixture": f"feat:{skel}"}}
    if rng.random() < 0.4:
        argv, out, check = ["inspect", "f.h5"] + (["--json"] if rng.random() < 0.5 else []), None, {"type": "inspect"}
    else:
        w = fixtures.WIDTHS[skel]
        mode = "categorical" if skel == "categorical-poly" else "normal"
        files["rows.npy"] = {"rows": {"seed": int(rng.integers(2**31)), "n": 4, "width": w, "mode": mode,
                                      "fmt": "npy"}}
        argv = ["transform", "f.h5", "rows.npy", "-o", "out.h5", "-q", "--layout", "dense"]
        out, check = "out.h5", {"type": "transform_any"}
    if must_fail:
        check["must_fail"] = must_fail
    elif unless_unchanged:
        check["must_fail_unless_unchanged"] = unless_unchanged
    # flips inside the 512-byte header may land in its padding: harmless
    for op in ops:
        if op["op"] == "bitflip":
            op["lo"] = 0
    return {"kind": "features", "id": cid, "files": files, "ops": ops, "argv": argv, "output": out, "check": check}


def shrink(case):
    return fixtures.without_one_op(case)
