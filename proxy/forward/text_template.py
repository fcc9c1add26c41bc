"""A stream's text events read without parsing each whole (``TextTemplate``).

Most events of a streamed reply differ from each other only in the text they carry: a chat chunk
``{"id":"chatcmpl-…","object":"chat.completion.chunk",…,"choices":[{"index":0,"delta":{"content":
"<text>"},"finish_reason":null}]}``, an Anthropic ``event: content_block_delta`` of ``{"type":
"content_block_delta","index":0,"delta":{"type":"text_delta","text":"<text>"}}``. Parsing each
whole builds every field again (about 8,000 instructions a chat chunk, callgrind; splitting it
into an event and reading the parse 8,000 more) for the one the log keeps. A template is
learned from one event parsed whole: its bytes before the text's JSON string (``head``) and
after it (``tail``). An event ``head + S + tail``, ``S`` one JSON string, parses whole to the
learned event with only its text replaced by ``S``'s (JSON is context-free: a string swapped
for another leaves every other part of the parse as it was), so only the ``S`` are parsed, all
of a chunk's in one array (``run``). What is learned is checked, not assumed: the event with a
probe string in place of the text must parse to the learned event with the probe as its text
(``learn``).

A template may have a second string slot, for a field that changes from event to event and
that the reader does not keep: OpenAI's ``obfuscation`` pad (random characters in every chunk,
by default, after the choices). Its events are ``head + S + mid + P + tail``, and both strings
are parsed in the same array (``run``); the texts are every other one.

Events that do not fit (another shape, another field that changes from event to event, text
orjson refuses, a chunk that ends inside an event) are split and parsed whole as before; the
template costs them a comparison of their first bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

PROBE = "\x00\"~"
"""The probe text (``learn``): its JSON string has escapes, which are not JSON outside a string."""
PROBE_TOKEN = orjson.dumps(PROBE)
MAX_LEARNS = 4
"""Learning tried at most this many times by one reader (chunks of text alone whose template the
probe refuses pay a probe each); a template learned is kept for the reader's life."""
_LF, _CR = 10, 13


@dataclass(slots=True)
class TextTemplate:
    """A stream's text events once learned: ``pre`` (``None`` until then) is ``data: `` and the
    bytes before the text's string, ``sep`` the bytes from the string's end to the next such
    event's string (the end of an event, then the start of the next), ``suf`` the end of one."""

    pre: bytes | None = None
    sep: bytes = b""
    suf: bytes = b""
    mid: bytes | None = None
    """With a second slot (a pad the reader does not keep): the bytes from the text's string to
    the pad's; ``None``: one slot."""
    lines: int = 2
    """LFs an event of the template has: its blank line's, and ``event: NAME``'s when it has one."""
    frame: int = 8
    """Bytes of an event that are not its data (``data: ``, the blank line, the name's line)."""
    learns: int = MAX_LEARNS

    def run(self, chunk: bytes) -> tuple[list[str], int] | None:
        """The texts of the events that open ``chunk`` (bytes of an SSE stream from an event's
        start, no CR) and fit the template, and the bytes those events take (to their blank
        line); ``None`` when the first does not fit or ``chunk`` ends inside them. Their strings
        are parsed in one array, ``[S1,<LF>S2,<LF>…]``: an LF is not JSON inside a string, so
        each comma put there is outside one, and the array has as many elements, all strings,
        as the events only if each event held exactly one string (and blanks); the LFs of the
        events are those of their frames alone (each event's data is one line, as SSE reads it).
        With ``mid`` (two slots), each event's bytes between ``pre`` and ``suf`` are cut at the
        first ``mid`` into its two strings, both in the array (two elements an event: a cut
        elsewhere leaves a piece that is not one JSON string, and the array fails or counts
        otherwise); the texts are the first of each pair."""
        pre = self.pre
        if pre is None or not chunk.startswith(pre):
            return None
        suf = self.suf
        pieces = chunk[len(pre):].split(self.sep)
        last = pieces[-1]
        end = last.find(suf)
        if end < 0:
            return None
        pieces[-1] = last[:end]
        size = len(chunk) - len(last) + end + len(suf)
        count = len(pieces)
        if chunk.count(b"\n", 0, size) != self.lines * count:
            return None
        mid = self.mid
        if mid is not None:
            cut: list[bytes] = []
            for piece in pieces:
                at = piece.find(mid)
                if at < 0:
                    return None
                cut += (piece[:at], piece[at + len(mid):])
            pieces = cut
        try:
            texts = orjson.loads(b"[" + b",\n".join(pieces) + b"]")
        except orjson.JSONDecodeError:
            return None
        if len(texts) != len(pieces):
            return None
        for text in texts:
            if type(text) is not str:
                return None
        return (texts if mid is None else texts[::2]), size

    def learn(self, data: bytes, key: bytes, text: str, probed: Callable[[Any], bool], name: bytes = b"",
              pad: bytes = b"") -> bool:
        """Learn the template of ``data`` (a one-line event's data, which ``orjson.loads`` read;
        ``name``: the event's ``event:`` name, if it has one), whose text ``text`` is the value of
        the last ``key`` member in it (``b'"content"'``); ``pad``: a key whose string value, the
        last such member after the text's, is a second slot (``mid``). True when learned: only if
        ``data`` with a probe string in place of that value (and of the pad's) parses to what
        ``probed`` accepts (called with that parse; true when it is the event's own parse with
        ``PROBE`` in place of ``text`` and of the pad, and may change it)."""
        if self.learns <= 0 or text == PROBE or _LF in data or _CR in data or _LF in name or _CR in name:
            return False
        self.learns -= 1
        at = data.rfind(key)
        found = _STRING_VALUE.match(data, at + len(key)) if at >= 0 else None
        if found is None:
            return False
        head, tail = data[:found.start(1)], data[found.end(1):]
        mid: bytes | None = None
        if pad:
            at = tail.rfind(pad)
            padded = _STRING_VALUE.match(tail, at + len(pad)) if at >= 0 else None
            if padded is None:
                return False
            mid, tail = tail[:padded.start(1)], tail[padded.end(1):]
        try:
            probe = head + PROBE_TOKEN + tail if mid is None else head + PROBE_TOKEN + mid + PROBE_TOKEN + tail
            if not probed(orjson.loads(probe)):
                return False
        except (orjson.JSONDecodeError, RecursionError):  # (``probed``'s ``==`` of an event nested deeper
            return False  # than Python recurses, which orjson reads: up to 1,024 levels)
        start = b"event: " + name + b"\ndata: " if name else b"data: "
        self.pre, self.sep, self.suf = start + head, tail + b"\n\n" + start + head, tail + b"\n\n"
        self.mid = mid
        self.lines, self.frame = (3, len(start) + 2) if name else (2, 8)
        return True


def learn_chat(template: TextTemplate, data: bytes, chunk: dict[str, Any]) -> bool:
    """``template.learn`` of a chat chunk's ``data`` (read as ``chunk``) if it carries text alone
    (``_text_alone``): its text, ``choices[0].delta.content``, and, when the chunk has a string
    ``obfuscation`` (OpenAI's pad, which the reply does not keep), that as a second slot; True
    when learned."""
    text = _text_alone(chunk)
    if text is None:
        return False
    pad = chunk.get("obfuscation")
    padded = type(pad) is str
    if pad == PROBE:  # (as ``learn`` refuses that text: the probe would not show where the pad is)
        return False

    def probed(parsed: Any) -> bool:  # (``chunk`` with the probe for its text and pad: put them back, compare)
        try:
            delta = parsed["choices"][0]["delta"]
            if delta["content"] != PROBE:
                return False
            delta["content"] = text
            if padded:
                if parsed["obfuscation"] != PROBE:
                    return False
                parsed["obfuscation"] = pad
        except (KeyError, IndexError, TypeError):
            return False
        return bool(parsed == chunk)

    return template.learn(data, b'"content"', text, probed, pad=b'"obfuscation"' if padded else b"")


def _text_alone(chunk: dict[str, Any]) -> str | None:
    """The text of a chat chunk that carries text alone (no usage; one choice, of index 0, with no
    finish reason, whose delta is ``{"content": <str>}``), else ``None``: what
    ``ReplyAssembler._add_chunks`` takes of such a chunk is its text and nothing else."""
    choices = chunk.get("choices")
    if chunk.get("usage") or type(choices) is not list or len(choices) != 1:
        return None
    choice = choices[0]
    if type(choice) is not dict or choice.get("index", 0) != 0 or choice.get("finish_reason"):
        return None
    delta = choice.get("delta")
    if type(delta) is not dict or len(delta) != 1:
        return None
    text = delta.get("content")
    return text if type(text) is str else None


_STRING_VALUE = re.compile(rb'[ \t\r\n]*:[ \t\r\n]*("(?:[^"\\]|\\.)*")', re.DOTALL)
"""A member's value that is a string, from the end of its key (group 1: the string)."""
