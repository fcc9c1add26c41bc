"""A value nested deeper than the recursive helpers go, in ``proxy.conversation``: a summary's
transcript shows it."""

from __future__ import annotations

from proxy.conversation.blocks import render_block
from tests.support.values import nested, nested_text


def test_a_transcript_shows_a_turn_nested_deeper_than_the_stdlib_writes() -> None:
    """A summary's transcript of a tool call nested 3,000 deep: its input as orjson's compact text
    (keys sorted); before, ``json.dumps`` raised ``RecursionError`` and the summary failed. A
    shallow one reads as it did (the stdlib's text)."""
    deep = {"type": "tool_use", "id": "toolu_01", "name": "f", "input": {"b": nested(3000), "a": 1}}
    assert render_block(deep) == '-> tool call f (id toolu_01): {"a":1,"b":' + nested_text(3000) + "}"
    assert render_block({**deep, "input": {"b": [[]], "a": 1}}) == '-> tool call f (id toolu_01): {"a": 1, "b": [[]]}'
