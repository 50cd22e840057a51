"""The learning benchmark (tests/learn/learn.py) end to end on a few rows: the real
pipeline (data files in their official formats, the shipped skeletons with their stated
preprocessing, RBFSampler, Nystroem, the streaming AdaGrad learner), small D."""

import gzip
import struct
import sys

import numpy as np
import pytest

from conftest import DATA, ROOT

pytest.importorskip("sklearn")
sys.path.insert(0, str(ROOT / "tests" / "learn"))

import learn  # noqa: E402


def _idx(path, arr):
    header = struct.pack(">BBBB", 0, 0, 8, arr.ndim) + b"".join(struct.pack(">I", n) for n in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


@pytest.fixture
def data(tmp_path):
    fm = np.load(DATA / "fashion_mnist_test_0-31.npy").reshape(-1, 28, 28)
    cf = np.load(DATA / "cifar10_test_0-63.npy")
    d = tmp_path / "data"
    (d / "fashion-mnist").mkdir(parents=True)
    (d / "cifar10").mkdir()
    labels = np.arange(32) % 10
    _idx(d / "fashion-mnist" / "train-images-idx3-ubyte.gz", fm[:24])
    _idx(d / "fashion-mnist" / "train-labels-idx1-ubyte.gz", labels[:24])
    _idx(d / "fashion-mnist" / "t10k-images-idx3-ubyte.gz", fm[24:])
    _idx(d / "fashion-mnist" / "t10k-labels-idx1-ubyte.gz", labels[24:])
    np.savez(d / "cifar10" / "cifar10_jpeg_data_batch_1.npz", data=cf[:48], labels=np.arange(48) % 10)
    np.savez(d / "cifar10" / "cifar10_jpeg_test.npz", data=cf[48:], labels=np.arange(16) % 10)
    return d


def test_learning_benchmark_end_to_end(data, tmp_path, capsys):
    results = learn.main(["--data", str(data), "--D", "16", "--epochs", "2", "--out", str(tmp_path / "out")])
    models = {(r["dataset"], r["model"].split(" gamma")[0]) for r in results}
    assert models == {(ds, m) for ds in ("fashion-mnist", "cifar10")
                      for m in ("raw pixels", "RBFSampler", "Nystroem")} | {
        ("fashion-mnist", "rfsgen mnist-conv"), ("cifar10", "rfsgen cifar-patches"), ("cifar10", "rfsgen cifar-deep"),
        ("cifar10", "rfsgen shallow-gaussian")}
    for r in results:
        assert 0.0 <= r["accuracy"] <= 1.0 and r["train_rows"] in (24, 48)
        assert r["D"] == (16 if r["model"] != "raw pixels" else {"fashion-mnist": 784, "cifar10": 1728}[r["dataset"]])
    out = capsys.readouterr().out
    assert "JPEG re-encodings" in out and "rfsgen mnist-conv" in out
    assert (tmp_path / "out" / "learn.json").exists()


def test_the_learner_learns():
    """AdaGrad softmax on separable standardised features reaches high accuracy."""
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((3, 20)) * 3
    y = rng.integers(0, 3, 600)
    f = (centers[y] + rng.standard_normal((600, 20))).astype(np.float32)
    model = learn.train_adagrad(f[:400], y[:400], 3, epochs=5, seed=0, lr=0.1)
    assert learn.accuracy(f[400:], y[400:], model) > 0.95


def test_the_sgd_learner_is_the_stock_call_in_the_docstring():
    """learn.train_sgd (the benchmark's default learner) is scikit-learn's StandardScaler and
    SGDClassifier.partial_fit exactly as learn.py's docstring tells a user to call them: same
    coefficients, same predictions; and it learns."""
    from sklearn.linear_model import SGDClassifier
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(1)
    centers = rng.standard_normal((3, 20)) * 3
    y = rng.integers(0, 3, 5000)
    f = (centers[y] + 2 * rng.standard_normal((5000, 20))).astype(np.float32)
    f_train, y_train, f_test, y_test = f[:4000], y[:4000], f[4000:], y[4000:]
    scaler, clf = learn.train_sgd(f_train, y_train, 3, epochs=3, seed=0)
    stock_scaler = StandardScaler()
    for a in range(0, len(f_train), 2048):
        stock_scaler.partial_fit(f_train[a:a + 2048])
    stock = SGDClassifier(loss="log_loss", alpha=1e-4, average=True, random_state=0)
    order = np.random.default_rng(0)
    for epoch in range(3):
        for a in order.permutation(np.arange(0, len(f_train), 2048)):
            stock.partial_fit(stock_scaler.transform(f_train[a:a + 2048]), y_train[a:a + 2048], classes=np.arange(3))
    assert np.array_equal(clf.coef_, stock.coef_) and np.array_equal(clf.intercept_, stock.intercept_)
    acc = learn.accuracy(f_test, y_test, (scaler, clf))
    assert acc == stock.score(stock_scaler.transform(f_test), y_test) and acc > 0.95


def test_table1_reproduction_end_to_end(data, tmp_path, capsys):
    """tests/reproduce/table1.py on 48 training and 16 test rows, D = 32: every architecture's
    skeleton is built from the patch PCA, sampled, transformed and trained; ranks and the
    Spearman correlation with the paper's column are reported."""
    sys.path.insert(0, str(ROOT / "tests" / "reproduce"))
    import table1

    res = table1.main(["--data", str(data), "--D", "32", "--epochs", "1", "--out", str(tmp_path / "out")])
    assert [r["arch"] for r in res["rows"]] == ["4,5", "6,4", "6,6", "4,4", "5,4", "4,6", "5,6", "6,5", "5,5", "Full"]
    assert sorted(r["rank"] for r in res["rows"]) == list(range(1, 11))
    assert [r["paper_rank"] for r in res["rows"]] == list(range(1, 11))
    assert -1.0 <= res["spearman"] <= 1.0
    out = capsys.readouterr().out
    assert "Spearman rank correlation" in out and (tmp_path / "out" / "table1.json").exists()
    assert table1.used_grid(4, 5) == 11 and table1.used_grid(4, 4) == 10 and table1.used_grid(6, 6) == 10
