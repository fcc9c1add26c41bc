"""The proxy's exception tree and its rendering as OpenAI's error envelope (Anthropic's for an
Anthropic request).

Every error that reaches a client is ``{"error": {"message", "type", "code", "param"}}`` with the
status below, never a stack trace; an Anthropic request (``proxy.routes.messages.speaks_anthropic``)
gets ``{"type": "error", "error": {"type", "message"}}`` (``anthropic_body``). Foreign exceptions
are translated where they occur (``raise ProxyError(...) from exc``): aiohttp's and httpx's inside
the upstream transports (``proxy.upstream.transport``), SQLAlchemy's inside ``storage``
(``storage.errors``). What reaches a route unanswered becomes the client's error in one place,
``proxy.routes.errors.client_error``: a ``StorageError`` a 503 (the only storage-error mapping),
anything else not ours a 500 without detail.

=========================  ======  ==========================
class                      status  type / code
=========================  ======  ==========================
BadRequest                 400     invalid_request_error
Unauthorized               401     authentication_error / invalid_api_key
Forbidden                  403     permission_error / forbidden
NotFound                   404     not_found_error / not_found
PayloadTooLarge            413     invalid_request_error / request_too_large
CannotFit                  400     invalid_request_error / context_length_exceeded
UpstreamError              502     upstream_error (base of the two below; also / unserved_tool_call:
                                   the model called only the proxy's tools and no round can serve them)
UpstreamUnreachable        502     upstream_error / upstream_unreachable
UpstreamTimeout            504     upstream_error / upstream_timeout
StorageUnavailableError    503     service_unavailable / database_unavailable
ProxyBusy                  503     service_unavailable / proxy_busy (+ ``retry-after``)
=========================  ======  ==========================
"""

from __future__ import annotations

from typing import Any

import orjson

ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
"""The ``error.type`` Anthropic's API gives for each status (its errors page, the SDK's ``ErrorType``);
the proxy's own 502 and 503 are ``api_error``. (The SDKs retry by status, not by type: 408, 409, 429
and 5xx.)"""


class ProxyError(Exception):
    """Base of every error the proxy answers itself. ``status`` is the HTTP status to send."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    """Response headers sent with the envelope (lower-case names)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def envelope(self) -> dict[str, Any]:
        """OpenAI's error envelope for this error."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body(self) -> bytes:
        """The envelope as JSON bytes."""
        return orjson.dumps(self.envelope())

    def anthropic_body(self) -> bytes:
        """Anthropic's error envelope for this error, as JSON bytes (the routes of the Messages API
        answer in it): ``{"type": "error", "error": {"type", "message"}}``, the type by status
        (``ANTHROPIC_ERROR_TYPES``; another 4xx ``invalid_request_error``, another 5xx ``api_error``)."""
        kind = ANTHROPIC_ERROR_TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "api_error")
        return orjson.dumps({"type": "error", "error": {"type": kind, "message": self.message}})

    def asgi_headers(self, body: bytes) -> list[tuple[bytes, bytes]]:
        """The response headers for ``body`` (this error's ``body()``) as ASGI sends them:
        ``content-type``, ``content-length``, then ``headers``."""
        out = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        out.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers)
        return out


class BadRequest(ProxyError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class Unauthorized(ProxyError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(ProxyError):
    status = 403
    type = "permission_error"
    code = "forbidden"


class NotFound(ProxyError):
    status = 404
    type = "not_found_error"
    code = "not_found"


class PayloadTooLarge(ProxyError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class CannotFit(ProxyError):
    """The request cannot fit the model's window whatever is compacted (e.g. tool schemas alone)."""

    status = 400
    type = "invalid_request_error"
    code = "context_length_exceeded"


class UpstreamError(ProxyError):
    """The upstream connection failed (what an upstream transport raises, never its library's
    exception): catch this one where any upstream failure is handled alike."""

    status = 502
    type = "upstream_error"
    code = "upstream_unreachable"


class UpstreamUnreachable(UpstreamError):
    """The upstream could not be reached, or closed the connection (mid-body too)."""

    status = 502
    code = "upstream_unreachable"


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer, or stopped sending, within the read timeout."""

    status = 504
    code = "upstream_timeout"


class StorageUnavailableError(ProxyError):
    status = 503
    type = "service_unavailable"
    code = "database_unavailable"


class ProxyBusy(ProxyError):
    """The proxy's own capacity is in use (upstream pool, body budget, connections): retry later.
    ``headers``: what the response carries besides the envelope (``retry-after``, seconds)."""

    status = 503
    type = "service_unavailable"
    code = "proxy_busy"
    headers = (("retry-after", "1"),)
