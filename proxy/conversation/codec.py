"""The contract of a codec: one per API, between its native request body and the neutral model.

A codec parses a native request into a ``proxy.conversation.model.Conversation`` (its pieces are the
native pieces themselves, never copies) and applies the projection's result back onto the native
body. The contract (``tests/conversation/test_codec_contract.py`` checks it for each codec):

- ``parse(body, raw, digests, chain)``: ``body`` is the parsed JSON object (already checked by the
  route), ``raw`` its bytes as received, ``digests``/``chain`` one per piece (from
  ``pieces(body)`` and ``proxy.conversation.canonical``). Pure; raises nothing for a body the
  route accepted (what the codec does not understand becomes ``OPAQUE`` items and ``OTHER``/
  ``OPAQUE`` parts, forwarded as they came).
- ``apply(body, raw, pieces, extra)``: the bytes to forward and the body they encode (``None``
  when the bytes are the client's). ``body``/``raw``: the parsed request and its bytes as
  received (a ``Conversation``'s). When ``pieces`` equal ``pieces(body)`` and ``extra`` is empty,
  the client's ``raw`` bytes, untouched; otherwise the body with only the pieces' place replaced
  (and the ``extra`` top-level fields set): every other field, unknown ones included, keeps its
  value and its place in the key order.
- ``item(piece)``: the ``Item`` of one piece (a pure function of the piece: items are kept across
  requests by chain hash); ``parts(piece, counter)``: its parts with token costs (priced through
  ``counter``, a ``PartCounter``: the counter knows no API shape, the codec says what a part is
  made of); ``price(piece, counter)``: the piece's whole cost, framing included (its parts, its
  message/name/tool-call frames, the fields no part holds); ``tool_schemas(tools)``: what each
  tool schema of a request is made of (JSON values the counter prices);
  ``answer(call_id, text)``: a native piece answering a dangling call (for codecs whose answers are
  items of their own); ``insert_answers(pieces, found, text)``: the pieces with those answers in
  place (``found`` from ``proxy.defenses.pairs.dangling_calls``).
- Reading and rewriting parts (what the part rewriters of ``proxy.defenses`` use, so they never
  read a native key): ``part_text(part)`` (the text of a ``TEXT``/``TOOL_RESULT`` part a defense
  may replace, else ``None``), ``with_text(part, text)``; ``tool_call(part)`` (a ``TOOL_CALL``
  part's ``ToolCall``: name and arguments, else ``None``), ``with_arguments(part, arguments)``;
  ``inline_media(part)`` (``(data_url, media_type)`` of inline media, else ``None``);
  ``inner_media(part)`` (``(index, data_url, media_type)`` of the inline media inside a part:
  Messages' images in a ``tool_result``'s blocks), ``with_inner(part, new)`` (the part with those
  inner elements replaced);
  ``text_part(text)`` (a new text part in the API's shape); ``with_parts(piece, new)`` (the piece
  with the parts at the indices of ``new``, indices into ``parts(piece, ...)``, replaced by those
  native parts: every other key keeps its value and place; ``piece`` itself when ``new`` is
  empty). Pure; a ``with_*`` given a part its reader gives ``None`` for raises ``ValueError``.
- The summary transcript (``proxy.defenses.summarize``): ``render_part(piece, part)`` (how a part
  of ``piece`` reads, ``None``: not shown), ``transcript_frame(piece)`` (the header words after
  ``### ``, and the lines for what no part shows: fields the codec does not know included, so the
  summarizer sees what the provider saw), ``text_piece(piece, text)`` (a stand-in for an
  oversized piece: its header, ``text`` as its whole content); ``user_text(piece)`` (the text of a
  user turn a summary pins: its text parts joined by newlines, ``""`` for none).
- Signed content: ``binds_prefix`` (see ``Codec``); ``unsigned(piece)`` (the piece without the
  parts a provider signed against the conversation before them, Messages ``thinking``/
  ``redacted_thinking``: what a turn whose prefix the proxy changed after it was made is
  forwarded as; ``None`` when it holds none).

Adding an API: write its codec (parse, item, parts, the part accessors, apply), register nothing
else: the defenses and the projection read only ``Item``/``Part``, the accessors and the pieces'
token counts (``price``, through a counter bound to the codec: ``proxy.tokens.priced``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from proxy.conversation.model import Conversation, Item, Part, Piece


class ToolCall(NamedTuple):
    """A tool call as a defense reads it: ``name`` (as sent: a string, or any JSON value for a
    malformed call) and ``arguments``: a JSON text (``str``: chat ``function.arguments``, Responses
    ``arguments``) or a JSON value (Messages ``tool_use.input``)."""

    name: object
    arguments: object


class PartCounter(Protocol):
    """What a codec needs of a token counter to price what a piece is made of (tokens; no API
    shape: ``proxy.tokens.counter.TokenCounter``). ``count_frame``: the framing of ``messages``
    messages, ``names`` names and ``tool_calls`` tool calls. ``count_image_url``: an image by URL
    (a ``data:`` URL is sized; ``detail`` as sent); ``count_image_data``: an inline base64 image
    priced the Anthropic way (``None``: unknown size); ``count_audio``: base64 audio of a format;
    ``count_file_data``: a base64 file (``data_url``: given as a ``data:`` URL; ``None``: unknown)."""

    def count_text(self, text: str) -> int: ...

    def count_json(self, value: object) -> int: ...

    def count_frame(self, *, messages: int = 0, names: int = 0, tool_calls: int = 0) -> int: ...

    def count_image_url(self, url: str, detail: object) -> int: ...

    def count_image_data(self, data: str | None) -> int: ...

    def count_audio(self, data: str, audio_format: str) -> int: ...

    def count_file_data(self, data: str | None, *, data_url: bool = False) -> int: ...


class Uncounted:
    """A ``PartCounter`` that prices nothing (every cost 0): for reading parts without counting
    them (a rewrite decides by kind, text and call, not by a part's cost). Stateless."""

    def count_text(self, text: str) -> int:
        return 0

    def count_json(self, value: object) -> int:
        return 0

    def count_frame(self, *, messages: int = 0, names: int = 0, tool_calls: int = 0) -> int:
        return 0

    def count_image_url(self, url: str, detail: object) -> int:
        return 0

    def count_image_data(self, data: str | None) -> int:
        return 0

    def count_audio(self, data: str, audio_format: str) -> int:
        return 0

    def count_file_data(self, data: str | None, *, data_url: bool = False) -> int:
        return 0


UNCOUNTED = Uncounted()
"""The one ``Uncounted`` (stateless)."""


class Codec(Protocol):
    """One API's codec (see the module docstring for the contract)."""

    name: str
    binds_prefix: bool
    """A sealed item's signed content is bound to the conversation before it (Messages thinking:
    ``True``; Responses reasoning is bound to its own item only): rewrites before a tool cycle's
    signed turns wait for the cycle's end (``proxy.projection.signed_cycle``)."""

    def pieces(self, body: Mapping[str, Any]) -> list[Piece]: ...

    def parse(self, body: dict[str, Any], raw: bytes, digests: list[str], chain: list[str]) -> Conversation: ...

    def item(self, piece: Piece) -> Item: ...

    def items(self, pieces: Sequence[Piece]) -> list[Item]: ...

    def parts(self, piece: Piece, counter: PartCounter) -> list[Part]: ...

    def price(self, piece: Piece, counter: PartCounter) -> int: ...

    def tool_schemas(self, tools: list[Any]) -> list[object]: ...

    def part_text(self, part: Part) -> str | None: ...

    def with_text(self, part: Part, text: str) -> object: ...

    def tool_call(self, part: Part) -> ToolCall | None: ...

    def with_arguments(self, part: Part, arguments: object) -> object: ...

    def inline_media(self, part: Part) -> tuple[str, str] | None: ...

    def inner_media(self, part: Part) -> list[tuple[int, str, str]]: ...

    def with_inner(self, part: Part, new: Mapping[int, object]) -> object: ...

    def text_part(self, text: str) -> object: ...

    def with_parts(self, piece: Piece, new: Mapping[int, object]) -> Piece: ...

    def render_part(self, piece: Piece, part: Part) -> str | None: ...

    def transcript_frame(self, piece: Piece) -> tuple[str, list[str]]: ...

    def text_piece(self, piece: Piece, text: str) -> Piece: ...

    def user_text(self, piece: Piece) -> str: ...

    def unsigned(self, piece: Piece) -> Piece | None: ...

    def insert_answers(self, pieces: list[Piece], found: list[tuple[int, list[str]]],
                       text: str) -> list[Piece]: ...

    def apply(self, body: Mapping[str, Any], raw: bytes, pieces: list[Piece],
              extra: Mapping[str, Any] | None = None) -> tuple[bytes, dict[str, Any] | None]: ...
