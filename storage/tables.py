"""SQLAlchemy Core tables of the log, events, artifacts, requests and learned limits.

The schema itself is created by the alembic migrations in ``storage/migrations``; these tables
describe it to queries and must match it (``tests/storage/test_migrate.py`` checks they do).

JSON is stored as text (orjson), so it reads back identically on SQLite and PostgreSQL (key
order and number forms as written). Times are UTC: ``timestamptz`` on PostgreSQL, ISO text on
SQLite; both read back as timezone-aware UTC ``datetime``s.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.types import TypeDecorator

metadata = sa.MetaData()

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
"""64-bit integer keys on PostgreSQL; ``INTEGER`` on SQLite so that it is the autoincrement rowid."""


class JsonText(TypeDecorator[Any]):
    """Any JSON value stored as UTF-8 text written by orjson."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> str | None:
        return None if value is None else orjson.dumps(value).decode()

    def process_result_value(self, value: str | None, dialect: sa.Dialect) -> Any:
        return None if value is None else orjson.loads(value)


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC ``datetime``; naive input is refused (it has no defined zone)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to storage; pass a timezone-aware UTC time")
        value = value.astimezone(UTC)
        # SQLite stores text without a zone: store UTC wall time so text order is time order.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("pk", BigId, primary_key=True, autoincrement=True),
    sa.Column("session_id", sa.Text, nullable=False),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
    sa.UniqueConstraint("tenant", "session_id", name="uq_sessions_tenant_session_id"),
    sa.Index("ix_sessions_updated", "updated_at", "pk"),
    sa.Index("ix_sessions_tenant_updated", "tenant", "updated_at", "pk"),
    sa.Index("ix_sessions_session_id", "session_id"),
    sqlite_autoincrement=True,
)

messages = sa.Table(
    "messages",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("session_pk", BigId, sa.ForeignKey("sessions.pk", ondelete="CASCADE"), nullable=False),
    sa.Column("chain_hash", sa.Text, nullable=False),
    sa.Column("parent_hash", sa.Text, nullable=True),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("message", JsonText, nullable=False),
    sa.Column("internal", sa.Boolean, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.UniqueConstraint("session_pk", "chain_hash", name="uq_messages_session_chain_hash"),
    sa.Index("ix_messages_session_parent", "session_pk", "parent_hash"),
    sa.Index("ix_messages_session_id", "session_pk", "id"),
    sa.Index("ix_messages_session_internal", "session_pk", "internal"),
)

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("session_pk", BigId, sa.ForeignKey("sessions.pk", ondelete="CASCADE"), nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("anchor_hash", sa.Text, nullable=False),
    sa.Column("payload", JsonText, nullable=False),
    sa.Column("tokens_before", sa.Integer, nullable=False),
    sa.Column("tokens_after", sa.Integer, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.UniqueConstraint("session_pk", "kind", "anchor_hash", name="uq_events_session_kind_anchor"),
    sa.Index("ix_events_session_created", "session_pk", "created_at"),
)

artifacts = sa.Table(
    "artifacts",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("session_pk", BigId, sa.ForeignKey("sessions.pk", ondelete="SET NULL"), nullable=True),
    sa.Column("media_type", sa.Text, nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("size_bytes", sa.BigInteger, nullable=False),
    sa.Column("line_count", sa.Integer, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
)

requests = sa.Table(
    "requests",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("session_pk", BigId, sa.ForeignKey("sessions.pk", ondelete="CASCADE"), nullable=False),
    sa.Column("model", sa.Text, nullable=True),
    sa.Column("status", sa.Integer, nullable=False),
    sa.Column("latency_ms", sa.Float, nullable=False),
    sa.Column("stream", sa.Boolean, nullable=False),
    sa.Column("usage", JsonText, nullable=True),
    sa.Column("added_messages", sa.Integer, nullable=False),
    sa.Column("first_added_seq", sa.Integer, nullable=True),
    sa.Column("tokens_client", sa.Integer, nullable=True),
    sa.Column("tokens_forwarded", sa.Integer, nullable=True),
    sa.Column("defenses", JsonText, nullable=False),
    sa.Column("event_ids", JsonText, nullable=False),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("finish_reason", sa.Text, nullable=True),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Index("ix_requests_session_created", "session_pk", "created_at"),
)

learned_limits = sa.Table(
    "learned_limits",
    metadata,
    sa.Column("upstream", sa.Text, primary_key=True),
    sa.Column("model", sa.Text, primary_key=True),
    sa.Column("context_window_tokens", sa.Integer, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
)
