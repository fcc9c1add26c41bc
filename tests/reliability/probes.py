"""What the reliability tests look through: the database's text, open TCP connections, a
dedicated PostgreSQL cluster, a ``context-proxy serve`` subprocess, log consistency, and the tally.

Nothing here replaces a part of the proxy: these observe real servers from the outside.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from storage.columns import unpack
from storage.tables import PACKED_COLUMNS
from tests.conftest import REPO_DIR, SHARED_DIR, _pg_binary
from tests.support.ports import free_port

ENVELOPE_KEYS = {"message", "type", "param", "code"}


@dataclass
class Tally:
    """Figures for RELIABILITY.md, added to by the tests (thread-safe)."""

    counts: Counter[str] = field(default_factory=Counter)
    notes: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def note(self, name: str, value: Any) -> None:
        with self._lock:
            self.notes[name] = value

    def as_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "notes": self.notes}


TALLY = Tally()


def assert_envelope(resp: httpx.Response, status: int | None = None) -> dict[str, Any]:
    """``resp`` is a 4xx/5xx in OpenAI's error envelope (and ``status`` if given); returns ``error``."""
    if status is not None:
        assert resp.status_code == status, (resp.status_code, resp.text[:300])
    assert resp.status_code >= 400, resp.status_code
    assert resp.headers.get("content-type", "").startswith("application/json"), resp.headers
    error = resp.json()["error"]
    assert set(error) >= ENVELOPE_KEYS and isinstance(error["message"], str) and error["message"]
    return error


# --- the database, as text -------------------------------------------------------------------


def database_text(database_url: str) -> str:
    """Every row of every table, as text (SQLite: its SQL dump; PostgreSQL: rows as JSON)."""
    if database_url.startswith("sqlite:///"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
            packed = [unpack(v).decode() for c in PACKED_COLUMNS  # compressed values, as their text
                      for (v,) in conn.execute(f"SELECT {c.name} FROM {c.table.name} WHERE typeof({c.name}) = 'blob'")]
            return "\n".join([*conn.iterdump(), *packed])
    import psycopg

    with psycopg.connect(database_url) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'")]
        lines: list[str] = []
        for table in tables:
            lines += [r[0] for r in conn.execute(f'SELECT row_to_json(t)::text FROM "{table}" t')]
        return "\n".join(lines)


def query(database_url: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` (plain, portable SQL) on SQLite or PostgreSQL."""
    if database_url.startswith("sqlite:///"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
            return list(conn.execute(sql))
    import psycopg

    with psycopg.connect(database_url) as conn:
        return list(conn.execute(sql))  # type: ignore[arg-type]


def log_consistency(database_url: str) -> dict[str, int]:
    """Check the log's invariants; returns rows checked. Raises ``AssertionError`` on a breach:
    duplicate ``(session, chain_hash)``, a message whose parent is missing (not prefix-closed), a
    message row that is not a whole message, an event whose anchor is not a message of its session."""
    import orjson

    rows = query(database_url, "SELECT session_pk, chain_hash, parent_hash, seq, role, message FROM messages")
    keys = Counter((r[0], r[1]) for r in rows)
    dupes = [k for k, n in keys.items() if n > 1]
    assert not dupes, f"duplicate messages: {dupes[:5]}"
    present = set(keys)
    for session_pk, chain_hash, parent, seq, role, message in rows:
        assert parent is None or (session_pk, parent) in present, f"message {chain_hash} of session {session_pk}: parent missing"
        assert (parent is None) == (seq == 0), f"message {chain_hash}: seq {seq} with parent {parent}"
        whole = orjson.loads(unpack(message))  # SQLite may hold it compressed
        assert isinstance(whole, dict) and whole.get("role") == role, f"half-written message {chain_hash}"
    events = query(database_url, "SELECT session_pk, id, anchor_hash FROM events")
    for session_pk, event_id, anchor in events:
        assert (session_pk, anchor) in present, f"event {event_id} anchored on a missing message"
    TALLY.add("rows_checked", len(rows) + len(events))
    return {"messages": len(rows), "events": len(events)}


# --- connections -------------------------------------------------------------------------------


def connections_to(port: int, pid: int | None = None) -> int:
    """ESTABLISHED TCP connections from process ``pid`` (default: this one) to 127.0.0.1:``port``."""
    proc = psutil.Process(pid or os.getpid())
    return sum(1 for c in proc.net_connections(kind="tcp")
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


# --- a dedicated PostgreSQL cluster --------------------------------------------------------------


class PgCluster:
    """A PostgreSQL cluster of its own (for tests that stop and start the database), on ``port``.

    Same setup as ``tests.conftest.postgres_server``: initdb once, trust auth, loopback only.
    """

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.root = Path(tempfile.mkdtemp(prefix="context-proxy-pg-rel-"))
        self.data = self.root / "data"
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run(_pg_binary("initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--locale=C", "--no-sync")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self._as, *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            log = self.root / "server.log"
            raise RuntimeError(f"{args[0]} failed: {done.stderr or done.stdout}\n{log.read_text()[-2000:] if log.exists() else ''}")

    def start(self) -> PgCluster:
        options = f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._run(_pg_binary("pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
                  "-o", options, "start")
        return self

    def stop(self) -> None:
        subprocess.run([*self._as, _pg_binary("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, check=False)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


# --- a `context-proxy serve` subprocess ---------------------------------------------------------


class ServeProcess:
    """``python -m proxy.cli serve`` on a free port; stderr (JSON log lines) kept in a file."""

    def __init__(self, tmp: Path, upstream_url: str, database_url: str, **env: str) -> None:
        self.port = free_port()
        self.stderr_path = tmp / f"serve-{self.port}.log"
        self.env = os.environ | {"TIKTOKEN_CACHE_DIR": str(SHARED_DIR / "tiktoken")} | env
        self.args = [sys.executable, "-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                     "--upstream-url", upstream_url, "--database-url", database_url, "--log-format", "json"]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30) -> ServeProcess:
        with self.stderr_path.open("ab") as stderr:
            self.proc = subprocess.Popen(self.args, cwd=REPO_DIR, env=self.env, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the proxy exited during startup: {self.stderr_path.read_text()[-2000:]}"
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError("the proxy did not become healthy")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def log_text(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""
