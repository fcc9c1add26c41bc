"""The refused-request write of ``storage.store.Store``: the record, and none of the request's content.

When the provider refuses a client's own key (401/403), the proxy keeps only that request's record
(``proxy.forward.pipeline``); whatever the request itself stored before the answer came is deleted in the
same transaction that writes the record, so none of it is visible once the record is. Only rows
the request's own inserts created count (``RequestWrites``; message ids from its early append):
never rows it found stored, nor rows matched by time, and of its own rows none another request
depends on. A concurrent accepted request of the same session may have found the refused one's
rows stored and used them (same messages, same content-addressed artifacts); these stay:

- a message with a child outside the deleted rows (another request's message or reply built on
  it), and its ancestors;
- an event another request's record applied (``requests.event_ids``);
- the artifacts, when a message of the request stays or another request of the tenant (any of its
  sessions: artifacts are content-addressed per tenant, so another session may have found them
  stored) recorded since they were stored offloaded content too (``OFFLOADING``: it may reference
  them).

A request still in flight that uses a deleted row and is recorded after this write can miss it.
The caller narrows that to requests not yet answered: ``proxy.forward.log_writer`` starts this
write once the log writes pending when the refused request finished have ended (a request
answered first, its record still on its way, is then seen here).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import sqlalchemy as sa

from storage.records import RequestRecord
from storage.tables import artifacts, events, messages, requests, sessions

T = TypeVar("T")

IN_BATCH = 500
"""Ids per ``IN (...)`` list (under every database's bound-parameter limit)."""

OFFLOADING = frozenset({"offload", "media"})
"""Defenses that store artifacts and reference them in the forwarded body."""


@dataclass(slots=True)
class RequestWrites:
    """The rows one request's own inserts created (``Store.put_artifacts``, ``Store.add_event``
    note them while ``track_writes`` is set in the request's context): new artifacts' ids (of the
    request's tenant) and new events' ids; not rows that were already stored."""

    artifact_ids: list[str] = field(default_factory=list)
    event_ids: list[str] = field(default_factory=list)


_writes: ContextVar[RequestWrites | None] = ContextVar("context_proxy_request_writes", default=None)


def track_writes(writes: RequestWrites) -> Token[RequestWrites | None]:
    """Note this context's new artifact and event rows in ``writes`` (until ``untrack_writes``)."""
    return _writes.set(writes)


def untrack_writes(token: Token[RequestWrites | None]) -> None:
    _writes.reset(token)


def tracked() -> RequestWrites | None:
    """The ``RequestWrites`` of the current context, if tracked."""
    return _writes.get()


class RefusedRequestQueries:
    """Mixed into ``Store``: uses its ``_transact`` (one transaction, errors translated) and its
    request-row statements."""

    _bump_session: Any
    _insert_request: Any

    async def _transact(self, operation: str, fn: Callable[[sa.Connection], T], *, write: bool = True,
                        small: bool = True) -> T:
        raise NotImplementedError

    @staticmethod
    def _request_row(record: RequestRecord, now: datetime) -> dict[str, Any]:
        raise NotImplementedError

    async def record_refused(self, record: RequestRecord, now: datetime, tenant: str, message_ids: Sequence[int],
                             artifact_ids: Sequence[str], event_ids: Sequence[str]) -> list[str]:
        """In one transaction: delete what the request of ``record`` created itself in its session
        (``record.session_pk``): its messages ``message_ids`` (ids its append inserted), its events
        ``event_ids`` and ``tenant``'s artifacts ``artifact_ids`` (rows its inserts created),
        except what another request depends on (module docstring); then insert ``record``.
        Returns the deleted artifacts' ids. Raises ``MissingRow`` if the session is gone."""
        session_pk = record.session_pk
        values = self._request_row(record, now)

        def run(conn: sa.Connection) -> list[str]:
            # the session's row lock (PostgreSQL) orders this after, or before, a concurrent
            # append of the session: a reply written first is seen as a child here
            conn.execute(self._bump_session, {"b_pk": session_pk, "b_now": now})
            kept = _forget_messages(conn, session_pk, message_ids)
            _forget_events(conn, session_pk, record.id, event_ids)
            gone = _forget_artifacts(conn, session_pk, record.id, tenant, artifact_ids, kept)
            conn.execute(self._insert_request, values)
            return gone

        return await self._transact("record_refused", run, small=False)


def _batches(items: Sequence[Any]) -> list[list[Any]]:
    return [list(items[i : i + IN_BATCH]) for i in range(0, len(items), IN_BATCH)]


def _forget_messages(conn: sa.Connection, session_pk: int, message_ids: Sequence[int]) -> bool:
    """Delete the messages ``message_ids`` of the session but those another message (not among
    them) descends from; whether any of them stays."""
    if not message_ids:
        return False
    mine: dict[int, tuple[str, str | None]] = {}
    for batch in _batches(message_ids):
        query = sa.select(messages.c.id, messages.c.chain_hash, messages.c.parent_hash).where(
            messages.c.session_pk == session_pk, messages.c.id.in_(batch))
        mine.update((row.id, (row.chain_hash, row.parent_hash)) for row in conn.execute(query))
    by_hash = {h: (i, parent) for i, (h, parent) in mine.items()}
    needed: set[str] = set()
    for batch in _batches(list(by_hash)):
        query = sa.select(messages.c.id, messages.c.parent_hash).where(
            messages.c.session_pk == session_pk, messages.c.parent_hash.in_(batch))
        needed.update(row.parent_hash for row in conn.execute(query) if row.id not in mine)
    stack = list(needed)
    while stack:  # a kept message keeps its ancestors among the request's
        parent = by_hash[stack.pop()][1]
        if parent is not None and parent in by_hash and parent not in needed:
            needed.add(parent)
            stack.append(parent)
    doomed = [i for i, (h, _) in mine.items() if h not in needed]
    for batch in _batches(doomed):
        conn.execute(sa.delete(messages).where(messages.c.session_pk == session_pk, messages.c.id.in_(batch)))
    return bool(needed)


def _earliest(conn: sa.Connection, table: sa.Table, where: tuple[sa.ColumnElement[bool], ...], key: sa.Column[Any],
              ids: Sequence[str]) -> datetime | None:
    """The earliest ``created_at`` of ``table``'s rows ``ids`` (``None``: none of them is stored)."""
    times = [conn.execute(sa.select(sa.func.min(table.c.created_at)).where(*where, key.in_(batch))).scalar()
             for batch in _batches(ids)]
    return min((t for t in times if t is not None), default=None)


def _other_records(conn: sa.Connection, session_pk: int, request_id: str, since: datetime) -> list[Any]:
    """``(defenses, event_ids)`` of the session's other request records since ``since``."""
    query = sa.select(requests.c.defenses, requests.c.event_ids).where(
        requests.c.session_pk == session_pk, requests.c.created_at >= since, requests.c.id != request_id)
    return list(conn.execute(query))


def _tenant_offloaded(conn: sa.Connection, tenant: str, request_id: str, since: datetime) -> bool:
    """Did another request of ``tenant`` (any session) recorded since ``since`` offload content?"""
    query = (sa.select(requests.c.defenses).select_from(requests.join(sessions, sessions.c.pk == requests.c.session_pk))
             .where(sessions.c.tenant == tenant, requests.c.created_at >= since, requests.c.id != request_id))
    return any(OFFLOADING.intersection(row.defenses or ()) for row in conn.execute(query))


def _forget_events(conn: sa.Connection, session_pk: int, request_id: str, event_ids: Sequence[str]) -> None:
    if not event_ids:
        return
    created = _earliest(conn, events, (events.c.session_pk == session_pk,), events.c.id, event_ids)
    if created is None:
        return
    used = {e for row in _other_records(conn, session_pk, request_id, created) for e in row.event_ids or ()}
    doomed = [e for e in event_ids if e not in used]
    for batch in _batches(doomed):
        conn.execute(sa.delete(events).where(events.c.session_pk == session_pk, events.c.id.in_(batch)))


def _forget_artifacts(conn: sa.Connection, session_pk: int, request_id: str, tenant: str,
                      artifact_ids: Sequence[str], messages_kept: bool) -> list[str]:
    if not artifact_ids or messages_kept:
        return []
    mine = (artifacts.c.tenant == tenant, artifacts.c.session_pk == session_pk)
    created = _earliest(conn, artifacts, mine, artifacts.c.id, artifact_ids)
    if created is None:
        return []
    if _tenant_offloaded(conn, tenant, request_id, created):
        return []
    gone: list[str] = []
    for batch in _batches(artifact_ids):
        gone.extend(conn.execute(sa.delete(artifacts).where(*mine, artifacts.c.id.in_(batch))
                                 .returning(artifacts.c.id)).scalars())
    return gone
