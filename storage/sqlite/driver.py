"""``DriverStatement``: a SQLAlchemy statement compiled once for SQLite, then run on ``sqlite3`` itself."""

from __future__ import annotations

import operator
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc


def _null(value: None) -> None:
    return None


# ``sqlite3`` binds only exact ``int``, ``float``, ``str`` and ``bytearray`` values at once; any
# other, ``None`` too, first goes through its adapter lookup, which raises and clears two
# ``AttributeError``s inside the driver when no adapter is registered for the type (about 3,300
# instructions per value, callgrind; a request row holds two ``None``s or more). With one
# registered for ``NoneType`` the lookup finds it and ``None`` is bound as before, as NULL. (The
# registry is the module's, for every ``sqlite3`` connection of the process: the same NULL for all.)
sqlite3.register_adapter(type(None), _null)


class DriverStatement:
    """A SQLAlchemy statement compiled once for SQLite, then run on the driver's connection.

    ``execute(conn, values)`` takes the values by bind name (as ``conn.execute`` does; ``row``,
    ``row_of``: the rows of the other calls), converts them with the compiled statement's bind
    processors (the column types' own: ``storage.columns`` gives each of its types one bind
    function on SQLite, the one SQLAlchemy's statements use too), and calls ``sqlite3`` directly
    inside ``conn``'s transaction (``run_on``: a driver connection's). They return the rows
    changed (``executemany``: the sum, so an ``INSERT .. ON CONFLICT DO NOTHING`` counts the rows
    it added). SQLAlchemy's per-execution work (execution
    context, parameter processing, result objects) was about 15% of a small chat request's CPU
    (py-spy, ``tests/benchmarks`` overhead at concurrency 16); this keeps the same SQL and types
    without it. Driver errors are raised as SQLAlchemy's (``OperationalError`` for a locked
    database), as ``conn.execute`` would. Statements with ``RETURNING`` are not supported.
    """

    __slots__ = ("_at", "_from_keys", "_get", "_processed", "sql")

    def __init__(self, statement: sa.Executable, dialect: sa.Dialect, column_keys: Sequence[str] | None = None) -> None:
        """``column_keys``: for an ``INSERT`` without values, the columns given (else all).
        Raises ``ValueError`` for a dialect whose parameters are not positional."""
        compiled = statement.compile(dialect=dialect, column_keys=list(column_keys) if column_keys else None)  # type: ignore[attr-defined]
        if compiled.positiontup is None:
            raise ValueError("DriverStatement needs a positional (qmark) dialect")
        processors: dict[str, Callable[[Any], Any]] = compiled._bind_processors  # (names with a processor)
        self.sql: str = compiled.string
        names = list(compiled.positiontup)
        self._get = operator.itemgetter(*names, *names[:1])  # (a name more: a 1-column row is a tuple too)
        procs = [_fast_bool(processors.get(name), dialect) if isinstance(compiled.binds[name].type, sa.Boolean)
                 else processors.get(name) for name in names]
        self._processed = [(i, proc) for i, proc in enumerate(procs) if proc is not None]
        self._at = {name: (i, procs[i]) for i, name in enumerate(names)}
        """``put``'s: each bind's position in a row and its processor."""
        self._from_keys: Callable[[Sequence[Any]], tuple[Any, ...]] | None = None
        """``row_of``'s reordering: from ``column_keys`` order to the statement's."""
        if column_keys and set(names) <= set(column_keys):
            keys = list(column_keys)
            at = [keys.index(name) for name in names]
            self._from_keys = operator.itemgetter(*at, *at[:1])

    def row(self, values: dict[str, Any]) -> list[Any]:
        """The driver's parameters for ``values`` (by bind name), converted by the column types."""
        row = list(self._get(values))
        row.pop()
        for i, proc in self._processed:
            row[i] = proc(row[i])
        return row

    def row_of(self, values: Sequence[Any]) -> list[Any]:
        """``row`` of ``dict(zip(column_keys, values))``, without the dict: ``values`` in the
        order of the ``column_keys`` the statement was made with (``ValueError`` if it was made
        without them)."""
        if self._from_keys is None:
            raise ValueError("row_of needs a statement made with column_keys naming all its binds")
        row = list(self._from_keys(values))
        row.pop()
        for i, proc in self._processed:
            row[i] = proc(row[i])
        return row

    def put(self, row: list[Any], name: str, value: Any) -> None:
        """Set bind ``name``'s value in ``row`` (made by ``row`` or ``row_of``) to ``value``,
        converted as they convert it. Raises ``KeyError`` for a name the statement does not bind."""
        i, proc = self._at[name]
        row[i] = value if proc is None else proc(value)

    def execute(self, conn: sa.Connection, values: dict[str, Any]) -> int:
        return self.run_on(_driver(conn), False, [self.row(values)])

    def executemany_rows(self, conn: sa.Connection, rows: list[list[Any]]) -> int:
        """``executemany`` of rows already converted by ``row`` or ``row_of``."""
        return self.run_on(_driver(conn), True, rows)

    def execute_row(self, conn: sa.Connection, row: list[Any]) -> int:
        """``execute`` of a row already converted by ``row`` or ``row_of``."""
        return self.run_on(_driver(conn), False, [row])

    def run_on(self, driver: sqlite3.Connection, many: bool, params: list[list[Any]]) -> int:
        """The statement on ``driver`` itself (``sqlite3``; a transaction of the caller's: one
        ``conn``'s, or ``storage.sqlite.file.SqliteFile.commit_driver``'s) with ``params``,
        rows converted by ``row`` or ``row_of`` (``many``: ``executemany``, else the first row).
        Returns the rows changed; driver errors raised as SQLAlchemy's (``DriverStatement``)."""
        try:
            cursor = driver.executemany(self.sql, params) if many else driver.execute(self.sql, params[0])
        except (sqlite3.Error, OverflowError) as exc:  # (sqlite3: an int beyond 64 bits)
            # parameters hidden, as every engine hides them (``storage.engine``): they are message content
            raise sa_exc.DBAPIError.instance(self.sql, params, exc, sqlite3.Error, hide_parameters=True) from exc
        try:
            count: int = cursor.rowcount
            return count
        finally:
            cursor.close()


def _fast_bool(process: Callable[[Any], Any] | None, dialect: sa.Dialect) -> Callable[[Any], Any] | None:
    """A ``Boolean`` column's bind: on a dialect without native booleans (SQLite) ``True`` and
    ``False`` as ``1`` and ``0`` at once, every other value through SQLAlchemy's ``process``
    (``None``; ``1`` and ``0``; what it refuses, with its ``TypeError``). Its ``process`` makes two
    Python calls for them (``_strict_as_bool``, then ``int``): the same results."""
    if process is None or dialect.supports_native_boolean:
        return process

    def bind(value: Any) -> Any:
        if value is True:
            return 1
        if value is False:
            return 0
        return process(value)

    return bind


def _driver(conn: sa.Connection) -> sqlite3.Connection:
    """``conn``'s ``sqlite3`` connection (a SQLite dialect's: its ``dbapi`` is ``sqlite3``)."""
    driver = conn.connection.driver_connection
    assert isinstance(driver, sqlite3.Connection)
    return driver
