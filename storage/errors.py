"""Storage's exception tree. Nothing above ``storage`` sees SQLAlchemy's or a driver's errors.

- ``StorageError``: any failure of a storage operation (constraint violated, bad data, SQL error).
- ``StorageUnavailable(StorageError)``: the database cannot be reached (connection refused or
  lost, pool exhausted, timeout). The proxy answers ``/readyz`` and writes with this in mind.
- ``InvalidCursor(StorageError)``: a keyset-pagination cursor (``after``) names no row the caller
  may see; a read route answers it with 400.
- ``MissingRow(StorageError)``: a write referred to a row that is gone (a foreign key failed:
  retention deleted the session meanwhile); ``proxy.forward.session_log`` opens the session again.

The messages of these errors never quote a value: a driver's or the server's error text may
(asyncpg's "invalid input for query argument $10: <the value>", PostgreSQL's "Key (id)=(...)"),
so a data or integrity error's message names the operation, the error classes and the SQLSTATE
or SQLite error code only; connection failures keep their text (it names hosts, not values).
SQLAlchemy's own text (the statement, ``[parameters: ...]``) stays in ``__cause__``, whose
parameters every engine hides (``storage.engine``); ``proxy.telemetry.logs`` writes no database
error's text unless content logging is on.
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


class MissingRow(StorageError):
    """A foreign key failed: the row written refers to one that is gone (a deleted session)."""


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
    SQLAlchemy marked invalid, asyncpg errors while connecting (bad password, unknown database),
    driver interface errors and ``OperationalError``s that are not
    schema problems (SQLite's "database is locked" past the busy timeout, "unable to open").
    Everything else (integrity, programming, data errors) is a ``StorageError``.
    A value the driver refused (asyncpg's ``DataError``, SQLite's ``OverflowError``) is a
    ``StorageError``, as is a foreign-key failure (``MissingRow``). The message quotes no value
    (module docstring). The caller raises the result ``from exc``.
    """
    full = f"{operation}: {type(exc).__name__}: {exc}".splitlines()[0][:500]
    if _refused_value(exc):
        return StorageError(_withheld(exc, operation))
    if isinstance(exc, OSError | sa_exc.TimeoutError | sa_exc.DisconnectionError | asyncpg.InterfaceError):
        return StorageUnavailable(full)
    if isinstance(exc, asyncpg.PostgresError):  # unwrapped: raised while connecting
        return StorageUnavailable(full)
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated or isinstance(exc, sa_exc.InterfaceError):
            return StorageUnavailable(full)
        if isinstance(exc, sa_exc.OperationalError) and not any(w in str(exc) for w in _SCHEMA_WORDS):
            return StorageUnavailable(full)
        if _sqlstate(exc) == "23503" or "FOREIGN KEY constraint failed" in str(exc.orig):
            return MissingRow(_withheld(exc, operation))
    return StorageError(_withheld(exc, operation))


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its explicit causes (``__cause__``: SQLAlchemy and asyncpg chain with it), at most 8."""
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(out) < 8 and current not in out:
        out.append(current)
        current = current.__cause__
    return out


def _refused_value(exc: BaseException) -> bool:
    """The driver refused a bound value before it reached the server (out of range, wrong type):
    asyncpg's ``DataError`` (an ``InterfaceError`` subclass, so not a lost connection), or a
    Python ``OverflowError``/``ValueError``/``TypeError`` from binding."""
    return any(isinstance(e, asyncpg.DataError | OverflowError | ValueError | TypeError) for e in _chain(exc))


def _sqlstate(exc: BaseException) -> str | None:
    for e in _chain(exc):
        code = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
        if isinstance(code, str):
            return code
    return None


def _withheld(exc: BaseException, operation: str) -> str:
    """``operation``, the classes of ``exc``'s chain, the SQLSTATE or SQLite error name: no value."""
    names = " <- ".join(type(e).__name__ for e in _chain(exc))
    codes = [f"sqlstate {code}"] if (code := _sqlstate(exc)) else []
    codes += [str(n) for e in _chain(exc) if isinstance(n := getattr(e, "sqlite_errorname", None), str)]
    return f"{operation}: {names}" + (f" ({', '.join(codes)})" if codes else "")
