"""proxy/forward/pipeline.py with its BodyMemo, in process: a conversation of big bodies is parsed
by reusing the previous body from its third request on, and what the provider receives and what
the session log holds are the same as with every body parsed whole."""

from __future__ import annotations

from typing import Any

from proxy.forward.pipeline import ChatPipeline
from tests.support.inprocess import FakeProvider

MODEL = "fake-128k-openai"


def history() -> list[dict[str, Any]]:
    """About 80 kB: past ``body_memo.MIN_BODY_BYTES``, far below the model's window."""
    return [{"role": "system", "content": "Be brief."}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} é ] , " + "word " * 150}
        for i in range(100)]


async def conversation(make: Any, provider: FakeProvider, memo: bool) -> tuple[list[bytes], list[Any], int]:
    """Four turns of one session: ``(bodies the provider received, messages logged, bodies reused)``."""
    proxy = await make()
    pipeline: ChatPipeline = proxy.app.state.proxy.pipeline
    if not memo:
        pipeline.body_memo = None  # type: ignore[assignment]  # every body parsed whole
    session = "memo" if memo else "whole"
    messages = history()
    first = len(provider.state.chat_requests)
    for turn in range(4):
        messages = [*messages, {"role": "user", "content": f"question {turn} ✓"}]
        resp = await proxy.chat({"model": MODEL, "messages": messages}, headers={"x-session-id": session})
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-context-proxy-defenses"] == "none"
        messages.append(resp.json()["choices"][0]["message"])
    await proxy.wait_logged(session, requests=4)
    page = (await proxy.http.get(f"/sessions/{session}/messages", params={"limit": 1000})).json()
    logged = [{k: v for k, v in m.items() if k != "created_at"} for m in page["data"]]  # ids: chain hashes
    sent = [r.body for r in provider.state.chat_requests[first:]]
    return sent, logged, pipeline.body_memo.reused if memo else 0


async def test_big_bodies_reuse_the_previous_parse_and_change_nothing(inprocess_factory: Any,
                                                                      fake_provider: FakeProvider) -> None:
    sent, logged, reused = await conversation(inprocess_factory, fake_provider, memo=True)
    sent_whole, logged_whole, _ = await conversation(inprocess_factory, fake_provider, memo=False)
    assert reused == 3  # every body after the first
    assert sent == sent_whole
    assert logged == logged_whole and len(logged) == 101 + 8
