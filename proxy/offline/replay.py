"""Offline replay: what the proxy would forward for a recorded conversation, without any upstream.

``context-proxy replay TRACE.jsonl --model M`` reads a trace (one chat message per line, the format
of ``../shared/traces``), and replays it as its agent sent it: before each assistant message the
client sends every message so far. Each request goes through ``proxy.projection.project`` and the
plan loop of ``proxy.compaction.compactor.ProjectingCompactor.prepare`` (at most ``MAX_PLAN_ROUNDS`` plans
executed per request, events kept in memory for the rest of the session, a forced compaction when
the forwarded estimate would still overflow, at most ``max_overflow_retries`` times).

**It is an offline estimate.** Summaries come from a deterministic local summarizer
(``offline_summary``: the first line of each summarized message and the lines that carry facts,
``FACT:``/``DECISION:``/``TODO:``/``NOTE:``), cut to the size the planner expects of a model's
summary (``DefenseConfig.summary_estimate_tokens``). A real summary differs in wording, not in
where the cutoffs fall. Token counts are the proxy's own tiktoken estimates; "overflow" means the
estimate exceeds the context window.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from proxy.compaction.compactor import MAX_PLAN_ROUNDS
from proxy.compaction.models import ModelProfiles
from proxy.conversation.canonical import digests_and_chain
from proxy.defenses.config import SUMMARY_HEADER_TOKENS
from proxy.defenses.summarize import (
    PROMPT_OVERHEAD_TOKENS,
    chunk_budget_tokens,
    render_message,
    render_transcript,
    summary_chunks,
)
from proxy.projection import DefenseConfig, Projection, SummaryPlan, project
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


def offline_summary(previous: str | None, messages: list[dict[str, Any]], budget_tokens: int, counter: TokenCounter) -> str:
    """A deterministic stand-in for a model's summary of ``messages`` folded into ``previous``.

    Keeps, in order, the previous summary's lines, then per message its role and first line (cut
    at ``FIRST_LINE_CHARS``) and every ``FACT_LINE``; drops the oldest non-fact lines until the
    text fits ``budget_tokens`` (then the oldest fact lines, if facts alone are over budget).
    """
    lines = [ln for ln in (previous or "").splitlines() if ln.strip()]
    for message in messages:
        rendered = render_message(message).splitlines()
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


class _Session:
    """Replays one conversation; events live in memory as the store would keep them."""

    def __init__(self, messages: list[dict[str, Any]], model: str, settings: Settings, window: int | None,
                 counter: TokenCounter, tools: list[dict[str, Any]] | None, reserved_output_tokens: int) -> None:
        self.messages, self.model, self.settings, self.counter = messages, model, settings, counter
        self.tools, self.reserved = tools, reserved_output_tokens
        self.cfg = DefenseConfig.from_settings(settings, window)
        self.digests, self.chain = digests_and_chain(messages)
        self.events: list[EventRecord] = []

    def _project(self, n: int, force: bool) -> Projection:
        return project(
            self.messages[:n], digests=self.digests[:n], chain_hashes=self.chain[:n], tools=self.tools,
            reserved_output_tokens=self.reserved, events=self.events, config=self.cfg, counter=self.counter,
            session_id=REPLAY_SESSION_ID, force=force,
        )

    def _execute(self, proj: Projection, result: dict[str, Any]) -> EventRecord:
        plan = proj.plan
        assert plan is not None
        if isinstance(plan, SummaryPlan):
            summary, calls, cost = self._summarize(plan)
            result["summary_calls"] += calls
            result["summary_input_tokens"] += cost
            payload, after = plan.payload(summary), plan.tokens_after_estimate
        else:
            payload, after = plan.payload(), plan.tokens_after
        digest = hashlib.sha256(f"{plan.kind}:{plan.anchor_hash}".encode()).hexdigest()[:24]
        event = EventRecord(f"evt_{digest}", 0, plan.kind, plan.anchor_hash, payload, plan.tokens_before, after,
                            _EPOCH)
        result["compactions"].append(plan.kind)
        return event

    def _summarize(self, plan: SummaryPlan) -> tuple[str, int, int]:
        """The offline summary, and the summary calls (count, input tokens) the proxy would make."""
        window = self.cfg.context_window_tokens or self.settings.fallback_trigger_tokens
        budget = self.cfg.summary_estimate_tokens - SUMMARY_HEADER_TOKENS
        summary = plan.previous_summary
        calls = cost = 0
        prior = self.counter.count_text(summary) if summary else 0
        for chunk in summary_chunks(plan.to_summarize, chunk_budget_tokens(window, self.settings.summary_max_tokens, prior),
                                    self.counter):
            cost += self.counter.count_text(render_transcript(chunk)) + PROMPT_OVERHEAD_TOKENS + prior
            calls += 1
            summary = offline_summary(summary, chunk, budget, self.counter)
            prior = self.counter.count_text(summary)
        return summary or "", calls, cost

    def prepare(self, n: int, force: bool, result: dict[str, Any]) -> Projection:
        """``ProjectingCompactor.prepare`` without I/O (artifacts count as stored)."""
        proj = self._project(n, force)
        for _ in range(MAX_PLAN_ROUNDS):
            if proj.plan is None:
                break
            self.events.append(self._execute(proj, result))
            force = False
            proj = self._project(n, force)
        return proj

    def turn(self, number: int, n: int) -> TurnResult:
        result: dict[str, Any] = {"compactions": [], "summary_calls": 0, "summary_input_tokens": 0}
        window = self.cfg.context_window_tokens
        proj = self.prepare(n, False, result)
        retries = 0
        while (window is not None and proj.tokens_forwarded > window and not proj.reason_unfittable
               and retries < self.settings.max_overflow_retries):
            retries += 1  # the upstream would answer with an overflow: the pipeline compacts and retries
            proj = self.prepare(n, True, result)
        over = window is not None and proj.tokens_forwarded > window
        return TurnResult(
            turn=number, message_count=n, tokens_without=proj.tokens_client, tokens_with=proj.tokens_forwarded,
            compactions=tuple(result["compactions"]), applied=proj.applied,
            summary_calls=result["summary_calls"], summary_input_tokens=result["summary_input_tokens"],
            overflow_without=window is not None and proj.tokens_client > window,
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
) -> ReplayReport:
    """Replay ``messages`` (a trace) turn by turn; ``on_turn(result, total_turns)`` after each turn.

    ``window_tokens`` overrides the model profile's window. ``counter`` defaults to the proxy's
    (``load_counter(settings.tiktoken_cache_dir)``). Deterministic: the same input gives the
    same report.
    """
    counter = counter or load_counter(settings.tiktoken_cache_dir)
    window = resolve_window(model, settings, window_tokens)
    session = _Session(messages, model, settings, window, counter, tools, reserved_output_tokens)
    report = ReplayReport(model=model, window_tokens=window, exact_tokens=counter.exact)
    indices = request_indices(messages)
    for number, n in enumerate(indices, 1):
        result = session.turn(number, n)
        report.turns.append(result)
        if on_turn is not None:
            on_turn(result, len(indices))
    return report
