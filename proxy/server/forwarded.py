"""uvicorn's ``X-Forwarded-For``/``X-Forwarded-Proto`` handling, applied by the app where it matters.

``server_options`` turns uvicorn's ``ProxyHeadersMiddleware`` off (``proxy_headers=False``): it was a
coroutine and a scan of the headers on every request. The chat and Messages endpoints read neither
the scope's ``client`` nor its ``scheme``, but Starlette does elsewhere: the router's trailing-slash
redirects (``/ui``, ``/docs/``) and the ``/ui`` files' directory redirects are absolute URLs built
from the scheme and the ``host`` header, and FastAPI's OpenTelemetry spans and metrics name the
scheme (``url.scheme``, and ``server.port`` from it). Behind a TLS-terminating proxy that uvicorn
trusts (a loopback peer by default), those said ``https`` only because of that middleware.
``forwarded_headers`` wraps an ASGI app (``ProxyApp``'s FastAPI path: every route but the chat and
Messages endpoints, and those too when traced) in the same middleware with the trust uvicorn gives
it when ``context-proxy serve`` starts it: ``FORWARDED_ALLOW_IPS``, else uvicorn's default.
Under a uvicorn that rewrote the scope already (its default ``proxy_headers``) it changes nothing:
the client it set is one the trusted list does not name, or the same header gives the same answer.
"""

from __future__ import annotations

import os
from typing import Any, cast

from starlette.types import ASGIApp
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

DEFAULT_FORWARDED_ALLOW_IPS = "127.0.0.1,::1"
"""The addresses whose forwarded headers uvicorn trusts when neither ``forwarded_allow_ips`` nor
``FORWARDED_ALLOW_IPS`` names any (``uvicorn.Config``)."""


def forwarded_headers(app: ASGIApp) -> ASGIApp:
    """``app`` behind uvicorn's ``ProxyHeadersMiddleware`` trusting ``FORWARDED_ALLOW_IPS`` (read
    now), else ``DEFAULT_FORWARDED_ALLOW_IPS``, as ``uvicorn.Config`` does."""
    trusted = os.environ.get("FORWARDED_ALLOW_IPS", DEFAULT_FORWARDED_ALLOW_IPS)
    return cast(ASGIApp, ProxyHeadersMiddleware(cast(Any, app), trusted_hosts=trusted))
