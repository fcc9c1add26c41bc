"""Routing and headers (issue 16, items 7 and 8).

7. Headers named in a message's ``Connection`` header belong to that one connection (RFC 9110
   section 7.6.1): never forwarded, neither to the upstream nor back to the client. With the
   proxy's own upstream key, the operator's account headers (``openai-organization``,
   ``openai-project``, ``x-ratelimit-*``, ``set-cookie``) stay with the proxy; with the client's
   own key they are the client's and pass.
8. In the default mode, ``POST /v1/chat/completions/``, ``/v1/chat//completions``, ``;x=1`` and
   similar spellings went through the pass-through: unlogged, uncompacted. They are refused
   (400, naming the right path); spellings the server decodes to the chat path itself (``%63``)
   are the chat route, logged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import orjson
import pytest

from tests.e2e.conftest import CLIENT_KEY, Proxy, Upstream, wait_logged
from tests.e2e.raw_http import RawServer, raw_request, response

CHAT_REPLY = orjson.dumps({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
})
UPSTREAM_HEADERS = [("connection", "x-hop, X-Other-Hop"), ("x-hop", "1"), ("x-other-hop", "2"), ("x-request-id", "req_1"),
                    ("openai-organization", "org-operator"), ("openai-project", "proj_operator"),
                    ("x-ratelimit-remaining-requests", "4999"), ("x-ratelimit-limit-tokens", "2000000"),
                    ("set-cookie", "__cf_bm=operator; path=/"), ("openai-processing-ms", "7")]
OPERATOR = ("openai-organization", "openai-project", "x-ratelimit-remaining-requests", "x-ratelimit-limit-tokens", "set-cookie")
CHAT_BODY = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]}'


def request_head(method: str, target: str, key: str = CLIENT_KEY, *extra: str) -> str:
    return "\r\n".join([f"{method} {target} HTTP/1.1", "host: proxy", f"authorization: Bearer {key}",
                        "content-type: application/json", *extra])


# --- 7. hop-by-hop request headers ---------------------------------------------------------------


@pytest.mark.parametrize("target", ["/v1/echo/hop", "/v1/chat/completions"], ids=["pass-through", "chat"])
def test_request_headers_named_by_connection_are_not_forwarded(proxy: Proxy, upstream: Upstream, target: str) -> None:
    status, _, content = raw_request(proxy.server.port, request_head(
        "POST", target, CLIENT_KEY, "connection: X-Hop-One, x-hop-two", "x-hop-one: a", "X-Hop-Two: b", "x-kept: c"), CHAT_BODY)
    assert status == 200, content[:300]
    received = {k.lower() for k in upstream.state.requests[-1].headers}
    assert "x-kept" in received
    assert not {"x-hop-one", "x-hop-two", "connection"} & received, received


# --- 7. hop-by-hop and operator response headers --------------------------------------------------


@pytest.fixture
def raw_upstream() -> Iterator[RawServer]:
    def reply(head: bytes) -> bytes:
        chat = head.startswith(b"POST /v1/chat/completions ")
        return response(200, CHAT_REPLY if chat else b'{"object": "list", "data": []}', UPSTREAM_HEADERS)

    with RawServer(reply) as server:
        yield server


@pytest.mark.parametrize("shared_key", [False, True], ids=["client-key", "shared-key"])
@pytest.mark.parametrize("method, target", [("GET", "/v1/models"), ("POST", "/v1/chat/completions")], ids=["pass-through", "chat"])
def test_response_headers(proxy_factory: Callable[..., Proxy], raw_upstream: RawServer, shared_key: bool,
                          method: str, target: str) -> None:
    settings = {"upstream_api_key": "sk-operator", "client_api_keys": CLIENT_KEY} if shared_key else {}
    proxy = proxy_factory(upstream_url=raw_upstream.url + "/v1", **settings)
    status, headers, content = raw_request(proxy.server.port, request_head(method, target),
                                           CHAT_BODY if method == "POST" else b"")
    assert status == 200, content[:300]
    assert "x-hop" not in headers and "x-other-hop" not in headers  # named by the upstream's Connection header
    assert headers["x-request-id"] == "req_1" and headers["openai-processing-ms"] == "7"
    for name in OPERATOR:
        assert (name in headers) is not shared_key, (name, headers)
    if shared_key:  # and the operator's key went upstream, the client's did not
        assert b"authorization: Bearer sk-operator" in raw_upstream.requests[-1]
        assert CLIENT_KEY.encode() not in raw_upstream.requests[-1]


# --- 8. chat completions spelt another way ------------------------------------------------------

VARIANTS = [
    "/v1/chat/completions/",
    "/v1/chat//completions",
    "/v1//chat/completions",
    "/v1/chat/completions;x=1",
    "/v1/chat;x=1/completions",
    "/v1/chat/completions.",
    "/v1/chat/completions%2e",
    "/v1/chat/completions%20",
    "/v1/Chat/Completions",
    "/v1/chat/COMPLETIONS/",
    "/v1/chat/completion%73/",
    "/v1/chat/completions/?x=1",
]


@pytest.mark.parametrize("target", VARIANTS)
def test_other_spellings_of_the_chat_path_are_refused(proxy: Proxy, upstream: Upstream, target: str) -> None:
    before = len(upstream.state.requests)
    status, headers, content = raw_request(proxy.server.port, request_head("POST", target), CHAT_BODY)
    assert status == 400, (target, status, content[:300])
    assert headers["content-type"].startswith("application/json")
    error = orjson.loads(content)["error"]
    assert error["type"] == "invalid_request_error" and "/v1/chat/completions" in error["message"], error
    assert len(upstream.state.requests) == before  # nothing went upstream unlogged


@pytest.mark.parametrize("target", ["/v1/chat/%63ompletions", "/v1/chat%2Fcompletions"])
def test_spellings_the_server_decodes_to_the_chat_path_are_logged(proxy: Proxy, upstream: Upstream, target: str) -> None:
    session = "spelt-" + target.replace("/", "-").replace("%", "")
    status, _, content = raw_request(proxy.server.port, request_head("POST", target, CLIENT_KEY, f"x-session-id: {session}"),
                                     CHAT_BODY)
    assert status == 200, content[:300]
    assert upstream.state.chat_requests[-1].path == "/v1/chat/completions"
    wait_logged(proxy, session, 1)


def test_stored_completions_still_pass_through(proxy: Proxy, upstream: Upstream) -> None:
    """Only ``POST`` to the chat path is the chat route: ``GET /v1/chat/completions`` (stored
    completions) and ``POST /v1/chat/completions/{id}`` (their metadata) are other calls."""
    for method, target in (("GET", "/v1/chat/completions"), ("POST", "/v1/chat/completions/chatcmpl-1")):
        before = len(upstream.state.requests)
        status, _, content = raw_request(proxy.server.port, request_head(method, target), b"{}" if method == "POST" else b"")
        assert status != 400, (target, content[:300])
        assert len(upstream.state.requests) == before + 1 and upstream.state.requests[-1].path == target
