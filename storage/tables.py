"""SQLAlchemy Core tables of the log, events, artifacts, requests and learned limits.

The schema itself is created by the alembic migrations in ``storage/migrations``; these tables
describe it to queries and must match it (``tests/storage/test_migrate.py`` checks they do). Their
column types (how JSON, text, hashes and times are stored, and their one bind function on SQLite)
are ``storage.columns``'.
"""

from __future__ import annotations

import sqlalchemy as sa

from storage.columns import UTC_TIME, BigCount, BigId, HexHash, JsonText, PackedJson, PackedText, SafeText

metadata = sa.MetaData()


sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("pk", BigId, primary_key=True, autoincrement=True),
    sa.Column("session_id", SafeText, nullable=False),
    sa.Column("tenant", SafeText, nullable=False),
    sa.Column("created_at", UTC_TIME, nullable=False),
    sa.Column("updated_at", UTC_TIME, nullable=False),
    sa.Column("api", SafeText, nullable=False, server_default="chat"),  # chat | messages (migration 0005)
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
    sa.Column("chain_hash", HexHash, nullable=False),
    sa.Column("parent_hash", HexHash, nullable=True),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("role", SafeText, nullable=False),
    sa.Column("message", PackedJson, nullable=False),
    sa.Column("internal", sa.Boolean, nullable=False),
    sa.Column("created_at", UTC_TIME, nullable=False),
    sa.UniqueConstraint("session_pk", "chain_hash", name="uq_messages_session_chain_hash"),
    sa.Index("ix_messages_session_parent", "session_pk", "parent_hash"),
    sa.Index("ix_messages_session_id", "session_pk", "id"),
    sa.Index("ix_messages_session_internal", "session_pk", "internal"),
)

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", SafeText, primary_key=True),
    sa.Column("session_pk", BigId, sa.ForeignKey("sessions.pk", ondelete="CASCADE"), nullable=False),
    sa.Column("kind", SafeText, nullable=False),
    sa.Column("anchor_hash", HexHash, nullable=False),
    sa.Column("payload", PackedJson, nullable=False),
    sa.Column("tokens_before", BigCount, nullable=False),
    sa.Column("tokens_after", BigCount, nullable=False),
    sa.Column("created_at", UTC_TIME, nullable=False),
    sa.UniqueConstraint("session_pk", "kind", "anchor_hash", name="uq_events_session_kind_anchor"),
    sa.Index("ix_events_session_created", "session_pk", "created_at"),
)

ARTIFACT_LIST_COLUMNS = ("session_pk", "created_at", "id", "media_type", "size_bytes", "line_count", "message_hash")
"""The columns of a session's artifact list, in the order of its covering index (migration 0006)."""

artifacts = sa.Table(
    "artifacts",
    metadata,
    sa.Column("tenant", SafeText, primary_key=True),
    sa.Column("id", SafeText, primary_key=True),
    sa.Column("session_pk", BigId, sa.ForeignKey("sessions.pk", ondelete="SET NULL"), nullable=True),
    sa.Column("media_type", SafeText, nullable=False),
    sa.Column("content", PackedText, nullable=False),
    sa.Column("size_bytes", sa.BigInteger, nullable=False),
    sa.Column("line_count", sa.Integer, nullable=False),
    sa.Column("created_at", UTC_TIME, nullable=False),
    sa.Column("message_hash", HexHash, nullable=True),  # the message it came from (migration 0006)
    # a session's list reads no content (SQLite stores the sizes after it, in its overflow pages)
    sa.Index("ix_artifacts_session_list", *ARTIFACT_LIST_COLUMNS),
)

requests = sa.Table(
    "requests",
    metadata,
    sa.Column("id", SafeText, primary_key=True),
    sa.Column("session_pk", BigId, sa.ForeignKey("sessions.pk", ondelete="CASCADE"), nullable=False),
    sa.Column("model", SafeText, nullable=True),
    sa.Column("status", sa.Integer, nullable=False),
    sa.Column("latency_ms", sa.Float, nullable=False),
    sa.Column("stream", sa.Boolean, nullable=False),
    sa.Column("usage", JsonText, nullable=True),
    sa.Column("added_messages", sa.Integer, nullable=False),
    sa.Column("first_added_seq", sa.Integer, nullable=True),
    sa.Column("tokens_client", BigCount, nullable=True),
    sa.Column("tokens_forwarded", BigCount, nullable=True),
    sa.Column("defenses", JsonText, nullable=False),
    sa.Column("event_ids", JsonText, nullable=False),
    sa.Column("error", SafeText, nullable=True),
    sa.Column("finish_reason", SafeText, nullable=True),
    sa.Column("created_at", UTC_TIME, nullable=False),
    sa.Column("overflow_retries", sa.Integer, nullable=False, server_default="0"),
    sa.Index("ix_requests_session_created", "session_pk", "created_at"),
)

learned_limits = sa.Table(
    "learned_limits",
    metadata,
    sa.Column("tenant", SafeText, primary_key=True),
    sa.Column("upstream", SafeText, primary_key=True),
    sa.Column("model", SafeText, primary_key=True),
    sa.Column("context_window_tokens", BigCount, nullable=True),
    sa.Column("estimate_ratio", sa.Float, nullable=True),
    sa.Column("source", SafeText, nullable=True),
    sa.Column("updated_at", UTC_TIME, nullable=False),
    sa.Column("expires_at", UTC_TIME, nullable=True),
)

PACKED_COLUMNS = (messages.c.message, events.c.payload, artifacts.c.content)
"""The columns SQLite may hold compressed (``storage.columns.PackedJson``/``PackedText``): raw SQL
that reads them (a dump, a consistency probe) passes each value through ``storage.columns.unpack``."""
