"""Defense 2: offload large content to artifacts, leaving a stub with a reference and a preview.

DESIGN.md section 2: a tool result over ``offload_tool_tokens`` (20,000, or a quarter of a small
window, see ``DefenseConfig.offload_tool_threshold_tokens``) and a user message over
``offload_user_tokens`` (50,000) become a stub naming the artifact id and read URL
(``/artifacts/{id}``), how to read it in parts, its size, and a preview of the first and last 5
lines, each cut at 1,000 chars, with a ``... [N lines truncated] ...`` marker; with the read
tool offered, a sentence saying to search the artifact with its ``query`` before paging.

Offload is applied as soon as a message is first seen and is a pure function of its content, so
the same message always shows the same stub (prefix stability) and needs no event. A ``tool``
message stays a ``tool`` message with its ``tool_call_id`` (case 020); a content list is measured
and offloaded part by part and keeps its shape (a text part becomes a text part holding the stub;
an Anthropic ``tool_result`` block keeps its type and ``tool_use_id``). Artifact ids are
content-addressed: ``art_`` + the first 32 hex digits of the SHA-256 of the UTF-8 content.

The defense reads no native key: it decides over the codec's parts (kind, text) and its items'
kinds, and rewrites through the codec (chat strings and parts, Messages ``tool_result`` blocks,
Responses ``function_call_output`` items alike).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from proxy.conversation.codec import UNCOUNTED, Codec
from proxy.conversation.model import RESULTS, TEXT, TOOL, TOOL_RESULT, USER, Item, Piece
from proxy.defenses.config import DefenseConfig
from proxy.defenses.hints import search_hint
from proxy.tokens.protocol import CountText

__all__ = ["ArtifactToStore", "artifact_id", "offload_message", "preview", "stub_text"]


@dataclass(frozen=True, slots=True)
class ArtifactToStore:
    """Content the pipeline must store before forwarding a reference to it.

    ``content`` is text (for media: the ``data:`` URL as sent); ``media_type`` is a MIME type.
    ``source``: the chain hash of the request's message it was offloaded from, set by the
    projection, which knows where each message sits (``None`` from the defenses, which do not).
    """

    id: str
    content: str
    media_type: str
    source: str | None = None


def artifact_id(content: str) -> str:
    """Content-addressed artifact id: ``"art_" + sha256(content utf-8)[:32]``."""
    return "art_" + hashlib.sha256(content.encode("utf-8")).hexdigest()[:32]


def preview(text: str, head_lines: int, line_chars: int) -> str:
    """First and last ``head_lines`` lines of ``text``, each cut at ``line_chars`` chars.

    Between them a ``... [N lines truncated] ...`` line when lines were left out.
    """
    lines = text.split("\n")

    def cut(line: str) -> str:
        if len(line) <= line_chars:
            return line
        return line[:line_chars] + f"... [{len(line) - line_chars} chars truncated]"

    if len(lines) <= 2 * head_lines:
        return "\n".join(cut(line) for line in lines)
    hidden = len(lines) - 2 * head_lines
    shown = [cut(line) for line in lines[:head_lines]]
    shown.append(f"... [{hidden} lines truncated] ...")
    shown.extend(cut(line) for line in lines[-head_lines:])
    return "\n".join(shown)


def stub_text(art_id: str, text: str, what: str, config: DefenseConfig) -> str:
    """The stub that replaces offloaded ``text`` (``what``: e.g. "tool result", "user message")."""
    line_count = text.count("\n") + 1
    tool_hint = f" or call the `{config.read_tool_name}` tool with this id" if config.read_tool_name else ""
    search = search_hint(config.read_tool_name, art_id) + "\n" if config.read_tool_name else ""
    return (
        f"[context-proxy] This {what} was too large for the context window and was offloaded "
        f"({line_count} lines, {len(text)} chars) to artifact {art_id}.\n"
        f"Read the full content at /artifacts/{art_id}{tool_hint}; read it in parts with "
        f"/artifacts/{art_id}?offset=LINE&limit=LINES (offset = first line, counted from 0).\n"
        + search +
        f"Preview (first {config.preview_lines} and last {config.preview_lines} lines):\n"
        + preview(text, config.preview_lines, config.preview_line_chars)
    )


def _offload_text(
    text: str, what: str, config: DefenseConfig, unavailable: frozenset[str], out: list[ArtifactToStore]
) -> str | None:
    art_id = artifact_id(text)
    if art_id in unavailable:
        return None  # fail safe: never reference unsaved data, keep the original
    out.append(ArtifactToStore(art_id, text, "text/plain"))
    return stub_text(art_id, text, what, config)


def offload_message(
    message: Piece, message_tokens: int, count_text: CountText, config: DefenseConfig,
    unavailable: frozenset[str] = frozenset(), *, item: Item, codec: Codec,
) -> tuple[Piece | None, list[ArtifactToStore]]:
    """Offload the large content of one piece (``message``, a piece of ``codec``; ``item``: its
    item, ``codec.item(message)``).

    ``message_tokens`` is the piece's (memoized) token count, used to skip small pieces cheaply
    and to measure a bare-string content (a part whose native is a ``str``: the piece's whole
    text); ``count_text(str) -> int`` measures a part of a list. Decided over the codec's parts:
    a ``TOOL`` item's text and result parts against the tool threshold (as "tool result"); a
    ``USER``/``RESULTS`` item's ``TEXT`` parts against the user threshold (as "user message") and
    its ``TOOL_RESULT`` parts against the tool threshold; only parts ``codec.part_text`` reads
    (anything else is kept as sent); rewritten with ``codec.with_text``/``codec.with_parts``.
    Returns ``(new piece or None if unchanged, artifacts to store)``. Ids in ``unavailable``
    (artifacts the pipeline failed to store) are never referenced: that content is kept as sent.
    """
    tool_t = config.offload_tool_threshold_tokens
    if item.kind == TOOL:
        text_t, what = tool_t, "tool result"
    elif item.kind in (USER, RESULTS):
        text_t, what = config.offload_user_tokens, "user message"
    else:
        return None, []
    if message_tokens <= min(text_t, tool_t):
        return None, []
    artifacts: list[ArtifactToStore] = []
    new: dict[int, object] = {}
    for index, part in enumerate(codec.parts(message, UNCOUNTED)):
        if part.kind not in (TEXT, TOOL_RESULT):
            continue
        text = codec.part_text(part)
        if text is None:
            continue
        result = part.kind == TOOL_RESULT and item.kind != TOOL
        tokens = message_tokens if isinstance(part.native, str) else count_text(text)
        if tokens > (tool_t if result else text_t):
            stub = _offload_text(text, "tool result" if result else what, config, unavailable, artifacts)
            if stub is not None:
                new[index] = codec.with_text(part, stub)
    if not new:
        return None, []
    return codec.with_parts(message, new), artifacts
