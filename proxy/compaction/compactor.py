"""The defenses' async shell: windows, stored events, artifacts, summary calls, learned limits.

``project()`` (pure, ``proxy.projection``) decides; this module does the I/O it asks for: stores
the artifacts a projection references *before* forwarding (an artifact that fails to store is
forwarded in full instead), executes a planned compaction (a truncation boundary, or summary calls
to the upstream with the client's credentials and token-limit parameter), stores it as an event,
and projects again. Learned windows (from a provider's overflow error) are kept in the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
from collections.abc import AsyncIterator
from itertools import repeat
from typing import TYPE_CHECKING, Any

import orjson

from proxy.cache import BoundedCache, Memo
from proxy.compaction.base import Compactor, Prepared
from proxy.compaction.limits import LearnedLimits, Sent, WindowView
from proxy.compaction.models import ModelProfiles
from proxy.compaction.overflow import Overflow, classify_error
from proxy.defenses.plans import SummaryPlan
from proxy.defenses.summarize import (
    build_summary_request_messages,
    chunk_budget_tokens,
    render_transcript,
    summary_chunks,
)
from proxy.errors import CannotFit, ProxyError
from proxy.forward.session_log import now
from proxy.json_text import parse_json
from proxy.projection import DefenseConfig, Projection, project
from proxy.settings import Settings
from proxy.telemetry.metrics import Metrics
from proxy.tokens.counter import load_counter
from proxy.tools.read_tool import compact_tool_schema, read_tool_schema, references_in
from proxy.upstream.client import Upstream, translate
from storage.errors import StorageError
from storage.records import ArtifactRecord, EventRecord
from storage.store import Store

if TYPE_CHECKING:
    from proxy.forward.pipeline import ChatContext

log = logging.getLogger("context_proxy.compaction")

STORED_ARTIFACT_TTL_S = 60.0
"""How long an artifact this process stored is assumed still stored (retention may delete it)."""
EVENTS_TTL_S = 30.0
"""How long a session's cached events are trusted on the fast path (re-read before compacting)."""
ARCHIVE_URL = re.compile(rb"/sessions/[^/\s]+/archive")
STUB_DEFENSES = frozenset({"offload", "summary", "clip", "media"})
MAX_PLAN_ROUNDS = 4
"""Plans executed per request at most (truncate, summarize, clip, media): a bound, not a target."""
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text", "refusal"})
RETRY_WINDOWS = 10_000
"""Requests between an overflow and their retry whose retry window is remembered (``learn``)."""
OFF_LOOP_BYTES = 1 << 20
"""Requests whose body has at least this many bytes are projected (counted, transformed) and split
into summary chunks in a worker thread, not on the event loop; smaller ones stay on the loop (a
thread hop costs ~0.2 ms, more than projecting a small request)."""


class SummaryFailed(Exception):
    """The upstream did not produce a summary (error status or unusable body)."""


class ProjectingCompactor(Compactor):
    """Runs the four defenses for the pipeline. One per app; safe for concurrent requests."""

    retries_overflows = True

    def __init__(self, settings: Settings, store: Store, upstream: Upstream, *, metrics: Metrics | None = None) -> None:
        self.metrics = metrics or Metrics()
        self.settings = settings
        self.store = store
        self.upstream = upstream
        self.counter = load_counter(settings.tiktoken_cache_dir)
        self.metrics.tokenizer(self.counter.encoding_name, self.counter.exact)
        self.profiles = ModelProfiles(settings.models_file)
        self.limits = LearnedLimits(store, upstream.base_url, self.profiles, settings.learned_limit_ttl_s, self.metrics,
                                    self.counter.exact)
        self._retry_windows = BoundedCache(RETRY_WINDOWS)
        self._events = BoundedCache(10_000, EVENTS_TTL_S)
        self._locks: dict[int, asyncio.Lock] = {}
        self._stored = BoundedCache(100_000, STORED_ARTIFACT_TTL_S)
        self._references = ReferenceMemo()
        self._configs: dict[tuple[int | None, bool], DefenseConfig] = {}

    async def window(self, ctx: ChatContext) -> WindowView:
        """The window ``ctx`` is sized for: its model's profile, lowered by what was learned for
        this tenant (and session), in the provider's tokens and (``estimate_window``) in ours."""
        return await self.limits.view(ctx.tenant, ctx.model, ctx.session.pk)

    def _offerable(self, ctx: ChatContext) -> tuple[list[str], list[dict[str, Any]]]:
        """Names and schemas of the proxy's tools this request may carry (client names never shadowed)."""
        if ctx.body.get("tool_choice") == "none":
            return [], []
        client = {(t.get("function") or {}).get("name") for t in ctx.body.get("tools") or () if isinstance(t, dict)}
        names, schemas = [], []
        if self.settings.read_tool_enabled and self.settings.read_tool_name not in client:
            names.append(self.settings.read_tool_name)
            schemas.append(read_tool_schema(self.settings.read_tool_name))
        if ctx.compact_tool and self.settings.compact_tool_name not in client:
            names.append(self.settings.compact_tool_name)
            schemas.append(compact_tool_schema(self.settings.compact_tool_name))
        return names, schemas

    def _own_tools(self, ctx: ChatContext, proj: Projection, names: list[str], schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The proxy's tools to append: the read tool only when the forwarded messages name stored content."""
        out = []
        for name, schema in zip(names, schemas, strict=True):
            if name == self.settings.read_tool_name and not self._names_stored_content(ctx, proj):
                continue
            out.append(schema)
        return out

    def _names_stored_content(self, ctx: ChatContext, proj: Projection) -> bool:
        """Do the forwarded messages name an artifact or archive? (cheap checks first)

        True when a stub defense applied. Else False when the body names no read URL or archive
        URL (and carries no internal rounds): a body up to ``SUBSTRING_FIRST_BYTES`` is searched
        for them first; a longer one asks ``ReferenceMemo`` first (only messages new since the last
        request are read), which answers False on almost every request, so that the body is not
        searched at all (that search cost 3.4 ms at 5,000 messages, 5.3 MB, on every request:
        ``tests/benchmarks``, pipeline section). Else ``references_in(proj.messages)`` (or the
        memo's answer, when the messages are the client's) decides.
        """
        if STUB_DEFENSES.intersection(proj.applied):
            return True
        small = len(ctx.raw) <= SUBSTRING_FIRST_BYTES
        if small and not self._url_in_body(ctx):
            return False  # what the lines below answer too, without the memo's bookkeeping
        named = self._references.names(ctx.messages, ctx.chain) if proj.messages is ctx.messages else None
        if named is False:
            return False
        if not small and not self._url_in_body(ctx):
            return False
        return named if named is not None else any(references_in(proj.messages))

    def _may_name_stored(self, ctx: ChatContext) -> bool:
        """Could the client's messages name stored content (before projecting)? The cheap checks
        of ``_names_stored_content``: a small body searched, a long one asked of ``ReferenceMemo``
        (which ``_names_stored_content`` then answers from its newest entry), never searched."""
        if len(ctx.raw) <= SUBSTRING_FIRST_BYTES:
            return self._url_in_body(ctx)
        return ctx.expanded or self._references.names(ctx.messages, ctx.chain)

    @staticmethod
    def _url_in_body(ctx: ChatContext) -> bool:
        """Could the body name stored content: a read URL or archive URL in it, or the proxy's own
        rounds put back? (a plain substring first: the regex over a long body costs ~0.3 ms per MB)"""
        return (b"/artifacts/art_" in ctx.raw or (b"/archive" in ctx.raw and ARCHIVE_URL.search(ctx.raw) is not None)
                or ctx.expanded)

    def _config(self, window: int | None, read_tool: bool) -> DefenseConfig:
        """The defenses' config for ``window`` (with the read tool named in stubs or not), built
        once per pair: the settings never change, and building one per request cost about 3% of
        a small request's CPU (py-spy)."""
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

    async def prepare(self, ctx: ChatContext, *, overflow: Overflow | None) -> Prepared:
        view = await self.window(ctx)
        window = view.estimate_window(_reserved(ctx.body))
        if overflow is not None:  # sized for what the provider said (``learn``), whatever was known
            hit = self._retry_windows.pop(ctx.request_id, None)
            retry = hit[0] if hit is not None else None
            if retry is not None:
                window = retry if window is None else min(window, retry)
        own_names, own_schemas = self._offerable(ctx)
        cfg = self._config(window, self.settings.read_tool_name in own_names)
        events = await self._events_of(ctx.session.pk, refresh=False)
        client_tools = ctx.body.get("tools") or None
        # counted against the window: the client's tools and the proxy's that will be sent (the
        # read tool when stored content may be named: a session with events, or a read URL)
        expected = [schema for name, schema in zip(own_names, own_schemas, strict=True)
                    if name != self.settings.read_tool_name or events or self._may_name_stored(ctx)]
        ctx.count_tools = [*(client_tools or []), *expected] or None
        unavailable: set[str] = set()
        force = overflow is not None
        force_media = overflow is not None and overflow.kind == "body_size"
        proj = await self._projected(ctx, cfg, events, force, force_media, unavailable)
        for _ in range(MAX_PLAN_ROUNDS):
            if proj.artifacts and not await self._store_artifacts(ctx, proj, unavailable):
                proj = await self._projected(ctx, cfg, events, force, force_media, unavailable)
                continue
            if proj.plan is None:
                break
            async with self._lock(ctx.session.pk), self.store.compaction_lock(ctx.session.pk):
                # under the lock, re-read: another request or replica may have compacted already
                fresh = await self._events_of(ctx.session.pk, refresh=True)
                if [e.id for e in fresh] != [e.id for e in events]:
                    events = fresh
                    proj = await self._projected(ctx, cfg, events, force, force_media, unavailable)
                    continue
                event = await self._execute(ctx, cfg, proj)
            if event is None:
                break
            events = [*events, event]
            self._events.put(ctx.session.pk, events)
            force = False
            proj = await self._projected(ctx, cfg, events, force, force_media, unavailable)
        if proj.reason_unfittable and view.source == "config" and view.ratio <= 1.0 and overflow is None:
            # only an operator's own limit refuses a request, and only by the estimate at face
            # value; any other is forwarded, and the provider (whose tokenizer may count fewer)
            # answers it
            raise CannotFit(proj.reason_unfittable)
        own = self._own_tools(ctx, proj, own_names, own_schemas)
        changed = ctx.expanded or (proj.messages is not ctx.messages and proj.messages != ctx.messages)
        forwarded = None
        if changed or own:
            forwarded = ctx.body | {"messages": proj.messages}
            if own:
                forwarded["tools"] = [*(ctx.body.get("tools") or []), *own]
        body = orjson.dumps(forwarded) if forwarded is not None else ctx.raw
        names = frozenset(t["function"]["name"] for t in own)
        tokens_client, tokens_forwarded = proj.tokens_client, proj.tokens_forwarded
        if expected or own:  # exact: the client's tools for the client, the tools sent for the forwarded
            counted = self.counter.count_tools(ctx.count_tools)
            tokens_client -= counted - self.counter.count_tools(client_tools)
            tokens_forwarded += self.counter.count_tools([*(client_tools or []), *own] or None) - counted
        return Prepared(body, tokens_client, tokens_forwarded, proj.applied, proj.event_ids, forwarded, names, window)

    async def _projected(
        self, ctx: ChatContext, cfg: DefenseConfig, events: list[EventRecord], force: bool, force_media: bool,
        unavailable: set[str], *, truncate_first: bool = True,
    ) -> Projection:
        """``_project``; for a big request (a body of ``OFF_LOOP_BYTES`` or more) in a worker thread,
        so that counting and transforming it does not stall the event loop's other requests (the
        projection's memos and the counter's are locked; the result is the same)."""
        if len(ctx.raw) < OFF_LOOP_BYTES:
            return self._project(ctx, cfg, events, force, force_media, unavailable, truncate_first=truncate_first)
        return await asyncio.to_thread(self._project, ctx, cfg, events, force, force_media, unavailable,
                                       truncate_first=truncate_first)

    def _project(
        self, ctx: ChatContext, cfg: DefenseConfig, events: list[EventRecord], force: bool, force_media: bool,
        unavailable: set[str], *, truncate_first: bool = True,
    ) -> Projection:
        return project(
            ctx.messages,
            digests=ctx.digests,
            chain_hashes=ctx.chain,
            tools=ctx.count_tools,
            reserved_output_tokens=_reserved(ctx.body),
            events=events,
            config=cfg,
            counter=self.counter,
            session_id=ctx.session.session_id,
            force=force,
            force_media=force_media,
            unavailable_artifacts=frozenset(unavailable),
            truncate_first=truncate_first,
        )

    @contextlib.asynccontextmanager
    async def _lock(self, session_pk: int) -> AsyncIterator[None]:
        """One compaction at a time per session in this process (the store locks across processes)."""
        lock = self._locks.setdefault(session_pk, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and not lock._waiters:  # type: ignore[attr-defined]
                self._locks.pop(session_pk, None)

    async def _events_of(self, session_pk: int, *, refresh: bool) -> list[EventRecord]:
        """The session's events: cached for ``EVENTS_TTL_S``, re-read before a new compaction."""
        events = None if refresh else self._events.fresh(session_pk)
        if events is None:
            events = list(await self.store.list_events(session_pk))
            self._events.put(session_pk, events)
        return events

    async def _store_artifacts(self, ctx: ChatContext, proj: Projection, unavailable: set[str]) -> bool:
        todo = [a for a in proj.artifacts if self._stored.fresh((ctx.tenant, a.id)) is None]
        if not todo:
            return True
        records = [
            ArtifactRecord(
                id=a.id,
                tenant=ctx.tenant,
                session_pk=ctx.session.pk,
                media_type=a.media_type,
                content=a.content,
                size_bytes=len(a.content.encode()),
                line_count=a.content.count("\n") + (0 if a.content.endswith("\n") or not a.content else 1),
                created_at=now(),
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
            unavailable.update(a.id for a in proj.artifacts)
            return False

    async def _execute(self, ctx: ChatContext, cfg: DefenseConfig, proj: Projection) -> EventRecord | None:
        """Carry out ``proj.plan`` and store it as an event (the stored one if another request won)."""
        plan = proj.plan
        assert plan is not None
        if isinstance(plan, SummaryPlan):
            try:
                summary = await self._summarize(ctx, cfg, plan)
            except SummaryFailed as exc:
                log.error("summary call failed: %s", exc, extra={"session_id": ctx.session.session_id})
                return None
            payload, after = plan.payload(summary), plan.tokens_after_estimate
        else:
            payload, after = plan.payload(), plan.tokens_after
        await ctx.ensure_logged()  # an event never anchors on a message missing from the log
        event = EventRecord(
            id=_event_id(ctx.session.pk, plan.kind, plan.anchor_hash),
            session_pk=ctx.session.pk,
            kind=plan.kind,
            anchor_hash=plan.anchor_hash,
            payload=payload,
            tokens_before=plan.tokens_before,
            tokens_after=after,
            created_at=now(),
        )
        stored = await self.store.add_event(event)
        self.metrics.compaction_stored(stored.kind)
        return stored

    async def _summarize(self, ctx: ChatContext, cfg: DefenseConfig, plan: SummaryPlan) -> str:
        """Fold ``plan.to_summarize`` into the previous summary, one window-sized chunk per call.

        Each call must fit the window itself (case 020): chunks are sized from the window, the
        reply budget and the running summary; if the provider still reports an overflow, the
        chunks are halved (at most three attempts) before giving up.
        """
        window = cfg.context_window_tokens or self.settings.fallback_trigger_tokens
        reply = self._reply_tokens(window)
        shrink = 1
        for _attempt in range(3):
            summary = plan.previous_summary
            try:
                for chunk in await self._chunks(ctx, plan.to_summarize, window, reply, summary, shrink):
                    summary = await self._summary_call(ctx, summary, render_transcript(chunk), reply)
                return summary or ""
            except _SummaryOverflow as exc:
                if exc.limit_tokens:
                    window = min(window, exc.limit_tokens)
                shrink *= 2
        raise SummaryFailed("the summary request overflowed the window three times")

    def _reply_tokens(self, window: int) -> int:
        """The summary's output budget: the setting, but at most a quarter of the window."""
        return max(64, min(self.settings.summary_max_tokens, window // 4))

    async def _chunks(self, ctx: ChatContext, messages: list[dict[str, Any]], window: int, reply: int, summary: str | None,
                      shrink: int) -> list[list[dict[str, Any]]]:
        """``summary_chunks`` of ``messages``; for a big request in a worker thread (rendering and
        counting every message is CPU: 8 s for 100,000 messages of 60 MB)."""
        prior = self.counter.count_text(summary) if summary else 0
        budget = max(128, chunk_budget_tokens(window, reply, prior) // shrink)
        if len(ctx.raw) < OFF_LOOP_BYTES:
            return summary_chunks(messages, budget, self.counter)
        return await asyncio.to_thread(summary_chunks, messages, budget, self.counter)

    async def _summary_call(self, ctx: ChatContext, previous: str | None, transcript: str, reply_tokens: int) -> str:
        """One non-streaming summary request with the client's credentials and token-limit field.

        Never carries ``stream``/``stream_options`` (case 029) and uses ``max_completion_tokens``
        or ``max_tokens`` exactly as the client did, or neither (case 028).
        """
        body: dict[str, Any] = {
            "model": self.settings.summary_model or ctx.model,
            "messages": build_summary_request_messages(previous, transcript),
        }
        if "max_completion_tokens" in ctx.body:
            body["max_completion_tokens"] = reply_tokens
        elif "max_tokens" in ctx.body:
            body["max_tokens"] = reply_tokens
        try:  # a failed summary never fails the client's request: it is forwarded uncompacted
            resp = await self.upstream.send("POST", "/chat/completions", headers=ctx.upstream_headers, content=orjson.dumps(body),
                                            tenant=ctx.tenant)
            try:
                data = await resp.aread()
            finally:
                await resp.aclose()
        except ProxyError as exc:
            raise SummaryFailed(exc.message) from exc
        except Exception as exc:
            raise SummaryFailed(str(translate(exc))) from exc
        if resp.status_code >= 400:
            overflow = classify_error(resp.status_code, data, resp.headers, sent=body)
            if overflow is not None:
                raise _SummaryOverflow(overflow.limit_tokens)
            raise SummaryFailed(f"status {resp.status_code}: {data[:200]!r}")
        try:
            text = parse_json(data)["choices"][0]["message"]["content"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise SummaryFailed("unusable summary reply") from exc
        if not isinstance(text, str) or not text.strip():
            raise SummaryFailed("empty summary")
        return text

    async def learn(self, ctx: ChatContext, overflow: Overflow) -> None:
        """Learn from the provider's overflow of ``ctx``'s last attempt (``proxy.compaction.limits``), and
        remember the window its retry (the next ``prepare(ctx, overflow=...)``) is sized for."""
        sent = self._sent(ctx)
        if sent is None:
            return
        retry = await self.limits.learn_overflow(overflow, sent)
        if retry is not None:
            self._retry_windows.put(ctx.request_id, retry)

    def _sent(self, ctx: ChatContext) -> Sent | None:
        """What ``ctx``'s last attempt sent, its own tool rounds included (``None`` before a projection)."""
        p = ctx.prepared
        if p is None or not p.tokens_forwarded:
            return None
        estimate = p.tokens_forwarded + sum(self.counter.count_message(m) for m in ctx.internal)  # the proxy's rounds
        return Sent(ctx.tenant, ctx.model, ctx.session.pk, estimate, _reserved(ctx.body), lambda: _text_only(ctx))

    async def compact_now(self, ctx: ChatContext) -> str:
        """Serve the manual compaction tool: summarize now if the session is past half the trigger.

        Never an error for the model: a failed compaction says that nothing was removed.
        """
        cfg = DefenseConfig.from_settings(self.settings, (await self.window(ctx)).estimate_window(_reserved(ctx.body)))
        events = await self._events_of(ctx.session.pk, refresh=True)
        proj = await self._projected(ctx, cfg, events, False, False, set())
        if proj.tokens_forwarded < cfg.trigger_tokens // 2:
            return (
                f"[context-proxy] Nothing to compact yet: the conversation uses about {proj.tokens_forwarded} tokens, "
                f"under half of the automatic trigger ({cfg.trigger_tokens})."
            )
        forced = await self._projected(ctx, cfg, events, True, False, set(), truncate_first=False)
        try:
            if forced.artifacts and not await self._store_artifacts(ctx, forced, set()):
                raise SummaryFailed("artifacts could not be stored")
            event = None
            if forced.plan is not None:
                async with self._lock(ctx.session.pk), self.store.compaction_lock(ctx.session.pk):
                    event = await self._execute(ctx, cfg, forced)
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

    def can_retry(self, ctx: ChatContext, overflow: Overflow) -> bool:
        return True

    def usage_observed(self, ctx: ChatContext, usage: dict[str, Any] | None) -> bool:
        """Take a successful reply's ``usage`` into the learned limits (cheap, no I/O: the
        estimate ratio, silent truncation, a window proved wrong); ``True`` when
        ``persist_observed`` has something to store."""
        sent = self._sent(ctx)
        return sent is not None and self.limits.observe(sent, usage)

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

    async def persist_observed(self, ctx: ChatContext) -> None:
        """Store what ``usage_observed`` changed. Never raises."""
        sent = self._sent(ctx)
        if sent is not None:
            await self.limits.persist(sent)


SUBSTRING_FIRST_BYTES = 16 * 1024
"""Bodies up to this size are searched for a stored-content URL before ``ReferenceMemo`` is asked
(the search is cheaper than the memo's lookups there: about a fifth of a small request's
``prepare``, cProfile); longer ones ask the memo first, which spares the search of most requests."""

CONFIG_MEMO = 4096
"""Defense configs kept (one per window and read-tool flag)."""
REFERENCE_MEMO_SIZE = 20_000
"""Chain hashes ``ReferenceMemo`` remembers (about 200 bytes each: 10 MB at most; a session needs
one, plus one per ``REFERENCE_CHECKPOINT`` messages of its history)."""
REFERENCE_LOOKBACK = 64
"""Newest positions of a request searched for a remembered chain hash (a client resends its
history plus a few messages; an edit further back is found at a checkpoint)."""
REFERENCE_CHECKPOINT = 256
"""Every this many positions, a scan remembers its answer so far (branches from older places)."""


class ReferenceMemo:
    """``names(messages, chain)`` is ``any(references_in(messages))``, reading only new messages.

    Whether some message up to position ``i`` names an artifact or archive is a function of
    ``chain[i]`` (a chain hash identifies a message together with everything before it), so the
    answer for the longest remembered prefix is reused and only the messages after it are read.
    A client resends its whole history each turn: a warm request reads the two or three messages
    it adds. Bounded (LRU over ``size`` chain hashes, idle ones out after ``proxy.cache.MEMO_IDLE_S``);
    not locked (one event loop).
    """

    def __init__(self, size: int = REFERENCE_MEMO_SIZE) -> None:
        self._seen = Memo(size)

    def names(self, messages: list[dict[str, Any]], chain: list[str]) -> bool:
        """True iff the text of some message in ``messages`` names stored content.

        ``chain``: the chain hashes of ``messages`` (``proxy.conversation.canonical.digests_and_chain``), one per
        message. Raises ``ValueError`` when the lengths differ.
        """
        n = len(messages)
        if len(chain) != n:
            raise ValueError(f"{n} messages but {len(chain)} chain hashes")
        start, found = 0, False
        for i in self._probes(n):
            hit = self._seen.get(chain[i])
            if hit is not None:
                start, found = i + 1, hit
                break
        for i in range(start, n):
            if found:
                break
            found = any(references_in(messages[i:i + 1]))
            if (i + 1) % REFERENCE_CHECKPOINT == 0:
                self._seen.put(chain[i], found)
        if n:
            self._seen.put(chain[-1], found)
        return found

    @staticmethod
    def _probes(n: int) -> list[int]:
        """Positions to look up, deepest first: the newest ``REFERENCE_LOOKBACK``, then checkpoints."""
        newest = range(n - 1, max(-1, n - 1 - REFERENCE_LOOKBACK), -1)
        checkpoints = range((n - REFERENCE_LOOKBACK) // REFERENCE_CHECKPOINT * REFERENCE_CHECKPOINT - 1, -1,
                            -REFERENCE_CHECKPOINT)
        return [*newest, *checkpoints]


class _SummaryOverflow(Exception):
    def __init__(self, limit_tokens: int | None) -> None:
        super().__init__(limit_tokens)
        self.limit_tokens = limit_tokens


def _text_only(ctx: ChatContext) -> bool:
    """No image, audio or file in ``ctx``'s messages: no content is a list of parts (one C-level
    pass), or every part of those that are is text (their parts read; the body is not searched)."""
    contents = list(map(dict.get, ctx.messages, repeat("content")))
    if list not in map(type, contents):
        return True
    return all(not isinstance(part, dict) or part.get("type") in TEXT_PART_TYPES
               for content in contents if type(content) is list for part in content)


def _reserved(body: dict[str, Any]) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def _event_id(session_pk: int, kind: str, anchor_hash: str) -> str:
    import hashlib

    return "evt_" + hashlib.sha256(f"{session_pk}:{kind}:{anchor_hash}".encode()).hexdigest()[:24]
