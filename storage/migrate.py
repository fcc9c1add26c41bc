"""Apply the alembic migrations programmatically (no ``alembic.ini`` needed at runtime).

Used at start by the proxy and by ``context-proxy db upgrade``. Idempotent: a database already at
``head`` is left unchanged. Safe when several processes start at once: the whole upgrade runs in
one transaction that first takes a lock (PostgreSQL: ``pg_advisory_xact_lock``; SQLite:
``BEGIN IMMEDIATE``, the database's write lock), so a second process waits, then finds the
schema at ``head`` and does nothing. Both databases run DDL transactionally, so a failed upgrade
leaves the schema as it was.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.util.exc import CommandError
from sqlalchemy import text
from sqlalchemy.engine import Connection

from storage.engine import create_engine, make_async_url
from storage.errors import FOREIGN_ERRORS, StorageError, translate_error

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
"""Alembic's script location, shipped as package data of ``storage``."""

ADVISORY_LOCK_KEY = 0x6374_7870_726F_7879 & 0x7FFF_FFFF_FFFF_FFFF
"""The bigint key of the PostgreSQL advisory lock held while migrating ("ctxproxy")."""


def alembic_config(database_url: str) -> Config:
    """An alembic ``Config`` built in code: script location in this package, the async URL."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # configparser interpolates '%': escape it (percent-encoded passwords).
    config.set_main_option("sqlalchemy.url", make_async_url(database_url).replace("%", "%%"))
    return config


async def upgrade(database_url: str, revision: str = "head") -> None:
    """Upgrade the schema of ``database_url`` to ``revision`` (default: the newest).

    Raises ``StorageUnavailable`` if the database cannot be reached and ``StorageError`` if a
    migration fails or the database carries a revision this code does not know (it is newer).
    """
    config = alembic_config(database_url)
    engine = create_engine(database_url, pool_size=1)
    try:
        async with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
            elif conn.dialect.name == "sqlite":
                await conn.exec_driver_sql("BEGIN IMMEDIATE")
            await conn.run_sync(_upgrade, config, revision)
    except CommandError as exc:
        raise StorageError(f"migration failed: {exc}") from exc
    except FOREIGN_ERRORS as exc:
        raise translate_error(exc, "migrate") from exc
    finally:
        await engine.dispose()


def _upgrade(connection: Connection, config: Config, revision: str) -> None:
    config.attributes["connection"] = connection
    command.upgrade(config, revision)
