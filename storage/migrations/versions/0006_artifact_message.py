"""The message an artifact was offloaded from.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04

``GET /sessions/{id}/artifacts`` (issue 20) names, for each artifact, the message whose content it
holds. ``artifacts.message_hash`` records that message's chain hash (32 bytes, as the other hash
columns: ``storage.columns.HexHash``), written with the artifact by the proxy that offloads it.
It is NULL for artifacts stored before this revision (and those an older replica stores during a
rolling upgrade): the read API answers ``"message": null`` for them, "not recorded".

The list reads a session's artifacts without their content: the index
``ix_artifacts_session_list`` holds every column it reads (a covering index: SQLite stores
``size_bytes`` and the columns after it behind the content, in its overflow pages, so reading them
from the table would walk every page of the content). The downgrade drops the index, then the
column in place (``ALTER TABLE ... DROP COLUMN``; SQLite 3.35 or newer), never by rebuilding the
table; the recorded messages are lost with it. The upgrade first sets a media type longer than RFC
6838 allows (127 characters) to ``application/octet-stream``: it is indexed now, and PostgreSQL
refuses an index row past 2,704 bytes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


LIST_COLUMNS = ["session_pk", "created_at", "id", "media_type", "size_bytes", "line_count", "message_hash"]
"""``storage.tables.ARTIFACT_LIST_COLUMNS`` as of this revision."""


def upgrade() -> None:
    op.add_column("artifacts", sa.Column("message_hash", sa.LargeBinary, nullable=True))
    # media_type is indexed now: a client-named one past RFC 6838's bound (stored before the proxy
    # bounded it, proxy.conversation.blocks.media_type_of) would make PostgreSQL refuse the index row
    op.execute("UPDATE artifacts SET media_type = 'application/octet-stream' WHERE length(media_type) > 127")
    op.create_index("ix_artifacts_session_list", "artifacts", LIST_COLUMNS)


def downgrade() -> None:
    op.drop_index("ix_artifacts_session_list", table_name="artifacts")
    op.execute("ALTER TABLE artifacts DROP COLUMN message_hash")
