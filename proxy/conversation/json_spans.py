"""Byte offsets in JSON text that is known valid, found without parsing it all (for ``body_memo``).

Every offset found here is a candidate its caller verifies by parsing (``proxy.conversation.body_memo``).
"""

from __future__ import annotations

import re

import orjson

WS = b" \t\n\r"
"""JSON's whitespace bytes."""
_KEY = re.compile(rb'[ \t\n\r]*("(?:[^"\\]|\\.)*")[ \t\n\r]*:[ \t\n\r]*', re.S)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_SCALAR = re.compile(rb"[^,}\]\s]+")
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.S)
_OPEN = re.compile(rb"[ \t\n\r]*\{")
_NEXT = re.compile(rb"[ \t\n\r]*([,}])")
_WS_RUN = re.compile(rb"[ \t\n\r]*")
MAX_HEAD_STEPS = 8192
"""Members, and strings or brackets inside them, ``messages_start`` steps over before the messages
(in Python: about 4 lines each); past it the body has no start (it is not kept). A tool before the
messages takes 30 to 100."""


def messages_start(raw: bytes) -> int | None:
    """Offset of the ``[`` opening the top-level ``messages`` array of ``raw`` (a JSON object already
    parsed: valid JSON), the members before it skipped; ``None`` when there is none (or its key is
    written with escapes, or more than ``MAX_HEAD_STEPS`` steps away)."""
    m = _OPEN.match(raw)
    if m is None:
        return None
    pos = m.end()
    steps = MAX_HEAD_STEPS
    while True:
        m = _KEY.match(raw, pos)
        if m is None:
            return None
        pos = m.end()
        if m.group(1) == b'"messages"':
            return pos if raw[pos:pos + 1] == b"[" else None
        skipped = _skip_value(raw, pos, steps)
        if skipped is None:
            return None
        pos, steps = skipped
        m = _NEXT.match(raw, pos)
        if m is None or m.group(1) == b"}":
            return None
        pos = m.end()


def _skip_value(raw: bytes, pos: int, steps: int) -> tuple[int, int] | None:
    """The offset just after the JSON value starting at ``pos`` and the steps left of ``steps``
    (one for the value, one for each string or bracket in it); ``None`` when none are left."""
    steps -= 1
    if steps < 0:
        return None
    c = raw[pos:pos + 1]
    if c == b'"':
        m = _STRING.match(raw, pos)
        return (m.end() if m else len(raw)), steps
    if c not in (b"[", b"{"):
        m = _SCALAR.match(raw, pos)
        return (m.end() if m else len(raw)), steps
    depth = 0
    for tok in _TOKEN.finditer(raw, pos):
        steps -= 1
        if steps < 0:
            return None
        t = tok.group()
        if t in (b"[", b"{"):
            depth += 1
        elif t in (b"]", b"}"):
            depth -= 1
            if depth == 0:
                return tok.end(), steps
    return len(raw), steps


def skip_ws(raw: bytes, pos: int, limit: int | None = None) -> int:
    """The first offset at or after ``pos`` that is not JSON whitespace (``len(raw)`` when none),
    looking no further than ``limit`` (returned when the run reaches it)."""
    return _WS_RUN.match(raw, pos, len(raw) if limit is None else limit).end()  # type: ignore[union-attr]  # (``*`` always matches)


def trim_ws(raw: bytes, lo: int, end: int) -> int:
    """The offset just after the last byte of ``raw[lo:end]`` that is not JSON whitespace (``lo``
    when none): a run of any length is stepped over in C (a slice's ``rstrip``), not byte by byte."""
    if end <= lo or raw[end - 1] not in WS:
        return end
    return lo + len(raw[lo:end].rstrip(WS))


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (halving, one C comparison each)."""
    lo, hi = 0, min(len(a), len(b))
    view = memoryview(b)
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if a.startswith(view[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo


def array_close(tail: bytes) -> int | None:
    """Offset in ``tail`` (an array's elements after a ``,``, its ``]``, then more) of that ``]``:
    orjson's error position for the text after the array is a candidate (in characters, or bytes),
    checked by the caller's parse; ``None`` when there is none."""
    doc = b"[" + tail
    try:
        orjson.loads(doc)
    except ValueError as exc:
        pos = getattr(exc, "pos", None)
        if not isinstance(pos, int):
            return None
    else:
        return None
    cands = [pos] if doc.isascii() else [len(doc.decode("utf-8", "replace")[:pos].encode()), pos]
    for at in cands:
        at = trim_ws(doc, 0, min(at, len(doc)))
        if at > 0 and doc[at - 1] == 0x5D:
            return at - 2  # in ``tail``: one byte of ``[`` less, and the index of the ``]``
    return None
