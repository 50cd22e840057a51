"""Every concrete example of issue 23 as a fuzz case; ``python tests/fuzz/issue_cases.py`` writes
them to tests/fuzz/regressions/issue23-*.json (the regression corpus replayed by test_fuzz.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CIRCLE8 = ("rfsgen: 1\ninput: {width: 8}\nnodes:\n  - {name: c, base: circle, per: column}\n"
           "  - {name: out, activation: relu, inputs: [c]}\n")


def skel(text, argv=("skeleton", "s.yaml"), output=None, check=None, files=None):
    f = {"s.yaml": {"text": text}}
    f.update(files or {})
    return {"kind": "skeletons", "files": f, "ops": [], "argv": list(argv), "output": output,
            "check": check or {"type": "skeleton"}}


def with_desc(value):
    return CIRCLE8.replace("input:", f"description: {value}\ninput:", 1)


def sample(text, n=1, extra=()):
    return skel(text, ("sample", "s.yaml", "-n", str(n), "-o", "f.h5", "-q", *extra), "f.h5",
                {"type": "sample", "columns": n})


def feat(ops, argv=("inspect", "f.h5"), base="tabular-circle", must_fail=None, rows_width=8):
    files = {"f.h5": {"fixture": f"feat:{base}"}}
    check = {"type": "inspect"}
    out = None
    if argv[0] == "transform":
        files["rows.npy"] = {"rows": {"seed": 1, "n": 4, "width": rows_width, "mode": "normal", "fmt": "npy"}}
        check, out = {"type": "transform_any"}, "out.h5"
    if must_fail:
        check["must_fail"] = must_fail
    return {"kind": "features", "files": files, "ops": ops, "argv": list(argv), "output": out, "check": check}


def shards(ops, layout="dense", dtype="float32", extra=(), must_fail=None):
    files = {f"sh{k}.h5": {"fixture": f"shard:{layout}-{dtype}-{k}"} for k in range(3)}
    check = {"type": "merge", "reference_fixture": f"full:{layout}-{dtype}"}
    if must_fail:
        check["must_fail"] = must_fail
    return {"kind": "shards", "files": files, "ops": ops, "argv": ["merge", "sh0.h5", "sh1.h5", "sh2.h5", "-o",
                                                                    "out.h5", "-q", *extra],
            "output": "out.h5", "check": check}


def rows(p, cmd, skeleton, feature=None, shape=None, stdin=False, must_fail=None, reference=None):
    ext = {"npy": "npy", "stdin-npy": "npy", "crafted-npy": "npy", "crafted-npz-coo": "npz", "crafted-h5": "h5",
           "crafted-h5ad-loop": "h5ad", "h5ad-dense": "h5ad"}[p["fmt"]]
    name = f"rows.{ext}"
    arg = "-" if stdin else name
    files = {name: {"rows": p}}
    if cmd == "transform":
        files["f.h5"] = {"fixture": f"feat:{feature}"}
        argv = ["transform", "f.h5", arg, "-o", "out.h5", "-q", "--layout", "dense"]
        check, out = {"type": "transform", "rows": p["n"], "columns": shape}, "out.h5"
        if reference:
            check["reference"] = {"fixture": f"feat:{feature}", "rows": dict(p, mode="normal")}
    else:
        files["s.yaml"] = {"skeleton": skeleton} if "\n" not in skeleton else {"text": skeleton}
        argv = ["kernel", "s.yaml", arg, "-o", "K.npy", "-q"]
        check, out = {"type": "kernel", "shape": [p["n"], p["n"]], "square": True}, "K.npy"
        if reference:
            check["reference"] = {"skeleton": skeleton, "rows": dict(p, mode="normal")}
    if must_fail:
        check["must_fail"] = must_fail
    return {"kind": "rows", "files": files, "ops": [], "argv": argv, "stdin": name if stdin else None,
            "output": out, "check": check}


def signal_case(cmd, sig, delay):
    from tests.fuzz import gen_signals

    import numpy as np

    for i in range(200):
        c = gen_signals.generate(np.random.default_rng(i), "x")
        if c["argv"][0] == cmd:
            c["signal"] = {"sig": sig, "delay": delay}
            return c
    raise RuntimeError(cmd)


GAUSS_SCALE = ("rfsgen: 1\ninput: {width: 8}\nnodes:\n  - {name: g, base: gaussian, scale: 1e300}\n"
               "  - {name: out, activation: relu, inputs: [g]}\n")

CASES = {
    # 1. YAML that cannot be constructed
    "1-date": skel(with_desc("2001-02-30")),
    "1-huge-int": skel(CIRCLE8.replace("circle,", "circle, scale: " + "1" * 4400 + ",")),
    "1-int-six": skel(CIRCLE8.replace("per: column", "per: column, scale: !!int six")),
    "1-bool-maybe": skel(with_desc("!!bool maybe")),
    # 2. self-referencing aliases
    "2-alias-cycle": skel(with_desc("&a [1, *a]")),
    "2-merge-cycle": skel(CIRCLE8.replace("  - {name: c,", "  - &m {<<: *m, name: c,")),
    # 3. expansion within the documented limits
    "3-conv-200": skel("rfsgen: 1\ninput: {shape: [400, 400, 1]}\nnodes:\n  - {name: p, base: gaussian, per: pixel}\n"
                       "  - {name: c, activation: relu, conv: {size: 200, stride: 1}}\n"
                       "  - {name: out, activation: relu, dense: true}\n"),
    "3-patch-25": skel("rfsgen: 1\ninput: {shape: [500, 500, 3]}\nnodes:\n"
                       "  - {name: p, base: gaussian, per: patch, patch: {size: 25, stride: 1}}\n"
                       "  - {name: out, activation: relu, dense: true}\n"),
    "3-auto-group": sample("rfsgen: 1\ninput: {width: auto}\nnodes:\n  - {name: g, base: gaussian, per: group, "
                           "group: 100000000}\n  - {name: out, activation: relu, inputs: [g]}\n",
                           extra=("--width", "100000000")),
    # 4. polynomial degree >= 1030
    "4-poly-1030-skeleton": skel(CIRCLE8.replace("activation: relu", "activation: {name: polynomial, degree: 1030}")),
    "4-poly-1030-sample": sample(CIRCLE8.replace("activation: relu", "activation: {name: polynomial, degree: 1030}"),
                                 n=8),
    # 5. sampling blow-ups
    "5-stacked-exp": sample("rfsgen: 1\ninput: {width: 8}\nnodes:\n  - {name: c, base: circle, per: column}\n"
                            + "".join(f"  - {{name: e{i}, activation: {{name: exp, beta: 5}}, inputs: "
                                      f"[{'c' if i == 0 else f'e{i - 1}'}]}}\n" for i in range(8)), n=64),
    "5-gaussian-1e7": sample("rfsgen: 1\ninput: {width: 10000000}\nnodes:\n  - {name: g, base: gaussian}\n"
                             "  - {name: out, activation: relu, inputs: [g]}\n"),
    "5-laplace-1e7": sample("rfsgen: 1\ninput: {width: 10000000}\nnodes:\n  - {name: g, base: laplace}\n"
                            "  - {name: out, activation: relu, inputs: [g]}\n"),
    "5-patch-99": sample("rfsgen: 1\ninput: {shape: [100, 100, 100]}\nnodes:\n"
                         "  - {name: p, base: gaussian, per: patch, patch: {size: 99, stride: 1}}\n"
                         "  - {name: out, activation: relu, dense: true}\n"),
    # 6. signals in the first second (timing-dependent: see test_fuzz.py)
    "6-sigterm-transform-early": signal_case("transform", "SIGTERM", 0.3),
    "6-sigint-sample-startup": signal_case("sample", "SIGINT", 0.02),
    "6-sighup-kernel-1s": signal_case("kernel", "SIGHUP", 1.0),
    "6-sigterm-merge-early": signal_case("merge", "SIGTERM", 0.5),
    # 7. forged feature files (seal and checksums recomputed)
    "7-stats-json": feat([{"op": "set_attr", "file": "f.h5", "key": "stats", "value": {"t": "str", "v": "{}"},
                           "reseal": True}]),
    "7-circle-power": feat([{"op": "dataset", "file": "f.h5", "name": "term_power", "how": "values",
                             "values": [2**56], "index": "all", "dtype": "<i8", "reseal": True}],
                           argv=("transform",)),
    "7-omega-1e308": feat([{"op": "dataset", "file": "f.h5", "name": "omega", "how": "values", "values": [1e308],
                            "index": "all", "reseal": True}], argv=("transform",), base="gauss8"),
    "7-gzip-bomb": feat([{"op": "dataset", "file": "f.h5", "name": "omega", "how": "bomb", "shape": [2 * 10**9],
                          "reseal": True}], argv=("transform",), base="gauss8"),
    "7-skeleton-alias": feat([{"op": "skeleton_text", "file": "f.h5",
                               "text": CIRCLE8.replace("input:", "description: &a [1, *a]\ninput:")}]),
    "7-external-passwd": feat([{"op": "dataset", "file": "f.h5", "name": "omega", "how": "external",
                                "target": "/etc/passwd", "reseal": True}], base="gauss8",
                              must_fail="external storage"),
    "7-external-fifo": feat([{"op": "mkfifo", "file": "fifo"},
                             {"op": "dataset", "file": "f.h5", "name": "omega", "how": "external", "target": "fifo",
                              "reseal": True}], base="gauss8", must_fail="external storage on a FIFO"),
    # 8. merge trusts its shards
    "8-rows-start-abc": shards([{"op": "set_attr", "file": "sh1.h5", "key": "rows_start",
                                 "value": {"t": "str", "v": "abc"}}]),
    "8-x-int32": shards([{"op": "dataset", "file": "sh1.h5", "name": "X", "how": "dtype", "dtype": "<i4"}]),
    "8-x-float16": shards([{"op": "dataset", "file": "sh1.h5", "name": "X", "how": "dtype", "dtype": "<f2"}]),
    "8-narrower": shards([{"op": "dataset", "file": "sh1.h5", "name": "X", "how": "narrow"}]),
    "8-swapped-ranges": shards([{"op": "swap_attrs", "file": "sh0.h5", "other": "sh1.h5",
                                 "keys": ["rows_start", "rows_stop"]}]),
    "8-extlink-x": shards([{"op": "dataset", "file": "sh1.h5", "name": "X", "how": "extlink", "other": "e.h5"}],
                          must_fail="an external link as X"),
    "8-nan": shards([{"op": "dataset", "file": "sh1.h5", "name": "X", "how": "values", "values": [float("nan")],
                      "index": [3]}]),
    "8-bitflip-dense": shards([{"op": "flip_in_dataset", "file": "sh1.h5", "name": "X", "pos": 0.37, "bit": 6}]),
    "8-bitflip-csr": shards([{"op": "flip_in_dataset", "file": "sh1.h5", "name": "X/data", "pos": 0.37, "bit": 6}],
                            layout="csr"),
    "8-virtual-narrow": shards([{"op": "dataset", "file": "sh1.h5", "name": "X", "how": "narrow"}],
                               extra=("--virtual",)),
    # 9. crafted inputs
    "9-coo-npz-1e9": rows({"fmt": "crafted-npz-coo", "declared_rows": 10**9, "width": 8, "n": 1, "seed": 0},
                          "kernel", "tabular-circle", must_fail="a crafted COO .npz"),
    "9-h5ad-loop": rows({"fmt": "crafted-h5ad-loop", "width": 8, "n": 1, "seed": 0}, "transform", None,
                        feature="tabular-circle", shape=48, must_fail="X a soft-link loop"),
    "9-obs-nul": rows({"fmt": "h5ad-dense", "width": 8, "n": 3, "seed": 0, "nul_names": True}, "transform", None,
                      feature="tabular-circle", shape=48),
    "9-stdin-npy-1e12": rows({"fmt": "crafted-npy", "declared_rows": 10**12, "width": 8, "n": 1, "seed": 0},
                             "transform", None, feature="tabular-circle", shape=48, stdin=True,
                             must_fail="a .npy declaring 1e12 rows"),
    "9-kernel-h5-1e12": rows({"fmt": "crafted-h5", "declared_rows": 10**12, "width": 8, "n": 1, "seed": 0},
                             "kernel", "tabular-circle", must_fail="an .h5 declaring 1e12 rows"),
    # 10. silent NaN from finite rows
    "10-subnormal-shallow-transform": rows({"fmt": "npy", "mode": "scaled", "scale": -1040, "n": 4, "width": 1728,
                                            "seed": 3}, "transform", None, feature="shallow-gaussian", shape=32,
                                           reference=True),
    "10-subnormal-cifar-kernel": rows({"fmt": "npy", "mode": "scaled", "scale": -1040, "n": 3, "width": 1728,
                                       "seed": 3}, "kernel", "cifar-deep", reference=True),
    "10-extreme-gaussian-kernel": rows({"fmt": "npy", "mode": "extreme", "density": 1.0, "n": 6, "width": 8,
                                        "seed": 5}, "kernel", "gauss8"),
    "10-extreme-laplace-transform": rows({"fmt": "npy", "mode": "extreme", "density": 1.0, "n": 6, "width": 8,
                                          "seed": 5}, "transform", None, feature="laplace8", shape=32),
    "10-scale-1e300": rows({"fmt": "npy", "mode": "big", "exp10": 100, "n": 4, "width": 8, "seed": 2}, "kernel",
                           GAUSS_SCALE),
    # 11. approx --plot checked too late
    "11-approx-plot-xyz": {"kind": "rows", "files": {"rows.npy": {"rows": {"fmt": "npy", "n": 40, "width": 8,
                                                                           "seed": 1, "mode": "normal"}},
                                                     "s.yaml": {"skeleton": "tabular-circle"}},
                           "ops": [], "argv": ["approx", "s.yaml", "rows.npy", "-n", "16", "--trials", "1",
                                               "--subset", "8", "-q", "--plot", "fig.xyz"],
                           "output": "fig.xyz", "check": {"type": "approx"}},
    "11-approx-plot-skeleton": {"kind": "rows", "files": {"rows.npy": {"rows": {"fmt": "npy", "n": 40, "width": 8,
                                                                                "seed": 1, "mode": "normal"}},
                                                          "s.yaml": {"skeleton": "tabular-circle"}},
                                "ops": [], "argv": ["approx", "s.yaml", "rows.npy", "-n", "16", "--trials", "1",
                                                    "--subset", "8", "-q", "--plot", "s.yaml", "--overwrite"],
                                "output": None, "check": {"type": "approx", "must_fail": "--plot names the skeleton"}},
    # 12. a sampler that never ends
    "12-auto-width-1": sample(open(ROOT / "skeletons" / "tabular-auto.yaml").read(), n=256, extra=("--width", "1")),
}


def main():
    out = HERE / "regressions"
    out.mkdir(exist_ok=True)
    for name, case in CASES.items():
        case = dict(case, id=f"issue23-{name}")
        if case["argv"] == ["transform"]:
            case["argv"] = ["transform", "f.h5", "rows.npy", "-o", "out.h5", "-q", "--layout", "dense"]
        (out / f"issue23-{name}.json").write_text(json.dumps({"case": case}, indent=1) + "\n")
    print(f"wrote {len(CASES)} cases to {out}")


if __name__ == "__main__":
    main()
