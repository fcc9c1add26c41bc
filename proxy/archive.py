"""The archive: a session's log rendered as Markdown, one timestamped section per compaction.

It is a *view* of the log (DESIGN.md section 3), rendered on each read from the stored messages and
events, never a second copy. Messages up to each summary event's cutoff form that compaction's
section; the messages after the last cutoff form a final "not summarized" section.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from proxy.chat import text_of
from storage.records import EventRecord, MessageRecord


def _render_message(record: MessageRecord) -> str:
    m: dict[str, Any] = record.message
    role = m.get("role", "?")
    head = f"### [{record.seq}] {role}"
    if m.get("name"):
        head += f" ({m['name']})"
    if m.get("tool_call_id"):
        head += f" — answer to `{m['tool_call_id']}`"
    if record.internal:
        head += " — internal (served by context-proxy)"
    lines = [head, ""]
    content = m.get("content")
    text = text_of(content)
    if isinstance(content, list):
        others = [p for p in content if isinstance(p, dict) and not isinstance(p.get("text"), str)]
        for part in others:
            kind = part.get("type", "part")
            lines.append(f"[{kind} part: {len(orjson.dumps(part))} bytes]")
    if text:
        lines.append(text)
    for call in m.get("tool_calls") or ():
        fn = call.get("function") or {}
        lines.append(f"\n**tool call** `{call.get('id')}` `{fn.get('name')}`:\n\n```json\n{fn.get('arguments', '')}\n```")
    lines.append("")
    return "\n".join(lines)


def render_archive(session_id: str, messages: Sequence[MessageRecord], events: Sequence[EventRecord]) -> str:
    """Markdown of ``messages`` (one branch, root first) sectioned by the summary ``events``."""
    seq_of = {m.chain_hash: m.seq for m in messages}
    summaries = sorted(
        (e for e in events if e.kind == "summary" and e.anchor_hash in seq_of), key=lambda e: seq_of[e.anchor_hash]
    )
    out = [f"# Archive of session `{session_id}`", "", f"{len(messages)} messages, {len(summaries)} compactions.", ""]
    start = 0
    for n, event in enumerate(summaries, 1):
        cutoff = seq_of[event.anchor_hash]
        out.append(f"## Compaction {n} — {event.created_at.isoformat()} (event `{event.id}`)")
        out.append("")
        out.append(f"Messages {start} to {cutoff} were summarized; the model was given this summary instead.")
        out.append("")
        out.extend(_render_message(m) for m in messages if start <= m.seq <= cutoff)
        start = cutoff + 1
    rest = [m for m in messages if m.seq >= start]
    if rest:
        out.append("## Not summarized" if summaries else "## Messages")
        out.append("")
        out.extend(_render_message(m) for m in rest)
    return "\n".join(out) + "\n"
