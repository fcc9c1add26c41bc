"""The read API's ``leaf`` and message ``after`` parameters are bounded (``LEAF_CHARS``; a chain
hash is 64 hex digits): a longer one is a 400 in OpenAI's error envelope on every route taking
it, and a client value an error repeats is cut (``ECHO_CHARS``)."""

from __future__ import annotations

from proxy.routes.read_scope import ECHO_CHARS, LEAF_CHARS
from tests.support.inprocess import InProcessProxy


async def one_turn(proxy: InProcessProxy) -> None:
    proxy.provider.state.script.append({"role": "assistant", "content": "the needle is in hay"})
    r = await proxy.chat({"model": "gpt-4o", "messages": [{"role": "user", "content": "needle?"}]},
                         headers={"x-session-id": "doc"})
    assert r.status_code == 200, r.text
    await proxy.wait_logged("doc", requests=1)


def is_openai_error(body: dict, kind: str) -> dict:
    error = body["error"]
    assert set(body) == {"error"} and error["type"] == kind, body
    return error


async def test_a_too_long_leaf_or_after_is_a_400_in_the_api_envelope(inprocess_proxy: InProcessProxy) -> None:
    await one_turn(inprocess_proxy)
    http = inprocess_proxy.http
    long = "a" * (LEAF_CHARS + 1)
    asks = [("/sessions/doc/messages", {"leaf": long}), ("/sessions/doc/messages", {"after": long}),
            ("/sessions/doc/archive", {"leaf": long}), ("/sessions/doc/archive/search", {"q": "x", "leaf": long})]
    for path, params in asks:
        resp = await http.get(path, params=params)
        assert resp.status_code == 400, (path, params, resp.text)
        error = is_openai_error(resp.json(), "invalid_request_error")
        assert error["param"] == f"query.{next(iter(params.keys() - {'q'}))}"
        assert long not in error["message"]
    # at the bound, an unknown leaf is a 404 that repeats it cut short
    at_bound = "b" * LEAF_CHARS
    for path, params in asks:
        name = next(iter(params.keys() - {"q"}))
        resp = await http.get(path, params={**params, name: at_bound})
        assert resp.status_code in (400, 404), resp.text
        error = is_openai_error(resp.json(), "invalid_request_error" if resp.status_code == 400 else "not_found_error")
        assert at_bound not in error["message"] and "b" * ECHO_CHARS in error["message"]


async def test_an_unknown_session_or_artifact_id_is_repeated_cut_short(inprocess_proxy: InProcessProxy) -> None:
    http = inprocess_proxy.http
    long = "s" * 150
    for path in (f"/sessions/{long}", f"/sessions/{long}/archive", f"/artifacts/{long}", f"/artifacts/{long}/search"):
        resp = await http.get(path, params={"q": "x"} if path.endswith("search") else None)
        assert resp.status_code == 404, resp.text
        message = is_openai_error(resp.json(), "not_found_error")["message"]
        assert long not in message and "s" * ECHO_CHARS + "… (150 chars)" in message


async def test_a_too_long_page_cursor_is_a_400_on_the_sessions_and_requests_lists(
        inprocess_proxy: InProcessProxy) -> None:
    """``after`` of ``GET /sessions`` (an admin's ``<tenant>:<session id>`` at most) and of
    ``GET /sessions/{id}/requests`` (a request id) is bounded like the other cursors: past the bound
    a 400 naming it, before any lookup; at the bound an unknown cursor is the usual 400."""
    from proxy.routes.read import SESSION_CURSOR_CHARS

    await one_turn(inprocess_proxy)
    http = inprocess_proxy.http
    for path, bound in (("/sessions", SESSION_CURSOR_CHARS), ("/sessions/doc/requests", 200)):
        resp = await http.get(path, params={"after": "c" * (bound + 1)})
        assert resp.status_code == 400, (path, resp.text)
        assert is_openai_error(resp.json(), "invalid_request_error")["param"] == "query.after"
        resp = await http.get(path, params={"after": "c" * bound})
        assert resp.status_code == 400, (path, resp.text)
        error = is_openai_error(resp.json(), "invalid_request_error")
        assert error["param"] == "after" and "c" * bound not in error["message"]
