"""The compaction lock of ``storage.store.Store``: one compaction of a session at a time, across processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from storage.errors import FOREIGN_ERRORS, translate_error

COMPACTION_LOCK_SPACE = 0x4350 << 40
"""High bits of the advisory-lock key of a session's compaction (``'CP'``), above any session pk."""


class CompactionLocks:
    """Mixed into ``Store``: uses its engine, dialect name and lock slots."""

    _engine: AsyncEngine
    _dialect: str
    _lock_slots: asyncio.Semaphore

    @asynccontextmanager
    async def compaction_lock(self, session_pk: int, wait_s: float = 120.0) -> AsyncIterator[bool]:
        """Hold the session's compaction lock across processes; yields whether it was acquired.

        PostgreSQL: a session-level advisory lock on a dedicated connection, polled with
        ``pg_try_advisory_lock`` for at most ``wait_s`` (then yields ``False``: the caller goes on
        unlocked rather than stall a request). At most ``lock_connections`` (half the pool, from
        ``Store.open``) are held at once in this process; more compactions wait for a slot, so
        requests always find connections. SQLite: yields ``True`` at once (one process writes a
        SQLite file in practice; the proxy also locks per session in-process).
        """
        if self._dialect != "postgresql":
            yield True
            return
        key = COMPACTION_LOCK_SPACE | session_pk
        try:
            async with self._lock_slots, self._engine.connect() as conn:
                deadline = asyncio.get_running_loop().time() + wait_s
                acquired = False
                while True:
                    tried = await conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": key})
                    acquired = bool(tried.scalar())
                    await conn.commit()
                    if acquired or asyncio.get_running_loop().time() > deadline:
                        break
                    await asyncio.sleep(0.05)
                try:
                    yield acquired
                finally:
                    if acquired:
                        await conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                        await conn.commit()
        except FOREIGN_ERRORS as exc:
            raise translate_error(exc, "compaction_lock") from exc
