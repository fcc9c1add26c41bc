"""Review of BodyMemo through the app (in process): bodies whose whole parse the proxy refuses
with its own 400 must get that 400 with the memo too."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.forward.pipeline import ChatPipeline
from tests.support.inprocess import FakeProvider

MODEL = "fake-128k-openai"
SYSTEM = orjson.dumps({"role": "system", "content": "Be brief. " * 8000})  # 80 kB: past MIN_BODY_BYTES


async def post(proxy: Any, raw: bytes, session: str) -> Any:
    return await proxy.http.post("/v1/chat/completions", content=raw,
                                 headers={"content-type": "application/json", "x-session-id": session})


async def test_a_message_hidden_behind_a_second_messages_member_is_checked(
        inprocess_factory: Any, fake_provider: FakeProvider) -> None:
    """The first body's first ``messages`` member is overridden by a second one (JSON's last
    member wins): it is never checked, but the memo keeps it and the next body that extends it
    reuses it unchecked."""
    proxy = await inprocess_factory()
    pipeline: ChatPipeline = proxy.app.state.proxy.pipeline
    model = orjson.dumps(MODEL)
    first = (b'{"model":' + model + b',"messages":[' + SYSTEM + b',1],'
             b'"messages":[{"role":"user","content":"hello"}]}')
    resp = await post(proxy, first, "hidden")
    assert resp.status_code == 200, resp.text
    second = b'{"model":' + model + b',"messages":[' + SYSTEM + b',1,{"role":"user","content":"hi"}]}'
    resp = await post(proxy, second, "hidden")
    pipeline.body_memo = None  # type: ignore[assignment]  # the same body, parsed whole
    whole = await post(proxy, second, "hidden-whole")
    assert whole.status_code == 400
    assert whole.json()["error"]["param"] == "messages[1]"
    assert (resp.status_code, resp.json()) == (whole.status_code, whole.json())


async def test_a_trailing_comma_after_the_kept_messages_is_the_400_of_a_whole_parse(
        inprocess_factory: Any, fake_provider: FakeProvider) -> None:
    proxy = await inprocess_factory()
    pipeline: ChatPipeline = proxy.app.state.proxy.pipeline
    messages: list[Any] = [orjson.loads(SYSTEM), {"role": "user", "content": "one"}]
    first = len(fake_provider.state.chat_requests)
    for turn in range(2):
        resp = await post(proxy, orjson.dumps({"model": MODEL, "messages": messages}), "comma")
        assert resp.status_code == 200, resp.text
        messages = [*messages, resp.json()["choices"][0]["message"], {"role": "user", "content": f"q{turn}"}]
    grown = orjson.dumps({"model": MODEL, "messages": messages})
    resp = await post(proxy, grown, "comma")
    assert resp.status_code == 200 and pipeline.body_memo.reused == 2
    bad = grown[:-2] + b",]}"  # [..., {...},]: not JSON
    resp = await post(proxy, bad, "comma")
    sent = len(fake_provider.state.chat_requests) - first
    pipeline.body_memo = None  # type: ignore[assignment]
    whole = await post(proxy, bad, "comma")
    assert whole.status_code == 400 and "not valid JSON" in whole.json()["error"]["message"]
    assert (resp.status_code, resp.json()) == (whole.status_code, whole.json())
    assert sent == 3  # the invalid body never reached the provider
