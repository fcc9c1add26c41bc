"""A session's log operations in one process run in the order they were started
(``storage.session_order``), on SQLite and PostgreSQL: a read sees the writes started before it,
and a message two writes carry is stored as the first sent it. Without the order, on PostgreSQL a
client's next request (its moved cache breakpoints, an SDK's ``null`` fields) sometimes stored its
form of a message the previous request's write was still storing (``tests/e2e/test_messages_log``
failed about once in ten runs)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.conversation.canonical import digests_and_chain
from storage import session_order
from storage.errors import StorageError
from storage.records import NewMessage
from storage.session_order import SessionOrder
from storage.store import Store
from tests.storage.test_added_counts_alone import _record
from tests.storage.test_store import T0, chain, conversation


def _as(entry: NewMessage, message: dict[str, Any]) -> NewMessage:
    """``entry`` carrying another form of its message (same chain hash: the log's identity)."""
    return NewMessage(entry.chain_hash, entry.parent_hash, entry.seq, entry.role, message)


async def test_a_read_sees_the_writes_started_before_it(store: Store) -> None:
    for round_ in range(5):
        session = await store.get_or_create_session("t", f"ryw{round_}", T0)
        log = chain(conversation(8, f"r{round_}"))
        write = store.append_and_record(session.pk, log, _record(f"req_{round_}", session.pk), T0, client_rows=8)
        assert await store.stored_prefix_len(session.pk, [e.chain_hash for e in log]) == len(log)
        assert await write == len(log)


async def test_a_message_two_writes_carry_is_stored_as_the_first_sent_it(store: Store) -> None:
    for round_ in range(5):
        session = await store.get_or_create_session("t", f"first{round_}", T0)
        log = chain(conversation(4, f"f{round_}"))
        first = {**log[1].message, "content": [{"type": "text", "text": log[1].message["content"],
                                                 "cache_control": {"type": "ephemeral"}}]}
        write = store.append_and_record(session.pk, [log[0], _as(log[1], first)], _record(f"r{round_}", session.pk),
                                        T0, client_rows=2)
        added = await store.append_new_messages(session.pk, log, T0)  # the next request's, started after
        assert await write == 2 and len(added) == 2  # (its own two; the first two were the first write's)
        stored = await store.get_message_by_hash(session.pk, log[1].chain_hash)
        assert stored is not None and stored.message == first


async def test_sessions_are_ordered_apart(store: Store) -> None:
    """Another session's write does not wait (nor is waited for)."""
    a = await store.get_or_create_session("t", "apart-a", T0)
    b = await store.get_or_create_session("t", "apart-b", T0)
    log_a, log_b = chain(conversation(3, "a")), chain(conversation(3, "b"))
    write = store.append_and_record(a.pk, log_a, _record("req_a", a.pk), T0)
    assert await store.append_messages(b.pk, log_b, T0) == 3
    assert await write == 3


def test_the_digests_match() -> None:  # (the helpers above build one branch from the root)
    log = chain(conversation(3))
    assert [e.chain_hash for e in log] == digests_and_chain([e.message for e in log])[1]


async def test_an_operation_waits_for_every_one_started_before_it() -> None:
    order = SessionOrder()
    ran: list[str] = []
    gates = {name: asyncio.Event() for name in "abc"}

    async def op(name: str) -> None:
        before, mine = order.enter(7)
        try:
            await order.wait(before)
            ran.append(name)
            await gates[name].wait()
        finally:
            order.leave(before, mine)

    tasks = [asyncio.create_task(op(n)) for n in "abc"]
    await asyncio.sleep(0)
    assert ran == ["a"] and len(order) == 1
    tasks[1].cancel()  # b gives up while waiting for a: c must still wait for a
    await asyncio.sleep(0.01)
    assert ran == ["a"]
    gates["a"].set()
    await asyncio.sleep(0.01)
    assert ran == ["a", "c"] and tasks[1].cancelled()
    gates["c"].set()
    await asyncio.gather(tasks[0], tasks[2])
    assert len(order) == 0  # (bounded by the operations in flight)


async def test_a_write_cancelled_before_it_starts_lets_the_next_run(store: Store) -> None:
    """(On PostgreSQL the write's task leaves the order from its done callback: cancelled before
    its first step, none of its code runs.)"""
    session = await store.get_or_create_session("t", "cancelled", T0)
    log = chain(conversation(4, "c"))
    write = store.append_and_record(session.pk, log[:2], _record("req_c1", session.pk), T0)
    write.cancel()  # before its first step (a SQLite file's queued write commits all the same)
    stored = await asyncio.wait_for(store.stored_prefix_len(session.pk, [e.chain_hash for e in log]), 10)
    assert stored == (2 if store._order is None else 0)
    assert await store.append_messages(session.pk, log, T0) == 4 - stored


async def _held(store: Store, session_pk: int, gate: asyncio.Event, started: list[str], name: str) -> None:
    """An operation of the session in the order (``Store._in_order``) that runs until ``gate`` is set."""

    async def op() -> None:
        started.append(name)
        await gate.wait()

    await store._in_order(session_pk, op)


async def test_each_operation_waits_for_one_started_before_it_still_running(store: Store) -> None:
    """The read, the append and the end-of-request write each wait (a SQLite file orders its own:
    they run at once there). Each of the three waits removed fails this, as does the write's task
    registering only once it runs."""
    session = await store.get_or_create_session("t", "held", T0)
    log = chain(conversation(6, "h"))
    ordered = store._order is not None
    started: list[str] = []
    gate = asyncio.Event()
    held = asyncio.create_task(_held(store, session.pk, gate, started, "held"))
    await asyncio.sleep(0)
    assert started == ["held"]
    hashes = [e.chain_hash for e in log]
    ops: list[asyncio.Future[Any]] = [asyncio.ensure_future(store.stored_prefix_len(session.pk, hashes))]
    await asyncio.sleep(0)  # (a coroutine takes its place in the order as it starts to run)
    ops.append(asyncio.ensure_future(store.append_new_messages(session.pk, log[:2], T0)))
    await asyncio.sleep(0)
    ops.append(store.append_and_record(session.pk, log[2:4], _record("req_held", session.pk), T0))
    done, _ = await asyncio.wait(ops, timeout=1.0)
    assert len(done) == (0 if ordered else 3)
    gate.set()
    await asyncio.wait_for(held, 10)
    results = await asyncio.wait_for(asyncio.gather(*ops), 10)
    if ordered:
        assert results[0] == 0 and len(results[1]) == 2 and results[2] == 2
    assert len(store._order or ()) == 0


async def test_an_operation_waiting_holds_up_those_started_after_it(store: Store) -> None:
    """An operation is in the order from when it starts, not once it may run: a write started while
    an earlier operation still waits for the first runs after it (here held running), not alongside
    it (fails if ``Store._in_order`` registers only after waiting)."""
    session = await store.get_or_create_session("t", "queued", T0)
    log = chain(conversation(4, "q"))
    started: list[str] = []
    first, second = asyncio.Event(), asyncio.Event()
    held = asyncio.create_task(_held(store, session.pk, first, started, "first"))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(_held(store, session.pk, second, started, "second"))  # waits for the first
    await asyncio.sleep(0)
    write = store.append_and_record(session.pk, log, _record("req_queued", session.pk), T0)
    first.set()
    await asyncio.wait_for(held, 10)
    await asyncio.sleep(0.05)
    assert started == ["first", "second"]
    done, _ = await asyncio.wait([write], timeout=1.0)
    assert not done if store._order is not None else done
    second.set()
    await asyncio.wait_for(waiting, 10)
    assert await asyncio.wait_for(write, 10) == 4


async def test_an_operation_that_failed_lets_the_next_run(store: Store) -> None:
    """(Fails if ``Store._in_order`` leaves only when its operation succeeded: the session would stall.)"""
    session = await store.get_or_create_session("t", "failed", T0)
    log = chain(conversation(2, "x"))

    async def fail() -> None:
        raise StorageError("refused")

    with pytest.raises(StorageError):
        await store._in_order(session.pk, fail)
    assert await asyncio.wait_for(store.append_messages(session.pk, log, T0), 10) == 2
    assert len(store._order or ()) == 0


async def test_an_operation_stuck_holds_up_the_next_for_order_wait_s_at_most(
        store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An earlier operation that does not end (a lock held elsewhere, a connection that does not
    answer) holds a later one of the session up for ``ORDER_WAIT_S``, then it goes on, logged
    (fails without the bound: the read waits as long as the stuck one)."""
    monkeypatch.setattr(session_order, "ORDER_WAIT_S", 0.2)
    session = await store.get_or_create_session("t", "stuck", T0)
    log = chain(conversation(3, "s"))
    gate = asyncio.Event()
    stuck = asyncio.create_task(_held(store, session.pk, gate, [], "stuck"))
    await asyncio.sleep(0)
    read = asyncio.ensure_future(store.stored_prefix_len(session.pk, [e.chain_hash for e in log]))
    done, _ = await asyncio.wait([read], timeout=3.0)
    assert done and read.result() == 0
    if store._order is not None:
        assert "without waiting" in caplog.text
    gate.set()
    await asyncio.wait_for(stuck, 10)
    assert await asyncio.wait_for(store.append_messages(session.pk, log, T0), 10) == 3
