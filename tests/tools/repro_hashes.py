"""Print SHA-256 hashes of feature files and transform outputs as JSON (used by
tests/test_reproducible.py, which runs this under several imitated CPUs).

Covers every sampled scheme (rfs, rr, orf on sphere and on gaussian nodes, exact with its float
column weights) and every base kind, float32 and float64, csr and
dense, and several --chunk-rows values.  Run: python tests/tools/repro_hashes.py OUTDIR
"""

import hashlib
import json
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "data"))

from conftest import SMALL_SKELETONS, rows_for  # noqa: E402

import cifar  # noqa: E402
from rfsgen import load_skeleton, parse_skeleton, sample, save_features  # noqa: E402
from rfsgen.transform import transform_file  # noqa: E402

JOBS = [("cifar-deep", "rfs"), ("shallow-gaussian", "rr"), ("shallow-gaussian", "orf"), ("mnist-conv", "rfs"),
        ("tabular-circle", "rfs"), ("gauss-laplace", "rfs"), ("categorical", "rfs"), ("cifar-deep", "exact"),
        ("gauss-laplace", "orf"), ("step-sphere", "rfs")]

# step over sphere nodes: powers in the millions, columns computed in the log domain
# (real 'coordinate' atoms and complex 'pair' ones).
STEP_SPHERE = """
rfsgen: 1
input: {width: 6}
nodes:
  - {name: p, base: sphere, scheme: pair, columns: [0, 1, 2, 3]}
  - {name: c, base: sphere, scheme: coordinate, columns: [4, 5]}
  - {name: out, activation: step, inputs: [p, c]}
"""


def digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main(out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    result = {}
    for name, scheme in JOBS:
        if name == "step-sphere":
            with warnings.catch_warnings():  # step over coordinate: the infinite-variance warning
                warnings.simplefilter("ignore")
                skel = parse_skeleton(STEP_SPHERE, name)
        elif name in SMALL_SKELETONS:
            skel = parse_skeleton(SMALL_SKELETONS[name], name)
        else:
            skel = load_skeleton(ROOT / "skeletons" / f"{name}.yaml")
        x = cifar.rows(64) if skel.width == 1728 else rows_for(skel, 61, seed=4)
        np.save(out / f"{name}.npy", x)
        fs = sample(skel, 60 if name == "categorical" else 700, seed=11, scheme=scheme)
        feats = out / f"{name}-{scheme}.h5"
        save_features(fs, feats, overwrite=True)
        result[f"{name}/{scheme}/features"] = digest(feats)
        for layout, dtype in (("csr", "float32"), ("dense", "float64")):
            for chunk in (None, 7):
                o = out / f"{name}-{scheme}-{layout}-{dtype}-{chunk}.h5"
                transform_file(feats, out / f"{name}.npy", o, layout=layout, dtype=dtype, chunk_rows=chunk,
                               overwrite=True)
                result[f"{name}/{scheme}/{layout}/{dtype}/{chunk}"] = digest(o)
    result["activation tables"] = _activations()
    return result


def _activations() -> str:
    """One hash over every activation's degree table and a run of tail degrees: the
    sampler's draws depend on their last bits (they were computed with numpy's
    CPU-specific exp/log before)."""
    from rfsgen.activations import REGISTRY, make_activation

    # parameters for the entries that need or take some (the rest: their defaults)
    given = {"polynomial": {"degree": 9, "c": 0.5}, "coefficients": {"values": [0.3, 0.2, 0.5]}, "exp": {"beta": 2.5},
             "arccos": {"degree": 2}, "function": {"expr": "where(x > 0, x, 0.1 * x) + tanh(x)"},
             "leaky_relu": {"slope": 0.2}, "elu": {"alpha": 0.5}}
    h = hashlib.sha256()
    for name in sorted(REGISTRY):
        act = make_activation(name, given.get(name, {}))
        h.update(act.coefficients.tobytes())
        if act.tail is not None:
            h.update(act.tail.sample(np.random.default_rng(1), 20000).tobytes())
    return h.hexdigest()


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1])), sort_keys=True))
