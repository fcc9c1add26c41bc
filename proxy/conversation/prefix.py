"""One per-conversation prefix state: what a request shares with the previous one of its conversation.

A client resends its whole history every turn. What the proxy derived from that history (the
chain-hash -> position map, the token count of each message per counter, the model's items) is a
function of the prefix alone, and a chain hash names a whole prefix (``canonical.chain_hash``),
so the state of ``chain[:i + 1]`` is kept under ``chain[i]`` and the next request of the
conversation finds it among its last ``LOOKBACK`` chain hashes, then extends it by the few
positions it adds. One object instead of one lookback cache per consumer (the projection's chain
index and the token counter's counts used to look back on their own).

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
    named ``items_codec``)."""

    __slots__ = ("counts", "index", "items", "items_codec", "length")

    def __init__(self) -> None:
        self.length = 0
        self.index: dict[str, int] = {}
        self.counts: dict[Hashable, list[int]] = {}
        self.items: list[Item] = []
        self.items_codec = ""
        """The ``Codec.name`` of the codec that gave ``items``."""

    def weight(self) -> int:
        """Positions held (the unit of ``MAX_POSITIONS``)."""
        return len(self.index) + len(self.items) + sum(len(c) for c in self.counts.values())

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
        """Give ``state`` back as the state of ``chain`` (every field at most ``len(chain)`` long)."""
        if not chain:
            return
        state.length = len(chain)
        with self._lock:
            self._states.put(chain[-1], state)

    def clear(self) -> None:
        """Forget everything (tests)."""
        with self._lock:
            self._states.clear()
