"""Issue 17, items 1 and 3: the read tool's search (``proxy.tools.search``) and its arguments."""

from __future__ import annotations

import time

from proxy.defenses.hints import search_hint
from proxy.tools.schemas import parse_arguments, read_tool_schema
from proxy.tools.search import (
    MAX_QUERY_CHARS,
    Source,
    compile_query,
    render,
    split_lines,
)


def log(n: int, plant: dict[int, str]) -> Source:
    rows = [f"{i:05d} INFO worker-{i % 7} processed batch {i}" for i in range(n)]
    for i, text in plant.items():
        rows[i] = text
    return Source("art_" + "a" * 32, rows)


def test_words_match_case_insensitively_with_context_and_a_way_on() -> None:
    src = log(5000, {2500: "FACT: Build_ID=B-77"})
    out = render([src], compile_query("fact build_id", False), 0, 20, 10_000)  # type: ignore[arg-type]
    first = out.splitlines()[1]
    assert first == f"{src.reference} · line 2500: FACT: Build_ID=B-77"
    assert "    2498: 02498 INFO" in out and "    2502: 02502 INFO" in out  # two lines either side
    assert "1 matching lines" in out and "no more matches" in out
    assert f'{{"reference": "{src.reference}", "offset": 2480, "limit": 40}}' in out  # how to read around it


def test_more_words_first_then_most_recent() -> None:
    old = Source("/sessions/s/archive", ["user: QUESTION: pin", "user: FACT: pin=1"])
    new = Source("art_" + "b" * 32, ["x pin y", "FACT: pin=2", "pin again"])
    out = render([old, new], compile_query("FACT pin", False), 0, 20, 10_000)  # type: ignore[arg-type]
    heads = [line for line in out.splitlines() if " · line " in line]
    assert heads == [f"{new.reference} · line 1: FACT: pin=2", "/sessions/s/archive · line 1: user: FACT: pin=1",
                     f"{new.reference} · line 2: pin again", f"{new.reference} · line 0: x pin y",
                     "/sessions/s/archive · line 0: user: QUESTION: pin"]


def test_pages_of_matches_and_a_cut_say_how_to_continue() -> None:
    src = log(1000, {i: f"ERROR disk {i} full " + "x" * 150 for i in range(0, 1000, 10)})
    query = compile_query("error", False)
    page = render([src], query, 0, 5, 100_000)  # type: ignore[arg-type]
    assert page.count(" · line ") == 5 and "next_offset=5" in page and "100 matching lines" in page
    assert " · line 990:" in page.splitlines()[1]  # most recent first
    cut = render([src], query, 5, 200, 2_000)  # type: ignore[arg-type]
    assert len(cut) < 2_600 and "cut to fit the context window" in cut
    shown = cut.count(" · line ")
    assert 1 <= shown < 20 and f"next_offset={5 + shown}" in cut


def test_regex_errors_and_long_queries_are_short_texts_for_the_model() -> None:
    assert compile_query("([unclosed", True).startswith("[context-proxy] The regex does not compile")  # type: ignore[union-attr]
    assert "longer than" in compile_query("w " * MAX_QUERY_CHARS, False)  # type: ignore[operator]
    assert parse_arguments('{"query": "(a", "regex": true}').startswith("[context-proxy]")  # type: ignore[union-attr]
    assert parse_arguments("{}").startswith("[context-proxy] Pass 'query'")  # type: ignore[union-attr]
    assert parse_arguments('{"query": 3}').startswith("[context-proxy]")  # type: ignore[union-attr]


def test_a_catastrophic_pattern_on_a_big_artifact_runs_in_linear_time() -> None:
    src = Source("art_" + "c" * 32, split_lines(("a" * 30 + "!\n") * 20_000 + "a" * 100_000))
    query = compile_query(r"(a+)+$", True)
    started = time.monotonic()
    out = render([src], query, 0, 20, 10_000)  # type: ignore[arg-type]
    assert time.monotonic() - started < 2.0
    assert "50 matching lines" in out and "stopped" not in out  # RE2: every segment of the long line, all of it searched


def test_a_search_stops_at_its_deadline_and_says_so() -> None:
    src = log(50_000, {})
    out = render([src], compile_query("worker", False), 0, 5, 10_000, deadline=time.monotonic())  # type: ignore[arg-type]
    assert "stopped: the search took too long" in out


def test_short_patterns_that_explode_compile_fast_in_bounded_memory() -> None:
    """Review: ``a{4294967294}`` allocated 3.5 GB, ``(?:a{1500}){1500}`` held the loop 2.9 s."""
    import tracemalloc

    for pattern in ("a{4294967294}", "(?:a{1500}){1500}", "(?:a{999}){999}", "((a{100}){100}){100}", "(x+x+)+y" * 20):
        tracemalloc.start()
        started = time.monotonic()
        compiled = compile_query(pattern[:MAX_QUERY_CHARS], True)
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert elapsed < 0.2 and peak < 20_000_000, (pattern, elapsed, peak)
        if isinstance(compiled, str):
            assert compiled.startswith("[context-proxy] The regex") and len(compiled) < 300
        else:
            started = time.monotonic()
            render([log(2000, {})], compiled, 0, 20, 10_000)  # type: ignore[arg-type]
            assert time.monotonic() - started < 1.0


def test_the_result_never_runs_over_its_cap() -> None:
    """Review: the fixed +200 allowance did not cover the long read-around reference and the tail."""
    ref = "/sessions/" + "%E2%9C%93" * 50 + "/archive"
    src = Source(ref, [f"{i} pin " + "y" * 180 for i in range(400)])
    query = compile_query("pin", False)
    for cap in range(300, 6000, 53):
        out = render([src], query, 3, 50, cap)  # type: ignore[arg-type]
        assert len(out) <= cap, (cap, len(out))
        assert "next_offset=" in out.rsplit("\n", 1)[-1] or len(out.rsplit("\n", 1)[-1]) <= cap


def test_regex_finds_what_words_cannot() -> None:
    src = log(3000, {1234: "commit 9f3e2a1 deployed to prod-eu"})
    out = render([src], compile_query(r"commit [0-9a-f]{7}\b", True), 0, 20, 10_000)  # type: ignore[arg-type]
    assert f"{src.reference} · line 1234: commit 9f3e2a1" in out


def test_arguments_query_alone_reference_alone_and_both() -> None:
    q = parse_arguments('{"query": "build id"}')
    assert q.reference is None and q.query.words == ("build", "id") and q.limit == 20  # type: ignore[union-attr]
    r = parse_arguments('{"reference": "art_x", "offset": true, "limit": 5}')
    assert r.reference == "art_x" and r.query is None and r.offset == 0 and r.limit == 5  # type: ignore[union-attr]
    both = parse_arguments('{"reference": "art_x", "query": "x", "limit": 100000}')
    assert both.reference == "art_x" and both.limit == 200  # type: ignore[union-attr]


def test_the_texts_tell_the_model_to_search_and_stay_stable() -> None:
    props = read_tool_schema("context_proxy_read")["function"]["parameters"]["properties"]
    assert {"query", "regex", "reference", "offset", "limit"} == set(props)
    assert "Search first" in read_tool_schema("context_proxy_read")["function"]["description"]
    assert search_hint("t", "art_1") == 'Search it first with `t` {"query": "words", "reference": "art_1"}, then read around a match.'
