"""``proxy.compaction.artifact_sources``: the walk over a request's messages that finds each new
artifact's source message, on hostile shapes (deep nesting, many strings): its work grows with the
message's size, not with size times depth, and nothing deeper than ``MAX_DEPTH`` is looked at."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import proxy.compaction.artifact_sources as artifact_sources
from proxy.compaction.artifact_sources import MAX_DEPTH, source_messages
from proxy.defenses.offload import ArtifactToStore, artifact_id

CHAIN = [f"{i:064x}" for i in range(4)]


def nested(depth: int, inner: Any) -> Any:
    """``inner`` inside ``depth`` lists: at depth ``depth`` of the value returned."""
    for _ in range(depth):
        inner = [inner]
    return inner


def frames_entered(fn: Any, *args: Any) -> int:
    """How many times a frame of ``artifact_sources``' code was entered or resumed (profile ``call``
    events: a generator's resume is one) while ``fn(*args)`` ran: the walk's Python-level work."""
    count = 0

    def hook(frame: FrameType, event: str, _arg: Any) -> None:
        nonlocal count
        if event == "call" and frame.f_code.co_filename == artifact_sources.__file__:
            count += 1

    sys.setprofile(hook)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return count


def test_the_walk_costs_the_message_size_not_size_times_depth() -> None:
    """A client controls its messages' nesting: 2,000 one-character strings at depth MAX_DEPTH (the
    deepest looked at) cost about as much as 2,000 strings at the top (a recursive generator passed each
    string up through one frame per level: 132,069 frames entered here against 8,007 flat)."""
    strings = ["a"] * 2000
    wanted = [ArtifactToStore(artifact_id("b" * 900), "b" * 900, "text/plain")]  # found nowhere: the whole walk
    flat = [{"role": "user", "content": strings}]
    deep = [{"role": "user", "content": nested(MAX_DEPTH - 2, strings)}]  # content: depth 1
    flat_work = frames_entered(source_messages, flat, CHAIN[:1], wanted)
    deep_work = frames_entered(source_messages, deep, CHAIN[:1], wanted)
    assert flat_work >= len(strings), "each string is looked at (the hook sees the walk)"
    assert deep_work <= flat_work + 2 * MAX_DEPTH, (flat_work, deep_work)


def test_content_is_found_down_to_max_depth_and_not_below() -> None:
    text = "an offloaded tool result\n" * 40
    art = [ArtifactToStore(artifact_id(text), text, "text/plain")]
    # the message dict is depth 0, its "content" value depth 1: the text sits at depth 1 + lists
    at_limit = [{"role": "tool", "content": nested(MAX_DEPTH - 1, text)}]
    below = [{"role": "tool", "content": nested(MAX_DEPTH, text)}]
    assert source_messages(at_limit, CHAIN[:1], art) == {art[0].id: CHAIN[0]}
    assert source_messages(below, CHAIN[:1], art) == {}
    # deep nesting in a newer message does not hide the content in an older one
    mixed = [{"role": "tool", "content": text}, {"role": "user", "content": nested(MAX_DEPTH + 50, ["x", text])},
             {"role": "user", "content": [{"type": "text", "text": "next"}, {"k": ["y", {"z": text}]}]}]
    assert source_messages(mixed, CHAIN[:3], art) == {art[0].id: CHAIN[2]}
    assert source_messages(mixed[:2], CHAIN[:2], art) == {art[0].id: CHAIN[0]}
