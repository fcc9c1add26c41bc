"""proxy/server/header_names.py: uvicorn's response header name check, the proxy's usual names
answered without the regex search, every answer the same as the pattern's."""

from __future__ import annotations

import random
import re
from typing import Any

import httpx
import pytest
from starlette.routing import Route
from uvicorn.protocols.http import httptools_impl

from proxy.routes.answer import KNOWN_NAMES
from proxy.server.header_names import SENT_NAMES, HeaderNameCheck, install_header_name_check
from proxy.server.http_guard import server_options
from proxy.settings import Settings
from tests.fakes.server import UvicornServer

UVICORN_PATTERN = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
"""uvicorn's ``HEADER_RE`` as this uvicorn defines it (the original, whatever was installed)."""


class _Counting:
    """A pattern whose searches are counted (the fast path makes none)."""

    def __init__(self, pattern: re.Pattern[bytes]) -> None:
        self.pattern = pattern
        self.searched: list[Any] = []

    def search(self, name: Any) -> re.Match[bytes] | None:
        self.searched.append(name)
        return self.pattern.search(name)


def _same(found: re.Match[bytes] | None, expected: re.Match[bytes] | None) -> bool:
    if expected is None:
        return found is None
    return found is not None and (found.span(), found.group()) == (expected.span(), expected.group())


def test_the_names_are_valid_and_cover_the_answers_own() -> None:
    assert all(UVICORN_PATTERN.search(name) is None for name in SENT_NAMES)
    assert set(KNOWN_NAMES.values()) <= SENT_NAMES
    assert {b"server", b"date", b"content-length"} <= SENT_NAMES  # uvicorn's own, the length whole_headers adds


def test_search_answers_as_the_pattern_and_skips_it_for_the_usual_names() -> None:
    counting = _Counting(UVICORN_PATTERN)
    check = HeaderNameCheck(counting, SENT_NAMES)  # type: ignore[arg-type]  # (a pattern's ``search``)
    for name in SENT_NAMES:  # the fast path: no search
        assert check.search(bytes(name)) is None
    assert counting.searched == []
    rng = random.Random(21)
    names: list[Any] = [bytes([b]) for b in range(256)]
    names += [b"x-ok" + bytes([b]) + b"-name" for b in range(256)]
    names += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))) for _ in range(500)]
    names += [b"", b"content-type ", b"Content-Type", bytearray(b"content-type"), bytearray(b"bad name")]
    for name in names:
        assert _same(check.search(name), UVICORN_PATTERN.search(name)), name
    assert len(counting.searched) == len(names) - sum(type(n) is bytes and n in SENT_NAMES for n in names)


def test_every_other_attribute_is_the_patterns() -> None:
    """A uvicorn that used another of the pattern's methods gets the pattern's own answers (review:
    an ``AttributeError`` on every response)."""
    check = HeaderNameCheck(UVICORN_PATTERN, SENT_NAMES)
    assert check.pattern is UVICORN_PATTERN
    assert _same(check.match(b"(x"), UVICORN_PATTERN.match(b"(x")) and check.match(b"date") is None
    assert check.flags == UVICORN_PATTERN.flags and check.findall(b"a b") == [b" "]


def test_the_check_copies_and_pickles_as_a_check() -> None:
    """``copy``, ``deepcopy`` and ``pickle`` give a check answering as the original (review:
    ``copy.copy`` and ``pickle`` recursed without end, ``deepcopy`` gave the bare pattern)."""
    import copy
    import pickle

    check = HeaderNameCheck(UVICORN_PATTERN, SENT_NAMES)
    for other in (copy.copy(check), copy.deepcopy(check), pickle.loads(pickle.dumps(check))):
        assert isinstance(other, HeaderNameCheck) and other.names == SENT_NAMES
        assert other.search(b"date") is None and _same(other.search(b"a b"), UVICORN_PATTERN.search(b"a b"))


def test_installed_once_over_uvicorns_pattern_and_never_over_one_refusing_a_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httptools_impl, "HEADER_RE", UVICORN_PATTERN)
    assert install_header_name_check(frozenset({b"bad name"})) is False
    assert httptools_impl.HEADER_RE is UVICORN_PATTERN  # left as it was
    assert install_header_name_check() is True
    installed = httptools_impl.HEADER_RE
    assert isinstance(installed, HeaderNameCheck) and installed.pattern is UVICORN_PATTERN
    assert install_header_name_check() is True and httptools_impl.HEADER_RE is installed  # once


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    name = scope["path"].encode()[1:]  # the header name to answer with: the path
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (name, b"v"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok", "more_body": False})


def _outcomes(url: str) -> list[Any]:
    out: list[Any] = []
    with httpx.Client(base_url=url) as client:
        for name in ("x-context-proxy-defenses", "x-other", "bad:name"):
            try:
                resp = client.get("/" + name)
                out.append((resp.status_code, resp.headers.get(name)))
            except httpx.RemoteProtocolError:  # uvicorn's answer to an invalid name once started: none
                out.append("disconnected")
    return out


def test_the_proxys_server_answers_valid_names_and_refuses_invalid_ones_as_uvicorn_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under uvicorn with ``server_options`` (the check installed): a usual name and another valid
    one answered, an invalid name refused by uvicorn (the connection dropped), as with uvicorn's
    own pattern."""
    server = UvicornServer(_app, **server_options(Settings())).start()
    try:
        installed = httptools_impl.HEADER_RE
        assert isinstance(installed, HeaderNameCheck)
        with_check = _outcomes(server.url)
        assert with_check == [(200, "v"), (200, "v"), "disconnected"]
        monkeypatch.setattr(httptools_impl, "HEADER_RE", installed.pattern)
        assert _outcomes(server.url) == with_check
    finally:
        server.stop()


async def _echo_peer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = f"{scope['client'][0]} {scope['scheme']}".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def test_the_proxys_server_leaves_the_client_address_and_scheme_as_the_socket_s() -> None:
    """Under uvicorn with ``server_options``: a request from loopback (uvicorn's default trusted
    address) naming another client and scheme in ``X-Forwarded-For``/``-Proto`` is seen as the
    socket's, not rewritten by uvicorn (its ``ProxyHeadersMiddleware`` is not paid on every request;
    the app applies it where the scope's scheme is read: the next test); under uvicorn's defaults it
    would be rewritten."""
    forwarded = {"x-forwarded-for": "203.0.113.9", "x-forwarded-proto": "https"}
    seen = []
    for options in (server_options(Settings()), {}):
        server = UvicornServer(_echo_peer, **options).start()
        try:
            seen.append(httpx.get(server.url + "/", headers=forwarded).text)
        finally:
            server.stop()
    assert seen == ["127.0.0.1 http", "203.0.113.9 https"]


async def test_the_app_reads_forwarded_headers_off_the_chat_and_messages_endpoints() -> None:
    """uvicorn's ``X-Forwarded-*`` handling off (``server_options``), the app applies it itself
    (``proxy.server.forwarded``) where Starlette builds URLs from the scope (a route's answer sees
    the forwarded client and scheme, as under uvicorn's defaults); the chat and Messages endpoints,
    which read neither, are reached without it."""
    from proxy.app import create_app

    app = create_app(Settings(upstream_url="http://127.0.0.1:9/v1", database_url="sqlite:///unused.db"))
    seen: dict[str, tuple[str, str]] = {}

    async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen[scope["path"]] = (scope["client"][0], scope["scheme"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def counted(scope: dict[str, Any], receive: Any, send: Any, budget: Any) -> None:
        await echo(scope, receive, send)

    class Echo:  # (an ASGI app: Starlette gives a plain function a request instead)
        __call__ = staticmethod(echo)

    app.router.routes.insert(0, Route("/echo", Echo(), methods=["GET"]))
    app.chat.counted = counted  # type: ignore[method-assign]
    app.messages.counted = counted  # type: ignore[method-assign]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    for method, path in (("GET", "/echo"), ("POST", "/v1/chat/completions"), ("POST", "/v1/messages")):
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
                 "raw_path": path.encode(), "root_path": "", "query_string": b"", "scheme": "http",
                 "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
                 "headers": [(b"host", b"proxy.example"), (b"x-forwarded-proto", b"https"),
                             (b"x-forwarded-for", b"203.0.113.9")]}
        await app(scope, receive, send)
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [204, 204, 204]
    assert seen == {"/echo": ("203.0.113.9", "https"), "/v1/chat/completions": ("127.0.0.1", "http"),
                    "/v1/messages": ("127.0.0.1", "http")}
