"""Retention: delete old sessions, and a tenant's oldest sessions past a size cap, consistently.

    report = await run_retention(database_url, RetentionPolicy(max_age_days=30, max_bytes_per_tenant=10**9))

Rules (issue 5, point 9):

- **Age.** A session whose ``updated_at`` (its last request) is older than ``max_age_days`` is
  deleted, and so is a learned limit (``learned_limits``) not updated for as long.
- **Size.** A tenant's stored bytes are the bytes the database holds for its sessions' message
  JSON and event payload JSON values (SQLite: ``length`` of the stored value, which
  ``storage.tables`` compresses when that is smaller; PostgreSQL: ``pg_column_size``, after
  TOAST's compression), plus the ``size_bytes`` (UTF-8 bytes of the content, recorded by the
  writer) of its artifacts. Values as stored, not as sent: the cap bounds the disk a tenant
  takes, and no SQL can see a compressed value's original length. While a tenant is over
  ``max_bytes_per_tenant``, its least recently updated session is deleted (the newest session
  too, if it alone is over the cap: the cap is a hard limit).
- **What goes with a session.** Its messages, compaction events, request records, and the
  artifacts it stored (``artifacts.session_pk``), plus the tenant's artifacts no session owns
  any longer (``session_pk`` NULL). Artifacts are content-addressed per tenant, so another live
  session of the same tenant may show a stub of the same id: the proxy stores every artifact a
  projection references *before* forwarding it (``ProjectingCompactor.prepare``), so that
  session's next request stores it again; a stale read in between is a 404, never another
  tenant's data.
- **Consistency.** A session is deleted whole, in one transaction, or not at all: the log never
  holds half a session. The transaction first locks the session rows (PostgreSQL ``FOR UPDATE``;
  SQLite's first write takes the database lock) and deletes a session only if it was not
  updated since it was chosen, so a session an agent resumes during retention is kept.
- **Batches.** Sessions are grouped so one transaction deletes about ``batch_size`` rows (at least
  one session), each group in its own short transaction: writers wait at most one batch, never
  the whole run. Under SQLite a writer waits on the database lock (``busy_timeout`` 10 s).

``dry_run`` computes the same choice and counts, and deletes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from storage.engine import create_engine
from storage.errors import FOREIGN_ERRORS, translate_error
from storage.tables import (
    artifacts,
    events,
    learned_limits,
    messages,
    requests,
    sessions,
)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """What to keep. ``None`` turns a rule off; ``batch_size`` is rows per delete transaction."""

    max_age_days: float | None = None
    max_bytes_per_tenant: int | None = None
    batch_size: int = 500


@dataclass(slots=True)
class RetentionReport:
    """What a run deleted (or, with ``dry_run``, would delete). ``bytes_freed`` in bytes as above."""

    dry_run: bool = False
    sessions: int = 0
    messages: int = 0
    events: int = 0
    requests: int = 0
    artifacts: int = 0
    learned_limits: int = 0
    """Learned-limit rows not updated within ``max_age_days`` (``proxy.compaction.limits``: learned again)."""
    bytes_freed: int = 0
    batches: int = 0
    by_reason: dict[str, int] = field(default_factory=lambda: {"age": 0, "size": 0})

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class _Candidate:
    pk: int
    tenant: str
    updated_at: datetime
    rows: int
    bytes: int


def _stored_bytes(engine: AsyncEngine, column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """Bytes the database holds for a value of ``column``: PostgreSQL ``pg_column_size`` (after
    TOAST compression; reads no toasted data); SQLite ``length`` of the value as a BLOB (a
    compressed BLOB's own length, a TEXT value's UTF-8 bytes)."""
    if engine.dialect.name == "postgresql":
        return sa.func.pg_column_size(column)
    return sa.func.length(sa.cast(sa.type_coerce(column, sa.LargeBinary), sa.LargeBinary))


def _per_session(engine: AsyncEngine, table: sa.Table, value: sa.ColumnElement[Any]) -> sa.Subquery:
    return (
        sa.select(table.c.session_pk.label("session_pk"), sa.func.count().label("n"),
                  sa.func.coalesce(sa.func.sum(value), 0).label("b"))
        .where(table.c.session_pk.is_not(None))
        .group_by(table.c.session_pk)
        .subquery()
    )


async def _candidates(conn: AsyncConnection, engine: AsyncEngine,
                      where: sa.ColumnElement[Any] | None) -> list[_Candidate]:
    """Sessions (filtered by ``where``) with their row count and stored bytes, oldest first."""
    parts = [
        _per_session(engine, messages, _stored_bytes(engine, messages.c.message)),
        _per_session(engine, events, _stored_bytes(engine, events.c.payload)),
        _per_session(engine, artifacts, artifacts.c.size_bytes),
        _per_session(engine, requests, sa.literal(0)),
    ]
    rows_expr: sa.ColumnElement[Any] = sa.literal(1)
    bytes_expr: sa.ColumnElement[Any] = sa.literal(0)
    query = sa.select(sessions.c.pk, sessions.c.tenant, sessions.c.updated_at)
    frm: Any = sessions
    for part in parts:
        frm = frm.outerjoin(part, part.c.session_pk == sessions.c.pk)
        rows_expr = rows_expr + sa.func.coalesce(part.c.n, 0)
        bytes_expr = bytes_expr + sa.func.coalesce(part.c.b, 0)
    query = query.add_columns(rows_expr.label("rows"), bytes_expr.label("bytes")).select_from(frm)
    if where is not None:
        query = query.where(where)
    query = query.order_by(sessions.c.updated_at, sessions.c.pk)
    return [_Candidate(r.pk, r.tenant, r.updated_at, int(r.rows), int(r.bytes)) for r in await conn.execute(query)]


def _batches(chosen: Sequence[_Candidate], batch_rows: int) -> Iterator[list[_Candidate]]:
    batch: list[_Candidate] = []
    rows = 0
    for c in chosen:
        if batch and rows + c.rows > batch_rows:
            yield batch
            batch, rows = [], 0
        batch.append(c)
        rows += c.rows
    if batch:
        yield batch


async def _delete_batch(engine: AsyncEngine, batch: list[_Candidate], report: RetentionReport) -> None:
    """Delete the sessions of ``batch`` not updated since they were chosen, whole, in one transaction."""
    unchanged = sa.or_(*(sa.and_(sessions.c.pk == c.pk, sessions.c.updated_at <= c.updated_at) for c in batch))
    lock = sa.select(sessions.c.pk, sessions.c.tenant).where(unchanged)
    if engine.dialect.name == "postgresql":
        lock = lock.with_for_update()
    async with engine.begin() as conn:
        if engine.dialect.name == "sqlite":  # take the write lock before reading: no stale choice
            await conn.execute(sa.update(sessions).where(sa.false()).values(pk=sessions.c.pk))
        locked = {r.pk: r.tenant for r in await conn.execute(lock)}
        if not locked:
            return
        pks = list(locked)
        tables = ((messages, "messages"), (events, "events"), (requests, "requests"), (artifacts, "artifacts"))
        for table, name in tables:
            deleted = (await conn.execute(sa.delete(table).where(table.c.session_pk.in_(pks)))).rowcount
            setattr(report, name, getattr(report, name) + deleted)
        orphans = sa.delete(artifacts).where(artifacts.c.session_pk.is_(None),
                                             artifacts.c.tenant.in_(set(locked.values())))
        report.artifacts += (await conn.execute(orphans)).rowcount
        report.sessions += (await conn.execute(sa.delete(sessions).where(sessions.c.pk.in_(pks)))).rowcount
    report.batches += 1
    report.bytes_freed += sum(c.bytes for c in batch if c.pk in locked)


def _over_cap(candidates: list[_Candidate], cap_bytes: int, skip: set[int]) -> list[_Candidate]:
    """Per tenant, its oldest sessions whose removal brings the tenant under ``cap_bytes``."""
    totals: dict[str, int] = {}
    for c in candidates:
        if c.pk not in skip:
            totals[c.tenant] = totals.get(c.tenant, 0) + c.bytes
    chosen = []
    for c in candidates:  # oldest first
        if c.pk in skip or totals[c.tenant] <= cap_bytes:
            continue
        chosen.append(c)
        totals[c.tenant] -= c.bytes
    return chosen


async def run_retention(
    database_url: str, policy: RetentionPolicy, *, now: datetime | None = None, dry_run: bool = False
) -> RetentionReport:
    """Apply ``policy`` to the database at ``database_url`` (as users write it); return the counts.

    ``now`` (timezone-aware, default the current UTC time) dates the age rule. Raises
    ``StorageError``/``StorageUnavailable`` if the database fails; batches already committed stay
    deleted (each is whole), so a rerun continues where this one stopped.
    """
    if policy.batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    now = now or datetime.now(UTC)
    report = RetentionReport(dry_run=dry_run)
    engine = create_engine(database_url, pool_size=2)
    try:
        async with engine.connect() as conn:
            old: list[_Candidate] = []
            if policy.max_age_days is not None:
                cutoff = now - timedelta(days=policy.max_age_days)
                old = await _candidates(conn, engine, sessions.c.updated_at < cutoff)
            big: list[_Candidate] = []
            if policy.max_bytes_per_tenant is not None:
                big = _over_cap(await _candidates(conn, engine, None), policy.max_bytes_per_tenant, {c.pk for c in old})
        report.by_reason = {"age": len(old), "size": len(big)}
        chosen = old + big
        if policy.max_age_days is not None:
            stale = learned_limits.c.updated_at < now - timedelta(days=policy.max_age_days)
            async with engine.begin() as conn:
                if dry_run:
                    count = sa.select(sa.func.count()).select_from(learned_limits).where(stale)
                    report.learned_limits = (await conn.execute(count)).scalar_one()
                else:
                    report.learned_limits = (await conn.execute(sa.delete(learned_limits).where(stale))).rowcount
        if dry_run:
            report.sessions = len(chosen)
            report.bytes_freed = sum(c.bytes for c in chosen)
            return report
        for batch in _batches(chosen, policy.batch_size):
            await _delete_batch(engine, batch, report)
        return report
    except FOREIGN_ERRORS as exc:
        raise translate_error(exc, "retention") from exc
    finally:
        await engine.dispose()
