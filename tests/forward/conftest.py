"""Fixtures of the pipeline's parts: ``log``, a ``SessionLog`` on a fresh store of each database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from proxy.forward.session_log import SessionLog
from storage.store import Store


@pytest.fixture
async def log(database_url: str) -> AsyncIterator[SessionLog]:
    store = await Store.open(database_url, pool_size=2)
    try:
        yield SessionLog(store)
    finally:
        await store.close()
