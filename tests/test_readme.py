"""The README is a promise: every code block a user would paste runs.

Shell and Python blocks run in a scratch directory that has `skeletons/` and a
`rows.npy` of real CIFAR rows, with this environment's `rfsgen` first on PATH;
YAML blocks must parse as skeletons.  Only blocks that install or build (`make`,
`pip install`) are skipped: the test suite itself is what `make test` runs.
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


RUN = [(i, lang, body) for i, (lang, body) in enumerate(BLOCKS) if lang in ("sh", "python") and not _skipped(body)]


@pytest.fixture
def scratch(tmp_path, cifar_rows):
    (tmp_path / "skeletons").symlink_to(ROOT / "skeletons")
    np.save(tmp_path / "rows.npy", cifar_rows[:24].astype(np.float32))
    return tmp_path


def test_the_readme_has_runnable_blocks():
    assert len(RUN) >= 3 and any(lang == "python" for _, lang, _ in RUN)


@pytest.mark.parametrize("index, lang, body", RUN, ids=[f"block{i}-{lang}" for i, lang, _ in RUN])
def test_readme_block_runs(scratch, index, lang, body):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if lang == "python":
        cmd = [sys.executable, "-c", body]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", body]
    res = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"README block {index}:\n{body}\n--- stderr:\n{res.stderr[-3000:]}"


@pytest.mark.parametrize("body", [b for lang, b in BLOCKS if lang == "yaml"])
def test_readme_yaml_blocks_are_valid_skeletons(body):
    parse_skeleton(body, "README")
