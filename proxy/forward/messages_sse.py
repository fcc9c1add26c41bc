"""The reply of an Anthropic Messages stream, reassembled from its events for the log.

The relay sends the upstream's bytes unchanged; this only observes them (events split by
``proxy.forward.sse.SSESplitter``). The events, as Anthropic's streaming docs give them:
``message_start`` (the Message with empty ``content`` and its first ``usage``),
``content_block_start`` (``index``, ``content_block``), ``content_block_delta`` (``text_delta``
``text``, ``input_json_delta`` ``partial_json``, ``thinking_delta`` ``thinking``,
``signature_delta`` ``signature`` (replacing, as the SDK does), ``citations_delta`` ``citation``),
``content_block_stop``, ``message_delta`` (``delta.stop_reason``/``stop_sequence``, cumulative ``usage``),
``message_stop``, ``ping``, and ``error`` (``{"type": "error", "error": {...}}``). Unknown events
and delta types are ignored (the relay still carries them).

Bounded: at most ``max_bytes`` bytes of event data are reassembled into content; past that the
content stops where it was (``truncated``: the reply is logged as far as it fits, marked so), while
the stop reason, usage and end of the message are still read.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.forward.sse import SSEEvent, SSESplitter
from proxy.forward.text_template import PROBE, TextTemplate
from proxy.json_text import parse_json

_DELTA_FIELDS = {"text_delta": ("text", "text"), "thinking_delta": ("thinking", "thinking")}
"""Delta type -> (the delta's field, the block's field it appends to)."""
_CONTENT_EVENTS = frozenset({"content_block_start", "content_block_delta"})
"""What grows the reassembled reply (bounded by ``max_bytes``)."""
_CR = 13
_DELTA = b"event: content_block_delta\n"
"""How a named delta opens (the template is learned from one: ``add_data``)."""


class MessagesAssembler:
    """Feed it a stream's events (``add``); ``message()`` is the reply as logged:
    ``{"role": "assistant", "content": [blocks]}`` (a ``tool_use`` block's ``input`` parsed from its
    ``partial_json`` pieces; pieces that do not parse are kept as ``input_json`` text).
    ``usage``: ``message_start``'s usage with ``message_delta``'s figures on top (the upstream's,
    unchanged); ``stop_reason``; ``done`` once ``message_stop`` came; ``upstream_error``: an
    ``error`` event came."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.seen_bytes = 0
        self.truncated = False
        self.blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self._text: dict[Any, tuple[dict[str, Any], str, list[str]]] = {}
        """Text or thinking deltas by block index: (the block, its field, the pieces: the field's value
        before the first delta, then the deltas), joined into the field by ``message()``, not at
        each delta (a string grown by ``+`` a delta at a time is copied whole each time: quadratic)."""
        self.template = TextTemplate()
        """The stream's text deltas (``proxy.forward.text_template``): learned from a named
        ``content_block_delta`` of text or thinking, then such events read by it (``add_data``)."""
        self._slot: tuple[Any, str] = (0, "")
        """The block index and field the template's deltas add to."""
        self.usage: dict[str, Any] | None = None
        self.stop_reason: str | None = None
        self.done = False
        self.upstream_error = False

    @property
    def empty(self) -> bool:
        return not self.blocks

    def add(self, event: SSEEvent, learn: bool = False) -> None:
        """Take one event in (never raises: what it cannot read is skipped). Past ``max_bytes`` of
        event data the content stops growing (``truncated``); the message's own events
        (``message_delta``, ``message_stop``, ``error``) are still read. ``learn``: ``template``
        may be learned from it (``add_events``)."""
        raw = event.data
        self.seen_bytes += len(raw)
        if self.seen_bytes > self.max_bytes and event.event in _CONTENT_EVENTS:
            self.truncated = True
            return
        if len(raw) > self.max_bytes:
            return
        try:  # (orjson directly, ``parse_json`` only for what it refuses: ``_loads``)
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = _loads(raw)
        if not isinstance(data, dict):
            return
        kind = event.event or data.get("type")
        if kind == "content_block_delta":  # (most events: checked first)
            if self.seen_bytes > self.max_bytes:  # (an event without its name)
                self.truncated = True
            elif isinstance(delta := data.get("delta"), dict):
                index = data.get("index")
                block = self.blocks.get(index) if isinstance(index, int) else None
                if block is None:
                    return
                kind = delta.get("type")
                if isinstance(kind, str) and kind in _DELTA_FIELDS:  # (text and thinking: most deltas; no call)
                    source, target = _DELTA_FIELDS[kind]
                    piece = delta.get(source)
                    if isinstance(piece, str):
                        text = self._text.get(index)
                        if text is not None and text[0] is block and text[1] == target:
                            text[2].append(piece)
                        else:
                            self._open_text(index, block, target, piece)
                        if learn and self.template.pre is None and self.template.learns \
                                and event.event == "content_block_delta":
                            self._learn(raw, data, index, source, target, piece)
                else:
                    self._other_delta(index, block, kind, delta)
        elif kind == "content_block_start" and self.seen_bytes > self.max_bytes:
            self.truncated = True
        elif kind == "error":
            self.upstream_error = True
        elif kind == "message_start" and isinstance(data.get("message"), dict):
            usage = data["message"].get("usage")
            if isinstance(usage, dict):
                self.usage = dict(usage)
        elif kind == "content_block_start" and isinstance(data.get("index"), int) \
                and isinstance(data.get("content_block"), dict):
            self.blocks[data["index"]] = dict(data["content_block"])
        elif kind == "content_block_stop" and isinstance(data.get("index"), int):
            self._stop(data["index"])
        elif kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                self.stop_reason = delta["stop_reason"]
            if isinstance(data.get("usage"), dict):
                self.usage = {**(self.usage or {}), **{k: v for k, v in data["usage"].items() if v is not None}}
        elif kind == "message_stop":
            self.done = True

    def add_data(self, splitter: SSESplitter, data: bytes) -> None:
        """``add`` of each event of ``splitter.feed(data)``: ``data`` the stream's next bytes. When
        the splitter holds nothing and ``data`` opens with deltas that fit ``template`` (to the
        block open at its index), those are read by it (``TextTemplate.run``: their pieces, as
        ``add`` of each would take them) and only the rest is split. A template not learned yet
        may be learned from ``data``'s first event when another delta follows it (a held start's
        ``tail``: the first block's deltas, the others then read by it): it is split and read
        alone first."""
        template = self.template
        if template.pre is None and template.learns and data.startswith(_DELTA) and splitter.idle \
                and _CR not in data:
            end = data.find(b"\n\n") + 2
            if 1 < end < len(data) and data.startswith(_DELTA, end):
                self.add_events(splitter.feed(data[:end]))  # (``add_events`` learns from its last event)
                data = data[end:]
        if template.pre is not None and splitter.idle and _CR not in data:
            run = template.run(data)
            if run is not None:
                pieces, size = run
                index, target = self._slot
                block = self.blocks.get(index)
                seen = self.seen_bytes + size - template.frame * len(pieces)
                if block is not None and seen <= self.max_bytes:
                    self.seen_bytes = seen
                    text = self._text.get(index)
                    if text is not None and text[0] is block and text[1] == target:
                        text[2].extend(pieces)
                    else:
                        self._open_text(index, block, target, pieces[0])
                        self._text[index][2].extend(pieces[1:])
                    if size == len(data):
                        return
                    data = data[size:]
        self.add_events(splitter.feed(data))

    def add_events(self, events: list[SSEEvent]) -> None:
        """``add`` of each event; ``template`` may be learned from the last (a text delta that ends
        what came so far is followed by more, most likely: one that other events follow, less)."""
        if events:
            add = self.add
            for event in events[:-1]:
                add(event)
            add(events[-1], True)

    def _learn(self, raw: bytes, data: dict[str, Any], index: Any, source: str, target: str, piece: str) -> None:
        """Learn ``template`` from a named ``content_block_delta`` (``raw``, read as ``data``) whose
        delta's ``source`` field, ``piece``, was added to the block at ``index``."""
        def probed(parsed: Any) -> bool:  # (``data`` with the probe for its piece: put the piece back, compare)
            try:
                delta = parsed["delta"]
                if delta[source] != PROBE:
                    return False
                delta[source] = piece
            except (KeyError, TypeError):
                return False
            return bool(parsed == data)

        if self.template.learn(raw, b'"' + source.encode() + b'"', piece, probed, b"content_block_delta"):
            self._slot = (index, target)

    def _other_delta(self, index: Any, block: dict[str, Any], kind: Any, delta: dict[str, Any]) -> None:
        """A delta that is not text or thinking, of ``block`` (the open block at ``index``)."""
        if kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            self._json.setdefault(index, []).append(delta["partial_json"])
        elif kind == "signature_delta" and isinstance(delta.get("signature"), str):
            block["signature"] = delta["signature"]  # (the SDK replaces it, as the block's one signature)
        elif kind == "citations_delta" and isinstance(delta.get("citation"), dict):
            citations = block.get("citations")
            block["citations"] = [*(citations if isinstance(citations, list) else []), delta["citation"]]

    def _open_text(self, index: Any, block: dict[str, Any], target: str, piece: str) -> None:
        """Start the pieces of ``block[target]`` (``index``'s block): its value so far (a string, else
        none), then ``piece``. The field is set now, so it keeps the place in the block a first
        delta gives it; the pieces open at ``index`` before (another field, or a block replaced
        by a new ``content_block_start``) are joined into their block first."""
        self._join(index)
        before = block.get(target)
        before = before if isinstance(before, str) else ""
        block[target] = before
        self._text[index] = (block, target, [before, piece])

    def _join(self, index: Any) -> None:
        """Join the pieces open at ``index`` into their block's field (they stay open, as one piece)."""
        text = self._text.get(index)
        if text is not None:
            block, target, pieces = text
            joined = "".join(pieces)
            pieces[:] = (joined,)
            block[target] = joined

    def _stop(self, index: int) -> None:
        pieces = self._json.pop(index, None)
        block = self.blocks.get(index)
        if pieces is None or block is None:
            return
        text = "".join(pieces)
        parsed = _loads(text) if text else {}
        if isinstance(parsed, dict):
            block["input"] = parsed
        else:
            block["input_json"] = text

    def message(self) -> dict[str, Any]:
        """The reply so far, blocks in index order (a block still open included as it stands)."""
        for index in list(self._json):
            self._stop(index)
        for index in self._text:
            self._join(index)
        return {"role": "assistant", "content": [self.blocks[i] for i in sorted(self.blocks)]}


def _loads(data: bytes | str) -> Any:
    """``parse_json(data)``, or ``None`` for what is not JSON."""
    if not data:
        return None
    try:
        return parse_json(data)
    except ValueError:
        return None
