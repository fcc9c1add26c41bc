"""The per-request context of the chat use case: what one chat request carries through the pipeline.

``ChatContext`` is built by ``proxy.forward.pipeline.ChatPipeline.handle`` once the request is parsed
and its session named, and lives until its log write ends. The compactor reads it as a
``proxy.compaction.base.CompactionInput`` (read-only, checked structurally: compaction never imports
this module); the round loop (``proxy.forward.rounds``), the tool rounds and the log writer update it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from proxy.compaction.base import Compactor, Prepared
from proxy.compaction.overflow import Overflow
from proxy.forward.session_log import LoggedRequest, SessionLog
from storage.records import SessionRecord
from storage.refused import RequestWrites

Spawn = Callable[[Coroutine[Any, Any, LoggedRequest]], "asyncio.Task[LoggedRequest]"]
"""Runs a write as a task (``asyncio.ensure_future``, or ``proxy.forward.log_writer.LogWriter.spawn``)."""


@dataclass(slots=True)
class ChatContext:
    """Everything one chat request carries through the pipeline.

    ``messages``/``digests``/``chain``: the client's messages (with ``expanded``: the proxy's earlier
    rounds put back), one digest and chain hash per message; ``raw``: the client's body bytes, ``body``
    it parsed; ``started``: ``time.perf_counter()`` seconds when it was read. The fields through
    ``expanded`` come first, in the order the pipeline passes them by position (naming 15
    arguments cost about half of building the context, timed)."""

    request_id: str
    tenant: str
    session: SessionRecord
    body: dict[str, Any]
    raw: bytes
    messages: list[dict[str, Any]]
    digests: list[str]
    chain: list[str]
    upstream_headers: list[tuple[str, str]]
    stream: bool
    started: float
    session_log: SessionLog
    compactor: Compactor = field(default_factory=Compactor)
    """Whose defenses prepared it: the log writer gives it the reply's ``usage`` and a refused
    request's deleted rows (the pass-through by default)."""
    compact_tool: bool = False
    """The client asked for the manual compaction tool (header ``X-Context-Proxy-Compact-Tool``)."""
    expanded: bool = False
    """``messages`` include internal rounds the client's history does not (forward them, not ``raw``)."""
    append_task: asyncio.Task[LoggedRequest] | None = None
    """Set when the client's messages are written before the reply (streams; compactions)."""
    finished: bool = False
    prepared: Prepared | None = None
    """What the last ``Compactor.prepare`` (and the tool rounds since) made of the request: what is sent."""
    retries: int = 0
    """Overflow retries so far (at most ``Settings.max_overflow_retries``)."""
    unrecovered: Overflow | None = None
    """The provider's overflow this request ended with, no retry left (its answer returned as sent)."""
    escalated: bool = False
    """An overflow's retry came out as the attempt refused: the next prepare compacts further."""
    internal: list[dict[str, Any]] = field(default_factory=list)
    """Messages of the proxy's own tool rounds in this request (logged as internal)."""
    read_rounds: int = 0
    tools_withdrawn: bool = False
    """The proxy's tools were left out of the body now sent (its last round: the model must answer)."""
    degraded: bool = False
    """The database failed and ``database_failure_mode`` is open: forwarded without compaction."""
    refused: bool = False
    """The provider refused the client's own key (401/403, keys passed through): only the request
    record is logged, none of the content (anyone can send a body under a made-up key)."""
    writes: RequestWrites = field(default_factory=RequestWrites)
    """The artifact and event rows this request's own inserts created (tracked while it is
    handled: ``storage.refused.track_writes``), deleted if it is ``refused``."""

    model: str = field(init=False)
    """The body's ``model`` as a string (read once: the pipeline, the compactor, the metrics and
    the record all ask for it)."""

    def __post_init__(self) -> None:
        self.model = str(self.body.get("model"))

    def start_append(self, spawn: Spawn = asyncio.ensure_future) -> asyncio.Task[LoggedRequest]:
        """Start writing the client's messages, once per request (``append_task``; a second call
        returns the first's task). ``spawn`` runs the write: the log writer's ``spawn`` to track it
        (a stream's early write), else a plain task. The one way the messages are written early."""
        if self.append_task is None:
            self.append_task = spawn(self.session_log.append_request(self.session, self.messages, self.chain))
        return self.append_task

    def append_early(self, spawn: Spawn) -> None:
        """A stream's early write of the client's messages (``start_append`` with ``spawn``, once
        its first byte is out), unless this process knows they are all stored already: nothing to
        commit while the stream runs, and the end of the request writes its reply alone, as a
        complete answer's does (no task, no shield; the same rows and record)."""
        if self.append_task is None and not self.session_log.known_stored(self.session, self.chain):
            self.start_append(spawn)

    async def ensure_logged(self) -> LoggedRequest:
        """Write the client's messages now (before a compaction event anchors on them). Shielded:
        a request cancelled meanwhile (its client left) does not cancel the write. Raises
        ``storage.errors.StorageError``."""
        logged = await asyncio.shield(self.start_append())
        self.use_session(logged)
        return logged

    def use_session(self, logged: LoggedRequest) -> None:
        """Go on in the session the messages went to (opened again if the request's was gone)."""
        if logged.session is not None:
            self.session = logged.session
