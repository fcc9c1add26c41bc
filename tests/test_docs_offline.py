"""``/docs`` and ``/redoc`` work without internet (issue 20): every script, style sheet and icon the
pages name is served by the proxy itself from the pinned ``fastapi-offline`` package, and the
OpenAPI schema they load documents the read routes (issue 20 item 4)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from proxy.routes.docs import ASSETS_DIR
from tests.support.inprocess import InProcessProxy


class _Urls(HTMLParser):
    """The URLs a page loads: ``<script src>``, ``<link href>``, ``<img src>``."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and (tag, name) in {("script", "src"), ("link", "href"), ("img", "src")}:
                self.urls.append((tag, value))


@pytest.mark.parametrize(("page", "expected"), [
    ("/docs", {"swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"}),
    ("/redoc", {"redoc.standalone.js", "favicon.png"}),
])
async def test_the_pages_load_only_local_assets(inprocess_proxy: InProcessProxy, page: str, expected: set[str]) -> None:
    http = inprocess_proxy.http_client(None)  # the pages need no key, as before
    resp = await http.get(page)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    parser = _Urls()
    parser.feed(resp.text)
    urls = [url for _, url in parser.urls]
    assert urls and all(url.startswith("/docs/assets/") for url in urls), urls
    assert {url.rsplit("/", 1)[1] for url in urls} == expected
    assert not re.search(r"https?://", " ".join(urls)) and "fonts.googleapis" not in resp.text
    for url in urls:
        asset = await http.get(url)
        assert asset.status_code == 200, url
        assert asset.content == (ASSETS_DIR / url.rsplit("/", 1)[1]).read_bytes()
        assert len(asset.content) > 1000
    schema = re.search(r"""(?:url|spec-url)\s*[:=]\s*['"]([^'"]+)['"]""", resp.text)
    assert schema is not None and schema.group(1) == "/openapi.json"
    assert (await http.get(schema.group(1))).status_code == 200


async def test_the_assets_are_what_the_pages_need(inprocess_proxy: InProcessProxy) -> None:
    http = inprocess_proxy.http_client(None)
    js = await http.get("/docs/assets/swagger-ui-bundle.js")
    assert "javascript" in js.headers["content-type"] and b"SwaggerUIBundle" in js.content
    css = await http.get("/docs/assets/swagger-ui.css")
    assert css.headers["content-type"].startswith("text/css") and b".swagger-ui" in css.content
    assert (await http.get("/docs/assets/nothing.js")).status_code == 404


async def test_the_schema_documents_the_read_routes(inprocess_proxy: InProcessProxy) -> None:
    spec = (await inprocess_proxy.http_client(None).get("/openapi.json")).json()
    for path in ("/sessions/{session_id}/branches", "/sessions/{session_id}/artifacts", "/artifacts/{artifact_id}",
                 "/sessions/{session_id}/archive"):
        assert "get" in spec["paths"][path], path
        assert spec["paths"][path]["get"]["summary"], path
    assert not any(p.startswith(("/docs", "/redoc")) for p in spec["paths"])


async def test_the_schema_declares_the_read_routes_bearer_key_and_auth_is_unchanged(
        inprocess_proxy: InProcessProxy) -> None:
    """The read and limits routes declare HTTP bearer security (``/docs`` gets its Authorize button and
    "Try it out" sends the key); health does not. The declaration decides nothing: without a key the
    read API still answers 401 in OpenAI's envelope, and a key in another scheme or header (read as
    ``proxy.routes.auth.client_key`` reads it: this proxy holds no upstream key, so any key is a
    tenant) is still a tenant's key, whose (empty) list is answered, not refused by the schema's bearer."""
    http = inprocess_proxy.http_client(None)
    spec = (await http.get("/openapi.json")).json()
    scheme = spec["components"]["securitySchemes"]["key"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer") and "Bearer KEY" in scheme["description"]
    for path, item in spec["paths"].items():
        for operation in item.values():
            tags = set(operation.get("tags", []))
            if tags & {"read", "limits"}:
                assert operation["security"] == [{"key": []}], path
            elif "health" in tags:
                assert "security" not in operation, path
    keyless = await http.get("/sessions")
    assert keyless.status_code == 401 and keyless.json()["error"]["code"]
    for headers in ({"authorization": "Basic eDp5"}, {"x-api-key": "sk-another-tenant"}):
        other = await http.get("/sessions", headers=headers)
        assert other.status_code == 200 and other.json()["data"] == [], headers
    assert (await inprocess_proxy.http_client().get("/sessions")).status_code == 200
