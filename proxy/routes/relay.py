"""Relaying a request untouched: the body (size-limited), the headers (hop-by-hop and the proxy's own
dropped; credentials replaced under a proxy-held key), the answer streamed back byte for byte,
content encoding included. The pass-through and the Anthropic routes use it."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from starlette.responses import StreamingResponse

from proxy.routes.body import read_body
from proxy.upstream.client import Upstream
from proxy.upstream.headers import forward_request_headers, response_headers


async def relay(request: Request, upstream: Upstream, target: str, *, tenant: str, upstream_api_key: str | None,
                key_header: str = "authorization", content: bytes | None = None) -> StreamingResponse:
    """``request`` sent to ``target`` (a path on ``upstream``, percent-encoded, with its query) in
    ``tenant``'s pool share, and the answer as it comes. ``upstream_api_key``: the proxy's key for
    this upstream, sent as ``key_header`` (``proxy.upstream.headers.forward_request_headers``);
    with it the operator's account headers are not passed back. Raises ``PayloadTooLarge`` past
    ``max_body_bytes``, ``ClientDisconnect``, ``ProxyBusy``, ``UpstreamError``. ``content``: the body
    to send instead of the request's (already read)."""
    state = request.app.state.proxy
    body = content if content is not None else await read_body(request, state.settings.max_body_bytes)
    headers = forward_request_headers(request.headers.items(), upstream_api_key=upstream_api_key, identity=False,
                                      key_header=key_header)
    resp = await upstream.send(request.method, target, headers=headers, content=body or None, tenant=tenant)

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.aiter_raw():  # raises ``UpstreamError`` only (the transport maps)
                yield chunk
        finally:
            await resp.aclose()

    return StreamingResponse(chunks(), status_code=resp.status_code, headers=response_headers(
        resp.headers, keep_encoding=True, shared_key=upstream_api_key is not None))
