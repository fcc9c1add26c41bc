"""Every other path under ``/v1/``: relayed untouched (method, query, headers, body, status, stream).

Nothing here is parsed or logged as chat. The body is streamed to the upstream and the response
streamed back, content encoding included, so what the client gets is byte for byte the upstream's.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import StreamingResponse

from proxy.upstream import forward_request_headers, response_headers, translate

router = APIRouter()

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


async def passthrough(path: str, request: Request) -> StreamingResponse:
    state = request.app.state.proxy
    state.auth.chat_tenant(request.headers)
    body = await request.body()
    headers = forward_request_headers(request.headers.items(), upstream_api_key=state.settings.upstream_api_key, identity=False)
    # The path and query exactly as the client wrote them (percent-encoding kept): httpx would
    # re-encode a ``params`` string (``%20`` -> ``+``) and the decoded ``path`` loses ``%2F``.
    raw_path = request.scope.get("raw_path") or ("/v1/" + path).encode()
    target = raw_path.decode("latin-1").removeprefix("/v1")
    if request.url.query:
        target += "?" + request.url.query
    resp = await state.upstream.send(request.method, target, headers=headers, content=body or None)

    async def relay():
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
        except BaseException as exc:
            raise translate(exc) from exc
        finally:
            await resp.aclose()

    return StreamingResponse(relay(), status_code=resp.status_code, headers=response_headers(resp.headers, keep_encoding=True))


for _method in METHODS:  # one route per method: one shared route gives duplicate OpenAPI operation ids (a warning)
    router.add_api_route(
        "/v1/{path:path}",
        passthrough,
        methods=[_method],
        tags=["openai"],
        summary="Any other OpenAI path (pass-through)",
        operation_id=f"passthrough_{_method.lower()}",
    )
