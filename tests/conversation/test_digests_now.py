"""proxy/conversation/canonical.py: ``digests_now``, the small request's hashing without a coroutine,
is ``digests_off_loop``'s answer; a big request gets ``None`` (it goes to a worker thread)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.conversation import canonical
from proxy.conversation.canonical import digests_and_chain, digests_now, digests_off_loop
from proxy.conversation.digest_memo import DigestMemo
from tests.support.shared import TRACES_DIR


def _trace_histories() -> list[list[dict[str, Any]]]:
    """Growing prefixes of the shared traces (one message a line), as an agent's turns send them."""
    out = []
    for path in sorted(TRACES_DIR.glob("*.jsonl"))[:6] if TRACES_DIR.exists() else []:
        messages = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        out += [messages[:n] for n in range(1, min(len(messages), 60) + 1, 5)]
    return out


async def test_digests_now_answers_what_digests_off_loop_answers() -> None:
    histories = _trace_histories() or [[{"role": "user", "content": f"turn {i}"} for i in range(n)] for n in (1, 3, 9)]
    now_memo, loop_memo = DigestMemo(), DigestMemo()
    for messages in histories:
        size = len(json.dumps(messages))
        fast = digests_now(messages, size, now_memo)
        assert fast is not None  # small: taken
        assert fast == await digests_off_loop(messages, size, loop_memo) == digests_and_chain(messages)
        assert digests_now(messages, size) == fast  # without a memo: hashed whole, the same values


async def test_a_big_request_gets_none_and_the_thread_gives_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    messages = [{"role": "user", "content": f"turn {i}"} for i in range(12)]
    monkeypatch.setattr(canonical, "OFF_LOOP_DIGEST_MESSAGES", 10)
    assert digests_now(messages, 100, DigestMemo()) is None
    assert await digests_off_loop(messages, 100, DigestMemo()) == digests_and_chain(messages)
    monkeypatch.setattr(canonical, "OFF_LOOP_DIGEST_MESSAGES", 1 << 62)
    monkeypatch.setattr(canonical, "OFF_LOOP_DIGEST_BYTES", 100)
    assert digests_now(messages, 100, DigestMemo()) is None
    assert digests_now(messages, 99, DigestMemo()) == digests_and_chain(messages)
