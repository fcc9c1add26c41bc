"""Storage growth: database bytes after replaying each shared trace (issue 7, item 4).

Each trace is replayed through the real app in-process as its agent sent it (before each
assistant message, the whole history so far), against an upstream that answers with the trace's
next assistant message, so the log ends equal to the trace. Then the app is closed, the SQLite
file is ``VACUUM``ed and its size, minus the size of the same empty migrated database, is the
trace's storage. It is compared with the sum of the unique messages' bytes (compact JSON; goal
≤ 1.2x) and with the naive log that stores every request body (O(N^2) in the turns). The
``messages`` table's own payload (bytes of ``messages.message`` as stored: zlib-compressed where
``storage.tables`` found that smaller) is shown too: the rest is per-row keys, hashes, indexes and
the per-request records. Every measure counts the bytes the database holds, compressed or not.
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.benchmarks import TRACES_DIR
from tests.benchmarks.config import BenchConfig
from tests.benchmarks.inproc import InProcessProxy
from tests.benchmarks.traces import load_trace, request_points


def scripted_upstream(replies: deque[dict[str, Any]]) -> httpx.MockTransport:
    """Answers each chat request with the next message of ``replies`` (a fixed text when empty)."""

    async def handler(request: httpx.Request) -> httpx.Response:
        await request.aread()
        message = replies.popleft() if replies else {"role": "assistant", "content": "ok"}
        body = {"id": "chatcmpl-s", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        return httpx.Response(200, content=orjson.dumps(body), headers={"content-type": "application/json"})

    return httpx.MockTransport(handler)


SCHEMA_TABLES = ("sqlite_schema", "alembic_version")


def vacuumed_size(db: Path) -> tuple[int, int, int | None]:
    """(file bytes after VACUUM, stored bytes of the ``messages.message`` column, row bytes of every
    table: SQLite's ``dbstat`` payload of the tables, indexes and schema excluded; ``None``
    when this SQLite has no ``dbstat``)."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        payload = conn.execute("SELECT COALESCE(SUM(length(CAST(message AS BLOB))), 0) FROM messages").fetchone()[0]
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'") if r[0] not in SCHEMA_TABLES]
        try:
            marks = ",".join("?" * len(tables))
            rows = conn.execute(f"SELECT COALESCE(SUM(payload), 0) FROM dbstat WHERE name IN ({marks})", tables).fetchone()[0]
        except sqlite3.OperationalError:
            rows = None
    finally:
        conn.close()
    return db.stat().st_size, int(payload), rows


async def replay_trace(path: Path, workdir: Path) -> dict[str, Any]:
    """Replay one trace; the row of the storage table."""
    trace = load_trace(path)
    points = request_points(trace)
    replies = deque(trace[i] for i in points)
    naive = 0
    async with InProcessProxy(scripted_upstream(replies), workdir=workdir) as proxy:
        for i in points:
            body = orjson.dumps({"model": "bench-model", "messages": trace[:i]})
            naive += len(body)
            resp = await proxy.chat(body, "storage")
            assert resp.status_code == 200, resp.text
        db = proxy.db_path
    size, payload, rows = vacuumed_size(db)
    unique = sum(len(orjson.dumps(m)) for m in trace)
    return {"trace": path.stem, "messages": len(trace), "requests": len(points), "db_bytes_total": size,
            "message_payload_bytes": payload, "row_bytes": rows, "unique_message_bytes": unique, "naive_log_bytes": naive}


async def empty_size(workdir: Path) -> int:
    async with InProcessProxy(scripted_upstream(deque()), workdir=workdir) as proxy:
        db = proxy.db_path
    return vacuumed_size(db)[0]


def run(cfg: BenchConfig) -> dict[str, Any]:
    """``{"traces": [row...], "empty_db_bytes", "vs_unique_max", "file_vs_unique_max", "vs_naive_max"}``.

    ``vs_unique``: the tables' row bytes over the unique messages' bytes (the goal's measure);
    ``file_vs_unique``: the VACUUMed file minus an empty database, over the same (adds SQLite's
    page slack, overflow pages and indexes)."""
    paths = sorted(p for p in TRACES_DIR.glob("*.jsonl") if not cfg.trace_filter or cfg.trace_filter in p.name)
    paths = paths[: cfg.storage_traces]

    async def main() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmp:
            base = Path(tmp)
            (base / "empty").mkdir()
            empty = await empty_size(base / "empty")
            rows = []
            for n, path in enumerate(paths):
                workdir = base / f"t{n}"
                workdir.mkdir()
                row = await replay_trace(path, workdir)
                row["db_bytes"] = row["db_bytes_total"] - empty
                row["file_vs_unique"] = row["db_bytes"] / row["unique_message_bytes"]
                row["rows_vs_unique"] = (row["row_bytes"] / row["unique_message_bytes"]) if row["row_bytes"] is not None else None
                row["vs_unique"] = row["rows_vs_unique"] if row["rows_vs_unique"] is not None else row["file_vs_unique"]
                row["payload_vs_unique"] = row["message_payload_bytes"] / row["unique_message_bytes"]
                row["vs_naive"] = row["db_bytes"] / row["naive_log_bytes"]
                rows.append(row)
                print(f"  storage {path.stem[:50]}: {row['db_bytes'] / 1e3:.0f} kB = {row['file_vs_unique']:.2f}x unique (file), "
                      f"{row['vs_unique']:.2f}x (row bytes), "
                      f"{row['vs_naive']:.3f}x naive", flush=True)
            return {"traces": rows, "empty_db_bytes": empty}

    out = asyncio.run(main())
    rows = out["traces"]
    total_db = sum(r["db_bytes"] for r in rows)
    total_unique = sum(r["unique_message_bytes"] for r in rows)
    out["vs_unique_max"] = max((r["vs_unique"] for r in rows), default=None)
    out["vs_unique_measure"] = "row bytes (dbstat payload of the tables)" if rows and rows[0]["row_bytes"] is not None else "file bytes"
    out["file_vs_unique_max"] = max((r["file_vs_unique"] for r in rows), default=None)
    out["file_vs_unique_all"] = total_db / total_unique if total_unique else None
    out["vs_naive_max"] = max((r["vs_naive"] for r in rows), default=None)
    return out
