"""Offline replay: what the proxy would forward for a recorded conversation, without any upstream.

``context-proxy replay TRACE.jsonl --model M`` reads a trace (one chat message per line, the format
of ``../shared/traces``), and replays it as its agent sent it: before each assistant message the
client sends every message so far. Each request goes through the proxy's own plan loop
(``proxy.compaction.plan_loop.PlanLoop``, the code ``ProjectingCompactor.prepare`` runs: the same
projection, event ids, own tools and body bytes), with events kept in memory for the rest of the
session and a forced compaction when the forwarded estimate would still overflow, at most
``max_overflow_retries`` times. Given the live session (``ReplaySession``) and the live summaries
(``summary_model``), it forwards byte for byte what the proxy forwarded
(``tests/compaction/test_replay_live_bytes.py``); what differs is only where the I/O went.

**By default it is an offline estimate.** Summaries come from a deterministic local summarizer
(``offline_summary``: the first line of each summarized message and the lines that carry facts,
``FACT:``/``DECISION:``/``TODO:``/``NOTE:``), cut to the size the planner expects of a model's
summary (``DefenseConfig.summary_estimate_tokens``). A real summary differs in wording, not in
where the cutoffs fall. Token counts are the proxy's own tiktoken estimates; "overflow" means the
estimate exceeds the context window.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from proxy.compaction.models import ModelProfiles
from proxy.compaction.offer import OwnToolOffer
from proxy.compaction.plan_loop import PlanLoop
from proxy.compaction.references import StoredContent
from proxy.compaction.summarizer import Summarizer, SummaryModel
from proxy.conversation.canonical import digests_and_chain
from proxy.conversation.chat_codec import CHAT
from proxy.defenses.config import SUMMARY_HEADER_TOKENS, DefenseConfig
from proxy.defenses.offload import ArtifactToStore
from proxy.defenses.summarize import PROMPT_OVERHEAD_TOKENS, render_message, render_transcript
from proxy.settings import Settings
from proxy.tokens.counter import TokenCounter, load_counter
from storage.records import EventRecord

OFFLINE_LABEL = "offline estimate: deterministic local summarizer, no upstream calls"
FACT_LINE = re.compile(r"\b(FACT|DECISION|TODO|NOTE):")
"""Lines the offline summarizer always keeps (the fake upstream's summarizer keeps ``FACT:`` lines too)."""
FIRST_LINE_CHARS = 200
"""Each message's first line is cut at this many characters in the offline summary."""
REPLAY_SESSION_ID = "replay"
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def load_trace(path: str | Path) -> list[dict[str, Any]]:
    """The messages of a JSONL trace (blank lines skipped). Raises ``ValueError`` naming the line
    of a line that is not a JSON object with a ``role``."""
    messages: list[dict[str, Any]] = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc})") from exc
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError(f"{path}:{n}: not a chat message (a JSON object with a 'role')")
        messages.append(message)
    return messages


def offline_summary(previous: str | None, messages: list[dict[str, Any]], budget_tokens: int,
                    counter: TokenCounter) -> str:
    """A deterministic stand-in for a model's summary of ``messages`` folded into ``previous``.

    Keeps, in order, the previous summary's lines, then per message its role and first line (cut
    at ``FIRST_LINE_CHARS``) and every ``FACT_LINE``; drops the oldest non-fact lines until the
    text fits ``budget_tokens`` (then the oldest fact lines, if facts alone are over budget).
    """
    lines = [ln for ln in (previous or "").splitlines() if ln.strip()]
    for message in messages:
        rendered = render_message(message, CHAT).splitlines()
        body = [ln for ln in rendered[1:] if ln.strip()]
        role = str(message.get("role", "?"))
        if body:
            lines.append(f"- {role}: {body[0].strip()[:FIRST_LINE_CHARS]}")
        lines.extend(ln.strip() for ln in body[1:] if FACT_LINE.search(ln))
    counts = [counter.count_text(ln) + 1 for ln in lines]
    total = sum(counts)
    for facts_too in (False, True):
        i = 0
        while total > budget_tokens and i < len(lines):
            if facts_too or not FACT_LINE.search(lines[i]):
                total -= counts[i]
                del lines[i], counts[i]
            else:
                i += 1
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class TurnResult:
    """One replayed request. Tokens are whole-prompt estimates (messages + tools + reserved output)."""

    turn: int
    message_count: int
    tokens_without: int
    tokens_with: int
    compactions: tuple[str, ...]
    applied: tuple[str, ...]
    summary_calls: int
    summary_input_tokens: int
    overflow_without: bool
    overflow_with: bool
    unfittable: str | None = None


@dataclass
class ReplayReport:
    """All turns of a replay and their totals."""

    model: str
    window_tokens: int | None
    exact_tokens: bool
    turns: list[TurnResult] = field(default_factory=list)

    @property
    def tokens_without(self) -> int:
        return sum(t.tokens_without for t in self.turns)

    @property
    def tokens_with(self) -> int:
        return sum(t.tokens_with for t in self.turns)

    @property
    def saved_fraction(self) -> float:
        """Share of the prompt tokens the proxy would not forward (0..1; summary calls excluded)."""
        return 1 - self.tokens_with / self.tokens_without if self.tokens_without else 0.0

    @property
    def compactions(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.turns:
            for kind in t.compactions:
                out[kind] = out.get(kind, 0) + 1
        return out

    @property
    def defenses_applied(self) -> dict[str, int]:
        """Requests each defense changed (offload and clipping need no event, so are not compactions)."""
        out: dict[str, int] = {}
        for t in self.turns:
            for name in t.applied:
                out[name] = out.get(name, 0) + 1
        return out

    @property
    def overflows_without(self) -> int:
        return sum(t.overflow_without for t in self.turns)

    @property
    def overflows_with(self) -> int:
        return sum(t.overflow_with for t in self.turns)

    @property
    def summary_calls(self) -> int:
        return sum(t.summary_calls for t in self.turns)

    @property
    def summary_input_tokens(self) -> int:
        return sum(t.summary_input_tokens for t in self.turns)


def request_indices(messages: list[dict[str, Any]]) -> list[int]:
    """Where the client sent a request: before each assistant message (``messages[:i]`` is sent)."""
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]


class OfflineSummaryModel:
    """``offline_summary`` as a ``proxy.compaction.summarizer.SummaryModel``: each summary cut to
    ``budget_tokens`` (the size the planner expects of a model's summary), whatever the reply budget."""

    def __init__(self, counter: TokenCounter, budget_tokens: int) -> None:
        self.counter, self.budget_tokens = counter, budget_tokens

    async def summarize(self, previous: str | None, chunk: list[dict[str, Any]], reply_tokens: int) -> str:
        return offline_summary(previous, chunk, self.budget_tokens, self.counter)


class _Counted:
    """A ``SummaryModel`` that counts the calls made of ``inner`` and their input tokens (the
    transcript, the prompt's fixed part and the previous summary, as the proxy would send)."""

    def __init__(self, inner: SummaryModel, counter: TokenCounter) -> None:
        self.inner, self.counter = inner, counter
        self.calls = self.input_tokens = 0

    async def summarize(self, previous: str | None, chunk: list[dict[str, Any]], reply_tokens: int) -> str:
        prior = self.counter.count_text(previous) if previous else 0
        self.calls += 1
        self.input_tokens += self.counter.count_text(render_transcript(chunk, CHAT)) + PROMPT_OVERHEAD_TOKENS + prior
        return await self.inner.summarize(previous, chunk, reply_tokens)


@dataclass(frozen=True, slots=True)
class ReplaySession:
    """The session a replay stands for: its store key and the client's session id (both appear in
    what is forwarded: event ids hash ``pk``, archive URLs name ``session_id``)."""

    pk: int = 0
    session_id: str = REPLAY_SESSION_ID


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """One replayed request as the plan loop reads it (``proxy.compaction.plan_loop.PlanInput``)."""

    body: dict[str, Any]
    raw: bytes
    messages: list[dict[str, Any]]
    digests: list[str]
    chain: list[str]
    session: ReplaySession
    expanded: bool = False
    compact_tool: bool = False
    escalated: bool = False


class _MemoryEffects:
    """The plan loop's I/O kept in memory: artifacts count as stored, events live in a list as the
    store would keep them, summaries come from ``model``."""

    def __init__(self, model: _Counted) -> None:
        self.model = model
        self.events: list[EventRecord] = []
        self.added: list[str] = []

    async def store_artifacts(self, artifacts: Sequence[ArtifactToStore]) -> bool:
        return True

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[list[EventRecord]]:
        yield self.events

    async def add_event(self, event: EventRecord, events: list[EventRecord]) -> EventRecord:
        self.events = [*events, event]
        self.added.append(event.kind)
        return event

    def summary_model(self) -> SummaryModel:
        return self.model

    def now(self) -> datetime:
        return _EPOCH


class _Session:
    """Replays one conversation through the live plan loop (``PlanLoop``)."""

    def __init__(self, messages: list[dict[str, Any]], model: str, settings: Settings, window: int | None,
                 counter: TokenCounter, fields: dict[str, Any], session: ReplaySession,
                 summary_model: SummaryModel | None) -> None:
        self.messages, self.model, self.settings, self.counter = messages, model, settings, counter
        self.window, self.fields, self.session = window, fields, session
        self.loop = PlanLoop(settings, counter, OwnToolOffer(settings, StoredContent()),
                             Summarizer(settings, counter, CHAT), CHAT)
        if summary_model is None:
            budget = DefenseConfig.from_settings(settings, window).summary_estimate_tokens - SUMMARY_HEADER_TOKENS
            summary_model = OfflineSummaryModel(counter, budget)
        self.effects = _MemoryEffects(_Counted(summary_model, counter))
        self.digests, self.chain = digests_and_chain(messages)

    def request(self, n: int) -> ReplayRequest:
        """The client's request before message ``n``: ``{"model", "messages", **fields}``."""
        body = {"model": self.model, "messages": self.messages[:n], **self.fields}
        return ReplayRequest(body, orjson.dumps(body), body["messages"], self.digests[:n], self.chain[:n], self.session)

    async def turn(self, number: int, n: int, on_forward: Callable[[int, bytes], None] | None) -> TurnResult:
        model, effects = self.effects.model, self.effects
        calls, cost, added = model.calls, model.input_tokens, len(effects.added)
        req, window = self.request(n), self.window
        force = False
        for retries in range(self.settings.max_overflow_retries + 1):
            planned = await self.loop.prepare(req, window, effects.events, effects, force=force, force_media=False)
            p, proj = planned.prepared, planned.projection
            if on_forward is not None:
                on_forward(number, p.body)
            over = window is not None and (p.tokens_forwarded or 0) > window
            if not over or proj.reason_unfittable or retries == self.settings.max_overflow_retries:
                break
            force = True  # the upstream would answer with an overflow: the pipeline compacts and retries
        tokens_client, tokens_forwarded = p.tokens_client or 0, p.tokens_forwarded or 0
        return TurnResult(
            turn=number, message_count=n, tokens_without=tokens_client, tokens_with=tokens_forwarded,
            compactions=tuple(effects.added[added:]), applied=p.applied,
            summary_calls=model.calls - calls, summary_input_tokens=model.input_tokens - cost,
            overflow_without=window is not None and tokens_client > window,
            overflow_with=over or proj.reason_unfittable is not None, unfittable=proj.reason_unfittable,
        )


def resolve_window(model: str, settings: Settings, window_tokens: int | None) -> int | None:
    """``window_tokens`` if given, else the model profile's window (``None``: unknown model)."""
    if window_tokens is not None:
        return window_tokens
    profile = ModelProfiles(settings.models_file).lookup(model)
    return profile.context_window_tokens if profile is not None else None


def replay(
    messages: list[dict[str, Any]],
    *,
    model: str,
    settings: Settings,
    window_tokens: int | None = None,
    counter: TokenCounter | None = None,
    tools: list[dict[str, Any]] | None = None,
    reserved_output_tokens: int = 0,
    on_turn: Callable[[TurnResult, int], None] | None = None,
    session: ReplaySession | None = None,
    summary_model: SummaryModel | None = None,
    on_forward: Callable[[int, bytes], None] | None = None,
) -> ReplayReport:
    """``areplay`` run to its end in a new event loop (for callers outside one: the CLI, tests)."""
    return asyncio.run(areplay(messages, model=model, settings=settings, window_tokens=window_tokens, counter=counter,
                               tools=tools, reserved_output_tokens=reserved_output_tokens, on_turn=on_turn,
                               session=session, summary_model=summary_model, on_forward=on_forward))


async def areplay(
    messages: list[dict[str, Any]],
    *,
    model: str,
    settings: Settings,
    window_tokens: int | None = None,
    counter: TokenCounter | None = None,
    tools: list[dict[str, Any]] | None = None,
    reserved_output_tokens: int = 0,
    on_turn: Callable[[TurnResult, int], None] | None = None,
    session: ReplaySession | None = None,
    summary_model: SummaryModel | None = None,
    on_forward: Callable[[int, bytes], None] | None = None,
) -> ReplayReport:
    """Replay ``messages`` (a trace) turn by turn; ``on_turn(result, total_turns)`` after each turn.

    Each request is ``{"model": model, "messages": messages[:n]}`` (plus ``tools`` and
    ``max_tokens: reserved_output_tokens`` when given), serialized as ``orjson.dumps`` does, and
    goes through the live plan loop (``proxy.compaction.plan_loop.PlanLoop.prepare``) with the
    window ``window_tokens`` (default: the model profile's) and events kept in memory;
    ``on_forward(turn, body)`` gets every body the proxy would forward (a forced compaction's
    retry too). ``session``: the session the events belong to (default ``pk`` 0, id
    ``"replay"``); ``summary_model``: who writes summaries (default ``OfflineSummaryModel``).
    ``counter`` defaults to the proxy's (``load_counter(settings.tiktoken_cache_dir)``).
    Deterministic: the same input gives the same report and the same bytes.
    """
    counter = counter or load_counter(settings.tiktoken_cache_dir)
    window = resolve_window(model, settings, window_tokens)
    fields: dict[str, Any] = {}
    if tools:
        fields["tools"] = tools
    if reserved_output_tokens > 0:
        fields["max_tokens"] = reserved_output_tokens
    replayed = _Session(messages, model, settings, window, counter, fields, session or ReplaySession(), summary_model)
    report = ReplayReport(model=model, window_tokens=window, exact_tokens=counter.exact)
    indices = request_indices(messages)
    for number, n in enumerate(indices, 1):
        result = await replayed.turn(number, n, on_forward)
        report.turns.append(result)
        if on_turn is not None:
            on_turn(result, len(indices))
    return report
