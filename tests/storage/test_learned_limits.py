"""Learned-limit queries (storage/learned_limits.py) on SQLite and PostgreSQL: per tenant,
upstream and model; window and ratio written apart; a bounded number of rows per tenant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from storage.records import LearnedLimitRecord
from storage.store import Store

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)

def _limit(tenant: str, upstream: str, model: str, window: int | None, at: datetime, **kw: Any) -> LearnedLimitRecord:
    return LearnedLimitRecord(tenant, upstream, model, window, kw.get("ratio"), kw.get("source", "overflow"), at,
                              kw.get("expires"))


async def test_learned_limits_are_kept_per_tenant_upstream_and_model(store: Store) -> None:
    up, other = "https://api.example/v1", "https://other/v1"
    assert await store.get_learned_limit("t1", up, "m") is None
    assert await store.set_learned_window("t1", up, "m", 32_768, "overflow", T0, None)
    assert await store.set_learned_window("t1", up, "m", 16_384, "overflow", T0 + timedelta(1), T0 + timedelta(2))
    assert await store.set_estimate_ratio("t1", up, "m", 1.25, T0 + timedelta(1))
    assert await store.set_learned_window("t1", other, "m", 8_192, "usage", T0, None)
    assert await store.set_estimate_ratio("t2", up, "m", 0.9, T0)
    got = await store.get_learned_limit("t1", up, "m")
    assert got == _limit("t1", up, "m", 16_384, T0 + timedelta(1), ratio=1.25, expires=T0 + timedelta(2))
    assert (await store.get_learned_limit("t1", other, "m")).source == "usage"
    assert (await store.get_learned_limit("t2", up, "m")).context_window_tokens is None
    listed = await store.list_learned_limits()
    assert len(listed) == 3 and listed[0].updated_at == T0 + timedelta(1)  # newest first
    assert [r.tenant for r in await store.list_learned_limits(tenant="t2")] == ["t2"]
    assert await store.delete_learned_limits(tenant="t1", model="m") == 2
    assert [r.tenant for r in await store.list_learned_limits()] == ["t2"]
    assert await store.delete_learned_limits() == 1
    assert await store.list_learned_limits() == []


async def test_the_window_and_the_ratio_are_written_apart(store: Store) -> None:
    """Two replicas, one learning a window and one a ratio for the same row, keep both."""
    up = "https://api.example/v1"
    await store.set_estimate_ratio("t", up, "m", 1.4, T0)
    await store.set_learned_window("t", up, "m", 4096, "overflow", T0, T0 + timedelta(1))
    await store.set_estimate_ratio("t", up, "m", 1.5, T0)
    row = await store.get_learned_limit("t", up, "m")
    assert (row.context_window_tokens, row.estimate_ratio, row.source) == (4096, 1.5, "overflow")
    await store.set_learned_window("t", up, "m", None, None, T0, None)  # forgotten: the ratio stays
    row = await store.get_learned_limit("t", up, "m")
    assert (row.context_window_tokens, row.estimate_ratio) == (None, 1.5)


async def test_one_tenant_has_a_bounded_number_of_learned_rows(store: Store, monkeypatch: Any) -> None:
    import storage.learned_limits as store_module

    monkeypatch.setattr(store_module, "MAX_LIMIT_ROWS_PER_TENANT", 3)
    up = "https://api.example/v1"
    assert all([await store.set_estimate_ratio("t", up, f"m{i}", 1.1, T0) for i in range(3)])
    assert await store.set_estimate_ratio("t", up, "m9", 1.1, T0) is False
    assert await store.set_learned_window("t", up, "m0", 4096, "overflow", T0, None)  # an existing row: updated
    assert await store.set_learned_window("u", up, "m9", 4096, "overflow", T0, None)  # another tenant: its own
    assert len(await store.list_learned_limits(tenant="t")) == 3
