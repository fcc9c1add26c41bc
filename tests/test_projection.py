"""The projection (proxy/projection.py): shared cases at unit level, determinism, prefix stability.

Each case runs the plan loop the pipeline runs (``run_plans``: project, store the planned event
with a deterministic fake summary that keeps FACT lines, project again) and checks what would be
forwarded against a strict provider (``tests.strict``) and the case's window.
"""

from __future__ import annotations

import json
import time

import orjson
import pytest

from proxy.conversation.canonical import digests_and_chain
from proxy.conversation.chat_codec import CHAT
from proxy.defenses.config import DefenseConfig
from proxy.defenses.offload import artifact_id
from proxy.defenses.plans import MediaPlan, SummaryPlan, TruncatePlan
from proxy.defenses.summarize import (
    build_summary_request_messages,
    render_transcript,
    summary_chunks,
)
from proxy.defenses.truncate_args import MARKER
from proxy.projection import ProjectionMemos
from tests.defenses.helpers import (
    T0,
    fabricate_event,
    load_case,
    project_once,
    run_plans,
)
from tests.strict import validate_chat_messages
from tests.support.shared import NO_ENCODINGS_REASON


@pytest.fixture(scope="module")
def counter():
    from proxy.tokens.counter import TokenCounter

    c = TokenCounter("o200k_base")
    if not c.exact:  # a public clone without ../shared: the expected figures are exact counts
        pytest.skip(NO_ENCODINGS_REASON)
    return c


def forwarded_text(messages: list[dict]) -> str:
    return orjson.dumps(messages).decode()


def run_case(case_id: str, counter, **kw):
    case = load_case(case_id)
    req = case["request"]
    cfg = DefenseConfig(context_window_tokens=case["upstream"]["context_window_tokens"])
    projection, events = run_plans(req["messages"], cfg, counter, tools=req.get("tools"), **kw)
    assert validate_chat_messages(projection.messages, allow_developer=False) == []
    return req, cfg, projection, events


def test_case_001_parallel_results_stay_with_their_call(counter):
    req, _cfg, p, _ = run_case("001", counter)
    assert p.fits and p.tokens_forwarded <= 2048 < p.tokens_client
    ids = [m.get("tool_call_id") for m in p.messages if m["role"] == "tool"]
    assert ids == ["call_a", "call_b", "call_c"]
    assert [c["id"] for c in p.messages[2]["tool_calls"]] == ["call_a", "call_b", "call_c"]
    assert "FACT: deadline=Friday" in forwarded_text(p.messages)
    assert {a.id for a in p.artifacts} == {artifact_id(m["content"]) for m in req["messages"][3:]}


def test_case_001_forced_summary_keeps_the_parallel_block_whole(counter):
    req = load_case("001")["request"]
    cfg = DefenseConfig(context_window_tokens=2048, offload_window_fraction=2.0)  # results stay inline
    background = [{"role": "user", "content": "Background: " + "the team meets on Mondays\n" * 120},
                  {"role": "assistant", "content": "Noted."}]
    messages = req["messages"][:1] + background + req["messages"][1:]
    plan = project_once(messages, cfg, counter, tools=req["tools"], force=True).plan
    assert isinstance(plan, SummaryPlan)
    calling = next(i for i, m in enumerate(messages) if m.get("tool_calls"))
    assert plan.cutoff_index < calling  # never inside the block of parallel results
    p, _ = run_plans(messages, cfg, counter, tools=req["tools"], force=True)
    assert validate_chat_messages(p.messages) == []
    assert [m.get("tool_call_id") for m in p.messages if m["role"] == "tool"] == ["call_a", "call_b", "call_c"]


def test_nothing_worth_summarizing_gives_no_plan(counter):
    req = load_case("001")["request"]  # after offload only the short question precedes the calls
    p = project_once(req["messages"], DefenseConfig(context_window_tokens=2048), counter, tools=req["tools"], force=True)
    assert p.plan is None and p.fits and validate_chat_messages(p.messages) == []


def test_case_002_anthropic_blocks_are_kept_together(counter):
    req, _cfg, p, events = run_case("002", counter)
    assert [e.kind for e in events] == ["summary"]
    assert p.fits
    assert p.messages[-2] is req["messages"][-2] and p.messages[-1] is req["messages"][-1]  # forwarded as sent
    assert "offsite in Norway" not in forwarded_text(p.messages)  # the big background was compressed
    assert p.messages[0] is req["messages"][0] and p.messages[1]["content"].startswith("[context-proxy]")


def test_case_004_untouched_request_with_dangling_call_is_forwarded_as_sent(counter):
    req = load_case("004")["request"]
    p = project_once(req["messages"], DefenseConfig(context_window_tokens=131_072), counter, tools=req["tools"])
    assert p.messages is req["messages"] and p.applied == () and p.plan is None and p.event_ids == ()
    assert p.tokens_forwarded == p.tokens_client


def test_case_004_patch_when_always_or_when_compacted(counter):
    req = load_case("004")["request"]
    p = project_once(req["messages"], DefenseConfig(context_window_tokens=131_072, patch_dangling_tool_calls="always"),
                     counter, tools=req["tools"])
    assert p.applied == ("patch_dangling",) and validate_chat_messages(p.messages) == []
    assert p.messages[3] == {"role": "tool", "tool_call_id": "call_x1",
                             "content": "[context-proxy] This tool call was cancelled or its result is unavailable."}


def _read_round(k: int) -> list[dict]:
    return [
        {"role": "assistant", "content": None, "tool_calls": [{"id": f"call_f{k}", "type": "function", "function": {
            "name": "read_file", "arguments": json.dumps({"path": f"configs/service_{k}.ini"})}}]},
        {"role": "tool", "tool_call_id": f"call_f{k}", "content": "setting_name = some_value_here\n" * 70},
        {"role": "assistant", "content": f"service_{k}.ini converted to TOML."},
    ]


def test_case_005_first_user_fact_survives_repeated_compaction(counter):
    req = load_case("005")["request"]
    cfg = DefenseConfig(context_window_tokens=4096)
    question = req["messages"][-1]
    history = list(req["messages"])
    events: list = []
    summaries = []
    for send in range(3):
        if send:
            history = history[:-1] + [m for k in range(6) for m in _read_round(10 * send + k + 1)] + [question]
        p, events = run_plans(history, cfg, counter, events, tools=req["tools"])
        assert validate_chat_messages(p.messages) == [] and p.fits
        text = forwarded_text(p.messages)
        assert "FACT: deploy_token=T-4471" in text or req["messages"][1] in p.messages
        assert p.messages[-1] is question
        summaries = [e for e in events if e.kind == "summary"]
    assert len(summaries) >= 2
    assert summaries[1].payload["previous_event_id"] == summaries[0].id  # chained
    assert summaries[1].payload["message_count"] > summaries[0].payload["message_count"]


def test_case_007_tool_schemas_are_counted_and_never_touched(counter):
    req, _cfg, p, events = run_case("007", counter)
    tools_before = orjson.dumps(req["tools"])
    assert p.fits and p.tokens_forwarded <= 4096
    assert p.tokens_forwarded >= counter.bind(CHAT).count_tools(req["tools"]) + sum(counter.bind(CHAT).count_message(m) for m in p.messages)
    assert orjson.dumps(req["tools"]) == tools_before
    assert len(events) == 1  # no compaction loop
    text = forwarded_text(p.messages)
    assert "FACT: table=events_2024" in text
    last_user = [m for m in p.messages if m["role"] == "user"][-1]
    assert "QUESTION: table" in last_user["content"]  # the user's request is never lost in the summary


def test_case_007_tools_alone_over_the_window_is_unfittable(counter):
    req = load_case("007")["request"]
    p = project_once(req["messages"], DefenseConfig(context_window_tokens=1024), counter, tools=req["tools"])
    assert p.plan is None and not p.fits and "tool schemas" in p.reason_unfittable
    p = project_once(req["messages"][:2], DefenseConfig(context_window_tokens=8192), counter,
                     reserved_output_tokens=8192)
    assert p.plan is None and "reserved output" in p.reason_unfittable


def test_case_019_body_size_overflow_offloads_older_images(counter):
    req = load_case("019")["request"]
    cfg = DefenseConfig(context_window_tokens=131_072)
    plain = project_once(req["messages"], cfg, counter)
    assert plain.messages is req["messages"]  # under the trigger: images stay until a 413
    first = project_once(req["messages"], cfg, counter, force_media=True)
    assert isinstance(first.plan, MediaPlan)
    p, events = run_plans(req["messages"], cfg, counter, force_media=True)
    assert [e.kind for e in events] == ["media"] and "media" in p.applied
    body = orjson.dumps({"model": req["model"], "messages": p.messages})
    assert len(body) < 1_000_000 < len(orjson.dumps(req))
    refs = [part["text"] for m in p.messages if isinstance(m["content"], list) for part in m["content"]
            if "offloaded to artifact" in part.get("text", "")]
    assert len(refs) == 3 and all(f"/artifacts/{p.artifacts[0].id}" in r for r in refs)
    assert p.artifacts[0].content.startswith("data:image/png;base64,")
    assert validate_chat_messages(p.messages) == []


def test_case_020_huge_result_is_a_stub_and_the_summary_request_fits(counter):
    req, cfg, p, _ = run_case("020", counter)
    stub = p.messages[3]
    assert stub["role"] == "tool" and stub["tool_call_id"] == "call_log"
    assert "FACT: slowest=req-9931 took 4812 ms" in stub["content"] and p.fits
    huge = req["messages"][3]["content"]
    assert p.artifacts[0].content == huge and p.artifacts[0].id in stub["content"]
    # later, with the result inside summarized history, the summary request must fit 4,096 too
    history = req["messages"] + [{"role": "assistant", "content": "req-9931 was the slowest."}]
    for k in range(3):
        history += [{"role": "user", "content": f"Now check small_{k}.log."},
                    {"role": "assistant", "content": None, "tool_calls": [{"id": f"call_s{k}", "type": "function",
                     "function": {"name": "read_file", "arguments": json.dumps({"path": f"small_{k}.log"})}}]},
                    {"role": "tool", "tool_call_id": f"call_s{k}", "content": "INFO request handled in 9 ms\n" * 60}]
    history.append({"role": "user", "content": "Which was the slowest overall? QUESTION: slowest"})
    forced = project_once(history, cfg, counter, tools=req["tools"], force=True)
    plan = forced.plan
    assert isinstance(plan, SummaryPlan)
    assert huge not in render_transcript(plan.to_summarize, CHAT)
    for chunk in summary_chunks(plan.to_summarize, 2500, counter, CHAT):
        request = build_summary_request_messages(plan.previous_summary, render_transcript(chunk, CHAT))
        assert counter.bind(CHAT).count_message(request[0]) + 1024 <= 4096


def test_unavailable_artifact_forwards_the_original(counter):
    req = load_case("020")["request"]
    huge = req["messages"][3]["content"]
    p = project_once(req["messages"], DefenseConfig(context_window_tokens=4096), counter, tools=req["tools"],
                     unavailable_artifacts=frozenset({artifact_id(huge)}))
    assert p.messages[3]["content"] == huge and artifact_id(huge) not in forwarded_text(p.messages)
    assert all(a.id != artifact_id(huge) for a in p.artifacts)


def test_case_022_trailing_results_are_clipped_in_place_never_deleted(counter):
    req = load_case("022")["request"]
    # a profile whose offload threshold does not catch them: only overflow clipping can help
    cfg = DefenseConfig(context_window_tokens=2048, offload_window_fraction=2.0)
    p, _events = run_plans(req["messages"], cfg, counter, tools=req["tools"], force=True)
    assert "clip" in p.applied and p.fits
    assert [m.get("tool_call_id") for m in p.messages[3:]] == ["call_d1", "call_d2"]
    assert p.messages[2] is req["messages"][2]
    assert "FACT: timeout_module=net" in p.messages[3]["content"]
    assert validate_chat_messages(p.messages) == []
    # with the default profile they are offloaded on sight
    _, _, p2, _ = run_case("022", counter)
    assert "offload" in p2.applied and [m.get("tool_call_id") for m in p2.messages[3:]] == ["call_d1", "call_d2"]


def test_case_025_truncation_keeps_json_and_content_form(counter):
    req, _cfg, p, events = run_case("025", counter)
    assert [e.kind for e in events] == ["truncate_args"] and p.fits
    assert len(p.messages) == len(req["messages"])
    for sent, fwd in zip(req["messages"], p.messages, strict=True):
        assert fwd["role"] == sent["role"]
        if sent["role"] == "assistant":
            assert fwd["content"] == sent["content"] and type(fwd["content"]) is type(sent["content"])
            assert [c["id"] for c in fwd.get("tool_calls", [])] == [c["id"] for c in sent.get("tool_calls", [])]
    args = json.loads(p.messages[2]["tool_calls"][0]["function"]["arguments"])
    assert list(args) == ["path", "content"] and args["content"].endswith(MARKER) and args["path"] == "hello.py"


def test_case_025_truncate_plan_is_tried_before_a_summary(counter):
    req = load_case("025")["request"]
    p = project_once(req["messages"], DefenseConfig(context_window_tokens=4096), counter, tools=req["tools"])
    assert isinstance(p.plan, TruncatePlan) and p.plan.tokens_after < p.plan.tokens_before


@pytest.mark.parametrize("case_id", ["023", "026"])
def test_cases_023_026_no_role_or_name_the_client_did_not_use(case_id, counter):
    req, cfg, p, events = run_case(case_id, counter)
    assert p.fits and [e.kind for e in events] == ["summary"]
    sent_roles = {m["role"] for m in req["messages"]}
    assert {m["role"] for m in p.messages} <= sent_roles
    for m in p.messages:
        if m not in req["messages"]:
            assert "name" not in m and m["role"] == "user"
    assert p.messages[-1] is req["messages"][-1]  # the client's message keeps its name (023)
    first = project_once(req["messages"], cfg, counter)
    request = build_summary_request_messages(None, render_transcript(first.plan.to_summarize, CHAT))
    assert [set(m) for m in request] == [{"role", "content"}] and request[0]["role"] == "user"
    fact = {"023": "FACT: pet=otter", "026": "FACT: lang=Rust"}[case_id]
    assert fact in forwarded_text(p.messages)


def test_projection_is_byte_identical_across_calls_and_counters(counter):
    from proxy.tokens.counter import TokenCounter

    req = load_case("005")["request"]
    cfg = DefenseConfig(context_window_tokens=4096)
    p1, events = run_plans(req["messages"], cfg, counter, tools=req["tools"])
    p2 = project_once(req["messages"], cfg, counter, events, tools=req["tools"])
    p3 = project_once(req["messages"], cfg, TokenCounter("o200k_base"), list(reversed(events)), tools=req["tools"])
    assert orjson.dumps(p1.messages) == orjson.dumps(p2.messages) == orjson.dumps(p3.messages)
    assert p1.artifacts == p2.artifacts == p3.artifacts and p1.event_ids == p2.event_ids == p3.event_ids


def test_event_of_another_branch_does_not_apply(counter):
    req = load_case("026")["request"]
    cfg = DefenseConfig(context_window_tokens=2048)
    _, events = run_plans(req["messages"], cfg, counter)
    edited = [req["messages"][0], {"role": "user", "content": "A different first question?"}]
    p = project_once(edited, cfg, counter, events)
    assert p.messages is edited and p.event_ids == ()


def test_input_is_not_mutated(counter):
    import copy

    req = load_case("025")["request"]
    before = copy.deepcopy(req["messages"])
    run_plans(req["messages"], DefenseConfig(context_window_tokens=4096), counter, tools=req["tools"], force=True)
    assert req["messages"] == before


def test_plan_payloads_carry_what_the_pipeline_stores(counter):
    req = load_case("026")["request"]
    p = project_once(req["messages"], DefenseConfig(context_window_tokens=2048), counter)
    plan = p.plan
    assert isinstance(plan, SummaryPlan) and plan.first_index == 1
    _, chain = digests_and_chain(req["messages"])
    assert plan.anchor_hash == chain[plan.cutoff_index] and plan.first_hash == chain[1]
    event = fabricate_event(plan, "S")
    assert event.payload == {"summary": "S", "first_hash": chain[1], "cutoff_hash": chain[plan.cutoff_index],
                             "previous_event_id": None, "message_count": plan.message_count,
                             "pinned_user_hash": plan.pinned_user_hash}
    assert plan.tokens_after_estimate < plan.tokens_before


def test_large_history_projects_fast(counter):
    history = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Do the task."}]
    for k in range(2500):
        history += [
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{k}", "type": "function", "function": {
                "name": "run_command", "arguments": json.dumps({"command": f"step {k}"})}}]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": f"output of step {k}: " + "ok " * 30},
        ]
    cfg = DefenseConfig(context_window_tokens=128_000)
    _, events = run_plans(history, cfg, counter)
    grown = history + [{"role": "user", "content": "Go on."}]
    memos = ProjectionMemos()  # what the plan loop holds
    project_once(grown, cfg, counter, events, memos=memos)  # warm the memo for the new message
    start = time.perf_counter()
    p = project_once(grown, cfg, counter, events, memos=memos)
    elapsed = time.perf_counter() - start
    assert p.fits and "summary" in p.applied
    assert elapsed < 0.5, elapsed


def test_images_in_summarized_history_become_references_for_the_summary_call(counter):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "iVBORw0K" * 500}}
    messages = [{"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": "text", "text": "Screenshot of the bug."}, image]},
                {"role": "assistant", "content": "I see the bug. " + "details " * 1200},
                {"role": "user", "content": "Fix it. QUESTION: bug"}]
    p = project_once(messages, DefenseConfig(context_window_tokens=2048), counter)
    plan = p.plan
    assert isinstance(plan, SummaryPlan) and plan.cutoff_index == 2
    part = plan.to_summarize[0]["content"][1]
    assert part["type"] == "text" and "/artifacts/art_" in part["text"]
    assert "base64" not in render_transcript(plan.to_summarize, CHAT)
    assert [a.media_type for a in p.artifacts] == ["image/png"] and p.artifacts[0].id in part["text"]
    assert p.messages is messages  # the forwarded request is unchanged until the summary is stored


def test_dangling_call_is_patched_once_the_proxy_changed_the_request(counter):
    req = load_case("026")["request"]
    dangling = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_z", "type": "function", "function": {"name": "run_command", "arguments": "{}"}}]}
    messages = req["messages"][:3] + [dangling] + req["messages"][3:]
    p, _ = run_plans(messages, DefenseConfig(context_window_tokens=2048), counter)
    assert p.applied[0] == "summary" and p.applied[-1] == "patch_dangling"
    assert validate_chat_messages(p.messages) == []
    i = next(i for i, m in enumerate(p.messages) if m is dangling)
    assert p.messages[i + 1]["tool_call_id"] == "call_z" and p.messages[i + 2] is messages[-1]


def test_force_with_a_last_message_too_large_to_fit_says_why(counter):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "word " * 3000}]
    p = project_once(messages, DefenseConfig(context_window_tokens=2048), counter, force=True)
    assert p.plan is None and not p.fits and "most recent messages" in p.reason_unfittable


def _fresh_counter():
    from proxy.tokens.counter import TokenCounter

    return TokenCounter("o200k_base")


def test_count_history_reuses_the_previous_turn_and_equals_counting_each_message():
    """Through the conversation's prefix state (``proxy.conversation.prefix``), as ``project`` does."""
    from proxy.conversation.prefix import PrefixStates

    counter = _fresh_counter()
    states = PrefixStates()

    def count_history(messages, digests, chain):
        state = states.take(chain)
        try:
            return counter.bind(CHAT).count_history(messages, digests, chain, state)
        finally:
            states.keep(chain, state)

    history = [{"role": "user" if i % 2 else "assistant", "content": f"message number {i} " * (i % 7)} for i in range(40)]
    d, c = digests_and_chain(history)
    assert count_history(history, d, c) == [counter.bind(CHAT).count_message(m) for m in history]
    misses = counter.memo_misses
    turn = [dict(m) for m in history] + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
    d2, c2 = digests_and_chain(turn)
    counts = count_history(turn, d2, c2)
    assert counts == [_fresh_counter().bind(CHAT).count_message(m) for m in turn]
    assert counter.memo_misses == misses + 2  # only the two new messages were counted
    hits = counter.memo_hits
    again = count_history(turn, d2, c2)  # a retry of the same request: no per-message lookup
    assert counter.memo_hits == hits
    assert again is count_history(turn, d2, c2) and again == counts  # the state's own list, no copy
    edited = turn[:-1] + [{"role": "user", "content": "other"}]  # a branch at the last message
    d3, c3 = digests_and_chain(edited)
    assert count_history(edited, d3, c3) == [_fresh_counter().bind(CHAT).count_message(m) for m in edited]
    assert counter.bind(CHAT).count_history(edited, d3, c3) == count_history(edited, d3, c3)  # without a state: the same
    with pytest.raises(ValueError):
        counter.bind(CHAT).count_history(turn, d2[:-1], c2)


def test_memoized_projection_equals_a_cold_one_turn_after_turn(counter):
    """Offload stubs, truncation and event positions come from memos on warm turns: same result as cold."""

    memos = ProjectionMemos()
    req = load_case("020")["request"]
    cfg = DefenseConfig(context_window_tokens=4096)
    history = list(req["messages"])
    for k in range(3):
        history += [{"role": "assistant", "content": f"step {k}"}, {"role": "user", "content": f"go on {k}"}]
        first = project_once(history, cfg, counter, tools=req["tools"], memos=memos)
        again = project_once([dict(m) for m in history], cfg, counter, tools=req["tools"], memos=memos)
        cold = project_once(history, cfg, _fresh_counter(), tools=req["tools"])
        for p in (first, again):
            assert orjson.dumps(p.messages) == orjson.dumps(cold.messages)
            assert (p.tokens_forwarded, p.tokens_client, p.applied, p.artifacts) == (
                cold.tokens_forwarded, cold.tokens_client, cold.applied, cold.artifacts)
        assert "offload" in first.applied and first.artifacts


def test_shortcut_for_untouched_requests_agrees_with_the_full_projection(counter, shared_dir, monkeypatch):
    """``project`` answers a request with no event, nothing to offload and no compaction due
    without its working state. On every request of every shared trace, at several windows and
    thresholds, that answer equals the full projection's: the same request with an event of
    another branch (it never applies, but it takes the full path) projects identically."""
    import proxy.projection as projection_module
    from proxy.offline.replay import load_trace, request_indices
    from storage.records import EventRecord

    full_runs = []
    real = projection_module._Projector.__init__

    def counting(self, *args, **kwargs):
        full_runs.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(projection_module._Projector, "__init__", counting)
    foreign = EventRecord("evt_elsewhere", 1, "summary", "f" * 64, {"summary": "S", "first_hash": "e" * 64},
                          10, 5, T0)
    configs = [DefenseConfig(context_window_tokens=None), DefenseConfig(context_window_tokens=16_384),
               DefenseConfig(context_window_tokens=131_072, offload_tool_tokens=2_000),
               DefenseConfig(context_window_tokens=32_768, patch_dangling_tool_calls="never")]
    shortcuts = compared = 0
    for path in sorted((shared_dir / "traces").glob("*.jsonl")):
        messages = load_trace(path)
        for cfg in configs:
            for i in request_indices(messages)[::3]:
                sent = messages[:i]
                before = len(full_runs)
                quick = project_once(sent, cfg, counter, reserved_output_tokens=256)
                shortcuts += len(full_runs) == before
                full = project_once(sent, cfg, counter, [foreign], reserved_output_tokens=256)
                assert len(full_runs) > before, "the event of another branch must take the full path"
                assert quick == full, (path.name, cfg.context_window_tokens, i)
                compared += 1
    assert shortcuts >= compared // 4, (shortcuts, compared)  # the shortcut is exercised...
    assert shortcuts < compared, (shortcuts, compared)  # ...and so is the full path's doing something


def test_each_artifact_names_the_message_it_was_offloaded_from(counter):
    """A tool result over the tool threshold is offloaded; the same text in a later user message,
    under the user threshold, is forwarded as sent: the artifact's ``source`` is the tool message's
    chain hash, also when the transform comes from the memo for a message at another position."""
    text = "\n".join(f"row {i}: {'x' * (i % 13)} café" for i in range(400))
    cfg = DefenseConfig(context_window_tokens=128_000, offload_tool_tokens=300)
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]}
    messages = [{"role": "user", "content": "Read it."}, call, {"role": "tool", "tool_call_id": "c1", "content": text},
                {"role": "user", "content": text}]
    memos = ProjectionMemos()
    p = project_once(messages, cfg, counter, memos=memos)
    chain = digests_and_chain(messages)[1]
    assert [m.get("content") == text for m in p.messages] == [False, False, False, True], "only the tool result"
    assert [(a.id, a.source) for a in p.artifacts] == [(artifact_id(text), chain[2])]
    moved = [{"role": "system", "content": "Be brief."}, *messages]  # the tool message now at index 3, from the memo
    p2 = project_once(moved, cfg, counter, memos=memos)
    assert [(a.id, a.source) for a in p2.artifacts] == [(artifact_id(text), digests_and_chain(moved)[1][3])]
