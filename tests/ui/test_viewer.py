"""The web viewer at ``/ui`` in a real browser (issue 20, items 2 and 3): headless Chromium
(``tests.ui.browser``) against the proxy under uvicorn, after a real trace replayed with
compactions (``tests.ui.seed``). What the page shows is checked against the read API's answers.

The content is hostile where it can be: a session whose id and messages carry ``<script>``,
``<img onerror>``, ``javascript:`` links, ``<svg onload>`` and ``<iframe>``; each payload would
set ``window.__xss``. Screenshots of the main pages are saved when ``CONTEXT_PROXY_UI_SCREENSHOTS``
names a directory (``docs/ui`` for the README's).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
from playwright.sync_api import Page, Request, Response, Route

from tests.support.real_server import CLIENT_KEY
from tests.ui.conftest import ADMIN_KEY, OTHER_KEY, Viewer, screenshots_dir
from tests.ui.seed import HOSTILE, HOSTILE_TEXT, LARGE, LARGE_MESSAGES, MESSAGES, OTHER, REPLAYED


def api(viewer: Viewer, path: str, key: str = CLIENT_KEY, **params: Any) -> Any:
    with httpx.Client(base_url=viewer.proxy.url, headers={"authorization": f"Bearer {key}"}, timeout=30) as http:
        resp = http.get(path, params=params)
        assert resp.status_code == 200, resp.text
        return resp.json()


def sign_in(tab: Page, viewer: Viewer, key: str = CLIENT_KEY, route: str = "") -> None:
    tab.goto(viewer.ui)
    tab.fill("#key", key)
    tab.click("#signin button")
    tab.locator("#sessions-status").wait_for()
    if route:
        tab.goto(viewer.ui + route)


def shot(tab: Page, name: str) -> None:
    where = screenshots_dir()
    if where is not None:
        where.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(where / name))


def number(text: str) -> int:
    return int(text.split()[0].replace(",", ""))


def test_ui_is_served_with_a_strict_content_security_policy(viewer: Viewer) -> None:
    for path in ("/ui/", "/ui/app.js", "/ui/style.css"):
        resp = httpx.get(viewer.proxy.url + path)
        assert resp.status_code == 200
        csp = resp.headers["content-security-policy"]
        for directive in ("default-src 'self'", "script-src 'self'", "object-src 'none'", "frame-ancestors 'none'",
                          "base-uri 'none'"):
            assert directive in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert resp.headers["x-content-type-options"] == "nosniff"
    page = httpx.get(viewer.proxy.url + "/ui/").text
    assert "<script>" not in page and 'type="module" src="app.js"' in page  # no inline script
    bare = httpx.get(viewer.proxy.url + "/ui")
    assert bare.status_code == 307 and bare.headers["location"].endswith("/ui/")
    assert "/ui/" not in httpx.get(viewer.proxy.url + "/openapi.json").json()["paths"]


def test_the_root_leads_to_the_viewer_and_its_icon_is_served(tab: Page, viewer: Viewer) -> None:
    """``GET /`` redirects to ``/ui/`` (it answered 404 "No route /."); the viewer's icon is served at
    the ``<link rel="icon">`` of its page and at ``/favicon.ico``, under the viewer's CSP (the ``tab``
    fixture fails a test whose page loads anything of the viewer's with an error)."""
    root = httpx.get(viewer.proxy.url + "/")
    assert root.status_code == 307 and root.headers["location"] == "/ui/"
    tab.goto(viewer.proxy.url + "/")
    tab.locator("#signin").wait_for()
    assert tab.url == viewer.ui
    href = tab.locator('link[rel="icon"]').get_attribute("href")
    assert href == "favicon.svg"
    for path in ("/ui/favicon.svg", "/favicon.ico"):
        icon = httpx.get(viewer.proxy.url + path)
        assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml"), path
        assert icon.text.startswith("<svg") and "content-security-policy" in icon.headers
    assert "/favicon.ico" not in httpx.get(viewer.proxy.url + "/openapi.json").json()["paths"]


def test_sign_in_refuses_a_bad_key_and_keeps_a_good_one_in_this_tab_only(tab: Page, viewer: Viewer) -> None:
    sent: list[Request] = []
    tab.on("request", lambda r: sent.append(r) if "/sessions" in r.url else None)
    tab.goto(viewer.ui)
    tab.fill("#key", "sk-not-a-key-of-this-proxy")
    tab.click("#signin button")
    tab.locator("#signin .error").wait_for()
    assert "not accepted" in tab.inner_text("#signin .error")
    assert tab.evaluate("() => sessionStorage.length") == 0
    tab.fill("#key", CLIENT_KEY)
    tab.click("#signin button")
    tab.locator(".session-row").first.wait_for()
    assert tab.evaluate("() => [sessionStorage.getItem('context-proxy.key'), localStorage.length]") == [CLIENT_KEY, 0]
    assert tab.context.cookies() == []
    assert sent and sent[-1].headers["authorization"] == f"Bearer {CLIENT_KEY}"
    assert all("key" not in r.url.split("?")[-1] for r in sent)  # never in a URL
    tab.click("#signout")
    tab.locator("#signin").wait_for()
    assert tab.evaluate("() => sessionStorage.length") == 0


def test_the_list_shows_the_tenants_sessions_newest_first_with_the_apis_numbers(tab: Page, viewer: Viewer) -> None:
    sign_in(tab, viewer)
    expected = api(viewer, "/sessions", limit=50)["data"]
    rows = tab.locator(".session-row")
    rows.nth(len(expected) - 1).wait_for()
    assert [rows.nth(i).get_attribute("data-id") for i in range(rows.count())] == [s["id"] for s in expected]
    assert OTHER not in [s["id"] for s in expected]
    replayed = next(s for s in expected if s["id"] == REPLAYED)
    cells = tab.locator(f'.session-row[data-id="{REPLAYED}"] td')
    texts = [cells.nth(i).inner_text() for i in range(cells.count())]
    assert [number(t) for t in texts[3:10]] == [replayed[k] for k in (
        "message_count", "request_count", "event_count", "branch_count", "tokens_client_total",
        "tokens_forwarded_total")] + [replayed["tokens_client_total"] - replayed["tokens_forwarded_total"]]
    assert replayed["event_count"] >= 1 and number(texts[9]) > 0
    shot(tab, "sessions.png")
    # the filters are the server's: the rows are what GET /sessions?model= answers
    with tab.expect_response(lambda r: "model=fake-16k-openai" in r.url):
        tab.fill("#filter-model", "fake-16k-openai")
        tab.press("#filter-model", "Enter")
    tab.locator("#sessions-status", has_text="1 session").wait_for()
    filtered = api(viewer, "/sessions", model="fake-16k-openai")["data"]
    assert [r.get_attribute("data-id") for r in tab.locator(".session-row").all()] == [s["id"] for s in filtered] == [REPLAYED]
    tab.fill("#filter-model", "")
    with tab.expect_response(lambda r: "updated_after=" in r.url and "model=" not in r.url) as answer:
        tab.select_option("#filter-since", "1h")
    assert answer.value.json()["data"] == expected  # every session was updated within the hour
    tab.locator(".session-row").nth(len(expected) - 1).wait_for()
    assert tab.locator(".session-row").count() == len(expected)


def test_an_admin_sees_every_tenant_with_the_tenant_shown(tab: Page, viewer: Viewer) -> None:
    sign_in(tab, viewer, ADMIN_KEY)
    expected = api(viewer, "/sessions", ADMIN_KEY, limit=50)["data"]
    rows = tab.locator(".session-row")
    rows.nth(len(expected) - 1).wait_for()
    assert {r.get_attribute("data-id") for r in rows.all()} >= {REPLAYED, OTHER}
    other = next(s for s in expected if s["id"] == OTHER)
    assert tab.inner_text(f'.session-row[data-id="{OTHER}"] .tenant') == other["tenant"]
    assert "admin" in tab.inner_text("#who")
    tab.click(f'.session-row[data-id="{OTHER}"] a')
    tab.locator("#session-stats").wait_for()
    assert tab.inner_text("#session-title") == OTHER
    assert other["tenant"] in tab.inner_text(".view > p.tenant")


def test_a_session_with_compactions_shows_the_apis_numbers(tab: Page, viewer: Viewer) -> None:
    sign_in(tab, viewer)
    tab.click(f'.session-row[data-id="{REPLAYED}"] a')
    tab.locator("#messages .message").first.wait_for()
    session = api(viewer, f"/sessions/{REPLAYED}")
    for key in ("message_count", "request_count", "event_count", "branch_count", "tokens_client_total",
                "tokens_forwarded_total"):
        assert number(tab.inner_text(f'#session-stats [data-stat="{key}"]')) == session[key], key
    requests = api(viewer, f"/sessions/{REPLAYED}/requests", limit=1000)["data"]
    rows = tab.locator("#requests .request-row")
    assert rows.count() == len(requests) == session["request_count"]
    assert [(number(r.locator(".sent").text_content()), number(r.locator(".forwarded").text_content())) for r in rows.all()] \
        == [(r["tokens_client"], r["tokens_forwarded"]) for r in requests]
    # the chart: a point per request in each series, a mark per compaction at the first request it applied to
    chart = tab.locator("#tokens-chart")
    assert chart.locator("circle.point.sent").count() == chart.locator("circle.point.forwarded").count() == len(requests)
    events = api(viewer, f"/sessions/{REPLAYED}/events")["data"]
    assert events and {e["kind"] for e in events} >= {"summary"}
    marks = chart.locator(".event-mark")
    assert sorted(m.get_attribute("data-event") for m in marks.all()) == sorted(
        e["id"] for e in events if any(e["id"] in r["event_ids"] for r in requests))
    # overflow recoveries: the 16k window was learned from the provider's first overflow
    recovered = [i for i, r in enumerate(requests) if r["overflow_retries"]]
    assert recovered and [int(m.get_attribute("data-request")) for m in chart.locator(".overflow-mark").all()] == recovered
    assert [number(r.locator(".overflow").text_content()) for r in rows.all()] == [r["overflow_retries"] for r in requests]
    assert tab.inner_text("#overflow-recoveries") == f"{len(recovered)} of {len(requests)} requests recovered from an overflow"
    first = next(i for i, r in enumerate(requests) if events[0]["id"] in r["event_ids"])
    assert f"at request {first + 1}: {events[0]['tokens_before']} → {events[0]['tokens_after']}" in \
        marks.first.locator("title").text_content()
    # the events: kind, tokens before and after, the summary the model was given
    shown = tab.locator("#events .compaction")
    assert shown.count() == len(events)
    for e, box in zip(events, shown.all()):
        assert box.get_attribute("data-event") == e["id"]
        assert number(box.locator(".tokens-before").inner_text()) == e["tokens_before"]
        assert number(box.locator(".tokens-after").inner_text()) == e["tokens_after"]
        assert e["kind"] in box.locator("h3").inner_text()
        assert box.locator(".summary pre").text_content() == e["payload"]["summary"]
    shot(tab, "session.png")


def test_a_single_request_shows_both_sent_and_forwarded_in_the_chart(tab: Page, viewer: Viewer) -> None:
    """One request whose tool result was offloaded (sent > forwarded): the chart has a point for each
    number, at its own height, and each point's title and data attributes carry both numbers as the
    read API gives them."""
    session = viewer.seeded.read_tool
    requests = api(viewer, f"/sessions/{session}/requests")["data"]
    assert len(requests) == 1 and requests[0]["tokens_client"] != requests[0]["tokens_forwarded"]
    sent, forwarded = requests[0]["tokens_client"], requests[0]["tokens_forwarded"]
    sign_in(tab, viewer, route=f"#/session/{session}")
    chart = tab.locator("#tokens-chart")
    chart.wait_for()
    points = {cls: chart.locator(f"circle.point.{cls}") for cls in ("sent", "forwarded")}
    assert [points[c].count() for c in points] == [1, 1]
    for point in points.values():
        assert [int(point.get_attribute(f"data-tokens-{k}") or "") for k in ("client", "forwarded")] == [sent, forwarded]
        assert f"sent {sent} (prompt + reserved output), forwarded {forwarded}" in point.locator("title").text_content()
    heights = [float(points[c].get_attribute("cy") or "") for c in points]
    assert heights[0] != heights[1]  # the larger number higher up (SVG's y grows downwards)
    assert (heights[0] < heights[1]) == (sent > forwarded)
    assert "reserved output" in tab.inner_text(".legend .key.sent")


def test_the_branch_switcher_reaches_each_branch_in_pages(tab: Page, viewer: Viewer) -> None:
    sign_in(tab, viewer, route=f"#/session/{REPLAYED}")
    tab.locator("#messages .message").first.wait_for()
    branches = api(viewer, f"/sessions/{REPLAYED}/branches")["data"]
    assert len(branches) == 2
    options = tab.locator("#branch option")
    assert [o.get_attribute("value") for o in options.all()] == [b["leaf"] for b in branches]
    newest = api(viewer, f"/sessions/{REPLAYED}/messages", limit=1000)["data"]
    assert [m.get_attribute("data-id") for m in tab.locator("#messages .message").all()] == [m["id"] for m in newest]
    other = next(b for b in branches if not b["newest"])
    tab.select_option("#branch", other["leaf"])
    tab.locator("#messages .message").nth(99).wait_for()
    assert tab.locator("#messages .message").count() == 100 and other["message_count"] > 100
    tab.click("#more-messages")
    tab.locator("#messages .message").nth(other["message_count"] - 1).wait_for()
    ids = [m.get_attribute("data-id") for m in tab.locator("#messages .message").all()]
    assert len(ids) == other["message_count"] and ids[-1] == other["leaf"]
    assert tab.locator("#more-messages").is_hidden()
    assert f"leaf={other['leaf']}" in tab.url
    # the compaction is marked after the message it summarized up to
    event = api(viewer, f"/sessions/{REPLAYED}/events")["data"][0]
    after = tab.locator(f'#m-{event["anchor_hash"]} + .compaction')
    assert after.get_attribute("data-event") == event["id"]
    # tool calls and results are collapsed, and open on a click
    call = tab.locator("#messages details.tool-call").first
    assert call.get_attribute("open") is None
    call.locator("summary").click()
    assert call.get_attribute("open") is not None


def test_the_archive_and_an_artifact_as_documents_with_search(tab: Page, viewer: Viewer) -> None:
    long = next(b for b in api(viewer, f"/sessions/{REPLAYED}/branches")["data"] if not b["newest"])
    sign_in(tab, viewer, route=f"#/session/{REPLAYED}?leaf={long['leaf']}")
    tab.locator("#messages .message").first.wait_for()
    tab.click("#archive-link")
    tab.locator("#doc-lines tr").first.wait_for()
    archive = httpx.get(f"{viewer.proxy.url}/sessions/{REPLAYED}/archive", params={"leaf": long["leaf"]},
                        headers={"authorization": f"Bearer {CLIENT_KEY}"}).text.split("\n")
    assert len(archive) > 500
    rows = tab.locator("#doc-lines tr")
    assert rows.count() == 500
    assert [rows.nth(i).locator(".code").text_content() for i in (0, 4, 499)] == [archive[0], archive[4], archive[499]]
    tab.fill("#search-q", "launch_code")
    tab.click("#search button")
    tab.locator("#search-results li").first.wait_for()
    found = api(viewer, f"/sessions/{REPLAYED}/archive/search", q="launch_code", limit=50, leaf=long["leaf"])
    assert found["total"] >= 2
    assert [int(a.get_attribute("data-line")) for a in tab.locator("#search-results .hit").all()] == \
        [m["line"] for m in found["data"]]
    target = found["data"][-1]["line"]
    tab.click(f'#search-results .hit[data-line="{target}"]')
    tab.locator(f"#L{target}.marked").wait_for()
    assert "launch_code" in tab.locator(f"#L{target} .code").text_content()
    shot(tab, "archive.png")
    # an artifact named in the summary: its link, its lines, its search
    tab.goto(viewer.ui + f"#/session/{REPLAYED}")
    link = tab.locator("#events .summary a.artifact-link").first
    art = link.text_content()
    link.evaluate("a => a.closest('details').open = true")
    link.click()
    tab.locator("#doc-lines tr").first.wait_for()
    stored = api(viewer, f"/artifacts/{art}", limit=100_000)
    assert tab.inner_text("#doc-title") == f"Artifact {art}"
    assert tab.locator("#doc-lines tr").count() == min(500, stored["line_count"])
    word = next(w for w in stored["content"].split() if len(w) > 6 and w.isalpha())
    tab.fill("#search-q", word)
    tab.click("#search button")
    tab.locator("#search-results li").first.wait_for()
    hits = api(viewer, f"/artifacts/{art}/search", q=word, limit=50)
    assert hits["total"] >= 1
    assert [int(a.get_attribute("data-line")) for a in tab.locator("#search-results .hit").all()] == \
        [m["line"] for m in hits["data"]]
    first = hits["data"][0]["line"]
    tab.click(f'#search-results .hit[data-line="{first}"]')
    tab.locator(f"#L{first}.marked").wait_for()
    assert word.lower() in tab.locator(f"#L{first} .code").text_content().lower()


def test_hostile_content_stays_inert(tab: Page, viewer: Viewer) -> None:
    dialogs: list[str] = []
    tab.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    sign_in(tab, viewer)
    tab.locator(".session-row").first.wait_for()
    assert tab.locator(".session-row").filter(has_text=HOSTILE).count() == 1  # the id is text
    tab.locator(".session-row a").filter(has_text=HOSTILE).click()
    tab.locator("#messages .message").nth(1).wait_for()
    texts = [t.text_content() for t in tab.locator("#messages pre.text").all()]
    assert texts == [HOSTILE_TEXT, HOSTILE_TEXT]  # shown as text, character for character
    assert tab.inner_text("#session-title") == HOSTILE
    for link in tab.locator("#messages a").all():
        link.click()  # any link there is ours: nothing runs
    tab.goto(viewer.ui + "#/archive/" + quote(HOSTILE, safe=""))
    tab.locator("#doc-lines tr").first.wait_for()
    assert HOSTILE_TEXT.split(" <img")[0] in tab.locator("#doc-lines").text_content()
    tab.goto(viewer.ui + "#/artifact/javascript:window.__xss=9")
    tab.locator(".view .error").wait_for()
    assert tab.evaluate("() => window.__xss") is None
    assert tab.evaluate("() => document.querySelectorAll('img, iframe, svg:not(#tokens-chart), object, embed').length") == 0
    assert tab.evaluate("() => [...document.querySelectorAll('a')].filter(a => !a.getAttribute('href').startsWith('#/')).length") == 0
    assert tab.evaluate("() => [...document.scripts].map(s => s.getAttribute('src'))") == ["app.js"]
    assert dialogs == []


def test_another_tenants_session_is_not_found(tab: Page, viewer: Viewer) -> None:
    sign_in(tab, viewer, route=f"#/session/{OTHER}")
    tab.locator(".view .error").wait_for()
    assert "Not found" in tab.inner_text(".view .error")
    assert tab.locator("#session-stats").count() == 0
    tab.goto(viewer.ui + f"#/archive/{OTHER}")
    tab.locator(".view .error").wait_for()
    assert tab.locator("#doc-lines").count() == 0
    # its owner sees it
    other = tab.context.new_page()
    try:
        sign_in(other, viewer, OTHER_KEY, route=f"#/session/{OTHER}")
        other.locator("#messages .message").first.wait_for()
        assert "secret of B" in other.locator("#messages").text_content()
    finally:
        other.close()


def test_a_large_session_is_read_in_bounded_pages(tab: Page, viewer: Viewer) -> None:
    responses: list[tuple[str, int]] = []

    def seen(response: Response) -> None:
        if "/ui/" not in response.url:
            responses.append((response.url, len(response.body())))

    tab.on("response", seen)
    sign_in(tab, viewer, route=f"#/session/{LARGE}")
    tab.locator("#messages .message").nth(99).wait_for()
    assert number(tab.inner_text('#session-stats [data-stat="message_count"]')) == LARGE_MESSAGES
    tab.click("#more-messages")
    tab.locator("#messages .message").nth(199).wait_for()
    assert tab.locator("#messages .message").count() == 200
    tab.click("#archive-link")
    tab.locator("#doc-lines tr").nth(499).wait_for()
    tab.click("#next-page")
    tab.locator("#L500").wait_for()
    pages = [(url, size) for url, size in responses if f"/sessions/{LARGE}/messages" in url]
    assert len(pages) == 2 and all("limit=100" in url for url, _ in pages)
    archive = [(url, size) for url, size in responses if f"/sessions/{LARGE}/archive" in url]
    assert len(archive) == 2 and all("limit=501" in url for url, _ in archive)
    total = sum(size for _, size in responses)
    assert max(size for _, size in responses) < 1_200_000  # one page of 100 messages of 6,000 characters
    assert total < 5_000_000, json.dumps(responses)  # of a 60 MB session


def test_a_page_that_fails_to_load_says_so_and_can_be_loaded_again(tab: Page, viewer: Viewer) -> None:
    """The second page of messages answers 503 once: the page says so beside the button (no unhandled
    error), the button stays usable, and a second click loads the page."""
    failed: list[str] = []

    def once(route: Route) -> None:
        if "after=" in route.request.url and not failed:
            failed.append(route.request.url)
            route.fulfill(status=503, content_type="application/json",
                          body='{"error": {"message": "busy", "type": "proxy_busy", "code": "proxy_busy"}}')
        else:
            route.continue_()

    tab.route(f"**/sessions/{LARGE}/messages*", once)
    sign_in(tab, viewer, route=f"#/session/{LARGE}")
    tab.locator("#messages .message").nth(99).wait_for()
    tab.click("#more-messages")
    tab.locator(".load-error", has_text="Could not load more").wait_for()
    assert failed and tab.locator("#messages .message").count() == 100
    assert tab.locator("#more-messages").is_enabled()
    tab.click("#more-messages")
    tab.locator("#messages .message").nth(199).wait_for()
    assert tab.inner_text(".load-error") == ""


def test_read_tool_rounds_are_marked_and_their_artifact_is_linked(tab: Page, viewer: Viewer) -> None:
    sign_in(tab, viewer, route=f"#/session/{viewer.seeded.read_tool}")
    tab.locator("#messages .message").first.wait_for()
    logged = api(viewer, f"/sessions/{viewer.seeded.read_tool}/messages", limit=1000)["data"]
    internal = [m for m in logged if m["internal"]]
    assert [m["role"] for m in internal] == ["assistant", "tool"]  # the proxy's read-tool round, where it happened
    marked = tab.locator("#messages .message:has(.badge.internal)")
    assert [m.get_attribute("data-id") for m in marked.all()] == [m["id"] for m in internal]
    # the round's result names the offloaded artifact: a link to it, inside the folded result
    result = tab.locator(f'#m-{internal[1]["id"]} details.tool-result')
    assert result.get_attribute("open") is None
    result.locator("summary").click()
    link = result.locator("a.artifact-link").first
    art = link.text_content()
    assert art in internal[1]["content"]
    link.click()
    tab.locator("#doc-lines tr").first.wait_for()
    stored = api(viewer, f"/artifacts/{art}", limit=500)
    shown = tab.locator("#doc-lines .code")
    assert shown.count() == stored["returned_lines"] == 500
    assert [shown.nth(i).text_content() for i in (0, 499)] == [stored["content"].splitlines()[i] for i in (0, 499)]
    tab.click("#next-page")
    tab.locator("#L500").wait_for()
    assert tab.locator("#L500 .code").text_content() == "FACT: build_id=B-7741"
    tab.click("#back")  # to the artifact's first page, then the session it was linked from
    tab.locator("#L0").wait_for()
    tab.click("#back")
    tab.locator("#session-stats").wait_for()
    assert tab.inner_text("#session-title") == viewer.seeded.read_tool
    # the session's artifacts, as GET /sessions/{id}/artifacts lists them
    tab.goto(viewer.ui + f"#/session/{viewer.seeded.read_tool}")
    rows = tab.locator("#artifacts .artifact-row")
    rows.first.wait_for()
    listed = api(viewer, f"/sessions/{viewer.seeded.read_tool}/artifacts", limit=100)["data"]
    assert [r.get_attribute("data-id") for r in rows.all()] == [a["id"] for a in listed] and art in [a["id"] for a in listed]
    assert [(number(r.locator(".bytes").inner_text()), number(r.locator(".lines").inner_text())) for r in rows.all()] == \
        [(a["bytes"], a["lines"]) for a in listed]


def test_a_messages_session_shows_thinking_tool_use_and_results_folded(tab: Page, viewer: Viewer) -> None:
    sign_in(tab, viewer, route=f"#/session/{MESSAGES}")
    tab.locator("#messages .message").nth(3).wait_for()
    logged = api(viewer, f"/sessions/{MESSAGES}/messages")["data"]
    assert [m.get_attribute("data-id") for m in tab.locator("#messages .message").all()] == [m["id"] for m in logged]
    assert tab.inner_text('#session-stats [data-stat="api"]') == "messages"
    folded = {cls: tab.locator(f"#messages details.{cls}") for cls in ("thinking", "tool-call", "tool-result")}
    assert [folded[c].count() for c in folded] == [2, 1, 1]
    assert all(d.get_attribute("open") is None for c in folded for d in folded[c].all())
    assert folded["tool-call"].locator("summary").inner_text() == "tool call: get_weather (toolu_01paris)"
    assert json.loads(folded["tool-call"].locator("pre").text_content()) == {"city": "Paris"}
    folded["tool-result"].locator("summary").click()
    assert folded["tool-result"].locator("pre").inner_text() == "21 C, sunny"
    assert folded["thinking"].first.locator("pre").text_content() == "The user wants the weather."
