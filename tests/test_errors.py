"""The message helpers of rfsgen.errors."""

import pytest
from hypothesis import given, settings, strategies as st

from rfsgen.errors import OutputExistsError, RfsgenError, article, count


@settings(derandomize=True, max_examples=50, database=None)
@given(st.integers(min_value=0, max_value=10**12), st.sampled_from(["value", "row", "column"]))
def test_count_is_singular_only_for_one(n, noun):
    assert count(n, noun) == (f"1 {noun}" if n == 1 else f"{n} {noun}s")


@pytest.mark.parametrize("word, want", [
    ("AnnData", "an"), ("array", "an"), ("dict", "a"), ("CSR", "a"), ("int", "an"),
    (1, "a"), (8, "an"), (11, "an"), (18, "an"), (80, "an"), (110, "a"), (800, "an"), (1100, "a"),
    (11000, "an"), (18000, "an"), (2, "a"), (111, "a"), ("8-column", "an"), ("16-value", "a"),
])
def test_article(word, want):
    assert article(word) == want


def test_the_cli_wording_travels_with_the_error():
    e = OutputExistsError("f.h5: already exists; pass overwrite=True to replace it",
                          cli="f.h5: already exists; pass --overwrite to replace it")
    assert str(e).endswith("overwrite=True to replace it") and e.cli_message.endswith("--overwrite to replace it")
    assert RfsgenError("a\nb").cli_message == str(RfsgenError("a\nb")) == "a\\nb"
