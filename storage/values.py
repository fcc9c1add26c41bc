"""What any value becomes in a column, so that odd input is stored and reads back as written.

Three kinds of value a client (or the upstream) controls could fail a write, and with it the
whole end-of-request transaction (issue 16, item 11):

- **Text with NUL or lone surrogates.** PostgreSQL ``text`` cannot hold U+0000, and no UTF-8
  text can hold a lone surrogate (``"\\ud800"``: SQLite's driver and asyncpg both refuse to
  encode it). ``escape_text`` makes any ``str`` storable, reversibly, on both databases alike:
  a value with none of NUL, ``ESCAPE`` or a surrogate is stored unchanged (one scan); any other
  is stored as ``ESCAPE`` followed by the value with NUL as ``ESCAPE 0``, ``ESCAPE`` as
  ``ESCAPE ESCAPE`` and each surrogate as ``ESCAPE u`` and 4 hex digits. ``unescape_text``
  undoes it for a stored value that starts with ``ESCAPE``; a malformed one reads as the
  literal text it is. Values written before this scheme that hold U+0010 are escaped by
  revision 0004, so they read back, and are found, as written.
- **JSON orjson refuses.** orjson writes NUL as ``\\u0000`` (storable), but refuses integers
  outside [-2^63, 2^64) and lone surrogates. ``dumps_json`` then writes ``JSON_FALLBACK_MARK``
  and the stdlib's JSON (any integer) of the value with every string (keys too) escaped as
  ``escape_text`` escapes it (a ``\\ud800\\udc00`` JSON escape would read back as one
  character, not the two lone surrogates written); ``loads_json`` reads such a value with the
  stdlib and undoes the escapes, so it reads back equal (orjson would read a big integer as a
  float). Integers orjson reads beyond 64 bits come in as floats already: they are stored as
  such floats.
- **JSON nested deeper than orjson writes** (254 arrays or objects; it reads up to 1024): a
  tool call's ``input`` the provider nested 500 deep. ``dumps_json`` then writes
  ``DEEP_JSON_MARK`` and the value as a table of its containers (``_flattened``): every container
  is a row (the value's first), whose container members are written as ``[row]``, so no row is
  nested deeper than two and orjson writes (and reads) the table; ``loads_json`` rebuilds the
  value from it (``_unflattened``): equal, key order kept, at any depth. The table goes through
  ``dumps_json`` itself (its lone surrogates or wide integers as above). Lossless but not the
  value's own JSON text: nothing reads these columns but ``loads_json`` (no SQL looks into them,
  ``storage.columns``), and orjson, the one JSON reader here, reads no deeper than 1024 (a reply
  reassembled from a stream may pass it by the levels around the tool's ``input``). Written
  without recursion, in time and memory linear in the value.
- **Counts beyond the column.** ``clamp_count`` bounds the integers of our records.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import orjson

ESCAPE = "\x10"
"""U+0010 (DLE, "data link escape"): marks an escaped text value (see the module docstring)."""
_NUL_OR_ESCAPE = ("\x00", ESCAPE)
_HEX = "0123456789abcdef"

JSON_FALLBACK_MARK = "#"
"""First character of a JSON value written by the stdlib (``dumps_json``): no JSON text starts with it."""
DEEP_JSON_MARK = "&"
"""First character of a value nested deeper than orjson writes, stored as a table of its containers
(``dumps_json``): no JSON text starts with it either."""

COUNT_MAX = 2**31 - 1
"""Largest value stored in an ``INTEGER`` column (PostgreSQL's is 32-bit): statuses, message
counts and positions, line counts. Larger values are stored as this."""

TOKENS_MAX = 2**40 - 1
"""Largest token count stored (``BIGINT`` columns: ``requests.tokens_*``, ``events.tokens_*``,
``learned_limits.context_window_tokens``): 1.1e12 tokens, far beyond any model's window (a
client's ``max_tokens`` of 3e9 is stored as is; 2^63 as this). Low enough that summing 8 million
such rows stays within SQLite's 64-bit ``SUM`` (which raises on overflow)."""


def escape_text(value: str) -> str:
    """``value`` as stored in a text column: unchanged unless it holds NUL, ``ESCAPE`` or a
    lone surrogate (then escaped: module docstring). Always encodable as UTF-8."""
    if value.isascii():
        if "\x00" not in value and ESCAPE not in value:
            return value
    elif ESCAPE not in value and "\x00" not in value and not _has_surrogate(value):
        return value
    out = [ESCAPE]
    for ch in value:
        if ch == "\x00":
            out.append(ESCAPE + "0")
        elif ch == ESCAPE:
            out.append(ESCAPE + ESCAPE)
        elif "\ud800" <= ch <= "\udfff":
            out.append(f"{ESCAPE}u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def unescape_text(stored: str) -> str:
    """The value ``escape_text`` stored as ``stored``. Never raises: a value that starts with
    ``ESCAPE`` but is not one ``escape_text`` wrote (a malformed escape in it) is literal text,
    returned as it is (revision 0004 escaped every older value holding ``ESCAPE``)."""
    if not stored.startswith(ESCAPE):
        return stored
    try:
        return _unescape(stored)
    except ValueError:
        return stored


def _unescape(stored: str) -> str:
    """``unescape_text`` of a value starting with ``ESCAPE``; ``ValueError`` if ``escape_text``
    cannot have written it (a malformed escape, or none at all: it escapes only values that need one)."""
    out: list[str] = []
    escapes = 0
    i, n = 1, len(stored)
    while i < n:
        ch = stored[i]
        if ch != ESCAPE:
            j = stored.find(ESCAPE, i)
            j = n if j < 0 else j
            out.append(stored[i:j])
            i = j
            continue
        code = stored[i + 1 : i + 2]
        escapes += 1
        if code == "0":
            out.append("\x00")
            i += 2
        elif code == ESCAPE:
            out.append(ESCAPE)
            i += 2
        elif code == "u" and i + 6 <= n and _is_surrogate_hex(stored[i + 2 : i + 6]):
            out.append(chr(int(stored[i + 2 : i + 6], 16)))
            i += 6
        else:
            raise ValueError(f"malformed escape at character {i} of a stored text value")
    if not escapes:
        raise ValueError("a stored text value marked as escaped has no escape")
    return "".join(out)


def _is_surrogate_hex(digits: str) -> bool:
    """4 lowercase hex digits of a surrogate code point (``d800``..``dfff``)."""
    return not digits.strip(_HEX) and "d800" <= digits <= "dfff"


def _has_surrogate(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return True
    return False


def dumps_json(value: Any) -> bytes:
    """``value`` as the UTF-8 JSON a column stores: orjson's, or, for a value orjson refuses
    (an integer beyond 64 bits, a lone surrogate), ``JSON_FALLBACK_MARK`` and the stdlib's, or
    for one nested deeper than orjson writes, ``DEEP_JSON_MARK`` and its table (module
    docstring). Raises ``TypeError`` for a value that is not JSON (neither writer takes it; a
    cycle)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        if str(exc) == "Recursion limit reached":  # (orjson's depth limit, or a cycle: ``_flattened`` tells)
            return DEEP_JSON_MARK.encode() + dumps_json(_flattened(value))
        try:
            text = json.dumps(_strings(value, escape_text), ensure_ascii=True, separators=(",", ":"), allow_nan=False)
        except ValueError as exc:  # (orjson would have written NaN as null: it does not get here)
            raise TypeError(f"not storable as JSON: {exc}") from exc
        return (JSON_FALLBACK_MARK + text).encode()


def loads_json(data: str | bytes) -> Any:
    """The value ``dumps_json`` wrote as ``data``."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        text = data.decode() if isinstance(data, bytes | bytearray | memoryview) else data
        if text.startswith(JSON_FALLBACK_MARK):
            return _strings(json.loads(text[1:]), unescape_text)
        if text.startswith(DEEP_JSON_MARK):
            return _unflattened(loads_json(text[1:]))
        raise


_CONTAINERS = (dict, list, tuple)


def _flattened(value: Any) -> list[Any]:
    """The table ``DEEP_JSON_MARK`` stands for (module docstring): ``value``'s containers as rows,
    depth first, a row's container members as ``[row]`` (a row's index is above its parent's); a
    container met twice is written twice, as JSON would. Raises ``TypeError`` for a cycle."""
    table: list[Any] = [None]
    open_ids: set[int] = set()  # the containers around the one being written
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, row = stack.pop()
        if row < 0:  # (its members all written)
            open_ids.discard(id(node))
            continue
        if id(node) in open_ids:
            raise TypeError("not storable as JSON: a value that holds itself")
        open_ids.add(id(node))
        stack.append((node, -1))
        pairs = node.items() if isinstance(node, dict) else enumerate(node)
        out: dict[Any, Any] | list[Any] = {} if isinstance(node, dict) else [None] * len(node)
        for key, member in pairs:
            if isinstance(member, _CONTAINERS):
                stack.append((member, len(table)))
                out[key] = [len(table)]
                table.append(None)
            else:
                out[key] = member
        table[row] = out
    return table


def _unflattened(table: list[Any]) -> Any:
    """The value ``_flattened`` made ``table`` of: the rows from the last, each ``[row]`` member
    replaced by that row (built already: its index is above)."""
    for row in reversed(table):
        for key, member in list(row.items() if isinstance(row, dict) else enumerate(row)):
            if member.__class__ is list:
                row[key] = table[member[0]]
    return table[0]


def _strings(value: Any, convert: Callable[[str], str]) -> Any:
    """``value`` with ``convert`` applied to every string in it, dict keys included."""
    if isinstance(value, str):
        return convert(value)
    if isinstance(value, dict):
        return {convert(k) if isinstance(k, str) else k: _strings(v, convert) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strings(v, convert) for v in value]
    return value


def clamp_count(value: Any, maximum: int = COUNT_MAX) -> Any:
    """An integer count bounded to ``[-maximum, maximum]``; a float is truncated to an integer
    first (non-finite: ``None``); ``None`` and anything else are returned as they are."""
    if type(value) is int:
        return value if -maximum <= value <= maximum else (maximum if value > 0 else -maximum)
    if isinstance(value, float):
        return clamp_count(int(value), maximum) if math.isfinite(value) else None
    return value


def finite(value: Any, default: float | None = 0.0) -> Any:
    """A float kept if finite, else ``default`` (SQLite stores NaN as NULL); other values as they are."""
    if isinstance(value, float) and not math.isfinite(value):
        return default
    return value
