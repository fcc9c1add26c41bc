"""What a request may hold at once: upstream connections (a share per tenant) and body bytes.

``PoolShare``: the upstream pool's ``pool_size`` slots, of which one tenant holds at most
``tenant_slots``; ``acquire`` waits at most ``timeout_s`` (the upstream connect timeout), then
raises ``ProxyBusy`` (503, ``retry-after``): a full pool is the proxy's condition, not the
provider's timeout. ``BodyBudget``: bytes of request bodies held at once by every request in the
process, counted as they are received (a declared ``content-length`` holds nothing until its bytes
come); a request whose received bytes would pass ``limit_bytes`` is refused with ``ProxyBusy``
(never waited for: a body that is being received already holds a socket and its buffers).

Both are built in the app's lifespan (``Upstream`` holds its ``PoolShare``; ``app.state`` the
budget) and are bounded: a tenant's entry exists only while it holds or waits for a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.errors import ProxyBusy


class PoolShare:
    """Upstream slots: ``pool_size`` in all, ``tenant_slots`` per tenant (at least 2, at most the
    pool; see the module docstring)."""

    def __init__(self, pool_size: int, tenant_slots: int) -> None:
        self.pool_size = pool_size
        # at least two: a request may hold one (a stream's start) while its summary call takes another
        self.tenant_slots = min(max(2, tenant_slots), pool_size)
        self._all = asyncio.Semaphore(pool_size)
        self._tenants: dict[str, list[int | asyncio.Semaphore]] = {}
        """tenant -> [holders and waiters, its semaphore]"""

    async def acquire(self, tenant: str | None, timeout_s: float) -> Callable[[], None]:
        """Wait for a slot (``tenant``: also one of its share; ``None``: the pool only) at most
        ``timeout_s`` seconds; returns the release function (idempotent). Raises ``ProxyBusy``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        entry = None
        if tenant is not None:
            entry = self._tenants.get(tenant)
            if entry is None:
                entry = self._tenants[tenant] = [0, asyncio.Semaphore(self.tenant_slots)]
            entry[0] += 1  # type: ignore[operator]
        try:
            if entry is not None:
                share: asyncio.Semaphore = entry[1]  # type: ignore[assignment]
                if share.locked():
                    await self._wait(share, deadline, loop, "this client's share of the upstream connections is in use")
                else:
                    await share.acquire()  # free: no timer (``_wait``'s first case, without its layer)
            try:
                if self._all.locked():
                    await self._wait(self._all, deadline, loop, "every upstream connection is in use")
                else:
                    await self._all.acquire()
            except BaseException:
                if entry is not None:
                    entry[1].release()  # type: ignore[union-attr]
                raise
        except BaseException:
            self._leave(tenant, entry)
            raise
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._all.release()
            if entry is not None:
                entry[1].release()  # type: ignore[union-attr]
                self._leave(tenant, entry)

        return release

    @staticmethod
    async def _wait(sem: asyncio.Semaphore, deadline: float, loop: asyncio.AbstractEventLoop, why: str) -> None:
        if not sem.locked():
            await sem.acquire()  # free: no timer
            return
        try:
            await asyncio.wait_for(sem.acquire(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise ProxyBusy(f"The proxy is busy: {why}; retry shortly.") from None

    def _leave(self, tenant: str | None, entry: list[int | asyncio.Semaphore] | None) -> None:
        if entry is None or tenant is None:
            return
        entry[0] -= 1  # type: ignore[operator]
        if entry[0] == 0 and self._tenants.get(tenant) is entry:
            del self._tenants[tenant]


SEARCHES_WAITING_PER_SLOT = 4
"""Read API searches that may wait for each one running; past that a search is refused (503)."""


class SearchSlots:
    """At most ``running`` read-API searches at once and ``waiting`` more queued behind them; one
    more is refused with ``ProxyBusy`` (503, ``retry-after``) rather than queued, so what waits (a
    request, and nothing loaded yet: ``held`` is entered before the document is read) is bounded."""

    def __init__(self, running: int, waiting: int) -> None:
        self._running = asyncio.Semaphore(running)
        self.max_waiting = waiting
        self.waiting = 0

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Hold one slot for the block; raises ``ProxyBusy`` when every slot is taken and
        ``max_waiting`` callers already wait."""
        if self._running.locked() and self.waiting >= self.max_waiting:
            raise ProxyBusy("The proxy is busy: as many read API searches as it runs and queues are under way; "
                            "retry shortly.")
        self.waiting += 1
        try:
            await self._running.acquire()
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self._running.release()


class BodyBudget:
    """Bytes of request bodies held at once, at most ``limit_bytes`` (see the module docstring)."""

    def __init__(self, limit_bytes: int, max_body_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.max_body_bytes = max_body_bytes
        """Larger declared bodies are not taken: the route refuses them (413) without reading them."""
        self.held_bytes = 0

    def take(self, size_bytes: int) -> None:
        """Hold ``size_bytes`` more; raises ``ProxyBusy`` (holding nothing more) past the limit."""
        if self.held_bytes + size_bytes > self.limit_bytes:
            raise ProxyBusy("The proxy is busy: the request bodies it holds have reached its memory budget "
                            f"({self.limit_bytes} bytes); retry shortly.")
        self.held_bytes += size_bytes

    def give_back(self, size_bytes: int) -> None:
        self.held_bytes -= size_bytes

    async def hold(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """Run ``app`` for one HTTP request with the body bytes it has received counted until the
        request ends (the response sent, streams included): each ``http.request`` message is taken
        as ``app`` receives it, and ``ProxyBusy`` is raised from ``receive`` (holding nothing more)
        when it does not fit. A declared length above ``max_body_bytes`` is left to ``app`` (413
        without reading it); a route that refuses before reading (401) holds nothing."""
        declared, chunked = 0, False
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = int(value) if value.isdigit() else 0
            elif name == b"transfer-encoding":
                chunked = True
        if (not declared and not chunked) or declared > self.max_body_bytes:
            await app(scope, receive, send)
            return
        taken = 0

        async def counted() -> Message:
            nonlocal taken
            message = await receive()
            size = len(message.get("body", b""))
            if size:
                self.take(size)
                taken += size
            return message

        try:
            await app(scope, counted, send)
        finally:
            self.give_back(taken)


class HeldBody:
    """The body bytes one request holds of a ``BodyBudget``, for a route that
    reads its own body (``proxy.routes.body.read_asgi_body``): what ``BodyBudget.hold`` counts
    through ``receive``, counted by the reader instead (no ``receive`` wrapped, no layer):
    ``take`` each chunk as it is received (raises ``ProxyBusy``, holding nothing more, when it
    does not fit), ``release`` everything when the request ends."""

    __slots__ = ("budget", "held_bytes")

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.held_bytes = 0

    def take(self, size_bytes: int) -> None:
        self.budget.take(size_bytes)
        self.held_bytes += size_bytes

    def release(self) -> None:
        self.budget.give_back(self.held_bytes)
        self.held_bytes = 0
