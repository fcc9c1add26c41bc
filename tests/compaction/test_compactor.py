"""``ProjectingCompactor`` driven directly (in-process app for its store and upstream, no
sockets): it reads its input through ``CompactionInput`` only and never writes to it, logs the
client's messages before an event anchors on them, and serves the manual compaction tool from the
tools its last ``prepare`` counted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from proxy.compaction.base import Prepared
from proxy.compaction.compactor import ProjectingCompactor
from proxy.conversation.canonical import digests_and_chain
from storage.records import SessionRecord
from tests.benchmarks.inproc import InProcessProxy, fixed_upstream

MODEL = "m-4k"
WINDOW = 4096


@dataclass(frozen=True)
class Input:
    """A ``CompactionInput`` that cannot be written to (frozen), recording ``ensure_logged`` calls."""

    session: SessionRecord
    body: dict[str, Any]
    raw: bytes
    messages: list[dict[str, Any]]
    digests: list[str]
    chain: list[str]
    request_id: str = "req-1"
    tenant: str = "t1"
    model: str = MODEL
    upstream_headers: list[tuple[str, str]] = field(default_factory=list)
    compact_tool: bool = False
    escalated: bool = False
    expanded: bool = False
    prepared: Prepared | None = None
    internal: Sequence[dict[str, Any]] = ()
    logged: list[int] = field(default_factory=list)

    async def ensure_logged(self) -> object:
        self.logged.append(len(self.messages))
        return None


def input_for(session: SessionRecord, messages: list[dict[str, Any]], **fields: Any) -> Input:
    body = {"model": MODEL, "messages": messages}
    digests, chain = digests_and_chain(messages)
    return Input(session, body, orjson.dumps(body), messages, digests, chain, **fields)


def long_chat(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(turns):
        out += [{"role": "user", "content": f"question {i}: " + "words and more words " * 20},
                {"role": "assistant", "content": f"answer {i}: " + "reply text here " * 20}]
    out.append({"role": "user", "content": "and now?"})
    return out


async def test_prepare_compacts_through_the_interface_alone(tmp_path: Path) -> None:
    async with InProcessProxy(fixed_upstream(), windows={MODEL: WINDOW}, workdir=tmp_path) as p:
        compactor = p.pipeline.compactor
        assert isinstance(compactor, ProjectingCompactor)
        session = await p.store.get_or_create_session("t1", "s1", datetime.now(UTC))
        small = input_for(session, [{"role": "user", "content": "hi"}])
        untouched = await compactor.prepare(small, overflow=None)
        assert untouched.body is small.raw and small.logged == []

        ctx = input_for(session, long_chat(40))
        prepared = await compactor.prepare(ctx, overflow=None)
        events = await p.store.list_events(session.pk)
        assert [e.kind for e in events] == ["summary"] and prepared.event_ids == (events[0].id,)
        assert ctx.logged == [len(ctx.messages)], "the messages are logged before the event is stored"
        assert prepared.own_tools == {p.settings.read_tool_name}  # sent with the summary
        assert prepared.count_tools is None  # (counted before projecting: no events, no read URL yet)
        assert prepared.forwarded is not None and events[0].id in orjson.dumps(prepared.forwarded).decode()


async def test_compact_now_reads_the_tools_the_last_prepare_counted(tmp_path: Path) -> None:
    async with InProcessProxy(fixed_upstream(), windows={MODEL: WINDOW}, workdir=tmp_path) as p:
        compactor = p.pipeline.compactor
        session = await p.store.get_or_create_session("t1", "s2", datetime.now(UTC))
        ctx = input_for(session, [{"role": "user", "content": "hi"}], compact_tool=True)
        prepared = await compactor.prepare(ctx, overflow=None)
        assert prepared.count_tools is not None
        assert [t["function"]["name"] for t in prepared.count_tools] == [p.settings.compact_tool_name]
        after = input_for(session, ctx.messages, compact_tool=True, prepared=prepared)
        text = await compactor.compact_now(after)
        assert text.startswith("[context-proxy] Nothing to compact yet")
