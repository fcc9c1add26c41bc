"""A stream's early write of the client's messages (``ChatContext.append_early``): made when this
process does not know them stored, skipped when it does (a regenerate, a retry: the same history
again), with the same rows and records either way."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.forward.log_writer import LogWriter
from proxy.forward.session_log import LoggedRequest, SessionLog
from tests.support.inprocess import InProcessProxy

USER = {"role": "user", "content": "Tell me about the early write."}


async def _stream(proxy: InProcessProxy, messages: list[dict[str, Any]]) -> str:
    resp = await proxy.chat({"model": "fake-8k-vllm", "messages": messages, "stream": True},
                            headers={"x-session-id": "early"})
    assert resp.status_code == 200 and "data: [DONE]" in resp.text
    return resp.text


async def test_a_history_known_stored_is_not_written_again_while_the_stream_runs(
        inprocess_proxy: InProcessProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    appended: list[int] = []
    append = SessionLog.append_request

    async def counted(self: SessionLog, session: Any, messages: list[dict[str, Any]],
                      chain: list[str]) -> LoggedRequest:
        appended.append(len(messages))
        return await append(self, session, messages, chain)

    monkeypatch.setattr(SessionLog, "append_request", counted)
    await _stream(inprocess_proxy, [USER])  # a new history: written while the stream runs
    await inprocess_proxy.wait_logged("early", requests=1)
    assert appended == [1]
    await _stream(inprocess_proxy, [USER])  # the same again (a regenerate): known stored
    session = await inprocess_proxy.wait_logged("early", requests=2)
    assert appended == [1]  # no early write the second time
    records = (await inprocess_proxy.http.get("/sessions/early/requests")).json()["data"]
    assert sorted((r["added_messages"], r["first_added_seq"]) for r in records) == [(0, None), (1, 0)]
    messages = (await inprocess_proxy.http.get("/sessions/early/messages")).json()["data"]
    assert [m["role"] for m in messages] == ["user", "assistant"]  # the same reply, stored once
    assert session["request_count"] == 2


async def test_a_complete_stream_s_log_write_is_built_once_its_last_byte_is_handed_over(
        inprocess_proxy: InProcessProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream that ended complete hands the server its end (``more_body: False``) before the
    record and rows are built (``LogWriter.finish(after_answer=True)``, as a whole answer): the
    client's last byte waits for no log work (it did: the write was built before the end was sent)."""
    order: list[str] = []
    write = LogWriter._write

    def recorded(self: LogWriter, *args: Any) -> None:
        order.append("write")
        write(self, *args)

    monkeypatch.setattr(LogWriter, "_write", recorded)
    app = inprocess_proxy.transport.app

    async def watched(scope: Any, receive: Any, send: Any) -> None:
        async def sent(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False) \
                    and scope["path"] == "/v1/chat/completions":
                order.append("end")
            await send(message)

        await app(scope, receive, sent)

    monkeypatch.setattr(inprocess_proxy.transport, "app", watched)
    await _stream(inprocess_proxy, [USER])  # a new history: its messages written while the stream runs
    await inprocess_proxy.wait_logged("early", requests=1)
    order.clear()
    await _stream(inprocess_proxy, [USER])  # known stored: the reply and record written at the end
    await inprocess_proxy.wait_logged("early", requests=2)
    assert order == ["end", "write"]
