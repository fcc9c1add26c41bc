"""Sending a pipeline's answer (``Buffered``, ``Streamed``) over ASGI (``send_whole``,
``send_stream``), and the plain ASGI endpoints' shared part (``CountedEndpoint``: the chat and the
Messages routes, reached without FastAPI's layers)."""

from __future__ import annotations

import asyncio
import time

from starlette.types import Receive, Scope, Send

from proxy.admission import BodyBudget, HeldBody
from proxy.forward.answers import Buffered, Streamed
from proxy.telemetry.logs import close_request_context, open_request_context
from proxy.telemetry.metrics import served

STATUS_KEY = "context_proxy.status"
"""Where an endpoint puts the status of the response it starts (in the ASGI scope)."""


class CountedEndpoint:
    """A POST route as plain ASGI (``proxy.routes.chat.ChatEndpoint``, the Messages endpoint), which
    ``ProxyApp`` reaches straight, without FastAPI's layers, through ``counted``. ``path``: the
    route's path, the ``route`` label of its metrics. ``__call__`` puts the status it starts in
    ``scope[STATUS_KEY]``; ``held``: the request's share of the body budget when the endpoint
    counts its body itself (``counted``), ``None`` when ``BodyBudget.hold`` counts it (the router)."""

    path: str = ""

    async def __call__(self, scope: Scope, receive: Receive, send: Send, held: HeldBody | None = None) -> None:
        raise NotImplementedError

    async def counted(self, scope: Scope, receive: Receive, send: Send, budget: BodyBudget) -> None:
        """``self(...)`` with what ``MetricsMiddleware`` adds (a request context, the count and the
        access line), without wrapping ``send``, and what ``budget.hold`` adds (the body's bytes
        held until the request ends), without wrapping ``receive``: the endpoint's body reader
        takes them. The status counted is the one whose response started (500 if none did, as
        the middleware)."""
        started = time.perf_counter()
        fields, token = open_request_context()
        held = HeldBody(budget)
        try:
            await self(scope, receive, send, held)
        finally:
            try:
                served(scope["app"].state["metrics"], "POST", self.path, fields.get("model", ""),
                       scope.get(STATUS_KEY, 500), started)
            finally:
                close_request_context(token)
                held.release()


async def send_outcome(outcome: Buffered | Streamed, receive: Receive, send: Send) -> None:
    """A pipeline's answer: a ``Buffered`` one as ``send_whole`` sends it (its headers encoded and
    its length set in one pass, ``whole_headers``), a ``Streamed`` one by ``send_stream``."""
    if isinstance(outcome, Buffered):
        body = outcome.body
        await send({"type": "http.response.start", "status": outcome.status,
                    "headers": whole_headers(outcome.headers, len(body))})
        await send({"type": "http.response.body", "body": body, "more_body": False})
    else:
        await send_stream(outcome, receive, send)


def encode_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


KNOWN_NAMES: dict[str, bytes] = {name: name.encode() for name in (
    "content-type", "x-request-id", "request-id", "openai-processing-ms", "openai-version", "retry-after",
    "x-context-proxy-session-id", "x-context-proxy-request-id", "x-context-proxy-tokens-client",
    "x-context-proxy-tokens-forwarded", "x-context-proxy-defenses", "x-context-proxy-events",
    "x-context-proxy-overflow-retries", "x-context-proxy-overflow", "x-context-proxy-warning")}
"""Lower-case header names an answer usually carries (the proxy's own, the upstream's common ones)
and their bytes, so ``whole_headers`` does not lower and encode them for each answer (a lower
and an encode were about 1,400 instructions a header, callgrind). Never ``content-length``."""


def whole_headers(headers: dict[str, str], length: int) -> list[tuple[bytes, bytes]]:
    """``encode_headers(headers)`` without any ``content-length`` of its own, then ``length``
    (bytes) as the ``content-length``: the headers ``send_whole`` sends for them (a name in
    ``KNOWN_NAMES`` taken from there)."""
    out = []
    known = KNOWN_NAMES
    for k, v in headers.items():
        name = known.get(k)
        if name is None:
            name = k.lower().encode("latin-1")
            if name == b"content-length":
                continue
        out.append((name, v.encode("latin-1")))
    out.append((b"content-length", b"%d" % length))
    return out


def stream_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """``encode_headers(headers)``, a name in ``KNOWN_NAMES`` taken from there: the headers
    ``send_stream`` sends."""
    known = KNOWN_NAMES
    return [(known.get(k) or k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def send_whole(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [h for h in headers if h[0] != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_stream(outcome: Streamed, receive: Receive, send: Send) -> None:
    """Relay ``outcome.chunks``; a client disconnect cancels the relay (and with it the upstream
    request). ``outcome.close()`` runs however it ends, unless ``outcome.closed()`` says it has
    nothing left to do."""
    task = asyncio.current_task()
    assert task is not None
    disconnected = False

    async def watch() -> None:
        nonlocal disconnected
        while (await receive())["type"] != "http.disconnect":
            pass
        disconnected = True
        task.cancel()

    watcher = task.get_loop().create_task(watch())  # (``asyncio.create_task`` asks for the loop again: a getpid)
    try:
        start = {"type": "http.response.start", "status": outcome.status, "headers": stream_headers(outcome.headers)}
        await send(start)
        async for chunk in outcome.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except asyncio.CancelledError:
        if not disconnected:
            raise  # the server is shutting down: let it
        task.uncancel()
    finally:
        watcher.cancel()
        if outcome.close is not None and (outcome.closed is None or not outcome.closed()):
            # shielded: neither the watcher's late cancel nor a shutdown's stops the cleanup
            # halfway (it logs the request and releases the upstream response)
            try:
                await asyncio.shield(outcome.close())
            except asyncio.CancelledError:
                if not disconnected:
                    raise
                task.uncancel()  # the watcher's cancel, come late: the client is gone, all is done
