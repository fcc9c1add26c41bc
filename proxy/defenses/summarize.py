"""Defense 3: pure helpers for the structured summary (the pipeline makes the upstream calls).

DESIGN.md section 2: messages before a cutoff are replaced by one summary message; the summary
is structured (session intent, decisions with reasons and rejected options, artifacts, next
steps), does not repeat finished work, and is chained (a later summary folds the earlier one in).
The summary request is ONE ``user`` message (no ``system``, no ``developer`` role, no ``name``:
cases 023, 026), and must itself fit the window: the history is cut into window-sized chunks,
each step folding the previous summary and the next chunk (issue 3, item 3).

The transcript reads no native key: the codec frames each piece and renders its parts
(``Codec.transcript_frame``, ``Codec.render_part``), so chat messages, Messages turns and
Responses items are rendered by the same code.
"""

from __future__ import annotations

from itertools import groupby
from operator import attrgetter
from typing import Any

from proxy.conversation.codec import UNCOUNTED, Codec
from proxy.conversation.model import Piece
from proxy.defenses.hints import archive_url, search_hint
from proxy.tokens.protocol import TextCounter

SUMMARY_PHRASE = "summarize the conversation"
"""Literal phrase in every summary request (the fake upstream recognizes summary calls by it)."""

PROMPT_OVERHEAD_TOKENS = 400
"""Tokens of the summary prompt's fixed instructions (measured ~300 with o200k_base, rounded up)."""

_CUT_MARKER = "\n... [message cut to fit the summary request: {n} chars omitted] ..."


def render_message(message: Piece, codec: Codec) -> str:
    """One piece (``message``, of ``codec``) as transcript text: a ``### header`` line
    (``codec.transcript_frame``: the role, a name, the call it answers), then its parts
    (``codec.render_part``), the parts of one field (content, tool calls) one block, an empty
    block left out, then the lines for what no part shows.

    A role the proxy does not know is shown by its name like any other (``### ipython``; one that
    is not a string as its JSON), and so are fields it does not know (a vendor's, DeepSeek's
    ``reasoning_content``): the summarizer sees what the provider saw, and interprets it.
    """
    header, rest = codec.transcript_frame(message)
    lines = [f"### {header}"]
    for _, parts in groupby(codec.parts(message, UNCOUNTED), key=attrgetter("field")):
        text = "\n".join(r for r in (codec.render_part(message, p) for p in parts) if r is not None)
        if text:
            lines.append(text)
    lines.extend(rest)
    return "\n".join(lines)


def render_transcript(messages: list[Piece], codec: Codec) -> str:
    """A readable, deterministic text transcript of ``messages`` (pieces of ``codec``; a blank line
    between two)."""
    return "\n\n".join(render_message(m, codec) for m in messages)


def _cut_to_fit(message: Piece, budget_tokens: int, counter: TextCounter, codec: Codec) -> Piece:
    """A stand-in for an oversized piece: its rendered text cut (with a marker) to ``budget_tokens``,
    under the same header (``codec.text_piece``: for chat, role, name and answered call kept; the
    rest of the text is the content)."""
    text = render_message(message, codec).partition("\n")[2]
    keep = max(1, budget_tokens * 3)  # >= 3 chars/token for prose and code with o200k_base
    while True:
        cut = text[:keep] + _CUT_MARKER.format(n=len(text) - keep)
        candidate = codec.text_piece(message, cut)
        if counter.count_text(render_message(candidate, codec)) <= budget_tokens or keep <= 1:
            return candidate
        keep //= 2


def summary_chunks(messages: list[Piece], budget_tokens: int,
                   counter: TextCounter, codec: Codec) -> list[list[Piece]]:
    """Split ``messages`` into consecutive chunks whose rendered transcript fits ``budget_tokens``.

    Measured with ``counter.count_text`` on the rendered text (what the summary request contains).
    A single message over the budget is replaced by a cut stand-in with a marker (after offload
    this should not happen, but a summary request is never oversized). Every chunk is non-empty.
    """
    chunks: list[list[Piece]] = []
    current: list[Piece] = []
    used = 0
    for message in messages:
        cost = counter.count_text(render_message(message, codec)) + 2
        if cost > budget_tokens:
            message = _cut_to_fit(message, max(1, budget_tokens - 2), counter, codec)
            cost = budget_tokens
        if current and used + cost > budget_tokens:
            chunks.append(current)
            current, used = [], 0
        current.append(message)
        used += cost
    if current:
        chunks.append(current)
    return chunks


def chunk_budget_tokens(window_tokens: int, reply_tokens: int, previous_summary_tokens: int) -> int:
    """Tokens of transcript one summary request can carry: window minus reply, prompt and prior summary.

    Keeps a 10% margin for counting differences between our tokenizer and the provider's.
    """
    return max(64, int(window_tokens * 0.9) - reply_tokens - PROMPT_OVERHEAD_TOKENS - previous_summary_tokens)


def build_summary_request_messages(previous_summary: str | None, transcript: str) -> list[dict[str, Any]]:
    """The messages of one summary call: a single ``user`` message (no system/developer/name).

    Asks the model to "summarize the conversation" into the structured sections of DESIGN.md,
    keeping verbatim lines that carry facts (identifiers, values, ``FACT: k=v`` lines), folding
    in ``previous_summary`` when there is one (chained summaries).
    """
    parts = [
        f"Please {SUMMARY_PHRASE} below between an AI agent, its user and its tools, so the agent "
        "can continue the work from your summary alone (the original messages will no longer be "
        "visible to it).",
        "Write these sections:\n"
        "## Session intent\nWhat the user asked for and wants in the end; quote the user's latest request.\n"
        "## Summary and decisions\nWhat was done and learned, the decisions taken with their reasons, "
        "and options that were tried or rejected (and why).\n"
        "## Artifacts\nFiles created or changed, commands, resources and references used "
        "(including any /artifacts/... or /sessions/... references).\n"
        "## Next steps\nWhat remains to be done.",
        "Rules: keep verbatim every line that carries a fact the agent will need later "
        "(identifiers, names, numbers, values, paths, and any line like 'FACT: key=value'). "
        "Do not repeat finished work as if it were still to be done. Be concise.",
    ]
    if previous_summary:
        parts.append(
            "An earlier part of the conversation was already summarized. Fold that summary into yours: "
            "keep everything from it that is still relevant, including all its FACT lines.\n"
            "<previous_summary>\n" + previous_summary + "\n</previous_summary>"
        )
    parts.append("<conversation>\n" + transcript + "\n</conversation>")
    return [{"role": "user", "content": "\n\n".join(parts)}]


def summary_message(
    summary_text: str,
    session_id: str,
    event_id: str,
    message_count: int,
    *,
    pinned_user_text: str | None = None,
    read_tool_name: str | None = None,
) -> dict[str, Any]:
    """The ``user`` message that stands for the summarized messages in a projection.

    Starts with a header saying that ``message_count`` earlier messages were summarized by
    context-proxy and where the full archive is (``/sessions/{session_id}/archive``, the id percent-encoded), then the
    summary. ``pinned_user_text``: the user's latest request when it lies inside the summarized
    span, repeated verbatim so the agent still sees it. Never ``system``/``developer``, no ``name``.
    """
    tool_hint = f" (or with the `{read_tool_name}` tool)" if read_tool_name else ""
    header = (
        f"[context-proxy] The earlier conversation ({message_count} messages) was summarized by "
        f"context-proxy to fit the model's context window (compaction event {event_id}). "
        f"The full archive of those messages can be read at {archive_url(session_id)}{tool_hint}."
    )
    if read_tool_name:
        header += " " + search_hint(read_tool_name)
    text = header + "\n\n" + summary_text.strip()
    if pinned_user_text:
        text += "\n\n[context-proxy] The user's latest request, verbatim:\n" + pinned_user_text
    return {"role": "user", "content": text}
