"""Minimal ASGI plumbing for the fake upstream: read a body, send JSON, send raw events.

Written against raw ASGI (not a framework) so faults can be exact: a cut stream is a response
that stops without its final empty body message, which uvicorn turns into a closed connection.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def read_body(receive: Receive) -> bytes:
    """The whole request body in bytes."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def header_list(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def start(send: Send, status: int, headers: dict[str, str]) -> None:
    """Send the response status line and headers."""
    await send({"type": "http.response.start", "status": status, "headers": header_list(headers)})


async def send_bytes(send: Send, status: int, body: bytes, headers: dict[str, str]) -> None:
    """A complete response with ``body`` and a content-length."""
    await start(send, status, {**headers, "content-length": str(len(body))})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send: Send, status: int, obj: Any, headers: dict[str, str]) -> None:
    """A complete JSON response."""
    body = json.dumps(obj, separators=(",", ":")).encode()
    await send_bytes(send, status, body, {"content-type": "application/json", **headers})


async def send_part(send: Send, body: bytes) -> None:
    """One more piece of a response body that continues."""
    await send({"type": "http.response.body", "body": body, "more_body": True})


async def finish(send: Send) -> None:
    """End a response body."""
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def decode_headers(scope: Scope) -> list[tuple[str, str]]:
    """Request headers as (lower-case name, value) pairs, in order."""
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])]


class Exchange:
    """One request being answered: its scope, raw body, parsed JSON, record and base headers.

    ``respond_json`` sends a complete JSON answer and fills the record's status and outcome.
    """

    def __init__(self, scope: Scope, send: Send, state: Any, record: Any, raw: bytes,
                 body: Any, request_id: str, fault: tuple[Any, ...] | None) -> None:
        self.scope, self.send, self.state, self.record = scope, send, state, record
        self.raw, self.body, self.request_id, self.fault = raw, body, request_id, fault
        self.headers = {
            "x-request-id": request_id,
            "openai-processing-ms": "42",
            "x-ratelimit-remaining-requests": "9999",
            "x-ratelimit-remaining-tokens": "1999000",
        }

    async def respond_json(self, status: int, obj: Any, outcome: str, headers: dict[str, str] | None = None) -> None:
        self.record.status, self.record.outcome = status, outcome
        await send_json(self.send, status, obj, {**self.headers, **(headers or {})})
