"""The column types of ``storage.tables``: how values are stored, one bind function each.

JSON is stored as text (orjson; ``storage.values.dumps_json``), so it reads back identically on
SQLite and PostgreSQL (key order and number forms as written). Text columns (``SafeText``,
``PackedText``) hold any ``str``, NUL and lone surrogates escaped (``storage.values``). Times are
UTC: ``timestamptz`` on PostgreSQL, ISO text on SQLite; both read back as timezone-aware UTC
``datetime``s.

Row layout (revision 0002; issue 7 goal: the tables hold at most 1.2x the unique messages'
bytes). Measured with SQLite's ``dbstat`` after replaying the shared traces, a message row
carried about 160 bytes besides its JSON, 128 of them the two hashes as hex text, and JSON is
about half redundancy (zlib level 1 keeps 0.38-0.53 of each trace's message bytes). So:

- chain hashes (``HexHash``) are stored as their 32 bytes (``BLOB``/``bytea``); Python sees the
  same 64-character lowercase hex ``str`` as before;
- on SQLite, the message JSON, event payloads and artifact contents (``PackedJson``,
  ``PackedText``) are stored zlib-compressed when that is smaller. PostgreSQL already compresses
  values over about 2 kB itself (TOAST), so there they stay plain text.

No SQL filters or measures these values' content except ``storage.retention`` (stored bytes per
tenant), which counts the bytes as stored.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.types import TypeDecorator

from storage.values import ESCAPE, dumps_json, escape_text, loads_json, unescape_text

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
"""64-bit integer keys on PostgreSQL; ``INTEGER`` on SQLite so that it is the autoincrement rowid."""


BigCount = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
"""A 64-bit count (token counts, which sums add up): ``BIGINT`` on PostgreSQL, ``INTEGER`` on
SQLite (already 64-bit there). Revision 0004 widened them from 32 bits."""


T = TypeVar("T")

Bind = Callable[[Any], Any]
"""A column type's bind function on SQLite: the Python value (or ``None``) to what ``sqlite3`` stores."""


class _OneStepBind(TypeDecorator[T]):
    """A column type whose bind on SQLite is one function, ``sqlite_bind()``'s: the value as
    ``sqlite3`` stores it, in one call. SQLAlchemy's statements use it (``bind_processor``) and so
    does ``storage.sqlite.driver.DriverStatement`` (it takes the compiled statement's bind
    processors), so both SQLite paths write the same bytes by construction. It does what
    ``process_bind_param`` and the ``impl`` type's own processor would do, in one step: the two
    wrapped calls were a measurable part of the end-of-request write (cProfile of a batch of 10
    request rows). Other dialects (PostgreSQL) bind as any ``TypeDecorator`` does."""

    cache_ok = True

    def sqlite_bind(self) -> Bind:
        raise NotImplementedError

    def bind_processor(self, dialect: sa.Dialect) -> Bind | None:
        if dialect.name == "sqlite":
            return self.sqlite_bind()  # (cached by SQLAlchemy per dialect and type)
        return super().bind_processor(dialect)


def _escape(value: str | None) -> str | None:
    if value is None or (value.isascii() and "\x00" not in value and ESCAPE not in value):
        return value  # (``escape_text``'s first test, without its call: the usual text)
    return escape_text(value)


def _json_text(value: Any) -> str | None:
    if value is None:
        return None
    if type(value) is list and not value:
        return "[]"  # (a request's defenses and event ids, usually: orjson's text, without the call)
    return dumps_json(value).decode()


class SafeText(_OneStepBind[str]):
    """A ``str`` in a ``TEXT`` column, any ``str``: NUL, U+0010 and lone surrogates are escaped
    reversibly (``storage.values.escape_text``) on both databases, so it reads back as written.
    Comparisons with the column (``column == value``, ``in_``) bind through the same escape."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: sa.Dialect) -> str | None:
        return _escape(value)

    def process_result_value(self, value: str | None, dialect: sa.Dialect) -> str | None:
        return None if value is None else unescape_text(value)

    def sqlite_bind(self) -> Bind:
        return _escape


class JsonText(_OneStepBind[Any]):
    """Any JSON value stored as UTF-8 text written by ``storage.values.dumps_json`` (orjson's,
    or the stdlib's for values orjson refuses)."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> str | None:
        return _json_text(value)

    def process_result_value(self, value: str | None, dialect: sa.Dialect) -> Any:
        return None if value is None else loads_json(value)

    def sqlite_bind(self) -> Bind:
        return _json_text


HASH_HEX_CHARS = 64
"""Length of a chain hash as callers see it: hex SHA-256 (``proxy.conversation.canonical.chain_hash``)."""

_HEX_DIGITS = "0123456789abcdef"


def is_hex_hash(value: object) -> bool:
    """True iff ``value`` is a ``str`` of exactly 64 lowercase hex digits: the only form a
    ``HexHash`` column stores. Callers holding user input (a hash in a URL) check it first: any
    other string names no stored row, and binding it would raise."""
    return isinstance(value, str) and len(value) == HASH_HEX_CHARS and not value.strip(_HEX_DIGITS)


def _hash_bytes(value: str | None) -> bytes | None:
    """The 32 bytes of a chain hash (``None`` as is); ``ValueError`` unless ``is_hex_hash``."""
    return None if value is None else bytes(_hash_raw(value))


def _hash_blob(value: str | None) -> bytearray | None:
    """The 32 bytes of a chain hash as a ``bytearray`` (``None`` as is); ``ValueError`` unless
    ``is_hex_hash``: what SQLite binds (``sqlite3`` passes an exact ``bytearray`` straight to a
    BLOB, while a ``bytes`` value first goes through its adapter lookup, which raises and clears
    two ``AttributeError``s inside the driver: about 3,300 instructions per value, callgrind; the
    BLOB stored is the same). Checked by the hex round trip (``fromhex`` takes uppercase and
    spaces too; its lowercase hex is ``value`` itself only if ``is_hex_hash``), cheaper than
    ``str.strip`` over the digits."""
    return None if value is None else _hash_raw(value)


def _hash_raw(value: str) -> bytearray:
    """``_hash_blob`` of a value that is not ``None``."""
    if isinstance(value, str) and len(value) == HASH_HEX_CHARS:
        try:
            raw = bytearray.fromhex(value)
        except ValueError:
            pass
        else:
            if raw.hex() == value:
                return raw
    raise ValueError(f"not a 64-character lowercase hex hash: {value!r:.80}")


class HexHash(_OneStepBind[str]):
    """A SHA-256 chain hash: a 64-character lowercase hex ``str`` in Python, its 32 bytes in the
    database (``BLOB`` on SQLite, ``bytea`` on PostgreSQL).

    Half the bytes of hex text, in the rows and in the indexes on them (measured: 64 bytes of a
    message row's ~160 bytes of overhead). Binding anything but ``is_hex_hash`` text raises
    ``ValueError`` (wrapped by SQLAlchemy in ``StatementError``): uppercase or short hex would
    otherwise not read back as written.
    """

    impl = sa.LargeBinary
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: sa.Dialect) -> bytes | None:
        return _hash_bytes(value)

    def process_result_value(self, value: bytes | None, dialect: sa.Dialect) -> str | None:
        return None if value is None else bytes(value).hex()

    def sqlite_bind(self) -> Bind:
        """The 32 bytes, a ``bytearray`` (``_hash_blob``; ``LargeBinary``'s own processor would
        wrap them in a ``memoryview``, which ``sqlite3`` stores as the same BLOB)."""
        return _hash_blob


PACK_MIN_BYTES = 256
"""Values shorter than this (bytes of UTF-8) are never compressed: each ``zlib.compress`` call
sets up its whole state first, about 12 us of CPU however short the value (timeit, level 1, the
traces' messages under 1 KiB), and a short value gains little. On the shared traces' 1,267
messages (1.36 MB as JSON) the 435 under 256 bytes would save 12.9 kB together (1% of the bytes,
about 30 bytes each, against a message row's ~160 bytes of overhead). In the proxy under
``tests/benchmarks``' overhead load (concurrency 16, a 215-byte reply logged per request), the
reply's row took 17 us of CPU to build with the threshold at 64 bytes and 9 us at 256."""

PACK_LEVEL = 1
"""zlib level: the fastest. On the traces' messages level 1 keeps 0.45 of the bytes for 0.024 ms
of CPU per kB (decompressing: 0.007 ms per kB); levels 6 and 9 keep 0.43 for 1.2x and 1.6x the
CPU. It runs once per stored value, never per request resent."""


def pack(data: bytes) -> bytes | None:
    """``data`` zlib-compressed (level ``PACK_LEVEL``), or ``None`` when that would not be
    smaller or ``data`` is under ``PACK_MIN_BYTES``."""
    if len(data) < PACK_MIN_BYTES:
        return None
    packed = zlib.compress(data, PACK_LEVEL)
    return packed if len(packed) < len(data) else None


def unpack(value: str | bytes) -> str | bytes:
    """The stored value's UTF-8 text: a ``bytes`` value (SQLite BLOB) is zlib data and is
    decompressed; a ``str`` (TEXT: a short value, a PostgreSQL value, or a row written before
    revision 0002) is returned as is. Raises ``zlib.error`` for a BLOB that is not zlib data."""
    return zlib.decompress(value) if isinstance(value, bytes | bytearray | memoryview) else value


def _packed_json(value: Any) -> str | bytearray | None:
    """JSON text, zlib-compressed when smaller (``pack``): a value as SQLite stores it (the
    compressed bytes as a ``bytearray``, which ``sqlite3`` binds without its adapter lookup:
    ``_hash_blob``)."""
    if value is None:
        return None
    data = dumps_json(value)
    packed = pack(data)
    return data.decode() if packed is None else bytearray(packed)


def _packed_text(value: str | None) -> str | bytearray | None:
    """Escaped text (``escape_text``), zlib-compressed when smaller: a value as SQLite stores it
    (compressed: a ``bytearray``, as ``_packed_json``'s)."""
    if value is None:
        return None
    value = escape_text(value)
    packed = pack(value.encode())
    return value if packed is None else bytearray(packed)


class _Packed(_OneStepBind[Any]):
    """A ``TEXT`` column whose values SQLite may hold compressed.

    The marker is SQLite's storage class: a ``TEXT`` column keeps a bound ``bytes`` value as a
    ``BLOB`` (no affinity conversion), so a BLOB is zlib data and TEXT is plain UTF-8. Rows
    written before revision 0002, and values that did not shrink, are TEXT and read unchanged;
    no migration of old rows is needed. PostgreSQL always gets text (TOAST compresses it).
    """

    impl = sa.Text
    cache_ok = True


class PackedJson(_Packed):
    """Any JSON value written by orjson; on SQLite stored compressed when smaller (``_Packed``)."""

    cache_ok = True  # SQLAlchemy reads it from each class's own namespace

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> str | bytes | None:
        """Not SQLite (``sqlite_bind`` there): plain JSON text."""
        return _json_text(value)

    def process_result_value(self, value: str | bytes | None, dialect: sa.Dialect) -> Any:
        return None if value is None else loads_json(unpack(value))

    def sqlite_bind(self) -> Bind:
        return _packed_json


class PackedText(_Packed):
    """A ``str``, escaped as ``SafeText`` (NUL, lone surrogates); on SQLite stored compressed
    when smaller (``_Packed``: the escaped text is what is compressed)."""

    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: sa.Dialect) -> str | bytes | None:
        """Not SQLite (``sqlite_bind`` there): the escaped text."""
        return _escape(value)

    def sqlite_bind(self) -> Bind:
        return _packed_text

    def process_result_value(self, value: str | bytes | None, dialect: sa.Dialect) -> str | None:
        if value is None:
            return None
        return unescape_text(value if isinstance(value, str) else zlib.decompress(value).decode())


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("naive datetime given to storage; pass a timezone-aware UTC time")
    return value.astimezone(UTC)


_THREE_DIGITS = tuple(f"{i:03d}" for i in range(1000))
"""``000`` to ``999``: a time's microseconds as two of them (``_sqlite_utc_text``)."""


def _sqlite_utc_text() -> Bind:
    """A bind of UTC wall time as the text SQLAlchemy's SQLite ``DATETIME`` writes
    (``2026-11-29 21:36:32.123456``: text order is time order), in one step. It remembers the
    last value it converted (one entry: a request's rows all carry the same ``now``) and the
    text of that value's second, as state of the function, which SQLAlchemy builds and keeps per
    dialect and column type (``UTC_TIME``: one type for every time column). Each of the
    ``Store``'s engines (``storage.engine``) has a dialect of its own, hence its own memo.
    ``test_driver_statements_write_the_same_rows_as_sqlalchemy`` and
    ``test_times_bind_as_sqlalchemys_sqlite_text_and_each_dialect_keeps_its_own_memo`` compare
    the text with the text SQLAlchemy's own ``DATETIME`` writes."""
    last: tuple[Any, ...] = (None, None, None, None)
    """``(value, its text, its second (fields), that second's text up to the ".")``."""

    def bind(value: datetime | None) -> str | None:
        nonlocal last
        if value is None:
            return None
        seen = last  # one tuple, swapped whole (an engine's threads may bind at once)
        if seen[0] is value:
            known: str = seen[1]
            return known
        if value.tzinfo is UTC and type(value) is datetime:
            # a UTC datetime (the proxy's ``now``) is written without the two datetimes of
            # astimezone and replace, and the text of its second is taken from the last value
            # when that was of the same second: ``str`` of a datetime was about 14,000
            # instructions, the six fields and the microseconds' digits about a fifth of that
            # (callgrind)
            second = (value.second, value.minute, value.hour, value.day, value.month, value.year)
            head = seen[3] if second == seen[2] else str(value.replace(microsecond=0))[:-6] + "."
            us = value.microsecond
            text = head + _THREE_DIGITS[us // 1000] + _THREE_DIGITS[us % 1000]
            last = (value, text, second, head)
            return text
        text = str(_utc(value).replace(tzinfo=None))
        if not value.microsecond:  # (str() leaves out microseconds of 0; astimezone keeps them)
            text += ".000000"
        last = (value, text, None, None)
        return text

    return bind


class UtcDateTime(_OneStepBind[datetime]):
    """A timezone-aware UTC ``datetime``; naive input is refused (it has no defined zone)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        """Not SQLite (``sqlite_bind`` there: UTC wall time as text): the aware UTC time."""
        return None if value is None else _utc(value)

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    def sqlite_bind(self) -> Bind:
        return _sqlite_utc_text()


UTC_TIME = UtcDateTime()
"""The one type of every time column (so its SQLite bind, and the memo in it, is shared by them)."""
