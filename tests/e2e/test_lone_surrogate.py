"""A reply with a lone surrogate escape (valid JSON text, a model cut mid-emoji) is logged, and the
history that repeats it is forwarded, on SQLite and PostgreSQL (``proxy.json_text``).

orjson refuses ``"\\ud83d"`` without its low half; the proxy used to drop such a reply from the
log (and record a streamed chunk as an error), then answer the resent history with a 400
"not valid JSON" the provider would never give.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.e2e.conftest import Proxy, Upstream, wait_logged

TEXT = b"half an emoji \\ud83d here"
"""As it is on the wire: JSON's escape of a lone high surrogate."""
LOGGED = "half an emoji \ufffd here"
"""What the log keeps (a lone surrogate is not a character; orjson cannot write it)."""

COMPLETION = (b'{"id":"chatcmpl-lone","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,'
              b'"message":{"role":"assistant","content":"' + TEXT + b'","refusal":null},"logprobs":null,"finish_reason":"stop"}],'
              b'"usage":{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}}')
_CHUNK = b'data: {"id":"chatcmpl-lone","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":'
STREAM = [
    _CHUNK + b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n',
    _CHUNK + b'[{"index":0,"delta":{"content":"' + TEXT + b'"},"logprobs":null,"finish_reason":null}]}\n\n',
    _CHUNK + b'[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}\n\n',
    _CHUNK + b'[],"usage":{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}}\n\n',
    b"data: [DONE]\n\n",
]
JSON = {"content-type": "application/json"}


def post(proxy: Proxy, raw: bytes, session: str) -> Any:
    with proxy.http() as http:
        return http.post("/v1/chat/completions", content=raw, headers=JSON | {"x-session-id": session})


def logged(proxy: Proxy, session: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The session's messages and request records, once its first request is logged."""
    wait_logged(proxy, session, 1)
    with proxy.http() as http:
        deadline = time.monotonic() + 10  # the reply is logged after the request record
        while True:
            messages = http.get(f"/sessions/{session}/messages").json()["data"]
            if len(messages) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return messages, http.get(f"/sessions/{session}/requests").json()["data"]


@pytest.mark.parametrize("stream", [False, True])
def test_lone_surrogate_reply_is_logged_and_its_history_forwarded(stream: bool, proxy: Proxy, upstream: Upstream) -> None:
    session = f"lone-{stream}"
    upstream.state.fail_next.append(("sse", STREAM) if stream else ("status", 200, COMPLETION, JSON))
    first = b'{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]' + (b',"stream":true}' if stream else b"}")
    resp = post(proxy, first, session)
    assert resp.status_code == 200
    assert resp.content == (b"".join(STREAM) if stream else COMPLETION)  # relayed as it came

    messages, requests = logged(proxy, session)
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[1]["content"] == LOGGED
    assert requests[0]["finish_reason"] == "stop" and requests[0]["usage"]["total_tokens"] == 14
    assert requests[0]["status"] == 200 and not requests[0].get("error")

    # the client resends the history with the reply as it received it (escape included)
    again = (b'{"model":"gpt-4o","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"' + TEXT
             + b'"},{"role":"user","content":"and then?"}]}')
    resp = post(proxy, again, session)
    assert resp.status_code == 200, resp.text
    assert upstream.state.chat_requests[-1].body == again  # nothing rewritten: the client's bytes
    wait_logged(proxy, session, 2)
    with proxy.http() as http:
        summary = http.get(f"/sessions/{session}").json()
        history = http.get(f"/sessions/{session}/messages").json()["data"]
    assert summary["branch_count"] == 1  # the resent reply is the logged one (same hash)
    assert [m["content"] for m in history[:3]] == ["hi", LOGGED, "and then?"]
