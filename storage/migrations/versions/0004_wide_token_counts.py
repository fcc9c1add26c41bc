"""Token counts as 64-bit integers.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02

A client's ``max_tokens`` of 3,000,000,000 overflowed PostgreSQL's 32-bit ``INTEGER`` token
columns and failed the end-of-request write, the client's messages with it (issue 16, item 11).
The token columns become ``BIGINT`` on PostgreSQL: ``requests.tokens_client`` and
``tokens_forwarded``, ``events.tokens_before`` and ``tokens_after``,
``learned_limits.context_window_tokens``. Storage also bounds what it writes there
(``storage.values.TOKENS_MAX``). On SQLite an ``INTEGER`` column already holds 64 bits: nothing
changes (``storage.columns.BigCount`` is ``INTEGER`` there). Rows are kept as they are; widening
rewrites each table on PostgreSQL (under its lock, once). The downgrade narrows them back and
fails if a stored value no longer fits.

Text columns now escape what no column could store (``storage.values.escape_text``: NUL, lone
surrogates), marking an escaped value with a leading U+0010. A value stored before, holding
U+0010, would read back wrong (or be missed by a lookup, which binds the escaped form): every
such value of every escaped column (``TEXT_COLUMNS``) is rewritten escaped, on both databases,
in batches of ``BATCH`` rows. On SQLite, ``artifacts.content`` may be zlib data (a BLOB): those
values are decompressed to look, and an escaped one is written back as plain text (valid: the
column reads either). The downgrade leaves them escaped (escaping is one-way on PostgreSQL, which
cannot hold a NUL).
"""

from __future__ import annotations

import zlib

import sqlalchemy as sa
from alembic import op

from storage.values import ESCAPE, escape_text

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

COLUMNS = (
    ("requests", "tokens_client", True),
    ("requests", "tokens_forwarded", True),
    ("events", "tokens_before", False),
    ("events", "tokens_after", False),
    ("learned_limits", "context_window_tokens", True),
)
"""``(table, column, nullable)`` of each widened column."""


TEXT_COLUMNS = {
    "sessions": (("pk",), ("session_id", "tenant")),
    "messages": (("id",), ("role",)),
    "events": (("id",), ("id", "kind")),
    "artifacts": (("tenant", "id"), ("tenant", "id", "media_type", "content")),
    "requests": (("id",), ("id", "model", "error", "finish_reason")),
    "learned_limits": (("tenant", "upstream", "model"), ("tenant", "upstream", "model", "source")),
}
"""``table: (primary key columns, escaped text columns)`` (``SafeText`` and ``PackedText`` in
``storage.tables``)."""

BATCH = 500
"""Rows read and rewritten per statement by the escape step."""


def upgrade() -> None:
    bind = op.get_bind()
    for table, (key, columns) in TEXT_COLUMNS.items():
        for column in columns:
            _escape_column(bind, table, key, column)
    if bind.dialect.name != "postgresql":
        return
    for table, column, nullable in COLUMNS:
        op.alter_column(table, column, type_=sa.BigInteger, existing_type=sa.Integer, existing_nullable=nullable)


def _escape_column(bind: sa.Connection, name: str, key: tuple[str, ...], column: str) -> None:
    """Rewrite escaped each value of ``name.column`` holding ``ESCAPE`` (key by key, in batches;
    the keys are read first, before a key column's own values change)."""
    t = sa.table(name, *(sa.column(c, sa.BigInteger if c in ("pk", "id") and name in ("sessions", "messages") else sa.Text)
                         for c in dict.fromkeys((*key, column))))
    value = t.c[column]
    sqlite_blobs = bind.dialect.name == "sqlite" and column == "content"
    if sqlite_blobs:  # zlib data: its text is looked at in Python
        found = sa.or_(sa.func.typeof(value) == "blob", sa.func.instr(value, ESCAPE) > 0)
    else:
        found = sa.func.strpos(value, ESCAPE) > 0 if bind.dialect.name == "postgresql" else sa.func.instr(value, ESCAPE) > 0
    keys = [tuple(row) for row in bind.execute(sa.select(*(t.c[k] for k in key)).where(found))]
    match = sa.and_(*(t.c[k] == sa.bindparam(f"k_{k}") for k in key))
    for i in range(0, len(keys), BATCH):
        batch = keys[i : i + BATCH]
        rows = bind.execute(sa.select(*(t.c[k] for k in key), value).where(
            sa.tuple_(*(t.c[k] for k in key)).in_(batch) if len(key) > 1 else t.c[key[0]].in_([k[0] for k in batch])))
        updates = []
        for row in rows:
            stored = row[-1]
            text = zlib.decompress(stored).decode() if isinstance(stored, bytes | bytearray | memoryview) else stored
            if text is None or ESCAPE not in text:
                continue
            updates.append({**{f"k_{k}": v for k, v in zip(key, row[:-1], strict=True)}, "v": escape_text(text)})
        if updates:
            bind.execute(sa.update(t).where(match).values({column: sa.bindparam("v")}), updates)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column, nullable in COLUMNS:
        op.alter_column(table, column, type_=sa.Integer, existing_type=sa.BigInteger, existing_nullable=nullable)
