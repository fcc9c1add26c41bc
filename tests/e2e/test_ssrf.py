"""The proxy talks only to its upstream (issue 16, item 6): with ``upstream_url`` without a path,
``/v1%2F@other:port/x`` was sent to ``http://host:port%2F@other:port/x``, whose host is ``other``
(any method, path and body, and the answer relayed). A real second server ("other") listens here
and must get no connection at all, whatever the request target; the upstream gets none of them
either (each is a 400 in OpenAI's envelope), and ordinary paths still reach the upstream."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import orjson
import pytest

from tests.e2e.conftest import Proxy
from tests.e2e.raw_http import RawServer, raw_request, response

OK = response(200, b'{"object": "list", "data": []}')


@pytest.fixture
def servers() -> Iterator[tuple[RawServer, RawServer]]:
    with RawServer(lambda head: OK) as upstream, RawServer(lambda head: OK) as other:
        yield upstream, other


def targets(other: int) -> list[str]:
    at = f"127.0.0.1:{other}"
    return [
        f"/v1%2F@{at}/x",  # the issue's: the decoded path is /v1/@..., the raw one has no /v1/
        f"/v1%2f@{at}/x",
        f"/v1/%2F@{at}/x",
        f"/v1/@{at}/x",
        f"/v1/%40{at}/x",
        f"/v1/x@{at}/x",
        "/v1/files%2Fx",
        "/v1/files%5Cx",
        "/v1/files%5cx",
        "/v1/files\\x",
        "/v1/../admin",
        "/v1/files/../../admin",
        "/v1/%2e%2e/admin",
        "/v1/%2E%2E/%2e%2E/admin",
        "/v1/.%2e/admin",
        "/v1/./models",
        "/v1/%2e/models",
        "/v1/models/..",
        "/v1/..;/admin",  # a dot segment with ;parameters (Tomcat, Jetty: "..")
        "/v1/%2e%2e;/models",
        "/v1/models/..;x=1/..;/admin",
        "/v1/files%252Fx",  # double encoding, for a server behind that decodes once more
        "/v1/%252e%252e/admin",
        "/v1/%252E%252E/%252e%252e/admin",
        "/v1/files%255cx",
        "/v1/models/%00x",
        "/v1/models/%09x",
        "/v1/models/%0d%0aHost:%20evil",
    ]


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_no_request_target_reaches_another_host(proxy_factory: Callable[..., Proxy], servers: tuple[RawServer, RawServer],
                                                method: str) -> None:
    upstream, other = servers
    proxy = proxy_factory(upstream_url=upstream.url)  # no path: the case of the issue
    body = b'{"model": "x"}' if method == "POST" else b""
    for target in targets(other.port):
        status, headers, content = raw_request(proxy.server.port, f"{method} {target} HTTP/1.1\r\nhost: proxy\r\n"
                                                                   "authorization: Bearer sk-client", body)
        # a decoded line break matches no route (404, before the pass-through); everything else: 400
        assert status == (404 if "%0a" in target else 400), (target, status, content[:300])
        if headers.get("content-type", "").startswith("application/json"):
            error = orjson.loads(content)["error"]
            assert error["type"] in ("invalid_request_error", "not_found_error") and error["message"], (target, error)
    assert other.connections == 0 and other.requests == []
    assert upstream.requests == []  # refused by the proxy, never forwarded
    status, _, _ = raw_request(proxy.server.port, f"{method} /v1/models/m%20x HTTP/1.1\r\nhost: proxy\r\n"
                                                  "authorization: Bearer sk-client", body)
    assert status == 200
    assert upstream.requests[-1].startswith(f"{method} /models/m%20x HTTP/1.1\r\n".encode())
    assert other.connections == 0


def test_the_query_stays_as_written_and_the_path_joins_the_base(proxy_factory: Callable[..., Proxy],
                                                               servers: tuple[RawServer, RawServer]) -> None:
    upstream, other = servers
    proxy = proxy_factory(upstream_url=upstream.url + "/api/v1/")  # a path, and a trailing slash
    query = "a=1&b=two%20words&at=@x&slash=%2F&dots=..&plus=x+y"
    status, _, _ = raw_request(proxy.server.port, f"GET /v1/models?{query} HTTP/1.1\r\nhost: proxy\r\n"
                                                  "authorization: Bearer sk-client")
    assert status == 200
    assert upstream.requests[-1].startswith(f"GET /api/v1/models?{query} HTTP/1.1\r\n".encode())
    assert other.connections == 0
