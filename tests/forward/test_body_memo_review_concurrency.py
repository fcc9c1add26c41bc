"""Review of BodyMemo through the app: two branches of one conversation sent at once, both
extending the same kept body, forward and log what whole parses give."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.forward.pipeline import ChatPipeline
from tests.support.inprocess import FakeProvider

MODEL = "fake-128k-openai"


def history() -> list[dict[str, Any]]:
    return [{"role": "system", "content": "Be brief."}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} é ] , " + "word " * 150}
        for i in range(100)]


async def branches(make: Any, provider: FakeProvider, memo: bool) -> tuple[list[bytes], list[list[Any]], int]:
    proxy = await make()
    pipeline: ChatPipeline = proxy.app.state.proxy.pipeline
    if not memo:
        pipeline.body_memo = None  # type: ignore[assignment]
    tag = "m" if memo else "w"
    base = history()
    first = len(provider.state.chat_requests)
    for turn in range(2):  # the memo learns where the first body's messages end
        base = [*base, {"role": "user", "content": f"q{turn}"}]
        resp = await proxy.chat({"model": MODEL, "messages": base}, headers={"x-session-id": f"{tag}-base"})
        assert resp.status_code == 200, resp.text
        base.append(resp.json()["choices"][0]["message"])
    bodies = [{"model": MODEL, "messages": [*base, {"role": "user", "content": f"branch {b}"}], "stream": b == 1}
              for b in range(2)]
    resps = await asyncio.gather(*(proxy.chat(body, headers={"x-session-id": f"{tag}-b{b}"})
                                   for b, body in enumerate(bodies)))
    assert [r.status_code for r in resps] == [200, 200]
    logged = []
    for b in range(2):
        await proxy.wait_logged(f"{tag}-b{b}", requests=1)
        page = (await proxy.http.get(f"/sessions/{tag}-b{b}/messages", params={"limit": 1000})).json()
        logged.append([{k: v for k, v in m.items() if k != "created_at"} for m in page["data"]])
    sent = sorted(r.body for r in provider.state.chat_requests[first:])
    return sent, logged, pipeline.body_memo.reused if memo else 0


async def test_concurrent_branches_reusing_one_kept_body(inprocess_factory: Any, fake_provider: FakeProvider) -> None:
    sent, logged, reused = await branches(inprocess_factory, fake_provider, memo=True)
    sent_whole, logged_whole, _ = await branches(inprocess_factory, fake_provider, memo=False)
    assert reused >= 2
    assert sent == sent_whole
    assert logged == logged_whole
