"""The plan loop: from one request, the window it is sized for and its session's events, to the
bytes forwarded. The same code for the live proxy (``proxy.compaction.compactor``) and for
``proxy.offline.replay``, which is why replay reproduces what the proxy forwarded.

``PlanLoop.prepare`` projects (``proxy.projection.project``: pure), then carries out what the
projection asks, at most ``MAX_PLAN_ROUNDS`` times: store the artifacts its stubs name (an
artifact that fails to store is forwarded in full instead), execute a planned compaction (a
truncation boundary, or summary calls) and store it as an event, and project again. It then
chooses the proxy's own tools (``proxy.compaction.offer``) and builds the forwarded body: the
client's bytes when nothing changed, else the body with the projected messages (and tools).

All I/O goes through the ``PlanEffects`` its caller passes (the store, the lock, the summary
model, the clock): the loop itself reads nothing but its inputs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from proxy.compaction.base import Prepared
from proxy.compaction.offer import NO_OFFER, Offer, OwnToolOffer
from proxy.compaction.summarizer import Summarizer, SummaryFailed, SummaryModel
from proxy.conversation.codec import Codec
from proxy.conversation.prefix import PrefixStates
from proxy.defenses.config import DefenseConfig
from proxy.defenses.offload import ArtifactToStore
from proxy.defenses.plans import SummaryPlan
from proxy.projection import Projection, ProjectionMemos, project
from proxy.settings import Settings
from proxy.tokens.counter import reserved_output_tokens
from proxy.tokens.protocol import Tokenizer
from storage.records import EventRecord

log = logging.getLogger("context_proxy.compaction")

MAX_PLAN_ROUNDS = 4
"""Plans executed per request at most (truncate, summarize, clip, media): a bound, not a target."""
OFF_LOOP_BYTES = 1 << 20
"""Requests whose body has at least this many bytes are projected (counted, transformed) and split
into summary chunks in a worker thread, not on the event loop; smaller ones stay on the loop (a
thread hop costs ~0.2 ms, more than projecting a small request)."""
MADE_BEFORE_MAX = 512
"""Chain hashes after an event's anchor its payload names as made before it (the rest: ``made_before_complete``)."""
MADE_BEFORE_CHARS = 16
"""Hex characters of each (unique enough within one session)."""
CONFIG_MEMO = 4096
"""Defense configs kept (one per window and read-tool flag)."""
NO_NAMES: frozenset[str] = frozenset()
"""No names, built once: no artifact unavailable (most projections), no own tool sent (most requests)."""


class SessionRef(Protocol):
    """The session a request belongs to: ``pk`` (the store's key) and the client's ``session_id``."""

    @property
    def pk(self) -> int: ...
    @property
    def session_id(self) -> str: ...


class PlanInput(Protocol):
    """What the plan loop reads of one request (``proxy.compaction.base.CompactionInput`` is one).

    ``messages``: the client's (with ``expanded``, the proxy's earlier rounds put back);
    ``digests``/``chain``: one per message; ``raw``: the client's body bytes, ``body`` it parsed."""

    @property
    def body(self) -> Mapping[str, Any]: ...
    @property
    def raw(self) -> bytes: ...
    @property
    def messages(self) -> list[dict[str, Any]]: ...
    @property
    def digests(self) -> list[str]: ...
    @property
    def chain(self) -> list[str]: ...
    @property
    def session(self) -> SessionRef: ...
    @property
    def expanded(self) -> bool: ...
    @property
    def compact_tool(self) -> bool: ...
    @property
    def escalated(self) -> bool: ...


class PlanEffects(Protocol):
    """The I/O the plan loop asks of its caller for one request."""

    async def store_artifacts(self, artifacts: Sequence[ArtifactToStore]) -> bool:
        """Store ``artifacts`` (those not known stored); ``False`` when that failed (they are
        then forwarded in full). Never raises."""
        ...

    def exclusive(self) -> AbstractAsyncContextManager[list[EventRecord]]:
        """Hold the session's compaction lock; enter with its events as stored now (another
        request or replica may have compacted since they were read)."""
        ...

    async def add_event(self, event: EventRecord, events: list[EventRecord]) -> EventRecord:
        """Store ``event`` (the session's ``events`` precede it); the stored one is returned (another
        request's, when it stored the same id first). Raises ``storage.errors.StorageError``."""
        ...

    def summary_model(self) -> SummaryModel:
        """Who writes this request's summaries."""
        ...

    def now(self) -> datetime:
        """The ``created_at`` of a new event."""
        ...


@dataclass(slots=True)
class Planned:
    """What ``PlanLoop.prepare`` decided: the ``prepared`` forward and the ``projection`` behind it
    (not ``frozen``, yet never changed: one per request; see ``proxy.compaction.base.Prepared``)."""

    prepared: Prepared
    projection: Projection


def event_id(session_pk: int, kind: str, anchor_hash: str) -> str:
    """The id of a compaction event: a function of the session, the kind and the anchor (so two
    requests planning the same event store one row). Summary messages name it."""
    return "evt_" + hashlib.sha256(f"{session_pk}:{kind}:{anchor_hash}".encode()).hexdigest()[:24]


class PlanLoop:
    """Runs the defenses over one request at a time; one per compactor (or replay).

    State: the defense configs (at most ``CONFIG_MEMO``: one per window and read-tool flag), the
    projection's memos (``ProjectionMemos``, bounded there) and the ``OwnToolOffer`` (its
    ``StoredContent`` memo is bounded there). Not locked: one event loop (the projection's memos
    lock themselves, for the worker thread of a big request).
    """

    def __init__(self, settings: Settings, counter: Tokenizer, offer: OwnToolOffer,
                 summarizer: Summarizer, codec: Codec, prefixes: PrefixStates | None = None) -> None:
        self.settings = settings
        self.codec = codec
        """Whose pieces the requests' messages are (``project`` and ``apply`` go through it)."""
        self.counter = counter
        self.priced = counter.bind(codec)
        """``counter`` bound to ``codec``: counts the requests' pieces and tools."""
        self.offer = offer
        self.summarizer = summarizer
        self.memos = ProjectionMemos(prefixes=prefixes)
        """The projection's memos (bounds in ``ProjectionMemos``; ``prefixes``: the app's
        per-conversation prefix states, shared with the session log and the offer's memo)."""
        self._configs: dict[tuple[int | None, bool], DefenseConfig] = {}

    def config(self, window: int | None, read_tool: bool) -> DefenseConfig:
        """The defenses' config for ``window`` (tokens; with the read tool named in stubs or not),
        built once per pair: the settings never change, and building one per request cost about
        3% of a small request's CPU (py-spy)."""
        key = (window, read_tool)
        cfg = self._configs.get(key)
        if cfg is None:
            cfg = DefenseConfig.from_settings(self.settings, window)
            if read_tool:
                cfg = dataclasses.replace(cfg, read_tool_name=self.settings.read_tool_name)
            if len(self._configs) >= CONFIG_MEMO:
                self._configs.clear()
            self._configs[key] = cfg
        return cfg

    async def prepare(self, req: PlanInput, window: int | None, events: list[EventRecord], effects: PlanEffects, *,
                      force: bool, force_media: bool, new_events: bool = True, own_tools: bool = True,
                      reserved: int | None = None) -> Planned:
        """What to forward for ``req`` sized for ``window`` (estimated tokens; ``None``: unknown),
        given the session's ``events``. ``force``: plan a compaction even under the trigger (after
        an overflow); ``force_media``: offload media too (after a body-size error); ``new_events``:
        ``False`` plans no compaction (the client's own compaction request); ``own_tools``: ``False``
        adds none of the proxy's tools (that request too); ``reserved``: the request's reserved
        output tokens when the caller has them (``reserved_output_tokens(req.body)``). Raises what
        ``effects`` raise (``StorageError``)."""
        offer = self.offer.offerable(req.body, req.compact_tool) if own_tools else NO_OFFER
        cfg = self.config(window, offer.has(self.settings.read_tool_name))
        client_tools = req.body.get("tools") or None
        # counted against the window: the client's tools and the proxy's that will be sent (the
        # read tool when stored content may be named: a session with events, or a read URL)
        expected = self.offer.expected(offer, bool(events), req.raw, req.messages, req.chain, req.expanded)
        count_tools = [*(client_tools or []), *expected] or None
        if reserved is None:
            reserved = reserved_output_tokens(req.body)
        unavailable: set[str] = set()
        if len(req.raw) < OFF_LOOP_BYTES:  # (``project``'s own choice, without its coroutine)
            proj = self._project(req, cfg, count_tools, events, force, force_media, unavailable, True, new_events,
                                 reserved)
        else:
            proj = await self.project(req, cfg, count_tools, events, force, force_media, unavailable,
                                      new_events=new_events, reserved=reserved)
        if proj.artifacts or proj.plan is not None:  # (else the loop would stop at once: most requests)
            proj = await self.rounds(req, cfg, count_tools, events, effects, proj, unavailable, force=force,
                                     force_media=force_media, new_events=new_events, reserved=reserved)
        return Planned(self._assemble(req, proj, offer, client_tools, expected, count_tools, window), proj)

    async def rounds(self, req: PlanInput, cfg: DefenseConfig, count_tools: list[dict[str, Any]] | None,
                     events: list[EventRecord], effects: PlanEffects, proj: Projection, unavailable: set[str], *,
                     force: bool, force_media: bool, new_events: bool, reserved: int) -> Projection:
        """The loop itself, from the first projection ``proj`` (made with ``unavailable``, which the
        rounds extend; ``reserved``: the request's reserved output tokens): store artifacts,
        execute a plan, project again (at most ``MAX_PLAN_ROUNDS`` rounds); the last projection.
        ``prepare`` enters it only when ``proj`` has artifacts or a plan (else it stops at once)."""

        async def again() -> Projection:  # (with the loop's events, force and unavailable as they are now)
            return await self.project(req, cfg, count_tools, events, force, force_media, unavailable,
                                      new_events=new_events, reserved=reserved)

        for _ in range(MAX_PLAN_ROUNDS):
            if proj.artifacts and not await effects.store_artifacts(proj.artifacts):
                unavailable.update(a.id for a in proj.artifacts)
                proj = await again()
                continue
            if proj.plan is None:
                break
            async with effects.exclusive() as fresh:
                # under the lock, re-read: another request or replica may have compacted already
                if [e.id for e in fresh] != [e.id for e in events]:
                    events = fresh
                    proj = await again()
                    continue
                event = await self.execute(req, cfg, proj, events, effects)
            if event is None:
                break
            events = [*events, event]
            force = False
            proj = await again()
        return proj

    async def project(
        self, req: PlanInput, cfg: DefenseConfig, count_tools: list[dict[str, Any]] | None, events: list[EventRecord],
        force: bool, force_media: bool, unavailable: set[str], *, truncate_first: bool = True,
        new_events: bool = True, reserved: int | None = None,
    ) -> Projection:
        """``proxy.projection.project`` of ``req``; for a big request (a body of ``OFF_LOOP_BYTES``
        or more) in a worker thread, so that counting and transforming it does not stall the
        event loop's other requests (the projection's memos and the counter's are locked; the
        result is the same). ``reserved``: ``reserved_output_tokens(req.body)`` when known."""
        if reserved is None:
            reserved = reserved_output_tokens(req.body)
        if len(req.raw) < OFF_LOOP_BYTES:
            return self._project(req, cfg, count_tools, events, force, force_media, unavailable, truncate_first,
                                 new_events, reserved)
        return await asyncio.to_thread(self._project, req, cfg, count_tools, events, force, force_media, unavailable,
                                       truncate_first, new_events, reserved)

    def _project(self, req: PlanInput, cfg: DefenseConfig, count_tools: list[dict[str, Any]] | None,
                 events: list[EventRecord], force: bool, force_media: bool, unavailable: set[str],
                 truncate_first: bool, new_events: bool, reserved: int) -> Projection:
        # (by position, in ``project``'s order: naming 17 arguments cost more than the call's work)
        return project(req.messages, req.digests, req.chain, events, cfg, self.counter, req.session.session_id,
                       self.codec, self.memos, count_tools, reserved, force, force_media, None,
                       frozenset(unavailable) if unavailable else NO_NAMES, truncate_first, new_events,
                       req.escalated)

    async def execute(self, req: PlanInput, cfg: DefenseConfig, proj: Projection, events: list[EventRecord],
                      effects: PlanEffects) -> EventRecord | None:
        """Carry out ``proj.plan`` (summary calls for a ``SummaryPlan``) and store it as an event
        after ``events``; the stored event, or ``None`` when the summary failed (logged: the
        request is then forwarded uncompacted). Raises what ``effects.add_event`` raises."""
        plan = proj.plan
        assert plan is not None
        if isinstance(plan, SummaryPlan):
            try:
                summary = await self.summarizer.fold(plan, cfg.context_window_tokens, effects.summary_model(),
                                                      off_loop=len(req.raw) >= OFF_LOOP_BYTES)
            except SummaryFailed as exc:
                log.error("summary call failed: %s", exc, extra={"session_id": req.session.session_id})
                return None
            payload, after = plan.payload(summary), plan.tokens_after_estimate
        else:
            payload, after = plan.payload(), plan.tokens_after
        # the pieces made before this event: a provider that signs content against what came
        # before it (Messages thinking) signed them over the old projection (``projection._unsign_stale``);
        # those after the anchor are named too (short hashes, the last ``MADE_BEFORE_MAX``), so a
        # branch that leaves this one after the anchor (a rewind) keeps the thinking made since
        if self.codec.binds_prefix:  # (no other API's content is signed against its prefix)
            payload["planned_at_hash"] = req.chain[-1]
            since = req.chain[req.chain.index(plan.anchor_hash) + 1:] if plan.anchor_hash in req.chain else []
            payload["made_before"] = [h[:MADE_BEFORE_CHARS] for h in since[-MADE_BEFORE_MAX:]]
            payload["made_before_complete"] = len(since) <= MADE_BEFORE_MAX
        event = EventRecord(
            id=event_id(req.session.pk, plan.kind, plan.anchor_hash),
            session_pk=req.session.pk,
            kind=plan.kind,
            anchor_hash=plan.anchor_hash,
            payload=payload,
            tokens_before=plan.tokens_before,
            tokens_after=after,
            created_at=effects.now(),
        )
        return await effects.add_event(event, events)

    def _assemble(self, req: PlanInput, proj: Projection, offer: Offer, client_tools: list[dict[str, Any]] | None,
                  expected: list[dict[str, Any]], count_tools: list[dict[str, Any]] | None,
                  window: int | None) -> Prepared:
        """The forwarded body (the client's bytes when nothing changed and no tool is added) and
        its token estimates, exact for the tools: the client's for the client, those sent for
        the forwarded."""
        own = self.offer.chosen(offer, req.raw, req.messages, req.chain, req.expanded, proj.messages, proj.applied)
        # the codec: the client's bytes when the messages are the body's own, else only they change
        extra = {"tools": [*(req.body.get("tools") or []), *own]} if own else None
        body, forwarded = self.codec.apply(req.body, req.raw, proj.messages, extra)
        names = frozenset(map(self.offer.name_of, own)) if own else NO_NAMES
        tokens_client, tokens_forwarded = proj.tokens_client, proj.tokens_forwarded
        if expected or own:
            counted = self.priced.count_tools(count_tools)
            tokens_client -= counted - self.priced.count_tools(client_tools)
            tokens_forwarded += self.priced.count_tools([*(client_tools or []), *own] or None) - counted
        # (every field by position: a class called with a keyword builds a dict for its ``__init__``)
        return Prepared(body, tokens_client, tokens_forwarded, proj.applied, proj.event_ids, forwarded, names, window,
                        count_tools)
