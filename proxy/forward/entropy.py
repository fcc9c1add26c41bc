"""System entropy read in blocks, for the random part of request ids (``session_log.new_id``).

``secrets.token_hex`` reads the system's random source once per id (a ``getrandom`` call, and three
Python calls around it, per request); ``EntropyPool`` reads ``ENTROPY_POOL_BYTES`` at once and hands
each byte out once. The bytes are the same source's (a CSPRNG: what one id shows says nothing of
another), never from ``random`` (whatever seeds it would make ids repeat), and a forked child drops
what it inherited (else parent and child would hand out the same bytes).
"""

from __future__ import annotations

import os
import threading
import weakref

ENTROPY_POOL_BYTES = 4096
"""Bytes read from the system at once (682 ids of 6 random bytes each; the pool's whole state)."""


class EntropyPool:
    """Hex text of system entropy, each byte handed out once. Thread-safe (one lock)."""

    def __init__(self, size: int = ENTROPY_POOL_BYTES) -> None:
        self._size = size
        self._hex = ""
        self._at = 0
        self._lock = threading.Lock()
        _POOLS.add(self)

    def hex(self, chars: int) -> str:
        """``chars`` (even, at most twice the pool's size) hex digits of bytes never handed out before."""
        with self._lock:
            at = self._at
            if at + chars > len(self._hex):
                self._hex, at = os.urandom(self._size).hex(), 0
            self._at = at + chars
            return self._hex[at:at + chars]

    def drop(self) -> None:
        """Forget the bytes not handed out yet (the next ``hex`` reads new ones)."""
        with self._lock:
            self._hex, self._at = "", 0

    def _forked(self) -> None:
        """In a forked child: forget the parent's bytes, and its lock (another thread of the parent
        may have held it at the fork: taking it would hang the child)."""
        self._lock = threading.Lock()
        self._hex, self._at = "", 0


_POOLS: weakref.WeakSet[EntropyPool] = weakref.WeakSet()
"""Every pool alive: a forked child resets each (one hook for all, registered once)."""


def _after_fork_in_child() -> None:
    for pool in list(_POOLS):
        pool._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)
