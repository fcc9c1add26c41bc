"""The contract of a codec: one per API, between its native request body and the neutral model.

A codec parses a native request into a ``proxy.conversation.model.Conversation`` (its pieces are the
native pieces themselves, never copies) and applies the projection's result back onto the native
body. The contract (``tests/conversation/test_codec_contract.py`` checks it for each codec):

- ``parse(body, raw, digests, chain)``: ``body`` is the parsed JSON object (already checked by the
  route), ``raw`` its bytes as received, ``digests``/``chain`` one per piece (from
  ``pieces(body)`` and ``proxy.conversation.canonical``). Pure; raises nothing for a body the
  route accepted (what the codec does not understand becomes ``OPAQUE`` items and ``OTHER``/
  ``OPAQUE`` parts, forwarded as they came).
- ``apply(conversation, pieces, extra)``: the bytes to forward and the body they encode (``None``
  when the bytes are the client's). When ``pieces`` equal the body's own and ``extra`` is empty,
  the client's ``raw`` bytes, untouched; otherwise the body with only the pieces' place replaced
  (and the ``extra`` top-level fields set): every other field, unknown ones included, keeps its
  value and its place in the key order.
- ``item(piece)``: the ``Item`` of one piece (a pure function of the piece: items are kept across
  requests by chain hash); ``parts(piece, counter)``: its parts with token costs;
  ``answer(call_id, text)``: a native piece answering a dangling call (for codecs whose answers are
  items of their own); ``insert_answers(pieces, found, text)``: the pieces with those answers in
  place (``found`` from ``proxy.defenses.pairs.dangling_calls``).

Adding an API: write its codec (parse, item, parts, apply), register nothing else: the defenses
and the projection read only ``Item``/``Part`` and the pieces' token counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from proxy.conversation.model import Conversation, Item, Part, Piece


class PartCounter(Protocol):
    """What a codec needs of a token counter to price parts (``proxy.tokens.counter.TokenCounter``)."""

    def count_text(self, text: str) -> int: ...

    def count_part(self, part: object) -> int: ...

    def count_tool_call(self, call: object) -> int: ...


class Codec(Protocol):
    """One API's codec (see the module docstring for the contract)."""

    name: str

    def pieces(self, body: Mapping[str, Any]) -> list[Piece]: ...

    def parse(self, body: dict[str, Any], raw: bytes, digests: list[str], chain: list[str]) -> Conversation: ...

    def item(self, piece: Piece) -> Item: ...

    def items(self, pieces: Sequence[Piece]) -> list[Item]: ...

    def parts(self, piece: Piece, counter: PartCounter) -> list[Part]: ...

    def insert_answers(self, pieces: list[Piece], found: list[tuple[int, list[str]]],
                       text: str) -> list[Piece]: ...

    def apply(self, conversation: Conversation, pieces: list[Piece],
              extra: Mapping[str, Any] | None = None) -> tuple[bytes, dict[str, Any] | None]: ...
