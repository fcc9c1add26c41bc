"""Per-session lists of the read API: the branches (leaves) of a session's message tree, and the
artifacts offloaded from it. Keyset pages as in ``storage.reads``: ``limit + 1`` rows are asked
for, and ``has_more`` reports the extra one."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from storage.columns import is_hex_hash
from storage.errors import InvalidCursor
from storage.records import BranchRecord
from storage.tables import messages

_children = messages.alias("branch_children")


def _leaf(m: Any) -> sa.ColumnElement[bool]:
    """``m`` has no child in its session (one probe of ``ix_messages_session_parent``)."""
    child = sa.select(sa.literal(1)).where(
        _children.c.session_pk == m.c.session_pk, _children.c.parent_hash == m.c.chain_hash
    )
    return ~sa.exists(child)


async def list_branches(
    conn: AsyncConnection, session_pk: int, limit: int, after: str | None
) -> tuple[list[BranchRecord], bool]:
    """A page of the session's branches, newest activity first (the leaf's ``created_at``, ties:
    higher id first), and ``has_more``.

    ``after`` is the leaf hash of the previous page's last branch; raises ``InvalidCursor`` if it
    names no message of this session (or is not a hex hash). ``newest`` marks the leaf with the
    highest id, the one ``reads.branch_leaf(None)`` picks. A branch grown between two pages moves
    to the front and is not listed again on later pages.
    """
    query = sa.select(messages.c.id, messages.c.chain_hash, messages.c.seq, messages.c.created_at).where(
        messages.c.session_pk == session_pk, _leaf(messages)
    )
    if after is not None:
        anchor = None
        if is_hex_hash(after):
            found = sa.select(messages.c.id, messages.c.created_at).where(
                messages.c.session_pk == session_pk, messages.c.chain_hash == after
            )
            anchor = (await conn.execute(found)).first()
        if anchor is None:
            raise InvalidCursor(f"after={after!r} names no message of this session")
        query = query.where(
            sa.or_(
                messages.c.created_at < anchor.created_at,
                sa.and_(messages.c.created_at == anchor.created_at, messages.c.id < anchor.id),
            )
        )
    query = query.order_by(messages.c.created_at.desc(), messages.c.id.desc()).limit(limit + 1)
    rows = (await conn.execute(query)).all()
    newest_q = (
        sa.select(sa.func.max(messages.c.id)).where(messages.c.session_pk == session_pk, _leaf(messages))
    )
    newest = (await conn.execute(newest_q)).scalar()
    page = [
        BranchRecord(leaf_hash=r.chain_hash, message_count=r.seq + 1, last_activity=r.created_at, newest=r.id == newest)
        for r in rows[:limit]
    ]
    return page, len(rows) > limit
