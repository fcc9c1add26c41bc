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
here); bounded by the request body's size, as the value is, in memory too (``_members``), and for
a request's hashing by ``DEEP_BUDGET_CONTAINERS`` (``deep_budget``; past it the request is
forwarded unlogged: ``DeepBudgetExceeded``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from contextvars import ContextVar
from operator import itemgetter
from typing import Any

import orjson

MAX_ORJSON_DEPTH = 254
"""The deepest nesting orjson writes (its parser reads up to 1024)."""

DEEP_BUDGET_CONTAINERS = 25_000
"""Containers each deep fallback of one request's hashing may walk, all of its messages together:
``messages_codec._hash_value_deep`` (a Messages turn's hash view, for a block deeper than Python
recurses) and the ``write_deep`` of ``canonical._hash_all``/``DigestMemo.digests_and_chain`` (its
digests), each its own account of this many. Measured on the development machine (2 cores, another
test run beside it): about 1.4 us a container for either walk, so 25,000 cost 30-35 ms each (tool
inputs 300-600 deep). A request whose deep content is over it is forwarded unlogged as it came
(``DeepBudgetExceeded``), as before the deep fallbacks existed, having cost at most this many
containers walked. One under it was walked once whole: its later stages (projection, apply, token
counting, storage) walk the same content, each at about the same cost, unbudgeted (the hashing's
own functions, called again on it, are capped one walk at a time: never reached). A reply's hash
view (``messages_codec.reply_view``) spends the request's account too, or its own when the request
had no deep content."""

DEEP_REPLY_ERROR = "the reply is nested too deep to log within the request's budget: logged without its content"
"""The error a reply is logged with when its deep content is past the budget (``messages_codec.reply_view``)."""


class DeepBudgetExceeded(Exception):
    """A request's hashing met more deep content than ``DEEP_BUDGET_CONTAINERS``: the request is
    forwarded unlogged (a reply's hashing: the reply logged without its content)."""


class DeepBudget:
    """One request's accounts of containers walked by the deep fallbacks (``deep_budget``): the
    hash views' (``views``) and the digests'."""

    __slots__ = ("decided", "left", "left_views", "task", "unbounded")

    walked_total = 0
    """Containers walked by every deep fallback of the process (tests read it)."""

    def __init__(self, task: object) -> None:
        self.left = self.left_views = DEEP_BUDGET_CONTAINERS
        self.decided = False
        """The request's hashing finished under budget: its later walks are capped one by one."""
        self.task = task
        self.unbounded = False
        """Walks not capped at all (``messages_codec.round_view``: a round the proxy must serve)."""

    def limit(self, *, views: bool = False) -> int | None:
        """How many containers the next budgeted walk may visit (``None``: any): what is left of
        the request's hashing (of its ``views`` or its digests); once it is decided,
        ``DEEP_BUDGET_CONTAINERS`` a walk (a later walk of content the hashing walked whole, a
        message or a block of it, never meets that)."""
        if self.unbounded:
            return None
        if self.decided:
            return DEEP_BUDGET_CONTAINERS
        return self.left_views if views else self.left

    def spend(self, walked: int, *, views: bool = False) -> None:
        DeepBudget.walked_total += walked
        if self.decided:
            return
        if views:
            self.left_views -= walked
        else:
            self.left -= walked


_BUDGET: ContextVar[DeepBudget | None] = ContextVar("deep_budget", default=None)


def deep_budget() -> DeepBudget:
    """The current request's ``DeepBudget``, made on its first use (only the deep fallbacks' except
    paths call this: nothing is set on an ordinary request). A request is its asyncio task; a
    worker thread hashing for one (``asyncio.to_thread``) sees the task's account in the context it
    was given; code outside any task (a script, a synchronous test) gets a new account each call."""
    try:
        task: object = asyncio.current_task()
    except RuntimeError:  # no event loop in this thread
        task = None
    budget = _BUDGET.get()
    if task is None:  # a worker thread: the task's account when it has one, else one for this call
        return budget if budget is not None and budget.task is not None else DeepBudget(None)
    if budget is None or budget.task is not task:
        budget = DeepBudget(task)
        _BUDGET.set(budget)
    return budget


def budget_fields(body: Mapping[str, Any], hashed: Collection[str]) -> None:
    """Spend the request's budget on its body's fields other than ``hashed`` (its turns, hashed
    already) nested deeper than orjson writes: the tool schemas (token counting writes them
    twice: ``CodecCounter.count_tools``), any other field (``apply``'s body): one walk of their
    containers here, within ``deep_budget()`` (raises ``DeepBudgetExceeded`` past it), so that a
    later stage's walk of them is as bounded as the turns'. One ``orjson.dumps`` a container field
    on the hot path (a 40 KB tool list: 14 us); a field orjson refuses for another reason is left
    to the stages that write it (as before)."""
    budget: DeepBudget | None = None
    for key, value in body.items():
        if key in hashed or not isinstance(value, dict | list):
            continue
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError as exc:
            if not is_too_deep(exc):
                continue
            budget = budget or deep_budget()
            try:
                budget.spend(len(_heights(value, exc, budget.limit())))
            except TypeError:  # (a cycle: none in a parsed body)
                continue


def count_walked(walked: int) -> None:
    """Count containers an unbudgeted deep walk visited (``DeepBudget.walked_total``)."""
    DeepBudget.walked_total += walked

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
               limit: int = MAX_ORJSON_DEPTH, budget: DeepBudget | None = None) -> bytes:
    """The bytes ``orjson.dumps(value)`` would write had it no depth limit, after it raised
    ``exc`` for ``value``: ``exc`` itself is raised again unless it is the depth limit
    (``is_too_deep``), or when ``value`` holds a cycle. Subtrees at most ``limit`` deep are written
    by orjson (a test lowers it to compare with orjson's own bytes). With ``budget``, raises
    ``DeepBudgetExceeded`` once more containers than it has left are met (before any is written)."""
    if not is_too_deep(exc):
        raise exc
    option = orjson.OPT_SORT_KEYS if sort_keys else None
    cap = budget.limit() if budget is not None else None
    heights = _heights(value, exc, cap)
    if budget is not None:
        budget.spend(len(heights))
    else:
        count_walked(len(heights))
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


def _heights(value: Any, exc: BaseException, cap: int | None = None) -> dict[int, int]:
    """The height of every container in ``value`` (1: one holding no container) by ``id``;
    raises ``exc`` for a cycle. Iterative: the containers in breadth-first order, then their
    heights from the last (a tree's children come after their parent); a container reached twice
    (a value the proxy built, sharing one) may break that order: ``_dag_heights`` then. Raises
    ``DeepBudgetExceeded`` past ``cap`` containers (``DeepBudget.walked_total`` counts them)."""
    order = [value] if isinstance(value, _CONTAINERS) else []
    seen = {id(value)}
    i = 0
    while i < len(order):
        if cap is not None and i > cap:
            DeepBudget.walked_total += i
            raise DeepBudgetExceeded(f"more than {cap} deep containers")
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
        return _dag_heights(value, exc, cap)
    return heights


def _dag_heights(value: Any, exc: BaseException, cap: int | None = None) -> dict[int, int]:
    """``_heights`` of a value that holds a container more than once, or a cycle (``exc`` raised):
    depth first, a container's height once its children's are known."""
    heights: dict[int, int] = {}
    open_ids: set[int] = set()  # containers whose children are still being measured
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        if cap is not None and len(heights) > cap:
            DeepBudget.walked_total += len(heights)
            raise DeepBudgetExceeded(f"more than {cap} deep containers")
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
