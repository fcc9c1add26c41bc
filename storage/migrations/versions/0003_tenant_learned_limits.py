"""Learned limits scoped by tenant, with an estimate ratio, a source and an expiry.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

``learned_limits`` was keyed by ``(upstream, model)``: one tenant's traffic set a window for
every tenant, and it never expired (issue 15). The table is recreated keyed by
``(tenant, upstream, model)`` with ``context_window_tokens`` nullable (a row may hold only the
estimate ratio), ``estimate_ratio``, ``source`` (``overflow`` or ``usage``) and ``expires_at``.

Existing rows are dropped, not converted: they belong to no tenant, and they were learned by the
rules this revision replaces (a window from a single reply's usage, or from text that may have
echoed a client's own strings), so none of them can be trusted. The proxy learns again from the
provider's next overflow error. The downgrade recreates revision 0002's table, empty.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.drop_table("learned_limits")
    op.create_table(
        "learned_limits",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("upstream", sa.Text, primary_key=True),
        sa.Column("model", sa.Text, primary_key=True),
        sa.Column("context_window_tokens", sa.Integer, nullable=True),
        sa.Column("estimate_ratio", sa.Float, nullable=True),
        sa.Column("source", sa.Text, nullable=True),
        sa.Column("updated_at", _TS, nullable=False),
        sa.Column("expires_at", _TS, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("learned_limits")
    op.create_table(
        "learned_limits",
        sa.Column("upstream", sa.Text, primary_key=True),
        sa.Column("model", sa.Text, primary_key=True),
        sa.Column("context_window_tokens", sa.Integer, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
    )
