"""A strict provider's message validation, as a list of problems (empty: a strict provider accepts).

Rules (OpenAI's and DeepSeek's documented 400s, Anthropic's pairing, cases 001, 002, 004, 022,
023, 026):
- roles: ``system``, ``user``, ``assistant``, ``tool`` (``developer`` only when allowed, and the
  ``extra_roles`` a provider's chat template knows, e.g. Llama's ``ipython``: ordinary messages
  here, so one inside a block of tool answers leaves the calls unanswered, as OpenAI would say);
- ``name`` only on ``user`` messages (xAI);
- ``content`` is ``None`` only on an assistant message with ``tool_calls``;
- every ``tool`` message answers a not-yet-answered id declared by the nearest preceding assistant
  ``tool_calls`` message (only tool messages in between); every call is answered before the next
  non-tool message and before the end; no call id declared twice;
- Anthropic blocks: each ``tool_use`` block of an assistant message is answered by a
  ``tool_result`` block in the next message, which must be a ``user`` message; each
  ``tool_result`` answers a ``tool_use`` of the message right before it.
"""

from __future__ import annotations

from typing import Any

ROLES = ("system", "user", "assistant", "tool")


def _blocks(message: dict[str, Any], kind: str, key: str) -> list[Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [p.get(key) for p in content if isinstance(p, dict) and p.get("type") == kind]


def validate_chat_messages(
    messages: list[dict[str, Any]], allow_developer: bool = False, extra_roles: tuple[str, ...] = ()
) -> list[str]:
    """Problems a strict provider would reject ``messages`` for; ``[]`` when it would accept them."""
    problems: list[str] = []
    roles = ROLES + (("developer",) if allow_developer else ()) + extra_roles
    if not messages:
        return ["messages is empty"]
    declared_ever: set[str] = set()
    pending: list[str] = []
    open_block = False
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            problems.append(f"messages[{i}] is not an object")
            continue
        role = m.get("role")
        if role not in roles:
            problems.append(f"messages[{i}].role {role!r} is not accepted")
        if "name" in m and role != "user":
            problems.append(f"messages[{i}] has a name but role {role!r}")
        if m.get("content") is None and not (role == "assistant" and m.get("tool_calls")):
            problems.append(f"messages[{i}].content is null")
        if role == "tool":
            cid = m.get("tool_call_id")
            if not open_block or cid not in pending:
                problems.append(f"messages[{i}] answers {cid!r}, not a pending call of the preceding assistant")
            else:
                pending.remove(cid)
            continue
        if pending:
            problems.append(f"calls {pending} unanswered before messages[{i}]")
        pending, open_block = [], False
        calls = m.get("tool_calls") if role == "assistant" else None
        if calls:
            ids = [c.get("id") if isinstance(c, dict) else None for c in calls]
            for cid in ids:
                if not isinstance(cid, str) or cid in declared_ever:
                    problems.append(f"messages[{i}] declares a missing or duplicate call id {cid!r}")
                declared_ever.add(str(cid))
            pending, open_block = list(ids), True
        uses = _blocks(m, "tool_use", "id") if role == "assistant" else []
        if uses:
            nxt = messages[i + 1] if i + 1 < len(messages) else None
            results = _blocks(nxt, "tool_result", "tool_use_id") if nxt and nxt.get("role") == "user" else []
            missing = [u for u in uses if u not in results]
            if missing:
                problems.append(f"tool_use ids {missing} at messages[{i}] have no tool_result right after")
        for rid in _blocks(m, "tool_result", "tool_use_id"):
            prev = messages[i - 1] if i > 0 else {}
            if role != "user" or prev.get("role") != "assistant" or rid not in _blocks(prev, "tool_use", "id"):
                problems.append(f"tool_result {rid!r} at messages[{i}] answers no tool_use of the previous message")
    if pending:
        problems.append(f"calls {pending} unanswered at the end")
    return problems
