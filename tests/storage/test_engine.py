"""URL translation and engine set-up (storage/engine.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from storage.engine import create_engine, is_sqlite, make_async_url
from storage.errors import StorageError


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("sqlite:///./context-proxy.db", "sqlite+aiosqlite:///./context-proxy.db"),
        ("sqlite:////var/lib/cp/db.sqlite", "sqlite+aiosqlite:////var/lib/cp/db.sqlite"),
        ("sqlite://", "sqlite+aiosqlite://"),
        ("sqlite:///:memory:", "sqlite+aiosqlite:///:memory:"),
        ("sqlite+pysqlite:///x.db", "sqlite+aiosqlite:///x.db"),
        ("postgresql://u:p@db:5432/cp", "postgresql+asyncpg://u:p@db:5432/cp"),
        ("postgres://u:p@db/cp", "postgresql+asyncpg://u:p@db/cp"),
        ("postgresql+psycopg2://u@db/cp", "postgresql+asyncpg://u@db/cp"),
        ("postgresql://u@db/cp?sslmode=require", "postgresql+asyncpg://u@db/cp?ssl=require"),
        ("postgresql://u@db/cp?connect_timeout=5&application_name=x", "postgresql+asyncpg://u@db/cp?timeout=5"),
        ("postgresql://u:p%40ss@db/cp", "postgresql+asyncpg://u:p%40ss@db/cp"),
        # already async: untouched
        ("sqlite+aiosqlite:///x.db", "sqlite+aiosqlite:///x.db"),
        ("postgresql+asyncpg://u@db/cp?sslmode=require", "postgresql+asyncpg://u@db/cp?sslmode=require"),
        ("postgresql+psycopg://u@db/cp", "postgresql+psycopg://u@db/cp"),
    ],
)
def test_make_async_url(given: str, expected: str) -> None:
    assert make_async_url(given) == expected


@pytest.mark.parametrize("given", ["mysql://u@db/cp", "not a url", "oracle://x"])
def test_make_async_url_refuses_other_databases(given: str) -> None:
    with pytest.raises(StorageError):
        make_async_url(given)


def test_is_sqlite() -> None:
    assert is_sqlite("sqlite://")
    assert not is_sqlite("postgres://u@h/d")


async def test_sqlite_engine_uses_wal_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "db.sqlite"  # directory created on demand
    engine = create_engine(f"sqlite:///{path}")
    try:
        async with engine.connect() as conn:
            assert (await conn.execute(text("PRAGMA journal_mode"))).scalar() == "wal"
            assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar() == 10_000
            assert (await conn.execute(text("PRAGMA foreign_keys"))).scalar() == 1
    finally:
        await engine.dispose()
    assert path.exists()


async def test_sqlite_memory_engine_shares_one_database() -> None:
    engine = create_engine("sqlite://")
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE t (x INTEGER)"))
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM t"))).scalar() == 0
    finally:
        await engine.dispose()
