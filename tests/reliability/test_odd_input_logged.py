"""Nothing logged is lost on odd input, through the proxy (issue 16, item 11), on SQLite and
PostgreSQL: a client's ``max_tokens`` of 3,000,000,000 and of 2^63, NUL and a BOM in its messages,
and an upstream reply whose ``role`` holds a NUL and whose usage counts overflow 32 and 63 bits.
Before, each of these rolled back the request's whole log write (the client's messages with it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from tests.e2e.conftest import Proxy, wait_logged
from tests.fakes.server import UvicornServer

ROLE = "assistant\x00"
USAGE = {"prompt_tokens": 2**63, "completion_tokens": 3_000_000_000, "total_tokens": 2**64 - 1}


async def odd_upstream(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    """A chat upstream whose reply's role holds a NUL and whose usage counts are huge."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    reply = {"id": "c", "object": "chat.completion", "created": 1, "model": "gpt-4o",
             "choices": [{"index": 0, "finish_reason": "stop\x00", "message": {"role": ROLE, "content": "hi\x00 there"}}],
             "usage": USAGE}
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": orjson.dumps(reply)})


def test_odd_input_and_reply_are_logged_whole(proxy_factory: Callable[..., Proxy]) -> None:
    """(The client does not echo the NUL role back: the proxy now refuses that as bad input, 400.)"""
    with UvicornServer(odd_upstream) as upstream:
        proxy = proxy_factory(upstream_url=upstream.url + "/v1")
        history: list[dict[str, Any]] = []
        with proxy.http() as http:
            for turn, max_tokens in enumerate([3_000_000_000, 2**63, 2**63 - 1]):
                history.append({"role": "user", "content": f"\ufeffquestion\x00 {turn}"})
                body = {"model": "gpt-4o\ufeff", "messages": history, "max_tokens": max_tokens}
                r = http.post("/v1/chat/completions", headers={"x-session-id": "odd"}, json=body)
                assert r.status_code == 200, r.text
                reply = r.json()["choices"][0]["message"]
                assert reply["role"] == ROLE
                session = wait_logged(proxy, "odd", turn + 1)
            messages = http.get("/sessions/odd/messages").json()["data"]
            requests = http.get("/sessions/odd/requests").json()["data"]
    assert session["message_count"] == 6  # each question and each reply
    assert [{"role": m["role"], "content": m["content"]} for m in messages] == [*history, reply]  # as sent
    assert [r["model"] for r in requests] == ["gpt-4o\ufeff"] * 3
    assert all(r["usage"] == USAGE and r["finish_reason"] == "stop\x00" for r in requests)
