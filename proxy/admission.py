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
import collections
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.errors import ProxyBusy


class Slots:
    """A FIFO counting semaphore of ``size`` slots whose free case is one plain call: ``take_now``
    (``asyncio.Semaphore`` takes a free slot through a coroutine, and its ``locked`` builds a
    generator each call: a free share and pool slot cost about 22,000 instructions a request,
    callgrind). ``wait`` queues behind earlier waiters; ``give`` hands a slot to the first
    waiter, else frees it. ``waiters`` holds only waits under way (as many as requests waiting:
    a cancelled or timed-out one leaves at once). Not thread-safe (one event loop)."""

    __slots__ = ("free", "waiters")

    def __init__(self, size: int) -> None:
        self.free = size
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        """Waiting ``wait`` calls, first come first."""

    def locked(self) -> bool:
        """No slot can be taken at once: none is free, or callers still wait for one."""
        return self.free <= 0 or bool(self.waiters)

    def take_now(self) -> bool:
        """Take a slot if one is free and nobody waits (``True``), else take nothing (``False``)."""
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return True
        return False

    async def wait(self) -> None:
        """Wait for a slot, after those already waiting (``take_now`` first when ``locked`` is false).
        A cancelled wait holds no slot: one handed to it as it was cancelled goes to the next."""
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed over just as the wait ended (``give`` took it out): pass it on
            else:
                waiter.cancel()
                try:
                    self.waiters.remove(waiter)  # (a timed-out wait must not stay: the queue would grow)
                except ValueError:
                    pass  # a ``give`` in the step it was cancelled in skipped it and dropped it already
            raise

    def give(self) -> None:
        """Give a slot back: to the first waiter, else to the free ones."""
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():  # (a wait cancelled but not yet resumed is skipped: it leaves then)
                waiter.set_result(None)
                return
        self.free += 1


class PoolShare:
    """Upstream slots: ``pool_size`` in all, ``tenant_slots`` per tenant (at least 2, at most the
    pool; see the module docstring)."""

    def __init__(self, pool_size: int, tenant_slots: int) -> None:
        self.pool_size = pool_size
        # at least two: a request may hold one (a stream's start) while its summary call takes another
        self.tenant_slots = min(max(2, tenant_slots), pool_size)
        self._all = Slots(pool_size)
        self._tenants: dict[str, list[Any]] = {}
        """tenant -> [holders and waiters, its ``Slots``]"""

    async def acquire(self, tenant: str | None, timeout_s: float) -> Callable[[], None]:
        """Wait for a slot (``tenant``: also one of its share; ``None``: the pool only) at most
        ``timeout_s`` seconds; returns the release function (idempotent). Raises ``ProxyBusy``."""
        entry = None
        deadline = None
        if tenant is not None:
            entry = self._tenants.get(tenant)
            if entry is None:
                entry = self._tenants[tenant] = [0, Slots(self.tenant_slots)]
            entry[0] += 1
        try:
            if entry is not None:
                share: Slots = entry[1]
                if not share.take_now():  # free: taken, no coroutine and no timer
                    loop = asyncio.get_running_loop()
                    deadline = loop.time() + timeout_s
                    await self._wait(share, deadline, loop, "this client's share of the upstream connections is in use")
            try:
                if not self._all.take_now():
                    loop = asyncio.get_running_loop()
                    if deadline is None:
                        deadline = loop.time() + timeout_s
                    await self._wait(self._all, deadline, loop, "every upstream connection is in use")
            except BaseException:
                if entry is not None:
                    entry[1].give()
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
            self._all.give()
            if entry is not None:
                entry[1].give()
                self._leave(tenant, entry)

        return release

    @staticmethod
    async def _wait(slots: Slots, deadline: float, loop: asyncio.AbstractEventLoop, why: str) -> None:
        """Take a slot of ``slots`` by the loop time ``deadline``, else raise ``ProxyBusy`` (``why``)."""
        if slots.take_now():
            return  # free: no timer
        try:
            async with asyncio.timeout_at(deadline):
                await slots.wait()
        except TimeoutError:
            raise ProxyBusy(f"The proxy is busy: {why}; retry shortly.") from None

    def _leave(self, tenant: str | None, entry: list[Any] | None) -> None:
        if entry is None or tenant is None:
            return
        entry[0] -= 1
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
