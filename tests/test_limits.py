"""Learned limits (proxy/compaction/limits.py): evidence, scope, floor, expiry, calibration, hostile input.

On a real store (SQLite and PostgreSQL). ``gpt-4o`` has a 128,000-token profile; ``fake-unknown``
has none.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from proxy.compaction import limits as limits_module
from proxy.compaction.limits import MAX_MODEL_CHARS, LearnedLimits, Sent
from proxy.compaction.models import ModelProfiles
from proxy.compaction.overflow import Overflow
from proxy.telemetry.metrics import Metrics
from storage.store import Store

UP = "https://upstream.example/v1"


def make(store: Store, *, exact: bool = True, ttl_s: float = 3600.0) -> LearnedLimits:
    return LearnedLimits(store, UP, ModelProfiles(), ttl_s, Metrics(), exact)


def sent(tenant: str = "t1", model: str = "fake-unknown", session: int = 1, estimate: int = 10_000, reserved: int = 0,
         text_only: bool = True) -> Sent:
    return Sent(tenant, model, session, estimate, reserved, lambda: text_only)


def overflow(limit: int | None, prompt: int | None = None) -> Overflow:
    return Overflow("context", limit, "openai-compatible", "This model's maximum context length is ...", prompt)


async def test_a_consistent_overflow_sets_the_window_of_that_tenant_only(store: Store) -> None:
    lim = make(store)
    await lim.view("t1", "fake-unknown")
    retry = await lim.learn_overflow(overflow(8192, 10_100), sent())
    assert retry == 8192
    assert (await lim.view("t1", "fake-unknown")).tokens == 8192
    assert (await lim.view("t2", "fake-unknown")).tokens is None  # another tenant: untouched
    fresh = make(store)  # another process, or a restart: the stored row
    assert (await fresh.view("t1", "fake-unknown")).tokens == 8192
    assert (await fresh.view("t2", "fake-unknown")).tokens is None
    (row,) = await store.list_learned_limits()
    assert (row.tenant, row.model, row.context_window_tokens, row.source) == ("t1", "fake-unknown", 8192, "overflow")
    assert row.expires_at is not None and row.expires_at > datetime.now(UTC)


@pytest.mark.parametrize(("limit", "prompt", "why"), [
    (300, 310, "the stated prompt is 30x under what was sent"),
    (8192, 90_000, "the stated prompt is 9x over what was sent"),
    (500_000, None, "a window 50x larger than everything sent could not have overflowed"),
    (300, None, "no model agents use has a 300-token window"),
])
async def test_numbers_that_do_not_agree_with_what_was_sent_are_not_learned(store: Store, limit: int, prompt: int | None,
                                                                           why: str) -> None:
    lim = make(store)
    retry = await lim.learn_overflow(overflow(limit, prompt), sent(estimate=10_000))
    assert retry == 9000, why  # the retry is sized from what was sent: 90% of it
    assert await store.list_learned_limits() == [], why
    assert (await lim.view("t1", "fake-unknown")).tokens is None


async def test_an_overflow_that_states_no_window_stores_nothing(store: Store) -> None:
    lim = make(store)
    assert await lim.learn_overflow(overflow(None), sent(estimate=20_000)) == 18_000
    assert await store.list_learned_limits() == []


async def test_a_larger_stated_window_raises_a_learned_one(store: Store) -> None:
    lim = make(store)
    await lim.learn_overflow(overflow(4096, 5000), sent(estimate=5000))
    await lim.learn_overflow(overflow(16_384, 17_000), sent(estimate=17_000))
    assert (await lim.view("t1", "fake-unknown")).tokens == 16_384


async def test_a_learned_window_never_loosens_the_profile(store: Store) -> None:
    lim = make(store)
    await lim.learn_overflow(overflow(200_000, 210_000), sent(model="gpt-4o", estimate=205_000))
    assert (await lim.view("t1", "gpt-4o")).tokens == 128_000


async def test_an_expired_window_is_not_used(store: Store) -> None:
    past = datetime.now(UTC) - timedelta(seconds=1)
    await store.set_learned_window("t1", UP, "fake-unknown", 4096, "overflow", past, past)
    assert (await make(store).view("t1", "fake-unknown")).tokens is None


async def test_a_reply_that_takes_more_than_the_learned_window_forgets_it(store: Store) -> None:
    lim = make(store)
    await lim.learn_overflow(overflow(4096, 5000), sent(estimate=5000))
    assert lim.observe(sent(estimate=6000), {"prompt_tokens": 6100}) is True
    await lim.persist(sent())
    assert (await lim.view("t1", "fake-unknown")).tokens is None
    (row,) = await store.list_learned_limits()
    assert row.context_window_tokens is None and row.estimate_ratio is not None


# --- silent truncation (case 017) -------------------------------------------------------------

async def test_one_suspected_truncation_sizes_that_session_only(store: Store) -> None:
    lim = make(store)
    for s in (1, 2):
        await lim.view("t1", "qwen3:8b", s)
    assert lim.observe(sent(model="qwen3:8b", estimate=4754), {"prompt_tokens": 2048}) is False
    assert (await lim.view("t1", "qwen3:8b", 1)).tokens == 2048
    assert (await lim.view("t1", "qwen3:8b", 2)).tokens == 40_960
    assert (await lim.view("t2", "qwen3:8b", 1)).tokens == 40_960
    assert await store.list_learned_limits() == []


async def test_two_agreeing_truncations_set_the_tenants_window(store: Store) -> None:
    lim = make(store)
    await lim.view("t1", "qwen3:8b", 1)
    lim.observe(sent(model="qwen3:8b", estimate=4754, session=1), {"prompt_tokens": 2048})
    assert lim.observe(sent(model="qwen3:8b", estimate=6000, session=2), {"prompt_tokens": 2048}) is True
    await lim.persist(sent(model="qwen3:8b"))
    assert (await lim.view("t1", "qwen3:8b", 3)).tokens == 2048
    assert (await lim.view("t2", "qwen3:8b", 3)).tokens == 40_960
    (row,) = await store.list_learned_limits()
    assert (row.context_window_tokens, row.source) == (2048, "usage")


async def test_usage_never_sets_a_window_under_the_floor(store: Store) -> None:
    lim = make(store)
    await lim.view("t1", "gpt-4o", 1)
    lim.observe(sent(model="gpt-4o", estimate=9000), {"prompt_tokens": 300})
    lim.observe(sent(model="gpt-4o", estimate=9500), {"prompt_tokens": 300})
    assert (await lim.view("t1", "gpt-4o", 1)).tokens == 2048  # max(2,048, 128,000 / 64)


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"estimate": 3000}, "small requests: fixed overheads could explain the gap"),
    ({"estimate": 9000, "text_only": False}, "image costs are estimates a provider may count far lower"),
])
async def test_usage_is_not_evidence_of_truncation_when(store: Store, kwargs: dict[str, Any], why: str) -> None:
    lim = make(store)
    await lim.view("t1", "gpt-4o", 1)
    for _ in range(3):
        lim.observe(sent(model="gpt-4o", **kwargs), {"prompt_tokens": 400})
    assert (await lim.view("t1", "gpt-4o", 1)).tokens == 128_000, why


async def test_with_the_byte_estimate_usage_learns_no_window(store: Store) -> None:
    """Tried without the encoding files, the old rule stored a 3,389-token window for an 8k model."""
    lim = make(store, exact=False)
    await lim.view("t1", "gpt-4o", 1)
    for _ in range(3):
        lim.observe(sent(model="gpt-4o", estimate=9000), {"prompt_tokens": 3389})
    view = await lim.view("t1", "gpt-4o", 1)
    assert view.tokens == 128_000
    assert view.ratio == 0.5  # the estimate is calibrated instead (clamped)


# --- calibration (case 043) -------------------------------------------------------------------

async def test_the_estimate_ratio_is_learned_per_tenant_and_applied_to_the_window(store: Store) -> None:
    lim = make(store)
    await lim.view("t1", "gpt-4o")
    for _ in range(5):
        assert isinstance(lim.observe(sent(model="gpt-4o", estimate=4000), {"prompt_tokens": 6000}), bool)
    await lim.persist(sent(model="gpt-4o"))
    view = await lim.view("t1", "gpt-4o")
    assert view.ratio == 1.5 and view.estimate_window() == int(128_000 / 1.5)
    assert view.estimate_window(4096) == int((128_000 - 4096) / 1.5) + 4096  # reserved output is not scaled
    assert (await lim.view("t2", "gpt-4o")).ratio == 1.0
    assert (await make(store).view("t1", "gpt-4o")).ratio == 1.5  # stored
    (row,) = await store.list_learned_limits()
    assert row.context_window_tokens is None and row.estimate_ratio == pytest.approx(1.5)


async def test_the_ratio_is_clamped_and_small_requests_do_not_move_it(store: Store) -> None:
    lim = make(store)
    await lim.view("t1", "gpt-4o")
    lim.observe(sent(model="gpt-4o", estimate=500), {"prompt_tokens": 5000})
    assert (await lim.view("t1", "gpt-4o")).ratio == 1.0
    for _ in range(3):
        lim.observe(sent(model="gpt-4o", estimate=2000), {"prompt_tokens": 20_000})
    assert (await lim.view("t1", "gpt-4o")).ratio == 2.0


async def test_an_overflow_that_states_the_prompt_calibrates_the_retry(store: Store) -> None:
    """Case 043: 'prompt is too long: X tokens > N maximum' with X = 1.5 x the estimate."""
    lim = make(store)
    await lim.view("t1", "fake-4k-anthropic")
    retry = await lim.learn_overflow(overflow(4096, 4959), sent(model="fake-4k-anthropic", estimate=3306))
    assert retry == int(4096 / 1.5)


# --- operators and hostile input --------------------------------------------------------------

async def test_a_reset_elsewhere_is_seen_after_the_refresh(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    lim = make(store)
    await lim.learn_overflow(overflow(8192, 10_000), sent())
    assert await store.delete_learned_limits(tenant="t1") == 1
    monkeypatch.setattr(limits_module, "REFRESH_S", 0.0)
    assert (await lim.view("t1", "fake-unknown")).tokens is None


async def test_forget_drops_what_this_process_remembers(store: Store) -> None:
    lim = make(store)
    await lim.view("t1", "qwen3:8b", 1)
    lim.observe(sent(model="qwen3:8b", estimate=4754), {"prompt_tokens": 2048})
    lim.forget(model="qwen3:8b")
    assert (await lim.view("t1", "qwen3:8b", 1)).tokens == 40_960


async def test_client_chosen_model_names_are_bounded(store: Store) -> None:
    lim = make(store)
    name = "m" * (MAX_MODEL_CHARS + 1)
    await lim.view("t1", name)
    await lim.learn_overflow(overflow(8192, 10_000), sent(model=name))
    assert lim.observe(sent(model=name), {"prompt_tokens": 20_000}) is False
    assert await store.list_learned_limits() == []
    assert len(lim._known) == 0


@pytest.mark.parametrize("usage", [None, {}, {"prompt_tokens": "9"}, {"prompt_tokens": True}, {"prompt_tokens": -1}, []])
async def test_odd_usage_is_ignored(store: Store, usage: Any) -> None:
    lim = make(store)
    await lim.view("t1", "gpt-4o")
    assert lim.observe(sent(model="gpt-4o"), usage) is False


async def test_a_cut_prompt_at_a_known_window_does_not_move_the_ratio(store: Store) -> None:
    """Case 017 goes on after the window is known: replies whose count is the window (the provider
    cut the prompt there, by less than 1.5x) say nothing about how it counts."""
    lim = make(store)
    await lim.view("t1", "qwen3:8b", 1)
    lim.observe(sent(model="qwen3:8b", estimate=4754), {"prompt_tokens": 2048})
    for estimate in (2300, 2600, 2900):
        lim.observe(sent(model="qwen3:8b", estimate=estimate), {"prompt_tokens": 2048})
    view = await lim.view("t1", "qwen3:8b", 1)
    assert (view.tokens, view.ratio, view.source) == (2048, 1.0, "session")
    assert view.estimate_window() == 2048


async def test_with_tiktoken_the_ratio_stays_at_or_over_the_exact_floor(store: Store) -> None:
    lim = make(store)
    await lim.view("t1", "gpt-4o")
    for _ in range(5):
        lim.observe(sent(model="gpt-4o", estimate=3000), {"prompt_tokens": 2100})  # 0.7x
    assert (await lim.view("t1", "gpt-4o")).ratio == 0.8


def test_a_usage_window_is_never_enlarged_by_a_ratio_under_one() -> None:
    from proxy.compaction.limits import WindowView

    assert WindowView(2048, 0.5, "session").estimate_window() == 2048
    assert WindowView(2048, 0.5, "usage").estimate_window() == 2048
    assert WindowView(2048, 0.5, "learned").estimate_window() == 4096
    assert WindowView(8192, 1.5, "config").estimate_window(4096) == int(4096 / 1.5) + 4096
    assert WindowView(None, 1.5, None).estimate_window() is None


async def test_agreeing_truncations_in_one_session_stay_that_sessions(store: Store) -> None:
    """A provider that under-reports usage twice in one conversation changes that conversation only;
    a tenant's window from usage needs a second session, and lasts an hour, not the whole TTL."""
    lim = make(store, ttl_s=86_400)
    await lim.view("t1", "qwen3:8b", 1)
    for estimate in (4754, 6000):
        lim.observe(sent(model="qwen3:8b", estimate=estimate, session=1), {"prompt_tokens": 2048})
    assert (await lim.view("t1", "qwen3:8b", 2)).tokens == 40_960
    lim.observe(sent(model="qwen3:8b", estimate=5000, session=2), {"prompt_tokens": 2048})
    await lim.persist(sent(model="qwen3:8b"))
    (row,) = await store.list_learned_limits()
    assert row.source == "usage" and row.expires_at - row.updated_at <= timedelta(seconds=limits_module.USAGE_WINDOW_S + 1)


async def test_view_now_is_the_view_without_io_once_the_limits_are_read(store: Store,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``view_now`` (the compactor's per-request path) answers what ``view`` answers, reading
    nothing; ``None`` until the tenant's limits were read, and again once they are older than
    ``REFRESH_S`` with nothing unstored (then ``view`` reads them)."""
    lim = make(store)
    reads: list[str] = []
    real = store.get_learned_limit

    async def counting(*args: Any) -> Any:
        reads.append(args[2])
        return await real(*args)

    monkeypatch.setattr(store, "get_learned_limit", counting)
    assert lim.view_now("t1", "gpt-4o", 1) is None and reads == []
    cases = [("t1", "gpt-4o", 1), ("t1", "fake-unknown", 1), ("t1", "qwen3:8b", 1), ("t1", "qwen3:8b", 2),
             ("t2", "fake-unknown", None), ("t1", "m" * (MAX_MODEL_CHARS + 1), 1)]
    for case in cases:
        await lim.view(*case)
    await lim.learn_overflow(overflow(8192, 10_100), sent())  # a learned window
    lim.observe(sent(model="qwen3:8b", estimate=4754), {"prompt_tokens": 2048})  # session 1's suspected one
    lim.observe(sent(model="gpt-4o", estimate=20_000), {"prompt_tokens": 26_000})  # a ratio, unstored
    seen = len(reads)
    for case in cases:
        now = lim.view_now(*case)
        assert now is not None and len(reads) == seen, case
        assert now == await lim.view(*case), case
    assert lim.view_now("t1", "qwen3:8b", 1).source == "session"  # type: ignore[union-attr]
    assert lim.view_now("t1", "fake-unknown", 1).tokens == 8192  # type: ignore[union-attr]
    monkeypatch.setattr(limits_module, "REFRESH_S", -1.0)  # every read is stale now
    assert lim.view_now("t2", "fake-unknown") is None  # read again by ``view``
    assert lim.view_now("t1", "gpt-4o", 1) is not None  # its ratio is not stored yet: not read again
    assert lim.view_now("t1", "m" * (MAX_MODEL_CHARS + 1), 1) is not None  # never read
