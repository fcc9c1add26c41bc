"""What the defenses and the projection need of a token counter, as Protocols (no tiktoken here).

``proxy.tokens.counter.TokenCounter`` (tiktoken, or its byte estimate) satisfies both; tests may
pass any object that does. Counts are tokens; a ``key`` is a memo key (a message digest).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from proxy.conversation.prefix import PrefixState

CountText = Callable[[str], int]
"""Tokens of a text (no framing)."""


class TextCounter(Protocol):
    """Counts texts: what the summary chunking and offload need."""

    def count_text(self, text: str) -> int: ...


class MessageCounter(TextCounter, Protocol):
    """Counts messages, histories and tool schemas: what ``proxy.projection.project`` needs.

    ``encoding_name``/``exact`` name the tokenizer (part of the projection's memo keys: another
    tokenizer counts, and offloads, differently); ``memo_key``: the key its per-message counts
    are kept under in a ``PrefixState``."""

    @property
    def encoding_name(self) -> str: ...

    @property
    def exact(self) -> bool: ...

    @property
    def memo_key(self) -> Hashable: ...

    def count_message(self, message: dict[str, Any], key: str | None = None) -> int: ...

    def count_history(self, messages: Sequence[dict[str, Any]], digests: Sequence[str], chain: Sequence[str],
                      state: PrefixState | None = None) -> list[int]: ...

    def count_tools(self, tools: list[dict[str, Any]] | None) -> int: ...
