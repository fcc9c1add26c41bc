"""proxy/json_depth.py: orjson's bytes at any depth, the same bytes orjson writes wherever it writes."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
import pytest

from proxy.json_depth import (
    DEEP_BUDGET_CONTAINERS,
    MAX_ORJSON_DEPTH,
    DeepBudget,
    DeepBudgetExceeded,
    deep_budget,
    dumps,
    is_too_deep,
    write_deep,
)
from tests.support.values import nested, nested_text, random_value

DEPTH_ERROR = orjson.JSONEncodeError("Recursion limit reached")


def test_orjson_refuses_past_its_depth_and_says_so() -> None:
    """What ``is_too_deep`` recognizes (a new orjson wording would fail here, not in production)."""
    orjson.dumps(nested(MAX_ORJSON_DEPTH))
    with pytest.raises(orjson.JSONEncodeError) as caught:
        orjson.dumps(nested(MAX_ORJSON_DEPTH + 1))
    assert is_too_deep(caught.value)
    with pytest.raises(orjson.JSONEncodeError) as other:
        orjson.dumps(2**64)
    assert not is_too_deep(other.value) and not is_too_deep(TypeError("Recursion limit reached!"))


@pytest.mark.parametrize("sort_keys", [False, True])
def test_the_fallback_writes_orjson_s_own_bytes_for_every_value_orjson_writes(sort_keys: bool) -> None:
    """With its limit lowered, ``write_deep`` writes the containers above it itself: the bytes are
    orjson's, to the byte (scalars, escapes, floats, key order or sorted keys), at every limit."""
    rng = random.Random(7)
    option = orjson.OPT_SORT_KEYS if sort_keys else None
    for _ in range(2000):
        value = random_value(rng, 6)
        want = orjson.dumps(value, option=option)
        for limit in (0, 1, 2, 4):
            assert write_deep(DEPTH_ERROR, value, sort_keys=sort_keys, limit=limit) == want


def test_a_value_deeper_than_orjson_writes_is_written_whole() -> None:
    deep = {"type": "tool_use", "input": {"z": 1.5, "a": nested(600)}, "id": "toolu_01"}
    text = b'{"type":"tool_use","input":{"z":1.5,"a":' + b"[" * 600 + b"]" * 600 + b'},"id":"toolu_01"}'
    assert dumps(deep) == text
    assert dumps(deep, sort_keys=True) == (
        b'{"id":"toolu_01","input":{"a":' + b"[" * 600 + b"]" * 600 + b',"z":1.5},"type":"tool_use"}')
    assert orjson.loads(text) == deep  # (orjson reads up to 1024)
    assert dumps(nested(100_000)) == b"[" * 100_000 + b"]" * 100_000  # no recursion, at any depth


def test_a_container_held_twice_is_written_twice_and_a_cycle_is_refused() -> None:
    shared: Any = nested(300)
    twice = [{"x": shared}, [[shared]], shared]
    assert orjson.loads(dumps(twice)) == twice
    inner: list[Any] = []
    inner.append([inner])
    with pytest.raises(orjson.JSONEncodeError, match="Recursion limit reached"):
        dumps([nested(300), inner])


def test_any_other_refusal_is_orjson_s() -> None:
    with pytest.raises(orjson.JSONEncodeError, match="64-bit"):
        dumps([nested(300), 2**64])
    with pytest.raises(orjson.JSONEncodeError, match="Dict key must be str"):
        dumps({"a": nested(300), 1: "b"})
    with pytest.raises(orjson.JSONEncodeError, match="64-bit"):
        dumps(2**64)  # (shallow: orjson's own error, as it raised it)


def test_members_orjson_writes_are_written_in_runs_not_one_call_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deep value with many shallow members (``[]`` beside a deep one, a client's body): orjson
    is called per run of members, not per member. Each result of orjson holds a buffer of about
    4 KB however short: one call per ``[]`` made 3 MB of ``[],`` beside a deep member take 4 GB."""
    import proxy.json_depth as json_depth

    calls = 0
    real = orjson.dumps

    def counted(*args: Any, **kwargs: Any) -> bytes:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(json_depth.orjson, "dumps", counted)
    wide: list[Any] = [[] for _ in range(20_000)]
    value = {"a": [*wide, nested(300), *wide, 1, "x"], "b": {str(i): [i] for i in range(20_000)}, "c": nested(300)}
    for sort_keys in (False, True):
        calls = 0
        text = dumps(value, sort_keys=sort_keys)
        assert calls < 200
        monkeypatch.setattr(json_depth.orjson, "dumps", real)
        assert orjson.loads(text) == value
        monkeypatch.setattr(json_depth.orjson, "dumps", counted)


def test_a_budgeted_walk_stops_past_the_budget_having_walked_no_more() -> None:
    """``write_deep`` with a budget raises ``DeepBudgetExceeded`` once it meets more containers than
    the budget has left, before writing anything (``DeepBudget.walked_total`` counts the walk)."""
    value = [nested(300) for _ in range(DEEP_BUDGET_CONTAINERS // 100)]  # 3x the budget
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        error = exc
    budget = DeepBudget(None)
    before = DeepBudget.walked_total
    with pytest.raises(DeepBudgetExceeded):
        write_deep(error, value, budget=budget)
    assert DeepBudget.walked_total - before <= DEEP_BUDGET_CONTAINERS + 1
    small = [nested(300)]
    budget.decided = True  # once the request's hashing is done: a walk at a time
    assert write_deep(error, small, budget=budget) == b"[" + nested_text(300).encode() + b"]"


async def test_each_request_task_has_its_own_budget() -> None:
    """``deep_budget`` is the running task's (one request's), made on first use; outside a task,
    a new one each call (a script's walks do not add up)."""
    async def twice() -> tuple[object, object]:
        return deep_budget(), deep_budget()

    (a1, a2), (b1, _) = await asyncio.gather(asyncio.create_task(twice()), asyncio.create_task(twice()))
    assert a1 is a2 and a1 is not b1
    assert await asyncio.to_thread(deep_budget) is not await asyncio.to_thread(deep_budget)
