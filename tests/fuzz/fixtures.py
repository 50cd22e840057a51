"""Valid files the fuzz cases start from: feature files, rows, transform shards.

Each fixture has a name (``feat:gauss8``, ``rows:r8``, ``shard:dense-float32-1``, ...) and is
built deterministically with the library (not the CLI: it is faster) into a cache directory,
once.  Building runs in a fresh interpreter (``python tests/fuzz/fixtures.py CACHE NAME...``) so
that the fuzz workers, which fork, never run compiled (threaded) code themselves.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Skeletons written for the fuzz suite (beside the repository's skeletons/).
SKELETONS = {
    "gauss8": "rfsgen: 1\ninput: {width: 8}\nnodes:\n"
              "  - {name: g, base: gaussian, scale: 0.5}\n"
              "  - {name: out, activation: {name: exp, beta: 0.5}, inputs: [g]}\n",
    # plain random Fourier features: --scheme orf's (cos, sin) pairs share one angle per frequency
    "rbf8": "rfsgen: 1\ninput: {width: 8}\nnodes:\n  - {name: g, base: gaussian, scale: 0.5}\n",
    "laplace8": "rfsgen: 1\ninput: {width: 8}\nnodes:\n"
                "  - {name: g, base: laplace, scale: 0.3, per: group, group: 4}\n"
                "  - {name: out, activation: relu, inputs: [g]}\n",
    # EOF (--scheme eof): one brownian / laplace node over columns 1..3 on a stated box
    "brownian3": "rfsgen: 1\ninput: {width: 4}\nnodes:\n"
                 "  - {name: b, base: brownian, columns: '1:4', domain: [-2, 2]}\n",
    "laplacebox3": "rfsgen: 1\ninput: {width: 4}\nnodes:\n"
                   "  - {name: l, base: laplace, scale: 0.7, columns: '1:4', domain: [[-2, -1, -3], [2, 1, 3]]}\n",
    # the same nodes with 'boundary: free' (EOF's unpinned kernels)
    "brownian3free": "rfsgen: 1\ninput: {width: 4}\nnodes:\n"
                     "  - {name: b, base: brownian, columns: '1:4', domain: [-2, 2], boundary: free}\n",
    "laplacebox3free": "rfsgen: 1\ninput: {width: 4}\nnodes:\n"
                       "  - {name: l, base: laplace, scale: 0.7, columns: '1:4', domain: [[-2, -1, -3], [2, 1, 3]], "
                       "boundary: free}\n",
    # EOF over 8,000 columns (level 1: one column): a transform's per-row work grows with d^2
    "brownianwide": "rfsgen: 1\ninput: {width: 8000}\nnodes:\n  - {name: b, base: brownian, domain: [0, 1]}\n",
    # A skeleton with a parameter: its feature file records the value (attribute 'params').
    "params8": "rfsgen: 1\ninput: {width: 8}\nparams: {s: 0.4}\nnodes:\n"
               "  - {name: g, base: gaussian, scale: $s}\n"
               "  - {name: out, activation: relu, inputs: [g]}\n",
    # Scale-invariant: a sphere node normalises each row, so rows * 2^k give the same features.
    "sphere8": "rfsgen: 1\ninput: {width: 8}\nnodes:\n"
               "  - {name: s, base: sphere, scheme: pair}\n"
               "  - {name: out, activation: {name: exp, beta: 0.5}, inputs: [s]}\n",
}

#: feature fixtures: name -> (skeleton, columns, seed, width)
FEATURES = {
    "tabular-circle": ("tabular-circle", 48, 1, None),
    "shallow-gaussian": ("shallow-gaussian", 32, 1, None),
    "cifar-deep": ("cifar-deep", 64, 1, None),
    "categorical-poly": ("categorical-poly", 32, 1, None),
    "tabular-auto5": ("tabular-auto", 16, 1, 5),
    "gauss8": ("gauss8", 32, 1, None),
    "laplace8": ("laplace8", 32, 1, None),
    "sphere8": ("sphere8", 32, 1, None),
    "circle-4k": ("tabular-circle", 4096, 2, None),
    "cifar-deep-1k": ("cifar-deep", 1024, 2, None),
    "exact-circle": ("tabular-circle", 48, 1, None),  # --scheme exact: float column weights
    "params8": ("params8", 32, 1, None),
    "gauss8-200k": ("gauss8", 200000, 3, None),  # a pool for select under a small --max-memory
    "rbf8-orf": ("rbf8", 40, 1, None),  # --scheme orf: twin frequencies, two columns an atom
}
#: Feature fixtures sampled with another scheme than rfs.
SCHEMES = {"exact-circle": "exact", "rbf8-orf": "orf"}

#: EOF feature fixtures (``rfsgen.eof.sample``): name -> (skeleton, level); their columns are the grid's.
EOF = {"eof-brownian3": ("brownian3", 3), "eof-laplace3": ("laplacebox3", 4), "eof-brownian-wide": ("brownianwide", 1),
       "eof-brownian3-free": ("brownian3free", 3), "eof-laplace3-free": ("laplacebox3free", 4)}
#: the EOF fixtures whose node says 'boundary: free'
EOF_FREE = {"eof-brownian3-free", "eof-laplace3-free"}

#: Which fixture feature file a skeleton name's rows cases use, and the skeleton's row width.
WIDTHS = {"tabular-circle": 8, "shallow-gaussian": 1728, "cifar-deep": 1728, "categorical-poly": 6,
          "tabular-auto5": 5, "gauss8": 8, "laplace8": 8, "sphere8": 8, "eof-brownian3": 4, "eof-laplace3": 4,
          "eof-brownian3-free": 4, "eof-laplace3-free": 4,
          "exact-circle": 8, "params8": 8, "rbf8-orf": 8}
#: Skeletons whose kernel and features do not change when a row is multiplied by a positive scale.
SCALE_INVARIANT = {"shallow-gaussian", "cifar-deep", "sphere8"}

#: rows fixtures: name -> (rows, width, seed)
ROWS = {"r8": (30, 8, 0), "r8-3000": (3000, 8, 0), "cifar200": (200, 1728, 0), "cifar1000": (1000, 1728, 0)}

SHARD_LAYOUTS = ("dense", "csr")
SHARD_DTYPES = ("float32", "float64")


def columns_of(feat: str) -> int:
    """Columns of feature fixture ``feat`` (an EOF fixture: its whole grid)."""
    if feat in EOF:
        from rfsgen.eof import grid_counts

        skel, level = EOF[feat]
        return grid_counts(level, 8000 if skel == "brownianwide" else 3, free=feat in EOF_FREE)[1]  # 3 of 4 columns
    return FEATURES[feat][1]


def skeleton_of(feat: str) -> str:
    """The skeleton name behind feature fixture ``feat`` (or ``feat`` itself)."""
    if feat in EOF:
        return EOF[feat][0]
    return FEATURES[feat][0] if feat in FEATURES else feat


def skeleton_text(name: str) -> str:
    if name in SKELETONS:
        return SKELETONS[name]
    return (ROOT / "skeletons" / f"{name}.yaml").read_text()


def all_names() -> list:
    names = [f"feat:{k}" for k in FEATURES] + [f"feat:{k}" for k in EOF] + [f"rows:{k}" for k in ROWS]
    for lay in SHARD_LAYOUTS:
        for dt in SHARD_DTYPES:
            names += [f"full:{lay}-{dt}"] + [f"shard:{lay}-{dt}-{k}" for k in range(3)]
    names += ["full:big-dense-float32"] + [f"shard:big-dense-float32-{k}" for k in range(3)]
    return names


def path_of(cache, name: str) -> Path:
    return Path(cache) / (name.replace(":", "__") + (".npy" if name.startswith("rows:") else ".h5"))


def rows_array(rows: int, width: int, seed: int):
    import numpy as np

    return np.random.default_rng(seed).standard_normal((rows, width))


def _build(cache: Path, name: str) -> Path:
    """Build fixture ``name`` (and what it needs) in this process; returns its path."""
    import numpy as np

    out = path_of(cache, name)
    if out.exists():
        return out
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    kind, key = name.split(":", 1)
    if kind == "rows":
        n, w, seed = ROWS[key]
        with open(tmp, "wb") as fh:
            np.save(fh, rows_array(n, w, seed))
    elif kind == "feat":
        from rfsgen import features, parse_skeleton, sampler

        if key in EOF:
            from rfsgen import eof

            skel_name, level = EOF[key]
            fs = eof.sample(parse_skeleton(skeleton_text(skel_name), f"{skel_name}.yaml"), level=level)
        else:
            skel_name, cols, seed, width = FEATURES[key]
            skel = parse_skeleton(skeleton_text(skel_name), f"{skel_name}.yaml", width=width)
            fs = sampler.sample(skel, cols, seed, scheme=SCHEMES.get(key, "rfs"))
        fs.tool_version = "fuzz-fixture"
        features.save(fs, str(tmp) + ".h5")
        os.replace(str(tmp) + ".h5", tmp)
    elif kind in ("full", "shard"):
        from rfsgen import transform_file

        big = key.startswith("big-")
        parts = key.split("-")
        if big:
            parts = parts[1:]
        layout, dtype = parts[0], parts[1]
        feat = _build(cache, "feat:circle-4k" if big else "feat:tabular-circle")
        rows = _build(cache, "rows:r8-3000" if big else "rows:r8")
        shard = f"{parts[2]}/3" if kind == "shard" else None
        transform_file(str(feat), str(rows), str(tmp) + ".h5", layout=layout, dtype=dtype, shard=shard)
        os.replace(str(tmp) + ".h5", tmp)
    else:
        raise KeyError(name)
    os.replace(tmp, out)
    return out


def ensure(cache, names) -> None:
    """Make sure every fixture in ``names`` exists in ``cache`` (built in a fresh interpreter)."""
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    missing = sorted({n for n in names if not path_of(cache, n).exists()})
    if not missing:
        return
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, __file__, str(cache), *missing], check=True, env=env, cwd=str(ROOT))


if __name__ == "__main__":
    c = Path(sys.argv[1])
    c.mkdir(parents=True, exist_ok=True)
    for n in sys.argv[2:]:
        _build(c, n)


def without_one_op(case):
    """Smaller variants of a failing case with several ops (the feature-file and shard
    generators' shrink): each with one op left out."""
    import json

    if len(case["ops"]) > 1:
        for i in range(len(case["ops"])):
            c = json.loads(json.dumps(case))
            del c["ops"][i]
            yield c
