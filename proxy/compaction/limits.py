"""Limits the proxy learns about a model (DESIGN.md section 7): windows, and how the provider counts.

What counts as evidence, and what it may change (all of it per tenant, upstream and model: one
tenant's traffic never changes what another tenant's requests see):

- **An overflow error** whose stated numbers agree with what was sent (``consistent``: the stated
  prompt size within ``STATED_FACTOR`` of the proxy's estimate; a stated window no larger than
  what was sent could exceed) sets the tenant's window (stored, expiring after
  ``Settings.learned_limit_ttl_s``). ``proxy.compaction.overflow`` reads those numbers from the provider's own
  words only, never from text that echoes the client's strings. An overflow that states no
  usable number changes nothing stored: the retry alone is sized from the estimate.
- **Silent front truncation** (case 017: ``usage.prompt_tokens`` far under the estimate of a
  large, text-only request) sets a window for that session alone; the same count seen again in
  another of the tenant's sessions sets the tenant's window (for ``USAGE_WINDOW_S``). Never below ``floor_tokens``; off
  with the byte estimate (no tiktoken files), which is too rough to tell truncation from counting.
- **Every large reply's usage** moves the tenant's *estimate ratio*: the provider's
  ``usage.prompt_tokens`` divided by the proxy's estimate of what it sent (a running mean over the
  last ``RATIO_SAMPLES`` replies, clamped to ``RATIO_MIN``-``RATIO_MAX``). Windows are divided by
  it before the trigger arithmetic, so a provider that counts 1.5x tiktoken (Claude-like, case
  043) is compacted for at 85% of *its* count.
- **A reply that proves a window wrong** (the provider accepted more prompt tokens than the
  learned window) forgets that window.

Nothing here refuses a request: a learned window only sizes the defenses, and the provider keeps
the last word (``proxy.forward.pipeline`` forwards what does not fit and passes the provider's answer on).
Operators list and reset what was learned with ``context-proxy limits`` or the admin read API.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from proxy.cache import BoundedCache
from proxy.compaction.models import ModelProfiles
from proxy.compaction.overflow import Overflow
from proxy.telemetry.metrics import Metrics
from storage.errors import StorageError
from storage.records import LearnedLimitRecord
from storage.store import Store

log = logging.getLogger("context_proxy.limits")

STATED_FACTOR = 4.0
"""A stated prompt size further than this factor from the proxy's estimate of what it sent is not
about this request (tokenizers differ by up to ~1.6x on agent content; images more)."""
MIN_STATED_WINDOW_TOKENS = 1024
"""A stated window under this is not believed (no model agents use has one; echoes have)."""
UNSTATED_RETRY_FRACTION = 0.9
"""An overflow that states no usable window: the retry is sized for this share of what was sent."""
TRUNCATION_SUSPECT_RATIO = 1.5
"""Usage under the estimate divided by this suggests silent front truncation."""
USAGE_MIN_ESTIMATE_TOKENS = 4096
"""Truncation is suspected only on requests at least this large (by the estimate, prompt only):
fixed overheads (tool schemas, per-message framing) cannot explain a gap of a third of that."""
USAGE_AGREEMENT = 0.05
"""Two suspected truncations agree when their counts are within this share of each other."""
WINDOW_FLOOR_TOKENS = 2048
FLOOR_SHARE = 1 / 64
"""A window learned from usage is at least ``max(WINDOW_FLOOR_TOKENS, profile window x FLOOR_SHARE)``:
2,048 tokens for most models. Not 1/8 of the profile: Ollama serves 2,048-4,096 tokens of
40k-128k models (case 017), exactly what this learning is for; the other guards (two agreeing
observations, large requests, the exact tokenizer, the tenant's scope, expiry) carry the safety."""
CALIBRATION_MIN_TOKENS = 1024
"""Only requests at least this large (estimate, prompt only) move the estimate ratio."""
RATIO_MIN, RATIO_MAX = 0.5, 2.0
RATIO_MIN_EXACT = 0.8
"""With tiktoken's files, a provider that counts under 0.8x is more likely truncating than counting
(o200k is among the most compact tokenizers): the ratio is not taken lower."""
RATIO_SAMPLES = 16
RATIO_STEP = 0.05
"""The ratio applied is rounded to this step (few distinct windows); it is stored when it moved
by at least this much since it was last stored."""
REFRESH_S = 60.0
"""How long a tenant's stored limits are trusted before they are read again (a reset by another
process takes effect within this)."""
USAGE_WINDOW_S = 3600.0
"""A tenant's window learned from usage is used this long (then learned again if the provider
still cuts): usage that under-reports (a glitch, a provider counting only uncached tokens) cannot
keep a tenant compacting for the whole ``ttl_s``, since compaction keeps later prompts under the
window and no reply can prove it wrong."""
SESSION_WINDOW_S = 3600.0
"""How long a window one reply suggested is used for its session (then learned again, if so)."""
MAX_KEYS = 10_000
"""(tenant, model) pairs kept in memory; least recently used out."""
MAX_MODEL_CHARS = 256
"""Longer model names (client-chosen strings) are never learned about or stored."""


@dataclass(slots=True)
class WindowView:
    """The window one request is sized for. ``tokens``: the context window in the provider's
    tokens (the profile's, or a learned one when smaller; ``None``: unknown); ``ratio``: the
    provider's count per estimated token; ``source``: where ``tokens`` came from (``builtin``,
    ``config``, ``learned``, ``session``). Not ``frozen``, yet never changed: one per request
    (see ``proxy.compaction.base.Prepared``)."""

    tokens: int | None
    ratio: float
    source: str | None

    def estimate_window(self, reserved_tokens: int = 0) -> int | None:
        """The window in the proxy's estimated tokens, for a request that reserves
        ``reserved_tokens`` of output (the projection adds those as they are): the prompt's part
        of the window divided by ``ratio``, plus the reserved tokens. A window learned from usage
        is the provider's own count of what it kept: never enlarged by a ratio under 1."""
        if self.tokens is None:
            return None
        ratio = max(self.ratio, 1.0) if self.source in ("usage", "session") else self.ratio
        prompt = self.tokens - reserved_tokens
        return self.tokens if prompt <= 0 else max(1, int(prompt / ratio) + reserved_tokens)


@dataclass(slots=True)
class _Known:
    """What is known about one (tenant, model) in this process: the stored row as last read (or
    as changed here since), the running ratio, a suspected truncation awaiting a second one, and
    which of the two parts (window, ratio) is to be stored."""

    record: LearnedLimitRecord | None
    read_at: float
    ratio: float | None = None
    samples: int = 0
    stored_ratio: float | None = None
    suspected_prompt: int | None = None
    suspected_session: int | None = None
    window_dirty: bool = False
    ratio_dirty: bool = False

    @property
    def window(self) -> int | None:
        """The learned window in force (``None``: none, or expired)."""
        r = self.record
        if r is None or r.context_window_tokens is None:
            return None
        if r.expires_at is not None and r.expires_at <= datetime.now(UTC):
            return None
        return r.context_window_tokens


@dataclass(slots=True)
class Sent:
    """What one request sent, as the pipeline knows it: ``estimate_tokens`` (the proxy's estimate
    of the whole prompt, reserved output included), ``reserved_tokens``; ``text_only()`` says
    whether it carried no image, audio or file (called at most once, only when needed: it may
    search the body). Not ``frozen``, yet never changed: one per answered request (its usage is
    observed), and a frozen dataclass's fields cost about five times as much to set (see
    ``proxy.compaction.base.Prepared``)."""

    tenant: str
    model: str
    session_pk: int
    estimate_tokens: int
    reserved_tokens: int
    text_only: Callable[[], bool]

    @property
    def prompt_estimate_tokens(self) -> int:
        prompt = self.estimate_tokens - self.reserved_tokens
        return prompt if prompt > 0 else 0  # (``max(0, prompt)``, inline)


@dataclass
class LearnedLimits:
    """The learned limits of one app (see the module docstring). Safe on one event loop."""

    store: Store
    upstream: str
    profiles: ModelProfiles
    ttl_s: float
    metrics: Metrics
    exact: bool
    _known: BoundedCache = field(init=False)
    _session: BoundedCache = field(init=False)
    """(tenant, model, session pk) -> a window from one suspected truncation (in this process only,
    for at most ``SESSION_WINDOW_S``)."""

    def __post_init__(self) -> None:
        self._known = BoundedCache(MAX_KEYS)
        self._session = BoundedCache(MAX_KEYS, min(self.ttl_s, SESSION_WINDOW_S))

    # --- reading ------------------------------------------------------------------------------

    async def view(self, tenant: str, model: str, session_pk: int | None = None) -> WindowView:
        """The window a request of ``tenant`` on ``model`` (in session ``session_pk``) is sized for.
        Raises ``StorageError`` when the stored limits cannot be read."""
        view = self.view_now(tenant, model, session_pk)
        if view is None:
            view = self._view(await self._get(tenant, model), tenant, model, session_pk)
        return view

    def view_now(self, tenant: str, model: str, session_pk: int | None = None) -> WindowView | None:
        """``view`` without I/O: ``None`` when the stored limits are to be read first (not read
        yet in this process, or more than ``REFRESH_S`` ago); most requests need no read."""
        known: _Known | None = None
        if len(model) <= MAX_MODEL_CHARS:
            key = (tenant, model)
            known = self._known.fresh(key)
            if known is None or self._stale(known, time.monotonic()):
                return None
            self._known.touch(key)
        return self._view(known, tenant, model, session_pk)

    def _view(self, known: _Known | None, tenant: str, model: str, session_pk: int | None) -> WindowView:
        profile = self.profiles.resolve(model, known.window if known is not None else None)
        tokens: int | None = profile.context_window_tokens if profile is not None else None
        source: str | None = profile.source if profile is not None else None
        if source == "learned" and known is not None and known.record is not None and known.record.source == "usage":
            source = "usage"
        local = self._session.fresh((tenant, model, session_pk)) if session_pk is not None and self._session else None
        if local is not None and (tokens is None or local < tokens):
            tokens, source = local, "session"
        return WindowView(tokens, _applied(known.ratio) if known is not None else 1.0, source)

    def floor_tokens(self, model: str) -> int:
        """The least window usage may set for ``model``: ``max(WINDOW_FLOOR_TOKENS, profile x FLOOR_SHARE)``."""
        profile = self.profiles.lookup(model)
        return max(WINDOW_FLOOR_TOKENS, int((profile.context_window_tokens if profile else 0) * FLOOR_SHARE))

    async def _get(self, tenant: str, model: str) -> _Known | None:
        if len(model) > MAX_MODEL_CHARS:
            return None
        key = (tenant, model)
        known = self._known.fresh(key)
        now = time.monotonic()
        if known is None or self._stale(known, now):
            record = await self.store.get_learned_limit(tenant, self.upstream, model)
            if known is None:
                known = _Known(record, now)
            known.record, known.read_at = record, now
            stored = record.estimate_ratio if record is not None else None
            if stored != known.stored_ratio:  # another process moved it, or a reset cleared it
                known.ratio, known.stored_ratio, known.samples = stored, stored, 1 if stored is not None else 0
        self._known.put(key, known)
        return known

    @staticmethod
    def _stale(known: _Known, now: float) -> bool:
        """Read more than ``REFRESH_S`` before ``now`` (``time.monotonic()``), nothing unstored."""
        return now - known.read_at > REFRESH_S and not (known.window_dirty or known.ratio_dirty)

    # --- an overflow --------------------------------------------------------------------------

    def consistent(self, overflow: Overflow, sent: Sent) -> tuple[int | None, int | None]:
        """``(window, prompt)``: the overflow's stated numbers that agree with what was sent, in
        the provider's tokens (``None`` for one that was not stated or does not agree)."""
        prompt, window = overflow.prompt_tokens, overflow.limit_tokens
        estimate = sent.prompt_estimate_tokens
        if prompt is not None and not (estimate / STATED_FACTOR <= prompt <= estimate * STATED_FACTOR):
            return None, None  # not about this request: believe neither number
        if window is not None:
            largest = ((prompt + sent.reserved_tokens) * 1.1 + 16 if prompt is not None
                       else sent.estimate_tokens * STATED_FACTOR)
            if window < MIN_STATED_WINDOW_TOKENS or window > largest:
                window = None
        return window, prompt

    async def learn_overflow(self, overflow: Overflow, sent: Sent) -> int | None:
        """Learn from an overflow of the request ``sent``; returns the window the retry is to be
        sized for, in estimated tokens (``None``: not a context overflow). Storage failures are
        logged, never raised."""
        if overflow.kind != "context":
            return None
        window, prompt = self.consistent(overflow, sent)
        known = await self._get_quietly(sent.tenant, sent.model)
        if prompt is not None and known is not None and sent.prompt_estimate_tokens >= CALIBRATION_MIN_TOKENS:
            self._sample(known, prompt / max(1, sent.prompt_estimate_tokens))
        if window is None:
            return max(1, int(sent.estimate_tokens * UNSTATED_RETRY_FRACTION))
        if known is not None:
            await self._store_window(sent, known, window, "overflow")
        ratio = _applied(known.ratio) if known is not None else 1.0
        return WindowView(window, ratio, "overflow").estimate_window(sent.reserved_tokens)

    async def _get_quietly(self, tenant: str, model: str) -> _Known | None:
        try:
            return await self._get(tenant, model)
        except StorageError:
            self.metrics.database_error("learned_limits")
            return None

    # --- a reply's usage ----------------------------------------------------------------------

    def observe(self, sent: Sent, usage: dict[str, Any] | None) -> bool:
        """Take a successful reply's ``usage`` (cheap, no I/O). ``True`` when ``persist`` has
        something to store for ``sent``'s tenant and model."""
        prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if not isinstance(prompt, int) or isinstance(prompt, bool) or prompt <= 0 or len(sent.model) > MAX_MODEL_CHARS:
            return False
        known: _Known | None = self._known.fresh((sent.tenant, sent.model))
        if known is None:
            return False  # every request reads its limits first (``view``): nothing to compare with
        if known.window is not None and prompt > known.window:  # the provider took more: it was wrong
            self._set_window(sent, known, None, None)
            self.metrics.limit_learned("forgotten")
        local = None
        if self._session:  # (empty but for sessions suspected of silent truncation)
            local_key = (sent.tenant, sent.model, sent.session_pk)
            local = self._session.fresh(local_key)
            if local is not None and prompt > local:
                self._session.pop(local_key, None)
        estimate = sent.prompt_estimate_tokens
        if estimate < CALIBRATION_MIN_TOKENS or not sent.text_only():
            return known.window_dirty or known.ratio_dirty  # image, audio, file costs: estimates
        if estimate > prompt * TRUNCATION_SUSPECT_RATIO and self.exact:
            if estimate >= USAGE_MIN_ESTIMATE_TOKENS:
                self._suspect(sent, known, prompt)
        elif not any(w and abs(prompt - w) <= USAGE_AGREEMENT * w
                     for w in (known.window, local, known.suspected_prompt)):
            self._sample(known, prompt / estimate)  # (a count at a window is a cut prompt, not a ratio)
        return known.window_dirty or known.ratio_dirty

    def _suspect(self, sent: Sent, known: _Known, prompt: int) -> None:
        window = max(prompt, self.floor_tokens(sent.model))
        log.warning("suspected silent truncation: the provider counted %d prompt tokens, the proxy estimated %d; "
                    "sizing this session for %d tokens", prompt, sent.prompt_estimate_tokens, window)
        self._session.put((sent.tenant, sent.model, sent.session_pk), window)
        earlier, known.suspected_prompt = known.suspected_prompt, prompt
        elsewhere, known.suspected_session = known.suspected_session != sent.session_pk, sent.session_pk
        agree = (earlier is not None and elsewhere
                 and abs(earlier - prompt) <= USAGE_AGREEMENT * max(earlier, prompt))
        if agree and (known.window is None or window < known.window):
            self._set_window(sent, known, window, "usage")
            self.metrics.limit_learned("usage")

    def _sample(self, known: _Known, ratio: float) -> None:
        ratio = min(RATIO_MAX, max(RATIO_MIN_EXACT if self.exact else RATIO_MIN, ratio))
        known.samples = min(known.samples + 1, RATIO_SAMPLES)
        known.ratio = ratio if known.ratio is None else known.ratio + (ratio - known.ratio) / known.samples
        if known.stored_ratio is None or abs(known.ratio - known.stored_ratio) >= RATIO_STEP:
            known.ratio_dirty = True

    def _set_window(self, sent: Sent, known: _Known, window: int | None, source: str | None) -> None:
        now = datetime.now(UTC)
        ttl_s = self.ttl_s if source != "usage" else min(self.ttl_s, USAGE_WINDOW_S)
        expires = now + timedelta(seconds=ttl_s) if window is not None else None
        base = known.record or LearnedLimitRecord(sent.tenant, self.upstream, sent.model, None, None, None, now, None)
        known.record = dataclasses.replace(base, context_window_tokens=window, source=source, updated_at=now,
                                           expires_at=expires)
        known.window_dirty = True

    async def _store_window(self, sent: Sent, known: _Known, window: int, source: str) -> None:
        self._set_window(sent, known, window, source)
        self.metrics.limit_learned(source)
        await self.persist(sent)

    async def persist(self, sent: Sent) -> None:
        """Store what changed for ``sent``'s tenant and model: the window columns and the ratio
        column each on their own (another replica's write of the other part is kept). Never raises."""
        known = self._known.fresh((sent.tenant, sent.model))
        if known is None or (known.record is None and known.ratio is None):
            return
        now = datetime.now(UTC)
        key = (sent.tenant, self.upstream, sent.model)
        try:
            if known.window_dirty and known.record is not None:
                known.window_dirty = False
                r = known.record
                await self.store.set_learned_window(*key, r.context_window_tokens, r.source, now, r.expires_at)
            if known.ratio_dirty and known.ratio is not None:
                known.ratio_dirty, ratio = False, known.ratio
                await self.store.set_estimate_ratio(*key, ratio, now)
                known.stored_ratio = ratio
                self.metrics.estimate_ratio(sent.model, _applied(ratio))
        except StorageError:
            known.window_dirty = known.window_dirty or known.record is not None
            known.ratio_dirty = known.ratio is not None
            log.error("storing the learned limits of %s failed", sent.model[:100])
            self.metrics.database_error("learned_limits")

    def forget(self, tenant: str | None = None, model: str | None = None) -> None:
        """Drop what this process remembers (after a reset), for one tenant/model or all."""
        for cache in (self._known, self._session):
            for key in list(cache):
                if (tenant is None or key[0] == tenant) and (model is None or key[1] == model):
                    cache.pop(key, None)


def _applied(ratio: float | None) -> float:
    """The ratio the trigger arithmetic uses: 1.0 until measured, else rounded to ``RATIO_STEP``."""
    if ratio is None:
        return 1.0
    return round(min(RATIO_MAX, max(RATIO_MIN, ratio)) / RATIO_STEP) * RATIO_STEP
