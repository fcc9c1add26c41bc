"""Token counting with tiktoken, memoized per message.

Counts follow OpenAI's documented accounting for chat messages (a few tokens of framing per
message plus the encoded text). INTERFACE STUB: being completed (images, fallback, tool schemas).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import orjson

TOKENS_PER_MESSAGE = 3
"""Framing tokens per message (OpenAI cookbook, 'How to count tokens with tiktoken')."""
TOKENS_PER_REPLY = 3
"""Every reply is primed with ``<|start|>assistant<|message|>``."""


class TokenCounter:
    """Counts tokens of messages, tool schemas and requests.

    ``count_message(message, key)`` is memoized by ``key`` (the message digest from
    ``proxy.chat.message_digest``), so a request costs only the messages it adds.
    """

    def __init__(self, encoding_name: str = "o200k_base", memo_size: int = 200_000) -> None:
        import tiktoken

        self._enc = tiktoken.get_encoding(encoding_name)
        self.exact = True
        self._memo: OrderedDict[str, int] = OrderedDict()
        self._memo_size = memo_size

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` (no framing)."""
        return len(self._enc.encode(text, disallowed_special=()))

    def count_message(self, message: dict[str, Any], key: str | None = None) -> int:
        """Tokens of one message including framing; memoized by ``key`` when given."""
        if key is not None:
            hit = self._memo.get(key)
            if hit is not None:
                return hit
        n = TOKENS_PER_MESSAGE
        for k, v in message.items():
            if v is None:
                continue
            if isinstance(v, str):
                n += self.count_text(v)
            else:
                n += self.count_text(orjson.dumps(v).decode())
        if key is not None:
            self._memo[key] = n
            if len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)
        return n

    def count_tools(self, tools: list[dict[str, Any]] | None) -> int:
        """Tokens of the tool schemas sent with a request."""
        if not tools:
            return 0
        return self.count_text(orjson.dumps(tools).decode())

    def count_messages(self, messages: list[dict[str, Any]], keys: list[str] | None = None) -> int:
        """Tokens of a message list plus the reply priming."""
        total = TOKENS_PER_REPLY
        for i, m in enumerate(messages):
            total += self.count_message(m, keys[i] if keys else None)
        return total
