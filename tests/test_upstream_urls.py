"""proxy/upstream/urls.py and the header filters of proxy/upstream/client.py, from tables (issue 16,
items 6-8); the end-to-end checks with real servers are tests/e2e/test_ssrf.py and
tests/e2e/test_routing_security.py."""

from __future__ import annotations

from typing import Any

import httpx
import pydantic
import pytest

from proxy.errors import BadRequest
from proxy.routes.messages import anthropic_target
from proxy.settings import Settings
from proxy.upstream.headers import forward_request_headers, response_headers
from proxy.upstream.urls import (
    chat_path_variant,
    join,
    passthrough_target,
    upstream_base,
)


@pytest.mark.parametrize("given, normalised", [
    ("https://api.openai.com/v1", "https://api.openai.com/v1"),
    ("HTTPS://API.OpenAI.com/v1/", "https://api.openai.com/v1"),
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
    ("http://[::1]:81/v1//", "http://[::1]:81/v1"),
    ("  http://h/api/v1 ", "http://h/api/v1"),
])
def test_the_upstream_url_is_normalised(given: str, normalised: str) -> None:
    assert str(upstream_base(given)) == normalised
    assert Settings(upstream_url=given).upstream_url == normalised


@pytest.mark.parametrize("bad, says", [
    ("ftp://h/v1", "http:// or https://"), ("api.openai.com/v1", "http:// or https://"), ("/v1", "http:// or https://"),
    ("http:///v1", "no host"), ("http://user:pw@h/v1", "user info"), ("http://key@h/v1", "user info"),
    ("http://h/v1?x=1", "query"), ("http://h/v1#frag", "fragment"), ("http://h/v1?", "query"),
    ("http://h:99999/v1", "not a valid URL"),
])
def test_a_bad_upstream_url_stops_the_start_with_a_clear_error(bad: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        upstream_base(bad)
    with pytest.raises(pydantic.ValidationError, match="upstream_url"):
        Settings(upstream_url=bad)


@pytest.mark.parametrize("base, target, url", [
    ("http://h:81", "/models", "http://h:81/models"),
    ("http://h:81/v1", "/files/a%2Fb%20c?x=%20y&z=1+2", "http://h:81/v1/files/a%2Fb%20c?x=%20y&z=1+2"),
    ("http://h:81/v1", "/x?a=@b&c=%2F", "http://h:81/v1/x?a=@b&c=%2F"),
    ("https://[::1]/v1", "/chat/completions", "https://[::1]/v1/chat/completions"),
])
def test_join_keeps_the_target_as_written_on_the_base(base: str, target: str, url: str) -> None:
    assert str(join(upstream_base(base), target)) == url


@pytest.mark.parametrize("target", ["%2F@other:1/x", "@other/x", "models", "?x=1", ""])
def test_join_refuses_a_target_that_is_not_a_path(target: str) -> None:
    with pytest.raises(BadRequest):
        join(upstream_base("http://h:81"), target)


@pytest.mark.parametrize("raw", [
    "/v1%2F@o:1/x", "/v1/%2F@o:1/x", "/v1/@o/x", "/v1/%40o", "/v1/a%5Cb", "/v1/a%5cb", "/v1/a\\b", "/v1/a%2fb",
    "/v1/..", "/v1/a/../b", "/v1/a#b", "/v1/%2e%2e/b", "/v1/%2E./b", "/v1/./b", "/v1/a/%2e", "/v1/a%00b", "/v1/a%0Db", "/v1x/models", "/v2/x",
    # ``;parameters`` on a dot segment (Tomcat and Jetty read ``..;x`` as ``..``)
    "/v1/..;/x", "/v1/%2e%2e;/models", "/v1/a/..;x=1/b", "/v1/.;/b", "/v1/..%3b/x", "/v1/..%3B/x",
    # double encoding (a server behind that decodes once more): ``%25`` before ``.``, ``/``, ``\``, ``;``
    "/v1/a%252Fb", "/v1/a%252fb", "/v1/%252e%252e/x", "/v1/%252E%252E/x", "/v1/a%255cb", "/v1/a%255Cb",
    "/v1/..%253b/x", "/v1/%25252e%25252e/x",
])
def test_passthrough_paths_that_could_leave_the_upstream_are_refused(raw: str) -> None:
    with pytest.raises(BadRequest):
        passthrough_target(raw, "", "GET")


@pytest.mark.parametrize("raw, query, target", [
    ("/v1/models", "", "/models"),
    ("/v1/files/file-abc/content", "a=%2F&b=..", "/files/file-abc/content?a=%2F&b=.."),
    ("/v1/models/ft:gpt-4o:org:x%20y", "", "/models/ft:gpt-4o:org:x%20y"),
    ("/v1/a.b/c..d/.e", "", "/a.b/c..d/.e"),
    ("/v1/a;b=1/c..;d/%2541", "", "/a;b=1/c..;d/%2541"),  # parameters and an encoded % before anything else
])
def test_ordinary_passthrough_paths_are_kept_as_written(raw: str, query: str, target: str) -> None:
    assert passthrough_target(raw, query, "POST") == target


@pytest.mark.parametrize("path, variant", [
    ("/chat/completions/", True), ("/chat//completions", True), ("//chat/completions", True),
    ("/chat/completions;x=1", True), ("/chat/completions.", True), ("/CHAT/Completions", True),
    ("/chat/completions/chatcmpl-1", False), ("/chat/completions/chatcmpl-1/messages", False),
    ("/completions", False), ("/chat", False), ("/chat/completionsx", False),
])
def test_chat_path_variants(path: str, variant: bool) -> None:
    assert chat_path_variant(path) is variant
    if variant:
        with pytest.raises(BadRequest, match="/v1/chat/completions"):
            passthrough_target("/v1" + path, "", "POST")
        assert passthrough_target("/v1" + path, "", "GET") == path  # stored completions: another call


def test_headers_named_by_connection_are_dropped_both_ways() -> None:
    sent = forward_request_headers([("Connection", "X-A, keep-alive"), ("connection", "x-b"), ("x-a", "1"), ("X-B", "2"),
                                    ("x-c", "3"), ("keep-alive", "timeout=5")], upstream_api_key=None, identity=False)
    assert sent == [("x-c", "3")]
    back = response_headers(httpx.Headers([("connection", "x-a"), ("x-a", "1"), ("x-c", "3")]), keep_encoding=True)
    assert back == {"x-c": "3"}


def test_operator_headers_stay_with_a_shared_key() -> None:
    upstream = httpx.Headers([("openai-organization", "org"), ("openai-project", "p"), ("X-RateLimit-Remaining-Requests", "9"),
                              ("set-cookie", "a=1"), ("set-cookie", "b=2"), ("retry-after", "20"), ("x-request-id", "r")])
    assert response_headers(upstream, keep_encoding=True, shared_key=True) == {"retry-after": "20", "x-request-id": "r"}
    kept = response_headers(upstream, keep_encoding=True, shared_key=False)
    assert kept["set-cookie"] == "a=1, b=2" and kept["openai-organization"] == "org" and kept["x-ratelimit-remaining-requests"] == "9"


def test_serve_with_a_bad_upstream_url_exits_with_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from proxy.cli import app

    monkeypatch.setenv("CONTEXT_PROXY_UPSTREAM_URL", "http://user:secret@h/v1")
    result = CliRunner().invoke(app, ["serve", "--port", "0"])
    assert result.exit_code == 2
    assert "upstream_url" in result.output and "user info" in result.output and "Traceback" not in result.output


def test_a_bad_setting_never_echoes_its_value() -> None:
    """pydantic's errors quote the input by default: a URL with credentials or a key would reach
    whoever reads the error (a log, a crash report). ``hide_input_in_errors`` keeps them out."""
    with pytest.raises(pydantic.ValidationError) as caught:
        Settings(upstream_url="ftp://user:s3cret-pass@example.com/v1", port="not-a-port-s3cret")
    text = str(caught.value)
    assert "upstream_url" in text and "port" in text
    assert "s3cret" not in text


@pytest.mark.parametrize("query", [b"", b"beta=true", b"a=%2F..&b=@#"])
@pytest.mark.parametrize("method", ["POST", "GET"])
def test_the_messages_route_s_target_is_what_the_pass_through_checks_give(query: bytes, method: str) -> None:
    """``anthropic_target`` answers the Messages route itself without the checks; its answer is theirs."""
    scope: dict[str, Any] = {"path": "/v1/messages", "raw_path": b"/v1/messages", "query_string": query}
    expected = "/v1" + passthrough_target("/v1/messages", query.decode("latin-1"), method)
    assert anthropic_target(scope, method) == expected  # type: ignore[arg-type]
    with pytest.raises(BadRequest):  # another spelling still goes through them
        anthropic_target(dict(scope, raw_path=b"/v1/messages/"), "POST")  # type: ignore[arg-type]
