import math

import h5py
import numpy as np
import pytest

from conftest import SMALL_SKELETONS, rows_for, skeleton_path
from reference import column_value
from rfsgen import FeatureFileError, SamplerError, UsageError, kernel, load_skeleton, parse_skeleton
from rfsgen.features import load, save
from rfsgen.sampler import sample


def skel(name):
    if name in SMALL_SKELETONS:
        return parse_skeleton(SMALL_SKELETONS[name], name)
    return load_skeleton(skeleton_path(name))


def reference_gram(fs, x):
    """Psi(x) Psi(x)^T with the literal reference evaluator (Python loops)."""
    vals = np.zeros((x.shape[0], fs.columns))
    w = fs.weight
    for j in range(fs.columns):
        a = fs.ptr[j]
        terms = fs.terms_of(j)
        omegas = {}
        for t, (node, code, power) in enumerate(terms):
            if fs.walk_skeleton.nodes[node].base.continuous:
                omegas[code] = fs.omega_of(a + t)
        for i in range(x.shape[0]):
            vals[i, j] = column_value(fs.walk_skeleton, x[i], terms, omegas, int(fs.kind[j]), w[j])
    return vals @ vals.T


@pytest.mark.slow
@pytest.mark.parametrize("name, D", [("shallow-gaussian", 300), ("cifar-deep", 300), ("relu-deep", 200),
                                     ("categorical", 60), ("binary", 24), ("circle-step", 200),
                                     ("gauss-laplace", 200), ("sphere-coordinate", 20)])
def test_scheme_is_unbiased_over_seeds(name, D, cifar_rows):
    """Mean over 100 seeds of the file's estimate of k(x, x') is within 4 standard errors of the exact kernel."""
    s = skel(name)
    x = cifar_rows[:4] if s.width == 1728 else rows_for(s, 4, seed=5)
    exact = kernel(s, x)
    est = np.array([reference_gram(sample(s, D, seed), x) for seed in range(100)])
    mean = est.mean(0)
    se = est.std(0, ddof=1) / math.sqrt(est.shape[0])
    iu = np.triu_indices(4, 1)
    assert np.all(np.abs(mean - exact)[iu] <= 4 * se[iu] + 1e-12), (mean[iu], exact[iu], se[iu])
    np.testing.assert_allclose(np.diag(mean), 1.0, atol=1e-9 + 4 * se.diagonal().max())


@pytest.mark.slow
@pytest.mark.parametrize("name, D", [("shallow-gaussian", 300), ("cifar-deep", 300), ("relu-deep", 200),
                                     ("circle-step", 200), ("sphere-coordinate", 20), ("categorical", 60)])
def test_strat_scheme_is_unbiased_over_seeds(name, D, cifar_rows):
    """The strat scheme: mean over 100 seeds within 4 standard errors of the exact kernel."""
    s = skel(name)
    x = cifar_rows[:4] if s.width == 1728 else rows_for(s, 4, seed=5)
    exact = kernel(s, x)
    est = np.array([reference_gram(sample(s, D, seed, scheme="strat"), x) for seed in range(100)])
    mean = est.mean(0)
    se = est.std(0, ddof=1) / math.sqrt(est.shape[0])
    iu = np.triu_indices(4, 1)
    assert np.all(np.abs(mean - exact)[iu] <= 4 * se[iu] + 1e-12), (mean[iu], exact[iu], se[iu])
    np.testing.assert_allclose(np.diag(mean), 1.0, atol=1e-9 + 4 * se.diagonal().max())


@pytest.mark.parametrize("name", ["shallow-gaussian", "relu-deep"])
def test_strat_degree_counts_follow_the_coefficients(name):
    """A strat block's output degrees: each degree's count within one of n a_i (table part);
    rfs's are multinomial, several counts off by more."""
    from rfsgen.sampler import _block_rng, _tables, _walk

    s = skel(name)
    act = s.nodes[s.output].activation
    n = 1 << 14
    expected = n * act.coefficients
    for scheme, ok in (("strat", True), ("rfs", False)):
        b = _walk(s, _tables(s), _block_rng(1, 0), n, stratify=scheme == "strat")
        counts = np.bincount(b.degree, minlength=act.coefficients.size)[:act.coefficients.size]
        assert np.all(np.abs(counts - expected) <= 1 + 1e-9) == ok, (scheme, counts[:5], expected[:5])


def test_strat_codes_are_stratified_per_node():
    from rfsgen.sampler import _stratified_codes

    rng = np.random.default_rng(0)
    node = np.repeat([3, 7, 9], [600, 50, 7])[rng.permutation(657)]
    code = _stratified_codes(rng, node, 6)
    for v, r in ((3, 600), (7, 50), (9, 7)):
        c = np.bincount(code[node == v], minlength=6)
        assert c.sum() == r and c.max() - c.min() <= 1
    per = _stratified_codes(rng, node, np.where(node == 3, 4, 5))
    assert per[node == 3].max() < 4 and per[node != 3].max() < 5


@pytest.mark.parametrize("name, D", [("categorical", 40), ("relu-deep", 60), ("gauss-laplace", 30)])
def test_dedup_is_exact(name, D):
    """The weighted deduplicated estimate equals the plain average over the same q draws."""
    s = skel(name)
    x = rows_for(s, 3, seed=9)
    audit = []
    fs = sample(s, D, seed=4, audit=audit)
    assert len(audit) == fs.draws
    plain = np.zeros((3, 3))
    for kind, terms in audit:
        omegas = {}
        v = np.array([column_value(s, row, terms, _omegas(fs, s, terms, kind, audit), kind, 1.0) for row in x]) if not _has_cont(s, terms) else None
        if v is None:
            continue
        plain += np.outer(v, v) / fs.draws
        del omegas
    cont_cols = [j for j in range(fs.columns) if _has_cont(s, fs.terms_of(j))]
    # Columns with continuous omegas come from exactly one draw each; add them from the file.
    ded = reference_gram(fs, x)
    if cont_cols:
        sub = _subset(fs, cont_cols)
        plain += reference_gram(sub, x)
        assert all(fs.count[j] == 1 for j in cont_cols)
    np.testing.assert_allclose(ded, plain, atol=1e-12, rtol=0)


def _has_cont(s, terms):
    return any(s.nodes[n].base.continuous for n, _, _ in terms)


def _omegas(fs, s, terms, kind, audit):
    return {}


def _subset(fs, cols):
    from rfsgen.features import FeatureSet

    lengths = np.diff(fs.ptr)[cols]
    idx = np.concatenate([np.arange(fs.ptr[j], fs.ptr[j + 1]) for j in cols])
    return FeatureSet(fs.skeleton, fs.scheme, fs.seed, fs.draws, fs.count[cols], fs.kind[cols],
                      np.concatenate(([0], np.cumsum(lengths))), fs.node[idx], fs.code[idx], fs.power[idx], fs.omega)


def test_merged_columns_are_distinct_and_counts_add_up():
    fs = sample(skel("cifar-deep"), 3000, seed=2)
    assert fs.columns == 3000 and int(fs.count.sum()) == fs.draws
    keys = {(int(fs.kind[j]), tuple(fs.terms_of(j))) for j in range(fs.columns)}
    assert len(keys) == 3000
    # canonical: terms sorted within each column, no zero powers, conjugates identified
    for j in range(0, 3000, 7):
        t = fs.terms_of(j)
        assert t == sorted(t) and all(p != 0 for _, _, p in t)
        conj = sorted((n, c ^ 1, p) for n, c, p in t)
        if conj != t:
            assert (int(fs.kind[j]), tuple(conj)) not in keys


@pytest.mark.parametrize("name, D", [("shallow-gaussian", 4000), ("categorical", 100), ("sphere-coordinate", 20),
                                     ("gauss-laplace", 4000), ("mnist-conv", 4000)])
def test_factor_count_matches_complexity(name, D):
    """Mean base factors per draw (before combining) is within 3 standard errors of C(S)."""
    s = skel(name)
    fs = sample(s, D, seed=3)
    mean = fs.stats["mean_factors_per_draw"]
    se = math.sqrt(fs.stats["var_factors_per_draw"] / fs.draws)
    assert abs(mean - s.complexity) <= 3 * se, (mean, s.complexity, se)


def test_reproducible_bytes_and_exact_budget(tmp_path):
    s = skel("cifar-deep")
    a, b, c = tmp_path / "a.h5", tmp_path / "b.h5", tmp_path / "c.h5"
    save(sample(s, 2500, seed=7), a)
    save(sample(s, 2500, seed=7), b)
    save(sample(s, 2500, seed=8), c)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    fa, fc = load(a), load(c)
    assert fa.columns == fc.columns == 2500
    assert fa.terms_of(100) != fc.terms_of(100) or fa.terms_of(200) != fc.terms_of(200)
    for D in (1, 2, 17, 1024, 1025):
        assert sample(s, D, seed=1).columns == D


@pytest.mark.parametrize("name, D, scheme", [("cifar-deep", 150_000, "rfs"), ("shallow-gaussian", 3000, "rfs"),
                                             ("shallow-gaussian", 3000, "orf"), ("circle-step", 2000, "rfs")])
def test_bytes_do_not_depend_on_the_thread_count(tmp_path, name, D, scheme):
    """Blocks are walked on several threads; each block's draws come from (seed, block)
    alone.  150,000 cifar-deep columns take several blocks (about 5 M draws), so blocks
    finish out of order on 2 and 3 threads."""
    from rfsgen.sampler import BLOCK

    files = []
    for threads in (1, 2, 3):
        fs = sample(skel(name), D, seed=11, scheme=scheme, threads=threads)
        files.append(tmp_path / f"{threads}.h5")
        save(fs, files[-1])
    assert files[0].read_bytes() == files[1].read_bytes() == files[2].read_bytes()
    if name == "cifar-deep":
        assert fs.draws > 4 * BLOCK


def test_bytes_do_not_depend_on_numba_num_threads(tmp_path):
    """Through the CLI, with NUMBA_NUM_THREADS 1, 2 and unset."""
    import os
    import subprocess
    import sys

    outs = []
    for threads in ("1", "2", None):
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_NUM_THREADS"}
        if threads:
            env["NUMBA_NUM_THREADS"] = threads
        out = tmp_path / f"t{threads}.h5"
        subprocess.run([sys.executable, "-m", "rfsgen", "sample", skeleton_path("cifar-deep"), "-n", "40000",
                        "--seed", "3", "-o", str(out), "-q"], check=True, env=env)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == outs[2]


def test_a_smaller_sample_is_a_prefix_of_a_larger_one():
    """Blocks have a fixed size, so the draws do not depend on D: the first D columns of a
    larger sample are those of a sample of D columns (their counts differ: more draws)."""
    s = skel("cifar-deep")
    small, large = sample(s, 3000, seed=5), sample(s, 90_000, seed=5)
    assert small.draws < large.draws
    n = small.ptr[-1]
    assert np.array_equal(small.kind, large.kind[:3000]) and np.array_equal(small.ptr, large.ptr[:3001])
    assert np.array_equal(small.node, large.node[:n]) and np.array_equal(small.code, large.code[:n])
    assert np.array_equal(small.power, large.power[:n])
    assert np.all(small.count <= large.count[:3000])


def test_round_trip(tmp_path):
    fs = sample(skel("gauss-laplace"), 300, seed=1)
    save(fs, tmp_path / "f.h5")
    back = load(tmp_path / "f.h5")
    for k in ("count", "kind", "ptr", "node", "code", "power", "omega"):
        np.testing.assert_array_equal(getattr(back, k), getattr(fs, k))
    assert back.draws == fs.draws and back.seed == 1 and back.skeleton.source == fs.skeleton.source


def test_heavy_tailed_step_is_sampled_exactly():
    s = skel("circle-step")
    fs = sample(s, 3000, seed=0)
    hist = fs.stats["output_degree_histogram"]
    assert sum(hist[:2]) < fs.draws  # degrees >= 3 occur
    assert max(np.diff(fs.ptr)) >= 1


def test_too_few_distinct_features():
    s = parse_skeleton("rfsgen: 1\ninput: {width: 2}\nnodes:\n  - {name: b, base: binary, per: column}\n"
                       "  - {name: out, activation: identity, inputs: [b]}\n", "tiny")
    # Within the bound of the feature space (2 x 2 values, of which one draw's single
    # factor reaches 1 + 2) but past what identity reaches (no constant).
    with pytest.raises(SamplerError, match=r"\(it can give at most 3 distinct columns\); the sampler stops at 20000 "
                                           "draws for -n 3: ask for at most 2"):
        sample(s, 3, seed=0, max_draws=20000)
    # Past the bound: at once, before any draw.
    with pytest.raises(SamplerError, match="too few distinct features for -n 10: it can give at most 3 distinct columns"):
        sample(s, 10, seed=0, max_draws=1)


@pytest.fixture
def feature_file(tmp_path):
    p = tmp_path / "f.h5"
    save(sample(skel("cifar-deep"), 2000, seed=1), p)
    return p


def test_truncated_file(feature_file):
    data = feature_file.read_bytes()
    feature_file.write_bytes(data[: len(data) // 2])
    with pytest.raises(FeatureFileError, match="not a readable HDF5 file|corrupted|incomplete"):
        load(feature_file)


def test_corrupted_dataset_is_caught_by_checksum(feature_file):
    with h5py.File(feature_file, "r") as f:
        off = f["term_node"].id.get_chunk_info(0).byte_offset
    data = bytearray(feature_file.read_bytes())
    data[off + 40] ^= 0xFF
    feature_file.write_bytes(bytes(data))
    with pytest.raises(FeatureFileError, match="checksum mismatch"):
        load(feature_file)


def test_foreign_and_wrong_version(tmp_path, feature_file):
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f["x"] = np.arange(3)
    with pytest.raises(FeatureFileError, match="not an rfsgen feature file"):
        load(tmp_path / "foreign.h5")
    with h5py.File(feature_file, "a") as f:
        f.attrs["format_version"] = 99
    _rehash(feature_file)
    with pytest.raises(FeatureFileError, match="format version 99 is not supported"):
        load(feature_file)
    (tmp_path / "text.h5").write_text("hello")
    with pytest.raises(FeatureFileError, match="not a readable HDF5 file"):
        load(tmp_path / "text.h5")
    with pytest.raises(FeatureFileError, match="no such feature file"):
        load(tmp_path / "missing.h5")


def _rehash(path):
    """Rewrite the file's rfsgen header checksum after an edit (as a forger would)."""
    from rfsgen.features import _write_header

    with open(path, "r+b") as fh:
        _write_header(fh)


def test_inconsistent_contents(feature_file):
    from rfsgen.features import _seal

    with pytest.raises(FeatureFileError, match="checksum mismatch"):
        with h5py.File(feature_file, "a") as f:
            f.attrs["draws"] = int(f.attrs["draws"]) + 1
        load(feature_file)
    _rehash(feature_file)
    with pytest.raises(FeatureFileError, match="attributes do not match their checksum"):
        load(feature_file)
    with h5py.File(feature_file, "a") as f:  # a crafted file with a consistent seal
        _seal(f)
    _rehash(feature_file)
    with pytest.raises(FeatureFileError, match="counts do not add up"):
        load(feature_file)


def test_key_matching_survives_64_bit_collisions():
    """Keys equal in their first half but not the second are different columns, both in a
    block's dedup (exact fallback) and in the table of known columns."""
    from rfsgen.sampler import _Known, _unique_keys

    u = np.uint64
    k1 = np.array([5, 5, 7, 5], dtype=u)
    k2 = np.array([2, 4, 6, 2], dtype=u)  # rows 0 and 3 are the same key; row 1 collides on k1
    inv, first, u1, u2 = _unique_keys(k1, k2)
    assert inv.tolist() == [0, 1, 2, 0] and first.tolist() == [0, 1, 2]
    assert u1.tolist() == [5, 5, 7] and u2.tolist() == [2, 4, 6]
    known = _Known(10)
    known.add(np.array([5, 9], dtype=u), np.array([4, 1], dtype=u), np.array([11, 12]))
    assert known.find(np.array([5, 5, 9, 9], dtype=u), np.array([2, 4, 1, 4], dtype=u)).tolist() == [-1, 11, 12, -1]


def test_known_columns_table_finds_every_key_it_holds():
    """The table of known keys, filled to its limit, finds each key's id and nothing else,
    also when many keys share low bits or are consecutive (continuous draws' keys)."""
    from rfsgen.sampler import _Known

    rng = np.random.default_rng(5)
    n = 3000
    for keys in (rng.integers(0, 2**63, n, dtype=np.uint64),
                 (rng.integers(0, 2**63, n, dtype=np.uint64) >> np.uint64(40)) << np.uint64(40),
                 np.arange(n, dtype=np.uint64)):
        keys = np.unique(keys)
        k2 = keys ^ np.uint64(99)
        known = _Known(keys.size)
        assert 4 * keys.size <= 3 * known.table.shape[0]
        ids = rng.permutation(keys.size)
        half = keys.size // 2
        known.add(keys[:half], k2[:half], ids[:half])
        known.add(keys[half:], k2[half:], ids[half:])
        np.testing.assert_array_equal(known.find(keys, k2), ids)
        assert np.all(known.find(keys, k2 + np.uint64(2)) == -1)  # same first halves, other second halves
        assert np.all(known.find(keys + np.uint64(2**62), k2) == -1)


def test_distinct_keys_of_a_block_are_numpy_unique():
    """The hash-table dedup gives np.unique's keys, first occurrences and inverse, numbered
    by first appearance, also when many keys share the low bits the table is indexed by."""
    from rfsgen.sampler import _unique_keys

    rng = np.random.default_rng(3)
    for low_bits_shared in (False, True):
        pool = rng.integers(0, 2**63, 3000, dtype=np.uint64)
        if low_bits_shared:
            pool = (pool >> np.uint64(40)) << np.uint64(40)  # every key lands in a few slots
        pick = rng.integers(0, pool.size, 20000)
        k1, k2 = pool[pick], pool[pick] ^ np.uint64(12345)
        inv, first, u1, u2 = _unique_keys(k1, k2)
        want_u, want_first, want_inv = np.unique(k1, return_index=True, return_inverse=True)
        order = np.argsort(want_first)
        rank = np.empty(order.size, dtype=np.int64)
        rank[order] = np.arange(order.size)
        np.testing.assert_array_equal(u1, want_u[order])
        np.testing.assert_array_equal(first, want_first[order])
        np.testing.assert_array_equal(inv, rank[want_inv.ravel()])
        np.testing.assert_array_equal(u2, k2[want_first[order]])


def _lexsort_reference(draw, node, code):
    order = np.lexsort((code, node, draw))
    return order, np.concatenate(([0], np.cumsum(np.bincount(draw, minlength=DRAWS))))


DRAWS = 300


def _walk_items(rng, n, sorted_draws, crowded):
    """n items of a block of DRAWS draws: draws in order (one level's items) or shuffled
    (several levels' leaves), a few nodes per draw or, ``crowded``, draws of 40-200 items
    (past the insertion sort's 32)."""
    if crowded:
        draw = np.repeat(rng.integers(0, DRAWS, 8), rng.integers(40, 200, 8))
        draw = np.concatenate([draw, rng.integers(0, DRAWS, n)])
    else:
        draw = rng.integers(0, DRAWS, n)
    if sorted_draws:
        draw = np.sort(draw)
    node = rng.integers(0, 12, draw.size)
    return draw.astype(np.int64), node.astype(np.int64)


@pytest.mark.parametrize("sorted_draws", [True, False])
@pytest.mark.parametrize("crowded", [False, True])
def test_leaf_items_merge_as_numpy_sums_them(sorted_draws, crowded):
    """merge_leaves: one item per distinct (draw, node), sorted, multiplicities summed --
    np.unique's keys and bincount's sums -- whether the draws come in order or not and
    however many items a draw holds; a draw outside the block is refused before a write."""
    from rfsgen._compiled import merge_leaves

    rng = np.random.default_rng(11)
    draw, node = _walk_items(rng, 2000, sorted_draws, crowded)
    mult = rng.integers(1, 2**40, draw.size).astype(np.int64)
    out = [np.empty(draw.size, np.int64) for _ in range(3)]
    k = merge_leaves(draw, node, mult, DRAWS, *out)
    keys, inv = np.unique(draw * 12 + node, return_inverse=True)
    assert k == keys.size
    np.testing.assert_array_equal(out[0][:k], keys // 12)
    np.testing.assert_array_equal(out[1][:k], keys % 12)
    np.testing.assert_array_equal(out[2][:k], np.bincount(inv.ravel(), weights=mult).astype(np.int64))
    for bad in (-1, DRAWS):
        wrong = draw.copy()
        wrong[-1] = bad
        assert merge_leaves(wrong, node, mult, DRAWS, *out) == -1
    # arrays of other lengths are refused before a write (the walk's own arrays always agree)
    short = [np.full(draw.size - 1, -7, np.int64) for _ in range(3)]
    assert merge_leaves(draw, node[:-1], mult, DRAWS, *out) == -1
    assert merge_leaves(draw, node, mult[:-1], DRAWS, *out) == -1
    assert merge_leaves(draw, node, mult, DRAWS, *short) == -1 and all(np.all(a == -7) for a in short)


@pytest.mark.parametrize("sorted_draws", [True, False])
@pytest.mark.parametrize("crowded", [False, True])
def test_term_order_is_a_stable_lexsort_with_each_draws_start(sorted_draws, crowded):
    """term_order: np.lexsort((code, node, draw)), stable where (draw, node, code) repeat,
    negative codes included, and where each draw's terms start; ``moved`` False exactly
    when the order is the identity (terms already sorted, the usual case)."""
    from rfsgen._compiled import term_order

    rng = np.random.default_rng(12)
    draw, node = _walk_items(rng, 3000, sorted_draws, crowded)
    code = rng.integers(-3, 4, draw.size).astype(np.int64)
    ptr = np.empty(DRAWS + 1, np.int64)
    order, moved = term_order(draw, node, code, DRAWS, ptr)
    want, want_ptr = _lexsort_reference(draw, node, code)
    np.testing.assert_array_equal(order, want)
    np.testing.assert_array_equal(ptr, want_ptr)
    assert moved
    d, v, c = draw[want], node[want], code[want]
    order, moved = term_order(d, v, c, DRAWS, ptr)
    np.testing.assert_array_equal(order, np.arange(d.size))
    assert not moved
    wrong = draw.copy()
    wrong[0] = DRAWS
    assert term_order(wrong, node, code, DRAWS, ptr)[0].size == 0
    short = np.full(DRAWS, -7, np.int64)  # one short of DRAWS + 1
    assert term_order(draw, node, code, DRAWS, short)[0].size == 0 and np.all(short == -7)
    assert term_order(draw, node[:-1], code, DRAWS, ptr)[0].size == 0
    assert term_order(draw, node, code[:-1], DRAWS, ptr)[0].size == 0


def test_level_census_counts_leaves_and_activations():
    """level_census: the leaf items and each activation's internal items of a level, as
    numpy counts them; a node or an activation outside the tables returns -1."""
    from rfsgen._compiled import level_census

    rng = np.random.default_rng(13)
    is_input = rng.random(30) < 0.4
    act_index = np.where(is_input, -1, rng.integers(0, 3, 30))
    node = rng.integers(0, 30, 5000)
    per_act = np.zeros(3, np.int64)
    assert level_census(node, is_input, act_index, per_act) == int(is_input[node].sum())
    np.testing.assert_array_equal(per_act, np.bincount(act_index[node[~is_input[node]]], minlength=3))
    for bad in (-1, 30):
        assert level_census(np.array([0, bad]), is_input, act_index, np.zeros(3, np.int64)) == -1
    internal = int(np.flatnonzero(~is_input)[0])
    assert level_census(np.array([internal]), is_input, act_index, np.zeros(act_index[internal], np.int64)) == -1
    assert level_census(node, is_input, act_index[:-1], np.zeros(3, np.int64)) == -1


def test_draws_without_terms_keep_their_kinds_keys():
    """draw_keys hashes a termless draw's key once per kind a call and copies it: the keys
    of a batch equal those of its draws hashed one by one, for every kind, mixed with
    draws that have terms and continuous ones."""
    from rfsgen.features import term_keys

    rng = np.random.default_rng(14)
    n = 400
    kind = rng.integers(0, 3, n).astype(np.uint8)
    lengths = np.where(rng.random(n) < 0.7, 0, rng.integers(1, 4, n))
    ptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    node, code, power = (rng.integers(0, 9, ptr[-1]).astype(np.int64) for _ in range(3))
    cont = rng.random(n) < 0.05
    batch = term_keys(kind, ptr, node, code, power, cont, 7)
    for i in range(n):
        a, z = ptr[i], ptr[i + 1]
        one = term_keys(kind[i:i + 1], np.array([0, z - a]), node[a:z], code[a:z], power[a:z], cont[i:i + 1], 7 + i)
        np.testing.assert_array_equal(batch[i], one[0])
    empty = (lengths == 0) & ~cont
    for k in range(3):  # a kind's termless draws share one key, and no other kind's
        keys = {tuple(batch[i]) for i in np.flatnonzero(empty & (kind == k))}
        assert len(keys) == 1
    assert len({tuple(batch[i]) for i in np.flatnonzero(empty)}) == 3


NESTED_STEP = """
rfsgen: 1
input: {width: 3}
nodes:
  - {name: s, base: sphere}
  - {name: a, activation: step, inputs: [s]}
  - {name: b, activation: step, inputs: [a]}
"""


def test_nested_step_samples_or_fails_with_one_line_and_bounded_memory():
    """Step over step: the inner node needs sums of billions of heavy-tailed degrees.
    Each seed either samples or ends with a SamplerError that says what happened and
    after how many draws (the empirical rate) -- never a MemoryError or a traceback;
    one draw's work is bounded (activations.SUM_BATCH, MAX_TAIL_DRAWS)."""
    import resource

    s = parse_skeleton(NESTED_STEP, "nested")
    outcomes = []
    for seed in range(6):
        try:
            fs = sample(s, 20000, seed=seed)
            outcomes.append("ok")
            assert fs.columns == 20000
        except SamplerError as e:
            msg = str(e)
            assert "\n" not in msg and "draws of 'nested'" in msg and ("2**6" in msg or "limit of" in msg), msg
            outcomes.append("error")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 * 2**20  # KiB: under 4 GiB for the whole run
    assert len(outcomes) == 6


def test_tail_overflow_message_gives_the_true_rate():
    from rfsgen.activations import make_activation

    t = make_activation("step").tail
    assert t.overflow_probability() == pytest.approx((2**14 / 2**61) ** 0.5)  # 8.4e-8 per tail degree
    assert make_activation("relu").tail.overflow_probability() < 1e-20


def test_asking_for_more_columns_than_exist_stops_early():
    """-n beyond the skeleton's feature space is refused before any draw when the space's
    bound says so, and otherwise detected after about STALL_DRAWS fruitless draws, not
    after time linear in -n."""
    import time

    from rfsgen.sampler import STALL_DRAWS

    s = parse_skeleton("rfsgen: 1\ninput: {width: 2}\nnodes:\n  - {name: b, base: binary, per: column}\n"
                       "  - {name: out, activation: identity, inputs: [b]}\n", "tiny")
    t = time.time()
    with pytest.raises(SamplerError, match=r"can give at most 3 distinct columns"):
        sample(s, 10**7, seed=0)
    assert time.time() - t < 5
    with pytest.raises(SamplerError, match=r"only 2 distinct columns in (\d+) draws") as e:
        sample(s, 3, seed=0)  # within the bound (1 + 2 values of one factor), beyond what identity reaches
    draws = int(e.value.args[0].split(" draws")[0].split()[-1])
    assert draws <= 2 * STALL_DRAWS + (1 << 18)
    assert time.time() - t < 60


@pytest.mark.parametrize("n, seed, message", [(0, 0, "-n must be"), (10**12, 0, "-n must be"), (5, -1, "--seed must be"),
                                              (5, 2**64, "--seed must be"), (5.5, 0, "-n must be")])
def test_bad_budgets_and_seeds(n, seed, message):
    with pytest.raises(UsageError, match=message):
        sample(skel("cifar-deep"), n, seed=seed)


def test_canonical_forms_pick_the_smaller_of_a_feature_and_its_conjugate():
    """The compiled canonicalisation against a literal one: sort the conjugate's terms by
    (node, code), compare (code, power) lists, keep the smaller; short and long node runs
    (insertion sort and merge sort), continuous draws never conjugated."""
    from rfsgen._compiled import canonical_forms

    rng = np.random.default_rng(11)
    ptr, node, code, power, cont = [0], [], [], [], []
    for d in range(400):
        for v in sorted(rng.choice(6, rng.integers(1, 4), replace=False)):
            k = int(rng.choice([1, 2, 5, 40]))  # runs longer than 32 take the merge sort
            codes = np.sort(rng.choice(200, k, replace=False))
            node += [v] * k
            code += codes.tolist()
            power += rng.integers(-3, 4, k).tolist()
        ptr.append(len(node))
        cont.append(bool(rng.random() < 0.1))
    ptr, node, code, power = (np.array(a, dtype=np.int64) for a in (ptr, node, code, power))
    cont = np.array(cont)
    cc, cp = code ^ 1, -power  # a bijection on codes, as a base's conjugate is
    out_code, out_power, real = np.empty_like(code), np.empty_like(power), np.empty(cont.size, dtype=bool)
    canonical_forms(ptr, node, code, power, cc, cp, cont, out_code, out_power, real)
    n_conj = 0
    for d in range(cont.size):
        a, z = ptr[d], ptr[d + 1]
        own = list(zip(node[a:z].tolist(), code[a:z].tolist(), power[a:z].tolist()))
        conj = sorted(zip(node[a:z].tolist(), cc[a:z].tolist(), cp[a:z].tolist()), key=lambda t: (t[0], t[1]))
        want_real = own == conj and not cont[d]
        use = conj if (not cont[d] and conj < own) else own
        assert real[d] == want_real
        assert list(zip(node[a:z].tolist(), out_code[a:z].tolist(), out_power[a:z].tolist())) == use
        n_conj += use is conj and conj != own
    assert n_conj > 50  # both branches are exercised


ORF_SMALL = """rfsgen: 1
input:
  shape: [1, 1, 3]
nodes:
  - name: v
    base: sphere
    scheme: pair
  - name: out
    activation: {name: exp, beta: 2.0}
    inputs: [v]
output: out
"""


@pytest.mark.parametrize("D", [40, 41])
def test_orf_ends_on_whole_pairs_and_its_diagonal_is_exact(D):
    """Issue 28 item 4: a run used to end after the cos half of a pair (always for an odd
    -n), overestimating k(x, x).  Over many seeds the diagonal is exact to rounding; an odd
    -n gives -n + 1 columns, an even one -n (and the same draws as before the change)."""
    from rfsgen import transform

    s = parse_skeleton(ORF_SMALL)
    x = np.random.default_rng(0).normal(size=(5, 3))
    exact = np.diag(kernel(s, x))
    for seed in range(40):
        fs = sample(s, D, seed=seed, scheme="orf")
        assert fs.columns == D + D % 2 and fs.draws % 2 == 0
        z = transform(fs, x, layout="dense", dtype="float64")
        np.testing.assert_allclose((z * z).sum(1), exact, rtol=0, atol=1e-12)


NEW_ACTIVATIONS = """rfsgen: 1
input: {width: 4}
nodes:
  - {name: v, base: sphere, scheme: pair}
  - {name: h, activation: {name: leaky_relu, slope: 0.2}, inputs: [v, v]}
  - {name: out, activation: {name: function, expr: "where(x > 0, x, expm1(x))"}, inputs: [h, v]}
output: out
"""


def test_new_activations_are_unbiased_over_seeds():
    """Issue 28: leaky_relu (relu's heavy tail, scaled) under an expression activation: the
    mean over 100 seeds of the estimate is within 4 standard errors of the exact kernel
    (DESIGN section 8), and the diagonal within 4 standard errors of 1."""
    from rfsgen import transform

    s = parse_skeleton(NEW_ACTIVATIONS)
    x = rows_for(s, 5, seed=3)
    exact = kernel(s, x)
    est = []
    for seed in range(100):
        z = transform(sample(s, 200, seed=seed), x, layout="dense", dtype="float64")
        est.append(z @ z.T)
    est = np.array(est)
    mean, se = est.mean(0), est.std(0, ddof=1) / math.sqrt(len(est))
    iu = np.triu_indices(5, 1)
    assert np.all(np.abs(mean - exact)[iu] <= 4 * se[iu] + 1e-12), (mean[iu], exact[iu], se[iu])
    np.testing.assert_allclose(np.diag(mean), 1.0, atol=1e-9 + 4 * se.diagonal().max())


def test_stacked_exp_whose_degrees_pass_2_61_is_one_error():
    """Found by the fuzzer: eight exp layers with beta = 999.9 ask numpy for a Poisson of
    mean ~1e21 (a ValueError traceback).  The sum is refused first, naming the cause."""
    nodes = "".join(f"  - {{name: e{i}, activation: {{name: exp, beta: 999.9}}, inputs: [{'g' if i == 0 else f'e{i - 1}'}]}}\n"
                    for i in range(8))
    s = parse_skeleton("rfsgen: 1\ninput: {width: 8}\nnodes:\n  - {name: g, base: gaussian, per: column}\n" + nodes)
    with pytest.raises(SamplerError, match=r"exp degrees in one draw would reach 2\*\*61 .*beta \(here 999.9\)"):
        sample(s, 64, seed=2067398024)
    # one layer of the same beta is fine
    one = parse_skeleton("rfsgen: 1\ninput: {width: 8}\nnodes:\n  - {name: g, base: gaussian, per: column}\n"
                         "  - {name: e, activation: {name: exp, beta: 999.9}, inputs: [g]}\n")
    assert sample(one, 64, seed=1).columns == 64


def test_stacked_polynomials_whose_trials_pass_2_61_are_one_error():
    """Four polynomial layers of degree 100,000 need 1e20 binomial trials in one draw: the
    int64 product used to wrap silently (a wrong draw, exit 0); now it is refused."""
    nodes = "".join(f"  - {{name: p{i}, activation: {{name: polynomial, degree: 100000}}, "
                    f"inputs: [{'g' if i == 0 else f'p{i - 1}'}]}}\n" for i in range(4))
    s = parse_skeleton("rfsgen: 1\ninput: {width: 4}\nnodes:\n  - {name: g, base: gaussian, per: column}\n" + nodes)
    with pytest.raises(SamplerError, match=r"polynomial degrees in one draw would reach 2\*\*61"):
        sample(s, 8, seed=0)


def test_a_constant_activation_passes_nothing_down_even_under_an_infinite_estimate():
    """Found by the fuzzer (seed 33): below a constant activation (degree 0 only) the size
    estimates met inf * 0 = NaN, printed numpy's RuntimeWarning and overstated the feature
    space (16 instead of 1: only the constant feature exists)."""
    import warnings

    from rfsgen.sampler import _tables, feature_space, footprint

    s = parse_skeleton("rfsgen: 1\ninput: {width: 2}\nnodes:\n"
                       "  - {name: a, base: binary, per: column}\n  - {name: b, base: binary, per: column}\n"
                       "  - {name: h0, activation: {name: coefficients, values: [0.328]}, inputs: [a, b]}\n"
                       "  - {name: h1, activation: {name: arccos, degree: 1}, inputs: [h0]}\n"
                       "  - {name: out, activation: {name: polynomial, degree: 5, c: 0.45}, inputs: [h1]}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        t = _tables(s)
        assert feature_space(s, t) == 1.0
        assert np.isfinite(footprint(s, t).items)
    with pytest.raises(SamplerError, match="at most 1 distinct column "):
        sample(s, 256, seed=486617684)



def test_each_block_size_is_checked_against_the_budget_once(monkeypatch):
    """The budget is read before the first block of each size, not before every block: the
    schedule repeats one size, and a block's estimate depends on its size alone."""
    import rfsgen.sampler as sampler_module
    from rfsgen import budget
    from rfsgen.errors import LimitError

    skel = load_skeleton(skeleton_path("cifar-deep"))
    checked, walked = [], []
    real_check, real_rng = sampler_module.check_block, sampler_module._block_rng

    def check(s, fp, draws, columns=0):
        checked.append(draws)
        return real_check(s, fp, draws, columns)

    def rng(seed, k):
        walked.append(k)
        return real_rng(seed, k)

    monkeypatch.setattr(sampler_module, "check_block", check)
    monkeypatch.setattr(sampler_module, "_block_rng", rng)
    plain = sample(skel, 30000, seed=3, threads=2)
    blocks = [d for d in checked if d]
    assert len(blocks) == len(set(blocks)) >= 2  # several sizes, each checked once
    assert len(walked) > len(blocks) + 2  # and more blocks walked than checks made
    # the bytes are those of a sample without the checks
    monkeypatch.setattr(sampler_module, "check_block", lambda *a, **k: None)
    again = sample(skel, 30000, seed=3, threads=2)
    assert plain.draws == again.draws
    for name in ("count", "kind", "ptr", "node", "code", "power", "omega"):
        assert np.array_equal(getattr(plain, name), getattr(again, name)), name
    # a budget too small for the blocks still stops the sample
    monkeypatch.setattr(sampler_module, "check_block", check)
    with budget.limited(3 << 20):
        with pytest.raises(LimitError, match="memory budget"):
            sample(skel, 30000, seed=3, threads=2)
