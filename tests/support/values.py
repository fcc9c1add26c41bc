"""JSON values for the tests of depth and hashing: ``nested(n)`` (arrays ``n`` deep, built without
recursion), ``nested_text(n)`` (its JSON text), ``same(a, b)`` (``==`` with key order and types,
without recursion), and seeded random values and messages whose stream of values is fixed by the seed (``tests/conversation/test_deep_values.py`` pins the
digests the code before the depth fallbacks gave them)."""

from __future__ import annotations

import random
from typing import Any

_LEAVES: list[Any] = [None, True, False, 0, 1, -7, 2**53, 2**63, 1.0, -2.0, 0.5, 1e16, 1e-7, -0.0, 3.0e300,
                      "", "text", "é ü 😀", 'quote " back \\ slash', "ctl \x00\x1f\n\t", "\u2028"]
_KEYS = ["type", "text", "input", "a", "B", "é", "😀", "", "id", "z" * 3]


def nested(depth: int, leaf: Any = None) -> Any:
    """``[[...[]...]]``: ``depth`` arrays, the innermost empty (or holding ``leaf``)."""
    value: Any = [] if leaf is None else [leaf]
    for _ in range(depth - 1):
        value = [value]
    return value


def nested_text(depth: int) -> str:
    """The JSON text of ``nested(depth)``."""
    return "[" * depth + "]" * depth


def same(a: Any, b: Any) -> bool:
    """``a == b`` for JSON values at any depth (``==`` recurses, as deep as they nest), objects'
    key order and every scalar's type included."""
    pairs = [(a, b)]
    while pairs:
        x, y = pairs.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            if list(x) != list(y):
                return False
            pairs.extend(zip(x.values(), y.values(), strict=True))
        elif isinstance(x, list):
            if len(x) != len(y):
                return False
            pairs.extend(zip(x, y, strict=True))
        elif x != y:
            return False
    return True


def random_value(rng: random.Random, depth: int) -> Any:
    """A JSON value at most ``depth`` containers deep: scalars of every kind orjson writes (whole
    floats, ``-0.0``, escapes, astral characters), arrays and objects."""
    roll = rng.random()
    if depth <= 0 or roll < 0.35:
        return rng.choice(_LEAVES)
    if roll < 0.65:
        return [random_value(rng, depth - 1) for _ in range(rng.randrange(4))]
    return {rng.choice(_KEYS) + str(i): random_value(rng, depth - 1) for i in range(rng.randrange(4))}


def random_messages(seed: int, count: int) -> list[dict[str, Any]]:
    """``count`` messages of any role: a ``None``, empty, text or block content (a marked text
    block, a tool call with a random ``input``), sometimes an ``extra`` field of a random value."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(count):
        role = rng.choice(["user", "assistant", "tool", "system"])
        content: Any = rng.choice([None, "", f"turn {i}", [
            {"type": "text", "text": f"t{i}", "cache_control": {"type": "ephemeral"}},
            {"type": "tool_use", "id": f"c{i}", "name": "f", "input": random_value(rng, 6)}]])
        message: dict[str, Any] = {"role": role, "content": content}
        if rng.random() < 0.3:
            message["extra"] = random_value(rng, 6)
        out.append(message)
    return out
