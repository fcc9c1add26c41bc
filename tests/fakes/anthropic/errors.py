"""The fake Anthropic provider's one exception and the API's error envelope.

``ApiError(status, error_type, message)`` is raised by every check (headers, size, body,
context window) and turned into a response once, in ``app.py``. The envelope is the one the
API documents (https://platform.claude.com/docs/en/api/errors, "Error shapes")::

    {"type": "error", "error": {"type": "invalid_request_error", "message": "..."}, "request_id": "req_..."}

Status and type pairs, from the same page: 400 ``invalid_request_error``, 401
``authentication_error``, 403 ``permission_error``, 404 ``not_found_error``, 413
``request_too_large``, 429 ``rate_limit_error``, 500 ``api_error``, 529 ``overloaded_error``.
"""

from __future__ import annotations

from typing import Any

ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    500: "api_error", 529: "overloaded_error",
}
"""The documented error ``type`` of each status."""


class ApiError(Exception):
    """A request the fake refuses: HTTP ``status``, the error ``type`` and its ``message``."""

    def __init__(self, status: int, message: str, error_type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type or ERROR_TYPES.get(status, "api_error")
        self.headers = headers or {}
        """Extra response headers (``retry-after`` of a scripted 429)."""


def invalid(message: str) -> ApiError:
    """A 400 ``invalid_request_error``."""
    return ApiError(400, message)


def error_body(error_type: str, message: str, request_id: str | None) -> dict[str, Any]:
    """The documented error envelope (``request_id`` top-level, as the errors page shows)."""
    body: dict[str, Any] = {"type": "error", "error": {"type": error_type, "message": message}}
    if request_id is not None:
        body["request_id"] = request_id
    return body
