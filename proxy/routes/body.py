"""Reading a request body with a size limit (the chat route and the pass-through use it)."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import Request
from starlette.requests import ClientDisconnect
from starlette.types import Receive

from proxy.admission import HeldBody
from proxy.errors import PayloadTooLarge


async def read_asgi_body(receive: Receive, headers: Mapping[str, str], limit_bytes: int,
                         held: HeldBody | None = None) -> bytes | None:
    """The whole body from ASGI ``receive`` (``None`` if the client disconnected first); raises
    ``PayloadTooLarge`` (413) past ``limit_bytes`` (declared or read) without reading it all.
    ``held``: the request's share of the app's ``BodyBudget``, each chunk taken from it as it is
    received (raises ``ProxyBusy`` when it does not fit), as ``BodyBudget.hold`` would."""
    declared = headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit_bytes:
        raise _too_large(limit_bytes)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if held is not None and chunk:
            held.take(len(chunk))
        size += len(chunk)
        if size > limit_bytes:
            raise _too_large(limit_bytes)
        if chunk:  # (a client may end with an empty chunk: joining would copy the body again)
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)  # b"" when empty


async def read_body(request: Request, limit_bytes: int) -> bytes:
    """``read_asgi_body`` of a Starlette request; raises ``ClientDisconnect`` if the client left."""
    body = await read_asgi_body(request.receive, request.headers, limit_bytes)
    if body is None:
        raise ClientDisconnect()
    return body


def _too_large(limit_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body is larger than this proxy's limit of {limit_bytes} bytes.")
