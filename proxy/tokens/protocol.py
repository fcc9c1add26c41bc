"""What the defenses and the projection need of a token counter, as Protocols (no tiktoken here).

``proxy.tokens.counter.TokenCounter`` (tiktoken, or its byte estimate) is a ``Tokenizer``; bound
to a codec (``Tokenizer.bind``) it is a ``MessageCounter`` (``proxy.tokens.priced.CodecCounter``);
tests may pass any object that satisfies them. Counts are tokens; a ``key`` is a memo key (a
piece's digest).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from proxy.conversation.codec import Codec
    from proxy.conversation.prefix import PrefixState

CountText = Callable[[str], int]
"""Tokens of a text (no framing)."""


class TextCounter(Protocol):
    """Counts texts: what the summary chunking and offload need."""

    def count_text(self, text: str) -> int: ...


class MessageCounter(TextCounter, Protocol):
    """Counts one codec's pieces, histories and tool schemas: what the projection works with
    (a ``Tokenizer`` bound to the codec of the pieces).

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


class Tokenizer(TextCounter, Protocol):
    """A token counter that knows no API shape (a ``proxy.conversation.codec.PartCounter`` too):
    what ``proxy.projection.project``, the planner and the tool rounds are given. ``bind(codec)``:
    the ``MessageCounter`` of that codec's pieces (the same object for the same codec)."""

    @property
    def encoding_name(self) -> str: ...

    @property
    def exact(self) -> bool: ...

    def bind(self, codec: Codec) -> MessageCounter: ...
