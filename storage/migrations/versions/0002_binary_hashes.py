"""Chain hashes as 32 bytes instead of 64-character hex text.

Revision ID: 0002
Revises: 0001
Create Date: 2025-06-01

``messages.chain_hash``, ``messages.parent_hash`` and ``events.anchor_hash`` become ``bytea`` on
PostgreSQL and ``BLOB`` on SQLite (``storage.columns.HexHash``; why: the docstring of
``storage.tables``). Existing rows are converted:

- PostgreSQL: one ``ALTER TABLE`` per table, ``USING decode(col, 'hex')`` (one rewrite of the
  table and its indexes);
- SQLite (3.40 has no ``unhex()``): the values are converted in Python, in batches by rowid, then
  the table is rebuilt with the new declared types (alembic's batch mode keeps its constraints,
  indexes and foreign keys; the copy's ``CAST(.. AS BLOB)`` leaves BLOBs unchanged).

The compressed ``PackedJson``/``PackedText`` values need no schema change: the columns stay
``TEXT`` and old rows are plain text, which reads as before. The downgrade turns hashes back to hex
text and, on SQLite, decompresses every compressed value, so revision 0001's code reads them.
Both directions run in the migration's single transaction (``storage.migrate``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

HASHES = {"messages": {"chain_hash": False, "parent_hash": True}, "events": {"anchor_hash": False}}
"""Hash columns per table, with their nullability."""

PACKED = {"messages": "message", "events": "payload", "artifacts": "content"}
"""Columns that SQLite may hold compressed (``storage.columns._Packed``)."""

BATCH_ROWS = 2000
"""Rows converted per round trip on SQLite (bounded memory on large logs)."""


def _rewrite_sqlite(table: str, columns: list[str], convert: Callable[[Any], Any], needs: str) -> None:
    """Set each of ``columns`` to ``convert(value)`` in the rows where a value's ``typeof`` is
    ``needs``, ``BATCH_ROWS`` rows at a time in rowid order; NULLs stay NULL."""
    bind = op.get_bind()
    wanted = " OR ".join(f"typeof({c}) = '{needs}'" for c in columns)
    select = sa.text(f"SELECT rowid, {', '.join(columns)} FROM {table} WHERE rowid > :last AND ({wanted}) "
                     f"ORDER BY rowid LIMIT {BATCH_ROWS}")
    update = sa.text(f"UPDATE {table} SET {', '.join(f'{c} = :{c}' for c in columns)} WHERE rowid = :rowid")
    last = -(2**63)
    while rows := bind.execute(select, {"last": last}).all():
        changes = []
        for row in rows:
            values = dict(zip(columns, row[1:], strict=True))
            changes.append({"rowid": row[0], **{c: None if v is None else convert(v) for c, v in values.items()}})
        bind.execute(update, changes)
        last = rows[-1][0]


def _to_bytes(value: Any) -> Any:
    return bytes.fromhex(value) if isinstance(value, str) else value


def _to_hex(value: Any) -> Any:
    return bytes(value).hex() if isinstance(value, bytes | memoryview) else value


def _unpacked(value: Any) -> Any:
    return zlib.decompress(value).decode() if isinstance(value, bytes | memoryview) else value


def _alter_types(table: str, new: type[sa.types.TypeEngine[Any]], old: type[sa.types.TypeEngine[Any]]) -> None:
    with op.batch_alter_table(table, recreate="always") as batch:
        for column, nullable in HASHES[table].items():
            batch.alter_column(column, type_=new(), existing_type=old(), existing_nullable=nullable)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table, columns in HASHES.items():
            op.execute(f"ALTER TABLE {table} "
                       + ", ".join(f"ALTER COLUMN {c} TYPE bytea USING decode({c}, 'hex')" for c in columns))
        return
    for table, columns in HASHES.items():
        _rewrite_sqlite(table, list(columns), _to_bytes, "text")
        _alter_types(table, sa.LargeBinary, sa.Text)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table, columns in HASHES.items():
            op.execute(f"ALTER TABLE {table} "
                       + ", ".join(f"ALTER COLUMN {c} TYPE text USING encode({c}, 'hex')" for c in columns))
        return
    for table, column in PACKED.items():
        _rewrite_sqlite(table, [column], _unpacked, "blob")
    for table, columns in HASHES.items():
        _rewrite_sqlite(table, list(columns), _to_hex, "blob")
        _alter_types(table, sa.Text, sa.LargeBinary)
