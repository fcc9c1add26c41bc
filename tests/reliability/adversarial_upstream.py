"""The adversarial harness's upstream side, run as a process of its own (so that the attacks' load
on the harness never shows as the provider's delay):

    python -m tests.reliability.adversarial_upstream      # prints {"upstream": PORT, "other": PORT}

Two uvicorn servers on loopback free ports:

- ``upstream``: the strict fake provider (``tests.fakes.upstream``) behind a wrapper whose
  behaviour is chosen by the request header ``x-adv`` (forwarded by the proxy as a client header):
  ``sink`` (drain the body, answer a minimal completion without parsing it), ``endless`` (an event
  stream that never ends, ``x-adv-seconds`` caps it, default 10), ``noblank`` (one event of
  ``x-adv-bytes`` bytes without a blank line, in pieces of ``x-adv-piece`` bytes), ``slow-<s>`` (wait ``s`` seconds first),
  ``hdrs`` (the operator's account headers on the answer), ``usage-huge`` (usage counts of 2^63+5),
  ``nulrole`` (a NUL in the reply's role); a key starting ``bad-`` gets a 401 in OpenAI's envelope.
- ``other``: a server the proxy must never reach (SSRF); it records and answers
  ``{"other_server": true}``.

Every request either server receives is recorded (method, raw path, headers, body length and its
first 65,536 bytes); ``GET /_adv/records?since=N`` on the upstream port returns records from index N.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from tests.fakes.asgi import finish, read_body, send_bytes, send_json, send_part, start
from tests.fakes.server import UvicornServer
from tests.fakes.upstream import create_fake_upstream

RECORDS: list[dict[str, Any]] = []
_LOCK = threading.Lock()
HEAD_BYTES = 65536


def _record(server: str, scope: Any, body: bytes) -> None:
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
    with _LOCK:
        RECORDS.append({"server": server, "method": scope["method"], "raw_path": scope.get("raw_path", b"").decode("latin-1"),
                        "path": scope["path"], "query": scope.get("query_string", b"").decode("latin-1"),
                        "headers": headers, "body_len": len(body), "body_head": body[:HEAD_BYTES].decode("utf-8", "replace"),
                        "ts": time.time()})


def _replay(body: bytes) -> Callable[[], Awaitable[dict[str, Any]]]:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}
    return receive


def _completion(content: str, role: str = "assistant", usage: dict[str, int] | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-adv", "object": "chat.completion", "created": int(time.time()), "model": "adv",
            "choices": [{"index": 0, "message": {"role": role, "content": content}, "finish_reason": "stop"}],
            "usage": usage or {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
    obj = {"id": "chatcmpl-adv", "object": "chat.completion.chunk", "created": 0, "model": "adv",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


SSE = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}


async def _endless(send: Any, seconds: float) -> None:
    await start(send, 200, SSE)
    piece = _chunk({"content": "y" * 65536})
    await send_part(send, _chunk({"role": "assistant", "content": ""}))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await send_part(send, piece)
    await send_part(send, _chunk({}, "stop") + b"data: [DONE]\n\n")
    await finish(send)


async def _noblank(send: Any, size: int, step: int = 65536) -> None:
    await start(send, 200, SSE)
    await send_part(send, _chunk({"role": "assistant", "content": ""}))
    await send_part(send, b'data: {"id":"chatcmpl-adv","object":"chat.completion.chunk","created":0,"model":"adv",'
                          b'"choices":[{"index":0,"delta":{"content":"')
    for _ in range(size // step):
        await send_part(send, b"z" * step)
    await send_part(send, b'"},"finish_reason":null}]}\n\n' + _chunk({}, "stop") + b"data: [DONE]\n\n")
    await finish(send)


class Wrapper:
    """The fake provider with the ``x-adv`` behaviours in front of it."""

    def __init__(self) -> None:
        self.inner, self.state = create_fake_upstream()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        if scope["path"] == "/_adv/records":
            since = int(parse_qs(scope.get("query_string", b"").decode()).get("since", ["0"])[0])
            with _LOCK:
                data = RECORDS[since:]
            return await send_json(send, 200, {"records": data, "next": since + len(data)}, {})
        body = await read_body(receive)
        _record("upstream", scope, body)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        adv = headers.get("x-adv", "")
        if headers.get("authorization", "").startswith("Bearer bad-"):
            return await send_json(send, 401, {"error": {"message": "Incorrect API key provided.", "type": "invalid_request_error",
                                                         "param": None, "code": "invalid_api_key"}}, {})
        if adv == "sink":
            return await send_json(send, 200, _completion("sunk"), {})
        if adv == "endless":
            return await _endless(send, float(headers.get("x-adv-seconds", "10")))
        if adv == "noblank":
            return await _noblank(send, int(headers.get("x-adv-bytes", str(32 << 20))), int(headers.get("x-adv-piece", "65536")))
        if adv.startswith("slow-"):
            await asyncio.sleep(float(adv.removeprefix("slow-")))
        if adv == "hdrs":
            return await send_json(send, 200, _completion("with operator headers"), {
                "openai-organization": "org-operator-secret", "openai-project": "proj_operator",
                "x-ratelimit-remaining-requests": "4999", "x-ratelimit-limit-tokens": "2000000",
                "set-cookie": "__cf_bm=operator-cookie; path=/"})
        if adv == "usage-huge":
            huge = 2**63 + 5
            return await send_json(send, 200, _completion("huge usage", usage={
                "prompt_tokens": huge, "completion_tokens": huge, "total_tokens": huge}), {})
        if adv == "nulrole":
            return await send_json(send, 200, _completion("nul in role", role="assistant\u0000"), {})
        await self.inner(scope, _replay(body), send)


async def other_server(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = await read_body(receive)
    _record("other", scope, body)
    await send_bytes(send, 200, b'{"other_server": true, "answer": "from the other host"}', {"content-type": "application/json"})


def main() -> None:
    upstream = UvicornServer(Wrapper(), lifespan="off", timeout_keep_alive=30).start()
    other = UvicornServer(other_server, lifespan="off").start()
    print(json.dumps({"upstream": upstream.port, "other": other.port}), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        upstream.stop()
        other.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
