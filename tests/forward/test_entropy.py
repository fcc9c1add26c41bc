"""proxy/forward/entropy.py: the request ids' random part, read from the system in blocks."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from proxy.forward.entropy import ENTROPY_POOL_BYTES, EntropyPool
from proxy.forward.session_log import new_id


def test_every_byte_read_is_handed_out_once_then_more_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[bytes] = []
    urandom = os.urandom

    def counted(n: int) -> bytes:
        reads.append(urandom(n))
        return reads[-1]

    monkeypatch.setattr(os, "urandom", counted)
    pool = EntropyPool(64)
    taken = [pool.hex(12) for _ in range(12)]  # 10 fit in 128 hex digits: the 11th reads again
    assert [len(r) for r in reads] == [64, 64]
    assert "".join(taken[:10]) == reads[0].hex()[:120]
    assert "".join(taken[10:]) == reads[1].hex()[:24]


def test_a_dropped_pool_reads_anew() -> None:
    """What a forked child does first (``os.register_at_fork``): it never hands out its parent's bytes."""
    pool = EntropyPool()
    pool.hex(12)
    kept = pool._hex
    pool.drop()
    assert pool._hex == "" and pool.hex(12) not in kept[12:]


def test_request_ids_from_a_pool_have_the_shape_and_stay_unique_whatever_seeds_random() -> None:
    pool = EntropyPool()
    ids = set()
    try:
        for _ in range(3 * ENTROPY_POOL_BYTES // 6):  # across two reads of the system's entropy
            random.seed(0)
            ids.add(new_id("req", pool))
    finally:
        random.seed()
    assert len(ids) == 3 * ENTROPY_POOL_BYTES // 6
    plain = new_id("req")
    for i in ids:
        assert len(i) == len(plain) == 28 and i[:4] == "req_" and int(i[4:], 16) >= 0
        assert i[4:16] <= plain[4:16]  # the time first, as without a pool


async def test_the_pipeline_draws_its_request_ids_from_its_pool(inprocess_proxy: Any) -> None:
    pool = inprocess_proxy.app.state.proxy.pipeline.entropy
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
    resp = await inprocess_proxy.chat(body)
    assert resp.status_code == 200
    request_id = resp.headers["x-context-proxy-request-id"]
    assert pool._at >= 12 and request_id[-12:] == pool._hex[pool._at - 12:pool._at]


def test_a_child_forked_while_another_thread_draws_ids_starts_with_a_pool_of_its_own() -> None:
    """The child's reset takes no lock (a parent thread may hold it at the fork: the child would
    hang in ``os.fork``), and one hook serves every pool (none registered per pool)."""
    import threading
    import time

    pool = EntropyPool()
    pool.hex(12)
    held, go = threading.Event(), threading.Event()

    def holder() -> None:
        with pool._lock:  # a thread inside ``hex`` at the moment of the fork
            held.set()
            go.wait()

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a fresh pool, its lock free
        os.write(write, b"ok" if pool._hex == "" and len(pool.hex(12)) == 12 else b"no")
        os._exit(0)
    go.set()
    thread.join()
    deadline = time.monotonic() + 10
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert done[0] == pid and os.read(read, 2) == b"ok"  # (it did not hang in the fork hook)


def test_pools_register_no_fork_hook_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    hooks: list[Any] = []
    monkeypatch.setattr(os, "register_at_fork", lambda **kw: hooks.append(kw))
    for _ in range(100):
        EntropyPool()
    assert hooks == []
