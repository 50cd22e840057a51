"""The documentation is a promise: every code block a user would paste runs, in order.

The pages are README.md and every ``docs/*.md`` (found by listing the folder, so a new page is
tested without touching this file).  Each page's ``sh`` and ``python`` blocks run in sequence in
one scratch directory per page, as a user would paste them into one terminal: a later block sees
the files an earlier one wrote, so an example that clobbers an earlier one's output (without
``--overwrite``) fails here as it would for the user.

The scratch directory stands in for the repository root after ``make demo``: ``skeletons/``, the
demo's rows in ``demo-output/rows.npy`` (written by the same function ``make demo`` runs) and a
stand-in for ``.venv/bin/activate`` (see :func:`_post_demo`).

- Only blocks that install or build (a line starting with ``make `` or ``pip install``) are
  skipped: the test suite itself is what ``make test`` runs.
- YAML blocks must parse as skeletons.
- A SLURM script (a shell block with ``#SBATCH``) runs once per array task with SLURM's variables
  set, and a ``make`` block runs as a makefile; each in a scratch directory of its own, where both
  must give the unsharded file.
- Every relative link of a page resolves to a file of the repository, and every ``#anchor`` to a
  heading of the page it names.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cifar  # tests/data/cifar.py (conftest puts tests/data on sys.path): what `make demo` runs
from conftest import ROOT
from rfsgen import parse_skeleton

BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
BIN = Path(sys.executable).parent  # the environment under test: its rfsgen and python
ACTIVATE = re.compile(r"^\s*(\.|source)\s+\.venv/bin/activate\b", re.M)


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _blocks(page: Path):
    """``(lang, body, line)`` of each fenced block of ``page``, in order (line: of the fence)."""
    text = page.read_text()
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in BLOCK.finditer(text)]


def _skipped(body: str) -> bool:
    return any(line.strip().startswith(("make ", "pip install")) for line in body.splitlines())


def _pasted(page: Path):
    """The blocks a user would paste into a terminal or a Python prompt, in page order."""
    return [(lang, body, line) for lang, body, line in _blocks(page)
            if lang in ("sh", "python") and not _skipped(body) and "#SBATCH" not in body]


ALL = [(page, lang, body) for page in PAGES for lang, body, _ in _blocks(page)]
SLURM = [body for _, lang, body in ALL if lang == "sh" and "#SBATCH" in body]
MAKEFILES = [body for _, lang, body in ALL if lang == "make"]
YAML = [(page, body) for page, lang, body in ALL if lang == "yaml"]


def test_the_pages_have_runnable_blocks():
    runnable = [b for page in PAGES for b in _pasted(page)]
    assert len(runnable) >= 10 and any(lang == "python" for lang, _, _ in runnable)
    assert ROOT / "docs" / "skeletons.md" in PAGES and len(PAGES) >= 5


def _post_demo(tmp: Path) -> Path:
    """A stand-in for the repository root after ``make demo``.

    ``make demo`` builds ``.venv`` (a minute of pip) and writes ``demo-output/``.  The test does
    not build a second environment: the interpreter running it is the environment under test
    (``make test``'s own ``.venv``).  So ``.venv/bin/activate`` here is a two-line stand-in that
    does, for rfsgen's purposes, what venv's script does: put that environment's ``bin`` first
    on PATH.  The README's blocks start without it on PATH (see :func:`_path`), so a quick start
    that forgets to activate fails here as it did for users."""
    (tmp / "skeletons").symlink_to(ROOT / "skeletons")
    (tmp / "demo-output").mkdir()
    np.save(tmp / "demo-output" / "rows.npy", cifar.rows(64).astype(np.float32))
    venv = tmp / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "activate").write_text(
        "# stand-in for the virtual environment that make demo builds (tests/test_readme.py)\n"
        f"export VIRTUAL_ENV='{BIN.parent}'\nexport PATH='{BIN}'\"${{PATH:+:$PATH}}\"\n")
    return tmp


def _path(active: bool) -> str:
    """PATH for a block: with the environment's ``bin`` first once the page activated it (in a
    terminal it stays active for the later blocks), else without any ``rfsgen`` at all."""
    rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and not (Path(p) / "rfsgen").exists()]
    return os.pathsep.join(([str(BIN)] if active else []) + rest)


def _env(active: bool = True, **extra):
    return dict(os.environ, PATH=_path(active), DASK_SCHEDULER_ADDRESS="", RFSGEN_SCHEDULER="", **extra)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_page_blocks_run_in_sequence(tmp_path, page):
    blocks = _pasted(page)
    if not blocks:
        pytest.skip(f"{_name(page)} has no shell or Python block")
    scratch = _post_demo(tmp_path)
    # Docs pages are read by someone who has rfsgen installed (make demo + activate, or pip);
    # the README is the first contact: nothing is on PATH until its block activates .venv.
    active = page.name != "README.md" or page.parent != ROOT
    for k, (lang, body, line) in enumerate(blocks):
        cmd = [sys.executable, "-c", body] if lang == "python" else ["bash", "-euo", "pipefail", "-c", body]
        res = subprocess.run(cmd, cwd=scratch, env=_env(active), capture_output=True, text=True, timeout=600)
        earlier = f" (after its {k} earlier block(s), in the same directory)" if k else ""
        assert res.returncode == 0, (f"{_name(page)}, the {lang} block at line {line}{earlier}:\n{body}\n"
                                     f"--- stdout:\n{res.stdout[-2000:]}\n--- stderr:\n{res.stderr[-3000:]}")
        active = active or (lang == "sh" and ACTIVATE.search(body) is not None)
    # A recipe that starts services (the Dask cluster) stops them cleanly before it ends.
    logs = {f.name: f.read_text(errors="replace") for f in scratch.glob("*.log")}
    tracebacks = {name: text[text.index("Traceback"):][:3000] for name, text in logs.items() if "Traceback" in text}
    assert not tracebacks, f"{_name(page)}: tracebacks in the logs: {tracebacks}"
    left = _processes_in(scratch)
    assert not left, f"{_name(page)}: processes still running in the page's directory: {left}"


def _processes_in(directory: Path) -> list:
    """Command lines of this user's processes whose working directory is ``directory``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(proc / "cwd")) == directory.resolve():
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip())
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def _sh(cmd, cwd, **env):
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=cwd, env=_env(**env),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{cmd}\n--- stderr:\n{res.stderr[-3000:]}"


@pytest.fixture
def scratch(tmp_path, cifar_rows):
    (tmp_path / "skeletons").symlink_to(ROOT / "skeletons")
    np.save(tmp_path / "rows.npy", cifar_rows[:24].astype(np.float32))
    return tmp_path


@pytest.mark.parametrize("body", SLURM)
def test_slurm_array_script_shards_and_merges(scratch, body):
    tasks = re.search(r"#SBATCH --array=0-(\d+)", body)
    n = int(tasks.group(1)) + 1
    _sh("rfsgen sample cifar-deep -n 2048 --seed 1 -o features.h5 -q", scratch)
    (scratch / "transform.sbatch").write_text(body)
    for k in range(n):
        _sh("bash transform.sbatch", scratch, SLURM_ARRAY_TASK_ID=str(k), SLURM_ARRAY_TASK_COUNT=str(n),
            SLURM_CPUS_PER_TASK="1")
    _sh("rfsgen merge part-*.h5 -o all.h5 -q && rfsgen transform features.h5 rows.npy -o direct.h5 -q && "
        "cmp all.h5 direct.h5", scratch)


@pytest.mark.parametrize("body", MAKEFILES)
def test_makefile_shards_and_merges(scratch, body):
    (scratch / "shards.mk").write_text(body)  # the name batch.md tells users to save it under
    _sh("make -f shards.mk -j2 all.h5 && rfsgen transform features.h5 rows.npy -o direct.h5 -q && "
        "cmp all.h5 direct.h5", scratch)


def test_the_docs_have_cluster_recipes():
    assert SLURM and MAKEFILES


@pytest.mark.parametrize("page, body", YAML, ids=[f"{_name(p)}-yaml{i}" for i, (p, _) in enumerate(YAML)])
def test_yaml_blocks_are_valid_skeletons(page, body):
    parse_skeleton(body, _name(page))


# ----------------------------------------------------------------------------- links

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """``text`` without fenced blocks and inline code (their brackets are not links)."""
    return re.sub(r"`[^`\n]*`", "", BLOCK.sub("", text))


def _anchors(page: Path) -> set:
    """The anchors GitHub makes for ``page``'s headings: lower case, inline code marks and
    punctuation other than ``-`` and ``_`` dropped, spaces to ``-``; repeats get ``-1``, ``-2``."""
    seen, out = {}, set()
    for heading in HEADING.findall(BLOCK.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_link_resolves(page):
    bad = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or ROOT.resolve() not in dest.parents:
            bad.append(f"{target}: no such file in the repository")
        elif anchor and (dest.suffix != ".md" or anchor not in _anchors(dest)):
            bad.append(f"{target}: no heading '#{anchor}' in {_name(dest)}")
    assert not bad, f"{_name(page)}: " + "; ".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_pages_name_no_missing_design_notes_or_issue_numbers(page):
    text = page.read_text()
    assert "DESIGN.md" not in text, f"{_name(page)} refers to DESIGN.md, which is not in the repository"
    found = re.search(r"\bissues? \d+", text, re.I)
    assert not found, f"{_name(page)} refers to '{found.group(0)}': say what it is instead"
