"""One bind function per column type on SQLite, shared by SQLAlchemy's statements and the driver's.

``storage.tables`` gives each of its column types one SQLite bind (``_OneStepBind.sqlite_bind``);
SQLAlchemy compiles it into its statements and ``storage.sqlite.driver.DriverStatement`` takes the
compiled statement's processors, so the two paths cannot drift apart.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from storage import columns
from storage.columns import UTC_TIME
from storage.sqlite.driver import DriverStatement
from storage.tables import metadata
from storage.values import ESCAPE


def test_every_column_binds_through_the_same_function_on_both_sqlite_paths() -> None:
    dialect = sqlite.dialect(paramstyle="qmark")
    for table in metadata.sorted_tables:
        insert = sa.insert(table)
        compiled = insert.compile(dialect=dialect)
        driver = DriverStatement(insert, dialect)
        names = list(compiled.positiontup or [])
        sqlalchemy_procs = {name: compiled._bind_processors.get(name) for name in names}
        driver_procs = {names[i]: proc for i, proc in driver._processed}
        booleans = {n for n in names if isinstance(compiled.binds[n].type, sa.Boolean)}
        assert driver_procs.keys() == {n for n, p in sqlalchemy_procs.items() if p is not None}, table.name
        assert {n: p for n, p in driver_procs.items() if n not in booleans} == {
            n: p for n, p in sqlalchemy_procs.items() if p is not None and n not in booleans}, table.name
        for name in booleans:  # SQLAlchemy's results, True and False without its two calls
            _assert_binds_as(driver_procs[name], sqlalchemy_procs[name])
        for column in table.columns:
            if hasattr(column.type, "sqlite_bind"):  # ours: one step, not process_bind_param + impl's processor
                proc = column.type.bind_processor(dialect)
                one_step = column.type.sqlite_bind()
                assert proc is one_step or proc.__qualname__ == one_step.__qualname__ == "_sqlite_utc_text.<locals>.bind", column


def test_times_bind_as_sqlalchemys_sqlite_text_and_each_dialect_keeps_its_own_memo() -> None:
    one, two = sqlite.dialect(), sqlite.dialect()
    bind_one, bind_two = UTC_TIME.bind_processor(one), UTC_TIME.bind_processor(two)
    assert bind_one is not None and bind_two is not None and bind_one is not bind_two
    plain = sa.DateTime().dialect_impl(one).bind_processor(one)  # SQLAlchemy's own SQLite DATETIME text
    assert plain is not None
    for when in (datetime(2026, 11, 29, 21, 36, 32, tzinfo=UTC), datetime(2026, 11, 29, 21, 36, 32, 7, tzinfo=UTC),
                 datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone(timedelta(hours=-7))),
                 datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=5, minutes=30))),
                 datetime(2026, 1, 2, 3, 4, 5, 1, tzinfo=UTC), datetime.now(UTC)):
        expected = plain(when.astimezone(UTC).replace(tzinfo=None))
        assert bind_one(when) == expected and bind_one(when) == expected and bind_two(when) == expected
    assert bind_one(None) is None


def test_a_utc_time_binds_by_its_own_text_without_converting_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy's times are UTC ``datetime``s: their text is their own ``str`` without "+00:00"
    (no astimezone or replace), the same text as converted (the test above); others convert."""
    bind = UTC_TIME.bind_processor(sqlite.dialect())
    assert bind is not None

    def converted(value: datetime) -> datetime:
        calls.append(value)
        return value.astimezone(UTC)

    calls: list[datetime] = []
    monkeypatch.setattr(columns, "_utc", converted)
    assert bind(datetime(2026, 12, 4, 20, 9, 32, 5, tzinfo=UTC)) == "2026-12-04 20:09:32.000005"
    assert bind(datetime(2026, 12, 4, 20, 9, 32, tzinfo=UTC)) == "2026-12-04 20:09:32.000000"
    assert calls == []
    eastern = datetime(2026, 12, 4, 15, 9, 32, tzinfo=timezone(timedelta(hours=-5)))
    assert bind(eastern) == "2026-12-04 20:09:32.000000" and calls == [eastern]


def test_postgresql_binds_as_sqlalchemy_does() -> None:
    """Off SQLite the types bind through ``process_bind_param`` (no compression, aware times)."""
    dialect = postgresql.dialect()
    messages = metadata.tables["messages"]
    artifacts = metadata.tables["artifacts"]
    packed = messages.c.message.type.bind_processor(dialect)
    text = artifacts.c.content.type.bind_processor(dialect)
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    time_proc = UTC_TIME.bind_processor(dialect)
    assert packed is not None and packed({"a": "x" * 1000}) == '{"a":"' + "x" * 1000 + '"}'
    assert text is not None and text("a\x00b") == ESCAPE + "a" + ESCAPE + "0b"
    bound = time_proc(when) if time_proc is not None else UTC_TIME.process_bind_param(when, dialect)
    assert bound == when and bound.tzinfo == UTC


def test_sqlite_binds_blobs_as_bytearrays_that_the_driver_takes_without_adapting() -> None:
    """``sqlite3`` binds an exact ``bytearray`` at once; a ``bytes`` value first goes through its
    adapter lookup (two ``AttributeError``s raised and cleared inside the driver, per value). The
    hashes and compressed values bind as ``bytearray``s holding the same bytes, which SQLite stores
    as the same BLOBs; anything but a lowercase 64-digit hex hash is still refused."""
    import hashlib
    import sqlite3

    dialect = sqlite.dialect(paramstyle="qmark")
    messages = metadata.tables["messages"]
    artifacts = metadata.tables["artifacts"]
    hash_bind = messages.c.chain_hash.type.bind_processor(dialect)
    json_bind = messages.c.message.type.bind_processor(dialect)
    text_bind = artifacts.c.content.type.bind_processor(dialect)
    assert hash_bind is not None and json_bind is not None and text_bind is not None
    h = hashlib.sha256(b"x").hexdigest()
    raw = hash_bind(h)
    assert type(raw) is bytearray and raw == bytes.fromhex(h)
    assert messages.c.chain_hash.type.process_bind_param(h, postgresql.dialect()) == bytes.fromhex(h)
    packed_json, packed_text = json_bind({"a": "x" * 1000}), text_bind("y" * 1000)
    assert type(packed_json) is bytearray and type(packed_text) is bytearray
    assert json_bind({"a": "short"}) == '{"a":"short"}' and text_bind("short") == "short"
    for bad in (h.upper(), h[:62] + "  ", h[:63], " " + h[:63], h + "0", b"\x00" * 32, 5):
        for bind in (hash_bind, lambda v: messages.c.chain_hash.type.process_bind_param(v, postgresql.dialect())):
            try:
                bind(bad)
            except ValueError:
                continue
            raise AssertionError(f"bound {bad!r}")
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (a BLOB, b TEXT)")
    conn.execute("INSERT INTO t VALUES (?, ?)", (raw, packed_json))
    conn.execute("INSERT INTO t VALUES (?, ?)", (bytes(raw), bytes(packed_json)))
    first, second = conn.execute("SELECT a, b, typeof(a), typeof(b) FROM t").fetchall()
    assert first == second and first[2:] == ("blob", "blob")


def test_the_end_write_converts_by_position_exactly_as_by_name() -> None:
    """``SqliteEndWrite.item`` builds the driver's rows by position (``DriverStatement.row_of`` of
    ``storage.rows.request_tuple``), without the dicts of ``record_item``: the same parameters as
    ``DriverStatement.row`` of those dicts, odd values included (counts past the columns, NaN,
    NUL and lone surrogates in text, JSON orjson refuses, a compressed message)."""
    import dataclasses
    import hashlib
    import math

    from sqlalchemy.ext.asyncio import create_async_engine

    from storage.records import NewMessage, RequestRecord
    from storage.rows import record_item
    from storage.sqlite.end_write import SqliteEndWrite
    from storage.store import Store

    class File:
        dialect = sqlite.dialect(paramstyle="qmark")
        batch = None

    store = Store(create_async_engine("sqlite+aiosqlite://"))  # (its statements; no SQLite file, no connection)
    end = SqliteEndWrite(File(), store._bump_session,  # type: ignore[arg-type]
                         store._insert(metadata.tables["messages"]).on_conflict_do_nothing(
                             index_elements=["session_pk", "chain_hash"]), store._insert_request)
    h = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(3)]
    messages = [NewMessage(h[0], None, 0, "user", {"role": "user", "content": "a\x00\ud800" * 200}),
                NewMessage(h[1], h[0], 1, "as\x10sistant", {"role": "assistant", "n": 2**70}, internal=True)]
    base = RequestRecord(id="req_\x00", session_pk=7, model="m\ud800", status=200, latency_ms=1.5, stream=True,
                         usage={"prompt_tokens": 3, "big": 2**65}, added_messages=1, first_added_seq=0,
                         tokens_client=10, tokens_forwarded=9, defenses=["truncate"], event_ids=["evt_1"],
                         error="e\x00", finish_reason="stop", overflow_retries=1)
    now = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    records = [base, dataclasses.replace(base, status=2**40, latency_ms=math.nan, tokens_client=2**50,
                                         added_messages=math.inf, first_added_seq=None, overflow_retries=None,
                                         usage=None, created_at=now - timedelta(seconds=1), error=None)]
    for record in records:
        for client_rows in (None, 1):
            _, rows, values, _, seqs = record_item(7, messages, record, now, client_rows)
            _, by_position, request_row, _, seqs_by_position = end.item(7, messages, record, now, client_rows)
            assert seqs == seqs_by_position == (None if client_rows is None else (0,))
            assert by_position == [end._insert_messages.row(r) for r in rows]
            assert request_row == end._insert_request.row(values)
            assert [type(v) for v in request_row] == [type(v) for v in end._insert_request.row(values)]
            end._insert_request.put(request_row, "first_added_seq", 4)  # (set once the write counted)
            assert request_row == end._insert_request.row({**values, "first_added_seq": 4})


def test_none_binds_through_a_registered_adapter_as_null() -> None:
    """``sqlite3`` looks an adapter up for every ``None`` it binds; without one registered the
    lookup raises and clears two exceptions inside the driver. ``storage.sqlite.driver`` registers
    one (``None`` to ``None``): found at once, and ``None`` is still stored as NULL."""
    import sqlite3

    import storage.sqlite.driver  # noqa: F401  (registers it)

    assert sqlite3.adapters.get((type(None), sqlite3.PrepareProtocol)) is not None
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (a, b TEXT, c INTEGER)")
    conn.executemany("INSERT INTO t VALUES (?, ?, ?)", [(None, None, None), (1, "x", None)])
    assert conn.execute("SELECT a, b, c, typeof(a), typeof(b), typeof(c) FROM t").fetchall() == [
        (None, None, None, "null", "null", "null"), (1, "x", None, "integer", "text", "null")]


def test_request_counts_in_range_are_taken_as_is_and_others_clamped_as_by_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """``storage.rows.request_tuple`` keeps a count already as stored (an ``int`` within its column,
    ``None`` where the column takes it) without calling ``_count``, and gives every other value
    to ``_count``: each field is what ``_count`` makes of it, whichever way it went."""
    import dataclasses
    import math

    from storage import rows
    from storage.records import RequestRecord
    from storage.values import COUNT_MAX, TOKENS_MAX

    base = RequestRecord(id="req_1", session_pk=1, model="m", status=200, latency_ms=1.0, stream=False, usage=None,
                         added_messages=0, first_added_seq=None, tokens_client=None, tokens_forwarded=None)
    now = datetime(2026, 1, 2, tzinfo=UTC)
    at = {name: i for i, name in enumerate(rows.REQUEST_ROW_KEYS)}
    fields = {"status": (COUNT_MAX, 0), "added_messages": (COUNT_MAX, 0), "first_added_seq": (COUNT_MAX, None),
              "tokens_client": (TOKENS_MAX, None), "tokens_forwarded": (TOKENS_MAX, None),
              "overflow_retries": (COUNT_MAX, 0)}
    count = rows._count
    calls: list[Any] = []
    monkeypatch.setattr(rows, "_count", lambda value, maximum, default: calls.append(value) or count(value, maximum, default))
    for name, (maximum, default) in fields.items():
        for value in (0, 7, -7, maximum, -maximum, maximum + 1, -maximum - 1, 2**70, None, 2.7, -2.7, math.nan,
                      math.inf, True, "x"):
            calls.clear()
            made = rows.request_tuple(dataclasses.replace(base, **{name: value}), now)
            expected = count(value, maximum, default)
            assert made[at[name]] == expected and type(made[at[name]]) is type(expected), (name, value)
            as_is = (type(value) is int and -maximum <= value <= maximum) or (value is None and default is None)
            assert (value not in calls) if as_is else (value in calls or value != value), (name, value)


def test_utc_times_of_one_second_bind_as_sqlalchemys_text_whatever_came_before() -> None:
    """The UTC time bind reuses the text of the last value's second when the next value is of the
    same second: every value's text is SQLAlchemy's, in any order (same second, the next
    second, the same clock time a minute, day, month or year apart, microseconds 0 and 999,999,
    other zones in between)."""
    import random

    dialect = sqlite.dialect()
    bind = UTC_TIME.bind_processor(dialect)
    plain = sa.DateTime().dialect_impl(dialect).bind_processor(dialect)
    assert bind is not None and plain is not None
    base = datetime(2026, 12, 4, 23, 59, 59, 999_999, tzinfo=UTC)
    times = [base, base.replace(microsecond=0), base.replace(microsecond=1), base + timedelta(microseconds=1),
             base.replace(minute=58), base.replace(hour=22), base.replace(day=3), base.replace(month=11),
             base.replace(year=2025), base.replace(year=999), base.astimezone(timezone(timedelta(hours=2))), base,
             datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 0, 0, 5, tzinfo=UTC)]
    rng = random.Random(7)
    times += [base - timedelta(microseconds=rng.randrange(3_000_000)) for _ in range(300)]
    for when in times:
        assert bind(when) == plain(when.astimezone(UTC).replace(tzinfo=None)), when
    # the reuse is taken: a value of the last one's second gets its text from that one's
    (cell,) = [c for c in bind.__closure__ or () if isinstance(c.cell_contents, tuple)]
    bind(base)
    head = cell.cell_contents[3]
    assert bind(base.replace(microsecond=5)) == "2026-12-04 23:59:59.000005" and cell.cell_contents[3] is head


def _assert_binds_as(fast: Any, process: Any) -> None:
    assert fast is not process and fast.__qualname__ == "_fast_bool.<locals>.bind"
    for value in (True, False, None, 1, 0):
        assert fast(value) == process(value) and type(fast(value)) is type(process(value)), value
    for odd in ("yes", 2, 0.5):  # refused alike (``TypeError``, ``ValueError`` for an int)
        with pytest.raises((TypeError, ValueError)) as slow:
            process(odd)
        with pytest.raises((TypeError, ValueError)) as quick:
            fast(odd)
        assert type(quick.value) is type(slow.value) and str(quick.value) == str(slow.value)


def test_boolean_columns_bind_true_and_false_at_once_as_sqlalchemy_binds_them() -> None:
    """On SQLite (no native booleans) ``DriverStatement`` binds a ``Boolean`` column's ``True`` and
    ``False`` as ``1`` and ``0`` itself (the fast path: no call of SQLAlchemy's processor, whose
    result for every value it is, errors included); with native booleans, SQLAlchemy's own."""
    from storage.tables import messages, requests

    dialect = sqlite.dialect(paramstyle="qmark")
    for table, column in ((messages, "internal"), (requests, "stream")):
        insert = sa.insert(table)
        compiled = insert.compile(dialect=dialect)
        names = list(compiled.positiontup or [])
        fast = {names[i]: proc for i, proc in DriverStatement(insert, dialect)._processed}[column]
        process = compiled._bind_processors[column]
        calls: list[Any] = []

        def counted(value: Any, process: Any = process, calls: list[Any] = calls) -> Any:
            calls.append(value)
            return process(value)

        from storage.sqlite.driver import _fast_bool
        watched = _fast_bool(counted, dialect)
        assert watched is not None and (watched(True), watched(False)) == (1, 0) and calls == []  # taken
        assert watched(None) is None and calls == [None]  # the rest: SQLAlchemy's
        _assert_binds_as(fast, process)
    native = sqlite.dialect(paramstyle="qmark")
    native.supports_native_boolean = True
    from storage.sqlite.driver import _fast_bool
    assert _fast_bool(process, native) is process
