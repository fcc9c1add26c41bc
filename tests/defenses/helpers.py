"""Helpers of the defense and projection tests: shared cases, a pipeline stand-in, fake summaries.

``run_plans`` plays the pipeline's part around the pure projection: project, and while a plan comes
back, fabricate the event the pipeline would store (a summary made by ``fake_summary``, which keeps
every ``FACT:`` line like the fake upstream's summarizer) and project again.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proxy.conversation.canonical import digests_and_chain
from proxy.conversation.chat_codec import CHAT
from proxy.defenses.config import DefenseConfig
from proxy.defenses.plans import SummaryPlan
from proxy.defenses.summarize import render_transcript
from proxy.projection import Projection, project
from storage.records import EventRecord

CASES_DIR = Path(__file__).resolve().parents[3] / "shared" / "cases"
_REPEAT = re.compile(r"\{\{repeat:(\d+):(.*?)\}\}", re.DOTALL)
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def expand(value: Any) -> Any:
    """Expand ``{{repeat:N:TEXT}}`` in every string of ``value`` (cases README convention)."""
    if isinstance(value, str):
        return _REPEAT.sub(lambda m: m.group(2) * int(m.group(1)), value)
    if isinstance(value, list):
        return [expand(v) for v in value]
    if isinstance(value, dict):
        return {k: expand(v) for k, v in value.items()}
    return value


def load_case(case_id: str) -> dict[str, Any]:
    """The case file whose name starts with ``case_id``, with its request expanded."""
    path = next(CASES_DIR.glob(f"{case_id}-*.json"))
    case = json.loads(path.read_text())
    case["request"] = expand(case["request"])
    return case


def fake_summary(plan: SummaryPlan) -> str:
    """A deterministic structured summary keeping every FACT line (as the fake upstream does)."""
    text = (plan.previous_summary or "") + "\n" + render_transcript(plan.to_summarize, CHAT)
    facts = []
    for line in text.splitlines():
        if "FACT:" in line and line.strip() not in facts:
            facts.append(line.strip())
    return (
        "## Session intent\nContinue the user's task.\n"
        f"## Summary and decisions\n{plan.message_count} messages summarized.\n"
        "## Artifacts\nnone\n## Next steps\ncontinue\n" + "\n".join(facts)
    )


def fabricate_event(plan: Any, summary_text: str | None = None) -> EventRecord:
    """The ``EventRecord`` the pipeline would store for ``plan`` (deterministic id)."""
    payload = plan.payload(summary_text if summary_text is not None else fake_summary(plan)) \
        if isinstance(plan, SummaryPlan) else plan.payload()
    after = plan.tokens_after_estimate if isinstance(plan, SummaryPlan) else plan.tokens_after
    event_id = "evt_" + hashlib.sha256(f"{plan.kind}:{plan.anchor_hash}".encode()).hexdigest()[:16]
    return EventRecord(event_id, 1, plan.kind, plan.anchor_hash, payload, plan.tokens_before, after, T0)


def run_plans(
    messages: list[dict[str, Any]],
    config: DefenseConfig,
    counter: Any,
    events: list[EventRecord] | None = None,
    *,
    tools: list[dict[str, Any]] | None = None,
    reserved_output_tokens: int = 0,
    force: bool = False,
    force_media: bool = False,
    session_id: str = "s1",
    max_rounds: int = 4,
) -> tuple[Projection, list[EventRecord]]:
    """Project, executing plans like the pipeline until none is left; returns the last projection and all events."""
    events = list(events or [])
    digests, chain = digests_and_chain(messages)
    for _ in range(max_rounds):
        projection = project(
            messages, digests=digests, chain_hashes=chain, events=events, config=config, counter=counter,
            session_id=session_id, tools=tools, reserved_output_tokens=reserved_output_tokens,
            force=force, force_media=force_media, codec=CHAT,
        )
        if projection.plan is None:
            return projection, events
        events.append(fabricate_event(projection.plan))
        force = force_media = False
    raise AssertionError("the plan loop did not converge")


def project_once(messages, config, counter, events=(), **kw: Any) -> Projection:
    """One ``project`` call with digests and chain computed here."""
    digests, chain = digests_and_chain(messages)
    kw.setdefault("session_id", "s1")
    kw.setdefault("codec", CHAT)
    return project(messages, digests=digests, chain_hashes=chain, events=list(events), config=config,
                   counter=counter, **kw)
