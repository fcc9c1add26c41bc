"""The fake model: deterministic replies chosen by a list of responders tried in order.

A responder is ``(prompt, state) -> Reply | None``; the first non-None reply wins. The default
order (``DEFAULT_RESPONDERS``) is:

1. ``respond_summary`` - a summarization request (``state.summary_substring``, default
   "summarize the conversation", case-insensitive, in the last user message with text or in a
   system message) gets a structured summary that keeps every line containing ``FACT:``;
2. ``respond_question`` - ``QUESTION: <key>`` in the last user text gets ``ANSWER: <value>``
   when ``FACT: <key>=<value>`` occurs anywhere in the prompt, else ``ANSWER: unknown``;
3. ``respond_script`` - the next scripted assistant message of ``state.script`` (trace replay);
4. ``respond_echo`` - ``OK: <first 40 chars of the last user/tool message>``.

Insert a responder into ``state.responders`` to add a behaviour (e.g. a read tool).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.tokens import content_text, message_text

FACT_PREFIX = "FACT:"
_QUESTION = re.compile(r"QUESTION:\s*([A-Za-z0-9_.\-]+)")
_TRAILING_PUNCT = ".,;:)]}'\"!?"


@dataclass
class Prompt:
    """What the model saw: the body, its messages, the whole text and the last user text.

    ``text`` is every message's text (``tokens.message_text``) joined by newlines, or the
    truncated rendering when the provider cut the prompt (Ollama style).
    """

    body: dict[str, Any]
    messages: list[dict[str, Any]]
    text: str
    last_user_text: str
    is_summary: bool


@dataclass
class Reply:
    """The assistant message to send: content and/or tool_calls, plus extra message fields."""

    content: str | None
    tool_calls: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"


Responder = Callable[[Prompt, Any], "Reply | None"]


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """Text of the last ``user`` message that has text (tool_result-only messages skipped)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            text = _user_text(message.get("content"))
            if text:
                return text
    return ""


def _user_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content if isinstance(content, str) else ""


def build_prompt(body: dict[str, Any], summary_substring: str, text: str | None = None) -> Prompt:
    """The ``Prompt`` of a validated chat body; ``text`` overrides the rendered prompt text."""
    messages = body["messages"]
    full_text = "\n".join(message_text(m) for m in messages) if text is None else text
    last = last_user_text(messages)
    if text is not None and last and last not in text:
        last = ""  # the provider dropped it before the model saw it
    return Prompt(body, messages, full_text, last, is_summary_request(messages, summary_substring))


def is_summary_request(messages: Any, summary_substring: str) -> bool:
    """True when ``summary_substring`` (case-insensitive) is in the last user text or a system message."""
    needle = summary_substring.lower()
    if not needle or not isinstance(messages, list):
        return False
    messages = [m for m in messages if isinstance(m, dict)]
    systems = [content_text(m.get("content")) for m in messages if m.get("role") == "system"]
    return any(needle in t.lower() for t in [last_user_text(messages), *systems])


def fact_lines(text: str) -> list[str]:
    """Every line containing ``FACT:``, verbatim (trailing whitespace cut), deduplicated, in order."""
    seen: dict[str, None] = {}
    for line in text.splitlines():
        if FACT_PREFIX in line:
            seen.setdefault(line.rstrip(), None)
    return list(seen)


def _session_intent(prompt: Prompt, needle: str) -> str:
    lines = prompt.text.splitlines()
    for i, line in enumerate(lines):  # a chained summary carries the previous intent forward
        if line.strip() == "## Session intent" and i + 1 < len(lines) and lines[i + 1].strip():
            return lines[i + 1].strip()
    for message in prompt.messages:
        text = _user_text(message.get("content")) if message.get("role") == "user" else ""
        if text and needle not in text.lower():
            first = next((line.strip() for line in text.splitlines() if line.strip()), None)
            if first:
                return first
    for pattern in (r"^\s*\[?user\]?\s*[:>]\s*(\S.*)$", r"^\s*(task\b.*)$"):
        for line in lines:
            match = re.match(pattern, line, re.IGNORECASE)
            if match:
                return match.group(1).strip()
    return "(unknown)"


def summary_text(prompt: Prompt, summary_substring: str) -> str:
    """The structured summary the fake model writes for a summarization request."""
    facts = fact_lines(prompt.text)
    artifacts = list(dict.fromkeys(
        line.strip() for line in prompt.text.splitlines() if "/artifacts/" in line or "/archive" in line
    ))
    return "\n".join([
        "## Session intent",
        _session_intent(prompt, summary_substring.lower()),
        "",
        "## Summary and decisions",
        f"- Summarized {len(prompt.messages)} messages.",
        *facts,
        "",
        "## Artifacts",
        *(artifacts or ["- none"]),
        "",
        "## Next steps",
        "- Continue the task from the latest request.",
    ])


def answer_for(key: str, text: str) -> str:
    """``ANSWER: <value>`` for the first ``FACT: <key>=<value>`` in ``text``, else unknown.

    The value runs to whitespace, a backslash or a quote (so a FACT inside a JSON-encoded
    argument ends at its escaped newline), minus trailing punctuation such as ``.,;:)``.
    """
    match = re.search(r"FACT:\s*" + re.escape(key) + r'=([^\s\\"]+)', text)
    if match is None:
        return "ANSWER: unknown"
    return "ANSWER: " + (match.group(1).rstrip(_TRAILING_PUNCT) or "unknown")


def respond_summary(prompt: Prompt, state: Any) -> Reply | None:
    if not prompt.is_summary:
        return None
    text = summary_text(prompt, state.summary_substring)
    drop = getattr(state, "summary_drop_substring", None)
    if drop:  # a summarizer that misses some details: they survive only in the archive
        text = "\n".join(line for line in text.splitlines() if drop not in line)
    return Reply(text)


def respond_question(prompt: Prompt, state: Any) -> Reply | None:
    match = _QUESTION.search(prompt.last_user_text)
    if match is None:
        return None
    return Reply(answer_for(match.group(1), prompt.text))


def reply_from_message(message: dict[str, Any]) -> Reply:
    """A ``Reply`` from a scripted assistant message (tool calls get ``type: function``)."""
    tool_calls = [
        {"id": c["id"], "type": c.get("type", "function"), "function": dict(c["function"])}
        for c in message.get("tool_calls") or []
    ] or None
    extra = {k: v for k, v in message.items() if k not in ("role", "content", "tool_calls")}
    return Reply(message.get("content"), tool_calls, extra)


def respond_script(prompt: Prompt, state: Any) -> Reply | None:
    if not state.script:
        return None
    return reply_from_message(state.script.popleft())


def respond_echo(prompt: Prompt, state: Any) -> Reply | None:
    for message in reversed(prompt.messages):
        if message.get("role") in ("user", "tool"):
            text = content_text(message.get("content"))
            if text and text not in prompt.text:  # cut by the provider: echo what was seen
                text = prompt.text[-40:]
            return Reply("OK: " + " ".join(text.split())[:40])
    return Reply("OK")


DEFAULT_RESPONDERS: tuple[Responder, ...] = (respond_summary, respond_question, respond_script, respond_echo)
