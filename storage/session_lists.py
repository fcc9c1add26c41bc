"""Per-session lists of the read API: the branches (leaves) of a session's message tree, and the
artifacts offloaded from it. Keyset pages as in ``storage.reads``: ``limit + 1`` rows are asked
for, and ``has_more`` reports the extra one."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from storage.errors import InvalidCursor
from storage.reads import branch_leaf, get_message_by_hash, is_leaf, past
from storage.records import ArtifactInfo, BranchRecord
from storage.tables import artifacts, messages


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
        messages.c.session_pk == session_pk, is_leaf(messages)
    )
    if after is not None:
        anchor = await get_message_by_hash(conn, session_pk, after)
        if anchor is None:
            raise InvalidCursor(f"after={after!r} names no message of this session")
        query = query.where(past(messages.c.created_at, messages.c.id, anchor.created_at, anchor.id, newest_first=True))
    query = query.order_by(messages.c.created_at.desc(), messages.c.id.desc()).limit(limit + 1)
    rows = (await conn.execute(query)).all()
    tip = await branch_leaf(conn, session_pk, None)
    newest = None if tip is None else tip.id
    page = [
        BranchRecord(leaf_hash=r.chain_hash, message_count=r.seq + 1, last_activity=r.created_at, newest=r.id == newest)
        for r in rows[:limit]
    ]
    return page, len(rows) > limit


_ARTIFACT_COLUMNS = (artifacts.c.id, artifacts.c.media_type, artifacts.c.size_bytes, artifacts.c.line_count,
                     artifacts.c.message_hash, artifacts.c.created_at)


async def list_artifacts(
    conn: AsyncConnection, session_pk: int, limit: int, after: str | None
) -> tuple[list[ArtifactInfo], bool]:
    """A page of the artifacts the session stored (``artifacts.session_pk``), oldest first (ties:
    lower id first), without their content (sizes as recorded at write time), and ``has_more``.

    ``after`` is the id of the previous page's last artifact, looked up in this session only;
    raises ``InvalidCursor`` if it names none. Artifacts are content-addressed per tenant: one
    that another session of the tenant stored first is listed under that session only.
    """
    query = sa.select(*_ARTIFACT_COLUMNS).where(artifacts.c.session_pk == session_pk)
    if after is not None:
        found = sa.select(artifacts.c.created_at).where(artifacts.c.session_pk == session_pk, artifacts.c.id == after)
        anchor = (await conn.execute(found)).first()
        if anchor is None:
            raise InvalidCursor(f"after={after!r} names no artifact of this session")
        query = query.where(past(artifacts.c.created_at, artifacts.c.id, anchor.created_at, after))
    query = query.order_by(artifacts.c.created_at, artifacts.c.id).limit(limit + 1)
    rows = (await conn.execute(query)).all()
    return [ArtifactInfo(**r._mapping) for r in rows[:limit]], len(rows) > limit
