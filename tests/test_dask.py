"""rfsgen.dask against real dask: lazy graphs, and a LocalCluster on 127.0.0.1
behind `rfsgen transform --dask-scheduler`."""

import os
import pickle

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import skeleton_path

da = pytest.importorskip("dask.array")  # the test extra installs dask and distributed
distributed = pytest.importorskip("distributed")

import rfsgen  # noqa: E402
import rfsgen.dask as rd  # noqa: E402
from rfsgen.cli import main  # noqa: E402


def run(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)


@pytest.fixture(scope="module")
def fs():
    return rfsgen.sample(rfsgen.load_skeleton(skeleton_path("cifar-deep")), 1500, seed=3)


@pytest.fixture(scope="module")
def x(cifar_rows):
    return cifar_rows[:60]


@pytest.mark.parametrize("chunks", [(60, 1728), (7, 1728), (13, 500), ((1, 29, 30), 1728)])
def test_transform_is_the_in_memory_transform_for_any_chunking(fs, x, chunks):
    X = da.from_array(x, chunks=chunks)
    dense = rd.transform(fs, X)
    assert dense.shape == (60, 1500) and dense.dtype == np.float32 and dense.numblocks[1] == 1
    assert dense.compute(scheduler="threads").tobytes() == rfsgen.transform(fs, x, layout="dense").tobytes()
    csr = rd.transform(fs, X, layout="csr", dtype="float64").compute(scheduler="sync")
    want = rfsgen.transform(fs, x, dtype="float64")
    assert csr.format == "csr" and csr.data.tobytes() == want.data.tobytes()
    assert np.array_equal(csr.indices, want.indices) and np.array_equal(csr.indptr, want.indptr)


def test_a_path_is_opened_lazily(fs, x, tmp_path):
    np.save(tmp_path / "x.npy", x.astype(np.float32))
    Z = rd.transform(fs, tmp_path / "x.npy", chunk_rows=16)
    assert Z.chunks[0] == (16, 16, 16, 12)
    assert Z.compute().tobytes() == rfsgen.transform(fs, x.astype(np.float32), layout="dense").tobytes()


def test_the_feature_set_is_in_the_graph_once(fs):
    X = da.zeros((4000, 1728), chunks=(100, 1728))  # 40 blocks
    Z = rd.transform(fs, X)
    graph = dict(Z.__dask_graph__())
    size_graph, size_fs = len(pickle.dumps(graph)), len(pickle.dumps(fs))
    assert len(graph) > 40 and size_fs < size_graph < 1.2 * size_fs, (size_graph, size_fs)
    held = [k for k, v in graph.items() if isinstance(getattr(v, "value", v), rfsgen.FeatureSet)]
    assert len(held) == 1


def test_bad_inputs(fs, x):
    with pytest.raises(rfsgen.InputError, match="expects width 1728"):
        rd.transform(fs, da.zeros((5, 3)))
    with pytest.raises(rfsgen.InputError, match="takes a dask.array or a path"):
        rd.transform(fs, x)


def test_kernel_blocks(x):
    s = rfsgen.load_skeleton(skeleton_path("cifar-deep"))
    X = da.from_array(x[:40], chunks=(15, 1728))
    K = rd.kernel(s, X)
    assert K.chunks == ((15, 15, 10), (15, 15, 10))
    k = K.compute()
    assert np.array_equal(k, k.T)
    np.testing.assert_allclose(k, rfsgen.kernel(s, x[:40]), rtol=0, atol=1e-12)
    kxy = rd.kernel(s, X, da.from_array(x[40:], chunks=7)).compute()
    np.testing.assert_allclose(kxy, rfsgen.kernel(s, x[:40], x[40:]), rtol=0, atol=1e-12)
    auto = rfsgen.load_skeleton(skeleton_path("tabular-auto"))
    Y = da.from_array(np.random.default_rng(0).standard_normal((9, 4)), chunks=4)
    np.testing.assert_allclose(rd.kernel(auto, Y).compute(), rfsgen.kernel(auto, Y.compute()), atol=1e-12)


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as c:
        yield c


def test_on_a_real_cluster(fs, x, cluster):
    with distributed.Client(cluster) as client:
        Z = rd.transform(fs, da.from_array(x, chunks=(11, 1728)))
        assert client.compute(Z).result().tobytes() == rfsgen.transform(fs, x, layout="dense").tobytes()


@pytest.fixture
def files(tmp_path, fs, x, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rfsgen.save_features(fs, "f.h5")
    np.save("x.npy", np.tile(x, (5, 1)))  # 300 rows
    return tmp_path


@pytest.mark.parametrize("layout", ["csr", "dense"])
def test_cli_on_a_cluster_writes_the_local_file(files, cluster, layout, monkeypatch):
    base = ["transform", "f.h5", "x.npy", "--layout", layout, "--chunk-rows", 37, "-q"]
    assert run(base + ["-o", "local.h5"]).exit_code == 0
    res = run(base + ["-o", "remote.h5", "--dask-scheduler", cluster.scheduler_address])
    assert res.exit_code == 0, res.output
    assert open("remote.h5", "rb").read() == open("local.h5", "rb").read()
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", cluster.scheduler_address)
    assert run(base + ["-o", "env.h5", "--shard", "1/2"]).exit_code == 0
    assert run(["transform", "f.h5", "x.npy", "--layout", layout, "-q", "-o", "env-local.h5", "--shard", "1/2"],
               env={"DASK_SCHEDULER_ADDRESS": ""}).exit_code == 0
    assert open("env.h5", "rb").read() == open("env-local.h5", "rb").read()


def test_unreachable_scheduler_is_one_line_and_leaves_nothing(files):
    res = run(["transform", "f.h5", "x.npy", "-o", "o.h5", "--dask-scheduler", "tcp://127.0.0.1:9"])
    assert res.exit_code == 1 and res.output.count("\n") == 1
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in res.output
    assert sorted(p.name for p in files.iterdir()) == ["f.h5", "x.npy"]


def _die(*args, **kwargs):
    os._exit(3)


def test_a_dying_worker_is_one_line_and_leaves_nothing(files, monkeypatch):
    import dask

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                                      dashboard_address=":0") as c:
            monkeypatch.setattr(rd, "transform_block", _die)  # what the workers are asked to run
            res = run(["transform", "f.h5", "x.npy", "-o", "o.h5", "--chunk-rows", 50,
                       "--dask-scheduler", c.scheduler_address])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert "a Dask worker died while transforming rows 0:50" in res.output
    assert sorted(p.name for p in files.iterdir()) == ["f.h5", "x.npy"]
