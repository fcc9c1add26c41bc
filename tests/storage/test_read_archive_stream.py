"""The read tool over a big archive, on SQLite and PostgreSQL (review of issue 17's search): a
read by lines stops after the lines asked for, and a search streams pages (memory about one page
and the matches kept, not the archive)."""

from __future__ import annotations

import time
import tracemalloc
from datetime import UTC, datetime
from typing import Any

from proxy.defenses.hints import archive_url
from proxy.tools.read_tool import Visible, serve_read
from tests.storage.test_reads_archive import entries

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


async def big_session(store: Any, sid: str, messages: int = 400, chars: int = 20_000) -> Any:
    session = await store.get_or_create_session("t", sid, T0)
    talk = [{"role": "user" if i % 2 == 0 else "assistant",
             "content": f"message {i}\n" + "\n".join(f"{i}.{k} filler line " + "z" * 60 for k in range(chars // 80))}
            for i in range(messages)]
    talk[messages // 2]["content"] += "\nFACT: vault_code=7319"
    await store.append_messages(session.pk, entries(talk), T0)
    return session


async def test_a_read_by_lines_reads_no_further_than_asked(store: Any) -> None:
    session = await big_session(store, "big s#1")  # ~8 MB of archive, 400 messages
    pages: list[int] = []
    original = store.messages_by_ids

    async def counted(pk: int, ids: list[int]) -> Any:
        pages.append(len(ids))
        return await original(pk, ids)

    store.messages_by_ids = counted
    visible = Visible((), frozenset({session.session_id}))
    url = archive_url(session.session_id)
    out = await serve_read(store, "t", session, f'{{"reference": "{url}", "offset": 0, "limit": 10}}', visible, 20_000)
    assert "lines 0-9" in out and "continue with offset=10" in out
    assert sum(pages) < 40, pages  # a page or two of messages, not all 400


async def test_a_search_of_a_big_archive_holds_about_one_page(store: Any) -> None:
    session = await big_session(store, "big s#2", messages=800)  # ~16 MB of archive
    visible = Visible((), frozenset({session.session_id}))
    tracemalloc.start()
    try:
        out = await serve_read(store, "t", session, '{"query": "vault_code"}', visible, 20_000, deadline=time.monotonic() + 120)  # tracemalloc slows it
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "FACT: vault_code=7319" in out and f"{archive_url(session.session_id)} · line " in out
    assert peak < 8_000_000, peak  # about one page of messages (``proxy.tools.archive.PAGE_CHARS``), not 16 MB
