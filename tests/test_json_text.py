"""``proxy.json_text.parse_json``: orjson's parser, with lone surrogate escapes read as U+FFFD."""

from __future__ import annotations

import json

import orjson
import pytest

from proxy.json_text import parse_json


@pytest.mark.parametrize(("text", "expected"), [
    (b'"half \\ud83d here"', "half \ufffd here"),  # a high surrogate without its low half
    (b'"\\udc00"', "\ufffd"),  # a low one alone
    (b'"\\ud83d\\u0041"', "\ufffdA"),  # a high one before a non-surrogate escape
    (b'"\\ud83d\\ud83d\\ude00"', "\ufffd\U0001f600"),  # a lone one, then a pair
    (b'"a\\\\\\ud83d"', "a\\\ufffd"),  # an escaped backslash before it
])
def test_lone_surrogates_become_replacement_characters(text: bytes, expected: str) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(text)
    assert parse_json(text) == expected
    assert parse_json(text.decode()) == expected  # str input too
    orjson.dumps(parse_json(text))  # writable: what the proxy hashes and logs


def test_keys_and_nested_values_are_replaced_and_the_rest_is_as_orjson_reads_it() -> None:
    text = (b'{"\\udc00k":[1,-9223372036854775809,18446744073709551616,2.5e3,true,null,{"d":"\\ud83d\\ude00"}],'
            b'"a":"x \\ud83d","a":2}')
    same_without = text.replace(b"\\udc00k", b"\\ufffdk").replace(b"x \\ud83d", b"x \\ufffd")
    assert parse_json(text) == orjson.loads(same_without)
    assert parse_json(memoryview(text)) == parse_json(bytearray(text)) == orjson.loads(same_without)


@pytest.mark.parametrize("text", [
    b'{"a":"\xed\xa0\xbd"}',  # a surrogate as raw UTF-8 bytes: invalid UTF-8 (json.loads would take it)
    b'["\\ud83d", NaN]',  # json.loads takes NaN, orjson does not
    b'["\\ud83d", 1e400]',  # json.loads makes infinity
    b'["\\ud83d"',
    b'["\\ud83d"] x',
    b"[" * 1100 + b'"\\ud83d"' + b"]" * 1100,
    b'{"a":"\\u00e9", }',  # not about surrogates at all
])
def test_everything_else_orjson_refuses_is_refused(text: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError) as expected:
        orjson.loads(text)
    with pytest.raises(orjson.JSONDecodeError) as got:
        parse_json(text)
    assert str(got.value) == str(expected.value)
    assert isinstance(got.value, ValueError)


def test_valid_text_is_orjson_s_own_result() -> None:
    value = {"s": "caf\u00e9 \U0001f600", "n": [0, -1, 2**63, 1.5], "o": {}, "b": False}
    text = json.dumps(value).encode()
    assert parse_json(text) == orjson.loads(text) == value
