"""rfsgen merge (rfsgen/merge.py): shards back into the unsharded file, or refused."""

import re

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from conftest import skeleton_path
from rfsgen.cli import main


def run(args):
    r = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    r.stderr_text = r.stderr if hasattr(r, "stderr") else r.output
    return r


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x = np.random.default_rng(0).standard_normal((103, 8))
    x[:, 3] = 0.0
    np.save("x.npy", x)
    assert run(["sample", skeleton_path("tabular-circle"), "-n", 300, "-o", "f.h5", "-q"]).exit_code == 0
    assert run(["sample", skeleton_path("tabular-circle"), "-n", 300, "--seed", 2, "-o", "g.h5", "-q"]).exit_code == 0
    return tmp_path


def shards(n, *extra, features="f.h5", prefix="p"):
    names = []
    for k in range(n):
        name = f"{prefix}{k}.h5"
        assert run(["transform", features, "x.npy", "-o", name, "--shard", f"{k}/{n}", "-q", *extra]).exit_code == 0
        names.append(name)
    return names


@pytest.mark.parametrize("extra", [["--layout", "csr"], ["--layout", "dense"],
                                   ["--layout", "csr", "--dtype", "float64", "--compression", "gzip"],
                                   ["--layout", "dense", "--compression", "lzf"]], ids=["csr", "dense", "csr-gzip",
                                                                                        "dense-lzf"])
def test_merged_file_is_the_unsharded_file_byte_for_byte(setup, extra):
    assert run(["transform", "f.h5", "x.npy", "-o", "all.h5", "-q", *extra]).exit_code == 0
    parts = shards(4, *extra)
    res = run(["merge", parts[2], parts[0], parts[3], parts[1], "-o", "m.h5", "-q"])  # any order
    assert res.exit_code == 0, res.output
    assert open("m.h5", "rb").read() == open("all.h5", "rb").read()
    # More shards than rows per shard, including empty ones, merge too.
    parts = shards(7, *extra, prefix="q")
    assert run(["merge", *parts, "-o", "m7.h5", "-q"]).exit_code == 0
    assert open("m7.h5", "rb").read() == open("all.h5", "rb").read()


def _rows_of(paths):
    out = []
    for p in paths:
        with h5py.File(p, "r") as f:
            out.append((int(f.attrs["rows_start"]), int(f.attrs["rows_stop"])))
    return out


class _Progress:
    """A progress callback with phases, recording what it is told in ``events``."""

    def __init__(self, events):
        self.events = events

    def __call__(self, n):
        self.events.append(("rows", n))

    def phase(self, name, total):
        self.events.append(("phase", name))


@pytest.mark.parametrize("extra, streamed", [(["--layout", "csr"], True),
                                             (["--layout", "csr", "--dtype", "float64", "--compression", "gzip"], True),
                                             (["--layout", "dense", "--compression", "lzf"], True),
                                             (["--layout", "dense"], False)],
                         ids=["csr", "csr-gzip", "dense-lzf", "dense-raw"])
@pytest.mark.parametrize("chunk", [10, None])
def test_a_streamed_merge_writes_the_first_shards_before_the_last_arrive(setup, extra, streamed, chunk):
    """The Dask engine's merge (rfsgen.merge.merge_streamed): each shard is waited for
    when the rows before it are written, in chunks no longer than the shortest range
    (the default chunk here is thousands of rows), so rows go out before the last shard
    is there; dense uncompressed shards (copied raw) wait for all, the bar counting each
    shard as it comes, then the merge.  The bytes are the unsharded run's either way,
    and every shard is waited for once, in order."""
    from rfsgen.merge import merge_streamed

    assert run(["transform", "f.h5", "x.npy", "-o", "all.h5", "-q", *extra]).exit_code == 0
    parts = shards(4, *extra)
    ranges = _rows_of(parts)
    events = []
    info = merge_streamed(ranges, parts, lambda i: events.append(("arrive", i)), "m.h5",
                          progress=_Progress(events), chunk_rows=chunk)
    assert open("m.h5", "rb").read() == open("all.h5", "rb").read()
    assert info["rows"] == 103 and info["shards"] == 4
    assert [i for what, i in events if what == "arrive"] == [0, 1, 2, 3]
    last = events.index(("arrive", 3))
    if streamed:
        phase = events.index(("phase", "transform"))
        assert phase < events.index(("arrive", 1)), events
        assert sum(n for what, n in events[phase:last] if what == "rows") >= 50, events
        assert sum(n for what, n in events if what == "rows") == 103
    else:  # each shard counted as it arrives, then the merge's rows
        merge = events.index(("phase", "merge"))
        assert last < merge and sum(n for what, n in events[:last] if what == "rows") == ranges[2][1], events
        assert sum(n for what, n in events[merge:] if what == "rows") == 103


@pytest.mark.parametrize("layout", ["csr", "dense"])
@pytest.mark.parametrize("which", [0, 2])
def test_a_streamed_shard_must_hold_the_rows_it_was_written_for(setup, layout, which):
    """A shard holding rows other than its range (the first, or a later one; streamed
    or, dense, merged once all are there) is refused naming it, even where the shards
    would tile a shorter range; so are ranges that do not follow each other."""
    from rfsgen.errors import InputError, UsageError
    from rfsgen.merge import merge_streamed

    parts = shards(4, "--layout", layout)
    ranges = _rows_of(parts)
    if which == 0:  # shards 0 and 1 given as one range 0:52
        paths, asked = parts[:2], [(0, ranges[1][1]), (ranges[1][1], 103)]
    else:  # the last range asked of the third shard: the merged file would stop at row 78
        paths, asked = parts[:3], ranges[:2] + [(ranges[2][0], 103)]
    before = set(p.name for p in setup.iterdir())
    with pytest.raises(InputError, match=rf"{paths[which]} \(rows {ranges[which][0]}:{ranges[which][1]}\): "
                                         rf"written for rows {asked[which][0]}:{asked[which][1]}, it holds others"):
        merge_streamed(asked, paths, lambda i: None, "m.h5", consume=True)
    assert set(p.name for p in setup.iterdir()) == before
    for bad in ([(0, 30), (20, 103)], [(0, 26), (60, 103)], [(0, 26), (26, 20)]):
        with pytest.raises(UsageError, match="row ranges must follow each other without a gap or an overlap"):
            merge_streamed(bad, parts[:2], lambda i: None, "m.h5")


@pytest.mark.parametrize("fault", ["other features", "other rows", "worker lost"])
def test_a_streamed_merge_that_fails_late_leaves_nothing(setup, fault):
    """A shard that fails its checks, or one that never comes, after earlier shards were
    written: the one-line error of merge_files (or the waiter's), and no output or
    temporary file."""
    from rfsgen.errors import InputError, RfsgenError
    from rfsgen.merge import merge_streamed

    parts = shards(4, "--layout", "csr")
    ranges = _rows_of(parts)
    if fault == "other features":
        parts[2] = shards(4, "--layout", "csr", features="g.h5", prefix="g")[2]
        want, match = InputError, "p0.h5 and g2.h5 come from different feature files"
    elif fault == "other rows":
        parts[2] = parts[1]
        want, match = InputError, rf"p1.h5 \(rows {ranges[1][0]}:{ranges[1][1]}\): written for rows " \
                                  rf"{ranges[2][0]}:{ranges[2][1]}, it holds others"
    else:
        want, match = RfsgenError, "a Dask worker died"

    def arrive(i):
        if fault == "worker lost" and i == 3:
            raise RfsgenError("a Dask worker died while transforming rows 78:103")

    before = set(p.name for p in setup.iterdir())
    with pytest.raises(want, match=match):
        merge_streamed(ranges, parts, arrive, "m.h5", chunk_rows=10)
    assert set(p.name for p in setup.iterdir()) == before


def test_dense_uncompressed_shards_are_copied_as_bytes(setup, monkeypatch):
    """Issue 26 item 5: dense uncompressed shards are copied byte for byte at their
    offsets (rfsgen.merge._RawDense), not read through h5py, and still verified; the
    file is the unsharded one. Pieces smaller than a shard (RAW_STEP) too."""
    import rfsgen.merge as rm

    assert run(["transform", "f.h5", "x.npy", "-o", "all.h5", "-q", "--layout", "dense"]).exit_code == 0
    parts = shards(3, "--layout", "dense")
    copied = []
    real = rm._RawDense.copy_into
    monkeypatch.setattr(rm._RawDense, "copy_into", lambda self, *a: copied.append(1) or real(self, *a))
    monkeypatch.setattr(rm, "RAW_STEP", 7 * 300 * 4)  # 7 rows a piece
    assert run(["merge", *parts, "-o", "m.h5", "-q"]).exit_code == 0
    assert copied and open("m.h5", "rb").read() == open("all.h5", "rb").read()


#: A merge whose first shard another program truncates to half its size once the
#: merge has read a block of it (the hook: the verifying thread's first block), in a
#: process of its own: blocks of 5 rows (dense uncompressed: pieces of 1 row), so
#: that more of that shard is read after it shrank.
TRUNCATING_MERGE = r"""
import os, sys
import rfsgen.merge as rm, rfsgen.output as ro
target = os.environ["TRUNCATE"]
ro.default_chunk_rows = lambda *a, **k: 5
rm.RAW_STEP, rm.MAP_MIN_CHUNK = 1, 1
submit = rm._Hasher.submit
def truncating(self, *a):
    submit(self, *a)
    if not os.environ.pop("TRUNCATE_DONE", None) and os.path.getsize(target) > 0:
        os.truncate(target, os.path.getsize(target) // 2)
        os.environ["TRUNCATE_DONE"] = "1"
rm._Hasher.submit = truncating
sys.argv[0] = "rfsgen"
from rfsgen._entry import main
main()
"""


@pytest.mark.parametrize("extra, how", [(["--layout", "dense"], "by position (_RawDense)"),
                                        (["--layout", "csr"], "by position (_CSRChunks)"),
                                        (["--layout", "csr", "--compression", "gzip"], "through HDF5"),
                                        (["--layout", "dense", "--compression", "lzf"], "through HDF5")],
                         ids=["dense", "csr", "csr-gzip", "dense-lzf"])
def test_a_shard_truncated_during_the_merge_is_one_line_naming_it(setup, extra, how):
    """Issue 37 item 10: a shard another program truncates while merge reads it ends the
    merge with one line naming the shard and exit code 1, and neither the output nor a
    temporary file is left.  (Read through a map of the file, a CSR shard ended it with
    SIGBUS, exit 135 and its temporary file left; a dense one blamed the output: "m.h5:
    cannot write (Bad address)".)"""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    parts = shards(2, *extra)
    size = os.path.getsize(parts[0])
    before = sorted(os.listdir("."))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRUNCATE=parts[0])
    env.pop("TRUNCATE_DONE", None)
    res = subprocess.run([sys.executable, "-c", TRUNCATING_MERGE, "merge", *parts, "-o", "m.h5", "-q"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert os.path.getsize(parts[0]) == size // 2, res.stderr  # it happened during the merge
    assert res.returncode == 1, (how, res.returncode, res.stderr)
    assert res.stderr.startswith(f"rfsgen: error: {parts[0]}: shrank from {size} to ") \
        and res.stderr.count("\n") == 1, res.stderr
    assert "while it was being merged" in res.stderr and res.stdout == ""
    assert sorted(os.listdir(".")) == before  # no m.h5, no temporary file


def test_a_read_that_ends_early_is_the_shard_shrinking(tmp_path):
    """rfsgen.merge._pread: a read by position that ends before the bytes its checks
    placed in the file names the shard and its new size (the size checks around it
    aside); a failing read is named too, and a whole read fills the buffer."""
    import os
    from types import SimpleNamespace

    import rfsgen.merge as rm
    from rfsgen.errors import InputChangedError

    path = tmp_path / "s.h5"
    path.write_bytes(bytes(range(256)) * 4)
    s = SimpleNamespace(path=str(path), size=1024)
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(100)
        rm._pread(s, fd, memoryview(buf), 900, "X")
        assert bytes(buf) == (bytes(range(256)) * 4)[900:1000]
        os.truncate(path, 950)
        with pytest.raises(InputChangedError, match=rf"^{re.escape(str(path))}: shrank from 1024 to 950 bytes "):
            rm._pread(s, fd, memoryview(buf), 900, "X")
        with pytest.raises(InputChangedError, match="shrank from 1024 to 950 bytes"):
            rm._check_size(s, fd)
    finally:
        os.close(fd)
    wfd = os.open(path, os.O_WRONLY)  # reading a descriptor open for writing only: EBADF
    try:
        with pytest.raises(InputError, match=rf"^{re.escape(str(path))}: 'X' cannot be read at byte 0 \("):
            rm._pread(SimpleNamespace(path=str(path), size=0), wfd, memoryview(buf), 0, "X")
    finally:
        os.close(wfd)


@pytest.mark.parametrize("damage_kind, message", [("swap", "'X/indices' is not canonical CSR at row 41 "),
                                                    ("outside", "'X/indices' is not canonical CSR at row 41 "),
                                                    ("zero", "'X/data' stores a zero at row 41 "),
                                                    ("negative zero", "'X/data' stores a zero at row 41 "),
                                                    ("negative last", "'X/indices' is not canonical CSR at row 41 ")])
def test_non_canonical_csr_is_refused_naming_the_row(setup, damage_kind, message):
    """CSR shards are verified without densifying (issue 26 item 5): columns out of order
    or outside the width, and stored zeros, are still found, at the right row."""
    parts = shards(2, "--layout", "csr")  # rows 0:51 and 51:103 of 298 values (2 columns are zero)
    with h5py.File(parts[0], "r+") as f:
        k = 41 * 300 + 7
        if damage_kind in ("zero", "negative zero"):
            f["X/data"][k] = 0.0 if damage_kind == "zero" else -0.0
        elif damage_kind == "negative last":
            # The row's last column -2^31: the numpy check this pass replaced took int32
            # differences, which wrapped (x - -2^31 > 0), and let it through.
            f["X/indices"][f["X/indptr"][42] - 1] = -2**31
        else:
            f["X/indices"][k:k + 2] = [8, 7] if damage_kind == "swap" else [7, 300]
    res = run(["merge", *parts, "-o", "m.h5", "-q"])
    assert res.exit_code == 2 and message in res.output and res.output.count("\n") == 1, res.output


def test_a_row_range_merges_with_its_rows_names_and_attributes(setup):
    assert run(["transform", "f.h5", "x.npy", "-o", "mid.h5", "--rows", "10:90", "-q", "--layout", "csr"]).exit_code == 0
    for a, b in (("10:40", "a.h5"), ("40:41", "b.h5"), ("41:90", "c.h5")):
        assert run(["transform", "f.h5", "x.npy", "-o", b, "--rows", a, "-q", "--layout", "csr"]).exit_code == 0
    assert run(["merge", "c.h5", "a.h5", "b.h5", "-o", "m.h5", "-q"]).exit_code == 0
    with h5py.File("m.h5", "r") as m, h5py.File("mid.h5", "r") as u:
        assert dict(m.attrs) == dict(u.attrs) and m.attrs["rows_start"] == 10
        assert list(m["obs/_index"][:2]) == [b"10", b"11"]
        assert m["X/indptr"].dtype == np.int64 and m["X/indices"].dtype == np.int32
    assert open("m.h5", "rb").read() == open("mid.h5", "rb").read()


def test_virtual_merge_of_dense_shards(setup):
    assert run(["transform", "f.h5", "x.npy", "-o", "all.h5", "--layout", "dense", "-q"]).exit_code == 0
    parts = shards(3, "--layout", "dense")
    res = run(["merge", *parts, "-o", "v.h5", "--virtual"])
    assert res.exit_code == 0 and "keep them where they are" in res.output
    with h5py.File("v.h5", "r") as v, h5py.File("all.h5", "r") as u:
        assert v["X"].is_virtual and np.array_equal(v["X"][()], u["X"][()])
        assert list(v["obs/_index"][()]) == list(u["obs/_index"][()])
    res = run(["merge", *shards(2, "--layout", "csr", prefix="c"), "-o", "v2.h5", "--virtual"])
    assert res.exit_code == 2 and "--virtual needs dense shards" in res.output


def test_shards_that_do_not_belong_together_are_refused(setup):
    csr = ("--layout", "csr")
    parts = shards(3, *csr)
    other = shards(3, *csr, features="g.h5", prefix="g")
    dense = shards(3, "--layout", "dense", prefix="d")
    f64 = shards(3, *csr, "--dtype", "float64", prefix="e")
    np.save("y.npy", np.load("x.npy"))
    assert run(["transform", "f.h5", "y.npy", "-o", "y1.h5", "--shard", "1/3", "-q", *csr]).exit_code == 0
    assert run(["transform", "f.h5", "x.npy", "-o", "wide.h5", "--rows", "30:70", "-q", *csr]).exit_code == 0
    bad = {
        (parts[0], parts[2]): r"rows 34:68 are in no shard \(between p0.h5 \(rows 0:34\) and p2.h5 \(rows 68:103\)\)",
        (parts[0], "wide.h5", parts[2]): r"p0.h5 \(rows 0:34\) and wide.h5 \(rows 30:70\) overlap in rows 30:34",
        (parts[0], parts[0]): "p0.h5 is given twice",
        (parts[0], other[1]): "come from different feature files",
        (parts[0], "y1.h5"): "come from different inputs",
        (parts[0], dense[1]): "have different layouts",
        (parts[0], f64[1]): r"different dtypes \(float32 vs float64\)",
        (parts[0], "f.h5"): r"f.h5: not an rfsgen transform output \(no 'rfsgen_version' attribute\)",
        (parts[0], "x.npy"): "x.npy: not a readable HDF5 file",
        (parts[0], "nope.h5"): "nope.h5: no such shard",
    }
    for args, msg in bad.items():
        res = run(["merge", *args, "-o", "m.h5"])
        assert res.exit_code == 2, (args, res.output)
        assert res.output.count("\n") == 1 and re.search(msg, res.output), (msg, res.output)
    assert not any(p.name.startswith(("m.h5", ".m.h5")) for p in setup.iterdir())  # nothing partial


def test_merge_does_not_overwrite_without_overwrite(setup):
    parts = shards(2)
    open("m.h5", "w").write("keep")
    res = run(["merge", *parts, "-o", "m.h5"])
    assert res.exit_code == 2 and "--overwrite" in res.output and open("m.h5").read() == "keep"
    assert run(["merge", *parts, "-o", "m.h5", "--overwrite", "-q"]).exit_code == 0
    res = run(["merge", parts[0], parts[1], "-o", parts[0], "--overwrite"])
    assert res.exit_code == 2


# ----------------------------------------------------------------------------- shards that cannot be trusted
import contextlib  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import damage  # noqa: E402
from rfsgen import load_skeleton, sample, save_features  # noqa: E402
from rfsgen.errors import InputError  # noqa: E402
from rfsgen.merge import merge_files  # noqa: E402
from rfsgen.transform import transform_file  # noqa: E402

CUTS = (0, 17, 40, 41, 77, 103)  # the base shards' row ranges: 0:17, 17:40, 40:41, 41:77, 77:103


#: The kinds of shard sets: "small" is CSR in HDF5 chunks of 16 values (see
#: :func:`small_chunks`), so that rows lie across chunks, up to 9 of them.
KINDS = ("csr", "dense", "gzip", "csr-gzip", "small")
OPTS = {"csr": {"layout": "csr"}, "dense": {"layout": "dense"}, "gzip": {"layout": "dense", "compression": "gzip"},
        "csr-gzip": {"layout": "csr", "compression": "gzip"}, "small": {"layout": "csr"}}


@contextlib.contextmanager
def small_chunks(values=16):
    """CSR outputs written meanwhile store ``data`` and ``indices`` in HDF5 chunks of
    ``values`` values (transform writes 2^12 to 2^20; another writer need not)."""
    from rfsgen.output import _Appender

    was = _Appender.__init__.__defaults__
    _Appender.__init__.__defaults__ = (values,)
    try:
        yield
    finally:
        _Appender.__init__.__defaults__ = was


@pytest.fixture(autouse=True)
def map_small_chunks(monkeypatch):
    """Merges here read CSR shards by position whatever their HDF5 chunks (by default
    only chunks of 2^12 values or more, transform's, are), so that "small" has rows
    across chunks read so."""
    import rfsgen.merge as rm

    monkeypatch.setattr(rm, "MAP_MIN_CHUNK", 1)


def write_shard(base, kind, name, **kw):
    with small_chunks() if kind == "small" else contextlib.nullcontext():
        transform_file(base / "f.h5", base / "x.npy", name, **OPTS[kind], **kw)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """Feature file, rows, an unsharded output and shards at CUTS, for each of KINDS (the
    unsharded output of "small" is the plain CSR one)."""
    d = tmp_path_factory.mktemp("base")
    x = np.random.default_rng(1).standard_normal((103, 8))
    x[:, 3] = 0.0
    np.save(d / "x.npy", x)
    save_features(sample(load_skeleton(skeleton_path("tabular-circle")), 120, seed=3), d / "f.h5")
    for kind in KINDS:
        transform_file(d / "f.h5", d / "x.npy", d / f"{kind}-all.h5", **OPTS[kind])
        for k, (a, b) in enumerate(zip(CUTS, CUTS[1:])):
            write_shard(d, kind, d / f"{kind}-{k}.h5", rows=f"{a}:{b}", chunk_rows=7)
    with h5py.File(d / "small-1.h5", "r") as f:
        assert f["X/data"].chunks == f["X/indices"].chunks == (16,)
    return d


def _copy_set(base, kind, into) -> list:
    names = []
    for k in range(len(CUTS) - 1):
        shutil.copyfile(base / f"{kind}-{k}.h5", into / f"s{k}.h5")
        names.append(into / f"s{k}.h5")
    return names


def _refused(res, into, *names):
    """One line, non-zero exit, the damaged shard named, and nothing written."""
    out = res.output
    assert res.exit_code in (1, 2), out
    assert out.startswith("rfsgen: error: ") and out.count("\n") == 1, out
    assert "Traceback" not in out
    for n in names:
        assert Path(n).name in out, (n, out)
    assert not [p for p in into.iterdir() if p.name.startswith(("m.h5", ".m.h5"))]


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(KINDS), which=st.integers(0, len(CUTS) - 2),
       damage_name=st.sampled_from(sorted(damage.DAMAGES)), seed=st.integers(0, 2**32 - 1),
       virtual=st.booleans())
def test_a_damaged_or_forged_shard_is_refused_and_nothing_is_written(base, kind, which, damage_name, seed, virtual):
    with tempfile.TemporaryDirectory() as tmp:
        into = Path(tmp)
        names = _copy_set(base, kind, into)
        damage.DAMAGES[damage_name](names[which], np.random.default_rng(seed))
        args = ["merge", *names, "-o", into / "m.h5", "-q"] + (["--virtual"] if virtual and kind == "dense" else [])
        res = run(args)
        if res.exit_code == 0 and kind.endswith("gzip") and damage_name.startswith("flip"):
            # A compressed chunk's last padding bits are no data: the merge must then be exact.
            assert (into / "m.h5").read_bytes() == (base / f"{kind}-all.h5").read_bytes()
            return
        _refused(res, into, names[which])


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(KINDS), how=st.sampled_from(["gap", "overlap", "swap", "twice"]),
       i=st.integers(0, len(CUTS) - 4))
def test_shard_sets_that_do_not_tile_their_rows_are_refused(base, kind, how, i):
    with tempfile.TemporaryDirectory() as tmp:
        into = Path(tmp)
        names = _copy_set(base, kind, into)
        named = []
        if how == "gap":
            named = [names[i], names[i + 2]]
            del names[i + 1]
        elif how == "overlap":
            write_shard(base, kind, into / "wide.h5", rows=f"{CUTS[i]}:{CUTS[i + 2]}")
            names.append(into / "wide.h5")
            named = [into / "wide.h5"]
        elif how == "swap":  # row ranges exchanged in the attributes, records resealed
            damage.swap_ranges(names[i], names[i + 1])
            named = [names[i]] if CUTS[i + 1] - CUTS[i] != CUTS[i + 2] - CUTS[i + 1] else []
        else:
            names.append(names[i])
            named = [names[i]]
        res = run(["merge", *names, "-o", into / "m.h5", "-q"])
        _refused(res, into, *named)


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(KINDS), cuts=st.sets(st.integers(1, 102), max_size=4),
       chunk=st.sampled_from([None, 1, 5, 64]), merge_chunk=st.sampled_from([None, 3, 50]),
       order=st.randoms(use_true_random=False))
def test_every_valid_shard_set_merges_to_the_bytes_of_the_unsharded_run(base, kind, cuts, chunk, merge_chunk, order):
    points = [0, *sorted(cuts), 103]
    with tempfile.TemporaryDirectory() as tmp:
        into = Path(tmp)
        names = []
        for k, (a, b) in enumerate(zip(points, points[1:])):
            write_shard(base, kind, into / f"s{k}.h5", rows=f"{a}:{b}", chunk_rows=chunk)
            names.append(into / f"s{k}.h5")
        order.shuffle(names)  # any order on the command line: shards are sorted by rows_start
        merge_files(names, into / "m.h5", chunk_rows=merge_chunk)
        assert (into / "m.h5").read_bytes() == (base / f"{kind}-all.h5").read_bytes()


# The examples of issue 23, item 8, one by one.
@pytest.fixture
def kit(base, tmp_path):
    def make(kind="csr"):
        return _copy_set(base, kind, tmp_path)
    return make


def _merge(tmp_path, names, *extra):
    return run(["merge", *names, "-o", tmp_path / "m.h5", "-q", *extra])


def test_rows_start_text_is_a_one_line_error(kit, tmp_path):
    names = kit()
    damage.set_attr(names[1], "rows_start", "abc")
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[1])
    assert "attribute 'rows_start' is 'abc', not an integer" in res.output


@pytest.mark.parametrize("definition", [None, 1, 2, 4])
def test_shards_of_different_output_definitions_are_refused(kit, tmp_path, definition):
    """A shard written before rfsgen's own cos/sin (no attribute: definition 1), before
    float32 fused multiply-add angles (definition 2) or by a later definition does not
    merge with today's (3): the values differ in their last bits."""
    import h5py

    names = kit()
    with h5py.File(names[1], "r+") as f:
        assert f.attrs["output_definition"] == 3
        if definition is None:  # as written before the attribute (and uns['rfsgen']) existed
            del f.attrs["output_definition"]
            del f["uns/rfsgen"]
        else:
            f.attrs["output_definition"] = definition
            f["uns/rfsgen/output_definition"][()] = definition
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[1])
    assert "different output definitions" in res.output


def test_a_merge_keeps_the_output_definition(kit, tmp_path):
    import h5py

    names = kit()
    assert _merge(tmp_path, names).exit_code == 0
    with h5py.File(tmp_path / "m.h5", "r") as f:
        assert f.attrs["output_definition"] == 3


def test_mismatched_columns_are_refused(kit, tmp_path):
    names = kit()
    damage.set_attr(names[2], "columns", 121)  # the record still says 120
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[2])
    assert "attribute 'columns' is 121 but its integrity record says 120" in res.output
    names = kit()
    damage.forge_attr(names[2], "columns", 121)  # record forged to agree: X's shape does not
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[2])
    assert "its integrity record's shape" in res.output or "shape" in res.output


@pytest.mark.parametrize("columns", [2**31, 2**40])
def test_a_width_rfsgen_never_writes_is_refused_before_anything_is_read(kit, tmp_path, columns):
    # The verifying pass takes column indices as uint32: a forged width of 2^31 or more
    # (record forged to agree) is refused from the attributes, not read.
    names = kit()
    damage.forge_attr(names[1], "columns", columns)
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[1])
    assert f"attribute 'columns' is {columns}; rfsgen writes 1 to 2^31 - 1 columns" in res.output


@pytest.mark.parametrize("dtype", ["int32", "float16"])
@pytest.mark.parametrize("kind", ["csr", "dense"])
def test_x_of_another_dtype_is_a_clear_error_not_a_keyerror(kit, tmp_path, dtype, kind):
    names = kit(kind)
    damage.retype_x(names[0], dtype)
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[0])
    assert f"has dtype {dtype}, expected <f4 (float32)" in res.output


@pytest.mark.parametrize("virtual", [False, True])
def test_a_narrower_shard_is_refused_also_virtually(kit, tmp_path, virtual):
    names = kit("dense")
    damage.narrow_x(names[3])
    res = _merge(tmp_path, names, *(["--virtual"] if virtual else []))
    _refused(res, tmp_path, names[3])
    assert "'X' has shape (36, 119), but its record says (36, 120)" in res.output


@pytest.mark.parametrize("kind", KINDS)
def test_a_truncated_shard_is_refused(kit, tmp_path, kind):
    names = kit(kind)
    with open(names[4], "r+b") as fh:
        fh.truncate(fh.seek(0, 2) - 3000)
    _refused(_merge(tmp_path, names), tmp_path, names[4])


@pytest.mark.parametrize("layout", ["csr", "dense"])
def test_swapped_row_ranges_are_not_accepted(base, tmp_path, layout):
    """Two shards of equal size whose ranges were exchanged (records resealed): their
    rows would be merged in the wrong order; their row names give them away."""
    names = []
    for k, rows in enumerate(("0:50", "50:100", "100:103")):
        names.append(tmp_path / f"s{k}.h5")
        transform_file(base / "f.h5", base / "x.npy", names[-1], rows=rows, layout=layout)
    damage.swap_ranges(names[0], names[1])
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[0])
    assert "its record says its row names are the row numbers 50:100" in res.output


@pytest.mark.parametrize("how", ["external", "soft"])
def test_x_as_a_link_is_never_followed(kit, tmp_path, how):
    names = kit("dense")
    other = kit("dense")  # the same data elsewhere: following the link would "work"
    shutil.copyfile(other[1], tmp_path / "elsewhere.h5")
    damage.link_x(names[1], tmp_path / "elsewhere.h5", how)
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[1])
    assert f"'X' is {'an external' if how == 'external' else 'a soft'} link" in res.output


@pytest.mark.parametrize("how", [damage.external_storage_x, damage.virtual_x])
def test_x_stored_outside_the_shard_is_refused(kit, tmp_path, how):
    names = kit("dense")
    how(names[2])
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[2])
    assert "external files" in res.output or "virtual dataset" in res.output


@pytest.mark.parametrize("kind", KINDS)
def test_nan_in_a_shard_is_not_copied(kit, tmp_path, kind):
    names = kit(kind)
    damage.put_nan(names[3], np.random.default_rng(0))
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[3])
    assert "holds NaN or infinity" in res.output


# Merge hashes each block in a background thread while the next is read: a NaN in an
# earlier block must still be the error reported when a later block fails another check.
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(i=st.integers(0, 20), gap=st.integers(1, 15), chunk=st.sampled_from([1, 3, 4]))
def test_a_bad_row_is_reported_before_a_later_block_fails(base, i, gap, chunk):
    with tempfile.TemporaryDirectory() as d:
        names = [Path(d) / "s0.h5", Path(d) / "s1.h5"]
        for name, rows in zip(names, ["0:41", "41:103"]):
            transform_file(base / "f.h5", base / "x.npy", name, rows=rows, layout="csr")
        j = i + gap + 1  # rows i and j - 1 are read in one block, or j - 1 in a later one
        with h5py.File(names[1], "r+") as f:  # the record is not resealed: its checksums are compared last
            ptr = f["X/indptr"][()]
            f["X/data"][ptr[i]] = np.nan
            f["X/indptr"][j] = ptr[j - 1] - 1  # a pointer that steps back, found before its block is hashed
        later = (41 + i) // chunk != (41 + j - 1) // chunk
        match = rf"holds NaN or infinity \(row {41 + i}, " if later else "is not a CSR row pointer"
        with pytest.raises(InputError, match=match):
            merge_files(names, Path(d) / "m.h5", chunk_rows=chunk)
        assert not [p for p in Path(d).iterdir() if p.name.startswith(("m.h5", ".m.h5"))]


def test_virtual_merge_over_mismatched_widths_is_refused(base, tmp_path):
    names = _copy_set(base, "dense", tmp_path)
    save_features(sample(load_skeleton(skeleton_path("tabular-circle")), 90, seed=3), tmp_path / "g.h5")
    transform_file(tmp_path / "g.h5", base / "x.npy", names[1], rows="17:40", layout="dense", overwrite=True)
    res = _merge(tmp_path, names, "--virtual")
    _refused(res, tmp_path, names[1])


@pytest.mark.parametrize("kind", KINDS)
def test_one_flipped_bit_anywhere_in_the_data_is_found(base, kit, tmp_path, kind):
    """Random bytes of every piece of X's stored data (of 24 pieces at most: "small" has
    hundreds), one bit each: the merge refuses, naming the shard and (uncompressed) the
    dataset.  (Compressed, a flip in the deflate stream's last padding bits changes no
    value: the merge must then give the unsharded bytes.)"""
    names = kit(kind)
    pristine = names[3].read_bytes()
    extents = damage.data_extents(names[3])
    rng = np.random.default_rng(5)
    if len(extents) > 24:
        extents = [extents[i] for i in sorted(rng.choice(len(extents), 24, replace=False))]
    offsets = [(name, off + int(rng.integers(size))) for name, off, size in extents for _ in range(4)]
    for name, off in offsets:
        names[3].write_bytes(pristine)
        damage.flip_bit(names[3], off, int(rng.integers(8)))
        res = _merge(tmp_path, names)
        if kind.endswith("gzip") and res.exit_code == 0:
            assert (tmp_path / "m.h5").read_bytes() == (base / f"{kind}-all.h5").read_bytes()
            (tmp_path / "m.h5").unlink()
            continue
        _refused(res, tmp_path, names[3])
        if not kind.endswith("gzip"):
            assert f"'{name}'" in res.output, res.output


def test_a_shard_without_a_record_is_refused_with_the_fix(kit, tmp_path):
    names = kit()
    damage.strip_record(names[0])
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[0])
    assert "has no integrity record" in res.output and "re-create the shard" in res.output


def test_a_record_edited_or_resealed_is_refused(kit, tmp_path):
    names = kit()
    damage.edit_record(names[2], nnz=1)
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[2])
    assert "does not match its seal" in res.output
    names = kit()
    damage.edit_record(names[2], reseal=True, nnz=1)
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[2])


def test_a_fifo_is_not_opened(kit, tmp_path):
    names = kit()
    import os

    os.mkfifo(tmp_path / "fifo.h5")
    res = _merge(tmp_path, [*names, tmp_path / "fifo.h5"])
    _refused(res, tmp_path, "fifo.h5")
    assert "not a regular file" in res.output


@pytest.mark.parametrize("kind", ["csr", "dense", "gzip"])
def test_version1_shards_verify_and_merge_alone_or_with_current_ones(base, tmp_path, kind):
    """Shards sealed with record version 1 (xxh64 blocks) are verified by it and merge,
    alone or mixed with version-2 shards, into the bytes of a direct run (a version-2
    record: the merge converts them); a flipped bit in one is still found."""
    for which in (list(range(len(CUTS) - 1)), [1, len(CUTS) - 2]):
        names = _copy_set(base, kind, tmp_path)
        for k in which:
            damage.to_version1(names[k])
        assert damage.record(names[which[0]])["version"] == 1
        for extra in ([], ["--virtual"]) if kind == "dense" else ([],):
            res = _merge(tmp_path, names[::-1], *extra)
            assert res.exit_code == 0, res.output
            with h5py.File(tmp_path / "m.h5", "r") as m, h5py.File(base / f"{kind}-all.h5", "r") as a:
                assert m.attrs["rfsgen_record"] == a.attrs["rfsgen_record"]
            if not extra:
                assert (tmp_path / "m.h5").read_bytes() == (base / f"{kind}-all.h5").read_bytes()
            (tmp_path / "m.h5").unlink()
    names = _copy_set(base, kind, tmp_path)
    damage.to_version1(names[2])
    with h5py.File(names[2], "r") as f:  # one bit of a value flipped (not padding, not the sign of a zero)
        name = "X" if kind == "dense" else "X/data"
        off = f[name].id.get_offset() if kind == "dense" else None
    if off is None:
        damage.flip_data_bit(names[2], np.random.default_rng(3))
    else:
        damage.flip_bit(names[2], off + 5, 3)
    res = _merge(tmp_path, names)
    if not (res.exit_code == 0 and kind.endswith("gzip")):  # a gzip chunk's padding bits are no data
        _refused(res, tmp_path, names[2])


def test_a_merged_output_carries_the_record_of_a_direct_run(base, tmp_path):
    names = _copy_set(base, "dense", tmp_path)
    assert _merge(tmp_path, names[::-1], "--virtual").exit_code == 0
    with h5py.File(tmp_path / "m.h5", "r") as v, h5py.File(base / "dense-all.h5", "r") as a:
        assert v.attrs["rfsgen_record"] == a.attrs["rfsgen_record"]


def test_shards_of_named_rows_merge_exactly_and_their_names_are_verified(base, tmp_path):
    """An .h5ad input's row names travel through the shards (checksummed) into the merge."""
    from rfsgen.h5ad import mark_dense, mark_root, write_index

    x = np.load(base / "x.npy")
    with h5py.File(tmp_path / "x.h5ad", "w") as f:
        f["X"] = x
        mark_dense(f["X"])
        mark_root(f)
        write_index(f, "obs", x.shape[0], lambda a, b: [f"cell-{i}" for i in range(a, b)])
        write_index(f, "var", x.shape[1], None)
    transform_file(base / "f.h5", tmp_path / "x.h5ad", tmp_path / "all.h5")
    names = []
    for k, rows in enumerate(("0:30", "30:31", "31:103")):
        names.append(tmp_path / f"s{k}.h5")
        transform_file(base / "f.h5", tmp_path / "x.h5ad", names[-1], rows=rows)
    assert damage.record(names[1])["obs_names"] == "input"
    assert _merge(tmp_path, names[::-1]).exit_code == 0
    assert (tmp_path / "m.h5").read_bytes() == (tmp_path / "all.h5").read_bytes()
    (tmp_path / "m.h5").unlink()
    with h5py.File(names[2], "r+") as f:  # one name changed, the record left as it was
        f["obs/_index"][5] = "cell-x"
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[2])
    assert "'obs/_index' (the row names) does not match its integrity record" in res.output


def test_eof_clipped_values_are_sealed_in_the_record(tmp_path):
    """An EOF shard's clipped_values is part of its sealed record: an edited count is refused,
    and a count added to a non-EOF shard too."""
    import h5py
    import numpy as np

    from rfsgen import eof, parse_skeleton
    from rfsgen.features import save
    from rfsgen.merge import merge_files
    from rfsgen.transform import transform_file

    skel = parse_skeleton("rfsgen: 1\ninput: {width: 2}\nnodes:\n  - {name: b, base: brownian, domain: [0, 1]}\n",
                          "b.yaml")
    save(eof.sample(skel, level=3), tmp_path / "f.h5")
    np.save(tmp_path / "x.npy", np.random.default_rng(1).random((20, 2)) * 1.4 - 0.2)
    for a, b in ((0, 9), (9, 20)):
        transform_file(tmp_path / "f.h5", tmp_path / "x.npy", tmp_path / f"s{a}.h5", rows=f"{a}:{b}")
    with h5py.File(tmp_path / "s9.h5", "a") as f:
        f.attrs["clipped_values"] = int(f.attrs["clipped_values"]) + 1
    from rfsgen import InputError

    with pytest.raises(InputError, match=r"s9.h5: attribute .clipped_values. is \d+ but its integrity record says"):
        merge_files([tmp_path / "s0.h5", tmp_path / "s9.h5"], tmp_path / "m.h5")
    assert not (tmp_path / "m.h5").exists()


def test_eof_clipped_values_add_up_in_copied_and_virtual_merges(tmp_path):
    import h5py
    import numpy as np

    from rfsgen import eof, parse_skeleton
    from rfsgen.features import save
    from rfsgen.merge import merge_files
    from rfsgen.transform import transform_file

    skel = parse_skeleton("rfsgen: 1\ninput: {width: 2}\nnodes:\n  - {name: b, base: brownian, domain: [0, 1]}\n",
                          "b.yaml")
    save(eof.sample(skel, level=3), tmp_path / "f.h5")
    x = np.random.default_rng(2).random((20, 2)) * 1.4 - 0.2
    np.save(tmp_path / "x.npy", x)
    want = int(np.count_nonzero((x < 0) | (x > 1)))
    for a, b in ((0, 9), (9, 20)):
        transform_file(tmp_path / "f.h5", tmp_path / "x.npy", tmp_path / f"s{a}.h5", rows=f"{a}:{b}", layout="dense")
    shards = [tmp_path / "s0.h5", tmp_path / "s9.h5"]
    merge_files(shards, tmp_path / "m.h5")
    merge_files(shards, tmp_path / "v.h5", virtual=True)
    for name in ("m.h5", "v.h5"):
        with h5py.File(tmp_path / name) as f:
            assert f.attrs["clipped_values"] == want > 0


def _spy_reads(monkeypatch):
    """The values read by position (rfsgen.merge._CSRChunks.read): a list of counts."""
    import rfsgen.merge as rm

    values = []
    real = rm._CSRChunks.read
    monkeypatch.setattr(rm._CSRChunks, "read", lambda self, lo, hi: values.append(hi - lo) or real(self, lo, hi))
    return values


def _nnz(*paths):
    total = 0
    for p in paths:
        with h5py.File(p, "r") as f:
            total += f["X/data"].shape[0]
    return total


@pytest.mark.parametrize("kind", KINDS)
def test_uncompressed_csr_shards_are_read_by_position(base, tmp_path, monkeypatch, kind):
    """Uncompressed CSR shards (version 2) are read by position from their files
    (rfsgen.merge._CSRChunks), in whatever HDF5 chunks they come, verified, and merge to
    the unsharded bytes; other shards are read through HDF5."""
    values = _spy_reads(monkeypatch)
    names = _copy_set(base, kind, tmp_path)
    merge_files(names, tmp_path / "m.h5", chunk_rows=5)
    assert (tmp_path / "m.h5").read_bytes() == (base / f"{kind}-all.h5").read_bytes()
    assert sum(values) == (_nnz(*names) if kind in ("csr", "small") else 0)
    assert sum(values) or kind not in ("csr", "small")


def _straddling(path, values):
    """A row of the CSR shard ``path`` whose values lie across a chunk boundary (chunks
    of ``values``), and the place of the first value after that boundary."""
    with h5py.File(path, "r") as f:
        ptr = f["X/indptr"][()]
    for r in range(ptr.size - 1):
        cut = (ptr[r] // values + 1) * values
        if ptr[r] < cut < ptr[r + 1] - 1 and cut - ptr[r] > 2:
            return r, int(cut)
    raise AssertionError("no row across a chunk boundary")


@pytest.mark.parametrize("values", [16, 1])
@pytest.mark.parametrize("fault", ["nan", "zero", "columns down", "column repeated"])
def test_a_fault_in_a_row_across_chunks_is_found_naming_its_row_and_column(base, tmp_path, values, fault):
    """A row that lies in two chunks or more is verified whole: a fault just after a
    chunk boundary, or in the order of columns across it, names the row (and column)."""
    names = []
    for k, rows in enumerate(("0:41", "41:103")):
        names.append(tmp_path / f"s{k}.h5")
        with small_chunks(values):
            transform_file(base / "f.h5", base / "x.npy", names[-1], rows=rows, layout="csr")
    r, cut = _straddling(names[1], 16)
    with h5py.File(names[1], "r+") as f:  # the record is not resealed: the fault is found first
        assert f["X/data"].chunks == (values,)
        column = int(f["X/indices"][cut])
        if fault == "nan":
            f["X/data"][cut] = np.nan
        elif fault == "zero":
            f["X/data"][cut] = -0.0
        elif fault == "columns down":
            f["X/indices"][cut - 1:cut + 1] = f["X/indices"][cut - 1:cut + 1][::-1]
        else:
            f["X/indices"][cut] = f["X/indices"][cut - 1]
    message = {"nan": rf"'X/data' holds NaN or infinity \(row {41 + r}, column {column}\)",
               "zero": rf"'X/data' stores a zero at row {41 + r} ",
               "columns down": rf"'X/indices' is not canonical CSR at row {41 + r} ",
               "column repeated": rf"'X/indices' is not canonical CSR at row {41 + r} "}[fault]
    with pytest.raises(InputError, match=message):
        merge_files(names, tmp_path / "m.h5", chunk_rows=7)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(("m.h5", ".m.h5"))]


def test_csr_shards_whose_datasets_are_chunked_differently_are_read_through_hdf5(base, tmp_path, monkeypatch):
    """X/data and X/indices in chunks of different sizes (valid HDF5, not transform's)
    cannot be read in place chunk by chunk: they are read through HDF5 and still merge
    to the unsharded bytes."""
    import rfsgen.merge as rm

    names = _copy_set(base, "csr", tmp_path)
    with h5py.File(names[3], "r+") as f:
        indices = f["X/indices"][()]
        del f["X/indices"]
        f["X"].create_dataset("indices", data=indices, chunks=(7,), maxshape=(None,))
    values = _spy_reads(monkeypatch)
    merge_files(names, tmp_path / "m.h5")
    assert (tmp_path / "m.h5").read_bytes() == (base / "csr-all.h5").read_bytes()
    assert sum(values) == _nnz(*names[:3], *names[4:]) > 0  # the other shards are read by position


def _spy_maps(monkeypatch):
    """Count the shards read by position at a time (rfsgen.merge._CSRChunks, each with
    its buffers): returns a dict with 'opened' and 'most' (open at once)."""
    import rfsgen.merge as rm

    seen = {"opened": 0, "open": 0, "most": 0}
    real_init, real_close = rm._CSRChunks.__init__, rm._CSRChunks.close

    def opened(self, s, fd):
        real_init(self, s, fd)
        seen["opened"] += 1
        seen["open"] += 1
        seen["most"] = max(seen["most"], seen["open"])

    def closed(self):
        seen["open"] -= 1
        real_close(self)

    monkeypatch.setattr(rm._CSRChunks, "__init__", opened)
    monkeypatch.setattr(rm._CSRChunks, "close", closed)
    return seen


def test_a_merge_of_many_csr_shards_holds_the_buffers_of_one_or_two_at_a_time(base, tmp_path, monkeypatch):
    """Each shard's chunks are found when its rows are first read and its read buffers
    let go once they are written (hundreds of shards must not hold hundreds of
    buffers)."""
    seen = _spy_maps(monkeypatch)
    names = []
    for k, a in enumerate(range(0, 103, 3)):
        names.append(tmp_path / f"s{k}.h5")
        write_shard(base, "small", names[-1], rows=f"{a}:{min(a + 3, 103)}")
    merge_files(names, tmp_path / "m.h5", chunk_rows=5)
    assert (tmp_path / "m.h5").read_bytes() == (base / "csr-all.h5").read_bytes()
    assert seen["opened"] == len(names) and seen["open"] == 0 and seen["most"] <= 3, seen


def test_chunks_smaller_than_transform_writes_are_read_through_hdf5_by_default(base, tmp_path, monkeypatch):
    import rfsgen.merge as rm

    monkeypatch.setattr(rm, "MAP_MIN_CHUNK", 1 << 12)
    seen = _spy_maps(monkeypatch)
    merge_files(_copy_set(base, "small", tmp_path), tmp_path / "m.h5")
    assert (tmp_path / "m.h5").read_bytes() == (base / "csr-all.h5").read_bytes()
    assert seen["opened"] == 0
    merge_files(_copy_set(base, "csr", tmp_path), tmp_path / "m2.h5")  # 2^12 values a chunk: by position
    assert seen["opened"] == len(CUTS) - 1


@pytest.mark.parametrize("values", [16, 1 << 12])
@pytest.mark.parametrize("chunk_rows", [None, 7])
def test_which_fault_is_named_does_not_depend_on_the_hdf5_chunks(base, tmp_path, values, chunk_rows):
    """Two faults of different kinds in one block: the block's NaN is named (as one
    pass over the block names it), whether its rows lie in one HDF5 chunk or many."""
    name = tmp_path / "s.h5"
    with small_chunks(values):
        transform_file(base / "f.h5", base / "x.npy", name, layout="csr")
    with h5py.File(name, "r+") as f:
        ptr = f["X/indptr"][()]
        f["X/indices"][ptr[2]] = 10**6  # row 2: a column past the width
        f["X/data"][ptr[5] + 1] = np.inf  # row 5: an infinity, same block of 7 rows
        column = int(f["X/indices"][ptr[5] + 1])
    with pytest.raises(InputError, match=rf"holds NaN or infinity \(row 5, column {column}\)"):
        merge_files([name], tmp_path / "m.h5", chunk_rows=chunk_rows)


@pytest.mark.parametrize("name", ["X/data", "X/indices"])
@pytest.mark.parametrize("where", ["past the end", "across the end", "another chunk"])
def test_a_chunk_placed_out_of_the_file_or_twice_is_refused_before_its_rows_are_read(base, tmp_path, name, where):
    """The chunk index of a shard read by position is checked when its rows are first read:
    a chunk outside the file is one line naming the shard and the dataset, and rows of
    the shards before are still checked first.  (Two chunks at one place are valid HDF5,
    read as HDF5 reads them: the checksum finds the values changed.)"""
    names = _copy_set(base, "small", tmp_path)
    size = names[3].stat().st_size
    with h5py.File(names[3], "r") as f:
        other = f[name].id.get_chunk_info_by_coord((0,)).byte_offset
    offset = {"past the end": 10**9, "across the end": size - 40, "another chunk": other}[where]
    assert damage.repoint_chunk(names[3], name, 32, offset)
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[3])
    if where == "another chunk":  # the checksum, or first the checks of canonical CSR in its pass
        assert re.search(rf"'{name}' (does not match the checksum|is not canonical CSR)", res.output), res.output
    else:
        assert f"'{name}' has a chunk at " in res.output
    damage.put_nan(names[1], np.random.default_rng(1))  # an earlier shard's fault is named first
    res = _merge(tmp_path, names)
    _refused(res, tmp_path, names[1])
    assert "holds NaN or infinity" in res.output


# ----------------------------------------------------------------------------- shards consumed as they are copied
def _punches_holes(directory) -> bool:
    """Whether this system frees a byte range of a file in ``directory`` (fallocate's
    PUNCH_HOLE): where it cannot, a consuming merge leaves its shards as they are."""
    import rfsgen.merge as rm

    fn = rm._fallocate()
    probe = Path(directory) / "probe.bin"
    probe.write_bytes(b"\1" * 8192)
    try:
        fd = os.open(probe, os.O_WRONLY)
        try:
            return fn is not None and fn(fd, rm._PUNCH_HOLE, 0, 8192) == 0
        finally:
            os.close(fd)
    finally:
        probe.unlink()


def _data_bytes(path) -> list:
    """The stored bytes of X's data (dense X; CSR data and indices), piece by piece."""
    with open(path, "rb") as fh:
        return [(name, os.pread(fh.fileno(), size, off)) for name, off, size in damage.data_extents(path)
                if name != "X/indptr"]


@pytest.mark.parametrize("kind", ["csr", "dense", "small"])
def test_a_consuming_merge_frees_the_shards_data_and_writes_the_same_bytes(base, tmp_path, kind):
    """consume=True (the Dask engine's own shards): the merged file is the unsharded
    one, byte for byte, and every shard's data now reads as zeros (its storage freed as
    it was copied); without it the shards are left as they were."""
    if not _punches_holes(tmp_path):
        pytest.skip("this file system cannot free a byte range of a file")
    names = _copy_set(base, kind, tmp_path)
    before = [p.read_bytes() for p in names]
    merge_files(names, tmp_path / "kept.h5")
    assert [p.read_bytes() for p in names] == before
    merge_files(names, tmp_path / "m.h5", consume=True)
    assert (tmp_path / "m.h5").read_bytes() == (base / f"{kind}-all.h5").read_bytes()
    for p, was in zip(names, before):
        pieces = _data_bytes(p)
        assert pieces and all(not any(b) for _, b in pieces), p
        assert p.stat().st_size == len(was)  # the size kept: a merge still reading it sees no shrink


@pytest.mark.parametrize("kind", ["csr", "dense"])
def test_a_consuming_merge_still_refuses_a_damaged_shard(base, kit, tmp_path, kind):
    """Bytes are freed only once they are in merge's buffers, where they are hashed and
    checked: a flipped bit in a later shard is still found, and nothing is written."""
    names = kit(kind)
    damage.flip_data_bit(names[3], np.random.default_rng(2))
    with pytest.raises(InputError, match=re.escape(str(names[3]))):
        merge_files(names, tmp_path / "m.h5", consume=True)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(("m.h5", ".m.h5"))]


def test_a_virtual_merge_cannot_consume_its_shards(kit, tmp_path):
    from rfsgen.errors import UsageError

    names = kit("dense")
    before = [p.read_bytes() for p in names]
    with pytest.raises(UsageError, match="cannot be consumed"):
        merge_files(names, tmp_path / "m.h5", virtual=True, consume=True)
    assert [p.read_bytes() for p in names] == before


def test_a_consuming_merge_never_frees_the_row_pointer(base, tmp_path):
    """A chunk index forged to place data over X/indptr (read after the chunks before
    it): that range is not freed, so the shard is judged on what it holds."""
    import rfsgen.merge as rm

    names = _copy_set(base, "csr", tmp_path)
    with h5py.File(names[0], "r") as f:
        ptr = f["X/indptr"].id
        keep = (ptr.get_offset(), ptr.get_storage_size())
    s = rm._open_shard(names[0])
    try:
        spent = rm._Spent(s)
        if spent.fd is None:
            pytest.skip("this system cannot free a byte range of a file")
        before = names[0].read_bytes()
        spent(keep[0] - 8, 16)  # across the pointer's start
        spent(keep[0] + keep[1] - 8, 8)  # its last bytes
        assert names[0].read_bytes() == before
        spent.close()
    finally:
        s.file.close()
