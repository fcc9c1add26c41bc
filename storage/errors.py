"""Storage's exception tree. Nothing above ``storage`` sees SQLAlchemy's or a driver's errors.

- ``StorageError``: any failure of a storage operation (constraint violated, bad data, SQL error).
- ``StorageUnavailable(StorageError)``: the database cannot be reached (connection refused or
  lost, pool exhausted, timeout). The proxy answers ``/readyz`` and writes with this in mind.
- ``InvalidCursor(StorageError)``: a keyset-pagination cursor (``after``) names no row the caller
  may see; a read route answers it with 400.
"""

from __future__ import annotations

import asyncpg
from sqlalchemy import exc as sa_exc


class StorageError(Exception):
    """A storage operation failed; ``__cause__`` holds the original SQLAlchemy/driver error."""


class StorageUnavailable(StorageError):
    """The database is unreachable (connect failure, lost connection, pool timeout)."""


class InvalidCursor(StorageError):
    """A pagination cursor (``after``) does not name a row visible to the caller."""


FOREIGN_ERRORS: tuple[type[BaseException], ...] = (
    sa_exc.SQLAlchemyError,
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
)
"""The library errors storage translates: SQLAlchemy's, the OS's, and asyncpg's own (asyncpg
raises its exceptions unwrapped while connecting: wrong password, unknown database)."""


_SCHEMA_WORDS = ("no such table", "no such column", "syntax error", "does not exist")


def translate_error(exc: BaseException, operation: str) -> StorageError:
    """Map a foreign error from ``operation`` to ``StorageUnavailable`` or ``StorageError``.

    Unavailable: OS-level failures (refused, reset, timeouts), the pool's timeout, a connection
    SQLAlchemy marked invalid, asyncpg errors while connecting (bad password, unknown database), driver interface errors and ``OperationalError``s that are not
    schema problems (SQLite's "database is locked" past the busy timeout, "unable to open").
    Everything else (integrity, programming, data errors) is a ``StorageError``.
    The caller raises the result ``from exc``.
    """
    message = f"{operation}: {type(exc).__name__}: {exc}".splitlines()[0][:500]
    if isinstance(exc, OSError | sa_exc.TimeoutError | sa_exc.DisconnectionError | asyncpg.InterfaceError):
        return StorageUnavailable(message)
    if isinstance(exc, asyncpg.PostgresError):  # unwrapped: raised while connecting
        return StorageUnavailable(message)
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated or isinstance(exc, sa_exc.InterfaceError):
            return StorageUnavailable(message)
        if isinstance(exc, sa_exc.OperationalError) and not any(w in str(exc) for w in _SCHEMA_WORDS):
            return StorageUnavailable(message)
    return StorageError(message)
