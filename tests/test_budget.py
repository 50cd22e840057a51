"""The memory budget (rfsgen.budget) and the bounds that use it: the sampler's blocks and
columns, its draw cap, the kernel's matrices, the transform's chunks, and --max-memory."""

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import ROOT, skeleton_path
from rfsgen import budget, sampler
from rfsgen.cli import main
from rfsgen.errors import InputError, LimitError, SamplerError, UsageError
from rfsgen.kernel import _Plan, check_memory, kernel
from rfsgen.skeleton import load_skeleton, parse_skeleton

EXP8 = "rfsgen: 1\ninput: {width: 1}\nnodes:\n  - {name: x, base: circle}\n" + "".join(
    f"  - {{name: h{i}, activation: {{name: exp, beta: 5}}, inputs: [{'x' if i == 1 else f'h{i - 1}'}]}}\n"
    for i in range(1, 9))
WIDE = ("rfsgen: 1\ninput: {{width: 10000000}}\nnodes:\n  - {{name: x, base: {base}}}\n"
        "  - {{name: out, activation: {{name: exp, beta: 1}}, inputs: [x]}}\n")
PATCH99 = ("rfsgen: 1\ninput: {shape: [100, 100, 100]}\nnodes:\n"
           "  - {name: p, base: gaussian, per: patch, patch: {size: 99, stride: 1}}\n"
           "  - {name: out, activation: relu, dense: true}\n")
FINITE = ("rfsgen: 1\ninput: {{width: 2}}\nnodes:\n  - {{name: c, base: categorical, categories: {k}, per: column}}\n"
          "  - {{name: out, activation: {{name: polynomial, degree: {p}}}, inputs: [c]}}\n")


def run(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)


def one_error_line(res):
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rfsgen: error: "), res.output
    return lines[0]


# ----------------------------------------------------------------------------- budget itself
@pytest.mark.parametrize("text, value", [("512M", 512 << 20), ("4G", 4 << 30), ("1.5GiB", 3 << 29), ("2e9", 2 * 10**9),
                                         ("1000", 1000), ("3 kb", 3000)])
def test_parse_size(text, value):
    assert budget.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "12x", "-1G", "0", "G", "1e400000G"[:4] + "Q"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError):
        budget.parse_size(text)


def test_limit_order(monkeypatch):
    monkeypatch.setenv(budget.ENV, "3M")
    assert budget.limit() == 3 << 20
    with budget.limited("1M"):
        assert budget.limit() == 1 << 20
        with budget.limited(None):
            assert budget.limit() == 1 << 20
    assert budget.limit() == 3 << 20
    monkeypatch.delenv(budget.ENV)
    assert budget.limit() == int(budget.machine_memory() * budget.DEFAULT_FRACTION)


def test_check_at_and_past_the_limit():
    with budget.limited(1000):
        budget.check(1000, "thing")
        with pytest.raises(LimitError, match=r"thing needs about 1001 B, over the memory budget of 1000 B; do less"):
            budget.check(1001, "thing", "do less")


# ----------------------------------------------------------------------------- sampler
def _exact_need(skel, columns):
    t = sampler._tables(skel)
    fp = sampler.footprint(skel, t)
    first = next(sampler.block_sizes(skel, columns))
    return fp.block_bytes(first) + fp.column_bytes(columns)


def test_sampler_block_at_and_past_the_budget():
    skel = parse_skeleton("\n".join(EXP8.replace("beta: 5", "beta: 2").splitlines()[:8]) + "\n", "exp.yaml")
    need = int(np.ceil(_exact_need(skel, 2)))
    reference = sampler.sample(skel, 2, seed=3)
    with budget.limited(need):
        fs = sampler.sample(skel, 2, seed=3)  # the same draws under any budget that holds them
    assert fs.draws == reference.draws and np.array_equal(fs.count, reference.count)
    with budget.limited(need - 1), pytest.raises(LimitError, match=r"node 'x'.*over the memory budget"):
        sampler.sample(skel, 2, seed=3)


def test_sampler_columns_checked_before_anything():
    skel = load_skeleton(skeleton_path("cifar-deep"))
    t = sampler._tables(skel)
    fp = sampler.footprint(skel, t)
    with budget.limited(int(fp.column_bytes(10**6)) - 1), pytest.raises(LimitError, match="1000000 columns asked for"):
        sampler.sample(skel, 10**6)


def test_footprint_complexity_matches_reach():
    # Without heavy tails or degree caps the expected items reaching the inputs is C(S).
    skel = parse_skeleton(FINITE.format(k=3, p=3), "f.yaml")
    fp = sampler.footprint(skel, sampler._tables(skel))
    inputs = [v.id for v in skel.input_nodes]
    assert fp.reach[inputs].sum() == pytest.approx(skel.complexity)


@pytest.mark.parametrize("text, node", [(EXP8, "'x'"), (WIDE.format(base="gaussian"), "'x' (gaussian over 10000000"),
                                        (WIDE.format(base="laplace"), "'x' (laplace over 10000000")])
def test_issue_blowups_fail_fast_with_one_line(tmp_path, text, node, monkeypatch):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    walked = _count_walks(monkeypatch)
    res = run(["sample", p, "-n", 1, "-o", tmp_path / "f.h5", "--max-memory", "1G"])
    assert res.exit_code == 1
    line = one_error_line(res)
    assert f"node {node}" in line and "needs about" in line and "memory budget of 1.0 GiB" in line
    assert walked == []  # fast: refused from the estimate, before a single draw (a count, not seconds)
    assert not (tmp_path / "f.h5").exists()


def _count_walks(monkeypatch) -> list:
    """The draws of every block the sampler walks from now on (``sampler._walk``'s
    ``n_draws``), appended to the returned list: the sampler's work as a count, which
    a loaded machine cannot change (issue 37, item 11: no test asserts seconds)."""
    walked, walk = [], sampler._walk

    def counted(skel, t, rng, n_draws, *a, **kw):
        walked.append(int(n_draws))
        return walk(skel, t, rng, n_draws, *a, **kw)

    monkeypatch.setattr(sampler, "_walk", counted)
    return walked


def test_issue_patch99_fails_fast(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(PATCH99)
    res = run(["sample", p, "-n", 1, "-o", tmp_path / "f.h5", "--max-memory", "1G"])
    assert res.exit_code == 1
    assert "node 'p[0, 0]' (gaussian over 980100 columns)" in one_error_line(res)


def test_issue_blowup_allocates_little_under_a_memory_cap(tmp_path):
    """The 1e7-wide Gaussian under RLIMIT_AS of 3 GiB: the budget's error, not a MemoryError."""
    p = tmp_path / "s.yaml"
    p.write_text(WIDE.format(base="gaussian"))

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    env = dict(os.environ, PYTHONPATH=str(ROOT), RFSGEN_MAX_MEMORY="2G")
    res = subprocess.run([sys.executable, "-m", "rfsgen", "sample", str(p), "-n", "1", "-o", str(tmp_path / "f.h5")],
                         preexec_fn=cap, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr
    assert res.stderr.count("\n") == 1 and "memory budget of 2.0 GiB" in res.stderr and "Traceback" not in res.stderr


def test_max_memory_option_and_env(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(EXP8)
    res = run(["sample", p, "-n", 1, "-o", tmp_path / "f.h5"], env={budget.ENV: "64M"})
    assert res.exit_code == 1 and "memory budget of 64.0 MiB" in one_error_line(res)
    res = run(["sample", p, "-n", 1, "-o", tmp_path / "f.h5", "--max-memory", "12x"])
    assert res.exit_code == 2 and "--max-memory" in one_error_line(res)
    for cmd in ("sample", "transform", "kernel", "approx", "merge"):
        assert "--max-memory SIZE" in run([cmd, "--help"]).output


# ----------------------------------------------------------------------------- sampler ends
def test_finite_feature_space_refused_at_once():
    skel = parse_skeleton(FINITE.format(k=3, p=2), "f.yaml")
    space = sampler.feature_space(skel)
    assert space == 9  # two categorical nodes of 3 values each
    with pytest.raises(SamplerError, match="can give at most 9 distinct columns"):
        sampler.sample(skel, 10)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(k=st.integers(2, 4), p=st.integers(1, 3), base=st.sampled_from(["categorical", "binary", "circle", "sphere"]))
def test_feature_space_bounds_what_the_sampler_finds(k, p, base):
    params = {"categorical": f"categorical, categories: {k}", "binary": "binary", "circle": "circle",
              "sphere": "sphere, per: all"}[base]
    text = FINITE.format(k=k, p=p).replace(f"categorical, categories: {k}", params)
    if base == "sphere":
        text = text.replace(", per: column", "")
    skel = parse_skeleton(text, "f.yaml")
    space = sampler.feature_space(skel)
    assert np.isfinite(space)
    try:
        fs = sampler.sample(skel, int(space), seed=1, max_draws=20_000)
        found = fs.columns
    except SamplerError as e:
        found = int(str(e).split("produced only ")[1].split()[0])
    assert found <= space


def test_slow_feature_space_ends_with_a_count(monkeypatch):
    """Issue 23, item 12: tabular-auto bound to width 1 with -n 256 walked for over 10
    minutes.  With the cap and the rate projection scaled down, it ends quickly with a
    line that says the columns are unbounded but rare."""
    monkeypatch.setattr(sampler, "MAX_DRAWS", 1 << 21)
    monkeypatch.setattr(sampler, "DRAWS_PER_COLUMN", 0)
    monkeypatch.setattr(sampler, "PROJECT_AFTER", 1 << 18)
    skel = load_skeleton(skeleton_path("tabular-auto")).bind(1)
    assert sampler.feature_space(skel) == np.inf
    walked = _count_walks(monkeypatch)
    with pytest.raises(SamplerError, match=r"produced only \d+ distinct columns.*unbounded, but new ones come ever"):
        sampler.sample(skel, 256, seed=0)
    # Ended by the cap (or the projection before it), not by a clock: the draws walked are
    # at most the cap and the blocks in flight beside the last one.
    from rfsgen._compiled import threads

    sizes = sampler.block_sizes(skel, 256)
    largest = max(next(sizes) for _ in range(32))
    assert 0 < sum(walked) <= sampler.MAX_DRAWS + (threads() + 2) * largest


def test_draw_cap_scales_down_with_expensive_draws():
    skel = parse_skeleton(EXP8, "exp8.yaml")
    fp = sampler.footprint(skel, sampler._tables(skel))
    assert fp.items > 10_000  # items per draw, so the cap is below 2^32 / items + 64 D draws
    assert sampler.MAX_WALK_ITEMS / fp.items < 1e6


# ----------------------------------------------------------------------------- generated
@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(depth=st.integers(1, 8), beta=st.floats(0.25, 6.0), base=st.sampled_from(["circle", "gaussian", "laplace"]),
       width=st.sampled_from([1, 10, 1000, 10**5, 10**7]), n=st.integers(1, 64))
def test_generated_skeletons_finish_within_budget_or_fail_fast(depth, beta, base, width, n):
    import tracemalloc

    if base == "circle":
        width = 1
    text = (f"rfsgen: 1\ninput: {{width: {width}}}\nnodes:\n  - {{name: x, base: {base}}}\n" + "".join(
        f"  - {{name: h{i}, activation: {{name: exp, beta: {beta}}}, inputs: [{'x' if i == 1 else f'h{i - 1}'}]}}\n"
        for i in range(1, depth + 1)))
    skel = parse_skeleton(text, "gen.yaml")
    limit = 64 << 20
    walked, walk = [], sampler._walk

    def counted(skel, t, rng, n_draws, *a, **kw):  # the work as a count of draws, not seconds
        walked.append(int(n_draws))
        return walk(skel, t, rng, n_draws, *a, **kw)

    tracemalloc.start()
    sampler._walk = counted
    try:
        with budget.limited(limit):
            sampler.sample(skel, n, seed=1, max_draws=200_000, threads=1)
    except (LimitError, SamplerError):
        pass
    finally:
        sampler._walk = walk
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    sizes = sampler.block_sizes(skel, n)
    largest = max(next(sizes) for _ in range(32))
    assert sum(walked) <= 200_000 + 3 * largest  # the cap, and at most two blocks in flight past it (threads=1)
    assert peak < 2 * limit


# ----------------------------------------------------------------------------- kernel, transform
def test_kernel_at_and_past_the_budget(cifar_rows):
    skel = load_skeleton(skeleton_path("shallow-gaussian"))
    x = cifar_rows[:20]
    per_row, fixed = check_memory(skel, _Plan(skel), 20, 20, True)
    with budget.limited(per_row + fixed):
        k = kernel(skel, x)
    assert np.allclose(np.diag(k), 1.0)
    with budget.limited(per_row + fixed - 1), pytest.raises(LimitError, match="20 x 20 rows"):
        kernel(skel, x)


def test_kernel_cli_checks_before_reading(tmp_path, cifar_rows):
    np.save(tmp_path / "x.npy", cifar_rows)
    res = run(["kernel", skeleton_path("shallow-gaussian"), tmp_path / "x.npy", "-o", tmp_path / "k.npy",
               "--max-memory", "100K"])
    assert res.exit_code == 1 and "for the kernel needs about" in one_error_line(res)
    assert not (tmp_path / "k.npy").exists()


def test_transform_chunks_fit_the_budget_with_the_same_bytes(tmp_path, cifar_rows):
    from rfsgen.features import save
    from rfsgen.transform import Transformer, transform_file

    fs = sampler.sample(load_skeleton(skeleton_path("cifar-deep")), 200, seed=2)
    save(fs, tmp_path / "f.h5")
    np.save(tmp_path / "x.npy", cifar_rows)
    row = Transformer(fs).row_bytes
    transform_file(tmp_path / "f.h5", tmp_path / "x.npy", tmp_path / "a.h5")
    # A quarter of the budget per chunk: a few rows a chunk (the expanded skeleton, about
    # 300 KiB, must fit too).
    with budget.limited("1M"):
        assert budget.limit() // 4 // row < 8
        transform_file(tmp_path / "f.h5", tmp_path / "x.npy", tmp_path / "b.h5")
    assert (tmp_path / "a.h5").read_bytes() == (tmp_path / "b.h5").read_bytes()
    res = run(["transform", tmp_path / "f.h5", tmp_path / "x.npy", "-o", tmp_path / "c.h5", "--chunk-rows", 64,
               "--max-memory", "1M"])
    assert res.exit_code == 1 and "a chunk of 64 rows" in one_error_line(res)
    with budget.limited("64K"), pytest.raises(LimitError, match="node 'pixels'"):  # not a damaged file
        transform_file(tmp_path / "f.h5", tmp_path / "x.npy", tmp_path / "d.h5")
    assert not (tmp_path / "c.h5").exists()


def test_approx_checks_its_matrices(tmp_path, cifar_rows):
    from rfsgen.approx import approx

    skel = load_skeleton(skeleton_path("shallow-gaussian"))
    with budget.limited("1M"), pytest.raises(LimitError, match="64 x 4096 feature matrix"):
        approx(skel, cifar_rows, [4096], trials=1, rows=64)


# ----------------------------------------------------------------------------- issue 37, item 5
GAUSS5 = "rfsgen: 1\ninput: {width: 5}\nnodes:\n  - {name: x, base: gaussian, scale: 0.5}\n"


def test_process_limits_are_ceilings(monkeypatch, tmp_path):
    """RLIMIT_AS / RLIMIT_DATA (less what the process already maps) and the cgroup's room
    cap any budget asked for; the error then names the limit, not --max-memory."""
    limits = {resource.RLIMIT_AS: 3_000_000 << 10, resource.RLIMIT_DATA: resource.RLIM_INFINITY}
    monkeypatch.setattr(resource, "getrlimit", lambda r: (limits.get(r, resource.RLIM_INFINITY),) * 2)
    monkeypatch.setattr(budget, "_proc_status", lambda: {"VmSize": 1 << 30, "VmData": 1 << 28})
    monkeypatch.setattr(budget, "CGROUP_ROOT", str(tmp_path / "no-cgroups"))
    room = (3_000_000 << 10) - (1 << 30)
    assert budget.ceiling()[0] == room
    with budget.limited("100G"):
        assert budget.limit() == room
        with pytest.raises(LimitError, match=r"over the memory budget of 1.9 GiB, .*RLIMIT_AS \(ulimit -v\); "
                                             r"do less \(or raise that limit\)") as e:
            budget.check(room + 1, "thing", "do less")
        assert "--max-memory" not in str(e.value)
        budget.check(room, "thing")
    with budget.limited("1M"):  # a smaller budget asked for stays in force, with its usual message
        assert budget.limit() == 1 << 20
        with pytest.raises(LimitError, match=r"budget of 1.0 MiB; x \(or raise the budget with --max-memory"):
            budget.check(2 << 20, "thing", "x")
    limits[resource.RLIMIT_DATA] = (1 << 28) + 5000
    assert budget.ceiling() == (5000, "what this process may still allocate under its limit RLIMIT_DATA (ulimit -d)")
    # cgroup v2 at the root: the limit less what the cgroup holds outside the page cache
    limits[resource.RLIMIT_AS] = limits[resource.RLIMIT_DATA] = resource.RLIM_INFINITY
    root = tmp_path / "cg"
    _cgroup_files(root, 1_000_000, 700_000, "anon 400000\nfile 300000\n")
    monkeypatch.setattr(budget, "CGROUP_ROOT", str(root))
    monkeypatch.setattr(budget, "PROC_CGROUP", str(tmp_path / "no-proc"))
    assert budget.ceiling() == (600_000, f"what is left in this process's memory cgroup ({root / 'memory.max'})")
    (root / "memory.max").write_text("max\n")
    assert budget.ceiling() == (None, "")


def _cgroup_files(d, cap, used, stat, v1=False):
    """One level of a fake memory cgroup: its limit (an int or "max"), usage and statistics."""
    d.mkdir(parents=True, exist_ok=True)
    names = ("memory.limit_in_bytes", "memory.usage_in_bytes") if v1 else ("memory.max", "memory.current")
    (d / names[0]).write_text(f"{cap}\n")
    (d / names[1]).write_text(f"{used}\n")
    (d / "memory.stat").write_text(stat)


def _fake_cgroups(monkeypatch, tmp_path, proc_text):
    (tmp_path / "proc-cgroup").write_text(proc_text)
    monkeypatch.setattr(budget, "PROC_CGROUP", str(tmp_path / "proc-cgroup"))
    monkeypatch.setattr(budget, "CGROUP_ROOT", str(tmp_path / "sys"))
    return tmp_path / "sys"


def test_cgroup_v2_follows_the_process_own_cgroup_to_the_tightest(monkeypatch, tmp_path):
    """The process's own cgroup (from /proc/self/cgroup, "0::/path") and every ancestor up
    to the root are read; the level with the least room binds, and is named."""
    monkeypatch.setattr(budget, "_proc_status", lambda: {})
    monkeypatch.setattr(resource, "getrlimit", lambda r: (resource.RLIM_INFINITY,) * 2)
    sys_root = _fake_cgroups(monkeypatch, tmp_path, "0::/user.slice/job-7/step\n")
    leaf, job = sys_root / "user.slice/job-7/step", sys_root / "user.slice/job-7"
    _cgroup_files(leaf, "max", 10 << 20, "anon 1\nfile 0\n")  # the leaf has no limit of its own
    _cgroup_files(job, 800 << 20, 500 << 20, "anon 1\nfile 100000000\n")  # 800 MiB less (500 MiB - the cache)
    _cgroup_files(sys_root / "user.slice", 4 << 30, 1 << 30, "file 0\n")
    _cgroup_files(sys_root, 64 << 30, 0, "file 0\n")  # (a root's limit file, as a container may show)
    room = (800 << 20) - ((500 << 20) - 100_000_000)
    assert budget.ceiling() == (room, f"what is left in this process's memory cgroup ({job / 'memory.max'})")
    assert budget.machine_memory() <= 800 << 20
    with budget.limited("100G"):
        assert budget.limit() == room
        with pytest.raises(LimitError, match=r"memory cgroup \(.*job-7/memory.max\); fix \(or raise that limit\)"):
            budget.check(room + 1, "thing", "fix")
    # the tightest may be an ancestor: the job's room grows past its parent's
    (job / "memory.max").write_text("max\n")
    assert budget.ceiling() == ((4 << 30) - (1 << 30), f"what is left in this process's memory cgroup "
                                                        f"({sys_root / 'user.slice/memory.max'})")
    # a level the process cannot see (a container showing its own cgroup as the root) is passed over
    (tmp_path / "proc-cgroup").write_text("0::/elsewhere/x\n")
    assert budget.ceiling() == (64 << 30, f"what is left in this process's memory cgroup ({sys_root / 'memory.max'})")
    # no /proc/self/cgroup: the root's files, as before
    monkeypatch.setattr(budget, "PROC_CGROUP", str(tmp_path / "missing"))
    assert budget.ceiling()[0] == 64 << 30


def test_cgroup_v1_memory_controller_and_unsafe_paths(monkeypatch, tmp_path):
    """v1: the "memory" controller's line (alone or with others) names the cgroup under
    /sys/fs/cgroup/memory; "no limit" (a page short of 2^63) is none; ".." in a path
    cannot leave the tree."""
    monkeypatch.setattr(budget, "_proc_status", lambda: {})
    monkeypatch.setattr(resource, "getrlimit", lambda r: (resource.RLIM_INFINITY,) * 2)
    sys_root = _fake_cgroups(monkeypatch, tmp_path, "9:pids:/\n4:cpu,memory:/docker/abc\n1:name=systemd:/\n0::/\n")
    mem = sys_root / "memory"
    _cgroup_files(mem, 9223372036854771712, 5 << 30, "total_cache 0\n", v1=True)
    _cgroup_files(mem / "docker", 9223372036854771712, 5 << 30, "total_cache 0\n", v1=True)
    _cgroup_files(mem / "docker/abc", 2 << 30, 1 << 30, "cache 7\ntotal_cache 268435456\n", v1=True)
    assert budget.ceiling() == ((2 << 30) - (1 << 30) + (256 << 20), f"what is left in this process's memory "
                                                                    f"cgroup ({mem / 'docker/abc/memory.limit_in_bytes'})")
    assert budget.machine_memory() <= 2 << 30
    (tmp_path / "proc-cgroup").write_text("4:memory:/../../../etc\n")
    assert budget.ceiling() == (None, "")
    (tmp_path / "proc-cgroup").write_text("garbage\n\n4:cpu:/docker/abc\n")  # no memory controller: the root only
    assert budget.ceiling() == (None, "")


def test_issue_ulimit_v_is_the_budget_error_not_memoryerror(tmp_path):
    """Under `ulimit -v 3000000` a kernel whose matrix needs 3.2 GB stopped in numpy's
    MemoryError: now the budget's one line, naming RLIMIT_AS, even with --max-memory 100G."""
    np.save(tmp_path / "x.npy", np.linspace(-1, 1, 20_000)[:, None])
    skel = tmp_path / "c.yaml"
    skel.write_text("rfsgen: 1\ninput: {width: 1}\nnodes:\n  - {name: x, base: circle}\n")

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (3_000_000 << 10, 3_000_000 << 10))

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-m", "rfsgen", "kernel", str(skel), str(tmp_path / "x.npy"), "-o",
                          str(tmp_path / "k.npy"), "--max-memory", "100G"],
                         preexec_fn=cap, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert "RLIMIT_AS (ulimit -v)" in res.stderr and "20000 x 20000" in res.stderr
    assert not (tmp_path / "k.npy").exists()


def _pool_file(tmp_path, columns):
    from rfsgen.features import save

    fs = sampler.sample(parse_skeleton(GAUSS5, "gauss.yaml"), columns, seed=1)
    save(fs, tmp_path / "pool.h5")
    return fs


def test_issue_select_block_is_checked_before_it_is_made(tmp_path):
    """select from a 200,000-column pool under --max-memory 64M used 1.3 GiB: a chunk is
    never smaller than 256 rows x N0 columns, so that block is checked first (here 4,000
    columns under 8M: the same arithmetic at a size a test can afford)."""
    _pool_file(tmp_path, 4000)
    x = np.random.default_rng(0).standard_normal((300, 5))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.arange(300) % 2)
    args = ["select", tmp_path / "pool.h5", tmp_path / "x.npy", tmp_path / "y.npy", "-n", 10, "-o", tmp_path / "s.h5"]
    res = run(args + ["--max-memory", "8M"])
    assert res.exit_code == 1
    line = one_error_line(res)
    assert "pool of 4000 columns: one block of 256 rows" in line and "memory budget of 8.0 MiB" in line, line
    assert "smaller pool" in line
    assert not (tmp_path / "s.h5").exists()
    res = run(args + ["--max-memory", "8M", "--chunk-rows", 16])  # a smaller chunk cannot go below a block
    assert res.exit_code == 1 and "one block of 256 rows" in one_error_line(res)
    assert run(args + ["--max-memory", "64M"]).exit_code == 0
    first = (tmp_path / "s.h5").read_bytes()
    assert run(args + ["--overwrite"]).exit_code == 0
    assert (tmp_path / "s.h5").read_bytes() == first  # the budget never changes the selection


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(columns=st.integers(50, 3000), classes=st.integers(2, 6), rows=st.integers(1, 700),
       limit=st.integers(1 << 20, 24 << 20))
def test_generated_selection_stays_within_the_budget_or_refuses(columns, classes, rows, limit):
    """What select's statistics allocate (numpy's allocations, traced) stays within the
    budget it accepted; otherwise it refuses before the first block."""
    import tracemalloc

    from rfsgen.select import pool_statistics

    fs = sampler.sample(parse_skeleton(GAUSS5, "gauss.yaml"), columns, seed=columns)
    x = np.random.default_rng(rows).standard_normal((rows, 5))
    codes = np.arange(rows) % classes
    pool_statistics(fs, x[:1], "classification", np.zeros(1, np.int64), 1)  # imports and compiled code: not counted
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    try:
        with budget.limited(limit):
            pool_statistics(fs, x, "classification", codes, classes)
        accepted = True
    except LimitError as e:
        accepted = False
        assert "one block of 256 rows" in str(e) or "statistics" in str(e)
    finally:
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
    assert peak <= limit if accepted else peak < (1 << 20) + 64 * columns


def test_issue_labels_npy_declaring_1e11_labels(tmp_path):
    from crafted import npy_bytes

    _pool_file(tmp_path, 40)
    np.save(tmp_path / "x.npy", np.zeros((4, 5)))
    (tmp_path / "y.npy").write_bytes(npy_bytes((10**11,), descr="<i8"))
    assert (tmp_path / "y.npy").stat().st_size < 1000
    res = run(["select", tmp_path / "pool.h5", tmp_path / "x.npy", tmp_path / "y.npy", "-n", 2, "-o", tmp_path / "s.h5"])
    assert res.exit_code == 2
    assert "y.npy: the array declares shape (100000000000,)" in one_error_line(res)
    np.save(tmp_path / "y.npy", np.arange(100_000) % 2)  # a real file past the budget: counted before it is read
    res = run(["select", tmp_path / "pool.h5", tmp_path / "x.npy", tmp_path / "y.npy", "-n", 2, "-o", tmp_path / "s.h5",
               "--max-memory", "1M"])
    assert res.exit_code == 1 and "labels file" in one_error_line(res) and "100000 labels" in one_error_line(res)


class _Counting:
    """A read-only byte stream that records the largest read asked of it."""

    def __init__(self, data):
        self.buf = __import__("io").BytesIO(data)
        self.largest = 0

    def read(self, n=-1):
        self.largest = max(self.largest, n if n >= 0 else 1 << 62)
        return self.buf.read(n)

    def peek(self, n):
        pos = self.buf.tell()
        out = self.buf.read(n)
        self.buf.seek(pos)
        return out


@pytest.mark.parametrize("have", [1, 3000])
def test_issue_stdin_skip_reads_in_pieces(have):
    """A .npy stream declaring 10^12 rows with --rows near its end was skipped by one read
    of the whole gap (MemoryError): skipped in pieces, and the early end is one line."""
    from crafted import npy_header

    from rfsgen.errors import InputError
    from rfsgen.inputs import SKIP_PIECE, open_input

    stream = _Counting(npy_header((10**12, 8)) + bytes(64 * have))
    with open_input("-", stdin=stream) as src:
        assert src.n_rows == 10**12
        with pytest.raises(InputError, match=r"<stdin>: the \.npy stream ended before row 999999999990 \(its header "
                                             r"declares 1000000000000 rows"):
            list(src.chunks(10, 10**12 - 10))
    assert stream.largest <= SKIP_PIECE
    rows = np.arange(64 * 3000, dtype=np.float64).reshape(-1, 8)  # a real stream: the skipped rows are right
    stream = _Counting(npy_header(rows.shape) + rows.tobytes())
    with open_input("-", stdin=stream) as src:
        got = list(src.chunks(7, 20_000, 20_010))
    assert got[0][0] == 20_000 and np.array_equal(np.concatenate([c for _, c in got]), rows[20_000:20_010])
    assert stream.largest <= SKIP_PIECE


def test_issue_stdin_skip_cli(tmp_path):
    from crafted import npy_header

    _pool_file(tmp_path, 8)
    res = run(["transform", tmp_path / "pool.h5", "-", "-o", tmp_path / "o.h5", "--rows", "999999999990:1000000000000"],
              input=npy_header((10**12, 5)) + bytes(400))
    assert res.exit_code == 2
    assert "ended before row 999999999990" in one_error_line(res)
    assert not (tmp_path / "o.h5").exists()


def test_issue_coo_declaring_1e9_rows_spends_nothing_per_row(tmp_path):
    """A 966-byte COO .npz declaring 10^9 rows allocated a 3.7 GiB index (its conversion
    to CSR): its coordinates are now sorted by row, and a chunk reads its own rows."""
    import tracemalloc

    from crafted import sparse_npz

    from rfsgen.inputs import open_input

    spec = sparse_npz(tmp_path, "coo", (10**9, 8), nnz=3)
    assert Path(spec).stat().st_size < 2000
    tracemalloc.start()
    with open_input(spec) as src:
        last = list(src.chunks(1000, 10**9 - 2000, 10**9))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert src.n_rows == 10**9 and sum(c.shape[0] for _, c in last) == 2000
    assert peak < 4 << 20


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(n_rows=st.integers(1, 60), width=st.integers(1, 7), nnz=st.integers(0, 120), chunk=st.integers(1, 70),
       fmt=st.sampled_from(["coo", "bsr", "dia"]), seed=st.integers(0, 2**32 - 1),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_generated_coo_chunks_equal_the_whole_conversion(n_rows, width, nnz, chunk, fmt, seed, dtype):
    """COO (duplicates included, in any order), BSR and DIA read in chunks give the bits a
    whole conversion to CSR gave, whatever the chunk size."""
    import scipy.sparse as sp

    from rfsgen.inputs import open_input

    rng = np.random.default_rng(seed)
    row, col = rng.integers(0, n_rows, nnz), rng.integers(0, width, nnz)
    val = rng.standard_normal(nnz).astype(dtype) * rng.choice([1e-30, 1.0, 1e30], nnz).astype(dtype)
    m = sp.coo_matrix((val, (row, col)), shape=(n_rows, width))
    want = sp.csr_matrix(m).toarray()
    if fmt != "coo":
        m = m.asformat(fmt)
        want = sp.csr_matrix(m).toarray()
    with open_input(m) as src:
        got = np.concatenate([c for _, c in src.chunks(chunk)])
    assert got.dtype == (np.float32 if dtype == np.float32 else np.float64)
    assert got.tobytes() == want.astype(got.dtype).tobytes()


def test_stdin_without_peek_is_never_read_whole():
    """A stream without ``peek`` was read whole to look at its first bytes: now buffered."""
    from crafted import npy_header

    from rfsgen.inputs import open_input

    class Plain:
        def __init__(self, data):
            self.stream = _Counting(data)

        def read(self, n=-1):
            return self.stream.read(n)

    rows = np.arange(8 * 5000, dtype=np.float64).reshape(-1, 8)
    plain = Plain(npy_header(rows.shape) + rows.tobytes())
    with open_input("-", stdin=plain) as src:
        first = next(src.chunks(10))[1]
        assert np.array_equal(first, rows[:10])
    assert plain.stream.largest < 64 * 1024
    text = Plain(b"1,2\n3,4\n")
    with open_input("-", stdin=text) as src:
        assert src.read().tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_every_command_takes_max_memory():
    for cmd in ("sample", "transform", "kernel", "approx", "select", "merge", "inspect", "skeleton"):
        assert "--max-memory SIZE" in run([cmd, "--help"]).output, cmd
    res = run(["skeleton", "cifar-deep", "--max-memory", "10K"])
    assert res.exit_code == 1 and "memory budget of 10.0 KiB" in one_error_line(res)


# ----------------------------------------------------------------------------- the CLI's MemoryError backstop
def _array_memory_error(*args, **kwargs):
    from numpy._core._exceptions import _ArrayMemoryError

    raise _ArrayMemoryError((10**12,), np.dtype(np.float64))  # numpy's own, as an allocation past RLIMIT_AS gives


def test_memoryerror_escaping_a_command_is_one_line_and_leaves_nothing(monkeypatch, tmp_path):
    """An allocation the budget did not foresee (here: writing transform's rows, after
    the temporary output exists) is one line naming the command and the options
    that shrink the run, exit 1, no output and no temporary file -- never a traceback."""
    from rfsgen import output
    from rfsgen.features import save

    save(sampler.sample(parse_skeleton(GAUSS5), 16, seed=1), tmp_path / "f.h5")
    np.save(tmp_path / "x.npy", np.zeros((10, 5)))
    made = []
    real_write = output._write

    def write(*args, **kwargs):
        made.extend(tmp_path.glob(".*.part"))  # the temporary output is there when it fails
        _array_memory_error()

    monkeypatch.setattr(output, "_write", write)
    res = run(["transform", tmp_path / "f.h5", tmp_path / "x.npy", "-o", tmp_path / "out.h5"])
    assert made and res.exit_code == 1
    line = one_error_line(res)
    assert line.startswith("rfsgen: error: rfsgen transform: ran out of memory (Unable to allocate 7.28 TiB for an "
                           "array with shape (1000000000000,)"), line
    assert "a smaller --max-memory" in line and "a smaller --chunk-rows" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.h5", "x.npy"]  # no output, no temporary file
    monkeypatch.setattr(output, "_write", real_write)
    assert run(["transform", tmp_path / "f.h5", tmp_path / "x.npy", "-o", tmp_path / "out.h5"]).exit_code == 0


def test_memoryerror_names_each_command_and_its_options(monkeypatch, tmp_path):
    """A bare MemoryError (no message) from kernel's matrix: the command named, its --rows
    suggested, no --chunk-rows (kernel has none)."""
    import importlib

    kernel_module = importlib.import_module("rfsgen.kernel")  # (rfsgen.kernel is also a function's name)
    np.save(tmp_path / "x.npy", np.zeros((3, 5)) + 0.1)
    skel = tmp_path / "g.yaml"
    skel.write_text(GAUSS5)

    def boom(*a, **k):
        raise MemoryError()

    monkeypatch.setattr(kernel_module, "kernel_files", boom)
    res = run(["kernel", skel, tmp_path / "x.npy", "-o", tmp_path / "k.npy"])
    line = one_error_line(res)
    assert res.exit_code == 1 and line.startswith("rfsgen: error: rfsgen kernel: ran out of memory; give a smaller "
                                                  "--max-memory"), line
    assert "--rows START:STOP" in line and "--chunk-rows" not in line
    assert not (tmp_path / "k.npy").exists()


# ----------------------------------------------------------------------------- one very long text line
class _LineReads(__import__("io").StringIO):
    """A text stream that records the longest ``readline`` asked of it (a whole line: -1)."""

    largest = 0

    def readline(self, size=-1):
        self.largest = max(self.largest, size if size is not None and size >= 0 else 1 << 62)
        return super().readline(size)


@pytest.mark.parametrize("where", [1, 3])
def test_one_very_long_text_line_is_refused_before_it_is_read_whole(where):
    """A row of 1,000,000 values on one line (2 MB of text) under a 16 MiB budget: refused
    naming the file and the line, and never read in more than budget / TEXT_LINE_BYTES
    characters; under a larger budget the same line is a row."""
    from rfsgen.inputs import TEXT_LINE_BYTES, TextSource

    lines = ["a,b", "1,2"][:where - 1] + [",".join(["1"] * 1_000_000), "3,4"]
    with budget.limited("16M"):
        most = budget.limit() // TEXT_LINE_BYTES
        stream = _LineReads("\n".join(lines) + "\n")
        with pytest.raises(LimitError, match=rf"^rows.csv:{where}: a line of more than {most} characters \(its text and "
                                             r"fields\) needs more than 16.0 MiB, over the memory budget of 16.0 MiB; "
                                             r"put one row on each line \(or raise the budget"):
            src = TextSource(stream, "rows.csv", ",")
            list(src.chunks(10))
        assert stream.largest == most + 1
    with budget.limited("128M"):
        src = TextSource(_LineReads("\n".join(lines[where - 1:where]) + "\n"), "rows.csv", ",")
        (row0, x), = src.chunks(10)
        assert x.shape == (1, 1_000_000)


def test_long_text_line_cli_one_line(tmp_path):
    """Through the command line, from a file and from standard input."""
    (tmp_path / "x.csv").write_text("0.1,0.2\n" + "0.5," * 400_000 + "0.5\n")
    skel = tmp_path / "g.yaml"
    skel.write_text(GAUSS5.replace("width: 5", "width: 2"))
    res = run(["kernel", skel, tmp_path / "x.csv", "-o", tmp_path / "k.npy", "--max-memory", "8M"])
    assert res.exit_code == 1 and f"{tmp_path / 'x.csv'}:2: a line of more than " in one_error_line(res)
    res = run(["kernel", skel, "-", "-o", tmp_path / "k.npy", "--max-memory", "8M"],
              input=(tmp_path / "x.csv").read_bytes())
    assert res.exit_code == 1 and "<stdin>:2: a line of more than " in one_error_line(res)
    assert not (tmp_path / "k.npy").exists()
    res = run(["kernel", skel, tmp_path / "x.csv", "-o", tmp_path / "k.npy", "--max-memory", "200M"])
    assert res.exit_code == 2 and "x.csv:2: has 400001 fields but the first row has 2" in one_error_line(res)


# ----------------------------------------------------------------------------- .h5 labels of variable length
def test_h5_vlen_labels_counted_from_their_data(tmp_path):
    """Variable-length class names in .h5 were counted at the pointer's 8 bytes: 100,000
    names, one of them 200,000 characters long, make numpy's str array 80 GB.  Now they
    are measured a slice at a time and refused once the longest seen says so, naming the
    dataset, the count and the width; ordinary ones (UTF-8 included) read as they are."""
    import tracemalloc

    import h5py

    from rfsgen.select import read_labels

    names = np.array(["cat", "dog"] * 50_000, dtype=object)
    names[7] = "x" * 200_000
    with h5py.File(tmp_path / "y.h5", "w") as f:
        f.create_dataset("y", data=names, dtype=h5py.string_dtype())
        f.create_dataset("ok", data=np.array(["chat", "été", "chat"], dtype=object), dtype=h5py.string_dtype())
        f.create_dataset("wide", data=np.array([b"a" * 1000, b"b"] * 10_000))  # fixed-length bytes: 4 x as str
        f.create_dataset("ragged", data=np.array([np.arange(3), np.arange(2)], dtype=object),
                         dtype=h5py.vlen_dtype(np.int64))
    with budget.limited("64M"):
        tracemalloc.start()
        try:
            with pytest.raises(LimitError, match=r"labels dataset '/y' of '.*y.h5' \(100000 class names of up to "
                                                 r"200000 characters\) needs about 149.0 GiB, over the memory budget "
                                                 r"of 64.0 MiB; give fewer labels or shorter class names"):
                read_labels(f"{tmp_path}/y.h5:/y")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 8 << 20  # a few labels at a time, not the 100,000
        assert read_labels(f"{tmp_path}/y.h5:/ok").tolist() == ["chat", "été", "chat"]
        with pytest.raises(LimitError, match=r"labels dataset '/wide' of .* needs about 153.0 MiB"):
            read_labels(f"{tmp_path}/y.h5:/wide")
        with pytest.raises(InputError, match="labels of a variable-length non-string type"):
            read_labels(f"{tmp_path}/y.h5:/ragged")
    with budget.limited("1G"):
        got = read_labels(f"{tmp_path}/y.h5:/wide")
        assert got.dtype.kind == "U" and got[0] == "a" * 1000 and got[1] == "b"
    _pool_file(tmp_path, 40)
    np.save(tmp_path / "x.npy", np.zeros((100_000, 5)))
    res = run(["select", tmp_path / "pool.h5", tmp_path / "x.npy", f"{tmp_path}/y.h5:/y", "-n", 2,
               "-o", tmp_path / "s.h5", "--max-memory", "64M"])
    assert res.exit_code == 1 and "100000 class names of up to 200000 characters" in one_error_line(res)
    assert not (tmp_path / "s.h5").exists()


# ----------------------------------------------------------------------------- EOF transform's working tables
def test_eof_transform_counts_its_per_thread_tables(monkeypatch, tmp_path):
    """Transforming an EOF file over 8,000 brownian columns used 278 MiB (fuzz budget-s37-19:
    761 MiB) under --max-memory 64M: each thread's (d + 1)^2 run products were not counted.
    Now counted per thread before the transform starts; a budget that holds them transforms."""
    from rfsgen import _compiled, eof
    from rfsgen.features import load, save

    skel = parse_skeleton("rfsgen: 1\ninput: {width: 3000}\nnodes:\n  - {name: b, base: brownian, domain: [0, 1]}\n")
    save(eof.sample(skel, level=1), tmp_path / "f.h5")
    np.save(tmp_path / "x.npy", np.full((2, 3000), 0.5))
    need = 8.0 * 3001 ** 2 + 8.0 * 5 * 3000 * 2  # one thread's tables
    for n in (1, 3):
        monkeypatch.setattr(_compiled, "threads", lambda n=n: n)
        with budget.limited(int(n * need) - 1), pytest.raises(LimitError, match=rf"the EOF transform's working tables "
                                                                                rf"in 3000 dimensions \({n} threads,"):
            eof.Transformer(load(tmp_path / "f.h5"))
    res = run(["transform", tmp_path / "f.h5", tmp_path / "x.npy", "-o", tmp_path / "o.h5", "--max-memory", "64M"])
    assert res.exit_code == 1 and "use fewer threads (--threads N)" in one_error_line(res)
    assert not (tmp_path / "o.h5").exists()
    monkeypatch.setattr(_compiled, "threads", lambda: 1)
    with budget.limited("256M"):
        z = eof.Transformer(load(tmp_path / "f.h5")).chunk(np.full((2, 3000), 0.5))
    assert z.shape == (2, 1) and np.all(np.isfinite(z))
