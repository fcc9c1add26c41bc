"""The proxy behind a TLS-terminating proxy on the same host (nginx, Envoy: a loopback peer, which
uvicorn trusts by default, ``FORWARDED_ALLOW_IPS``) under a real uvicorn server with
``proxy.server.http_guard.server_options`` (what ``context-proxy serve`` runs): the absolute URLs
Starlette builds from the scope's scheme (the trailing-slash redirects of the router and of the
``/ui`` files) keep the client's ``https``, as they did under uvicorn's ``ProxyHeadersMiddleware``."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.fakes.server import UvicornServer

BEHIND_TLS = {"host": "proxy.example", "x-forwarded-proto": "https", "x-forwarded-for": "203.0.113.9"}
"""What a TLS-terminating proxy in front adds to a request it passes on."""


def _location(server: UvicornServer, path: str, headers: dict[str, str]) -> tuple[int, str | None]:
    r = httpx.get(server.url + path, headers=headers)
    return r.status_code, r.headers.get("location")


def test_behind_a_tls_terminator_the_redirects_keep_https(bounded: Callable[..., UvicornServer]) -> None:
    """``/ui`` (the mount, no slash), ``/docs/`` and ``/metrics/`` (a route, a slash too many) are
    redirected with absolute URLs: ``https`` as the client asked, not the ``http`` of the hop
    from the terminator. Without ``x-forwarded-proto`` they stay ``http``; ``/`` is relative."""
    server = bounded()
    assert _location(server, "/ui", BEHIND_TLS) == (307, "https://proxy.example/ui/")
    assert _location(server, "/docs/", BEHIND_TLS) == (307, "https://proxy.example/docs")
    assert _location(server, "/metrics/", BEHIND_TLS) == (307, "https://proxy.example/metrics")
    assert _location(server, "/", BEHIND_TLS) == (307, "/ui/")
    plain = {"host": "proxy.example"}
    assert _location(server, "/ui", plain) == (307, "http://proxy.example/ui/")


def test_forwarded_headers_are_trusted_only_from_forwarded_allow_ips(
        bounded: Callable[..., UvicornServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """``FORWARDED_ALLOW_IPS`` naming another address: a loopback peer's ``x-forwarded-proto`` is
    ignored, as uvicorn ignores it (a client cannot make the proxy name another scheme)."""
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "192.0.2.1")
    server = bounded()
    assert _location(server, "/ui", BEHIND_TLS) == (307, "http://proxy.example/ui/")
