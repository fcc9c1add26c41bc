"""The API a session speaks.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

A session's turns are logged in their API's native shape (issue 19): chat completions messages, or
Anthropic Messages turns with their blocks. ``sessions.api`` records which (``chat`` or
``messages``: the proxy's own words, never a client's), set when the session is created. Existing
sessions are chat sessions: the column's default fills them, and fills the rows an older replica
inserts during a rolling upgrade. The downgrade drops the column in place (``ALTER TABLE ... DROP
COLUMN``; SQLite 3.35 or newer), never by rebuilding the table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("api", sa.Text, nullable=False, server_default="chat"))


def downgrade() -> None:
    # in place on both (SQLite has had DROP COLUMN since 3.35): a batch rebuild of ``sessions`` would
    # drop the old table, and its ON DELETE CASCADE every message, event and request with it
    op.execute("ALTER TABLE sessions DROP COLUMN api")
