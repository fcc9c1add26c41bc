"""Defense 3: pure helpers for the structured summary (the pipeline makes the upstream calls).

DESIGN.md section 2: messages before a cutoff are replaced by one summary message; the summary
is structured (session intent, decisions with reasons and rejected options, artifacts, next
steps), does not repeat finished work, and is chained (a later summary folds the earlier one in).
The summary request is ONE ``user`` message (no ``system``, no ``developer`` role, no ``name``:
cases 023, 026), and must itself fit the window: the history is cut into window-sized chunks,
each step folding the previous summary and the next chunk (issue 3, item 3).
"""

from __future__ import annotations

import json
from typing import Any

from proxy.defenses.hints import archive_url, search_hint
from proxy.tokens.protocol import TextCounter

SUMMARY_PHRASE = "summarize the conversation"
"""Literal phrase in every summary request (the fake upstream recognizes summary calls by it)."""

PROMPT_OVERHEAD_TOKENS = 400
"""Tokens of the summary prompt's fixed instructions (measured ~300 with o200k_base, rounded up)."""

_CUT_MARKER = "\n... [message cut to fit the summary request: {n} chars omitted] ..."


def _part_text(part: Any) -> str:
    if not isinstance(part, dict):
        return str(part)
    kind = part.get("type")
    if kind == "text":
        return str(part.get("text", ""))
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        url = str(url)
        return f"[image: inline data, {len(url)} chars]" if url.startswith("data:") else f"[image: {url}]"
    if kind == "tool_use":
        args = json.dumps(part.get("input"), ensure_ascii=False, sort_keys=True)
        return f"-> tool call {part.get('name')} (id {part.get('id')}): {args}"
    if kind == "tool_result":
        return f"<- tool result (id {part.get('tool_use_id')}):\n{_content_text(part.get('content'))}"
    return json.dumps(part, ensure_ascii=False, sort_keys=True)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_part_text(p) for p in content)
    return json.dumps(content, ensure_ascii=False, sort_keys=True)


_RENDERED_FIELDS = frozenset({"role", "name", "tool_call_id", "content", "tool_calls", "function_call"})


def _field_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def render_message(message: dict[str, Any]) -> str:
    """One message as transcript text: a ``### role`` header, its text, its tool calls, then every
    other non-empty field as ``[field] value``.

    A role the proxy does not know is shown by its name like any other (``### ipython``; one that
    is not a string as its JSON), and so are fields it does not know (a vendor's, DeepSeek's
    ``reasoning_content``): the summarizer sees what the provider saw, and interprets it.
    """
    role = message.get("role", "?")
    header = f"### {_field_text(role)}"
    if message.get("name"):
        header += f" ({message['name']})"
    if message.get("tool_call_id"):
        header += f" [answer to call {message['tool_call_id']}]"
    lines = [header]
    text = _content_text(message.get("content"))
    if text:
        lines.append(text)
    for call in message.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        fn: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
        lines.append(f"-> tool call {fn.get('name')} (id {call.get('id')}): {fn.get('arguments')}")
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        lines.append(f"-> function call {legacy.get('name')}: {legacy.get('arguments')}")
    for key, value in message.items():
        if key not in _RENDERED_FIELDS and value is not None and value != "" and value != [] and value != {}:
            lines.append(f"[{key}] {_field_text(value)}")
    return "\n".join(lines)


def render_transcript(messages: list[dict[str, Any]]) -> str:
    """A readable, deterministic text transcript of ``messages`` (blank line between messages)."""
    return "\n\n".join(render_message(m) for m in messages)


def _cut_to_fit(message: dict[str, Any], budget_tokens: int, counter: TextCounter) -> dict[str, Any]:
    """A stand-in for an oversized message: its rendered text cut (with a marker) to ``budget_tokens``,
    under the same header (role, name and answered call kept; the rest of the text is the content)."""
    text = render_message(message).partition("\n")[2]
    header: dict[str, Any] = {k: message[k] for k in ("role", "name", "tool_call_id") if k in message}
    keep = max(1, budget_tokens * 3)  # >= 3 chars/token for prose and code with o200k_base
    while True:
        cut = text[:keep] + _CUT_MARKER.format(n=len(text) - keep)
        candidate = {**header, "content": cut}
        if counter.count_text(render_message(candidate)) <= budget_tokens or keep <= 1:
            return candidate
        keep //= 2


def summary_chunks(messages: list[dict[str, Any]], budget_tokens: int,
                   counter: TextCounter) -> list[list[dict[str, Any]]]:
    """Split ``messages`` into consecutive chunks whose rendered transcript fits ``budget_tokens``.

    Measured with ``counter.count_text`` on the rendered text (what the summary request contains).
    A single message over the budget is replaced by a cut stand-in with a marker (after offload
    this should not happen, but a summary request is never oversized). Every chunk is non-empty.
    """
    chunks: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    used = 0
    for message in messages:
        cost = counter.count_text(render_message(message)) + 2
        if cost > budget_tokens:
            message = _cut_to_fit(message, max(1, budget_tokens - 2), counter)
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
