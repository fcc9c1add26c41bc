"""Read-side queries: sessions with their counts, branches of the message tree, keyset pages.

Functions take an open ``AsyncConnection`` and return records; ``Store`` owns connections and
error translation. Pagination is keyset (never OFFSET): a page asks for ``limit + 1`` rows and
reports ``has_more`` when the extra row exists.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from storage.columns import is_hex_hash
from storage.errors import InvalidCursor
from storage.records import MessageRecord, RequestRecord, SessionFilter, SessionRecord, SessionSummary
from storage.tables import events, messages, requests, sessions

_children = messages.alias("children")


def is_leaf(m: sa.Table | Any) -> sa.ColumnElement[bool]:
    """``m`` has no child in its session (no message names it as parent)."""
    child = sa.select(sa.literal(1)).where(
        _children.c.session_pk == m.c.session_pk, _children.c.parent_hash == m.c.chain_hash
    )
    return ~sa.exists(child)


def past(time: sa.ColumnElement[Any], ident: sa.ColumnElement[Any], time_value: Any, ident_value: Any, *,
         newest_first: bool = False) -> sa.ColumnElement[bool]:
    """The rows after a keyset cursor ``(time_value, ident_value)`` in the order ``(time, ident)``:
    ascending, or descending with ``newest_first``."""
    if newest_first:
        return sa.or_(time < time_value, sa.and_(time == time_value, ident < ident_value))
    return sa.or_(time > time_value, sa.and_(time == time_value, ident > ident_value))


def _summary_columns(session_pk: sa.ColumnElement[Any]) -> list[sa.Label[Any]]:
    """Correlated scalar subqueries computing a ``SessionSummary``'s numbers for ``session_pk``."""
    leaf = messages.alias("leaf")
    zero = sa.literal(0)
    return [
        sa.select(sa.func.count()).where(messages.c.session_pk == session_pk).scalar_subquery().label("message_count"),
        sa.select(sa.func.count()).where(requests.c.session_pk == session_pk).scalar_subquery().label("request_count"),
        sa.select(sa.func.count()).where(events.c.session_pk == session_pk).scalar_subquery().label("event_count"),
        sa.select(sa.func.count())
        .select_from(leaf)
        .where(leaf.c.session_pk == session_pk, is_leaf(leaf))
        .scalar_subquery()
        .label("branch_count"),
        sa.select(sa.func.coalesce(sa.func.sum(requests.c.tokens_client), zero))
        .where(requests.c.session_pk == session_pk)
        .scalar_subquery()
        .label("tokens_client_total"),
        sa.select(sa.func.coalesce(sa.func.sum(requests.c.tokens_forwarded), zero))
        .where(requests.c.session_pk == session_pk)
        .scalar_subquery()
        .label("tokens_forwarded_total"),
        sa.select(requests.c.model)
        .where(requests.c.session_pk == session_pk, requests.c.model.is_not(None))
        .order_by(requests.c.created_at.desc(), requests.c.id.desc())
        .limit(1)
        .scalar_subquery()
        .label("last_model"),
    ]


def _summary(row: sa.Row[Any]) -> SessionSummary:
    m = row._mapping
    return SessionSummary(
        session=SessionRecord(
            pk=m["pk"],
            session_id=m["session_id"],
            tenant=m["tenant"],
            created_at=m["created_at"],
            updated_at=m["updated_at"],
            api=m["api"],
        ),
        message_count=int(m["message_count"]),
        request_count=int(m["request_count"]),
        event_count=int(m["event_count"]),
        branch_count=int(m["branch_count"]),
        tokens_client_total=int(m["tokens_client_total"]),
        tokens_forwarded_total=int(m["tokens_forwarded_total"]),
        last_model=m["last_model"],
    )


def _session_where(session_id: str, tenant: str | None) -> sa.Select[Any]:
    query = sa.select(*sessions.c).where(sessions.c.session_id == session_id)
    if tenant is not None:
        query = query.where(sessions.c.tenant == tenant)
    return query.order_by(sessions.c.updated_at.desc(), sessions.c.pk.desc()).limit(1)


async def find_session(conn: AsyncConnection, session_id: str, tenant: str | None) -> SessionRecord | None:
    """The tenant's session named ``session_id``; for ``tenant=None`` (admin) the newest of any tenant.
    An id with a NUL character names nothing (PostgreSQL text cannot hold one; asking would fail)."""
    if "\x00" in session_id:
        return None
    row = (await conn.execute(_session_where(session_id, tenant))).first()
    return None if row is None else SessionRecord(**row._mapping)


def _filtered(query: sa.Select[Any], where: SessionFilter) -> sa.Select[Any]:
    """``query`` (over ``sessions``) keeping the sessions ``where`` names."""
    if where.model is not None:
        used = sa.select(requests.c.id).where(requests.c.session_pk == sessions.c.pk, requests.c.model == where.model)
        query = query.where(used.exists())
    if where.updated_after is not None:
        query = query.where(sessions.c.updated_at >= where.updated_after)
    if where.updated_before is not None:
        query = query.where(sessions.c.updated_at < where.updated_before)
    return query


async def list_sessions(
    conn: AsyncConnection, tenant: str | None, limit: int, after: str | None, after_tenant: str | None = None,
    where: SessionFilter | None = None,
) -> tuple[list[SessionSummary], bool]:
    """A page of sessions, newest ``updated_at`` first (ties: higher pk first), and ``has_more``.

    ``after`` is the ``session_id`` of the last session of the previous page, resolved to its
    ``(updated_at, pk)`` as the caller sees it (``find_session``); ``after_tenant``, if given, is
    that session's tenant (an admin's cursor: several tenants may use one id, and without it the
    newest session of the id is meant). Raises ``InvalidCursor`` if they name no session visible
    to ``tenant``. A session updated between two pages moves to the front and is not listed
    again on later pages. ``where``: only the sessions it names (the cursor need not be one of them).
    """
    query = sa.select(*sessions.c, *_summary_columns(sessions.c.pk))
    if tenant is not None:
        query = query.where(sessions.c.tenant == tenant)
    if where is not None:
        query = _filtered(query, where)
    if after is not None:
        owner = tenant if after_tenant is None else after_tenant
        cursor = None if tenant not in (None, owner) else await find_session(conn, after, owner)
        if cursor is None:
            raise InvalidCursor(f"after={after!r} names no session")
        query = query.where(past(sessions.c.updated_at, sessions.c.pk, cursor.updated_at, cursor.pk, newest_first=True))
    query = query.order_by(sessions.c.updated_at.desc(), sessions.c.pk.desc()).limit(limit + 1)
    rows = (await conn.execute(query)).all()
    return [_summary(r) for r in rows[:limit]], len(rows) > limit


async def session_summary(conn: AsyncConnection, session: SessionRecord) -> SessionSummary:
    """Counts (messages, requests, events, branches = leaf messages), token sums, last model."""
    query = sa.select(*sessions.c, *_summary_columns(sessions.c.pk)).where(sessions.c.pk == session.pk)
    row = (await conn.execute(query)).one()
    return _summary(row)


async def get_message_by_hash(conn: AsyncConnection, session_pk: int, chain_hash: str) -> MessageRecord | None:
    """The message of ``session_pk`` with this chain hash, or ``None``: always for a string that is
    not 64 lowercase hex digits (user input from a URL; the column stores only those, as bytes)."""
    if not is_hex_hash(chain_hash):
        return None
    query = sa.select(*messages.c).where(messages.c.session_pk == session_pk, messages.c.chain_hash == chain_hash)
    row = (await conn.execute(query)).first()
    return None if row is None else MessageRecord(**row._mapping)


async def branch_leaf(conn: AsyncConnection, session_pk: int, leaf_hash: str | None) -> MessageRecord | None:
    """The tip of a branch: the message ``leaf_hash`` if given (``None`` if unknown), otherwise
    the newest leaf (highest id among messages without children); ``None`` for an empty session."""
    if leaf_hash is not None:
        return await get_message_by_hash(conn, session_pk, leaf_hash)
    query = (
        sa.select(*messages.c)
        .where(messages.c.session_pk == session_pk, is_leaf(messages))
        .order_by(messages.c.id.desc())
        .limit(1)
    )
    row = (await conn.execute(query)).first()
    return None if row is None else MessageRecord(**row._mapping)


async def list_branch_messages(
    conn: AsyncConnection, session_pk: int, leaf_hash: str, after_seq: int | None, limit: int
) -> tuple[list[MessageRecord], bool]:
    """Messages from the root to ``leaf_hash`` ordered by ``seq``: those with ``seq > after_seq``,
    at most ``limit``, and ``has_more``. Empty if ``leaf_hash`` is unknown (or not a hex hash).

    A recursive CTE walks ``parent_hash`` up from the leaf (one index probe per message), and
    stops below ``after_seq``, so a page costs the distance from the leaf to the page.
    """
    if not is_hex_hash(leaf_hash):
        return [], False
    floor = -1 if after_seq is None else after_seq
    anchor = sa.select(messages.c.id, messages.c.parent_hash, messages.c.seq).where(
        messages.c.session_pk == session_pk, messages.c.chain_hash == leaf_hash
    )
    branch = anchor.cte("branch", recursive=True)
    parent = messages.alias("parent")
    branch = branch.union_all(
        sa.select(parent.c.id, parent.c.parent_hash, parent.c.seq).where(
            parent.c.session_pk == session_pk,
            parent.c.chain_hash == branch.c.parent_hash,
            branch.c.seq > floor + 1,
        )
    )
    query = (
        sa.select(*messages.c)
        .join(branch, branch.c.id == messages.c.id)
        .where(messages.c.seq > floor)
        .order_by(messages.c.seq)
        .limit(limit + 1)
    )
    rows = (await conn.execute(query)).all()
    return [MessageRecord(**r._mapping) for r in rows[:limit]], len(rows) > limit


def _branch(session_pk: int, leaf_hash: str) -> sa.CTE:
    """Recursive CTE of ``(id, parent_hash, seq)`` from ``leaf_hash`` up to the root."""
    anchor = sa.select(messages.c.id, messages.c.parent_hash, messages.c.seq).where(
        messages.c.session_pk == session_pk, messages.c.chain_hash == leaf_hash
    )
    branch = anchor.cte("branch_ids", recursive=True)
    parent = messages.alias("parent")
    return branch.union_all(
        sa.select(parent.c.id, parent.c.parent_hash, parent.c.seq).where(
            parent.c.session_pk == session_pk, parent.c.chain_hash == branch.c.parent_hash
        )
    )


async def branch_message_ids(conn: AsyncConnection, session_pk: int, leaf_hash: str) -> list[int]:
    """The ids of the messages from the root to ``leaf_hash``, by ``seq`` (empty if unknown): one
    walk of the branch reading three small columns, so a reader can then fetch the messages in
    pages by id (``messages_by_ids``) instead of walking from the leaf for every page."""
    if not is_hex_hash(leaf_hash):
        return []
    branch = _branch(session_pk, leaf_hash)
    rows = await conn.execute(sa.select(branch.c.id).order_by(branch.c.seq))
    return [r[0] for r in rows]


async def messages_by_ids(conn: AsyncConnection, session_pk: int, ids: list[int]) -> list[MessageRecord]:
    """The messages of ``session_pk`` with these ids, by ``seq`` (ids of other sessions name nothing)."""
    if not ids:
        return []
    query = (sa.select(*messages.c).where(messages.c.session_pk == session_pk, messages.c.id.in_(ids))
             .order_by(messages.c.seq))
    return [MessageRecord(**r._mapping) for r in (await conn.execute(query)).all()]


async def list_requests(
    conn: AsyncConnection, session_pk: int, limit: int, after: str | None
) -> tuple[list[RequestRecord], bool]:
    """The session's request records, oldest first (keyset on ``(created_at, id)``), and ``has_more``.

    ``after`` is the id of the last record of the previous page, looked up in this session only
    (so request ids of other sessions or tenants cannot be probed). Raises ``InvalidCursor`` if it
    names no request of the session.
    """
    query = sa.select(*requests.c).where(requests.c.session_pk == session_pk)
    if after is not None:
        found = sa.select(requests.c.created_at).where(requests.c.session_pk == session_pk, requests.c.id == after)
        anchor = None if "\x00" in after else (await conn.execute(found)).first()
        if anchor is None:
            raise InvalidCursor(f"after={after!r} names no request of this session")
        query = query.where(past(requests.c.created_at, requests.c.id, anchor.created_at, after))
    rows = (await conn.execute(query.order_by(requests.c.created_at, requests.c.id).limit(limit + 1))).all()
    return [RequestRecord(**r._mapping) for r in rows[:limit]], len(rows) > limit
