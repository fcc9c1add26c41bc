"""The artifact queries of ``storage.store.Store``: offloaded content, per tenant, content-addressed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa

from storage.records import ArtifactRecord
from storage.refused import tracked
from storage.tables import artifacts
from storage.values import COUNT_MAX, clamp_count

T = TypeVar("T")

INSERT_BATCH_ROWS = 500
"""Rows per multi-row INSERT: keeps bound parameters (rows x columns) under SQLite's and asyncpg's
32,766/32,767 limits."""


class ArtifactQueries:
    """Mixed into ``Store``: uses its ``_transact`` (one transaction, errors translated) and
    ``_insert`` (the dialect's INSERT with ``ON CONFLICT``)."""

    async def _transact(self, operation: str, fn: Callable[[sa.Connection], T], *, write: bool = True,
                        small: bool = True) -> T:
        raise NotImplementedError

    def _insert(self, table: sa.Table) -> Any:
        raise NotImplementedError

    async def put_artifacts(self, items: Sequence[ArtifactRecord]) -> list[str]:
        """Store artifacts; an id already stored for that tenant is left as it is. Returns the ids
        of the rows inserted (noted in the context's ``storage.refused.RequestWrites`` if tracked).

        Ids are content-addressed, so two tenants offloading the same content get the same id:
        the primary key is ``(tenant, id)`` and each tenant owns its own copy.
        """
        if not items:
            return []
        rows = [
            {
                "id": a.id,
                "tenant": a.tenant,
                "session_pk": a.session_pk,
                "media_type": a.media_type,
                "content": a.content,
                "size_bytes": clamp_count(a.size_bytes, 2**63 - 1),
                "line_count": clamp_count(a.line_count, COUNT_MAX),
                "created_at": a.created_at,
                "message_hash": a.message_hash,
            }
            for a in items
        ]
        def run(conn: sa.Connection) -> list[str]:
            new: list[str] = []
            for i in range(0, len(rows), INSERT_BATCH_ROWS):
                stmt = self._insert(artifacts).values(rows[i : i + INSERT_BATCH_ROWS])
                new.extend(conn.execute(stmt.on_conflict_do_nothing(index_elements=[artifacts.c.tenant, artifacts.c.id])
                                        .returning(artifacts.c.id)).scalars())
            return new

        new = await self._transact("put_artifacts", run, small=False)  # offloaded content is large by definition
        if new and (writes := tracked()) is not None:
            writes.artifact_ids.extend(new)
        return new

    async def get_artifact(self, artifact_id: str, tenant: str | None) -> ArtifactRecord | None:
        """The artifact if it exists and belongs to ``tenant`` (``None``: admin, any tenant). Any
        ``str`` may be asked for (ids are escaped as stored: ``storage.columns.SafeText``)."""
        query = sa.select(*artifacts.c).where(artifacts.c.id == artifact_id)
        if tenant is not None:
            query = query.where(artifacts.c.tenant == tenant)
        row = await self._transact("get_artifact", lambda conn: conn.execute(query).first(), write=False, small=False)
        return None if row is None else ArtifactRecord(**row._mapping)
