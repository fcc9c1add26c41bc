"""Every memo and cache of one app, its owner and its bound, in one table (``BOUNDS``).

Each is an object's state, built in the app's lifespan (``proxy.app.ProxyState``) or by an object
built there, passed down, and gone with the app: no module holds mutable state but loggers and
constants. Entries unused for ``proxy.cache.MEMO_IDLE_S`` seconds leave the idle-bounded ones
("idle"); a TTL is how long an entry is trusted. ``constant`` names where each bound is set: a
module attribute, a ``Settings`` field, or a parameter's default (``module.Class(param)``);
``tests/test_bounds.py`` checks that every one exists and is a positive number, so the table
follows the code (a constant may bound two memos: the model labels bound the metric series).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bound:
    """One memo or cache: ``what`` it holds, its ``owner`` (the object holding it, from the
    lifespan down), its ``bound`` in words (with the unit), and the ``constant`` setting it
    (``package.module.NAME``, ``proxy.settings.Settings.field`` or ``package.module.Class(param)``)."""

    what: str
    owner: str
    bound: str
    constant: str


BOUNDS: tuple[Bound, ...] = (
    Bound("parsed upstream URLs, per path", "Upstream", "256 paths of at most 256 characters, cleared when full",
          "proxy.upstream.client.URL_MEMO_PATHS"),
    Bound("pool slots per tenant", "Upstream.slots (PoolShare)", "one entry per tenant with a request in flight",
          "proxy.settings.Settings.upstream_pool_size"),
    Bound("tenant ids of keys seen, by the keys' BLAKE2s digests", "Authenticator._tenants",
          "1,024 keys, cleared when full",
          "proxy.routes.auth.TENANTS_KEPT"),
    Bound("held request bodies", "app.state.body_budget (BodyBudget)", "bytes of bodies held at once",
          "proxy.settings.Settings.max_held_body_bytes"),
    Bound("kinds of log-line extra fields", "JsonFormatter", "1,024 field names, cleared when full",
          "proxy.telemetry.logs.FIELD_KINDS_KEPT"),
    Bound("masked access-line texts", "JsonFormatter._access_texts",
          "1,024 (message, route) pairs of at most 256 characters each, cleared when full",
          "proxy.telemetry.logs.ACCESS_TEXTS_KEPT"),
    Bound("series of the (route, model, status) triples served", "Metrics._served",
          "1,024 triples of models of at most 100 characters, cleared when full",
          "proxy.telemetry.metrics.SERVED_KEPT"),
    Bound("upstream latency series of the models answered", "Metrics._latency",
          "1,024 models of at most 100 characters, cleared when full", "proxy.telemetry.metrics.LATENCY_KEPT"),
    Bound("model label names", "Metrics", "256 names of at most 100 characters, the rest 'other'",
          "proxy.telemetry.metrics.MODEL_LABELS"),
    Bound("metric series (labelled children)", "Metrics._children",
          "one per label set: the model label is one of 257 (the names above, or 'other'), the other labels "
          "are the proxy's own words (routes, statuses, kinds)", "proxy.telemetry.metrics.MODEL_LABELS"),
    Bound("message digests and chain hashes", "ChatPipeline.digest_memo (DigestMemo; MessagesPipeline shares it)",
          "16 MB of messages, idle",
          "proxy.conversation.digest_memo.MEMO_MAX_BYTES"),
    Bound("big request bodies and their parsed messages, per tenant", "ChatPipeline.body_memo (BodyMemo)",
          "32 MB accounted (the kept bytes and their parsed shape; text outside ASCII up to 2.4x), "
          "16 per tenant and first KB, idle",
          "proxy.conversation.body_memo.BODY_MEMO_MAX_BYTES"),
    Bound("sessions, stored-length trust stamps, internal messages", "SessionLog", "10,000 sessions each, 30 s TTL",
          "proxy.forward.session_log.CACHED_SESSIONS"),
    Bound("derived session ids", "SessionLog", "10,000 ids, cleared when full",
          "proxy.forward.session_log.DERIVED_IDS_KEPT"),
    Bound("system entropy not yet used in request ids", "ChatPipeline.entropy (EntropyPool)",
          "4,096 bytes, read again when used up (MessagesPipeline.entropy is the same pool)",
          "proxy.forward.entropy.ENTROPY_POOL_BYTES"),
    Bound("compaction events per session", "ProjectingCompactor", "10,000 sessions, 30 s TTL",
          "proxy.compaction.compactor.EVENTS_CACHED"),
    Bound("artifact ids known stored", "ProjectingCompactor", "100,000 ids, 60 s TTL",
          "proxy.compaction.compactor.ARTIFACTS_KNOWN"),
    Bound("retry windows", "ProjectingCompactor", "10,000 entries",
          "proxy.compaction.compactor.RETRY_WINDOWS"),
    Bound("per-session compaction locks", "ProjectingCompactor._locks",
          "one per session with a compaction running or waiting, dropped when its last waiter leaves "
          "(so at most the requests in flight, whose held bodies are bounded in bytes)",
          "proxy.settings.Settings.max_held_body_bytes"),
    Bound("learned limits and session windows", "LearnedLimits", "10,000 keys each, TTL",
          "proxy.compaction.limits.MAX_KEYS"),
    Bound("model profile lookups", "ModelProfiles", "4,096 names, cleared when full",
          "proxy.compaction.models.LOOKUP_MEMO"),
    Bound("defense configs", "PlanLoop", "4,096 (window, read tool) keys, cleared when full",
          "proxy.compaction.plan_loop.CONFIG_MEMO"),
    Bound("transformed messages", "PlanLoop.memos (ProjectionMemos)", "20,000 messages, idle",
          "proxy.projection.TRANSFORM_MEMO_SIZE"),
    Bound("per-conversation prefix states (chain index, token counts, items, whether the prefix names "
          "stored content, its stored length per session)",
          "ProxyState's lifespan: one PrefixStates shared by ProjectionMemos.prefixes, ReferenceMemo.prefixes and "
          "SessionLog.prefixes", "200,000 positions (a state counts one more, a stored length one), idle; found "
          "among a request's newest 64 chain hashes", "proxy.conversation.prefix.MAX_POSITIONS"),
    Bound("sessions remembered per prefix state", "PrefixState.stored", "8 sessions, the newest noted kept",
          "proxy.conversation.prefix.STORED_SESSIONS_PER_PREFIX"),
    Bound("prefix state lookback", "PrefixStates", "64 newest positions of a request searched",
          "proxy.conversation.prefix.LOOKBACK"),
    Bound("read API searches running at once", "ProxyState.searches (SearchSlots)",
          "searches per process; more wait their turn", "proxy.settings.Settings.read_api_max_concurrent_searches"),
    Bound("read API searches waiting", "ProxyState.searches (SearchSlots)",
          "4 per running slot; one more is a 503 proxy_busy", "proxy.admission.SEARCHES_WAITING_PER_SLOT"),
    Bound("message token counts", "TokenCounter", "200,000 messages, idle",
          "proxy.tokens.counter.TokenCounter(memo_size)"),
    Bound("recent tool lists and their counts", "CodecCounter._recent_tools",
          "8 lists per codec, the oldest dropped", "proxy.tokens.priced.RECENT_TOOL_LISTS"),
)
"""The table (module docstring)."""
