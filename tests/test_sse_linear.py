"""Issue 16 item 3: the SSE splitter works in linear time on an event that never ends (no blank
line): 40 MB fed in 64 KiB chunks costs about four times 10 MB, not sixteen (a re-scan of the
whole buffer per chunk is quadratic: a 131 MB event once took 28 s). Its buffer stays under the
8 MiB event cap, and the event is dropped (counted), not kept."""

from __future__ import annotations

import time

from proxy.forward.sse import SSESplitter

CHUNK = b"data: " + b"x" * (64 * 1024 - 6)


def _feed(megabytes: int) -> tuple[float, SSESplitter]:
    splitter = SSESplitter()
    chunks = megabytes * 16
    started = time.perf_counter()
    for _ in range(chunks):
        assert splitter.feed(CHUNK) == []
        assert len(splitter._buf) <= SSESplitter.MAX_EVENT_BYTES + len(CHUNK)
    return time.perf_counter() - started, splitter


def test_an_endless_event_is_split_in_linear_time_and_dropped() -> None:
    _feed(2)  # warm-up
    small = min(_feed(10)[0] for _ in range(3))
    large, splitter = _feed(40)
    assert splitter.dropped == 1
    # linear: ~4x; quadratic: ~16x (a generous bound, not a timing benchmark)
    assert large < 8 * small, (small, large)
    assert splitter.feed(b"\n\ndata: {}\n\n")[0].data == b"{}"  # the next event is whole again
