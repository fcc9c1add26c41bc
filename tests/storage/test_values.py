"""storage/values.py: the escape of text columns and the JSON fallback, checked exhaustively on
the characters that matter and by property on any string."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.values import (
    DEEP_JSON_MARK,
    ESCAPE,
    JSON_FALLBACK_MARK,
    clamp_count,
    dumps_json,
    escape_text,
    loads_json,
    unescape_text,
)
from tests.support.values import nested, same

ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40) | st.text(
    st.sampled_from(["\x00", ESCAPE, "0", "u", "\ud800", "\udfff", "\ufeff", "a", "é"]), max_size=30)


@given(ANY_TEXT)
def test_escape_reads_back_and_is_storable(value: str) -> None:
    stored = escape_text(value)
    assert "\x00" not in stored
    stored.encode()  # valid UTF-8: no lone surrogate left
    assert unescape_text(stored) == value


@pytest.mark.parametrize("value", ["", "plain", "ünïcödé", "\ufeffBOM", "emoji 😀", "tab\tnewline\n"])
def test_ordinary_text_is_stored_unchanged(value: str) -> None:
    assert escape_text(value) is value


@pytest.mark.parametrize("stored", [
    ESCAPE + "a" + ESCAPE + "x", ESCAPE + ESCAPE, ESCAPE + ESCAPE + "u12", ESCAPE + "a" + ESCAPE + "u00zz",
    ESCAPE + ESCAPE + "u+123", "\x10a\x10b", ESCAPE, ESCAPE + "abc", ESCAPE + ESCAPE + "u0041",
])
def test_a_malformed_escape_reads_as_the_literal_text_it_is(stored: str) -> None:
    """A value ``escape_text`` never writes (one stored before the scheme, say) never fails a
    read: it is returned as it is."""
    assert unescape_text(stored) == stored


def test_escapes_read_back() -> None:
    assert unescape_text(ESCAPE + "a" + ESCAPE + "0" + ESCAPE + "ud800") == "a\x00\ud800"


@given(st.recursive(st.none() | st.booleans() | st.integers(-(2**90), 2**90) | ANY_TEXT,
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
                    max_leaves=12))
def test_json_reads_back_equal(value: object) -> None:
    data = dumps_json(value)
    assert loads_json(data) == value and loads_json(data.decode()) == value


def test_json_fallback_only_for_what_orjson_refuses() -> None:
    assert dumps_json({"a": 2**64 - 1}) == b'{"a":18446744073709551615}'
    assert dumps_json({"a": 2**64}).startswith(JSON_FALLBACK_MARK.encode())
    with pytest.raises(TypeError):
        dumps_json({"a": object()})
    with pytest.raises(TypeError):
        dumps_json({"a": 2**64, "b": float("nan")})


@pytest.mark.parametrize("depth", [255, 600, 1100, 100_000])
def test_json_nested_deeper_than_orjson_writes_reads_back_equal(depth: int) -> None:
    """Past orjson's writer (254) and past its reader (1,024; a reply reassembled from a stream
    may be a few levels deeper than the body it came in): stored as a table of its containers,
    read back equal, key order and odd leaves (a wide integer, a lone surrogate) kept. Before,
    the stdlib fallback recursed: ``RecursionError`` past about 500 levels, and nothing orjson
    wrote past 1,024 would have read back."""
    value = {"z": 1, "input": {"b": nested(depth, {"wide": 2**70, "half": "\ud800", "f": 1.0})}, "a": [None, "x"]}
    data = dumps_json(value)
    assert data.startswith(DEEP_JSON_MARK.encode())
    for stored in (data, data.decode()):
        back = loads_json(stored)
        assert same(back, value)  # (``==`` itself would recurse)


def test_a_value_that_holds_itself_is_not_json() -> None:
    value: list[Any] = [nested(300)]
    value.append(value)
    with pytest.raises(TypeError):
        dumps_json(value)


def test_clamp_count() -> None:
    assert [clamp_count(v, 10) for v in (5, 11, -11, 2.5, float("inf"), None, True)] == [5, 10, -10, 2, None, None, True]
