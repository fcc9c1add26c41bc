"""The compaction shell around the pure projection: what the pipeline asks before each forward.

``Compactor`` is the pass-through base (used when compaction is disabled): it forwards the
client's bytes unchanged. ``proxy.compactor.ProjectingCompactor`` runs the defenses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.overflow import Overflow
    from proxy.pipeline import ChatContext


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


class Compactor:
    """Pass-through: forwards the body as sent and never retries an overflow."""

    async def prepare(self, ctx: ChatContext, *, overflow: Overflow | None) -> Prepared:
        return Prepared(ctx.raw)

    async def learn(self, ctx: ChatContext, overflow: Overflow) -> None:
        return None

    def can_retry(self, ctx: ChatContext, overflow: Overflow) -> bool:
        return False

    async def observe_reply(self, ctx: ChatContext, usage: dict[str, Any] | None) -> None:
        return None
