"""proxy/server/process.py: the garbage collector is tuned by the serving process, once its app
started, never by ``create_app`` or the app's lifespan (tests build many apps in one process)."""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from proxy.app import create_app
from proxy.server import process
from proxy.settings import Settings


@pytest.fixture
def gc_state() -> Iterator[None]:
    threshold = gc.get_threshold()
    gc.set_threshold(700, *threshold[1:])
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


async def test_the_app_and_its_lifespan_leave_the_collector_alone(gc_state: None, tmp_path: Path) -> None:
    gc.unfreeze()
    app = create_app(Settings(upstream_url="http://127.0.0.1:9/v1", database_url=f"sqlite:///{tmp_path / 'p.db'}",
                              gc_young_threshold=12_345))
    async with app.router.lifespan_context(app):
        assert gc.get_threshold()[0] == 700
        assert gc.get_freeze_count() == 0


def test_tune_gc_freezes_and_sets_the_young_threshold(gc_state: None) -> None:
    gc.unfreeze()
    process.tune_gc(12_345)
    assert gc.get_threshold()[0] == 12_345 and gc.get_freeze_count() > 0
    process.tune_gc(0)  # 0 leaves the threshold as it is
    assert gc.get_threshold()[0] == 12_345


async def test_the_server_tunes_the_collector_once_the_app_started(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(process, "tune_gc", calls.append)
    started: list[bool] = []

    async def startup(self: uvicorn.Server, sockets: object = None) -> None:
        self.started = bool(started)  # uvicorn sets it once the lifespan ran and the sockets listen

    monkeypatch.setattr(uvicorn.Server, "startup", startup)
    server = process.ProxyServer(uvicorn.Config(app=lambda *a: None), gc_young_threshold=9_000)
    await server.startup()
    assert calls == []  # the app did not start: nothing tuned
    started.append(True)
    await server.startup()
    assert calls == [9_000]


async def test_the_main_loop_ticks_with_the_date_header_work_at_every_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tick gets a counter uvicorn's ``on_tick`` refreshes the ``date`` header at (a
    multiple of 10), and the loop ends at the tick after ``should_exit`` is set."""
    monkeypatch.setattr(process, "IDLE_TICK_S", 0.001)
    server = process.ProxyServer(uvicorn.Config(app=lambda *a: None), gc_young_threshold=0)
    counters: list[int] = []

    async def on_tick(counter: int) -> bool:
        counters.append(counter)
        if len(counters) == 4:
            server.should_exit = True
        return server.should_exit

    monkeypatch.setattr(server, "on_tick", on_tick)
    await asyncio.wait_for(server.main_loop(), 10)
    assert counters == [0, 10, 20, 30]


async def test_a_signal_wakes_the_main_loop_before_its_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a tick of an hour, the loop ends only because ``handle_exit`` (uvicorn's signal
    handler) woke it."""
    monkeypatch.setattr(process, "IDLE_TICK_S", 3600.0)
    server = process.ProxyServer(uvicorn.Config(app=lambda *a: None), gc_young_threshold=0)
    loop = asyncio.create_task(server.main_loop())
    await asyncio.sleep(0.05)
    assert not loop.done()
    server.handle_exit(signal.SIGTERM, None)
    await asyncio.wait_for(loop, 10)
    assert server.should_exit
