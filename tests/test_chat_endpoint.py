"""proxy/routes/chat.py: one ASGI chat endpoint, documented in the OpenAPI schema without a decoy route."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.routing import Match, Route

from proxy.app import create_app
from proxy.routes.chat import CHAT_ROUTE, ChatEndpoint
from proxy.settings import Settings


def _app():  # type: ignore[no-untyped-def]
    return create_app(Settings(upstream_url="http://127.0.0.1:9/v1", database_url="sqlite:///unused.db"))


def test_the_schema_documents_chat_completions_once() -> None:
    app = _app()
    schema = app.openapi()
    assert list(schema["paths"]).count(CHAT_ROUTE) == 1
    operation = schema["paths"][CHAT_ROUTE]["post"]
    assert operation["operationId"] == "chat_completions" and operation["tags"] == ["openai"]
    assert set(schema["paths"][CHAT_ROUTE]) == {"post"}  # other methods are the pass-through's
    assert "application/json" in operation["requestBody"]["content"]
    assert schema["components"]["schemas"]["Error"]["required"] == ["error"]
    ids = [op["operationId"] for item in schema["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))  # no duplicate operation ids
    assert app.openapi() is schema  # built once


def test_one_route_serves_the_chat_path_and_it_is_the_app_s_endpoint() -> None:
    app = _app()
    chat_routes = [r for r in app.routes if getattr(r, "path", None) == CHAT_ROUTE]
    assert len(chat_routes) == 1
    route = chat_routes[0]
    assert isinstance(route, Route) and route.methods == {"POST"}
    assert isinstance(app.chat, ChatEndpoint) and route.app is app.chat
    for method, served_by_chat in (("POST", True), ("GET", False)):  # GET: the pass-through's
        scope = {"type": "http", "method": method, "path": CHAT_ROUTE, "root_path": "", "headers": []}
        first = next(r for r in app.router.routes if r.matches(scope)[0] == Match.FULL)
        assert (first is route) == served_by_chat


def test_the_schema_is_served_at_openapi_json() -> None:
    from starlette.testclient import TestClient

    with TestClient(_app()) as client:
        schema = client.get("/openapi.json").json()
    assert CHAT_ROUTE in schema["paths"] and "post" in schema["paths"][CHAT_ROUTE]


def test_the_messages_route_is_one_documented_endpoint_of_the_app() -> None:
    from proxy.routes.messages import MESSAGES_ROUTE, MessagesEndpoint

    app = _app()
    schema = app.openapi()
    operation = schema["paths"][MESSAGES_ROUTE]["post"]
    assert operation["operationId"] == "anthropic_messages" and operation["tags"] == ["anthropic"]
    assert set(schema["paths"][MESSAGES_ROUTE]) == {"post"}
    assert operation["responses"]["default"]["content"]["application/json"]["schema"]["required"] == ["type", "error"]
    assert "/v1/messages/count_tokens" in schema["paths"]
    routes = [r for r in app.routes if getattr(r, "path", None) == MESSAGES_ROUTE]
    assert len(routes) == 1 and isinstance(app.messages, MessagesEndpoint) and routes[0].app is app.messages


def test_the_chat_and_messages_endpoints_read_the_app_state_by_key_not_by_attribute(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Starlette's ``State`` finds an attribute through ``__getattr__`` after a failed lookup (an
    ``AttributeError`` raised and caught per read): the two direct endpoints read it by key, on
    their answers and on their error answers (an unreachable upstream: 502)."""
    from starlette.datastructures import State
    from starlette.testclient import TestClient

    reads: list[str] = []
    original = State.__getattr__

    def counted(self: State, key: str):  # type: ignore[no-untyped-def]
        reads.append(key)
        return original(self, key)

    with TestClient(_app()) as client:
        monkeypatch.setattr(State, "__getattr__", counted)
        chat = client.post(CHAT_ROUTE, json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        messages = client.post("/v1/messages", json={"model": "m", "max_tokens": 8,
                                                     "messages": [{"role": "user", "content": "hi"}]},
                               headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
        monkeypatch.setattr(State, "__getattr__", original)
    assert chat.status_code == 502 and messages.status_code == 502, (chat.text, messages.text)
    assert messages.json()["type"] == "error"  # Anthropic's envelope
    assert reads == []


async def test_a_buffered_answer_is_sent_as_send_whole_sends_its_encoded_headers() -> None:
    """``send_outcome`` encodes a ``Buffered`` answer's headers and sets its length in one pass
    (``whole_headers``): the same messages as ``send_whole`` of ``encode_headers``, whatever case
    or ``content-length`` of its own the headers carry."""
    from proxy.forward.answers import Buffered
    from proxy.routes.answer import encode_headers, send_outcome, send_whole

    cases = [{}, {"content-type": "application/json", "x-context-proxy-defenses": "none"},
             {"Content-Type": "text/plain", "Content-Length": "3", "x-é": "café"},
             {"content-length": "999", "x-request-id": "req_1", "X-RateLimit-Remaining": "5"}]
    for headers in cases:
        for body in (b"", b'{"ok": true}', b"x" * 70_000):
            slow, fast = _Sent(), _Sent()
            await send_whole(slow, 201, encode_headers(headers), body)  # type: ignore[arg-type]
            await send_outcome(Buffered(201, dict(headers), body), None, fast)  # type: ignore[arg-type]
            assert fast == slow, headers
            assert fast[0]["headers"][-1] == (b"content-length", str(len(body)).encode())


async def test_whole_headers_takes_known_names_from_its_table_and_sends_what_encoding_them_sends() -> None:
    """``whole_headers`` takes a name of ``KNOWN_NAMES`` from the table (the fast path: the very
    bytes object there) and lowers and encodes any other: the same messages as ``send_whole`` of
    ``encode_headers`` either way, a known name in another case or a ``content-length`` included."""
    from proxy.forward.answers import Buffered
    from proxy.routes.answer import KNOWN_NAMES, encode_headers, send_outcome, send_whole, whole_headers

    assert all(raw == name.lower().encode("latin-1") and name == name.lower() for name, raw in KNOWN_NAMES.items())
    assert "content-length" not in KNOWN_NAMES
    known = {name: f"v{i}" for i, name in enumerate(KNOWN_NAMES)}
    cases = [known, {"Content-Type": "application/json", "X-Context-Proxy-Session-Id": "sess_é", "content-length": "1"},
             {**known, "Content-Length": "7", "x-other": "café"}]
    for headers in cases:
        slow, fast = _Sent(), _Sent()
        await send_whole(slow, 200, encode_headers(headers), b"{}")  # type: ignore[arg-type]
        await send_outcome(Buffered(200, dict(headers), b"{}"), None, fast)  # type: ignore[arg-type]
        assert fast == slow, headers
    taken = whole_headers(known, 2)
    assert all(name is KNOWN_NAMES[text] for (name, _), text in zip(taken, known, strict=False))  # from the table


async def test_a_streamed_answer_s_headers_are_encoded_as_encode_headers_encodes_them() -> None:
    """``send_stream`` sends ``stream_headers``: a name of ``KNOWN_NAMES`` from the table (the very
    bytes object there), any other lowered and encoded: what ``encode_headers`` gives either way."""
    from proxy.forward.answers import Streamed
    from proxy.routes.answer import KNOWN_NAMES, encode_headers, send_outcome, stream_headers

    known = {name: f"v{i}" for i, name in enumerate(KNOWN_NAMES)}
    cases = [{}, known, {"Content-Type": "text/event-stream", "X-Context-Proxy-Session-Id": "sess_é", "x-other": "café"}]
    for headers in cases:
        assert stream_headers(headers) == encode_headers(headers), headers

        async def chunks() -> AsyncIterator[bytes]:
            yield b"data: [DONE]\n\n"

        async def receive() -> dict[str, str]:
            await asyncio.sleep(3600)  # (the client stays)
            return {"type": "http.disconnect"}

        sent = _Sent()
        await send_outcome(Streamed(200, dict(headers), chunks(), None), receive, sent)  # type: ignore[arg-type]
        assert sent[0] == {"type": "http.response.start", "status": 200, "headers": encode_headers(headers)}
        assert [m["body"] for m in sent[1:]] == [b"data: [DONE]\n\n", b""]
    taken = stream_headers(known)
    assert all(name is KNOWN_NAMES[text] for (name, _), text in zip(taken, known, strict=True))  # from the table


class _Sent(list):  # type: ignore[type-arg]
    """An ASGI ``send`` keeping what it is sent."""

    async def __call__(self, message: dict) -> None:  # type: ignore[type-arg]
        self.append(message)
