"""Plans: compaction events the projection asks the pipeline to perform and store.

The pipeline executes a plan (for a summary: the upstream calls), stores an ``EventRecord`` with
``kind=plan.kind``, ``anchor_hash=plan.anchor_hash``, ``payload=plan.payload(...)``,
``tokens_before``/``tokens_after``, then projects again with the new event included; that second
projection needs no plan (store a summary event's ``tokens_after`` as that re-projection's
``tokens_forwarded``). Anchors are chain hashes (DESIGN.md section 3): an event applies to a
request iff its ``anchor_hash`` is among the request's chain hashes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class TruncatePlan:
    """Truncate old tool-call arguments in messages up to and including ``anchor_hash``'s message.

    No upstream call needed. Event kind ``truncate_args``, payload ``{"boundary_hash": anchor}``.
    """

    anchor_hash: str
    tokens_before: int
    tokens_after: int
    kind: str = "truncate_args"

    def payload(self) -> dict[str, Any]:
        """The event payload to store."""
        return {"boundary_hash": self.anchor_hash}


@dataclass(frozen=True, slots=True)
class MediaPlan:
    """Offload inline images of messages up to and including ``anchor_hash``'s message (case 019).

    Planned after a body-size overflow (``force_media``). Event kind ``media``, payload
    ``{"boundary_hash": anchor}``. No upstream call; the re-projection lists the artifacts.
    """

    anchor_hash: str
    tokens_before: int
    tokens_after: int
    kind: str = "media"

    def payload(self) -> dict[str, Any]:
        """The event payload to store."""
        return {"boundary_hash": self.anchor_hash}


@dataclass(frozen=True, slots=True)
class SummaryPlan:
    """Summarize the client's messages ``first_index..cutoff_index`` (inclusive) into one message.

    ``anchor_hash``: chain hash of the cutoff message (the last summarized). ``to_summarize``: the
    messages to fold *since the previous summary* (offload stubs and media references already in
    place, so the summary request fits); ``previous_summary``/``previous_event_id``: the applied
    summary to fold in (chained summaries). ``pinned_user_hash``: chain hash of the user's latest
    request when it lies inside the span (it is repeated verbatim in the summary message).
    ``tokens_after_estimate`` uses ``DefenseConfig.summary_estimate_tokens`` for the summary.
    Event kind ``summary``; payload from ``payload(summary_text)``.
    """

    anchor_hash: str
    first_hash: str
    first_index: int
    cutoff_index: int
    previous_summary: str | None
    previous_event_id: str | None
    to_summarize: list[dict[str, Any]]
    tokens_before: int
    tokens_after_estimate: int
    pinned_user_hash: str | None = None
    kind: str = field(default="summary")

    @property
    def message_count(self) -> int:
        """Client messages covered by the summary (cumulative over chained summaries)."""
        return self.cutoff_index - self.first_index + 1

    def payload(self, summary_text: str) -> dict[str, Any]:
        """The event payload to store, given the summary text the model returned."""
        return {
            "summary": summary_text,
            "first_hash": self.first_hash,
            "cutoff_hash": self.anchor_hash,
            "previous_event_id": self.previous_event_id,
            "message_count": self.message_count,
            "pinned_user_hash": self.pinned_user_hash,
        }


Plan = TruncatePlan | SummaryPlan | MediaPlan
