"""The compaction interface the chat use case calls before each forward, and its pass-through.

Dependencies point one way: ``proxy.forward`` calls this package, never the reverse. What the
compactor reads of a request is ``CompactionInput`` (a Protocol of read-only members: the pipeline's
``proxy.forward.context.ChatContext`` is one, checked structurally, so nothing here imports it);
what it returns is ``Prepared``. The compactor never writes to its input. The one thing it
asks of the caller is ``CompactionInput.ensure_logged()``: write the client's messages now, because a
compaction event about to be stored anchors on them (an event never anchors on a message missing from
the log); it is the caller's to do (the pipeline passes it in, on the input), and afterwards
``session`` reads the session they went to.

``Compactor`` is the pass-through (compaction disabled): it forwards the client's bytes unchanged
and never retries an overflow. ``proxy.compaction.compactor.ProjectingCompactor`` runs the defenses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from proxy.json_depth import dumps

if TYPE_CHECKING:
    from proxy.compaction.overflow import Overflow
    from storage.records import SessionRecord


class CompactionInput(Protocol):
    """What the compactor reads of one chat request; read-only (the compactor never writes to it).

    ``messages`` are the client's messages (with ``expanded``: with the proxy's earlier tool rounds
    put back), ``digests``/``chain`` their digests and chain hashes (one per message,
    ``proxy.conversation.canonical``); ``raw`` the client's body bytes and ``body`` it parsed;
    ``upstream_headers`` the headers a summary call sends (the client's credentials);
    ``prepared`` the last ``prepare``'s result (``None`` before the first) and ``internal`` the
    messages of the proxy's own tool rounds sent since it (both read by ``learn``,
    ``usage_observed`` and ``compact_now``).
    """

    @property
    def request_id(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def session(self) -> SessionRecord:
        """The request's session; after ``ensure_logged``, the one its messages went to (opened
        again if retention had deleted the request's)."""
        ...
    @property
    def body(self) -> dict[str, Any]: ...
    @property
    def raw(self) -> bytes: ...
    @property
    def messages(self) -> list[dict[str, Any]]: ...
    @property
    def digests(self) -> list[str]: ...
    @property
    def chain(self) -> list[str]: ...
    @property
    def upstream_headers(self) -> list[tuple[str, str]]: ...
    @property
    def compact_tool(self) -> bool:
        """The client asked for the manual compaction tool (header ``X-Context-Proxy-Compact-Tool``)."""
        ...
    @property
    def escalated(self) -> bool:
        """An overflow's retry came out as the attempt the provider refused: compact further (a
        signed tool cycle is then summarized whole)."""
        ...
    @property
    def expanded(self) -> bool:
        """``messages`` include internal rounds the client's history does not (forward them, not ``raw``)."""
        ...
    @property
    def prepared(self) -> Prepared | None: ...
    @property
    def internal(self) -> Sequence[dict[str, Any]]: ...

    async def ensure_logged(self) -> object:
        """Write the client's messages now if not yet written (before a compaction event anchors on
        them); shielded from the request's cancellation. Raises ``storage.errors.StorageError``."""
        ...


@dataclass(slots=True)
class Prepared:
    """What to forward: the body bytes and what the defenses did (for headers, metrics, the record).

    ``tokens_client``/``tokens_forwarded`` are estimates (tiktoken) of the prompt as the client sent
    it and as forwarded, tools and reserved output tokens included. Not ``frozen``, yet never
    changed once built (``dataclasses.replace`` makes a changed copy): one is built per request,
    and a frozen dataclass sets each field through ``object.__setattr__`` (9 fields: about five
    times the cost of a plain one to build, 970 against 196 ns, timed).
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
    count_tools: list[dict[str, Any]] | None = None
    """Tool schemas counted against the window: the client's plus the proxy's own it expected to send
    (``None``: none)."""


class Compactor:
    """Pass-through: forwards the body as sent and never retries an overflow.

    Every method takes the request as a ``CompactionInput``; none writes to it."""

    retries_overflows = False
    """Whether an overflow can be compacted and retried at all (a stream's first events are then
    held until they carry something, so that an error event among them can be retried)."""

    async def prepare(self, ctx: CompactionInput, *, overflow: Overflow | None) -> Prepared:
        """What to forward (after an ``overflow``: compacted even below the trigger). Raises
        ``proxy.errors.CannotFit`` (an operator's limit the request cannot fit),
        and ``storage.errors.StorageError``."""
        if ctx.expanded:
            forwarded = ctx.body | {"messages": ctx.messages}
            return Prepared(dumps(forwarded), forwarded=forwarded)
        return Prepared(ctx.raw)

    async def counted(self, ctx: CompactionInput) -> bytes:
        """The body a token count of ``ctx`` is asked for: what ``prepare`` would forward now,
        planning nothing and storing nothing (Anthropic's ``count_tokens``: a client sizing its
        context sees the projected size). Raises ``storage.errors.StorageError``."""
        return ctx.raw

    async def compact_now(self, ctx: CompactionInput) -> str:
        """Serve the manual compaction tool: the text of its result (never raises)."""
        return "[context-proxy] Compaction is disabled on this proxy; nothing was removed."

    async def learn(self, ctx: CompactionInput, overflow: Overflow) -> None:
        """Learn from the provider's ``overflow`` of ``ctx``'s last attempt (``ctx.prepared``)."""
        return

    def can_retry(self, ctx: CompactionInput, overflow: Overflow) -> bool:
        return False

    def usage_observed(self, ctx: CompactionInput, usage: dict[str, Any] | None) -> bool:
        """Take a reply's ``usage`` in (no I/O); ``True`` when ``persist_observed`` has something to store."""
        return False

    def forget_refused(self, session_pk: int, tenant: str, artifact_ids: list[str], events_deleted: bool) -> None:
        """Drop what this process remembers of a refused request's deleted rows: ``tenant``'s
        artifacts ``artifact_ids`` and (``events_deleted``) the session's events."""
        return

    def forget_limits(self, tenant: str | None, model: str | None) -> None:
        """Drop what this process remembers of learned limits (after a reset); ``None``: all."""
        return

    async def persist_observed(self, ctx: CompactionInput) -> None:
        """Store what ``usage_observed`` changed. Never raises."""
        return
