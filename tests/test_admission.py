"""``proxy.admission``: the upstream pool's per-tenant share and the body budget."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from proxy.admission import BodyBudget, HeldBody, PoolShare, Slots
from proxy.errors import ProxyBusy


async def test_a_tenant_holds_at_most_its_share_and_others_still_get_slots() -> None:
    pool = PoolShare(pool_size=6, tenant_slots=3)
    a = [await pool.acquire("a", 1.0) for _ in range(3)]
    with pytest.raises(ProxyBusy, match="share"):
        await pool.acquire("a", 0.05)  # over its share: refused after the timeout, as the proxy's
    b = [await pool.acquire("b", 0.05) for _ in range(3)]  # b is not kept waiting by a
    with pytest.raises(ProxyBusy, match="every upstream connection"):
        await pool.acquire("c", 0.05)  # the pool is full
    a[0]()
    a[0]()  # idempotent
    assert await pool.acquire("c", 0.05)
    for release in [*a[1:], *b]:
        release()
    assert set(pool._tenants) == {"c"}  # a tenant's entry lives only while it holds or waits


async def test_a_waiter_gets_the_slot_given_back_and_a_cancelled_one_leaves_nothing() -> None:
    pool = PoolShare(pool_size=2, tenant_slots=2)
    first, second = await pool.acquire("a", 1.0), await pool.acquire("a", 1.0)
    waiter = asyncio.ensure_future(pool.acquire("a", 5.0))
    await asyncio.sleep(0.01)
    first()
    third = await asyncio.wait_for(waiter, 1.0)
    cancelled = asyncio.ensure_future(pool.acquire("a", 5.0))
    await asyncio.sleep(0.01)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    second()
    third()
    assert pool._tenants == {} and not pool._all.locked()


def test_the_share_is_at_least_two_and_at_most_the_pool() -> None:
    assert PoolShare(8, 0).tenant_slots == 2  # a stream's start and its summary call
    assert PoolShare(1, 5).tenant_slots == 1


def test_the_body_budget_refuses_past_its_limit_and_frees_what_is_given_back() -> None:
    budget = BodyBudget(limit_bytes=100, max_body_bytes=80)
    budget.take(60)
    with pytest.raises(ProxyBusy) as refused:
        budget.take(41)
    assert refused.value.status == 503 and dict(refused.value.headers) == {"retry-after": "1"}
    assert budget.held_bytes == 60
    budget.give_back(60)
    budget.take(100)
    assert budget.held_bytes == 100


async def test_the_body_budget_counts_bytes_received_not_bytes_declared() -> None:
    budget = BodyBudget(limit_bytes=1000, max_body_bytes=800)
    scope = {"type": "http", "headers": [(b"content-length", b"800")]}
    parts = [b"a" * 300, b"b" * 300]
    seen: list[int] = []

    async def receive() -> dict:
        body = parts.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(parts)}

    async def app(scope: dict, receive: object, send: object) -> None:
        seen.append(budget.held_bytes)  # declared 800, nothing received: nothing held
        await receive()  # type: ignore[operator]
        seen.append(budget.held_bytes)
        budget.take(450)  # another request receives 450 meanwhile
        with pytest.raises(ProxyBusy):
            await receive()  # type: ignore[operator]  # 300 + 450 + 300 > 1000: refused, holding nothing more
        seen.append(budget.held_bytes)
        budget.give_back(450)

    await budget.hold(app, scope, receive, None)  # type: ignore[arg-type]
    assert seen == [0, 300, 750] and budget.held_bytes == 0


def test_a_body_just_begun_is_not_evicted_before_one_that_has_trickled_for_long() -> None:
    """At the connection cap the slowest body goes, but a body whose headers came a moment ago
    (0 bytes yet: an httpx-style client writes headers and body separately) is judged after every
    body older than the grace, so a slowloris trickling 1 byte/s for a minute goes first (review)."""
    from types import SimpleNamespace

    from proxy.server.http_guard import EVICT_GRACE_S, GuardedHttpToolsProtocol

    class Conn(SimpleNamespace):
        __hash__ = object.__hash__

    now = 1000.0
    flow = SimpleNamespace(read_paused=False)
    trickler = Conn(_body_bytes=60, _body_since=now - 60, flow=flow)
    fresh = Conn(_body_bytes=0, _body_since=now - 0.002, flow=flow)
    me = SimpleNamespace(loop=SimpleNamespace(time=lambda: now), _receiving={fresh: None, trickler: None})
    assert GuardedHttpToolsProtocol._slowest_body(me, young=False) is trickler  # type: ignore[arg-type]
    assert GuardedHttpToolsProtocol._slowest_body(me, young=True) is fresh  # type: ignore[arg-type]
    # with only young bodies, none is judged among the old (an idle connection goes first) and
    # the slowest young one is the last resort
    young = Conn(_body_bytes=5, _body_since=now - EVICT_GRACE_S / 2, flow=flow)
    me._receiving = {young: None, fresh: None}
    assert GuardedHttpToolsProtocol._slowest_body(me, young=False) is None  # type: ignore[arg-type]
    assert GuardedHttpToolsProtocol._slowest_body(me, young=True) is fresh  # type: ignore[arg-type]


async def test_a_free_slot_is_taken_without_the_waiting_path_and_a_busy_one_through_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``acquire`` takes a free share and a free pool slot straight (no ``_wait`` layer); a busy
    one waits through ``_wait`` (its timeout and ``ProxyBusy``), as before."""
    waited: list[str] = []
    original = PoolShare._wait

    async def counted(sem, deadline, loop, why):  # type: ignore[no-untyped-def]
        waited.append(why)
        await original(sem, deadline, loop, why)

    monkeypatch.setattr(PoolShare, "_wait", staticmethod(counted))
    pool = PoolShare(pool_size=3, tenant_slots=2)
    held = [await pool.acquire("a", 1.0), await pool.acquire("a", 1.0), await pool.acquire(None, 1.0)]
    assert waited == []  # three free slots: none waited
    with pytest.raises(ProxyBusy, match="share"):
        await pool.acquire("a", 0.01)
    with pytest.raises(ProxyBusy, match="every upstream connection"):
        await pool.acquire("b", 0.01)
    assert waited == ["this client's share of the upstream connections is in use", "every upstream connection is in use"]
    for release in held:
        release()
    assert pool._tenants == {} and not pool._all.locked()


def test_a_request_s_held_body_is_taken_from_the_budget_and_given_back_whole() -> None:
    budget = BodyBudget(limit_bytes=100, max_body_bytes=80)
    held = HeldBody(budget)
    held.take(60)
    held.take(30)
    assert budget.held_bytes == 90 and held.held_bytes == 90
    with pytest.raises(ProxyBusy):
        held.take(20)  # past the limit: refused, holding nothing more
    assert budget.held_bytes == 90
    held.release()
    assert budget.held_bytes == 0 and held.held_bytes == 0


async def test_slots_serve_waiters_first_come_first_and_a_newcomer_does_not_jump_the_queue() -> None:
    """``Slots`` (``PoolShare``'s semaphore): a freed slot goes to the longest waiter, and while
    anybody waits a new caller cannot take one at once (``take_now``), as ``asyncio.Semaphore``."""
    slots = Slots(1)
    assert slots.take_now() and slots.locked() and not slots.take_now()
    order: list[str] = []

    async def waits(name: str) -> None:
        await slots.wait()
        order.append(name)

    first, second = asyncio.ensure_future(waits("first")), asyncio.ensure_future(waits("second"))
    await asyncio.sleep(0)
    slots.give()  # to ``first``, not to the free count
    assert not slots.take_now()  # ``second`` still waits: a newcomer is refused
    await first
    slots.give()
    await second
    assert order == ["first", "second"]
    slots.give()
    assert slots.free == 1 and not slots.locked() and slots.take_now()


async def test_a_slot_handed_to_a_wait_that_is_cancelled_at_that_moment_goes_to_the_next_waiter() -> None:
    """The slot ``give`` hands to a waiter whose task is cancelled before it runs (its timeout, a
    client gone) is not lost: the next waiter gets it, else it is free again."""
    slots = Slots(1)
    assert slots.take_now()
    late, next_ = asyncio.ensure_future(slots.wait()), asyncio.ensure_future(slots.wait())
    await asyncio.sleep(0)
    slots.give()  # handed to ``late`` ...
    late.cancel()  # ... which is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await late
    await asyncio.wait_for(next_, 1.0)  # the slot went on
    slots.give()
    assert slots.free == 1 and not slots.waiters
    alone = asyncio.ensure_future(slots.wait()) if not slots.take_now() else None
    assert alone is None  # free again: taken at once


async def test_pool_share_waiting_times_out_holding_nothing_and_serves_in_order() -> None:
    """``PoolShare`` over ``Slots``: a waiter that times out holds no slot (of its share or the
    pool), and the waiters that remain are served in order as slots come back."""
    pool = PoolShare(pool_size=2, tenant_slots=2)
    held = [await pool.acquire("a", 1.0), await pool.acquire("b", 1.0)]
    with pytest.raises(ProxyBusy, match="every upstream connection"):
        await pool.acquire("a", 0.01)
    assert pool._tenants["a"][0] == 1 and pool._tenants["a"][1].free == 1  # its share slot given back
    got: list[str] = []

    async def take(name: str) -> Callable[[], None]:
        release = await pool.acquire(name, 5.0)
        got.append(name)
        return release

    c, d = asyncio.ensure_future(take("c")), asyncio.ensure_future(take("d"))
    await asyncio.sleep(0.01)
    held[0]()
    release_c = await asyncio.wait_for(c, 1.0)
    assert got == ["c"] and not d.done()
    held[1]()
    release_d = await asyncio.wait_for(d, 1.0)
    assert got == ["c", "d"]
    release_c()
    release_d()
    assert pool._tenants == {} and pool._all.free == 2 and not pool._all.locked()


async def test_waits_that_time_out_or_are_cancelled_leave_the_queue() -> None:
    """A wait for a busy pool that times out (``ProxyBusy``) or is cancelled leaves ``Slots``'
    queue at once: requests refused while streams hold every slot for minutes do not pile up."""
    pool = PoolShare(pool_size=1, tenant_slots=1)
    held = await pool.acquire("a", 1.0)
    for _ in range(50):
        with pytest.raises(ProxyBusy):
            await pool.acquire("b", 0.0)
    cancelled = asyncio.ensure_future(pool.acquire("c", 5.0))
    await asyncio.sleep(0.01)
    assert len(pool._all.waiters) == 1
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert not pool._all.waiters and pool._all.free == 0 and set(pool._tenants) == {"a"}
    held()
    assert pool._all.free == 1 and not pool._all.locked() and pool._tenants == {}


# A wait cancelled (its timeout, a client gone) in the loop step a slot is given back: the
# cancellation or ProxyBusy, not ValueError from the waiters' queue (review of Slots).

async def test_a_wait_cancelled_in_the_step_a_slot_is_given_raises_cancelled() -> None:
    slots = Slots(1)
    assert slots.take_now()
    waiting = asyncio.ensure_future(slots.wait())
    await asyncio.sleep(0)
    waiting.cancel()
    slots.give()  # skips the cancelled waiter: the slot is free again
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert slots.free == 1 and not slots.waiters


async def test_a_pool_wait_timing_out_as_a_slot_comes_back_is_proxy_busy() -> None:
    pool = PoolShare(pool_size=1, tenant_slots=1)
    loop = asyncio.get_running_loop()
    held = await pool.acquire("a", 1.0)
    waiting = asyncio.ensure_future(pool.acquire("b", 0.05))
    await asyncio.sleep(0)
    timer = next(h for h in loop._scheduled if not h.cancelled())  # type: ignore[attr-defined]  # the wait's timeout
    loop.call_at(timer.when(), held)  # a stream ends in the same step as the timeout fires
    with pytest.raises(ProxyBusy):
        await waiting
    assert pool._all.free == 1 and not pool._all.waiters and pool._tenants == {}
