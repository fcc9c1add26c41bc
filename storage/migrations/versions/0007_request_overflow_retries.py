"""How many times a request was sent again after the provider's overflow.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04

The web viewer (issue 20) shows a session's overflow recoveries per request; the response header
``x-context-proxy-overflow-retries`` said it, the request record did not. ``requests.overflow_retries``
holds it (0 to ``max_overflow_retries``). Older rows, and rows an older replica inserts during a
rolling upgrade, read 0 (the column's default): "none recorded". The downgrade drops the column in
place (``ALTER TABLE ... DROP COLUMN``; SQLite 3.35 or newer), never by rebuilding the table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("requests", sa.Column("overflow_retries", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    op.execute("ALTER TABLE requests DROP COLUMN overflow_retries")
