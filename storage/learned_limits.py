"""The learned-limit queries of ``storage.store.Store`` (``proxy.compaction.limits`` is their one user).

A row per (tenant, upstream, model): the learned window (with its source and expiry) and the
estimate ratio, each written on its own so that two replicas learning one part each keep both.
A tenant has at most ``MAX_LIMIT_ROWS_PER_TENANT`` rows (its model names are its own choice).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import sqlalchemy as sa

from storage.records import LearnedLimitRecord
from storage.tables import learned_limits
from storage.values import TOKENS_MAX, clamp_count, finite

MAX_LIMIT_ROWS_PER_TENANT = 1000
"""Learned-limit rows one tenant may have (one per upstream and model name it used)."""

T = TypeVar("T")


class LearnedLimitQueries:
    """Mixed into ``Store``: uses its ``_transact`` (one transaction, errors translated) and
    ``_insert`` (the dialect's INSERT with ``ON CONFLICT``)."""

    async def _transact(self, operation: str, fn: Callable[[sa.Connection], T], *, write: bool = True,
                        small: bool = True) -> T:
        raise NotImplementedError

    def _insert(self, table: sa.Table) -> Any:
        raise NotImplementedError

    async def get_learned_limit(self, tenant: str, upstream: str, model: str) -> LearnedLimitRecord | None:
        """What was learned about ``model`` at ``upstream`` for ``tenant``, or ``None``."""
        query = sa.select(*learned_limits.c).where(
            learned_limits.c.tenant == tenant, learned_limits.c.upstream == upstream, learned_limits.c.model == model
        )
        row = await self._transact("get_learned_limit", lambda conn: conn.execute(query).first(), write=False)
        return None if row is None else LearnedLimitRecord(**row._mapping)

    async def set_learned_window(self, tenant: str, upstream: str, model: str, window_tokens: int | None,
                                 source: str | None, now: datetime, expires_at: datetime | None) -> bool:
        """Set (or clear, with ``None``) the learned window of ``(tenant, upstream, model)``; its
        estimate ratio is left as stored. ``False`` when the row is new and the tenant already has
        ``MAX_LIMIT_ROWS_PER_TENANT`` rows (nothing stored). The window is stored bounded by
        ``storage.values.TOKENS_MAX`` (a provider's error text may state any number)."""
        values = {"context_window_tokens": clamp_count(window_tokens, TOKENS_MAX), "source": source,
                  "updated_at": now, "expires_at": expires_at}
        return await self._set_limit_columns("set_learned_window", tenant, upstream, model, values)

    async def set_estimate_ratio(self, tenant: str, upstream: str, model: str, ratio: float, now: datetime) -> bool:
        """Set the estimate ratio of ``(tenant, upstream, model)``; its window is left as stored.
        ``False`` as for ``set_learned_window``. A non-finite ratio is stored as ``None`` (unmeasured)."""
        return await self._set_limit_columns("set_estimate_ratio", tenant, upstream, model,
                                             {"estimate_ratio": finite(ratio, None), "updated_at": now})

    async def _set_limit_columns(self, operation: str, tenant: str, upstream: str, model: str,
                                 values: dict[str, Any]) -> bool:
        c = learned_limits.c
        key = (c.tenant == tenant) & (c.upstream == upstream) & (c.model == model)
        count = sa.select(sa.func.count()).select_from(learned_limits).where(c.tenant == tenant)
        row = {"tenant": tenant, "upstream": upstream, "model": model} | values
        insert = self._insert(learned_limits).values(**row).on_conflict_do_update(
            index_elements=[c.tenant, c.upstream, c.model], set_=values)

        def run(conn: sa.Connection) -> bool:
            if conn.execute(sa.update(learned_limits).where(key).values(**values)).rowcount:
                return True
            if conn.execute(count).scalar_one() >= MAX_LIMIT_ROWS_PER_TENANT:
                return False  # a tenant's model names are its own choice: bounded
            conn.execute(insert)
            return True

        return await self._transact(operation, run)

    async def list_learned_limits(self, *, tenant: str | None = None, model: str | None = None,
                                  limit: int = 1000) -> list[LearnedLimitRecord]:
        """Learned limits, most recently updated first (at most ``limit``); ``None`` filters nothing."""
        query = sa.select(*learned_limits.c)
        if tenant is not None:
            query = query.where(learned_limits.c.tenant == tenant)
        if model is not None:
            query = query.where(learned_limits.c.model == model)
        query = query.order_by(learned_limits.c.updated_at.desc(), learned_limits.c.model).limit(limit)
        return await self._transact(
            "list_learned_limits", lambda conn: [LearnedLimitRecord(**r._mapping) for r in conn.execute(query)],
            write=False
        )

    async def delete_learned_limits(self, *, tenant: str | None = None, model: str | None = None) -> int:
        """Forget learned limits (all of them, or one tenant's and/or one model's); returns rows deleted."""
        stmt = sa.delete(learned_limits)
        if tenant is not None:
            stmt = stmt.where(learned_limits.c.tenant == tenant)
        if model is not None:
            stmt = stmt.where(learned_limits.c.model == model)
        return await self._transact("delete_learned_limits", lambda conn: conn.execute(stmt).rowcount)
