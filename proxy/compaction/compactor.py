"""The defenses' async shell: windows, stored events, artifacts, summary calls, learned limits.

``ProjectingCompactor.prepare`` finds the window a request is sized for (its model's profile,
lowered by what was learned: ``proxy.compaction.limits``) and the session's events, then runs the
plan loop (``proxy.compaction.plan_loop``: the same one ``proxy.offline.replay`` runs) with the
live ``PlanEffects``: artifacts and events go to the store (one compaction at a time per session:
a lock here, the store's lock across replicas), summaries to the provider
(``proxy.compaction.summarizer.UpstreamSummaryModel``). After an overflow it learns from the
provider's stated numbers and sizes the retry for them.

Owned state (all bounded, built here, one compactor per app): the retry windows of requests
between an overflow and their retry (``RETRY_WINDOWS``), the sessions' events (10,000 sessions,
``EVENTS_TTL_S``), the artifacts known stored (100,000, ``STORED_ARTIFACT_TTL_S``), one lock per
session compacting now, and the plan loop's (defense configs, ``ReferenceMemo``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

from proxy.cache import BoundedCache
from proxy.compaction.apis import CHAT_API, ProviderApi
from proxy.compaction.artifact_sources import source_messages
from proxy.compaction.base import CompactionInput, Compactor, Prepared
from proxy.compaction.limits import LearnedLimits, Sent, WindowView
from proxy.compaction.models import ModelProfiles
from proxy.compaction.offer import OwnToolOffer
from proxy.compaction.overflow import Overflow
from proxy.compaction.plan_loop import PlanLoop
from proxy.compaction.references import StoredContent
from proxy.compaction.summarizer import Summarizer, SummaryFailed, SummaryModel, UpstreamSummaryModel
from proxy.conversation.prefix import PrefixStates
from proxy.defenses.config import DefenseConfig
from proxy.defenses.offload import ArtifactToStore
from proxy.errors import CannotFit
from proxy.settings import Settings
from proxy.telemetry.metrics import Metrics
from proxy.tokens.counter import TokenCounter, reserved_output_tokens
from proxy.upstream.client import Upstream
from storage.errors import StorageError
from storage.records import ArtifactRecord, EventRecord
from storage.store import Store

log = logging.getLogger("context_proxy.compaction")

STORED_ARTIFACT_TTL_S = 60.0
"""How long an artifact this process stored is assumed still stored (retention may delete it)."""
EVENTS_TTL_S = 30.0
"""How long a session's cached events are trusted on the fast path (re-read before compacting)."""
EVENTS_CACHED = 10_000
"""Sessions whose events are cached."""
ARTIFACTS_KNOWN = 100_000
"""(tenant, artifact id) pairs remembered as stored."""
RETRY_WINDOWS = 10_000
"""Requests between an overflow and their retry whose retry window is remembered (``learn``)."""


class ProjectingCompactor(Compactor):
    """Runs the four defenses for the pipeline. One per app; safe for concurrent requests."""

    retries_overflows = True

    def __init__(self, settings: Settings, store: Store, upstream: Upstream, counter: TokenCounter, *,
                 metrics: Metrics, prefixes: PrefixStates | None = None, api: ProviderApi = CHAT_API) -> None:
        self.api = api
        """The API this compactor's requests speak (its codec, summary calls and usage)."""
        self.metrics = metrics
        self.settings = settings
        self.store = store
        self.upstream = upstream
        self.counter = counter
        self.metrics.tokenizer(self.counter.encoding_name, self.counter.exact)
        self.profiles = ModelProfiles(settings.models_file)
        self.limits = LearnedLimits(store, upstream.base_url, self.profiles, settings.learned_limit_ttl_s, self.metrics,
                                    self.counter.exact)
        prefixes = prefixes if prefixes is not None else PrefixStates()
        offer = OwnToolOffer(settings, StoredContent(prefixes), shape=api.name)
        self.plans = PlanLoop(settings, self.counter, offer, Summarizer(settings, self.counter, api.codec), api.codec,
                              prefixes)
        self._retry_windows = BoundedCache(RETRY_WINDOWS)
        self._events = BoundedCache(EVENTS_CACHED, EVENTS_TTL_S)
        self._locks: dict[int, asyncio.Lock] = {}
        self._stored = BoundedCache(ARTIFACTS_KNOWN, STORED_ARTIFACT_TTL_S)

    async def window(self, ctx: CompactionInput) -> WindowView:
        """The window ``ctx`` is sized for: its model's profile, lowered by what was learned for
        this tenant (and session), in the provider's tokens and (``estimate_window``) in ours."""
        return await self.limits.view(ctx.tenant, ctx.model, ctx.session.pk)

    async def prepare(self, ctx: CompactionInput, *, overflow: Overflow | None) -> Prepared:
        pk = ctx.session.pk
        # (the window and the events as cached, without a coroutine each: most requests read neither)
        view = self.limits.view_now(ctx.tenant, ctx.model, pk)
        if view is None:
            view = await self.window(ctx)
        reserved = reserved_output_tokens(ctx.body)
        window = view.estimate_window(reserved)
        if overflow is not None:  # sized for what the provider said (``learn``), whatever was known
            hit = self._retry_windows.pop(ctx.request_id, None)
            retry = hit[0] if hit is not None else None
            if retry is not None:
                window = retry if window is None else min(window, retry)
        events = self._events.fresh(pk)
        if events is None:
            events = await self._events_of(pk, refresh=True)
        clients_own = self.api.client_compaction(ctx.body)  # forwarded untouched: no event, no tool of ours
        planned = await self.plans.prepare(ctx, window, events, _LiveEffects(self, ctx), force=overflow is not None,
                                           force_media=overflow is not None and overflow.kind == "body_size",
                                           new_events=not clients_own, own_tools=not clients_own, reserved=reserved)
        reason = planned.projection.reason_unfittable
        if reason and view.source == "config" and view.ratio <= 1.0 and overflow is None:
            # only an operator's own limit refuses a request, and only by the estimate at face
            # value; any other is forwarded, and the provider (whose tokenizer may count fewer)
            # answers it
            raise CannotFit(reason)
        return planned.prepared

    async def counted(self, ctx: CompactionInput) -> bytes:
        """The body ``prepare`` would forward for ``ctx`` now (its window, the session's events, the
        defenses), with no event planned and no artifact stored: the stubs a count sees are the
        ones the next forward stores. A session not stored yet (``pk`` 0) has no events."""
        window = (await self.window(ctx)).estimate_window(reserved_output_tokens(ctx.body))
        events = await self._events_of(ctx.session.pk, refresh=False) if ctx.session.pk else []
        planned = await self.plans.prepare(ctx, window, events, _CountEffects(), force=False, force_media=False,
                                           new_events=False, own_tools=not self.api.client_compaction(ctx.body))
        return planned.prepared.body

    @contextlib.asynccontextmanager
    async def _lock(self, session_pk: int) -> AsyncIterator[None]:
        """One compaction at a time per session in this process (the store locks across processes)."""
        lock = self._locks.setdefault(session_pk, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and not lock._waiters:
                self._locks.pop(session_pk, None)

    async def _events_of(self, session_pk: int, *, refresh: bool) -> list[EventRecord]:
        """The session's events: cached for ``EVENTS_TTL_S``, re-read before a new compaction."""
        events = None if refresh else self._events.fresh(session_pk)
        if events is None:
            events = list(await self.store.list_events(session_pk))
            self._events.put(session_pk, events)
        return events

    async def _store_artifacts(self, ctx: CompactionInput, artifacts: Sequence[ArtifactToStore]) -> bool:
        """Store those of ``artifacts`` not known stored; ``False`` (logged) when the store failed."""
        todo = [a for a in artifacts if self._stored.fresh((ctx.tenant, a.id)) is None]
        if not todo:
            return True
        created = datetime.now(UTC)
        sources = source_messages(ctx.messages, ctx.chain, [a for a in todo if a.source is None])
        records = [
            ArtifactRecord(
                id=a.id,
                tenant=ctx.tenant,
                session_pk=ctx.session.pk,
                media_type=a.media_type,
                content=a.content,
                size_bytes=len(a.content.encode()),
                line_count=a.content.count("\n") + (0 if a.content.endswith("\n") or not a.content else 1),
                created_at=created,
                message_hash=a.source or sources.get(a.id),
            )
            for a in todo
        ]
        try:
            await self.store.put_artifacts(records)
            for a in todo:
                self._stored.put((ctx.tenant, a.id), True)
            self.metrics.artifacts_stored(len(records))
            return True
        except StorageError:
            self.metrics.artifacts_stored(len(records), ok=False)
            self.metrics.database_error("artifacts")
            log.error("storing %d artifacts failed; forwarding their content in full", len(records))
            return False

    async def _add_event(self, ctx: CompactionInput, event: EventRecord, events: list[EventRecord]) -> EventRecord:
        await ctx.ensure_logged()  # an event never anchors on a message missing from the log
        stored = await self.store.add_event(event)
        self.metrics.compaction_stored(stored.kind)
        self._events.put(event.session_pk, [*events, stored])
        return stored

    async def learn(self, ctx: CompactionInput, overflow: Overflow) -> None:
        """Learn from the provider's overflow of ``ctx``'s last attempt (``proxy.compaction.limits``), and
        remember the window its retry (the next ``prepare(ctx, overflow=...)``) is sized for."""
        sent = self._sent(ctx)
        if sent is None:
            return
        retry = await self.limits.learn_overflow(overflow, sent)
        if retry is not None:
            self._retry_windows.put(ctx.request_id, retry)

    def _sent(self, ctx: CompactionInput) -> Sent | None:
        """What ``ctx``'s last attempt sent, its own tool rounds included (``None`` before a projection)."""
        p = ctx.prepared
        if p is None or not p.tokens_forwarded:
            return None
        rounds = self.plans.priced  # the proxy's rounds: chat messages
        estimate = p.tokens_forwarded + (sum(rounds.count_message(m) for m in ctx.internal) if ctx.internal else 0)
        return Sent(ctx.tenant, ctx.model, ctx.session.pk, estimate, reserved_output_tokens(ctx.body),
                    lambda: self.api.text_only(ctx.messages))

    async def compact_now(self, ctx: CompactionInput) -> str:
        """Serve the manual compaction tool: summarize now if the session is past half the trigger.

        Never an error for the model: a failed compaction says that nothing was removed.
        """
        window = (await self.window(ctx)).estimate_window(reserved_output_tokens(ctx.body))
        cfg = DefenseConfig.from_settings(self.settings, window)
        tools = ctx.prepared.count_tools if ctx.prepared is not None else None
        events = await self._events_of(ctx.session.pk, refresh=True)
        proj = await self.plans.project(ctx, cfg, tools, events, False, False, set())
        if proj.tokens_forwarded < cfg.trigger_tokens // 2:
            return (
                f"[context-proxy] Nothing to compact yet: the conversation uses about {proj.tokens_forwarded} tokens, "
                f"under half of the automatic trigger ({cfg.trigger_tokens})."
            )
        forced = await self.plans.project(ctx, cfg, tools, events, True, False, set(), truncate_first=False)
        try:
            if forced.artifacts and not await self._store_artifacts(ctx, forced.artifacts):
                raise SummaryFailed("artifacts could not be stored")
            event = None
            if forced.plan is not None:
                async with self._lock(ctx.session.pk), self.store.compaction_lock(ctx.session.pk):
                    event = await self.plans.execute(ctx, cfg, forced, events, _LiveEffects(self, ctx))
            self._events.pop(ctx.session.pk, None)
        except (SummaryFailed, StorageError) as exc:
            log.error("manual compaction failed: %s", exc)
            event = None
        if event is None:
            return "[context-proxy] Compaction did not happen this time; nothing was removed from the conversation."
        return (
            f"[context-proxy] Compacted: the earlier conversation was summarized (event {event.id}); from the next "
            "request on the summary replaces those messages, which stay readable in the archive."
        )

    def can_retry(self, ctx: CompactionInput, overflow: Overflow) -> bool:
        return True

    def usage_observed(self, ctx: CompactionInput, usage: dict[str, Any] | None) -> bool:
        """Take a successful reply's ``usage`` into the learned limits (cheap, no I/O: the
        estimate ratio, silent truncation, a window proved wrong); ``True`` when
        ``persist_observed`` has something to store."""
        sent = self._sent(ctx)
        return sent is not None and self.limits.observe(sent, self.api.prompt_usage(usage))

    def forget_limits(self, tenant: str | None, model: str | None) -> None:
        self.limits.forget(tenant, model)

    def forget_refused(self, session_pk: int, tenant: str, artifact_ids: list[str], events_deleted: bool) -> None:
        """Forget what this process cached of a refused request's deleted rows: its artifacts (else
        a later request would think them stored and not store them again) and, when it had
        events, the session's cached events (else for ``EVENTS_TTL_S`` requests would apply an
        event whose row is gone)."""
        for artifact_id in artifact_ids:
            self._stored.pop((tenant, artifact_id), None)  # (it may have expired or been evicted)
        if events_deleted:
            self._events.pop(session_pk, None)

    async def persist_observed(self, ctx: CompactionInput) -> None:
        """Store what ``usage_observed`` changed. Never raises."""
        sent = self._sent(ctx)
        if sent is not None:
            await self.limits.persist(sent)


class _LiveEffects:
    """The plan loop's I/O for one live request (``proxy.compaction.plan_loop.PlanEffects``)."""

    __slots__ = ("compactor", "ctx")

    def __init__(self, compactor: ProjectingCompactor, ctx: CompactionInput) -> None:
        self.compactor, self.ctx = compactor, ctx

    async def store_artifacts(self, artifacts: Sequence[ArtifactToStore]) -> bool:
        return await self.compactor._store_artifacts(self.ctx, artifacts)

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[list[EventRecord]]:
        c, pk = self.compactor, self.ctx.session.pk
        async with c._lock(pk), c.store.compaction_lock(pk):
            yield await c._events_of(pk, refresh=True)

    async def add_event(self, event: EventRecord, events: list[EventRecord]) -> EventRecord:
        return await self.compactor._add_event(self.ctx, event, events)

    def summary_model(self) -> SummaryModel:
        ctx, compactor = self.ctx, self.compactor
        # (``summary_model`` names a model of the OpenAI upstream's: Messages use their own)
        model = (compactor.settings.summary_model if compactor.api is CHAT_API else None) or ctx.model
        return UpstreamSummaryModel(compactor.upstream, model, ctx.body, ctx.upstream_headers, ctx.tenant,
                                    compactor.api)

    def now(self) -> datetime:
        return datetime.now(UTC)


class _CountEffects:
    """The plan loop's I/O for a token count: nothing is stored (no event is planned for one)."""

    async def store_artifacts(self, artifacts: Sequence[ArtifactToStore]) -> bool:
        return True  # (counted as the stubs the next forward stores)

    def exclusive(self) -> contextlib.AbstractAsyncContextManager[list[EventRecord]]:
        raise AssertionError("a count plans no event")

    async def add_event(self, event: EventRecord, events: list[EventRecord]) -> EventRecord:
        raise AssertionError("a count plans no event")

    def summary_model(self) -> SummaryModel:
        raise AssertionError("a count plans no event")

    def now(self) -> datetime:
        return datetime.now(UTC)
