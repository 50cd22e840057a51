"""``--obsm`` cases: ``transform f.h5 cells.h5ad -o out.h5ad --obsm KEY`` onto AnnData files of
other shapes: ``obsm`` or ``uns`` a dataset, a soft link (to /X, to itself, to nowhere), an
external link to a missing file; ``uns/rfsgen`` a dataset or a dangling link; ``obsm/KEY``
already there; odd keys.  The oracle: one line naming the group, or a copy whose X is the
input's and whose ``obsm/KEY`` holds the rows' features (finite, of the right shape).
"""

from __future__ import annotations

import numpy as np

from . import fixtures

#: (path, what it becomes) in the input file
SHAPES = [("obsm", "dataset"), ("obsm", "softlink-X"), ("obsm", "loop"), ("obsm", "dangling"), ("obsm", "extlink"),
          ("uns", "dataset"), ("uns", "softlink-X"), ("uns", "dangling"), ("uns/rfsgen", "dataset"),
          ("uns/rfsgen", "dangling"), ("uns/rfsgen", "loop"), ("uns/rfsgen", "extlink"), ("obsm/KEY", "dataset"),
          ("obsm", "group"), ("uns", "group"), (None, None)]
KEYS = ["X_rf", "X_rf", "a/b", "", ".", "x" * 300, "X_rf\u00e9", "obs"]


def write_h5ad(p: dict, path) -> None:
    """An h5ad file of ``p["rows"]`` (dense X, obs names) with ``p["at"]`` made ``p["how"]``."""
    import h5py

    from .gen_rows import write_rows

    write_rows(dict(p["rows"], fmt="h5ad-dense"), path)
    at, how = p.get("at"), p.get("how")
    if not at:
        return
    at = at.replace("KEY", p.get("key", "X_rf"))
    with h5py.File(path, "a") as f:
        if "/" in at:
            f.require_group(at.rsplit("/", 1)[0])
        if how == "dataset":
            f.create_dataset(at, data=np.arange(6.0).reshape(3, 2))
        elif how == "softlink-X":
            f[at] = h5py.SoftLink("/X")
        elif how == "loop":
            f[at] = h5py.SoftLink("/" + at)
        elif how == "dangling":
            f[at] = h5py.SoftLink("/nowhere")
        elif how == "extlink":
            f[at] = h5py.ExternalLink("missing.h5", "/g")
        elif how == "group":  # an existing, ordinary group with something in it
            g = f.create_group(at)
            g.attrs["encoding-type"] = "dict"
            g.attrs["encoding-version"] = "0.1.0"
            g.create_dataset("other", data=np.zeros((len(f["X"]), 2)))


def generate(rng: np.random.Generator, cid: str) -> dict:
    feat = str(rng.choice(["tabular-circle", "gauss8", "laplace8"]))
    n = int(rng.integers(1, 12))
    rows = {"seed": int(rng.integers(2**31)), "n": n, "width": fixtures.WIDTHS[feat], "mode": "normal"}
    at, how = SHAPES[rng.integers(len(SHAPES))]
    key = str(rng.choice(KEYS)) if rng.random() < 0.3 else "X_rf"
    if at == "obsm/KEY" and key in ("", ".", ".."):
        # no HDF5 member has such a name ("obsm/" is no name, "obsm/." is obsm itself): the
        # key cannot be there already, and the run tests the key alone (rfsgen refuses it)
        at, how = None, None
    files = {"f.h5": {"fixture": f"feat:{feat}"}, "cells.h5ad": {"h5ad": {"rows": rows, "at": at, "how": how,
                                                                         "key": key}}}
    argv = ["transform", "f.h5", "cells.h5ad", "-o", "out.h5ad", "--obsm", key, "-q",
            "--layout", str(rng.choice(["dense", "csr"])), "--dtype", str(rng.choice(["float32", "float64"]))]
    check = {"type": "obsm", "key": key, "rows": n, "columns": fixtures.columns_of(feat),
             "probe_rows": dict(rows, fmt="h5ad-dense")}
    if at == "obsm/KEY":
        check["must_fail"] = "a key the file already holds"
    if how in ("loop", "dangling", "extlink") or (how == "dataset" and at in ("obsm", "uns", "uns/rfsgen")):
        check["must_fail"] = f"{at} a {how}"
    return {"kind": "obsm", "id": cid, "files": files, "ops": [], "argv": argv, "output": "out.h5ad", "check": check}
