"""proxy/forward/pipeline.py and rounds.py, in process: a database that fails, per ``database_failure_mode``.

The failure is injected where the pipeline meets the database (opening the session; the
compactor's ``prepare``) by replacing that call on the app's own objects; the fake provider answers.
Open: the request is forwarded (unlogged, or uncompacted) with a warning header, streamed or not;
closed: a 503 in OpenAI's envelope. Either way the database is then marked down and probed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.forward.pipeline import DEGRADED_WARNING, ChatPipeline
from storage.errors import StorageUnavailable
from tests.support.inprocess import FakeProvider, InProcessProxy

USER = {"role": "user", "content": "hello there"}


def pipeline_of(proxy: InProcessProxy) -> ChatPipeline:
    pipeline: ChatPipeline = proxy.app.state.proxy.pipeline
    return pipeline


def fail(*_: Any, **__: Any) -> Any:
    raise StorageUnavailable("the database went away")


async def answer(proxy: InProcessProxy, stream: bool, session: str) -> tuple[int, dict[str, str], str]:
    """``(status, headers, answer text)`` of one request (a stream's text joined from its deltas)."""
    payload: dict[str, Any] = {"model": "fake-8k-openai", "messages": [USER], "stream": stream}
    headers = {"x-session-id": session}
    if not stream:
        resp = await proxy.chat(payload, headers=headers)
        text = resp.json()["choices"][0]["message"]["content"] if resp.status_code == 200 else resp.text
        return resp.status_code, dict(resp.headers), text
    async with proxy.http.stream("POST", "/v1/chat/completions", json=payload, headers=headers) as r:
        raw = (await r.aread()).decode()
    events = [e[6:] for e in raw.split("\n\n") if e.startswith("data: ")]
    if r.status_code != 200:
        return r.status_code, dict(r.headers), raw
    assert events[-1] == "[DONE]", raw
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in map(json.loads, events[:-1]) if c.get("choices"))
    return r.status_code, dict(r.headers), text


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "streamed"])
async def test_open_forwards_unlogged_when_the_session_cannot_be_opened(
    stream: bool, inprocess_factory: Any, fake_provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = await inprocess_factory(database_failure_mode="open")
    pipeline = pipeline_of(proxy)
    monkeypatch.setattr(pipeline.log, "open_session", fail)
    status, headers, text = await answer(proxy, stream, "down")
    assert status == 200 and text == "OK: hello there"
    assert headers["x-context-proxy-warning"] == DEGRADED_WARNING
    assert "x-context-proxy-session-id" not in headers  # nothing was logged: no session to name
    assert fake_provider.state.model_requests[-1].json["messages"] == [USER]  # the client's body as sent
    assert pipeline.health.down  # marked down: the next request probes first
    monkeypatch.undo()
    status, headers, _ = await answer(proxy, stream, "up")  # the probe answers: logged again
    assert status == 200 and "x-context-proxy-warning" not in headers and not pipeline.health.down
    await proxy.wait_logged("up", requests=1)


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "streamed"])
async def test_closed_answers_503(stream: bool, inprocess_factory: Any, fake_provider: FakeProvider,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = await inprocess_factory(database_failure_mode="closed")
    monkeypatch.setattr(pipeline_of(proxy).log, "open_session", fail)
    status, _, text = await answer(proxy, stream, "down")
    assert status == 503
    assert json.loads(text)["error"]["code"] == "database_unavailable"
    assert fake_provider.state.model_requests == []  # nothing forwarded


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "streamed"])
async def test_open_forwards_uncompacted_when_preparing_fails(
    stream: bool, inprocess_factory: Any, fake_provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = await inprocess_factory(database_failure_mode="open")
    pipeline = pipeline_of(proxy)
    monkeypatch.setattr(pipeline.compactor, "prepare", fail)
    status, headers, text = await answer(proxy, stream, "half")
    assert status == 200 and text == "OK: hello there"
    assert headers["x-context-proxy-warning"] == DEGRADED_WARNING
    assert headers["x-context-proxy-session-id"] == "half"  # the session was opened: the reply is logged
    sent = fake_provider.state.model_requests[-1]
    assert sent.json == {"model": "fake-8k-openai", "messages": [USER], "stream": stream}  # the client's bytes
    monkeypatch.undo()
    await proxy.wait_logged("half", requests=1)


async def test_only_a_database_marked_down_is_probed(
    inprocess_factory: Any, fake_provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An up database's answer is read from ``health.down`` without awaiting ``usable`` (its answer
    then is True all the same); once marked down, each request awaits ``usable`` (the probe)."""
    proxy = await inprocess_factory(database_failure_mode="open")
    health = pipeline_of(proxy).health
    asked: list[bool] = []
    usable = health.usable

    async def counted() -> bool:
        ok = await usable()
        asked.append(ok)
        return ok

    monkeypatch.setattr(health, "usable", counted)
    status, headers, _ = await answer(proxy, False, "up")
    assert status == 200 and "x-context-proxy-warning" not in headers
    assert asked == [] and await usable() is True  # not asked: True is what it would have said
    health.failed()  # marked down: the next request awaits the probe, which finds the database up
    status, headers, _ = await answer(proxy, False, "up")
    assert status == 200 and "x-context-proxy-warning" not in headers
    assert asked == [True] and not health.down
    await proxy.wait_logged("up", requests=2)
