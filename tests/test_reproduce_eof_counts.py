"""tests/reproduce/eof_counts.py (issue 40 item 3, the seed 002's Table 2 counts): its closed
forms agree with rfsgen.eof's enumeration, and the conclusion docs/eof-experiment.md states
still holds -- so that the doc cannot silently drift."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "eof-experiment.md"


@pytest.fixture(scope="module")
def counts():
    sys.path.insert(0, str(ROOT / "tests" / "reproduce"))
    try:
        import importlib

        yield importlib.import_module("eof_counts")
    finally:
        sys.path.remove(str(ROOT / "tests" / "reproduce"))


@pytest.fixture(scope="module")
def searched(counts):
    return counts.at_rule_levels(), counts.free_search(), counts.caps()


def test_closed_forms_agree_with_rfsgen_and_brute_force(counts):
    assert counts.cross_check() == []


def test_rfsgen_gives_its_documented_counts_at_the_seeds_settings(counts):
    from rfsgen import eof

    got = []
    for _, d, D, _ in counts.SEED_TABLE2:
        n = eof.smallest_level(d, D)
        got.append(eof.grid_counts(n, d)[1])
        assert counts.rule_level(d, D, "interior", "sparse", 0) == n - 1
    assert tuple(got) == counts.RFSGEN_COUNTS == (2177, 163, 391, 161)
    assert [t for *_, t in counts.SEED_TABLE2] == [2048, 161, 338, 128]


def test_no_convention_matches_all_four_and_the_closest_is_d_minus_1_plus_1(counts, searched):
    rule_rows, free_rows, _ = searched
    best = max(r["matches"] for r in rule_rows)
    assert best == 3
    top = [r for r in rule_rows if r["matches"] == best]
    assert [(r["weights"], r["index_set"], r["dim"], r["offset"]) for r in top] == [("interior", "sparse", -1, 1)]
    assert top[0]["counts"] == [2048, 162, 338, 128] and top[0]["levels"] == [2, 1, 2, 2]  # n = 3 / 2 / 3 / 3
    plain = next(r for r in rule_rows if (r["weights"], r["index_set"], r["dim"], r["offset"]) == ("interior", "sparse", -1, 0))
    assert plain["counts"] == [2047, 161, 337, 127]
    # any level, each set its own dimension near d: still nothing matches all four; one convention three
    assert max(r["sets_matched"] for r in free_rows) == 3
    assert [(r["weights"], r["index_set"], r["offset"]) for r in free_rows if r["sets_matched"] == 3] == [
        ("interior", "sparse", 1)]
    # 2 d^2 at n = 3 on d - 1 coordinates plus one, exactly
    for d in range(2, 100):
        assert counts.count(d - 1, 2) + 1 == 2 * d * d


def test_the_seeds_grid_is_always_odd(counts):
    for d in range(1, 100):
        for n in range(1, 6):
            assert counts.seed_count(d, n) % 2 == 1
            assert counts.count(d, n - 1, "interior", "full") % 2 == 1


def test_the_doc_states_what_the_script_finds(counts, searched):
    rule_rows, free_rows, caps = searched
    doc = DOC.read_text()
    section = doc[doc.index("## The seed's feature counts"):]
    for line in counts.rule_table(rule_rows, caps) + counts.free_table(free_rows):
        assert line in section, line
    prose = " ".join(section.split())
    for phrase in ("no convention in this family gives all four numbers", "d - 1 coordinates plus one constant feature",
                   "2048 / 162 / 338 / 128", "always has an odd number of features", "Worth offering in rfsgen? No."):
        assert phrase in prose, phrase


def test_script_runs(counts, capsys, tmp_path):
    assert counts.main(["--no-check", "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "| **seed's Table 2** |" in out and "the best matches 3/4" in out
    assert (tmp_path / "c.json").stat().st_size > 0
