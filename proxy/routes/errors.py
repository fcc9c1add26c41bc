"""The one place an error that left a route unanswered becomes the client's error
(``client_error``): a ``StorageError`` (any database failure) is a 503, anything not ours a 500
without detail. The error tree itself and its rendering are ``proxy/errors.py`` (a leaf the core may
import: it knows nothing of storage)."""

from __future__ import annotations

import logging
from typing import Protocol

from proxy.errors import ProxyError, StorageUnavailableError
from storage.errors import StorageError

log = logging.getLogger("context_proxy.app")  # the logger these lines had before the module split


class DatabaseErrors(Protocol):
    """Counts database errors (``proxy.telemetry.metrics.Metrics`` is one)."""

    def database_error(self, where: str) -> None: ...


def client_error(exc: BaseException, counter: DatabaseErrors) -> ProxyError:
    """The error a client is answered with when serving its request raised ``exc``.

    ``ProxyError``: itself. ``StorageError``: ``StorageUnavailableError`` (503; counted in
    ``counter`` as ``request``, logged by class: the database's own text may quote values and is
    never shown to clients). Anything else: a 500 with no detail (logged with its traceback).
    """
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, StorageError):
        log.error("database error: %s", type(exc).__name__)
        counter.database_error("request")
        return StorageUnavailableError("The proxy's database is unavailable; try again shortly.")
    log.exception("unexpected error", exc_info=exc)
    return ProxyError("The proxy failed to handle this request (internal error).")
