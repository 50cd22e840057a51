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


@pytest.mark.parametrize("extra", [[], ["--layout", "dense"], ["--dtype", "float64", "--compression", "gzip"],
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


def test_a_row_range_merges_with_its_rows_names_and_attributes(setup):
    assert run(["transform", "f.h5", "x.npy", "-o", "mid.h5", "--rows", "10:90", "-q"]).exit_code == 0
    for a, b in (("10:40", "a.h5"), ("40:41", "b.h5"), ("41:90", "c.h5")):
        assert run(["transform", "f.h5", "x.npy", "-o", b, "--rows", a, "-q"]).exit_code == 0
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
    res = run(["merge", *shards(2, prefix="c"), "-o", "v2.h5", "--virtual"])
    assert res.exit_code == 2 and "--virtual needs dense shards" in res.output


def test_shards_that_do_not_belong_together_are_refused(setup):
    parts = shards(3)
    other = shards(3, features="g.h5", prefix="g")
    dense = shards(3, "--layout", "dense", prefix="d")
    f64 = shards(3, "--dtype", "float64", prefix="e")
    np.save("y.npy", np.load("x.npy"))
    assert run(["transform", "f.h5", "y.npy", "-o", "y1.h5", "--shard", "1/3", "-q"]).exit_code == 0
    assert run(["transform", "f.h5", "x.npy", "-o", "wide.h5", "--rows", "30:70", "-q"]).exit_code == 0
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
