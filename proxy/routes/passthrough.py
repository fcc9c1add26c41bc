"""Every other path under ``/v1/``: relayed untouched (method, query, headers, body, status, stream),
to the OpenAI upstream, or to the Anthropic one for a request with an ``anthropic-version`` header
(``proxy.routes.messages``).

Nothing here is parsed or logged as chat. The body (size-limited like chat bodies) is sent as
received and the response streamed back, content encoding included, so what the client gets is
byte for byte the upstream's. With a proxy-held upstream key, only stateless paths are relayed,
and the operator's account headers are not passed back. A path that could reach another host or
another resource (``@``, encoded slashes, backslashes, dot segments) and a ``POST`` to chat
completions spelt another way (it would skip the log) are refused with a 400
(``proxy.upstream.urls.passthrough_target``).
"""

from __future__ import annotations

import re
from urllib.parse import quote

from fastapi import APIRouter, Request
from starlette.responses import StreamingResponse

from proxy.errors import Forbidden
from proxy.routes.messages import relay_anthropic, speaks_anthropic
from proxy.routes.relay import relay
from proxy.upstream.urls import passthrough_target

router = APIRouter()

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


SHARED_KEY_ALLOWED = (
    ("GET", re.compile(r"/models(/[^/]+)?")),
    ("POST", re.compile(r"/(embeddings|moderations|completions|responses"
                        r"|audio/(speech|transcriptions|translations)|images/(generations|edits|variations))")),
)
"""What a tenant may reach through the proxy's own upstream key: stateless calls only. Paths that
read or change account state (files, batches, stored completions and responses, fine-tuning,
vector stores, …) would let one tenant see another's data under the shared key; they are
refused unless the caller is an admin (or the client sends its own key to the upstream)."""


async def passthrough(path: str, request: Request) -> StreamingResponse:
    """Relay ``/v1/{path}`` to the OpenAI upstream, or to the Anthropic one for a request sent with an
    ``anthropic-version`` header (``proxy.routes.messages.speaks_anthropic``)."""
    if speaks_anthropic(request.url.path, request.headers):
        return await relay_anthropic(request)
    state = request.app.state.proxy
    tenant = state.auth.chat_tenant(request.headers)
    # The path exactly as the client wrote it (percent-encoding kept: the decoded ``path`` loses
    # ``%2F``), the query too (a client library would re-encode it: ``%20`` -> ``+``); checked so
    # that it reaches the configured upstream only (``passthrough_target``, ``Upstream.url``).
    raw_path = request.scope.get("raw_path") or quote("/v1/" + path).encode()  # a server without raw_path
    target = passthrough_target(raw_path.decode("latin-1"), request.url.query, request.method)
    key = state.settings.upstream_api_key
    if key is not None and state.auth.reader(request.headers) is not None and not any(
            request.method == m and rx.fullmatch("/" + path) for m, rx in SHARED_KEY_ALLOWED):
        raise Forbidden(
            f"{request.method} /v1/{path} is not available through this proxy's shared upstream key "
            "(it would reach account-wide state); ask an admin."
        )
    return await relay(request, state.upstream, target, tenant=tenant, upstream_api_key=key)


for _method in METHODS:  # one route per method: one shared route gives duplicate OpenAPI operation ids (a warning)
    router.add_api_route(
        "/v1/{path:path}",
        passthrough,
        methods=[_method],
        tags=["openai"],
        summary="Any other OpenAI path (pass-through)",
        operation_id=f"passthrough_{_method.lower()}",
    )
