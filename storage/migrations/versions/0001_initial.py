"""Initial schema: sessions, messages (the log), events, artifacts, requests, learned_limits.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

A frozen snapshot: it spells its types out instead of importing ``storage.tables``, so later
changes to the tables need a new revision. JSON columns are text (orjson), times ``timestamptz``
on PostgreSQL (text on SQLite), integer keys 64-bit on PostgreSQL and the rowid on SQLite.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("pk", _ID, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.UniqueConstraint("tenant", "session_id", name="uq_sessions_tenant_session_id"),
        sqlite_autoincrement=True,  # a deleted session's pk is never reused (caches key on it)
    )
    op.create_index("ix_sessions_updated", "sessions", ["updated_at", "pk"])
    op.create_index("ix_sessions_tenant_updated", "sessions", ["tenant", "updated_at", "pk"])
    op.create_index("ix_sessions_session_id", "sessions", ["session_id"])

    op.create_table(
        "messages",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("session_pk", _ID, sa.ForeignKey("sessions.pk", ondelete="CASCADE"), nullable=False),
        sa.Column("chain_hash", sa.Text, nullable=False),
        sa.Column("parent_hash", sa.Text, nullable=True),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("internal", sa.Boolean, nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.UniqueConstraint("session_pk", "chain_hash", name="uq_messages_session_chain_hash"),
    )
    op.create_index("ix_messages_session_parent", "messages", ["session_pk", "parent_hash"])
    op.create_index("ix_messages_session_id", "messages", ["session_pk", "id"])
    op.create_index("ix_messages_session_internal", "messages", ["session_pk", "internal"])

    op.create_table(
        "events",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("session_pk", _ID, sa.ForeignKey("sessions.pk", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("anchor_hash", sa.Text, nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("tokens_before", sa.Integer, nullable=False),
        sa.Column("tokens_after", sa.Integer, nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.UniqueConstraint("session_pk", "kind", "anchor_hash", name="uq_events_session_kind_anchor"),
    )
    op.create_index("ix_events_session_created", "events", ["session_pk", "created_at"])

    op.create_table(
        "artifacts",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("session_pk", _ID, sa.ForeignKey("sessions.pk", ondelete="SET NULL"), nullable=True),
        sa.Column("media_type", sa.Text, nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("line_count", sa.Integer, nullable=False),
        sa.Column("created_at", _TS, nullable=False),
    )

    op.create_table(
        "requests",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("session_pk", _ID, sa.ForeignKey("sessions.pk", ondelete="CASCADE"), nullable=False),
        sa.Column("model", sa.Text, nullable=True),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("latency_ms", sa.Float, nullable=False),
        sa.Column("stream", sa.Boolean, nullable=False),
        sa.Column("usage", sa.Text, nullable=True),
        sa.Column("added_messages", sa.Integer, nullable=False),
        sa.Column("first_added_seq", sa.Integer, nullable=True),
        sa.Column("tokens_client", sa.Integer, nullable=True),
        sa.Column("tokens_forwarded", sa.Integer, nullable=True),
        sa.Column("defenses", sa.Text, nullable=False),
        sa.Column("event_ids", sa.Text, nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("finish_reason", sa.Text, nullable=True),
        sa.Column("created_at", _TS, nullable=False),
    )
    op.create_index("ix_requests_session_created", "requests", ["session_pk", "created_at"])

    op.create_table(
        "learned_limits",
        sa.Column("upstream", sa.Text, primary_key=True),
        sa.Column("model", sa.Text, primary_key=True),
        sa.Column("context_window_tokens", sa.Integer, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
    )


def downgrade() -> None:
    for table in ("learned_limits", "requests", "artifacts", "events", "messages", "sessions"):
        op.drop_table(table)
