"""Does a request name stored content (an artifact or an archive)? Asked to decide whether the
proxy's read tool goes with the forwarded request.

``StoredContent`` answers it cheaply: a stub defense that applied always names stored content; a
small body is searched for a read URL; a long one asks its ``ReferenceMemo``, which reads only the
messages new since a remembered prefix (a client resends its whole history each turn), so the
long body is almost never searched (that search cost 3.4 ms at 5,000 messages, 5.3 MB, on every
request: ``tests/benchmarks``, pipeline section).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from proxy.conversation.prefix import PrefixStates
from proxy.tools.read_tool import references_in

ARCHIVE_URL = re.compile(rb"/sessions/[^/\s]+/archive")
STUB_DEFENSES = frozenset({"offload", "summary", "clip", "media"})
"""Defenses whose output names stored content (a stub or a summary pointing at it)."""
SUBSTRING_FIRST_BYTES = 16 * 1024
"""Bodies up to this size are searched for a stored-content URL before ``ReferenceMemo`` is asked
(the search is cheaper than the memo's lookups there: about a fifth of a small request's
``prepare``, cProfile); longer ones ask the memo first, which spares the search of most requests."""


class ReferenceMemo:
    """``names(messages, chain)`` is ``any(references_in(messages))``, reading only new messages.

    Whether some message up to position ``i`` names an artifact or archive is a function of
    ``chain[i]`` (a chain hash identifies a message together with everything before it), so the
    answer is kept in the conversation's ``PrefixState`` (``refs_checked``/``refs_at``) and the
    next request reads only the messages after the longest prefix found among its newest
    ``PrefixStates.lookback`` positions (a branch further back reads its whole history once).
    A client resends its whole history each turn: a warm request reads the two or three messages
    it adds. Bounded by the ``PrefixStates`` it is given (``proxy.conversation.prefix.MAX_POSITIONS``).
    """

    def __init__(self, prefixes: PrefixStates | None = None) -> None:
        self.prefixes = prefixes if prefixes is not None else PrefixStates()

    def names(self, messages: Sequence[dict[str, Any]], chain: Sequence[str]) -> bool:
        """True iff the text of some message in ``messages`` names stored content.

        ``chain``: the chain hashes of ``messages`` (``proxy.conversation.canonical.digests_and_chain``), one per
        message. Raises ``ValueError`` when the lengths differ.
        """
        n = len(messages)
        if len(chain) != n:
            raise ValueError(f"{n} messages but {len(chain)} chain hashes")
        if not n:
            return False
        state = self.prefixes.take(chain)
        at, checked = state.refs_at, min(state.refs_checked, state.length)
        if not 0 <= at < checked:
            at = -1
            for i in range(checked, n):
                if any(references_in(messages[i:i + 1])):
                    at = i
                    break
            state.refs_at, state.refs_checked = at, (at + 1 if at >= 0 else n)
        self.prefixes.keep(chain, state)
        return at >= 0


def url_in_body(raw: bytes, expanded: bool) -> bool:
    """Could the body ``raw`` name stored content: a read URL or archive URL in it, or the proxy's
    own rounds put back (``expanded``)? (plain substrings first: the regex over a long body costs
    ~0.3 ms per MB; and first of all a ``/``, which both URLs start with: one ``memchr`` answers
    a body without any, where the two searches cost about 1 us per KB, a tenth of a small
    request's ``prepare``). ``bytes.find``, not ``in``: ``bytes in bytes`` first tries the
    operand as an integer, which raises and clears a ``TypeError`` inside CPython on every test
    (``PyErr_Format`` under ``_PyNumber_Index``, callgrind: two a small request)."""
    return expanded or (raw.find(b"/") >= 0 and (raw.find(b"/artifacts/art_") >= 0
                                                 or (raw.find(b"/archive") >= 0
                                                     and ARCHIVE_URL.search(raw) is not None)))


class StoredContent:
    """Answers "does this request name stored content?" for the read tool's offer.

    Owns one ``ReferenceMemo`` over ``prefixes`` (the app's per-conversation prefix states, or
    its own); one per compactor (or replay).
    """

    def __init__(self, prefixes: PrefixStates | None = None) -> None:
        self.memo = ReferenceMemo(prefixes)

    def may_be_named(self, raw: bytes, messages: Sequence[dict[str, Any]], chain: Sequence[str],
                     expanded: bool) -> bool:
        """Could the client's messages name stored content (before projecting)? The cheap checks
        of ``named``: a small body searched, a long one asked of the memo (which ``named`` then
        answers from its newest entry), never searched."""
        if len(raw) <= SUBSTRING_FIRST_BYTES:
            return url_in_body(raw, expanded)
        return expanded or self.memo.names(messages, chain)

    def named(self, raw: bytes, messages: list[dict[str, Any]], chain: Sequence[str], expanded: bool,
              forwarded: list[dict[str, Any]], applied: Sequence[str]) -> bool:
        """Do the forwarded messages name an artifact or archive? (cheap checks first)

        ``messages``/``chain``/``raw``: the client's; ``forwarded``: the projection's messages
        (``messages`` itself when nothing applied); ``applied``: the defenses that did.
        True when a stub defense applied. Else False when the body names no read URL or archive
        URL (and carries no internal rounds): a body up to ``SUBSTRING_FIRST_BYTES`` is searched
        for them first; a longer one asks the memo first (only messages new since the last
        request are read), which answers False on almost every request, so that the body is not
        searched at all. Else ``references_in(forwarded)`` (or the memo's answer, when the
        forwarded messages are the client's) decides.
        """
        if STUB_DEFENSES.intersection(applied):
            return True
        small = len(raw) <= SUBSTRING_FIRST_BYTES
        if small and not url_in_body(raw, expanded):
            return False  # what the lines below answer too, without the memo's bookkeeping
        hit = self.memo.names(messages, chain) if forwarded is messages else None
        if hit is False:
            return False
        if not small and not url_in_body(raw, expanded):
            return False
        return hit if hit is not None else any(references_in(forwarded))
