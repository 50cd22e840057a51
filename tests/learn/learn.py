"""Learning benchmark (``make learn``): shipped image skeletons against RBFSampler,
Nystroem and raw pixels, with one streaming linear learner.  Not part of ``make test``
(``tests/test_learn.py`` runs a few hundred rows end to end).

    python tests/learn/learn.py [--datasets fashion-mnist,cifar10] [--D 4096,16384] [--train N]
                                [--learner sgd|adagrad]

Data (``../shared/data``; ``--data DIR`` to point elsewhere):

* Fashion-MNIST: the official ``*-idx*-ubyte.gz`` files (from
  https://github.com/zalandoresearch/fashion-mnist, ``data/fashion``); the first
  ``--train`` training rows (default all 60,000) and the 10,000 test rows.
* CIFAR-10: ``cifar10/cifar10_jpeg_data_batch_1.npz`` (10,000 rows) as the training set and
  ``cifar10/cifar10_jpeg_test.npz`` as the test set.  **These are JPEG re-encodings of
  CIFAR-10**, not the original pixels, so accuracies are a little below the original's.

Each model's preprocessing is the one its skeleton's leading comment states, applied as a
user would: Fashion-MNIST pixels standardised per pixel on the training rows
(``StandardScaler``); CIFAR-10 the paper's (HWC, centre crop 24x24, per-image
standardisation, ``tests/data/cifar.py``).  RBFSampler and Nystroem get the same rows, with
``gamma = 1 / (width * variance)`` (scikit-learn's "scale").

Features are written chunk by chunk to a memory-mapped file and learned from a chunk at a
time, so D can grow past memory.  The learner is scikit-learn's own streaming one
(``--learner sgd``, the default): a ``StandardScaler`` fitted by ``partial_fit`` on the
training chunks, then ``SGDClassifier(loss="log_loss", alpha=1e-4, average=True,
random_state=seed)`` (one-vs-rest logistic regression, averaged SGD) trained by
``partial_fit`` over the standardised training chunks, ``--epochs`` passes, the chunks in a
seeded random order.  A table row is reproduced, with the features in memory, by::

    from sklearn.linear_model import SGDClassifier
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler()
    for a in range(0, len(F_train), 2048):
        scaler.partial_fit(F_train[a:a + 2048])
    clf = SGDClassifier(loss="log_loss", alpha=1e-4, average=True, random_state=0)
    rng = np.random.default_rng(0)
    for epoch in range(10):
        for a in rng.permutation(np.arange(0, len(F_train), 2048)):
            clf.partial_fit(scaler.transform(F_train[a:a + 2048]), y_train[a:a + 2048], classes=np.arange(10))
    accuracy = clf.score(scaler.transform(F_test), y_test)

(``learn.train_sgd``).  ``--learner adagrad`` is the earlier hand-written multinomial
AdaGrad (batch 256), kept to compare.  Reported: test accuracy, feature seconds (fit +
transform of train and test), training seconds.  Prints a table and writes
``learn-output/learn.json``.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))
DEFAULT_DATA = ROOT.parent / "shared" / "data"
CHUNK = 2048

SKELETONS = {"fashion-mnist": ["mnist-conv"], "cifar10": ["cifar-patches", "cifar-deep", "shallow-gaussian"]}


# ----------------------------------------------------------------------------- data
def _idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _need(paths, how):
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        sys.exit(f"learn: missing {', '.join(missing)}; {how}")


def fashion_raw(data: Path, train: int | None):
    """The first ``train`` (default all) Fashion-MNIST training rows and the test rows,
    as read: uint8 ``(n, 784)`` images and uint8 labels."""
    d = data / "fashion-mnist"
    names = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
             "t10k-labels-idx1-ubyte.gz"]
    _need([d / n for n in names], "download them from https://github.com/zalandoresearch/fashion-mnist (data/fashion)")
    xtr, ytr, xte, yte = (_idx(d / n) for n in names)
    n = len(xtr) if train is None else min(train, len(xtr))
    return xtr[:n].reshape(n, -1), ytr[:n], xte.reshape(len(xte), -1), yte


def load_fashion(data: Path, train: int | None):
    xtr, ytr, xte, yte = fashion_raw(data, train)
    n = len(xtr)
    xtr, xte = xtr.astype(np.float64), xte.astype(np.float64)
    # mnist-conv.yaml's preprocessing: each pixel standardised over the training rows.
    mean, std = xtr.mean(axis=0), xtr.std(axis=0)
    std[std == 0] = 1.0
    return (((xtr - mean) / std).astype(np.float32), ytr[:n].astype(np.int64),
            ((xte - mean) / std).astype(np.float32), yte.astype(np.int64),
            f"Fashion-MNIST, {n} training rows, {len(xte)} test rows, pixels standardised per pixel")


def load_cifar(data: Path, train: int | None):
    import cifar

    d = data / "cifar10"
    _need([d / "cifar10_jpeg_data_batch_1.npz", d / "cifar10_jpeg_test.npz"],
          "see ../shared/data/README.md (CIFAR-10 JPEG re-encodings)")
    tr, te = np.load(d / "cifar10_jpeg_data_batch_1.npz"), np.load(d / "cifar10_jpeg_test.npz")
    n = len(tr["labels"]) if train is None else min(train, len(tr["labels"]))
    return (cifar.preprocess(tr["data"][:n]).astype(np.float32), tr["labels"][:n].astype(np.int64),
            cifar.preprocess(te["data"]).astype(np.float32), te["labels"].astype(np.int64),
            f"CIFAR-10 JPEG re-encodings (not the original pixels): {n} training rows (data_batch_1), "
            f"{len(te['labels'])} test rows; paper preprocessing (24x24 crop, per-image standardisation)")


# ----------------------------------------------------------------------------- features
def write_features(transform, x: np.ndarray, D: int, path: Path) -> np.memmap:
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(x.shape[0], D))
    for a in range(0, x.shape[0], CHUNK):
        out[a:a + CHUNK] = transform(x[a:a + CHUNK])
    out.flush()
    return out


#: Nystroem needs an SVD of its D x D landmark kernel: at D = 16384 that is 4.4e12
#: flops, about 20 minutes on 2 cores, more than the whole benchmark's budget.
NYSTROEM_MAX = 8192


def featurizers(dataset, D, seed, xtr, log=print):
    """name -> fit() returning a chunk transform."""
    from sklearn.kernel_approximation import Nystroem, RBFSampler

    import rfsgen

    gamma = 1.0 / (xtr.shape[1] * float(xtr.var()))
    out = {}
    for name in SKELETONS[dataset]:
        def fit_rfsgen(name=name):
            fs = rfsgen.sample(rfsgen.load_skeleton(ROOT / "skeletons" / f"{name}.yaml"), D, seed=seed)
            return lambda x: rfsgen.transform(fs, x, layout="dense")
        out[f"rfsgen {name}"] = fit_rfsgen

    def fit_rbf():
        r = RBFSampler(gamma=gamma, n_components=D, random_state=seed).fit(xtr)
        return lambda x: r.transform(x).astype(np.float32)

    def fit_nystroem():
        rng = np.random.default_rng(seed)
        ny = Nystroem(kernel="rbf", gamma=gamma, n_components=D, random_state=seed)
        ny.fit(xtr[rng.choice(len(xtr), min(D, len(xtr)), replace=False)])
        return lambda x: ny.transform(x).astype(np.float32)

    out[f"RBFSampler gamma={gamma:.3g}"] = fit_rbf
    if D <= NYSTROEM_MAX:
        out[f"Nystroem gamma={gamma:.3g}"] = fit_nystroem
    else:
        log(f"(Nystroem skipped at D = {D}: its {D} x {D} SVD is beyond this benchmark's time; "
            f"see NYSTROEM_MAX = {NYSTROEM_MAX})")
    return out


# ----------------------------------------------------------------------------- learner
def standardisation(f: np.ndarray):
    s1 = np.zeros(f.shape[1])
    s2 = np.zeros(f.shape[1])
    for a in range(0, f.shape[0], CHUNK):
        c = np.asarray(f[a:a + CHUNK], dtype=np.float64)
        s1 += c.sum(axis=0)
        s2 += (c * c).sum(axis=0)
    mean = s1 / f.shape[0]
    std = np.sqrt(np.maximum(s2 / f.shape[0] - mean * mean, 0.0))
    std[std < 1e-8] = 1.0
    return mean.astype(np.float32), (1.0 / std).astype(np.float32)


def train_adagrad(f, y, classes, epochs, seed, lr=0.02, l2=1e-5, batch=256):
    """Multinomial logistic regression by mini-batch AdaGrad over standardised features
    read a chunk at a time from ``f`` (memory-mapped ``(n, D)``)."""
    mean, inv = standardisation(f)
    n, D = f.shape
    W = np.zeros((D, classes), dtype=np.float32)
    b = np.zeros(classes, dtype=np.float32)
    GW = np.full((D, classes), 1e-8, dtype=np.float32)
    Gb = np.full(classes, 1e-8, dtype=np.float32)
    rng = np.random.default_rng(seed)
    onehot = np.eye(classes, dtype=np.float32)
    starts = np.arange(0, n, CHUNK)
    for _ in range(epochs):
        for a in rng.permutation(starts):
            c = (np.asarray(f[a:a + CHUNK]) - mean) * inv
            yc = y[a:a + CHUNK]
            for k in rng.permutation(np.arange(0, c.shape[0], batch)):
                xb, yb = c[k:k + batch], onehot[yc[k:k + batch]]
                z = xb @ W + b
                z -= z.max(axis=1, keepdims=True)
                p = np.exp(z)
                p /= p.sum(axis=1, keepdims=True)
                g = (p - yb) / xb.shape[0]
                gW = xb.T @ g + l2 * W
                gb = g.sum(axis=0)
                GW += gW * gW
                Gb += gb * gb
                W -= lr * gW / np.sqrt(GW)
                b -= lr * gb / np.sqrt(Gb)
    return mean, inv, W, b


#: scikit-learn's SGDClassifier as the benchmark uses it (``train_sgd``).
SGD = {"loss": "log_loss", "alpha": 1e-4, "average": True}


def train_sgd(f, y, classes, epochs, seed):
    """scikit-learn's streaming learner: ``StandardScaler.partial_fit`` over the chunks of
    ``f`` (memory-mapped ``(n, D)``), then ``SGDClassifier(**SGD, random_state=seed)
    .partial_fit`` over the standardised chunks, ``epochs`` passes in a seeded random
    chunk order.  Returns ``(scaler, classifier)``."""
    from sklearn.linear_model import SGDClassifier
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler()
    for a in range(0, f.shape[0], CHUNK):
        scaler.partial_fit(np.asarray(f[a:a + CHUNK]))
    clf = SGDClassifier(**SGD, random_state=seed)
    rng = np.random.default_rng(seed)
    labels = np.arange(classes)
    for _ in range(epochs):
        for a in rng.permutation(np.arange(0, f.shape[0], CHUNK)):
            clf.partial_fit(scaler.transform(np.asarray(f[a:a + CHUNK])), y[a:a + CHUNK], classes=labels)
    return scaler, clf


def accuracy(f, y, model) -> float:
    right = 0
    if len(model) == 2:  # train_sgd's (scaler, classifier)
        scaler, clf = model
        for a in range(0, f.shape[0], CHUNK):
            right += int((clf.predict(scaler.transform(np.asarray(f[a:a + CHUNK]))) == y[a:a + CHUNK]).sum())
        return right / f.shape[0]
    mean, inv, W, b = model
    for a in range(0, f.shape[0], CHUNK):
        c = (np.asarray(f[a:a + CHUNK]) - mean) * inv
        right += int(((c @ W + b).argmax(axis=1) == y[a:a + CHUNK]).sum())
    return right / f.shape[0]


# ----------------------------------------------------------------------------- main
def cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def run(datasets, Ds, train, epochs, seed, data, work, log=print, learner="sgd"):
    results = []
    for ds in datasets:
        xtr, ytr, xte, yte, note = (load_fashion if ds == "fashion-mnist" else load_cifar)(data, train)
        log(f"\n{note}")
        log(f"{'model':34s} {'D':>6s} {'accuracy':>9s} {'features s':>11s} {'training s':>11s}")
        runs = [("raw pixels", None, None)]
        for D in Ds:
            runs += [(name, D, fit) for name, fit in featurizers(ds, D, seed, xtr, log).items()]
        for name, D, fit in runs:
            t = time.perf_counter()
            if fit is None:
                ftr, fte = xtr, xte
            else:
                tf = fit()
                ftr = write_features(tf, xtr, D, work / "train.npy")
                fte = write_features(tf, xte, D, work / "test.npy")
            t_feat = time.perf_counter() - t if fit is not None else 0.0
            t = time.perf_counter()
            model = (train_sgd if learner == "sgd" else train_adagrad)(ftr, ytr, 10, epochs, seed)
            t_train = time.perf_counter() - t
            acc = accuracy(fte, yte, model)
            results.append({"dataset": ds, "model": name, "D": D or xtr.shape[1], "accuracy": acc,
                            "feature_s": t_feat, "train_s": t_train, "epochs": epochs, "train_rows": len(xtr),
                            "learner": learner})
            log(f"{name:34s} {D or xtr.shape[1]:6d} {acc:9.4f} {t_feat:11.1f} {t_train:11.1f}")
            del ftr, fte
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", default="fashion-mnist,cifar10")
    ap.add_argument("--D", default="4096,8192,16384")
    ap.add_argument("--train", type=int, default=None, help="Training rows (default: all).")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--learner", choices=["sgd", "adagrad"], default="sgd",
                    help="sgd: scikit-learn's SGDClassifier.partial_fit (default); adagrad: the hand-written one")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--out", type=Path, default=Path("learn-output"))
    args = ap.parse_args(argv)
    Ds = [int(d) for d in args.D.split(",")]
    datasets = args.datasets.split(",")
    print(f"rfsgen learning benchmark, {datetime.date.today()}, {cpu()}, {os.cpu_count()} cores; "
          + (f"SGDClassifier({', '.join(f'{k}={v!r}' for k, v in SGD.items())}).partial_fit"
             if args.learner == "sgd" else "hand-written AdaGrad softmax")
          + f", {args.epochs} epochs, standardised features")
    with tempfile.TemporaryDirectory(prefix="rfsgen-learn-") as tmp:
        results = run(datasets, Ds, args.train, args.epochs, args.seed, args.data, Path(tmp), learner=args.learner)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "learn.json").write_text(json.dumps({"date": str(datetime.date.today()), "cpu": cpu(),
                                                     "cores": os.cpu_count(), "results": results}, indent=1))
    return results


if __name__ == "__main__":
    main()
