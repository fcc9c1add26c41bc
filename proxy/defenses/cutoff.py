"""Where a summary cuts: keep the most recent messages verbatim, never split a tool-call pair.

DESIGN.md section 2: keep the most recent 10% of the window (``keep_tokens``; unknown window: the
last 6 messages); the cutoff moves *earlier* so it never separates an assistant ``tool_calls``
message from its ``tool`` answers (parallel calls included, case 001) nor a ``tool_use`` block
from its ``tool_result`` block (case 002). The last message is always kept.

A message with a role the proxy does not know stays with the message before it (issue 15): the
kept tail never starts at one, and one right after the leading system messages stays with them.
"""

from __future__ import annotations

from typing import Any

from proxy.conversation.canonical import is_known_role
from proxy.defenses.pairs import is_user_turn, safe_start


def tail_start(
    messages: list[dict[str, Any]],
    counts: list[int],
    lo: int,
    keep_tokens: int | None,
    keep_messages: int | None,
) -> int:
    """First index of the kept tail; the summarizable span is ``lo .. tail_start - 1``.

    ``counts[i]`` are token counts of the messages as projected (only ``i >= lo`` are read).
    The tail grows backwards in pair-safe steps while it stays within ``keep_tokens`` (or has
    fewer than ``keep_messages`` messages), and always holds the last message with its pair.
    Returns a value ``<= lo`` when nothing can be summarized.
    """
    n = len(messages)
    if n == 0:
        return 0
    s = safe_start(messages, n - 1)
    if keep_messages is not None:
        return min(s, safe_start(messages, max(0, n - keep_messages)))
    budget = keep_tokens or 0
    total = sum(counts[s:n])
    while s - 1 >= lo:
        s2 = safe_start(messages, s - 1)
        if s2 < lo:
            break
        add = sum(counts[s2:s])
        if total + add > budget:
            break
        total += add
        s = s2
    return s


def last_user_turn(messages: list[dict[str, Any]]) -> int | None:
    """Index of the user's latest request (a ``user`` message that is not a ``tool_result`` carrier)."""
    for i in range(len(messages) - 1, -1, -1):
        if is_user_turn(messages[i]):
            return i
    return None


def leading_system_count(messages: list[dict[str, Any]]) -> int:
    """Number of leading ``system``/``developer`` messages (they stay first in every projection),
    with the messages of unknown roles among and right after them (bound to the message before)."""
    i, n = 0, len(messages)
    while i < n and (messages[i].get("role") in ("system", "developer") or (i and not is_known_role(messages[i]))):
        i += 1
    return i
