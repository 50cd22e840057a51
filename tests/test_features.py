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
    params = {"polynomial": {"degree": 3}, "coefficients": {"values": [1, 2]}, "arccos": {"degree": 2},
              "function": {"expr": "where(x > 0, x, 0.1 * x)"}}
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


# ----------------------------------------------------------------------------- forged files (issue 23, item 7)
# A forger recomputes every checksum and the seal (tests/forge.py): only the reader's
# semantic checks stand between a forged file and the transform.  Oracle: load() either
# raises a one-line FeatureFileError (or LimitError, for sizes over the memory budget),
# or returns a feature set whose transform of finite rows is finite (or a one-line
# DataError naming the row and column, the documented report of a value too large).
import os
import subprocess
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import forge as F
from rfsgen import DataError, LimitError
from rfsgen.features import MAX_OMEGA, MAX_UNIT_POWER

FORGE_SKELETONS = ("circle-step", "gauss-laplace", "categorical", "binary", "relu-deep")


@pytest.fixture(scope="module")
def valid_files(tmp_path_factory, original):
    """One small valid file per base (cifar-deep: sphere pairs of 3; relu-deep: of 2)."""
    d = tmp_path_factory.mktemp("valid")
    files = {"cifar-deep": original[0]}
    for name in FORGE_SKELETONS:
        s = parse_skeleton(SMALL_SKELETONS[name], f"{name}.yaml")
        files[name] = d / f"{name}.h5"
        save(sample(s, 16 if name in ("binary", "categorical") else 60, seed=3), files[name])
    return files


def _rows(fs, seed=0):
    from conftest import rows_for

    rng = np.random.default_rng(seed)
    x = rows_for(fs.skeleton, 6, seed=seed)
    cont = [c for base, _, cols in fs.skeleton.input_groups if base.name not in ("binary", "categorical")
            for c in cols.ravel()]
    x[:3, cont] *= 10.0 ** rng.integers(-300, 6, size=(3, len(cont)))  # finite extremes, small and large
    return x


def _oracle(p):
    """'loaded' or 'refused' for the forged file ``p``; fails the test on anything else."""
    from rfsgen import budget

    try:
        with budget.limited("512M"):  # a declared size that slipped through would fail here, not swap
            fs = load(p)
    except (FeatureFileError, LimitError) as e:
        assert "\n" not in str(e) and str(p) in str(e), str(e)
        return "refused"
    for dtype in ("float32", "float64"):
        try:
            z = transform(fs, _rows(fs), layout="dense", dtype=dtype)
        except DataError as e:
            assert "\n" not in str(e) and "too large" in str(e) and "row " in str(e) and "column " in str(e), str(e)
            continue
        assert np.isfinite(z).all(), f"a loaded forgery gives non-finite values in {dtype}"
    return "loaded"


_INT_VALUES = st.sampled_from([0, -1, 1, 2, 3, 255, 256, 65535, 2**31, 2**40, 2**50, 2**50 + 1, 2**54, 2**60,
                               2**62, 2**63 - 1, -(2**62), -(2**63)])
_FLOAT_VALUES = st.sampled_from([0.0, -0.0, 1e-320, 1e300, -1e308, 1e308, float(MAX_OMEGA), float(MAX_OMEGA) * 2,
                                 float("nan"), float("inf"), float("-inf")])


@st.composite
def _forgeries(draw):
    """(file name, [edits], description): one or two generated forgeries of one valid file."""
    name = draw(st.sampled_from(("cifar-deep",) + FORGE_SKELETONS))
    edits, what, last = [], [], []  # HDF5 tricks go last: later edits would read a bomb or follow a link
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(["value", "value", "value", "map", "dtype", "shape", "attr", "hdf5"]))
        ds = draw(st.sampled_from([k for k in F.DATASETS if k != "skeleton"]))
        if kind == "hdf5":  # reaching outside the file, foreign filters, declared sizes far beyond the data
            trick = draw(st.sampled_from(["external storage", "external link", "soft link", "virtual", "lzf",
                                          "bomb", "bomb+columns"]))
            n = 2**27
            last.extend({
                "external storage": [F.external_storage(ds, "/etc/hostname")],
                "external link": [F.external_link(ds, "/etc/hostname")],
                "soft link": [F.soft_link(ds, "/" + draw(st.sampled_from(F.DATASETS)))],
                "virtual": [F.virtual(ds, "/etc/hostname")],
                "lzf": [F.with_filter(ds, compression="lzf")],
                "bomb": [F.gzip_bomb(ds, n, np.float64 if ds == "omega" else np.uint64)],
                "bomb+columns": [F.gzip_bomb(k, n) for k in ("column_count", "column_kind", "column_terms")]
                + [F.set_attr("columns", n)],
            }[trick])
            what.append(f"{ds}: {trick}")
        elif kind == "value":
            v = draw(_FLOAT_VALUES if ds == "omega" else st.one_of(_INT_VALUES, _FLOAT_VALUES))
            i = draw(st.integers(-3, 3))
            edits.append(F.set_values(ds, i, v))
            what.append(f"{ds}[{i}] = {v!r}")
        elif kind == "map":
            op = draw(st.sampled_from(["neg", "x2^52", "+1", "zero", "reverse"]))
            fn = {"neg": lambda a: -a, "x2^52": lambda a: a * 2.0**52 if a.dtype.kind == "f" else a << 52,
                  "+1": lambda a: a + 1, "zero": lambda a: a * 0, "reverse": lambda a: a[::-1]}[op]
            edits.append(F.map_dataset(ds, fn))
            what.append(f"{ds}: {op}")
        elif kind == "dtype":
            dt = draw(st.sampled_from(["float64", "float16", "int8", "uint8", "bool", "S4", "complex128"]))

            def conv(a, dt=dt):
                return a.astype(np.float64).astype(dt) if dt != "S4" else a.astype("S4")
            edits.append(F.map_dataset(ds, conv))
            what.append(f"{ds} as {dt}")
        elif kind == "shape":
            op = draw(st.sampled_from(["2-D", "longer", "shorter", "empty", "scalar"]))
            fn = {"2-D": lambda a: np.stack([a, a], axis=1), "longer": lambda a: np.concatenate([a, a[:1] if a.size else [1]]),
                  "shorter": lambda a: a[:-1], "empty": lambda a: a[:0], "scalar": lambda a: a[0] if a.size else 0}[op]
            edits.append(F.map_dataset(ds, fn))
            what.append(f"{ds}: {op}")
        else:
            key = draw(st.sampled_from(F.ATTRIBUTES))
            v = draw(st.one_of(_INT_VALUES, _FLOAT_VALUES, st.sampled_from(
                ["", "x", "{}", "[1]", '{"mean_factors_per_draw": "x"}', '{"output_degree_histogram": 5}',
                 '{"mean_factors_per_draw": NaN}', '{"output_degree_histogram": [1, -1]}', "[" * 5000 + "]" * 5000,
                 "rfs", "rr", "orf", "strat", np.array([1, 2]), np.array(["a", "b"]), np.float32(3)])))
            edits.append(F.set_attr(key, v))
            what.append(f"attribute {key} = {str(v)[:30]!r}")
    return name, edits + last, "; ".join(what)


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(_forgeries())
def test_generated_forgeries_load_finite_or_fail_in_one_line(valid_files, tmp_path_factory, forgery):
    name, edits, what = forgery
    p = tmp_path_factory.mktemp("forged") / "f.h5"
    try:
        F.forge(valid_files[name], p, *edits)
    except (TypeError, ValueError, OSError):  # h5py cannot store this forgery: nothing to test
        return
    outcome = _oracle(p)
    assert outcome in ("loaded", "refused"), what
    # The CLI: a refused file is one line and exit 2 (1 for the memory budget) in every
    # command that reads it; a loaded one inspects.
    from click.testing import CliRunner

    from rfsgen.cli import main

    rows = p.parent / "rows.npy"
    for args in (["inspect", str(p)], ["transform", str(p), str(rows), "-o", str(p.parent / "o.h5"), "-q"]):
        if args[0] == "transform":
            if outcome == "loaded":
                continue
            np.save(rows, np.ones((2, 6)))
        r = CliRunner().invoke(main, args)
        if outcome == "loaded":
            assert r.exit_code == 0, (what, r.output)
        else:
            lines = r.output.strip().splitlines()
            assert r.exit_code in (1, 2) and len(lines) == 1 and lines[0].startswith("rfsgen: error: "), (what, r.output)
            assert r.exit_code == 2 or "memory budget" in lines[0], (what, r.output)


@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(["circle-step", "categorical", "relu-deep"]),
       power=st.integers(MAX_UNIT_POWER - 4, 2**62), index=st.integers(0, 10), sign=st.sampled_from([1, -1]))
def test_unit_modulus_powers_are_bounded(valid_files, tmp_path_factory, name, power, index, sign):
    """Powers of unit-modulus factors (circle, categorical frequencies, sphere pairs of 2)
    past 2^50 are refused (they used to give values ~1e156 and inf); at the bound they
    load and stay finite."""
    p = F.forge(valid_files[name], tmp_path_factory.mktemp("pw") / "f.h5",
                F.set_values("term_power", index, sign * power if name == "circle-step" else power))
    outcome = _oracle(p)
    if power > MAX_UNIT_POWER:
        assert outcome == "refused"


@pytest.mark.parametrize("power", [2**54, 2**57, 2**60])
def test_issue_circle_power_2_54_to_2_60(valid_files, tmp_path, power):
    p = F.forge(valid_files["circle-step"], tmp_path / "f.h5", F.set_values("term_power", 0, power))
    with pytest.raises(FeatureFileError, match=r"dataset 'term_power': column \d+'s powers of unit-modulus factors "
                                               rf"add up to {power}, over 2\^50") as e:
        load(p)
    assert "\n" not in str(e.value) and "re-create it with 'rfsgen sample'" in str(e.value)


def test_unit_power_at_the_bound_is_finite(valid_files, tmp_path):
    fs = load(valid_files["circle-step"])
    j = int(np.argmax(np.diff(fs.ptr) == 1))  # a column with one circle term
    p = F.forge(valid_files["circle-step"], tmp_path / "f.h5", F.set_values("term_power", int(fs.ptr[j]), MAX_UNIT_POWER))
    z = transform(load(p), _rows(load(p)), layout="dense", dtype="float32")
    assert np.isfinite(z).all() and np.abs(z[:, j]).max() <= 1.75 * fs.scale[j]


@pytest.mark.parametrize("value", [1e308, -1e308, float(MAX_OMEGA) * 2, float("nan"), float("inf")])
def test_issue_omega_1e308(valid_files, tmp_path, value):
    p = F.forge(valid_files["gauss-laplace"], tmp_path / "f.h5", F.set_values("omega", 0, value))
    with pytest.raises(FeatureFileError, match=r"dataset 'omega': value 0 is .*; omegas must be finite with "
                                               r"\|omega\| <= 2\^160"):
        load(p)
    ok = F.forge(valid_files["gauss-laplace"], tmp_path / "ok.h5", F.set_values("omega", 0, float(MAX_OMEGA)))
    assert np.isfinite(transform(load(ok), _rows(load(ok))[3:], layout="dense")).all()


def test_the_omega_table_is_held_once_while_loading(tmp_path):
    """Loading reads the omega table into one float64 array and checks it in slices: the
    peak of numpy's allocations stays near the table's own bytes (it was three times them:
    a cast copy, then |omega| beside it), and a bad value past the first slice is still
    named by its index."""
    import tracemalloc

    from rfsgen.features import OMEGA_CHECK_SLICE

    fs = sample(parse_skeleton("rfsgen: 1\ninput: {width: 640}\nnodes:\n  - {name: x, base: gaussian}\noutput: x\n",
                               "wide.yaml"), 3000, seed=2)
    assert fs.omega.size > 8 * OMEGA_CHECK_SLICE
    p = tmp_path / "wide.h5"
    save(fs, p)
    tracemalloc.start()
    try:
        got = load(p)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.array_equal(got.omega, fs.omega) and got.omega.dtype == np.float64
    assert peak < fs.omega.nbytes + (4 << 20), (peak, fs.omega.nbytes)
    i = 5 * OMEGA_CHECK_SLICE + 7
    bad = F.forge(p, tmp_path / "bad.h5", F.set_values("omega", i, float("inf")))
    with pytest.raises(FeatureFileError, match=rf"dataset 'omega': value {i} is inf; omegas must be finite"):
        load(bad)


def test_issue_stats_empty_object_loads_and_inspects(valid_files, tmp_path):
    """stats = "{}" is what a FeatureSet made in code carries: it loads, and inspect says
    the statistics were not recorded (it used to end in a TypeError)."""
    from click.testing import CliRunner

    from rfsgen.cli import main

    p = F.forge(valid_files["circle-step"], tmp_path / "f.h5", F.set_attr("stats", "{}"))
    assert load(p).stats == {}
    r = CliRunner().invoke(main, ["inspect", str(p)])
    assert r.exit_code == 0 and "not recorded" in r.output, r.output
    r = CliRunner().invoke(main, ["inspect", str(p), "--json"])
    assert r.exit_code == 0 and '"mean_factors_per_draw": null' in r.output


@pytest.mark.parametrize("stats, message", [
    ('{"mean_factors_per_draw": "x"}', "'mean_factors_per_draw' is 'x'; expected a finite number"),
    ('{"mean_factors_per_draw": NaN}', "'mean_factors_per_draw' is nan"),
    ('{"output_degree_histogram": 5}', "'output_degree_histogram' is 5"),
    ('{"output_degree_histogram": [1, -1]}', "'output_degree_histogram' is a list of 2 values"),
    ("[" * 100000 + "]" * 100000, "not JSON"),
])
def test_stats_types_are_checked(valid_files, tmp_path, stats, message):
    p = F.forge(valid_files["circle-step"], tmp_path / "f.h5", F.set_attr("stats", stats))
    with pytest.raises(FeatureFileError, match=message):
        load(p)


def _load_in_subprocess(p, timeout=180, memory=1 << 30):
    """load(p) in a child limited to ``memory`` bytes and ``timeout`` seconds: its one-line
    outcome (a hang or a memory blow-up fails the test instead of the machine)."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (%d, %d))\n"
            "from rfsgen.features import load\nfrom rfsgen.errors import RfsgenError\n"
            "try:\n    load(sys.argv[1]); print('loaded')\n"
            "except RfsgenError as e:\n    print(type(e).__name__ + ': ' + str(e))\n") % (memory, memory)
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "RFSGEN_MAX_MEMORY": str(memory // 2)})
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    return r.stdout.strip()


@pytest.mark.parametrize("case", ["column_count", "omega", "skeleton", "terms", "all columns"])
def test_issue_gzip_bomb_fails_before_decompression(valid_files, tmp_path, case):
    """Kilobytes of file declaring more than 8 GB: refused from the declared sizes, before a
    byte is decompressed (the child has 1 GiB of address space)."""
    src = valid_files["gauss-laplace"]
    edits = {
        "column_count": [F.gzip_bomb("column_count", 2**30)],
        "omega": [F.gzip_bomb("omega", 2**30, np.float64)],
        "skeleton": [F.gzip_bomb("skeleton", 9 * 2**30, np.uint8)],
        "terms": [F.gzip_bomb(k, 2**30) for k in ("term_node", "term_code", "term_power")],
        "all columns": [F.gzip_bomb("column_count", 2**30), F.gzip_bomb("column_kind", 2**30, np.uint8),
                        F.gzip_bomb("column_terms", 2**30), F.set_attr("columns", 2**30)],
    }[case]
    p = F.forge(src, tmp_path / "bomb.h5", *edits)
    assert os.path.getsize(p) < 2 << 20
    out = _load_in_subprocess(p)
    assert out.startswith(("FeatureFileError: ", "LimitError: ")) and "\n" not in out, out
    if case == "all columns":
        assert out.startswith("LimitError: ") and "1073741824 columns" in out and "over the memory budget" in out


def test_issue_external_storage_fifo_and_any_path(valid_files, tmp_path):
    """External storage would read /etc/passwd, or block forever on a FIFO: refused from
    the dataset's creation properties, before HDF5 touches the target."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, name in (("/etc/passwd", "omega"), (fifo, "column_count"), (fifo, "skeleton")):
        p = F.forge(valid_files["gauss-laplace"], tmp_path / "ext.h5", F.external_storage(name, target))
        out = _load_in_subprocess(p)
        assert out.startswith("FeatureFileError: ") and f"dataset '{name}' has external storage" in out \
            and str(target) in out, out


@pytest.mark.parametrize("case, message", [
    ("external link", r"'omega' is a link \(an external link\), not a dataset"),
    ("soft link", r"'term_code' is a link \(a soft link\), not a dataset"),
    ("virtual", "dataset 'omega' is a virtual dataset"),
    ("lzf", "dataset 'term_code' uses HDF5 filter 32000; only gzip, shuffle and fletcher32"),
    ("scale-offset", "dataset 'omega' uses HDF5 filter 6"),
    ("huge chunks", "dataset 'column_kind' has chunks of"),
    ("float attribute", "attribute 'columns' must be an integer"),
    ("array attribute", r"attribute 'draws' has shape \(2,\)"),
])
def test_reaching_outside_the_file_is_refused(valid_files, tmp_path, case, message):
    src = valid_files["gauss-laplace"]
    edit = {
        "external link": F.external_link("omega", "/etc/passwd"),
        "soft link": F.soft_link("term_code", "/term_power"),
        "virtual": F.virtual("omega", src),
        "lzf": F.with_filter("term_code", compression="lzf"),
        "scale-offset": F.with_filter("omega", scaleoffset=2),
        "huge chunks": F.write_dataset("column_kind", np.zeros(60, np.uint8), chunks=(1 << 20,), maxshape=(None,)),
        "float attribute": F.set_attr("columns", 60.0),
        "array attribute": F.set_attr("draws", np.array([1, 2])),
    }[case]
    p = F.forge(src, tmp_path / "f.h5", edit)
    with pytest.raises(FeatureFileError, match=message) as e:
        load(p)
    assert "\n" not in str(e.value)


def test_a_fifo_or_device_as_the_feature_file_is_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for p in (fifo, "/dev/zero"):
        with pytest.raises(FeatureFileError, match="not a regular file"):
            load(p)


ALIAS_BOMB = """rfsgen: 1
description: &a [1, *a]
input: {width: 6}
nodes:
  - {name: g, base: gaussian, columns: "0:6"}
  - {name: out, activation: relu, inputs: [g]}
"""


def test_issue_embedded_skeleton_with_a_recursive_alias(valid_files, tmp_path):
    """The embedded skeleton goes through parse_skeleton's guarded YAML loader: a
    self-referencing alias is a one-line error, not a run that grows past 8 GB."""
    p = F.forge(valid_files["gauss-laplace"], tmp_path / "f.h5", F.embedded_skeleton(ALIAS_BOMB))
    out = _load_in_subprocess(p)
    assert out.startswith("FeatureFileError: ") and "the embedded skeleton no longer parses" in out, out


@pytest.mark.parametrize("case", ["circle 2^60", "omega 1e308", "external storage", "bomb", "column_kind 7"])
@pytest.mark.parametrize("command", ["inspect", "transform"])
def test_forged_files_exit_2_with_one_line_in_the_cli(valid_files, tmp_path, case, command):
    from click.testing import CliRunner

    from rfsgen.cli import main

    name = "circle-step" if case == "circle 2^60" else "gauss-laplace"
    edit = {"circle 2^60": F.set_values("term_power", 0, 2**60), "omega 1e308": F.set_values("omega", 0, 1e308),
            "external storage": F.external_storage("omega", "/etc/passwd"),
            "bomb": F.gzip_bomb("omega", 2**30, np.float64), "column_kind 7": F.set_values("column_kind", 0, 7)}[case]
    p = F.forge(valid_files[name], tmp_path / "f.h5", edit)
    rows = tmp_path / "rows.npy"
    np.save(rows, np.ones((3, 6 if name == "gauss-laplace" else 3)))
    args = ["inspect", str(p)] if command == "inspect" else ["transform", str(p), str(rows), "-o", str(tmp_path / "o.h5")]
    r = CliRunner().invoke(main, args)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("rfsgen: error: ") and str(p) in lines[0], r.output
    assert not (tmp_path / "o.h5").exists()


def test_every_valid_kind_loads_as_written(tmp_path):
    """Every shipped and test skeleton under every scheme that applies: the loaded
    feature set is the one saved, and transforms to the same bytes."""
    import glob

    from conftest import ROOT, load_shipped, rows_for
    from rfsgen.schemes import SCHEMES

    skeletons = [load_shipped(p) for p in sorted(glob.glob(str(ROOT / "skeletons" / "*.yaml")))]
    skeletons += [parse_skeleton(v, k) for k, v in SMALL_SKELETONS.items()]
    n = 0
    for s in skeletons:
        for scheme in SCHEMES:
            small = any(k in s.path for k in ("coordinate", "binary", "categorical"))
            try:
                fs = sample(s, 20 if small else 100, seed=1, scheme=scheme)
            except ValueError:  # the scheme does not apply to this skeleton
                continue
            p = tmp_path / f"{n}.h5"
            n += 1
            save(fs, p)
            got = load(p)
            assert _same(got, fs), (s.path, scheme)
            x = rows_for(s, 3, seed=2)
            assert transform(got, x, layout="dense").tobytes() == transform(fs, x, layout="dense").tobytes()
    assert n >= 25


# ----------------------------------------------------------------------------- float column weights (issues 25, 28)
# One definition: an optional float64 dataset /column_weight (with the sealed root attribute
# column_weights = "float") replaces count / draws as each column's weight; files without it
# keep their bytes.
import hashlib

from rfsgen.features import MAX_WEIGHT_SUM, weight_problem

#: SHA-256 of files written before float column weights existed (tool_version and command
#: pinned); the writer must keep these bytes for files without weights.
#: Format 4 (issue 42: the skeleton an HDF5 string, a deliberate change); in format 2 they were
#: f873cccf... and 23d2dc2b..., whose files still load (test_format_2_files_still_load_and_transform_the_same).
UNWEIGHTED_SHA256 = {
    "gauss-laplace": "c7b1a658c2c2d3a6167ddd4c57f55bea7541999f930c7bd301d10a24e636fe19",
    "circle-step": "8de1a5a60c5cb434c2d1a99da4a913550008d2915f788374a69ddb5f18c5734f",
}


def _pinned(name):
    fs = sample(parse_skeleton(SMALL_SKELETONS[name], f"{name}.yaml"), 40, seed=7)
    fs.tool_version = fs.command = "pinned"
    return fs


@pytest.mark.parametrize("name", sorted(UNWEIGHTED_SHA256))
def test_files_without_column_weights_keep_their_bytes(tmp_path, name):
    fs = _pinned(name)
    save(fs, tmp_path / "f.h5")
    assert hashlib.sha256((tmp_path / "f.h5").read_bytes()).hexdigest() == UNWEIGHTED_SHA256[name]
    back = load(tmp_path / "f.h5")
    assert back.column_weight is None and np.array_equal(back.weight, fs.count / fs.draws)
    with h5py.File(tmp_path / "f.h5", "r") as f:
        assert "column_weight" not in f and "column_weights" not in f.attrs


@pytest.fixture(scope="module")
def weighted(tmp_path_factory):
    """A gauss-laplace file with float weights (Dirichlet, summing to 1), and its feature set."""
    fs = _pinned("gauss-laplace")
    fs.column_weight = np.random.default_rng(1).dirichlet(np.ones(fs.columns))
    path = tmp_path_factory.mktemp("w") / "w.h5"
    save(fs, path)
    return path, fs


def test_column_weights_survive_save_and_load_and_scale_the_output(weighted, tmp_path):
    from conftest import rows_for
    from rfsgen.features import describe

    path, fs = weighted
    back = load(path)
    assert back.column_weight.dtype == np.float64 and np.array_equal(back.column_weight, fs.column_weight)
    assert np.array_equal(back.weight, fs.column_weight) and _same(back, fs)
    assert describe(back, path)["column_weights"] == "float" and describe(_pinned("gauss-laplace"))["column_weights"] == "counts"
    with h5py.File(path, "r") as f:
        ds = f["column_weight"]
        assert f.attrs["column_weights"] == "float" and ds.fletcher32 and ds.dtype == np.float64
    # The output scale follows: column j is sqrt(w_j / (count_j / draws)) times the unweighted one.
    x = rows_for(fs.skeleton, 5, seed=2)
    plain = _pinned("gauss-laplace")
    z, z0 = (transform(s, x, layout="dense", dtype="float64") for s in (back, plain))
    np.testing.assert_allclose(z, z0 * np.sqrt(fs.column_weight / plain.weight), rtol=1e-12, atol=1e-300)
    save(back, tmp_path / "again.h5")  # a loaded weighted set writes the same bytes again
    assert (tmp_path / "again.h5").read_bytes() == path.read_bytes()


def test_column_weights_pickle_with_the_feature_set(weighted):
    import pickle

    _, fs = weighted
    assert np.array_equal(pickle.loads(pickle.dumps(fs)).weight, fs.column_weight)


@pytest.mark.parametrize("weights, message", [
    (lambda w: np.where(np.arange(w.size) == 3, np.nan, w), "column 3 has weight nan"),
    (lambda w: np.where(np.arange(w.size) == 0, -1e-9, w), "column 0 has weight -1e-09"),
    (lambda w: np.where(np.arange(w.size) == 1, np.inf, w), "column 1 has weight inf"),
    (lambda w: w * 2.0**21, "add up to"),
    (lambda w: np.full(w.size, 1e308), "add up to inf"),
    (lambda w: w[:-1], "declares"),
    (lambda w: np.concatenate([w, w]), "declares"),
    (lambda w: np.stack([w, w], axis=1), "expected a 1-D float array"),
    (lambda w: (w * 100).astype(np.int64), "expected a 1-D float array"),
    (lambda w: w.astype(np.float32), "dtype float32; expected float64"),
])
def test_forged_column_weights_are_refused_in_one_line(weighted, tmp_path, weights, message):
    path, fs = weighted
    bad = F.forge(path, tmp_path / "bad.h5", F.write_dataset("column_weight", weights(fs.column_weight), compress=False))
    with pytest.raises(FeatureFileError) as e:
        load(bad)
    assert "\n" not in str(e.value) and str(bad) in str(e.value) and message in str(e.value)
    assert "'column_weight'" in str(e.value)


def test_column_weight_dataset_and_attribute_go_together(weighted, tmp_path):
    path, fs = weighted
    unweighted = tmp_path / "u.h5"
    save(_pinned("gauss-laplace"), unweighted)
    cases = [
        (F.forge(path, tmp_path / "a.h5", F.del_attr("column_weights")), "without the 'column_weights' attribute"),
        (F.forge(path, tmp_path / "b.h5", lambda f: f.__delitem__("column_weight")), "without the 'column_weight' dataset"),
        (F.forge(path, tmp_path / "c.h5", F.set_attr("column_weights", "int")), "expected 'float'"),
        (F.forge(unweighted, tmp_path / "d.h5", lambda f: f.create_dataset("column_weight", data=fs.column_weight)),
         "without the 'column_weights' attribute"),
        (F.forge(path, tmp_path / "e.h5", F.set_attr("column_weights", "counts"), seal=False), "checksum"),
    ]
    for bad, message in cases:
        with pytest.raises(FeatureFileError) as e:
            load(bad)
        assert "\n" not in str(e.value) and message in str(e.value), (bad, str(e.value))


@settings(max_examples=25, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
    [0.0, -0.0, 5e-324, 2.0**20, 2.0**20 + 1, -1.0])), min_size=0, max_size=5))
def test_generated_column_weights_load_finite_or_fail_in_one_line(weighted, tmp_path_factory, values):
    path, fs = weighted
    w = fs.column_weight.copy()
    w[:len(values)] = values
    bad = F.forge(path, tmp_path_factory.mktemp("g") / "g.h5", F.write_dataset("column_weight", w, compress=False))
    expected_ok = weight_problem(w, fs.columns) is None
    assert expected_ok == (np.isfinite(w).all() and (w >= 0).all() and w.sum() <= MAX_WEIGHT_SUM)
    assert _oracle(bad) == ("loaded" if expected_ok else "refused")


def test_weights_are_checked_when_written(tmp_path):
    fs = _pinned("gauss-laplace")
    fs.column_weight = np.full(fs.columns, np.nan)
    with pytest.raises(ValueError, match="column 0 has weight nan"):
        save(fs, tmp_path / "x.h5")
    assert not (tmp_path / "x.h5").exists()


# ----------------------------------------------------------------------------- the skeleton as text (issue 42)
def _as_format_2(src, dst):
    """``src`` (format 4) rewritten as format 2 wrote it: the skeleton as uint8 bytes."""
    from forge import forge, set_attr, write_dataset
    from rfsgen.features import _write_header

    with h5py.File(src, "r") as f:
        raw = bytes(f["skeleton"][0])
    forge(src, dst, set_attr("format_version", 2), write_dataset("skeleton", np.frombuffer(raw, dtype=np.uint8)))
    with open(dst, "r+b") as fh:
        _write_header(fh, 2)
    return dst


def test_the_skeleton_is_stored_as_an_hdf5_utf8_string(tmp_path):
    fs = _pinned("gauss-laplace")
    save(fs, tmp_path / "f.h5")
    with h5py.File(tmp_path / "f.h5", "r") as f:
        ds = f["skeleton"]
        assert f.attrs["format_version"] == 4 and ds.shape == (1,) and ds.dtype.kind == "S"
        assert h5py.check_string_dtype(ds.dtype).encoding == "utf-8"
        assert ds[0].decode("utf-8") == fs.skeleton.source
    assert load(tmp_path / "f.h5").skeleton.source == fs.skeleton.source


def test_format_2_files_still_load_and_transform_the_same(tmp_path):
    from conftest import rows_for

    fs = _pinned("circle-step")
    save(fs, tmp_path / "f.h5")
    old = _as_format_2(tmp_path / "f.h5", tmp_path / "old.h5")
    with h5py.File(old, "r") as f:
        assert f.attrs["format_version"] == 2 and f["skeleton"].dtype == np.uint8
    back = load(old)
    assert back.skeleton.source == fs.skeleton.source and _same(back, fs)
    x = rows_for(fs.skeleton, 5, seed=1)
    assert transform(back, x, layout="dense").tobytes() == transform(fs, x, layout="dense").tobytes()


def test_a_skeleton_of_the_other_format_is_refused(tmp_path):
    from forge import forge, set_attr, write_dataset
    from rfsgen.features import _write_header

    save(_pinned("circle-step"), tmp_path / "f.h5")
    raw = load(tmp_path / "f.h5").skeleton.source.encode()
    bytes_in_4 = forge(tmp_path / "f.h5", tmp_path / "a.h5", write_dataset("skeleton", np.frombuffer(raw, np.uint8)))
    with pytest.raises(FeatureFileError, match="dataset 'skeleton' .* expected one fixed-length string"):
        load(bytes_in_4)
    old = _as_format_2(tmp_path / "f.h5", tmp_path / "old.h5")
    string_in_2 = forge(old, tmp_path / "b.h5", write_dataset("skeleton", np.array([raw], dtype=h5py.string_dtype(
        "utf-8", len(raw)))))
    with open(string_in_2, "r+b") as fh:
        _write_header(fh, 2)
    with pytest.raises(FeatureFileError, match="dataset 'skeleton' .* expected a 1-D integer array"):
        load(string_in_2)
