"""``SessionOrder``: a session's log operations in this process run one after another, in the
order they were started.

On PostgreSQL each operation is a transaction of its own, on a pooled connection, and two of one
session may run at once: a client's next request often arrives while its last reply's write is
still on its way. Both may insert the same message (a turn the client sends again, a reply it
echoes) with ``ON CONFLICT DO NOTHING``, and the one that commits first is the row kept: without
an order, sometimes the later request's form of the message (its moved cache breakpoints, the
SDK's ``null`` fields) instead of the form first sent; and a read of how much is stored may miss
a write this process started before it. Ordered, the first started commits first and a read
sees every write started before it. (A SQLite file needs none of this: its end-of-request writes
are queued in order, and flushed before any other operation, ``storage.sqlite.batch``.)
"""

from __future__ import annotations

import asyncio
import functools
import logging

log = logging.getLogger("context_proxy.storage")

ORDER_WAIT_S = 5.0
"""How long an operation waits for the one started before it (seconds): past that it goes on
unordered, as before there was an order (the inserts are idempotent; a message sent twice is
then stored in whichever form commits first). A session's log write takes milliseconds; one
stuck in the database (a lock held elsewhere, a connection that does not answer) must not hold
up every later operation of the session, reads included, and through the log writer's bound on
pending writes, the other sessions'."""


class SessionOrder:
    """Per session pk, the last operation started (``enter``), until it has left and every one
    started before it has (``leave``). Bounded by the operations in flight: a session's entry is
    dropped as its last operation leaves. Used on the event loop's thread."""

    def __init__(self) -> None:
        self._last: dict[int, asyncio.Future[None]] = {}

    def __len__(self) -> int:
        return len(self._last)

    def enter(self, session_pk: int) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """An operation of ``session_pk`` starts now: ``(before, mine)``, ``before`` the operation
        to wait for first (``None``: none in flight), ``mine`` this one's, for ``leave``."""
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        before = self._last.get(session_pk)
        self._last[session_pk] = mine
        mine.add_done_callback(functools.partial(self._gone, session_pk))
        return before, mine

    @staticmethod
    async def wait(before: asyncio.Future[None] | None) -> None:
        """Until ``before`` has left (however it ended: its outcome is its caller's), or
        ``ORDER_WAIT_S`` has passed (logged). Raises ``CancelledError`` if the waiter is
        cancelled (``before`` is not)."""
        if before is not None and not before.done():
            await asyncio.wait((before,), timeout=ORDER_WAIT_S)
            if not before.done():
                log.warning("a log operation of this session has run for %.0f s: the next goes on without waiting "
                            "for it", ORDER_WAIT_S)

    @staticmethod
    def leave(before: asyncio.Future[None] | None, mine: asyncio.Future[None]) -> None:
        """The operation ``mine`` has ended (or will not run): the next may start once ``before``
        has left too (so an operation cancelled while waiting does not let the next overtake the
        one it waited for). Idempotent."""
        if mine.done():
            return
        if before is None or before.done():
            mine.set_result(None)
        else:
            before.add_done_callback(functools.partial(_release, mine))

    def _gone(self, session_pk: int, mine: asyncio.Future[None]) -> None:
        if self._last.get(session_pk) is mine:
            del self._last[session_pk]


def _release(mine: asyncio.Future[None], _before: asyncio.Future[None]) -> None:
    if not mine.done():
        mine.set_result(None)
