"""Feature files are untrusted input: every damage is a one-line FeatureFileError
(or, for bytes nothing reads, no change at all), never a traceback, a crash, silent
acceptance of changed contents, or out-of-bounds reads in compiled code."""

import shutil

import h5py
import numpy as np
import pytest

from conftest import SMALL_SKELETONS, skeleton_path
from rfsgen import FeatureFileError, load_skeleton, parse_skeleton, sample, transform
from rfsgen.features import _seal, _write_header, load, save


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    path = tmp_path_factory.mktemp("ff") / "f.h5"
    fs = sample(load_skeleton(skeleton_path("cifar-deep")), 300, seed=4)
    fs.command = "rfsgen sample cifar-deep -n 300"
    save(fs, path)
    return path, load(path)


def _same(a, b) -> bool:
    arrays = ("count", "kind", "ptr", "node", "code", "power", "omega")
    return (all(np.array_equal(getattr(a, k), getattr(b, k)) for k in arrays)
            and (a.seed, a.draws, a.scheme, a.command, a.stats, a.tool_version, a.skeleton.source)
            == (b.seed, b.draws, b.scheme, b.command, b.stats, b.tool_version, b.skeleton.source))


def test_bit_flips_anywhere_are_detected_or_harmless(original, tmp_path, cifar_rows):
    """300 single-bit flips spread over the whole file (superblock, object headers,
    B-trees, heaps, attributes, compressed data): each one loads as exactly the
    original feature set (a flip in unused bytes) or fails with FeatureFileError."""
    path, fs = original
    data = path.read_bytes()
    rng = np.random.default_rng(0)
    outcomes = {"detected": 0, "harmless": 0}
    for k, bit in enumerate(rng.choice(8 * len(data), 300, replace=False)):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        p = tmp_path / f"flip{k}.h5"
        p.write_bytes(bytes(flipped))
        try:
            got = load(p)
        except FeatureFileError as e:
            assert "\n" not in str(e)
            outcomes["detected"] += 1
            continue
        assert _same(got, fs), f"bit {bit} (byte {bit // 8}) changed the feature set silently"
        outcomes["harmless"] += 1
    assert outcomes["detected"] > 100, outcomes


def _crafted(original, tmp_path, edit, reseal=True):
    path, _ = original
    p = tmp_path / "c.h5"
    shutil.copy(path, p)
    with h5py.File(p, "a") as f:
        edit(f)
        if reseal and "term_node" in f and "format" in f.attrs:
            _seal(f)  # a deliberate forgery: the seal agrees, the contents must still be checked
    with open(p, "r+b") as fh:  # ...and so does the file's checksum
        _write_header(fh)
    return p


def _replace(name, fn):
    def edit(f):
        a = f[name][()]
        del f[name]
        f.create_dataset(name, data=fn(a.astype(np.int64)))
        if name == "term_node":
            f[name].attrs["encoding"] = "delta-within-column"
    return edit


CRAFTED = {
    "format is an array": (lambda f: f.attrs.__setitem__("format", np.array([1, 2])), "not an rfsgen feature file"),
    "format_version 'abc'": (lambda f: f.attrs.__setitem__("format_version", "abc"), "format version 'abc'"),
    "format_version 1.7": (lambda f: f.attrs.__setitem__("format_version", 1.7), "format version 1.7 is not"),
    "seed is text": (lambda f: f.attrs.__setitem__("seed", "x"), "'seed' must be an integer"),
    "stats is a JSON list": (lambda f: f.attrs.__setitem__("stats", "[1, 2]"), "not a JSON object"),
    "stats is not JSON": (lambda f: f.attrs.__setitem__("stats", "{"), "not JSON"),
    "unknown scheme": (lambda f: f.attrs.__setitem__("scheme", "magic"), "unknown scheme"),
    "omega is a group": (lambda f: (f.__delitem__("omega"), f.create_group("omega")), "'omega' is not a dataset"),
    "dangling external link": (lambda f: (f.__delitem__("omega"), f.__setitem__("omega", h5py.ExternalLink("gone.h5", "/x"))),
                               "'omega' is a link"),
    "term_code + 1e9": (_replace("term_code", lambda a: a + 10**9), "code outside"),
    "term_code + 1000": (_replace("term_code", lambda a: a + 1000), "code outside"),
    "term_code negative": (_replace("term_code", lambda a: a - 1000), "code outside"),
    "term_power 0": (_replace("term_power", lambda a: a * 0), "power outside"),
    "term_power negated": (_replace("term_power", lambda a: -a), "power outside"),
    "term_node + 10^6": (_replace("term_node", lambda a: a + 10**6), "node the skeleton does not have"),
    "column_kind 7": (_replace("column_kind", lambda a: a + 7), "unknown column kind"),
    "column_terms too many": (_replace("column_terms", lambda a: a + 1), "term arrays of different lengths"),
    "column_count zero": (_replace("column_count", lambda a: a * 0), "counts do not add up"),
    "2-D dataset": (lambda f: (f.__delitem__("column_kind"), f.create_dataset("column_kind", data=np.zeros((300, 2), np.uint8))),
                    "expected a 1-D integer array"),
    "float term codes": (lambda f: (f.__delitem__("term_code"), f.create_dataset("term_code", data=np.zeros(10))),
                         "expected a 1-D integer array"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_files_are_rejected_before_any_compiled_code_runs(original, tmp_path, case):
    edit, message = CRAFTED[case]
    p = _crafted(original, tmp_path, edit)
    with pytest.raises(FeatureFileError, match=message) as e:
        load(p)
    assert "\n" not in str(e.value)


def test_any_change_to_the_bytes_fails_the_checksum(original, tmp_path):
    p = tmp_path / "t.h5"
    data = original[0].read_bytes()
    p.write_bytes(data[:-100])
    with pytest.raises(FeatureFileError, match="checksum mismatch"):
        load(p)
    p.write_bytes(b"x" + data[1:])
    with pytest.raises(FeatureFileError, match="not a readable HDF5 file"):
        load(p)


def test_unsealed_attribute_changes_are_detected(original, tmp_path):
    for key, value in (("command", "rm -rf /"), ("skeleton_path", "elsewhere.yaml"), ("stats", "{}"), ("draws", 5)):
        p = _crafted(original, tmp_path, lambda f: f.attrs.__setitem__(key, value), reseal=False)
        with pytest.raises(FeatureFileError, match="attributes do not match their checksum"):
            load(p)


def test_huge_powers_of_valid_terms_are_computed_not_garbage(original, tmp_path, cifar_rows):
    """A power multiplied by 1e15 is a valid (if absurd) feature: it is evaluated in the
    log domain; a value beyond float64 is a one-line DataError naming row and column,
    and nothing non-finite is ever returned."""
    from rfsgen import DataError

    p = _crafted(original, tmp_path, _replace("term_power", lambda a: a * 10**15))
    try:
        z = transform(load(p), cifar_rows[:4], layout="dense", dtype="float64")
    except DataError as e:
        assert "too large for float64" in str(e) and "row " in str(e) and "column " in str(e)
    else:
        assert np.isfinite(z).all()


def test_powers_are_range_checked_per_base(tmp_path):
    """Binary powers must be 1 and categorical frequencies 1..n-1."""
    s = parse_skeleton(SMALL_SKELETONS["binary"])
    p = tmp_path / "b.h5"
    save(sample(s, 24, seed=1), p)
    with h5py.File(p, "a") as f:
        a = f["term_power"][()].astype(np.int64)
        del f["term_power"]
        f["term_power"] = a * 3
        _seal(f)
    with open(p, "r+b") as fh:
        _write_header(fh)
    with pytest.raises(FeatureFileError, match="binary term has power outside 1..1"):
        load(p)


def test_skeletons_feature_sets_activations_and_bases_pickle():
    """Objects travel to worker processes: every shipped and test skeleton, its feature
    set, and every activation and base kind pickle; the unpickled feature set
    transforms to the same bytes."""
    import glob
    import pickle

    from conftest import ROOT, load_shipped, rows_for
    from rfsgen.activations import REGISTRY as ACTIVATIONS
    from rfsgen.activations import make_activation
    from rfsgen.bases import REGISTRY as BASES

    skeletons = [load_shipped(p) for p in sorted(glob.glob(str(ROOT / "skeletons" / "*.yaml")))]
    skeletons += [parse_skeleton(v, k) for k, v in SMALL_SKELETONS.items()]
    for s in skeletons:
        small = any(k in s.path for k in ("coordinate", "binary", "categorical"))
        fs = sample(s, 20 if small else 200, seed=1)
        again = pickle.loads(pickle.dumps(fs))
        x = rows_for(s, 4, seed=1)
        assert transform(again, x, layout="dense").tobytes() == transform(fs, x, layout="dense").tobytes(), s.path
        assert pickle.loads(pickle.dumps(s)).describe() == s.describe()
    params = {"polynomial": {"degree": 3}, "coefficients": {"values": [1, 2]}}
    r = np.linspace(-1, 1, 9)
    for name in ACTIVATIONS:
        a = make_activation(name, params.get(name))
        b = pickle.loads(pickle.dumps(a))
        assert np.array_equal(a.dual(r), b.dual(r)) and np.array_equal(a.gap(r, 1 - r), b.gap(r, 1 - r)), name
    assert {n.base.name for s in skeletons for n in s.input_nodes} == set(BASES)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32, np.int64])
def test_chunks_filtered_on_threads_are_the_bytes_hdf5_writes(tmp_path, dtype):
    """Chunks shuffled, compressed and checksummed on a thread pool (the fast write) are
    byte for byte what HDF5's own filter pipeline stores, the padded last chunk included,
    and read back through HDF5's checks."""
    from concurrent.futures import ThreadPoolExecutor

    from rfsgen.features import CHUNK, _put

    rng = np.random.default_rng(4)
    info = np.iinfo(dtype)
    data = rng.integers(max(info.min, -1000), min(info.max, 70000) + 1, 2 * CHUNK + 12345).astype(dtype)
    data[: CHUNK // 3] = 7  # a run that compresses well, next to noise that does not
    with h5py.File(tmp_path / "own.h5", "w") as own, h5py.File(tmp_path / "pool.h5", "w") as fast, \
            ThreadPoolExecutor(2) as pool:
        _put(own, "d", data)
        _put(fast, "d", data, pool=pool)
        for start in range(0, data.size, CHUNK):
            assert own["d"].id.read_direct_chunk((start,)) == fast["d"].id.read_direct_chunk((start,))
    with h5py.File(tmp_path / "pool.h5", "r") as f:
        assert f["d"].fletcher32 and f["d"].shuffle and f["d"].compression == "gzip"
        np.testing.assert_array_equal(f["d"][:], data)


def test_fletcher32_is_hdf5s_checksum():
    """The checksum HDF5 verifies on read, including odd lengths and the 360-word folds."""
    from rfsgen._compiled import fletcher32

    def reference(b):  # HDF5's H5_checksum_fletcher32, literally
        s1 = s2 = 0
        words = len(b) // 2
        i = 0
        while words:
            t = min(words, 360)
            words -= t
            for _ in range(t):
                s1 += (b[i] << 8) | b[i + 1]
                s2 += s1
                i += 2
            s1 = (s1 & 0xFFFF) + (s1 >> 16)
            s2 = (s2 & 0xFFFF) + (s2 >> 16)
        if len(b) % 2:
            s1 += b[i] << 8
            s2 += s1
            s1 = (s1 & 0xFFFF) + (s1 >> 16)
            s2 = (s2 & 0xFFFF) + (s2 >> 16)
        s1 = (s1 & 0xFFFF) + (s1 >> 16)
        s2 = (s2 & 0xFFFF) + (s2 >> 16)
        return (s2 << 16) | s1

    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 719, 720, 721, 5000, 5001):
        for b in (rng.integers(0, 256, n, dtype=np.uint8), np.full(n, 255, np.uint8)):
            assert int(fletcher32(b)) == reference(b.tolist())
