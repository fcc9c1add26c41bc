"""Parsing the JSON that clients and the provider send, as leniently as the provider reads it.

``parse_json`` is orjson's parser, except for one kind of text orjson refuses and JSON allows
(RFC 8259, section 8.2) and Python's ``json`` and OpenAI accept: a string with a lone surrogate
escape (``"half an emoji \\ud83d here"``, a high surrogate without its low half, or a low one
alone), which a model cut mid-character produces. Refusing it would leave that reply unlogged
and answer the next request that carries it in its history with a 400 the provider would not
give. Such text is parsed by the standard library and each lone surrogate in a string (keys
too) becomes U+FFFD (the replacement character): orjson, which writes every value the proxy
hashes, logs and projects, cannot write a lone surrogate, and a reply and the history that
repeats it must hash the same. This is lossy only for the lone surrogate, which is not a
character; a body that no defense changed is forwarded as the client's raw bytes, escape
included (``proxy.compaction.compactor``), so only a rewritten body carries U+FFFD upstream.

Everything else orjson refuses is still refused the same way: invalid UTF-8 (raw surrogate
bytes included), ``NaN``/``Infinity``, a number beyond a double's range, nesting past orjson's
limit (1024). An integer beyond 64 bits is a float, as orjson makes it. The fallback runs only for
text with such an escape and costs about 4x orjson (0.2 s against 0.05 s for a 5 MB history).
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""After ``json.loads`` every surrogate left in a string is lone: it joins escaped pairs."""

_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
"""orjson's integers (i64 and u64); wider ones it parses as floats."""


def parse_json(data: bytes | bytearray | memoryview | str) -> Any:
    """``data`` (UTF-8 JSON text) as Python values: ``orjson.loads``'s, with lone surrogate escapes
    accepted and replaced by U+FFFD (module docstring). Raises ``orjson.JSONDecodeError`` (a
    ``ValueError``) exactly when orjson does for a reason other than a lone surrogate escape."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "surrogate" not in str(exc):
            raise
        try:
            return _replaced(_stdlib(data))
        except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
            raise exc from None


def _stdlib(data: bytes | bytearray | memoryview | str) -> Any:
    """``json.loads`` held to orjson's rules (module docstring); raises ``ValueError`` otherwise.
    Bytes are decoded strictly: ``json.loads`` itself would let raw surrogate bytes through."""
    text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    return json.loads(text, parse_constant=_refuse, parse_float=_finite, parse_int=_int)


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("number is infinity when parsed as double")
    return value


def _int(text: str) -> int | float:
    value = int(text)
    return value if _INT_MIN <= value <= _INT_MAX else float(value)


def without_lone_surrogates(value: Any) -> Any:
    """``value`` (parsed JSON: dicts, lists, scalars) with every lone surrogate in its strings
    (keys too) replaced by U+FFFD, for a value another parser made (``json.loads`` keeps them);
    the same value when there is none."""
    return _replaced(value)


def _replaced(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys too) replaced by U+FFFD."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_LONE_SURROGATE.sub("\ufffd", k): _replaced(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replaced(v) for v in value]
    return value
