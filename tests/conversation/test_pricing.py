"""The codecs say what a piece is made of; the counter prices it knowing no API shape (issue 18 item 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from proxy.conversation.chat_codec import CHAT, ChatCodec
from proxy.conversation.codec import PartCounter
from proxy.conversation.messages_codec import MESSAGES
from proxy.conversation.model import Piece
from proxy.conversation.pricing import price_message, price_part, tool_schemas
from proxy.tokens.counter import TokenCounter


class Ruler:
    """A ``PartCounter`` whose prices show what was priced: a text costs its length, JSON its
    text's length, a message frame 1000, a name 100, a tool call 10, any media 7."""

    def count_text(self, text: str) -> int:
        return len(text)

    def count_json(self, value: object) -> int:
        return len(orjson.dumps(value))

    def count_frame(self, *, messages: int = 0, names: int = 0, tool_calls: int = 0) -> int:
        return 1000 * messages + 100 * names + 10 * tool_calls

    def count_image_url(self, url: str, detail: object) -> int:
        return 7

    def count_image_data(self, data: str | None) -> int:
        return 7

    def count_audio(self, data: str, audio_format: str) -> int:
        return 7

    def count_file_data(self, data: str | None, *, data_url: bool = False) -> int:
        return 7


RULER = Ruler()


def test_a_chat_message_is_its_frames_texts_and_json() -> None:
    message = {"role": "assistant", "name": "al", "content": [{"type": "text", "text": "hi"},
                                                                {"type": "image_url", "image_url": {"url": "u"}}],
               "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
               "extra": {"k": 1}}
    expected = 1000 + len("assistant") + len("al") + 100 + 2 + 7 + 10 + len("f") + 2 + len('{"k":1}')
    assert CHAT.price(message, RULER) == price_message(message, RULER) == expected
    parts = CHAT.parts(message, RULER)
    assert [p.tokens for p in parts] == [2, 7, 10 + 1 + 2]
    # the parts and the fields no part holds (role, name, unknown fields) make the price
    assert sum(p.tokens for p in parts) + 1000 + 9 + 2 + 100 + 7 == CHAT.price(message, RULER)


def test_anthropic_blocks_are_frames_and_texts() -> None:
    use = {"type": "tool_use", "id": "t", "name": "get", "input": {"a": 1}}
    result = {"type": "tool_result", "tool_use_id": "t", "content": "out"}
    assert price_part(use, RULER) == 10 + 3 + len('{"a":1}')
    assert price_part(result, RULER) == 10 + 3
    assert price_part({"type": "image", "source": {"type": "url", "url": "u"}}, RULER) == 7
    assert price_part({"type": "document", "source": {"type": "text", "data": "doc"}}, RULER) == 3
    piece = {"role": "user", "content": [result]}
    assert MESSAGES.price(piece, RULER) == 1000 + 4 + 13 == sum(p.tokens for p in MESSAGES.parts(piece, RULER)) + 1004


def test_a_thinking_block_with_only_a_signature_is_counted_by_it() -> None:
    """Claude Code's adaptive thinking sends blocks with empty text and a signature that carries the
    thinking: counted by the signature (its decoded bytes at 4 a token), not as nothing."""
    signature = "A" * 4000  # 3,000 bytes decoded
    assert price_part({"type": "thinking", "thinking": "", "signature": signature}, RULER) == 750
    assert price_part({"type": "thinking", "thinking": "I see.", "signature": signature}, RULER) == len("I see.")
    piece = {"role": "assistant", "content": [{"type": "thinking", "thinking": "", "signature": signature},
                                              {"type": "text", "text": "ok"}]}
    assert MESSAGES.item(piece).sealed  # kept whole, never rewritten


def test_tool_schemas_are_what_the_codec_says() -> None:
    tools: list[Any] = [{"type": "function", "function": {"name": "f", "parameters": {}, "strict": True}},
                        {"type": "web_search"}]
    assert tool_schemas(tools) == [{"name": "f", "parameters": {}}, {"type": "web_search"}]


def test_the_counter_source_names_no_api_field() -> None:
    root = Path(__file__).resolve().parents[2] / "proxy" / "tokens"
    for name in ("counter.py", "priced.py", "media.py", "protocol.py"):
        text = (root / name).read_text()
        for key in ('"role"', '"content"', '"tool_calls"', '"function"', '"image_url"', '"type"', '"name"'):
            assert key not in text, (name, key)
    assert not hasattr(TokenCounter, "count_message") and not hasattr(TokenCounter, "count_part")


class _Doubled(ChatCodec):
    """Another API whose pieces cost twice a chat message's."""

    name = "doubled"

    def price(self, piece: Piece, counter: PartCounter) -> int:
        return 2 * price_message(piece, counter)


def test_a_bound_counter_keeps_its_codecs_counts_apart() -> None:
    counter = TokenCounter("o200k_base")
    chat, doubled = counter.bind(CHAT), counter.bind(_Doubled())
    assert counter.bind(CHAT) is chat and chat.memo_key != doubled.memo_key
    message = {"role": "user", "content": "hello there"}
    one = chat.count_message(message, "d1")
    assert doubled.count_message(message, "d1") == 2 * one  # the same digest, not the chat count
    hits = counter.memo_hits
    assert chat.count_message(message, "d1") == one and counter.memo_hits == hits + 1
