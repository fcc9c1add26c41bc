"""Whether the database is usable, as the hot path sees it.

With the per-process caches a steady-state request does not touch the database before it is
forwarded, so a database that went down would only be noticed when the reply is logged, and that
reply would be lost. Every ``StorageUnavailable`` the pipeline meets marks the database down; while
it is down each request asks ``usable()``, which probes (``SELECT 1`` on a fresh pool; one probe
shared by the requests that arrive while it runs). The pipeline then fails closed (503)
or open (forwarded unlogged), per ``database_failure_mode``.
"""

from __future__ import annotations

import asyncio
import logging

from storage.errors import StorageUnavailable
from storage.store import Store

log = logging.getLogger("context_proxy.database")


class DatabaseHealth:
    """Down/up state of the database from the pipeline's point of view."""

    def __init__(self, store: Store, probe_timeout_s: float = 5.0) -> None:
        self.store = store
        self.probe_timeout_s = probe_timeout_s
        self.down = False
        self._probe: asyncio.Task[bool] | None = None

    def failed(self) -> None:
        """A database call failed for want of a connection: treat the database as down."""
        if not self.down:
            log.error("database unavailable; requests fail per database_failure_mode until it answers again")
        self.down = True

    def saw(self, exc: BaseException) -> None:
        """A database call raised ``exc``: ``failed()`` if it is a ``StorageUnavailable``."""
        if isinstance(exc, StorageUnavailable):
            self.failed()

    async def usable(self) -> bool:
        """True unless the database is down and a probe says it still is. The hot path tests
        ``down`` first and awaits this only then (an up database's answer, without a coroutine).

        While down, every request waits for a probe (a fresh pool, then ``SELECT 1`` within
        ``probe_timeout_s``); requests that arrive while one runs share it.
        """
        if not self.down:
            return True
        if self._probe is None:
            self._probe = asyncio.ensure_future(self._run_probe())
        return await asyncio.shield(self._probe)

    async def _run_probe(self) -> bool:
        try:
            await self.store.reset_pool()  # pooled connections died with the server
            ok = await self.store.ping(timeout_s=self.probe_timeout_s)
            if ok:
                self.down = False
                log.info("database answers again")
            return ok
        finally:
            self._probe = None
