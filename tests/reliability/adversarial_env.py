"""The adversarial harness's parts: a ``context-proxy serve`` from any source tree, the upstream
process, resource probes of the proxy, a healthy client measuring what others wait, and cleanup.

Everything started here is a process group of its own, killed (SIGKILL to the group) by
``Cleanup.close`` whatever happened, Ctrl-C included.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import REPO_DIR, SHARED_DIR
from tests.support.ports import free_port

PROXY_NOFILE = 4096
"""File-descriptor limit the proxy runs with (``RLIMIT_NOFILE``), so that the idle-socket flood
reaches it with thousands of sockets instead of the machine's 20,000."""


class Cleanup:
    """Process groups to kill at the end (idempotent)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.callbacks: list[Any] = []

    def add(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for cb in reversed(self.callbacks):
            try:
                cb()
            except Exception as exc:  # noqa: BLE001 - cleanup goes on
                print(f"cleanup: {exc!r}", file=sys.stderr)
        self.callbacks.clear()
        for proc in self.procs:
            kill_group(proc)
        self.procs.clear()


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


class UpstreamProcess:
    """``python -m tests.reliability.adversarial_upstream`` (from this repository's tests)."""

    def __init__(self, cleanup: Cleanup) -> None:
        env = os.environ | {"TIKTOKEN_CACHE_DIR": str(SHARED_DIR / "tiktoken"), "PYTHONPATH": str(REPO_DIR)}
        self.proc = cleanup.add(subprocess.Popen([sys.executable, "-m", "tests.reliability.adversarial_upstream"], cwd=REPO_DIR,
                                                 env=env, stdout=subprocess.PIPE, start_new_session=True))
        assert self.proc.stdout is not None
        ports = json.loads(self.proc.stdout.readline())
        self.port, self.other_port = ports["upstream"], ports["other"]
        self.url = f"http://127.0.0.1:{self.port}"
        self._seen = 0

    def records(self, since: int = 0) -> list[dict[str, Any]]:
        return httpx.get(f"{self.url}/_adv/records", params={"since": since}, timeout=30).json()["records"]

    def mark(self) -> int:
        """Index of the next record (pass to ``records``)."""
        return len(self.records(0))


class Proxy:
    """``python -m proxy.cli serve`` from ``tree`` (cwd and PYTHONPATH), stderr kept in a file."""

    def __init__(self, tree: Path, tmp: Path, upstream_url: str, database_url: str, cleanup: Cleanup, **env: str) -> None:
        self.tree, self.cleanup = tree, cleanup
        self.port = free_port()
        self.log_path = tmp / f"serve-{self.port}.log"
        self.env = os.environ | {"TIKTOKEN_CACHE_DIR": str(SHARED_DIR / "tiktoken"), "PYTHONPATH": str(tree),
                                 "CONTEXT_PROXY_LOG_LEVEL": "info"} | env
        self.args = [sys.executable, "-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                     "--upstream-url", upstream_url, "--database-url", database_url, "--log-format", "json"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_error: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float = 60) -> bool:
        """True once ``/healthz`` answers; False (``start_error`` set) if it exited or hung."""
        with self.log_path.open("ab") as stderr:
            self.proc = self.cleanup.add(subprocess.Popen(self.args, cwd=self.tree, env=self.env, stdout=subprocess.DEVNULL,
                                                          stderr=stderr, start_new_session=True))
        resource.prlimit(self.proc.pid, resource.RLIMIT_NOFILE, (PROXY_NOFILE, PROXY_NOFILE))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.start_error = f"exited with {self.proc.returncode}: {self.log_text()[-600:]}"
                return False
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.start_error = "did not become healthy within 60 s"
        self.stop()
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            kill_group(self.proc)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # --- resources, from /proc ---------------------------------------------------------------

    def status_kb(self, key: str) -> int:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        except (OSError, AssertionError):
            pass
        return 0

    def rss_mb(self) -> float:
        return round(self.status_kb("VmRSS") / 1024, 1)

    def hwm_mb(self) -> float:
        return round(self.status_kb("VmHWM") / 1024, 1)

    def fds(self) -> int:
        try:
            return len(os.listdir(f"/proc/{self.pid}/fd"))
        except OSError:
            return 0


def chat_body(text: str, model: str = "fake-128k-openai", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


def key_headers(key: str, session: str | None = None, **more: str) -> dict[str, str]:
    h = {"authorization": f"Bearer {key}"}
    if session is not None:
        h["x-session-id"] = session
    return h | more


def uid(prefix: str = "") -> str:
    return prefix + uuid.uuid4().hex[:12]


@dataclass
class Healthy:
    """A plain small chat request in a loop (its own key and session), latencies recorded."""

    proxy: Proxy
    samples: list[tuple[float, float, int]] = field(default_factory=list)  # (start, seconds, status; 0 = transport error)
    inflight_since: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Healthy:
        self._thread = threading.Thread(target=self._run, daemon=True, name="healthy-client")
        self._thread.start()
        return self

    def _run(self) -> None:
        session = uid("healthy-")
        n = 0
        with httpx.Client(timeout=httpx.Timeout(60, connect=10)) as client:
            while not self._stop.is_set():
                n += 1
                t0 = time.monotonic()
                self.inflight_since = t0
                try:
                    status = client.post(self.proxy.url + "/v1/chat/completions", headers=key_headers("healthy-key", session),
                                         json=chat_body(f"healthy ping {n % 7}")).status_code
                except httpx.HTTPError:
                    status = 0
                self.samples.append((t0, time.monotonic() - t0, status))
                self.inflight_since = None
                self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(70)

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        lat = [s for st, s, _ in self.samples if t0 <= st <= t1]
        errors = sum(1 for st, _, status in self.samples if t0 <= st <= t1 and status != 200)
        pending = (t1 - self.inflight_since) if self.inflight_since is not None and self.inflight_since <= t1 else 0.0
        worst = max([*lat, pending]) if lat or pending else 0.0
        p99 = statistics.quantiles(lat, n=100, method="inclusive")[98] if len(lat) >= 2 else (lat[0] if lat else pending)
        return {"healthy_requests": len(lat), "healthy_errors": errors, "healthy_max_ms": round(worst * 1000),
                "healthy_p99_ms": round(p99 * 1000)}


MIN_WATCH_S = 1.5
"""A watch lasts at least this long (seconds), so that a quick attack still has healthy-client samples."""


class Watch:
    """Samples the proxy's RSS and fds every 0.1 s while open; ``figures`` when closed."""

    def __init__(self, proxy: Proxy, healthy: Healthy | None, rss_cap_mb: float = 6000) -> None:
        self.proxy, self.healthy, self.rss_cap_mb = proxy, healthy, rss_cap_mb
        self.figures: dict[str, Any] = {}
        self.over_cap = threading.Event()
        self._stop = threading.Event()

    def __enter__(self) -> Watch:
        self.t0 = time.monotonic()
        self.rss0, self.fds0 = self.proxy.rss_mb(), self.proxy.fds()
        self.rss_peak, self.fds_peak = self.rss0, self.fds0
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            rss, fds = self.proxy.rss_mb(), self.proxy.fds()
            self.rss_peak, self.fds_peak = max(self.rss_peak, rss), max(self.fds_peak, fds)
            if rss > self.rss_cap_mb:
                self.over_cap.set()

    def __exit__(self, *exc: object) -> None:
        time.sleep(max(0.0, self.t0 + MIN_WATCH_S - time.monotonic()))  # the healthy client gets a few turns
        self._stop.set()
        self._thread.join(5)
        t1 = time.monotonic()
        self.figures = {"seconds": round(t1 - self.t0, 1), "rss_start_mb": self.rss0, "rss_peak_mb": self.rss_peak,
                        "rss_growth_mb": round(self.rss_peak - self.rss0, 1), "rss_end_mb": self.proxy.rss_mb(),
                        "vmhwm_mb": self.proxy.hwm_mb(), "fds_start": self.fds0, "fds_peak": self.fds_peak}
        if self.healthy is not None:
            self.figures |= self.healthy.window(self.t0, t1)


# --- raw HTTP, the database as text, and the run's context ------------------------------------


def raw_http(port: int, method: str, target: str, headers: dict[str, str] | None = None, body: bytes = b"",
             timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """One request written byte for byte (``target`` as given, no normalisation), ``Connection: close``.
    Returns (status, lower-case headers, body); status 0 when the connection closed without an answer."""
    import socket

    lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body
    chunks: list[bytes] = []
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(data)
            while True:
                part = sock.recv(65536)
                if not part:
                    break
                chunks.append(part)
    except OSError:
        pass
    raw = b"".join(chunks)
    head, _, rest = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/"):
        return 0, {}, raw
    first, *hlines = head.decode("latin-1").split("\r\n")
    hdrs = {}
    for line in hlines:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    if hdrs.get("transfer-encoding") == "chunked":
        out, buf = b"", rest
        while buf:
            size_line, _, buf = buf.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            out, buf = out + buf[:size], buf[size + 2:]
        rest = out
    return int(first.split()[1]), hdrs, rest


def database_contains(database_url: str, needles: list[str]) -> set[str]:
    """Which of ``needles`` occur anywhere in the database (SQLite: every cell, zlib BLOBs opened;
    PostgreSQL: every row as JSON text)."""
    import zlib

    found: set[str] = set()
    if database_url.startswith("sqlite:///"):
        import sqlite3

        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            for table in tables:
                for row in conn.execute(f'SELECT * FROM "{table}"'):
                    for cell in row:
                        text = cell if isinstance(cell, str) else None
                        if isinstance(cell, bytes):
                            try:
                                text = zlib.decompress(cell).decode("utf-8", "replace")
                            except zlib.error:
                                text = cell.decode("utf-8", "replace")
                        if text:
                            found |= {n for n in needles if n in text}
        return found
    import psycopg

    with psycopg.connect(database_url) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'")]
        for table in tables:
            for (text,) in conn.execute(f'SELECT row_to_json(t)::text FROM "{table}" t'):
                found |= {n for n in needles if n in text}
    return found


@dataclass
class Ctx:
    """One run: the tree, the database, the upstream process, the proxies, and the results."""

    tree: Path
    tmp: Path
    db: str
    database_url: str
    upstream: UpstreamProcess
    cleanup: Cleanup
    results: list[dict[str, Any]] = field(default_factory=list)
    proxies: list[Proxy] = field(default_factory=list)
    markers: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)

    def marker(self) -> str:
        m = uid("advmark")
        self.markers.append(m)
        return m

    def key(self, prefix: str = "sk-adv-") -> str:
        k = uid(prefix) + uuid.uuid4().hex
        self.keys.append(k)
        return k

    def proxy(self, upstream_url: str | None = None, **env: str) -> Proxy:
        p = Proxy(self.tree, self.tmp, upstream_url or f"{self.upstream.url}/v1", self.database_url, self.cleanup, **env)
        self.proxies.append(p)
        return p

    def record(self, item: int, attempt: str, sent: str, outcome: str, detail: str, **figures: Any) -> None:
        """``outcome``: held | defect | n/a (the attack did not reach what it tests)."""
        self.results.append({"item": item, "attempt": attempt, "sent": sent, "outcome": outcome, "detail": detail,
                             "figures": figures})
        print(f"  [{item:>2}] {attempt}: {outcome.upper()} - {detail}", flush=True)
