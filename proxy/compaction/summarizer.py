"""Summaries for a ``SummaryPlan``: the transcript cut into window-sized chunks, each folded into
the running summary by one call of a ``SummaryModel``.

``Summarizer.fold`` is the same for the live proxy and for ``proxy.offline.replay``; only the
model differs: ``UpstreamSummaryModel`` asks the provider (one non-streaming request per chunk, in
the client's API, with its credentials), replay injects a deterministic local one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

from proxy.compaction.apis import ProviderApi, UnusableReply
from proxy.compaction.overflow import classify_error
from proxy.conversation.codec import Codec
from proxy.defenses.plans import SummaryPlan
from proxy.defenses.summarize import (
    chunk_budget_tokens,
    render_transcript,
    summary_chunks,
)
from proxy.errors import ProxyError
from proxy.json_depth import dumps
from proxy.settings import Settings
from proxy.tokens.protocol import TextCounter
from proxy.upstream.client import Upstream

SUMMARY_ATTEMPTS = 3
"""Attempts at one summary (the chunks halved after each overflow of a summary call)."""
MIN_CHUNK_TOKENS = 128
"""A chunk's transcript budget is never cut below this many tokens."""


class SummaryFailed(Exception):
    """No summary was produced (the provider answered an error or an unusable body, or every
    attempt overflowed)."""


class SummaryOverflow(Exception):
    """A summary call overflowed the window; ``limit_tokens`` is the window the provider stated
    (``None``: it stated none)."""

    def __init__(self, limit_tokens: int | None) -> None:
        super().__init__(limit_tokens)
        self.limit_tokens = limit_tokens


class SummaryModel(Protocol):
    """Writes one summary: ``chunk`` (chat messages) folded into ``previous`` (``None``: the first),
    in at most ``reply_tokens`` tokens. Raises ``SummaryOverflow`` (the call overflowed: the chunks
    are halved and tried again) or ``SummaryFailed``."""

    async def summarize(self, previous: str | None, chunk: list[dict[str, Any]], reply_tokens: int) -> str: ...


class UpstreamSummaryModel:
    """The provider writes the summary: one request of one client's (its credentials, its model or
    ``Settings.summary_model``, its token-limit field), in the client's API (``api``: the call's
    path, body and answer). Built per request; holds no state."""

    def __init__(self, upstream: Upstream, model: str, client_body: Mapping[str, Any],
                 headers: list[tuple[str, str]], tenant: str, api: ProviderApi) -> None:
        self.upstream, self.model, self.client_body, self.api = upstream, model, client_body, api
        self.headers, self.tenant = headers, tenant

    async def summarize(self, previous: str | None, chunk: list[dict[str, Any]], reply_tokens: int) -> str:
        """One non-streaming summary request (``ProviderApi.summary_body``); its reply's text.

        A failed call never fails the client's request (the caller forwards it uncompacted):
        raises ``SummaryOverflow`` for the provider's overflow error, ``SummaryFailed`` for any
        other error status, a transport error or a reply without text."""
        api = self.api
        body = api.summary_body(self.model, self.client_body, previous, render_transcript(chunk, api.codec),
                                reply_tokens)
        try:
            resp = await self.upstream.send("POST", api.summary_path, headers=self.headers,
                                            content=dumps(body), tenant=self.tenant)
            try:
                data = await resp.aread()
            finally:
                await resp.aclose()
        except ProxyError as exc:  # the transport's errors (``UpstreamError``), ``ProxyBusy``
            raise SummaryFailed(exc.message) from exc
        except Exception as exc:  # anything else: the request goes on uncompacted all the same
            raise SummaryFailed(type(exc).__name__) from exc
        if resp.status_code >= 400:
            overflow = classify_error(resp.status_code, data, resp.headers, sent=body)
            if overflow is not None:
                raise SummaryOverflow(overflow.limit_tokens)
            raise SummaryFailed(f"status {resp.status_code}: {data[:200]!r}")
        try:
            text = api.reply_text(data)
        except UnusableReply as exc:
            raise SummaryFailed(str(exc)) from exc
        if not text.strip():
            raise SummaryFailed("empty summary")
        return text


class Summarizer:
    """Folds a ``SummaryPlan``'s messages into its previous summary, chunk by chunk. Stateless
    past its settings and counter; one per compactor (or replay)."""

    def __init__(self, settings: Settings, counter: TextCounter, codec: Codec) -> None:
        self.settings = settings
        self.counter = counter
        self.codec = codec
        """Whose pieces a plan's messages are (their transcript and chunks)."""

    def reply_tokens(self, window_tokens: int) -> int:
        """The summary's output budget: ``Settings.summary_max_tokens``, at most a quarter of the
        window (tokens), at least 64."""
        return max(64, min(self.settings.summary_max_tokens, window_tokens // 4))

    async def fold(self, plan: SummaryPlan, window_tokens: int | None, model: SummaryModel, *, off_loop: bool) -> str:
        """The new summary text of ``plan`` (``window_tokens``: the window it is sized for,
        ``None``: ``Settings.fallback_trigger_tokens``).

        Each call must fit the window itself (case 020): chunks are sized from the window, the
        reply budget and the running summary; when the provider still reports an overflow, the
        chunks are halved (``SUMMARY_ATTEMPTS`` attempts) and the stated window believed if
        smaller. ``off_loop``: split in a worker thread (rendering and counting every message is
        CPU: 8 s for 100,000 messages of 60 MB). Raises ``SummaryFailed``.
        """
        window = window_tokens or self.settings.fallback_trigger_tokens
        reply = self.reply_tokens(window)
        shrink = 1
        for _attempt in range(SUMMARY_ATTEMPTS):
            summary = plan.previous_summary
            try:
                for chunk in await self._chunks(plan.to_summarize, window, reply, summary, shrink, off_loop):
                    summary = await model.summarize(summary, chunk, reply)
                return summary or ""
            except SummaryOverflow as exc:
                if exc.limit_tokens:
                    window = min(window, exc.limit_tokens)
                shrink *= 2
        raise SummaryFailed(f"the summary request overflowed the window {SUMMARY_ATTEMPTS} times")

    async def _chunks(self, messages: list[dict[str, Any]], window: int, reply: int, summary: str | None,
                      shrink: int, off_loop: bool) -> list[list[dict[str, Any]]]:
        prior = self.counter.count_text(summary) if summary else 0
        budget = max(MIN_CHUNK_TOKENS, chunk_budget_tokens(window, reply, prior) // shrink)
        if not off_loop:
            return summary_chunks(messages, budget, self.counter, self.codec)
        return await asyncio.to_thread(summary_chunks, list(messages), budget, self.counter, self.codec)
