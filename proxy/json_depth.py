"""JSON nested deeper than orjson writes it: the bytes orjson would write, written without recursion.

orjson refuses to write a value nested deeper than ``MAX_ORJSON_DEPTH`` arrays or objects
(``orjson.JSONEncodeError``, ``Recursion limit reached``: ``is_too_deep``), while it reads up to
1024, and a provider may send such a value and accept it back: a tool call's ``input`` nested 500
deep is a reply the log must keep and the next request's history must carry. ``write_deep`` writes
any depth, and writes exactly what orjson writes for every value orjson writes (compact, every
scalar written by orjson itself, keys sorted as ``OPT_SORT_KEYS`` sorts them): a digest or a body
is the same whichever path wrote it.

The hot path stays orjson's: a caller tries ``orjson.dumps`` and calls ``write_deep`` only in its
``except`` (``dumps`` does both, for callers off the hot path). Cost of the fallback: linear in the
value (one pass over its containers for their heights, then every subtree orjson can write is
written by orjson whole, a run of them by one call: only the containers above them are written
here); bounded by the request body's size, as the value is, in memory too (``_members``).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import orjson

MAX_ORJSON_DEPTH = 254
"""The deepest nesting orjson writes (its parser reads up to 1024)."""

_CONTAINERS = (dict, list, tuple)
_KEY = itemgetter(0)


def is_too_deep(exc: BaseException) -> bool:
    """True when ``exc`` is orjson's encoder refusing a value nested deeper than
    ``MAX_ORJSON_DEPTH`` (or a cycle, which it meets as the same limit). ``orjson.JSONEncodeError``
    *is* ``TypeError``: any other ``TypeError`` is another refusal (a lone surrogate, an integer
    beyond 64 bits, a type it does not write)."""
    return exc.__class__ is TypeError and str(exc) == "Recursion limit reached"


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """``orjson.dumps(value)`` (``OPT_SORT_KEYS`` with ``sort_keys``), at any depth: a value
    nested deeper than orjson writes is written by ``write_deep``. Raises what orjson raises for
    anything else (``orjson.JSONEncodeError``)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None)
    except orjson.JSONEncodeError as exc:
        return write_deep(exc, value, sort_keys=sort_keys)


def write_deep(exc: orjson.JSONEncodeError, value: Any, *, sort_keys: bool = False,
               limit: int = MAX_ORJSON_DEPTH) -> bytes:
    """The bytes ``orjson.dumps(value)`` would write had it no depth limit, after it raised
    ``exc`` for ``value``: ``exc`` itself is raised again unless it is the depth limit
    (``is_too_deep``), or when ``value`` holds a cycle. Subtrees at most ``limit`` deep are written
    by orjson (a test lowers it to compare with orjson's own bytes)."""
    if not is_too_deep(exc):
        raise exc
    option = orjson.OPT_SORT_KEYS if sort_keys else None
    heights = _heights(value, exc)
    out: list[bytes] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if item.__class__ is bytes:  # (punctuation, keys and runs pushed below; a value is never ``bytes``)
            out.append(item)
        elif not isinstance(item, _CONTAINERS) or heights[id(item)] <= limit:
            out.append(orjson.dumps(item, option=option))
        else:
            stack.extend(reversed(_members(item, heights, limit, sort_keys, option)))
    return b"".join(out)


def _members(item: Any, heights: dict[int, int], limit: int, sort_keys: bool, option: int | None) -> list[Any]:
    """What ``write_deep`` writes for a container too high for orjson, in order: its brackets, the
    commas, and its members, each run of members low enough to write wrapped (height below
    ``limit``) written by one ``orjson.dumps`` of the run (its brackets cut off: the same bytes as
    each member's, commas between), and any other member as itself (to be written in turn). One
    call per run, not per member: orjson's result holds a buffer of about 4 KB whatever its length
    (a member ``[]`` written alone kept 4 KB: 3 MB of ``[],`` under a deep one took 4 GB)."""
    parts: list[Any] = []
    run: list[Any] = []
    if isinstance(item, dict):
        pairs = sorted(item.items(), key=_KEY) if sort_keys else list(item.items())
        parts.append(b"{")
        for key, child in pairs:
            if not isinstance(key, str):
                raise orjson.JSONEncodeError("Dict key must be str")
            if isinstance(child, _CONTAINERS) and heights[id(child)] >= limit:
                if run:
                    parts.append((b"," if len(parts) > 1 else b"") + orjson.dumps(dict(run), option=option)[1:-1])
                    run = []
                parts.append((b"," if len(parts) > 1 else b"") + orjson.dumps(key) + b":")
                parts.append(child)
            else:
                run.append((key, child))
        if run:
            parts.append((b"," if len(parts) > 1 else b"") + orjson.dumps(dict(run), option=option)[1:-1])
        parts.append(b"}")
        return parts
    parts.append(b"[")
    start = 0  # the first member of the current run
    for i, child in enumerate(item):
        if isinstance(child, _CONTAINERS) and heights[id(child)] >= limit:
            if start < i:
                parts.append((b"," if len(parts) > 1 else b"") + orjson.dumps(list(item[start:i]), option=option)[1:-1])
            if len(parts) > 1:
                parts.append(b",")
            parts.append(child)
            start = i + 1
    if start < len(item):
        parts.append((b"," if len(parts) > 1 else b"") + orjson.dumps(list(item[start:]), option=option)[1:-1])
    parts.append(b"]")
    return parts


def _heights(value: Any, exc: BaseException) -> dict[int, int]:
    """The height of every container in ``value`` (1: one holding no container) by ``id``;
    raises ``exc`` for a cycle. Iterative: the containers in breadth-first order, then their
    heights from the last (a tree's children come after their parent); a container reached twice
    (a value the proxy built, sharing one) may break that order: ``_dag_heights`` then."""
    order = [value] if isinstance(value, _CONTAINERS) else []
    seen = {id(value)}
    i = 0
    while i < len(order):
        node = order[i]
        i += 1
        for child in node.values() if node.__class__ is dict else node:
            if isinstance(child, _CONTAINERS) and id(child) not in seen:
                seen.add(id(child))
                order.append(child)
    heights: dict[int, int] = {}
    try:
        for node in reversed(order):
            height = 0
            for child in node.values() if node.__class__ is dict else node:
                if isinstance(child, _CONTAINERS) and heights[id(child)] > height:
                    height = heights[id(child)]
            heights[id(node)] = height + 1
    except KeyError:
        return _dag_heights(value, exc)
    return heights


def _dag_heights(value: Any, exc: BaseException) -> dict[int, int]:
    """``_heights`` of a value that holds a container more than once, or a cycle (``exc`` raised):
    depth first, a container's height once its children's are known."""
    heights: dict[int, int] = {}
    open_ids: set[int] = set()  # containers whose children are still being measured
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        node, measured = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        if measured:
            heights[id(node)] = 1 + max((heights[id(c)] for c in children if isinstance(c, _CONTAINERS)), default=0)
            open_ids.discard(id(node))
        elif id(node) not in heights:
            if id(node) in open_ids:
                raise exc  # a cycle (orjson met it as its depth limit)
            open_ids.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in children if isinstance(c, _CONTAINERS))
    return heights
