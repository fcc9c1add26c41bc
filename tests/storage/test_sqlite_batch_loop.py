"""``DeferredBatch.defer`` looks the running loop up once per batch (on Python 3.11 each lookup is
a ``getpid`` system call): the writes queued after the first take the loop of the first's future.
The futures, the flush timer and the results are those of a lookup per write (a queue left by a
loop that has ended since: the running loop)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from storage.sqlite import batch as batch_module
from storage.sqlite.batch import DeferredBatch


class _Runner:
    """Runs the batch's function on an in-memory ``sqlite3`` connection."""

    def __init__(self) -> None:
        self.driver = sqlite3.connect(":memory:")
        self.inline = 0

    def commit_driver(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        return fn(self.driver)

    async def run(self, operation: str, fn: Callable[..., Any], *, write: bool, small: bool) -> Any:
        raise AssertionError("not retried")

    def wrote_inline(self) -> None:
        self.inline += 1


def _doubled(driver: sqlite3.Connection, items: list[int]) -> list[int]:
    return [2 * item for item in items]


async def test_defer_looks_the_loop_up_once_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    looked_up: list[asyncio.AbstractEventLoop] = []
    real = asyncio.get_running_loop

    def counting() -> asyncio.AbstractEventLoop:
        looked_up.append(real())
        return looked_up[-1]

    monkeypatch.setattr(batch_module.asyncio, "get_running_loop", counting)
    runner = _Runner()
    batch = DeferredBatch(runner)
    futures = [batch.defer("w", lambda conn: None, batch=_doubled, item=i) for i in range(3)]
    assert len(looked_up) == 1  # the first write's lookup; the others took its future's loop
    loop = real()
    assert all(f.get_loop() is loop for f in futures)
    assert batch._flush_timer is not None  # one timer, on the running loop
    await asyncio.wait_for(asyncio.gather(*futures), 1.0)  # flushed by the timer, as before
    assert [f.result() for f in futures] == [0, 2, 4] and runner.inline == 1
    later = batch.defer("w", lambda conn: None, batch=_doubled, item=5)  # a new batch: looked up again
    assert len(looked_up) == 2 and later.get_loop() is loop
    assert await asyncio.wait_for(later, 1.0) == 10


def test_a_batch_left_queued_by_an_ended_loop_serves_the_next_loop() -> None:
    """A write still queued when its loop ended (a store never closed), then the batch used from a
    new loop: the new write's future is the new loop's, and the flush settles it there (review: the
    first write's ended loop was taken, and the flush raised ``Event loop is closed``)."""
    batch = DeferredBatch(_Runner())

    async def first() -> None:
        batch.defer("w", lambda conn: None, batch=_doubled, item=1)  # the loop ends before the timer

    async def second() -> list[int]:
        got: list[int] = []
        future = batch.defer("w", lambda conn: None, batch=_doubled, item=2)
        assert future.get_loop() is asyncio.get_running_loop()
        future.add_done_callback(lambda f: got.append(f.result()))
        batch.flush()  # what the store's next operation does first
        await asyncio.sleep(0)
        return got

    asyncio.run(first())
    assert asyncio.run(second()) == [4]
