"""The thresholds of the defenses, derived once per request from the settings and a model profile.

Numbers are DESIGN.md section 2's defaults (``proxy.settings.Settings``): trigger at 85% of the
context window, keep the most recent 10% verbatim, offload tool results over 20,000 tokens and
user messages over 50,000 tokens, truncate old ``write_file``/``edit_file`` arguments over 2,000
chars to their first 20 chars. Models without a known window use the fallback of DESIGN.md: trigger
at 170,000 tokens, keep the last 6 messages.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

FALLBACK_TRIGGER_TOKENS = 170_000
FALLBACK_KEEP_MESSAGES = 6
SUMMARY_HEADER_TOKENS = 120
"""Tokens of the summary message's fixed header (measured: about 80 with o200k_base, rounded up)."""


@dataclass(frozen=True, slots=True)
class DefenseConfig:
    """Settings of the defenses for one request; all derived thresholds are properties.

    ``context_window_tokens`` is ``None`` for a model without a profile (fallback thresholds).
    Every count compared with these thresholds is the whole prompt: messages + tool schemas +
    the completion tokens the request reserves (``max_tokens``/``max_completion_tokens``).
    """

    context_window_tokens: int | None
    enabled: bool = True
    trigger_fraction: float = 0.85
    keep_fraction: float = 0.10
    fallback_trigger_tokens: int = FALLBACK_TRIGGER_TOKENS
    fallback_keep_messages: int = FALLBACK_KEEP_MESSAGES
    truncate_args_tools: frozenset[str] = frozenset({"write_file", "edit_file"})
    truncate_args_max_chars: int = 2000
    truncate_args_keep_chars: int = 20
    offload_tool_tokens: int = 20_000
    offload_user_tokens: int = 50_000
    offload_window_fraction: float = 0.25
    preview_lines: int = 5
    preview_line_chars: int = 1000
    summary_max_tokens: int = 2048
    patch_dangling_tool_calls: str = "compacted"
    read_tool_name: str | None = None
    """Hook: the name of a tool the proxy offers to read archives/artifacts, named in stubs."""

    @classmethod
    def from_settings(cls, settings: Any, context_window_tokens: int | None) -> DefenseConfig:
        """Build from ``proxy.settings.Settings`` and the model profile's window (``None``: unknown)."""
        tools = frozenset(t.strip() for t in settings.truncate_args_tools.split(",") if t.strip())
        return cls(
            context_window_tokens=context_window_tokens,
            enabled=settings.compaction_enabled,
            trigger_fraction=settings.trigger_fraction,
            keep_fraction=settings.keep_fraction,
            fallback_trigger_tokens=settings.fallback_trigger_tokens,
            fallback_keep_messages=settings.fallback_keep_messages,
            truncate_args_tools=tools,
            truncate_args_max_chars=settings.truncate_args_max_chars,
            truncate_args_keep_chars=settings.truncate_args_keep_chars,
            offload_tool_tokens=settings.offload_tool_tokens,
            offload_user_tokens=settings.offload_user_tokens,
            offload_window_fraction=settings.offload_window_fraction,
            preview_lines=settings.preview_lines,
            preview_line_chars=settings.preview_line_chars,
            summary_max_tokens=settings.summary_max_tokens,
            patch_dangling_tool_calls=settings.patch_dangling_tool_calls,
        )

    def with_window(self, limit_tokens: int | None) -> DefenseConfig:
        """This config with the window lowered to ``limit_tokens`` (a limit learned from an overflow)."""
        if limit_tokens is None:
            return self
        window = self.context_window_tokens
        new = limit_tokens if window is None else min(window, limit_tokens)
        return dataclasses.replace(self, context_window_tokens=new)

    @property
    def trigger_tokens(self) -> int:
        """Compact when the prompt estimate passes this (85% of the window; fallback 170,000)."""
        if self.context_window_tokens is None:
            return self.fallback_trigger_tokens
        return int(self.context_window_tokens * self.trigger_fraction)

    @property
    def keep_tokens(self) -> int | None:
        """Tokens of recent messages kept verbatim after a summary (10% of the window); ``None``: unknown window."""
        if self.context_window_tokens is None:
            return None
        return max(1, int(self.context_window_tokens * self.keep_fraction))

    @property
    def keep_messages(self) -> int | None:
        """Messages kept verbatim when the window is unknown (fallback: 6)."""
        return self.fallback_keep_messages if self.context_window_tokens is None else None

    @property
    def offload_tool_threshold_tokens(self) -> int:
        """Tool results over this are offloaded: 20,000 tokens, or a quarter of a small window.

        The window share matters for small models: at a 16k window a 6k-token result is over a
        third of the window, and two of them leave no room for anything else, although each is far
        under 20,000 tokens.
        """
        if self.context_window_tokens is None:
            return self.offload_tool_tokens
        share = int(self.context_window_tokens * self.offload_window_fraction)
        return max(1, min(self.offload_tool_tokens, share))

    @property
    def summary_estimate_tokens(self) -> int:
        """Planning estimate of a summary message: the reply budget, at most the keep budget, plus the header."""
        body = self.summary_max_tokens
        if self.keep_tokens is not None:
            body = min(body, max(256, self.keep_tokens))
        return body + SUMMARY_HEADER_TOKENS
