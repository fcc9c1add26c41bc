"""``proxy.compaction.plan_loop``: the plan loop over in-memory effects (no store, no upstream)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from proxy.compaction.offer import OwnToolOffer
from proxy.compaction.plan_loop import MAX_PLAN_ROUNDS, PlanLoop, Planned, event_id
from proxy.compaction.references import StoredContent
from proxy.compaction.summarizer import Summarizer, SummaryFailed, SummaryModel
from proxy.conversation.canonical import digests_and_chain
from proxy.conversation.chat_codec import CHAT
from proxy.defenses.offload import ArtifactToStore
from proxy.offline.replay import ReplayRequest, ReplaySession, load_trace, request_indices
from proxy.settings import Settings
from proxy.tokens.counter import TokenCounter, load_counter, reserved_output_tokens
from storage.records import EventRecord
from tests.conftest import SHARED_DIR

WINDOW = 4096
SESSION = ReplaySession(42, "sess-1")


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return load_counter(str(SHARED_DIR / "tiktoken"))


class Summaries:
    """A summary model answering ``SUMMARY <n>``; or failing (``fail``) on every call."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[tuple[str | None, int]] = []

    async def summarize(self, previous: str | None, chunk: list[dict[str, Any]], reply_tokens: int) -> str:
        self.calls.append((previous, len(chunk)))
        if self.fail:
            raise SummaryFailed("status 500")
        return f"SUMMARY {len(self.calls)}"


class Effects:
    """In-memory ``PlanEffects`` that record what was asked of them."""

    def __init__(self, model: SummaryModel, *, store_ok: bool = True, fresh: list[EventRecord] | None = None) -> None:
        self.model, self.store_ok, self.fresh = model, store_ok, fresh
        self.stored: list[str] = []
        self.events: list[EventRecord] = []
        self.locked = 0

    async def store_artifacts(self, artifacts: Sequence[ArtifactToStore]) -> bool:
        if self.store_ok:
            self.stored += [a.id for a in artifacts]
        return self.store_ok

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[list[EventRecord]]:
        self.locked += 1
        if self.fresh is not None:  # another request compacted meanwhile: once
            fresh, self.fresh = self.fresh, None
            self.events = fresh
            yield fresh
            return
        yield self.events

    async def add_event(self, event: EventRecord, events: list[EventRecord]) -> EventRecord:
        self.events = [*events, event]
        return event

    def summary_model(self) -> SummaryModel:
        return self.model

    def now(self) -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC)


def loop_of(counter: TokenCounter, **settings: Any) -> PlanLoop:
    s = Settings(**settings)
    return PlanLoop(s, counter, OwnToolOffer(s, StoredContent()), Summarizer(s, counter, CHAT), CHAT)


def request(messages: list[dict[str, Any]], **fields: Any) -> ReplayRequest:
    body = {"model": "m", "messages": messages, **fields}
    digests, chain = digests_and_chain(messages)
    return ReplayRequest(body, orjson.dumps(body), messages, digests, chain, SESSION)


def long_chat(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        out += [{"role": "user", "content": f"question {i}: " + "words and more words " * 20},
                {"role": "assistant", "content": f"answer {i}: " + "reply text here " * 20}]
    out.append({"role": "user", "content": "and now?"})
    return out


def test_event_ids_keep_their_value() -> None:
    """The stored ids must not change: a summary message names its event id (the value of the old
    ``compactor._event_id``)."""
    assert event_id(7, "summary", "abc") == "evt_3ccd98d407cffe2ab58df4e1"
    assert event_id(8, "summary", "abc") != event_id(7, "summary", "abc")


def test_reserved_tokens_read_the_clients_token_limit() -> None:
    assert reserved_output_tokens({"max_completion_tokens": 300, "max_tokens": 100}) == 300
    assert reserved_output_tokens({"max_tokens": 100}) == 100
    assert reserved_output_tokens({"max_tokens": 0}) == reserved_output_tokens({"max_tokens": "9"}) == 0
    assert reserved_output_tokens({}) == reserved_output_tokens({"max_tokens": True}) == 0


async def test_an_untouched_request_is_forwarded_as_the_clients_bytes(counter: TokenCounter) -> None:
    req = request([{"role": "user", "content": "hello"}])
    effects = Effects(Summaries())
    planned = await loop_of(counter).prepare(req, WINDOW, [], effects, force=False, force_media=False)
    assert planned.prepared.body is req.raw
    assert planned.prepared.forwarded is None and planned.prepared.own_tools == frozenset()
    assert planned.prepared.count_tools is None and planned.prepared.window_tokens == WINDOW
    assert effects.locked == 0 and effects.events == []


async def test_a_request_over_the_trigger_is_summarized_stored_and_projected_again(counter: TokenCounter) -> None:
    req = request(long_chat(40))
    summaries = Summaries()
    effects = Effects(summaries)
    planned = await loop_of(counter).prepare(req, WINDOW, [], effects, force=False, force_media=False)
    [event] = effects.events
    assert event.kind == "summary" and event.id == event_id(SESSION.pk, "summary", event.anchor_hash)
    assert event.payload["summary"] == f"SUMMARY {len(summaries.calls)}"
    p = planned.prepared
    assert p.forwarded is not None and p.body == orjson.dumps(p.forwarded)
    assert p.applied[0] == "summary" and p.event_ids == (event.id,)
    text = orjson.dumps(p.forwarded["messages"]).decode()
    assert event.id in text and "/sessions/sess-1/archive" in text
    assert p.own_tools == {Settings().read_tool_name}  # the read tool goes with a summary
    assert [t["function"]["name"] for t in p.forwarded["tools"]] == [Settings().read_tool_name]
    assert p.tokens_forwarded is not None and p.tokens_client is not None and p.tokens_forwarded < p.tokens_client
    assert p.tokens_forwarded <= WINDOW


async def test_a_failed_summary_forwards_the_request_uncompacted(counter: TokenCounter,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    req = request(long_chat(40))
    effects = Effects(Summaries(fail=True))
    planned = await loop_of(counter, read_tool_enabled=False).prepare(req, WINDOW, [], effects, force=False,
                                                                      force_media=False)
    assert effects.events == [] and effects.locked == 1
    assert planned.prepared.body is req.raw
    assert planned.projection.plan is not None  # still planned: the next request tries again
    assert "summary call failed" in caplog.text


async def test_events_another_request_stored_meanwhile_are_applied_not_planned_again(counter: TokenCounter) -> None:
    req = request(long_chat(40))
    first = Effects(Summaries())
    await loop_of(counter).prepare(req, WINDOW, [], first, force=False, force_media=False)
    [theirs] = first.events
    # a second replica saw no events, planned the same summary, and finds it stored under the lock
    summaries = Summaries()
    second = Effects(summaries, fresh=[theirs])
    planned = await loop_of(counter).prepare(req, WINDOW, [], second, force=False, force_media=False)
    assert summaries.calls == [] and second.events == [theirs]
    assert planned.prepared.event_ids == (theirs.id,)


async def test_artifacts_that_fail_to_store_are_forwarded_in_full(counter: TokenCounter) -> None:
    big = "line of a long tool output\n" * 3000
    call = {"id": "c1", "type": "function", "function": {"name": "cat", "arguments": "{}"}}
    messages = [{"role": "user", "content": "cat it"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": big}]
    ok = await loop_of(counter).prepare(request(messages), 128_000, [], Effects(Summaries()), force=False,
                                        force_media=False)
    assert "offload" in ok.prepared.applied and b"/artifacts/art_" in ok.prepared.body
    failing = Effects(Summaries(), store_ok=False)
    planned = await loop_of(counter).prepare(request(messages), 128_000, [], failing, force=False, force_media=False)
    assert "offload" not in planned.prepared.applied and planned.prepared.body == request(messages).raw


async def test_at_most_max_plan_rounds_plans_are_executed(counter: TokenCounter) -> None:
    """An event that never takes effect (its anchor is not in the chain) cannot loop forever."""

    class Stray(Effects):
        async def add_event(self, event: EventRecord, events: list[EventRecord]) -> EventRecord:
            stray = EventRecord(f"evt_{len(self.events)}", 0, event.kind, "not-in-chain", event.payload,
                                event.tokens_before, event.tokens_after, event.created_at)
            self.events = [*events, stray]
            return stray

    summaries = Summaries()
    effects = Stray(summaries)
    await loop_of(counter).prepare(request(long_chat(40)), WINDOW, [], effects, force=False, force_media=False)
    assert len(effects.events) == MAX_PLAN_ROUNDS


def test_configs_are_built_once_per_window_and_read_tool_flag(counter: TokenCounter) -> None:
    loop = loop_of(counter)
    assert loop.config(4096, True) is loop.config(4096, True)
    assert loop.config(4096, False) is not loop.config(4096, True)
    assert loop.config(4096, True).read_tool_name == Settings().read_tool_name


async def _through_the_rounds(loop: PlanLoop, req: ReplayRequest, window: int | None, events: list[EventRecord],
                              effects: Effects) -> Planned:
    """What ``prepare`` did before it could skip the rounds: its first projection always handed to
    them (``PlanLoop.rounds``), then assembled the same way."""
    offer = loop.offer.offerable(req.body, req.compact_tool)
    cfg = loop.config(window, offer.has(loop.settings.read_tool_name))
    client_tools = req.body.get("tools") or None
    expected = loop.offer.expected(offer, bool(events), req.raw, req.messages, req.chain, req.expanded)
    count_tools = [*(client_tools or []), *expected] or None
    reserved, unavailable = reserved_output_tokens(req.body), set[str]()
    proj = await loop.project(req, cfg, count_tools, events, False, False, unavailable, reserved=reserved)
    proj = await loop.rounds(req, cfg, count_tools, events, effects, proj, unavailable, force=False, force_media=False,
                             new_events=True, reserved=reserved)
    return Planned(loop._assemble(req, proj, offer, client_tools, expected, count_tools, window), proj)


async def test_prepare_skips_the_rounds_only_where_they_would_stop_at_once(counter: TokenCounter,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``prepare`` hands its first projection to the plan rounds (``PlanLoop.rounds``) only when it
    has artifacts to store or a plan to execute. Over every fourth request of every shared trace (each turn with
    the events the earlier ones stored), at three windows, with the client's tools and the
    compaction tool or without: the same forward (bytes, estimates, defenses, events applied,
    the proxy's tools), the same artifacts stored and events stored as through the rounds; most
    requests skip them, some do not."""
    rounds: list[int] = []
    real = PlanLoop.rounds

    async def counting(self: PlanLoop, *args: Any, **kwargs: Any) -> Any:
        rounds.append(1)
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(PlanLoop, "rounds", counting)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    skipped = compared = 0
    traces = sorted((SHARED_DIR / "traces").glob("*.jsonl"))
    assert traces, "the shared traces are missing"
    for path in traces:
        messages = load_trace(path)
        for window, fields, compact_tool in ((None, {}, False), (16_384, {"tools": tools}, True),
                                             (WINDOW, {"max_tokens": 256}, False)):
            quick, full = loop_of(counter), loop_of(counter)
            quick_effects, full_effects = Effects(Summaries()), Effects(Summaries())
            for i in request_indices(messages)[::4]:
                req = dataclasses.replace(request(messages[:i], **fields), compact_tool=compact_tool)
                before = len(rounds)
                a = await quick.prepare(req, window, list(quick_effects.events), quick_effects, force=False,
                                        force_media=False)
                skipped += len(rounds) == before
                b = await _through_the_rounds(full, req, window, list(full_effects.events), full_effects)
                assert a == b, (path.name, window, i)
                assert (quick_effects.stored, quick_effects.events) == (full_effects.stored, full_effects.events)
                compared += 1
    assert skipped >= compared // 2, (skipped, compared)  # the common case skips the rounds...
    assert skipped < compared, (skipped, compared)  # ...and some requests need them
