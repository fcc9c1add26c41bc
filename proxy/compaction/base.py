"""The compaction shell around the pure projection: what the pipeline asks before each forward.

``Compactor`` is the pass-through base (used when compaction is disabled): it forwards the
client's bytes unchanged. ``proxy.compaction.compactor.ProjectingCompactor`` runs the defenses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from proxy.compaction.overflow import Overflow
    from proxy.forward.pipeline import ChatContext


@dataclass(frozen=True, slots=True)
class Prepared:
    """What to forward: the body bytes and what the defenses did (for headers, metrics, the record).

    ``tokens_client``/``tokens_forwarded`` are estimates (tiktoken) of the prompt as the client sent
    it and as forwarded, tools and reserved output tokens included.
    """

    body: bytes
    tokens_client: int | None = None
    tokens_forwarded: int | None = None
    applied: tuple[str, ...] = ()
    event_ids: tuple[str, ...] = ()
    forwarded: dict[str, Any] | None = None
    """The forwarded body as a dict when it differs from the client's (``None``: ``body`` is the client's bytes)."""
    own_tools: frozenset[str] = frozenset()
    """Names of the proxy's own tools appended to ``tools`` (served by the proxy, hidden from the client)."""
    window_tokens: int | None = None


class Compactor:
    """Pass-through: forwards the body as sent and never retries an overflow."""

    retries_overflows = False
    """Whether an overflow can be compacted and retried at all (a stream's first events are then
    held until they carry something, so that an error event among them can be retried)."""

    async def prepare(self, ctx: ChatContext, *, overflow: Overflow | None) -> Prepared:
        if ctx.expanded:
            forwarded = ctx.body | {"messages": ctx.messages}
            return Prepared(orjson.dumps(forwarded), forwarded=forwarded)
        return Prepared(ctx.raw)

    async def compact_now(self, ctx: ChatContext) -> str:
        return "[context-proxy] Compaction is disabled on this proxy; nothing was removed."

    async def learn(self, ctx: ChatContext, overflow: Overflow) -> None:
        return None

    def can_retry(self, ctx: ChatContext, overflow: Overflow) -> bool:
        return False

    def usage_observed(self, ctx: ChatContext, usage: dict[str, Any] | None) -> bool:
        return False

    def forget_refused(self, session_pk: int, tenant: str, artifact_ids: list[str], events_deleted: bool) -> None:
        """Drop what this process remembers of a refused request's deleted rows: ``tenant``'s
        artifacts ``artifact_ids`` and (``events_deleted``) the session's events."""
        return

    def forget_limits(self, tenant: str | None, model: str | None) -> None:
        """Drop what this process remembers of learned limits (after a reset); ``None``: all."""
        return

    async def persist_observed(self, ctx: ChatContext) -> None:
        return None
