"""Where a summary cuts: keep the most recent items verbatim, never split a pairing group.

DESIGN.md section 2: keep the most recent 10% of the window (``keep_tokens``; unknown window: the
last 6 messages); the cutoff moves *earlier* so it never separates an item making tool calls from
its answers (parallel calls included, case 001; ``tool_use`` and ``tool_result`` blocks, case 002).
The last item is always kept. Read from the neutral model (``proxy.conversation.model``).

An ``OPAQUE`` item stays with the item before it (issue 15): the kept tail never starts at one,
and one right after the leading system items stays with them.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.conversation.model import OPAQUE, SYSTEM, Item, group_start, is_user_turn


def tail_start(
    items: Sequence[Item],
    counts: Sequence[int],
    lo: int,
    keep_tokens: int | None,
    keep_messages: int | None,
) -> int:
    """First index of the kept tail; the summarizable span is ``lo .. tail_start - 1``.

    ``counts[i]`` are token counts of the items as projected (only ``i >= lo`` are read).
    The tail grows backwards in pair-safe steps while it stays within ``keep_tokens`` (or has
    fewer than ``keep_messages`` items), and always holds the last item with its group.
    Returns a value ``<= lo`` when nothing can be summarized.
    """
    n = len(items)
    if n == 0:
        return 0
    s = group_start(items, n - 1)
    if keep_messages is not None:
        return min(s, group_start(items, max(0, n - keep_messages)))
    budget = keep_tokens or 0
    total = sum(counts[s:n])
    while s - 1 >= lo:
        s2 = group_start(items, s - 1)
        if s2 < lo:
            break
        add = sum(counts[s2:s])
        if total + add > budget:
            break
        total += add
        s = s2
    return s


def last_user_turn(items: Sequence[Item]) -> int | None:
    """Index of the user's latest request (a ``USER`` item: never a carrier of tool results)."""
    for i in range(len(items) - 1, -1, -1):
        if is_user_turn(items[i]):
            return i
    return None


def leading_system_count(items: Sequence[Item]) -> int:
    """Number of leading ``SYSTEM`` items (they stay first in every projection), with the
    ``OPAQUE`` items among and right after them (bound to the item before)."""
    i, n = 0, len(items)
    while i < n and (items[i].kind == SYSTEM or (i and items[i].kind == OPAQUE)):
        i += 1
    return i
