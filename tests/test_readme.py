"""The README is a promise: every code block a user would paste runs.

Shell and Python blocks run in a scratch directory that has `skeletons/` and a
`rows.npy` of real CIFAR rows, with this environment's `rfsgen` first on PATH;
YAML blocks must parse as skeletons.  A SLURM script (a shell block with `#SBATCH`)
runs once per array task with SLURM's variables set, and a `make` block runs as a
Makefile; both must give the unsharded file.  Only blocks that install or build
(`make ...`, `pip install`) are skipped: the test suite itself is what `make test` runs.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from rfsgen import parse_skeleton

BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
BLOCKS = [(lang, body) for lang, body in BLOCK.findall((ROOT / "README.md").read_text())]


def _skipped(body: str) -> bool:
    return any(line.strip().startswith(("make ", "pip install")) for line in body.splitlines())


RUN = [(i, lang, body) for i, (lang, body) in enumerate(BLOCKS)
       if lang in ("sh", "python") and not _skipped(body) and "#SBATCH" not in body]
SLURM = [body for lang, body in BLOCKS if lang == "sh" and "#SBATCH" in body]
MAKEFILES = [body for lang, body in BLOCKS if lang == "make"]


@pytest.fixture
def scratch(tmp_path, cifar_rows):
    (tmp_path / "skeletons").symlink_to(ROOT / "skeletons")
    np.save(tmp_path / "rows.npy", cifar_rows[:24].astype(np.float32))
    return tmp_path


def test_the_readme_has_runnable_blocks():
    assert len(RUN) >= 3 and any(lang == "python" for _, lang, _ in RUN)


@pytest.mark.parametrize("index, lang, body", RUN, ids=[f"block{i}-{lang}" for i, lang, _ in RUN])
def test_readme_block_runs(scratch, index, lang, body):
    env = _env()
    if lang == "python":
        cmd = [sys.executable, "-c", body]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", body]
    res = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"README block {index}:\n{body}\n--- stderr:\n{res.stderr[-3000:]}"


def _env():
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                DASK_SCHEDULER_ADDRESS="")


def _sh(cmd, cwd, **env):
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=cwd, env=dict(_env(), **env),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{cmd}\n--- stderr:\n{res.stderr[-3000:]}"


@pytest.mark.parametrize("body", SLURM)
def test_readme_slurm_array_script_shards_and_merges(scratch, body):
    import re as _re

    tasks = _re.search(r"#SBATCH --array=0-(\d+)", body)
    n = int(tasks.group(1)) + 1
    _sh("rfsgen sample skeletons/cifar-deep.yaml -n 2048 --seed 1 -o features.h5 -q", scratch)
    (scratch / "transform.sbatch").write_text(body)
    for k in range(n):
        _sh("bash transform.sbatch", scratch, SLURM_ARRAY_TASK_ID=str(k), SLURM_ARRAY_TASK_COUNT=str(n),
            SLURM_CPUS_PER_TASK="1")
    _sh("rfsgen merge part-*.h5 -o all.h5 -q && rfsgen transform features.h5 rows.npy -o direct.h5 -q && "
        "cmp all.h5 direct.h5", scratch)


@pytest.mark.parametrize("body", MAKEFILES)
def test_readme_makefile_shards_and_merges(scratch, body):
    (scratch / "Makefile").write_text(body)
    _sh("make -j2 all.h5 && rfsgen transform features.h5 rows.npy -o direct.h5 -q && cmp all.h5 direct.h5", scratch)


def test_the_readme_has_cluster_recipes():
    assert SLURM and MAKEFILES


@pytest.mark.parametrize("body", [b for lang, b in BLOCKS if lang == "yaml"])
def test_readme_yaml_blocks_are_valid_skeletons(body):
    parse_skeleton(body, "README")
