"""One per-conversation prefix state: what a request shares with the previous one of its conversation.

A client resends its whole history every turn. What the proxy derived from that history (the
chain-hash -> position map, the token count of each message per counter, the model's items) is a
function of the prefix alone, and a chain hash names a whole prefix (``canonical.chain_hash``),
so the state of ``chain[:i + 1]`` is kept under ``chain[i]`` and the next request of the
conversation finds it among its last ``LOOKBACK`` chain hashes, then extends it by the few
positions it adds. One object instead of one lookback cache per consumer (the projection's chain
index, the token counter's counts, ``proxy.compaction.references.ReferenceMemo``'s "does this
prefix name stored content" and ``proxy.forward.session_log.SessionLog``'s "how much of this
prefix is stored in session pk" used to look back on their own).

Ownership: a ``PrefixState`` taken with ``PrefixStates.take`` belongs to the caller until it is
given back with ``keep`` (two requests of one conversation at once: the second builds its own);
values handed out of it (``index``, ``counts_for``'s list, ``items``) are never mutated once
kept: a longer prefix gets copies, so a caller may keep reading what it got.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence

from proxy.cache import MEMO_IDLE_S, Memo
from proxy.conversation.model import Item

LOOKBACK = 64
"""Trailing positions ``take`` looks back for a shorter prefix seen before (a turn adds a reply and
a user message; an agent step a few tool rounds)."""
STORED_SESSIONS_PER_PREFIX = 8
"""Sessions whose stored length one ``PrefixState`` remembers (``stored``; the newest noted kept):
conversations that start the same way in many sessions do not grow a state."""
MAX_POSITIONS = 200_000
"""Bound of ``PrefixStates``: positions summed over the kept states' fields (chain index entries
about 100 bytes each, counts about 40, items shared objects: 15 MB at most); least recently used
state first out, and a state unused for ``proxy.cache.MEMO_IDLE_S`` leaves too. (Replaces the
projection's index memo and the counter's history memo, 100,000 positions each.)"""


class PrefixState:
    """What is known of one prefix of a conversation (``length`` pieces; each field covers at most
    that many, a field not needed yet may be shorter or empty).

    ``index``: ``{chain hash: position}``; ``counts``: per counter key (``TokenCounter.memo_key``),
    the token count of each piece; ``items``: the model's ``Item`` of each piece (by the codec
    named ``items_codec``); ``refs_checked``/``refs_at``: the first ``refs_checked`` pieces were
    searched for a name of stored content (``proxy.tools.read_tool.references_in``), the first
    found at ``refs_at`` (-1: none); ``stored``: ``(session pk, length, stamp, end hash)`` per
    session, the first ``length`` pieces of the chain ending in ``end hash`` known stored in that
    session's log, noted at ``stamp`` (the session log's clock: it decides which stamps it still
    trusts), and the length and hash of the prefix this state was found under when noted (so the same
    history sent again is known stored too); at most ``STORED_SESSIONS_PER_PREFIX``. The end hash
    names the whole stored prefix, so the length may reach past this state's own prefix (the reply
    and the proxy's own rounds after it)
    and still answers only for a chain that has that prefix."""

    __slots__ = ("counts", "index", "items", "items_codec", "length", "refs_at", "refs_checked", "stored")

    def __init__(self) -> None:
        self.length = 0
        self.index: dict[str, int] = {}
        self.counts: dict[Hashable, list[int]] = {}
        self.items: list[Item] = []
        self.items_codec = ""
        """The ``Codec.name`` of the codec that gave ``items``."""
        self.refs_checked = 0
        self.refs_at = -1
        self.stored: tuple[tuple[int, int, int, str, int, str], ...] = ()

    def weight(self) -> int:
        """Positions held (the unit of ``MAX_POSITIONS``; a stored length counts one)."""
        return (len(self.index) + len(self.items) + sum(map(len, self.counts.values())) + len(self.stored)
                + 1)  # (``map``: no generator frame; weighed on every ``keep``)

    def stored_in(self, session_pk: int, since: int, chain: Sequence[str]) -> int | None:
        """How many of ``chain``'s first pieces are known stored in ``session_pk``'s log, noted after
        stamp ``since``; ``None`` when this state knows none (or only of another chain)."""
        for pk, length, stamp, end, base, base_hash in self.stored:
            if pk != session_pk or stamp <= since:
                continue
            if 0 < length <= len(chain) and chain[length - 1] == end:
                return length
            if 0 < base <= len(chain) and chain[base - 1] == base_hash:
                return base  # the same history again (a retry, a regenerate): its own prefix is stored
        return None

    def note_stored(self, session_pk: int, chain: Sequence[str], stamp: int, base: int) -> None:
        """Remember that all of ``chain`` is stored in ``session_pk``'s log, and so its first
        ``base`` pieces (this state's own prefix: ``chain[base - 1]`` is its key), a new tuple: a
        state handed out is never mutated in place."""
        others = [e for e in self.stored if e[0] != session_pk]
        entry = (session_pk, len(chain), stamp, chain[-1], base, chain[base - 1])
        self.stored = (entry, *others[:STORED_SESSIONS_PER_PREFIX - 1])

    def notes_in_place(self, session_pk: int) -> bool:
        """``note_stored`` of ``session_pk`` would leave ``weight`` as it is: the session has an
        entry already, or the entries are at their bound."""
        for entry in self.stored:
            if entry[0] == session_pk:
                return True
        return len(self.stored) >= STORED_SESSIONS_PER_PREFIX

    def _merge(self, other: PrefixState) -> None:
        """Take what ``other`` (a state of the same prefix) knows and this one does not: stored
        lengths (per session the newest noted), and the reference search when it went further."""
        for entry in reversed(other.stored):
            mine = [e for e in self.stored if e[0] == entry[0]]
            if not mine:
                self.stored = (*self.stored, entry)[:STORED_SESSIONS_PER_PREFIX]
            elif mine[0][2] < entry[2]:
                self.stored = tuple(entry if e[0] == entry[0] else e for e in self.stored)
        if other.refs_checked > self.refs_checked:
            self.refs_checked, self.refs_at = other.refs_checked, other.refs_at

    def chain_index(self, chain: Sequence[str]) -> dict[str, int]:
        """``{chain_hash: position}`` of ``chain`` (this state's conversation), extended from what is
        known; the map returned is never mutated afterwards (do not mutate it either)."""
        index, n = self.index, len(chain)
        start = len(index)
        if start < n:
            index = dict(index)
            for i in range(start, n):
                index.setdefault(chain[i], i)
            self.index = index
        return index


class PrefixStates:
    """The bounded store of ``PrefixState``s, keyed by the chain hash of their last piece.

    Bounded by ``max_positions`` (``PrefixState.weight`` summed) and by idleness (``idle_s``);
    thread-safe (one lock, held for lookups and stores only). Built by the owner of the
    projection (``proxy.projection.ProjectionMemos``) and passed down."""

    def __init__(self, max_positions: int = MAX_POSITIONS, idle_s: float = MEMO_IDLE_S,
                 lookback: int = LOOKBACK) -> None:
        self._states = Memo(max_positions, idle_s, weight=PrefixState.weight)
        self._lock = threading.Lock()
        self.lookback = lookback

    def __len__(self) -> int:
        return len(self._states)

    def take(self, chain: Sequence[str]) -> PrefixState:
        """The state of the longest prefix of ``chain`` kept (removed from the store: the caller owns
        it until ``keep``), its ``length`` set to that prefix's; a new empty state when none."""
        with self._lock:
            state, start = self._states.pop_longest(chain, self.lookback)
        if state is None:
            return PrefixState()
        assert isinstance(state, PrefixState)
        state.length = start
        return state

    def keep(self, chain: Sequence[str], state: PrefixState) -> None:
        """Give ``state`` back as the state of ``chain`` (every field at most ``len(chain)`` long).
        A state kept meanwhile under the same prefix (another consumer's) gives ``state`` what it
        knew that ``state`` does not (``stored``, the reference search)."""
        if not chain:
            return
        state.length = len(chain)
        with self._lock:
            other = self._states.pop(chain[-1])
            if isinstance(other, PrefixState) and other is not state:
                state._merge(other)
            self._states.put(chain[-1], state)

    def stored_len(self, chain: Sequence[str], session_pk: int, since: int) -> int | None:
        """How many of ``chain``'s first pieces are known stored in ``session_pk``'s log (noted
        after stamp ``since``): the deepest such state among the newest ``lookback`` positions;
        ``None`` when none knows. Nothing is taken."""
        with self._lock:
            stop = len(chain) - 1 - self.lookback  # (``max(-1, stop)``, inline: as ``Memo.pop_longest``)
            for i in range(len(chain) - 1, stop if stop > -1 else -1, -1):
                state = self._states.get(chain[i])
                if isinstance(state, PrefixState):
                    length = state.stored_in(session_pk, since, chain)
                    if length is not None:
                        return length
        return None

    def note_stored(self, chain: Sequence[str], session_pk: int, stamp: int) -> None:
        """Remember that all of ``chain`` is stored in ``session_pk``'s log (at ``stamp``), on the
        longest state kept among ``chain``'s newest ``lookback`` positions, which stays where it is
        (a regenerated or retried request, or a client whose echo of the reply differs, still finds
        it; noted in place when that leaves its weight as it is, ``PrefixState.notes_in_place``, else
        taken out and put back, weighed again); a new state at ``chain``'s end when none is kept."""
        if not chain:
            return
        with self._lock:
            states = self._states
            stop = len(chain) - 1 - self.lookback  # (``max(-1, stop)``, inline: as ``Memo.pop_longest``)
            for i in range(len(chain) - 1, stop if stop > -1 else -1, -1):
                state = states.get(chain[i])
                if isinstance(state, PrefixState):
                    if state.notes_in_place(session_pk):  # (its weight stays: no pop and put again)
                        state.note_stored(session_pk, chain, stamp, i + 1)
                        return
                    states.pop(chain[i])
                    break
            else:
                state, i = PrefixState(), len(chain) - 1
                state.length = len(chain)
            state.note_stored(session_pk, chain, stamp, i + 1)
            states.put(chain[i], state)

    def clear(self) -> None:
        """Forget everything (tests)."""
        with self._lock:
            self._states.clear()
