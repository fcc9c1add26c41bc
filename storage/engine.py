"""Database URLs as users write them, and the async engine built from them.

Supported: SQLite through ``aiosqlite`` (the embedded default) and PostgreSQL through ``asyncpg``.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy import create_engine as create_sync_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from storage.errors import StorageError

SQLITE_BUSY_TIMEOUT_MS = 10_000
"""How long a SQLite writer waits for another writer's lock before failing (PRAGMA busy_timeout)."""

_PASS_THROUGH = {("sqlite", "aiosqlite"), ("postgresql", "asyncpg"), ("postgresql", "psycopg")}

# Query parameters of a PostgreSQL URL and what asyncpg calls them (None: keep the name).
# libpq's ``sslmode`` values (disable, allow, prefer, require, verify-ca, verify-full) are
# accepted as is by asyncpg's ``ssl`` argument (asyncpg docs, ``connect(ssl=...)``).
_PG_QUERY = {
    "sslmode": "ssl",
    "ssl": None,
    "connect_timeout": "timeout",
    "timeout": None,
    "command_timeout": None,
    "target_session_attrs": None,
    "passfile": None,
    "host": None,
    "port": None,
    "prepared_statement_cache_size": None,
    "statement_cache_size": None,
}
_PG_NUMERIC = {"timeout": float, "command_timeout": float, "statement_cache_size": int}


def make_async_url(url: str) -> str:
    """Return ``url`` rewritten for an async driver.

    ``sqlite:///PATH``, ``sqlite://`` and ``sqlite:///:memory:`` become ``sqlite+aiosqlite://...``;
    ``postgresql://``, ``postgres://`` (and sync drivers such as ``+psycopg2``) become
    ``postgresql+asyncpg://``. For PostgreSQL, ``sslmode`` becomes asyncpg's ``ssl`` and
    ``connect_timeout`` its ``timeout``; libpq-only parameters asyncpg does not take (for example
    ``application_name``, ``options``) are dropped. URLs already naming ``aiosqlite``, ``asyncpg``
    or ``psycopg`` pass through unchanged. Raises ``StorageError`` for another database.
    """
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StorageError(f"not a database URL: {_redact(url)}") from exc
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    if backend not in ("sqlite", "postgresql"):
        raise StorageError(f"unsupported database {backend!r}: use sqlite:///PATH or postgresql://...")
    if (backend, driver) in _PASS_THROUGH and "+" in parsed.drivername:
        return url
    if backend == "sqlite":  # keep the path verbatim (rendering would escape ':memory:')
        return "sqlite+aiosqlite" + url[url.index("://") :]
    query: dict[str, Any] = {}
    for key, value in parsed.query.items():
        if key in _PG_QUERY:
            query[_PG_QUERY[key] or key] = value
    parsed = parsed.set(drivername="postgresql+asyncpg", query=query)
    return parsed.render_as_string(hide_password=False)


def is_sqlite(url: str) -> bool:
    """True if ``url`` names a SQLite database."""
    return make_url(make_async_url(url)).get_backend_name() == "sqlite"


def create_engine(database_url: str, *, pool_size: int = 20) -> AsyncEngine:
    """Create the async engine for ``database_url`` (any form ``make_async_url`` accepts).

    PostgreSQL: a pool of ``pool_size`` connections plus as many overflow connections, each
    checked with a ping when taken from the pool (one round trip; after a server restart the
    pooled connections are dead, and without it each would fail one request).
    SQLite file: WAL journal (readers never block the writer), ``busy_timeout`` of
    ``SQLITE_BUSY_TIMEOUT_MS`` (concurrent writers wait instead of failing with "database is
    locked"), foreign keys on; the file's directory is created if missing. SQLite in memory:
    one shared connection (each new connection would otherwise see its own empty database).
    Every engine hides statement parameters from its errors (``hide_parameters``): a failed
    insert's message would otherwise quote the stored values, message content included.
    """
    url = make_url(make_async_url(database_url))
    kwargs: dict[str, Any] = {}
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        if database in ("", ":memory:") or "mode=memory" in str(url):
            kwargs.update(poolclass=StaticPool)
        else:
            with contextlib.suppress(OSError):  # if it fails, connecting reports the problem
                Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            kwargs.update(pool_size=pool_size, max_overflow=pool_size)
        engine = create_async_engine(url, hide_parameters=True, **kwargs)
        event.listen(engine.sync_engine, "connect", _sqlite_on_connect)
        return engine
    url, connect_args = _pg_connect_args(url) if url.get_driver_name() == "asyncpg" else (url, {})
    return create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=1800,
        pool_pre_ping=True,  # a server restart leaves every pooled connection dead: test before use
        connect_args=connect_args,
        hide_parameters=True,  # errors never quote the values (message content) they failed on
    )


def create_sqlite_file_engine(database_url: str, *, pool_size: int = 4, inline: bool = False) -> Engine | None:
    """A synchronous engine (stdlib ``sqlite3``) on the same SQLite file, or ``None`` when
    ``database_url`` is not a SQLite file (PostgreSQL, or SQLite in memory: a second engine would
    see another, empty database).

    ``Store`` runs each hot-path transaction whole on a thread of its own with this engine: one
    thread hop per transaction instead of one per statement through ``aiosqlite`` (measured with
    ``tests/benchmarks``: most of the ~1.5 ms of CPU a small transaction cost went to those hops).
    Same pragmas as ``create_engine`` (WAL, busy timeout, foreign keys).

    ``inline``: one connection for transactions run on the event loop's own thread; it never waits
    for a lock (``busy_timeout`` 0: the caller retries on a thread) and never checkpoints the WAL
    itself (``wal_autocheckpoint`` 0: a checkpoint writes and syncs the database file, so
    ``Store`` runs it on its writer thread).
    """
    url = make_url(make_async_url(database_url))
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if database in ("", ":memory:") or "mode=memory" in str(url):
        return None
    with contextlib.suppress(OSError):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    sync_url = url.set(drivername="sqlite+pysqlite")
    if inline:
        engine = create_sync_engine(sync_url, poolclass=StaticPool, connect_args={"check_same_thread": False},
                                    hide_parameters=True)
        event.listen(engine, "connect", _sqlite_on_connect_inline)
        return engine
    engine = create_sync_engine(sync_url, pool_size=pool_size, max_overflow=pool_size,
                                connect_args={"check_same_thread": False}, hide_parameters=True)
    event.listen(engine, "connect", _sqlite_on_connect)
    return engine


def _sqlite_on_connect_inline(dbapi_connection: Any, record: Any) -> None:
    _sqlite_on_connect(dbapi_connection, record)
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA busy_timeout = 0")
    cursor.execute("PRAGMA wal_autocheckpoint = 0")
    cursor.close()


def _pg_connect_args(url: URL) -> tuple[URL, dict[str, Any]]:
    """Move numeric asyncpg arguments out of the query string (they would arrive as strings)."""
    connect_args: dict[str, Any] = {}
    query = dict(url.query)
    for key, cast in _PG_NUMERIC.items():
        if key in query:
            connect_args[key] = cast(query.pop(key))
    return url.set(query=query), connect_args


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    """Per-connection pragmas. WAL is a property of the database file: switch it once, without
    waiting (busy_timeout still 0). Waiting could deadlock: the switch holds a shared lock while it
    asks for an exclusive one, and another connection's committing write waits on that shared
    lock. If another connection holds a lock now, it is switching or writing; a later connection
    switches instead, and this one sees WAL from its next transaction on."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode")
    if str(cursor.fetchone()[0]).lower() != "wal":
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
    cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.close()


def _redact(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparsable URL>"
