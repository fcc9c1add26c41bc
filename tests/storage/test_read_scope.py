"""The read tool against a real store (SQLite and PostgreSQL): search with and without a
reference, reading by lines, and the session scope (issue 16 item 10, issue 17 items 1 and 5)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from proxy.defenses.offload import artifact_id
from proxy.tools.read_tool import Visible, serve_read
from storage.records import ArtifactRecord


def artifact(tenant: str, session_pk: int, text: str) -> ArtifactRecord:
    return ArtifactRecord(artifact_id(text), tenant, session_pk, "text/plain", text, len(text.encode()), text.count("\n") + 1,
                          datetime.now(UTC))


def log_with(fact: str, at: int, n: int = 3000) -> str:
    rows = [f"{i:05d} INFO processed batch {i}" for i in range(n)]
    rows[at] = fact
    return "\n".join(rows)


async def test_search_read_and_scope(store: Any) -> None:
    now = datetime.now(UTC)
    a = await store.get_or_create_session("t1", "sess-a", now)
    b = await store.get_or_create_session("t1", "sess-b", now)
    secret = log_with("FACT: token=SECRET-A", 1200)
    mine_old, mine_new = log_with("FACT: pin=1111", 100), log_with("FACT: pin=2222", 2900)
    await store.put_artifacts([artifact("t1", a.pk, secret), artifact("t1", b.pk, mine_old), artifact("t1", b.pk, mine_new)])
    ids = [artifact_id(t) for t in (secret, mine_old, mine_new)]
    visible = Visible(tuple(ids), frozenset(), ({"role": "user", "content": f"see {ids[0]}"},), "session")

    found = await serve_read(store, "t1", b, '{"query": "FACT pin"}', visible, 20_000)
    heads = [line for line in found.splitlines() if " · line " in line]
    assert heads[:2] == [f"{ids[2]} · line 2900: FACT: pin=2222", f"{ids[1]} · line 100: FACT: pin=1111"]  # most recent first
    assert "SECRET-A" not in found  # session A's artifact, only named by text in B, is not searched

    one = await serve_read(store, "t1", b, f'{{"query": "pin", "reference": "{ids[1]}"}}', visible, 20_000)
    assert f"{ids[1]} · line 100: FACT: pin=1111" in one and "2222" not in one
    page = await serve_read(store, "t1", b, f'{{"reference": "/artifacts/{ids[1]}?offset=0", "offset": 98, "limit": 5}}', visible, 20_000)
    assert page.splitlines()[0].startswith(f"[context-proxy] artifact {ids[1]}, lines 98-102 of 3000") and "FACT: pin=1111" in page

    denied = await serve_read(store, "t1", b, f'{{"reference": "{ids[0]}"}}', visible, 20_000)
    assert denied == f"[context-proxy] Nothing stored under {ids[0]} for this conversation."
    assert "SECRET-A" in await serve_read(store, "t1", b, f'{{"reference": "{ids[0]}", "offset": 1190}}',
                                          Visible(visible.artifacts, scope="tenant"), 20_000)
    # session B's own copy of the same content (stored under A first: ids are per tenant) reads
    own = Visible(visible.artifacts, client=({"role": "tool", "tool_call_id": "c", "content": secret},))
    assert "SECRET-A" in await serve_read(store, "t1", b, '{"query": "token"}', own, 20_000)
    assert "Nothing stored" in await serve_read(store, "t2", b, f'{{"reference": "{ids[1]}"}}', visible, 20_000)  # another tenant
