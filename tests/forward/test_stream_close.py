"""A stream's cleanup (``Streamed.close``) is skipped when it has nothing left to do
(``Streamed.closed``): a stream relayed to its end was logged and released by the relay itself;
running the cleanup then cost a task of its own, shielded, for nothing. A stream the client left,
or never started, is still cleaned up: logged and released."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.forward.answers import Buffered, Streamed
from proxy.forward.pipeline import ChatPipeline
from proxy.telemetry.logs import close_request_context, open_request_context
from tests.support.inprocess import CLIENT_KEY, InProcessProxy

USER = {"role": "user", "content": "Count to twenty, slowly."}


class _Outcomes(list):  # type: ignore[type-arg]
    """Each streamed answer of ``ChatPipeline.handle``: ``(outcome, closed() as handed over,
    how many times its close ran)``; ``close`` counted in place."""

    def record(self, outcome: Streamed) -> None:
        entry: list[Any] = [outcome, outcome.closed() if outcome.closed else None, 0]
        close = outcome.close
        assert close is not None

        async def counted() -> None:
            entry[2] += 1
            await close()

        outcome.close = counted
        self.append(entry)


@pytest.fixture
def outcomes(monkeypatch: pytest.MonkeyPatch) -> _Outcomes:
    seen = _Outcomes()
    handle = ChatPipeline.handle

    async def recorded(self: ChatPipeline, *args: Any, **kwargs: Any) -> Buffered | Streamed:
        outcome = await handle(self, *args, **kwargs)
        if isinstance(outcome, Streamed):
            seen.record(outcome)
        return outcome

    monkeypatch.setattr(ChatPipeline, "handle", recorded)
    return seen


async def _records(proxy: InProcessProxy, session_id: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = (await proxy.http.get(f"/sessions/{session_id}/requests")).json()["data"]
    return data


async def test_a_stream_relayed_to_its_end_is_not_cleaned_up_again(inprocess_proxy: InProcessProxy,
                                                                   outcomes: _Outcomes) -> None:
    resp = await inprocess_proxy.chat({"model": "fake-8k-vllm", "messages": [USER], "stream": True},
                                      headers={"x-session-id": "to-the-end"})
    assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
    [(outcome, at_start, closes)] = outcomes
    assert at_start is False  # handed over, its relay not started: the cleanup would be needed
    assert outcome.closed is not None and outcome.closed()
    assert closes == 0
    await inprocess_proxy.wait_logged("to-the-end", requests=1)
    [record] = await _records(inprocess_proxy, "to-the-end")
    assert record["status"] == 200 and record["error"] is None  # complete, logged by the relay itself
    messages = (await inprocess_proxy.http.get("/sessions/to-the-end/messages")).json()["data"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    # the upstream response was released: the next stream is served as the first was
    again = await inprocess_proxy.chat({"model": "fake-8k-vllm", "messages": [USER], "stream": True},
                                       headers={"x-session-id": "to-the-end"})
    assert again.status_code == 200 and again.text.endswith("data: [DONE]\n\n")
    assert [entry[2] for entry in outcomes] == [0, 0]


def _pipeline_state(proxy: InProcessProxy) -> Any:
    return proxy.transport.app.state["proxy"]  # type: ignore[attr-defined]


async def _streamed(proxy: InProcessProxy, session_id: str) -> Streamed:
    """``ChatPipeline.handle`` of a streamed request, called as the chat route calls it."""
    state = _pipeline_state(proxy)
    headers = {"authorization": f"Bearer {CLIENT_KEY}", "content-type": "application/json",
               "x-session-id": session_id}
    raw = orjson.dumps({"model": "fake-8k-vllm", "messages": [USER], "stream": True})
    _, token = open_request_context()
    try:
        outcome = await state.pipeline.handle(raw, headers, list(headers.items()), state.auth.chat_tenant(headers))
    finally:
        close_request_context(token)
    assert isinstance(outcome, Streamed) and outcome.closed is not None and outcome.close is not None
    return outcome


@pytest.mark.parametrize("chunks_read", [0, 1])
async def test_a_stream_left_before_its_end_needs_its_cleanup_which_logs_it_partial(
        inprocess_proxy: InProcessProxy, chunks_read: int) -> None:
    """The relay never started (the client gone before the first byte), or stopped at a chunk it
    handed over (gone while the server sent it): ``closed()`` is false until ``close`` ran, which
    logs the request as far as it came."""
    session_id = f"left-after-{chunks_read}"
    outcome = await _streamed(inprocess_proxy, session_id)
    assert outcome.closed is not None and outcome.close is not None
    for _ in range(chunks_read):
        assert (await anext(aiter(outcome.chunks))).startswith(b"data: ")
    assert not outcome.closed()  # not started, or at a chunk: the relay's ``finally`` has not run
    await outcome.close()
    assert outcome.closed()
    await inprocess_proxy.wait_logged(session_id, requests=1)
    [record] = await _records(inprocess_proxy, session_id)
    assert record["error"] == "client disconnected"


async def test_a_stream_read_to_its_end_leaves_its_cleanup_nothing(inprocess_proxy: InProcessProxy) -> None:
    outcome = await _streamed(inprocess_proxy, "read")
    assert outcome.closed is not None
    body = b"".join([chunk async for chunk in outcome.chunks])
    assert body.endswith(b"data: [DONE]\n\n")
    assert outcome.closed()  # logged and released by the relay: no ``close``
    await inprocess_proxy.wait_logged("read", requests=1)
    [record] = await _records(inprocess_proxy, "read")
    assert record["status"] == 200 and record["error"] is None
