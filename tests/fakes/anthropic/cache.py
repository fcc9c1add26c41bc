"""Prompt-cache emulation: which input tokens a request reads from the cache, and writes to it.

The rules kept from https://platform.claude.com/docs/en/build-with-claude/prompt-caching:
a cache entry is the exact prefix (``tools`` → ``system`` → ``messages``, ``tokens.py``'s
segments) up to a block carrying ``cache_control`` (a *breakpoint*); a request reads the longest
prefix an earlier request wrote, and writes every prefix up to its own breakpoints. Top-level
``cache_control`` (automatic caching, ``message_create_params.py``) puts a breakpoint on the last
segment. Entries are per model. Usage then reports (all in tokens)::

    cache_read_input_tokens     = tokens of the longest prefix, ending at or before this request's
                                  last breakpoint, that an earlier request wrote
    cache_creation_input_tokens = tokens from there up to this request's last breakpoint
    input_tokens                = the rest (after the last breakpoint, plus the reply priming)

so the three add up to the request's total input, as the Usage docs say.

Simplifications (documented, not the API's): entries never expire (the API: 5 minutes or 1 hour
after last use, ``ttl``); no 20-block lookback limit (the API looks back at most 20 blocks from
a breakpoint for an earlier entry); the minimum cacheable prefix is ``min_cacheable_tokens``
(default 0; the API's is 1,024 to 4,096 tokens by model, below which nothing is cached and no
error is raised); every creation is reported as ``ephemeral_5m_input_tokens`` unless the last
breakpoint asks ``ttl: "1h"``. Thread-safe: one lock around the table.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

from tests.fakes.anthropic.tokens import REPLY_PRIMING_TOKENS, Segment


@dataclass(frozen=True)
class CacheUsage:
    """The input split of one request, in tokens."""

    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int


class PromptCache:
    """Prefix digests written by earlier requests (see the module docstring)."""

    def __init__(self, min_cacheable_tokens: int = 0) -> None:
        self.min_cacheable_tokens = min_cacheable_tokens
        self._written: set[bytes] = set()
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._written.clear()

    def account(self, model: str, segments: list[Segment], auto_breakpoint: bool, *, write: bool = True) -> CacheUsage:
        """Split the input of a request and (``write``) record its breakpoints' prefixes."""
        running = hashlib.sha256(model.encode())
        prefix_digests: list[bytes] = []
        cumulative = [0]
        for segment in segments:
            running.update(segment.digest)
            prefix_digests.append(running.copy().digest())
            cumulative.append(cumulative[-1] + segment.tokens)
        breakpoints = [k + 1 for k, s in enumerate(segments) if s.breakpoint]
        if auto_breakpoint and segments:
            breakpoints.append(len(segments))
        total = cumulative[-1] + REPLY_PRIMING_TOKENS
        last = max(breakpoints, default=0)
        with self._lock:
            read_at = max((k for k in range(1, last + 1) if prefix_digests[k - 1] in self._written), default=0)
            read = cumulative[read_at]
            creation = 0
            if last > read_at and cumulative[last] >= self.min_cacheable_tokens:
                creation = cumulative[last] - read
            if write:
                for k in breakpoints:
                    if cumulative[k] >= self.min_cacheable_tokens:
                        self._written.add(prefix_digests[k - 1])
        return CacheUsage(total - read - creation, creation, read)
