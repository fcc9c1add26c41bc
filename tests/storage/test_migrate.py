"""Alembic migrations applied in code (storage/migrate.py) on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from storage.engine import create_engine
from storage.errors import StorageUnavailable
from storage.migrate import MIGRATIONS_DIR, upgrade
from storage.tables import metadata

TABLES = {"sessions", "messages", "events", "artifacts", "requests", "learned_limits"}


async def _inspect(url: str) -> tuple[set[str], str | None, list[Any]]:
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:

            def look(sync: sa.Connection) -> tuple[set[str], str | None, list[Any]]:
                tables = set(sa.inspect(sync).get_table_names())
                context = MigrationContext.configure(sync, opts={"compare_type": True})
                revision = context.get_current_revision()
                return tables, revision, compare_metadata(context, metadata) if revision else []

            return await conn.run_sync(look)
    finally:
        await engine.dispose()


async def test_upgrade_creates_schema_and_is_idempotent(empty_database_url: str) -> None:
    assert await _inspect(empty_database_url) == (set(), None, [])
    await upgrade(empty_database_url)
    tables, revision, diff = await _inspect(empty_database_url)
    assert TABLES <= tables and revision == "0003"
    assert diff == []  # storage/tables.py describes exactly what the migrations create
    await upgrade(empty_database_url)
    assert await _inspect(empty_database_url) == (tables, "0003", [])


async def test_concurrent_upgrades_both_succeed(empty_database_url: str) -> None:
    await asyncio.gather(*(upgrade(empty_database_url) for _ in range(3)))
    tables, revision, _ = await _inspect(empty_database_url)
    assert TABLES <= tables and revision == "0003"


async def test_upgrade_of_unreachable_database_raises_unavailable() -> None:
    with pytest.raises(StorageUnavailable):
        await upgrade("postgresql://nobody@127.0.0.1:1/none")


def test_migration_scripts_ship_without_alembic_ini() -> None:
    assert (MIGRATIONS_DIR / "env.py").is_file()
    assert (MIGRATIONS_DIR / "versions" / "0001_initial.py").is_file()
