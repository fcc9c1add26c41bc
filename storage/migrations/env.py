"""Alembic environment of context-proxy.

Run by ``storage.migrate.upgrade``, which passes an open synchronous connection (from the async
engine's ``run_sync``) in ``config.attributes["connection"]``. Without one (alembic's own CLI with
``-x`` nothing), the URL in ``sqlalchemy.url`` is opened with the async engine.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from storage.engine import create_engine
from storage.tables import metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


async def _run_from_url(url: str) -> None:
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif (connection := config.attributes.get("connection")) is not None:
    _run(connection)
else:
    asyncio.run(_run_from_url(config.get_main_option("sqlalchemy.url") or ""))
