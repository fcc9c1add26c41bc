"""Hashing a message nested deeper than the recursive helpers go (``messages_codec.hash_view``,
orjson's writer in ``canonical.canonical_bytes`` and the digest memo), and proof that every digest
the code gave before is given again: the log's chain hashes are stored, and a changed digest would
split every stored session.

The pins below were computed by the code before the depth fallbacks (``main`` at 02cba45), over
the shared traces (``../shared/traces``: chat messages, hashed as chat does and through Messages'
``hash_view``) and over seeded random messages (``tests.support.values.random_messages``: every
kind of scalar, nested values, nulls and whole floats ``hash_view`` rewrites)."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import pytest

from proxy.conversation import messages_codec
from proxy.conversation.blocks import render_block
from proxy.conversation.canonical import canonical_bytes, digests_and_chain, message_digest
from proxy.conversation.digest_memo import DigestMemo
from proxy.conversation.messages_codec import hash_view
from tests.support.shared import TRACES_DIR, needs_traces
from tests.support.values import nested, nested_text, random_messages, random_value

TRACE_PINS = {  # name: (messages, chat chain pin, hash_view chain pin)
    "mini-swe-agent__django-11099__deepseek-chat.jsonl": (
        86, "2d868a310821f742cf9ef13b05f7cba5e8e8255758055096860b783b60928991",
        "d4611b2cf0bf49f5f761d87775bfd35fabc18e86e06d1e2f82e0c33cff31f216"),
    "mini-swe-agent__django-13964__deepseek-chat.jsonl": (
        333, "aebe326b40d542aab974e80189ee5429fdc36c9c8f8d508eddd22dc7b2a72770",
        "98b6e975243f52edd6634ab7a409ec5df8b97017963047b945f354345dad8342"),
    "mini-swe-agent__sqlfluff-1733__deepseek-chat.jsonl": (
        316, "52cf39b75f4e8b3d9893b0bf27a4450872b2243c54c527daa870f566114daa76",
        "7857ea61515ac210780211d04e062d7e252ae0097df49e1e65dbc2444fdb2fe7"),
    "mini-swe-agent__sqlfluff-1763__deepseek-reasoner.jsonl": (
        208, "e906332d8aa502dac2e7adb2ab71cff763e11e31e0c1aeb2be1a639f365d6a25",
        "fc0c189a3e9d7f1cfd20f5ed8ed26e99ffc15c02703e7340ef4c09bdc30facdc"),
    "openhands__ponyc-4588__llama-4-maverick.jsonl": (
        101, "d18c5a299a717fac0c2fd0b9644f14f8bcc349e51a08c36134f9271c8a49d22f",
        "ed86385a39fd7f6b88029f74b7de4287150be915d20cd7f3fd15ac0f9c6184f7"),
    "openhands__ponyc-4595__llama-4-maverick.jsonl": (
        47, "0d8048dc03a4c26af05bfe92804e7e120ed4657d60374280f3643dafff5fdce3",
        "c7a7064e24a35cac265eb1dc7ae09177429ef3304c47345ea1adfd496889dd73"),
    "swe-agent__ctf-forensics-flash__demo.jsonl": (
        9, "1304559af04587fb409753e77ef115707a666ddc987b40b49145f13911448e79",
        "ff3221d18d0b068b5988223d619a2032b31ae0af2970b2ad83d4161078ba4464"),
    "swe-agent__ctf-rev-rock__demo.jsonl": (
        26, "115dd71ac2e71c16cac4ee9862b5fdb5c4e7fb318af3a931811fa354531e6b5d",
        "c0ff2342470cc4fc38b20558b41f93184f31251019da8c7ba666234154e1a59b"),
    "swe-agent__marshmallow-1867__function-calling.jsonl": (
        24, "b212b04f251070c91a099aca85aab2c26f4ab4a49110e9c8aef79dc4de10d4ad",
        "d7d75280425191925e019d5a08851a67e2f4f7eb1680ee66bcbba2ab5729fd7a"),
    "swe-agent__pydicom-1458__gpt-4.jsonl": (
        27, "742922da2c14c98dda8414288d687b6a24552665f0c4d3512471ca8ca6b0a93a",
        "c92a435a9501eea6854a901b2bc3acf64f90e60fd3fecba08c960e63d96a4ce3"),
    "tau-bench__airline-task13-trial1__gpt-4o.jsonl": (
        28, "f3b56477a807d56b4b23be7d57102e372e479f5efbef1fad425cf55eb290476c",
        "093bc5d8856bb3dffea99a9c2fc2632d03a922d94ff184a757a4ac46ea8966b3"),
    "tau-bench__airline-task2-trial1__gpt-4o.jsonl": (
        62, "ddc982eb79c2413a41bc37c8da1ade6f337bae262e79928634a444e962c1be1b",
        "b13a6b3aff26f79c8eb5d2582035c79e79f895455dbfc4de3fe92deea1ce7280"),
}
RANDOM_PIN = (20261205, 2000, "997508a814ea832ae06214f31d4039a2994033f81a8747bfdf30f0f1fbd36c93",
              "5fe5330bb51e7f5a790168f4492f0e0455c4d38f6a5a8f61b9ac28b1f79b48d3")
"""(seed, messages, chat chain pin, hash_view chain pin) of ``random_messages``."""


def _pin(messages: list[dict[str, Any]], memo: DigestMemo | None = None) -> str:
    """SHA-256 over the chain hashes of ``messages``, one a line."""
    _, chain = memo.digests_and_chain(messages) if memo is not None else digests_and_chain(messages)
    return hashlib.sha256("\n".join(chain).encode()).hexdigest()


@needs_traces
def test_the_traces_hash_as_before() -> None:
    names = sorted(p.name for p in TRACES_DIR.glob("*.jsonl"))
    assert set(TRACE_PINS) <= set(names), "a pinned trace is missing from ../shared/traces"
    memo = DigestMemo()
    for name, (count, chat_pin, view_pin) in TRACE_PINS.items():
        messages = [json.loads(line) for line in (TRACES_DIR / name).read_text().splitlines() if line.strip()]
        assert len(messages) == count, name
        views = [hash_view(m) for m in messages]
        assert _pin(messages) == _pin(messages, memo) == chat_pin, name
        assert _pin(views) == _pin(views, memo) == view_pin, name


def test_random_messages_hash_as_before() -> None:
    seed, count, chat_pin, view_pin = RANDOM_PIN
    messages = random_messages(seed, count)
    views = [hash_view(m) for m in messages]
    assert _pin(messages) == _pin(messages, DigestMemo()) == chat_pin
    assert _pin(views) == _pin(views, DigestMemo()) == view_pin


def test_the_hash_view_without_recursion_is_the_recursive_one() -> None:
    """``_hash_value_deep`` (taken once ``_hash_value`` runs out of stack) gives ``_hash_value``'s
    value: equal, the same object when nothing changes."""
    rng = random.Random(11)
    for _ in range(3000):
        value = random_value(rng, 6)
        want = messages_codec._hash_value(value)
        got = messages_codec._hash_value_deep(value)
        assert got == want and type(got) is type(want) and (got is value) == (want is value)


def _tool_turn(value: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": "f", "input": value,
                                              **extra}]}


def test_a_turn_nested_deeper_than_the_helpers_go_is_hashed_by_the_same_rules() -> None:
    """A tool call's input 600 arrays deep: past ``_hash_value``'s recursion and orjson's writer
    (254). Before, ``hash_view`` raised ``RecursionError`` and ``canonical_bytes``
    ``orjson.JSONEncodeError``; now its digest is the SHA-256 of the canonical bytes orjson would
    write, and ``hash_view``'s rules apply at any depth (a ``null`` left out, a whole float an int:
    the SDK's echo of the reply continues its branch)."""
    sent = _tool_turn({"a": nested(600, {"x": 1.0, "y": None})}, cache_control={"type": "ephemeral"})
    echoed = _tool_turn({"a": nested(600, {"x": 1})}, caller=None)
    view = hash_view(sent)
    assert view == hash_view(echoed) == _tool_turn({"a": nested(600, {"x": 1})})
    text = ('{"content":[{"id":"toolu_01","input":{"a":' + nested_text(600)[:600] + '{"x":1}' + nested_text(600)[600:]
            + '},"name":"f","type":"tool_use"}],"role":"assistant"}')
    assert canonical_bytes(view) == text.encode()
    assert message_digest(view) == hashlib.sha256(text.encode()).hexdigest() == message_digest(hash_view(echoed))


def test_the_memo_gives_a_deep_turn_the_same_digest_and_never_compares_it() -> None:
    """The digest memo hashes a deep turn as ``digests_and_chain`` does, every time (its ``==``
    would recurse as deep: the turn is never reused, the shallow turns around it are)."""
    first = {"role": "user", "content": "hi"}
    history = [first, hash_view(_tool_turn(nested(900))), {"role": "user", "content": "ok"}]
    memo = DigestMemo()
    want = digests_and_chain(history)
    assert memo.digests_and_chain(history) == want
    again = json.loads(json.dumps(history[:1])) + [hash_view(_tool_turn(nested(900)))] + history[2:]
    assert memo.digests_and_chain(again) == want
    assert (memo.hashed, memo.reused) == (4, 2)  # the deep turn hashed again; the shallow ones reused


@pytest.mark.parametrize("depth", [300, 2000])
def test_hashing_a_deep_turn_costs_no_recursion_at_any_depth(depth: int) -> None:
    assert message_digest(hash_view(_tool_turn(nested(depth)))) == hashlib.sha256(
        ('{"content":[{"id":"toolu_01","input":' + nested_text(depth) + ',"name":"f","type":"tool_use"}],'
         '"role":"assistant"}').encode()).hexdigest()


def test_a_transcript_shows_a_turn_nested_deeper_than_the_stdlib_writes() -> None:
    """A summary's transcript of a tool call nested 3,000 deep: its input as orjson's compact text
    (keys sorted); before, ``json.dumps`` raised ``RecursionError`` and the summary failed. A
    shallow one reads as it did (the stdlib's text)."""
    deep = {"type": "tool_use", "id": "toolu_01", "name": "f", "input": {"b": nested(3000), "a": 1}}
    assert render_block(deep) == '-> tool call f (id toolu_01): {"a":1,"b":' + nested_text(3000) + "}"
    assert render_block({**deep, "input": {"b": [[]], "a": 1}}) == '-> tool call f (id toolu_01): {"a": 1, "b": [[]]}'
