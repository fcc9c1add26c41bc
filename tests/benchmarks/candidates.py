"""The overhead section's server processes: the upstream, one per candidate, and the crowd.

Candidates (``kind``): ``proxy`` and ``baseline`` run as their tree's ``python -m proxy.cli serve``
(``SERVED``); the optional peers awecompress, cliffcompaction, context-guardian and headroom as
their own command line, run by a Python that has them (``peers.CLI_PEERS``, ``peers.command``);
the others (``floor``, ``proxy-httpx``, ``litellm``) as ``python -m tests.benchmarks.servers KIND``.
Every candidate is pinned to the candidate core; the upstream to the load generator's core.

Crowded mode (``servers(..., crowd=N)``): ``N`` more servers of the candidates' own kinds
(bystanders, each with its own database and log) are up on the candidate core for the whole run,
idle while the measured candidate serves, as when many peers are installed and started side by
side (issue 21: nine processes, context-proxy's CPU per request doubled).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tests.benchmarks import REPO_DIR, peers

if TYPE_CHECKING:
    from tests.benchmarks.baseline import Baseline

SERVED = ("proxy", "baseline")
"""Candidates run as their tree's ``python -m proxy.cli serve`` (what an operator runs: the HTTP
guard, the garbage-collector tuning and uvicorn's options of that tree), with the same flags and
environment; the CLI peers run as their own command (``peers.command``); the others are
``tests.benchmarks.servers`` kinds."""
CROWD_SIZE = 8
"""Servers on the candidate core in crowded mode, candidates included (issue 21's first run: seven
candidate servers beside the upstream and the load generator)."""


def cores() -> tuple[int | None, int | None]:
    """(core for load generator + upstream, core for the candidate); ``None`` on one core."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        return None, None
    return available[0], available[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(python: str, port: int, upstream: str, db: Path) -> list[str]:
    """``context-proxy serve`` as the benchmark runs it (every tree compared gets the same flags)."""
    return [python, "-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--upstream-url", upstream,
            "--database-url", f"sqlite:///{db}", "--log-format", "json"]


def process_state(pid: int) -> str | None:
    """The process's state letter from ``/proc/<pid>/stat`` (``R``, ``S``, ``T`` stopped, ...);
    ``None`` when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


class Server:
    """A candidate's server process; ``url`` is its base URL (``http://127.0.0.1:P``).

    ``kind`` in ``SERVED``: ``python -m proxy.cli serve`` of ``tree`` (this repository when
    ``None``; ``env`` its environment), pinned to ``cpu``; a CLI peer (``peers.CLI_PEERS``): its
    command run by ``python`` in ``workdir``; else a ``tests.benchmarks.servers`` process of this
    repository, which prints its port. ``workdir`` holds its log (``KIND.log``) and database."""

    def __init__(self, kind: str, cpu: int | None, workdir: Path, upstream: str | None = None,
                 ready_path: str = "/healthz", python: str = sys.executable, tree: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.kind = kind
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = open(workdir / f"{kind}.log", "wb")  # noqa: SIM115 (open while the server runs; stop() closes it)
        env = dict(env or os.environ)
        pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
        if kind in SERVED or kind in peers.CLI_PEERS:
            assert upstream, f"{kind} needs an upstream"
            port = free_port()
            cwd = tree or REPO_DIR
            if kind in peers.CLI_PEERS:  # in its workdir: this repository's packages must not shadow its own
                cmd, extra = peers.command(kind, python, port, upstream.removesuffix("/v1"), workdir)
                env.update(extra)
                cwd = workdir
            else:
                env.setdefault("CONTEXT_PROXY_TIKTOKEN_CACHE_DIR", env.get("TIKTOKEN_CACHE_DIR", ""))
                # the Messages rows: the same fake upstream, without /v1 (a tree without the setting ignores it)
                env["CONTEXT_PROXY_ANTHROPIC_UPSTREAM_URL"] = upstream.removesuffix("/v1")
                cmd = serve_command(python, port, upstream, workdir / f"{kind}.db")
            self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=self.log, stderr=self.log, env=env,
                                         preexec_fn=pin)
            self.url = f"http://127.0.0.1:{port}"
        else:
            cmd = [python, "-m", "tests.benchmarks.servers", kind, "--workdir", str(workdir)]
            if cpu is not None:
                cmd += ["--cpu", str(cpu)]
            if upstream:
                cmd += ["--upstream", upstream]
            self.proc = subprocess.Popen(cmd, cwd=REPO_DIR, stdout=subprocess.PIPE, stderr=self.log, env=env)
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline().decode()
            if not line.startswith("PORT "):
                self.stop()
                raise RuntimeError(f"server {kind} failed to start; see {workdir / (kind + '.log')}")
            self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        self._wait_ready(ready_path)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _wait_ready(self, path: str, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s  # LiteLLM's proxy takes seconds to import
        while True:
            try:
                data = b"{}" if path.startswith("/v1/") else None  # the upstream answers POSTs only
                with urllib.request.urlopen(urllib.request.Request(self.url + path, data=data), timeout=5) as r:
                    r.read()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"server {self.kind} not ready") from None
                time.sleep(0.05)

    def pause(self) -> None:
        """Stop the process (SIGSTOP): it runs nothing, not even its timers, until ``resume``.
        Returns once it is stopped (``/proc``'s state ``T``; at most 1 s)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP)
            deadline = time.monotonic() + 1.0
            while process_state(self.proc.pid) not in ("T", "t", "Z", None) and time.monotonic() < deadline:
                time.sleep(0.001)

    def resume(self) -> None:
        """Continue a paused process (SIGCONT; harmless when it runs); returns once it is no
        longer stopped (at most 1 s)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            deadline = time.monotonic() + 1.0
            while process_state(self.proc.pid) in ("T", "t") and time.monotonic() < deadline:
                time.sleep(0.001)

    def stop(self) -> None:
        self.resume()  # a paused process would hold SIGTERM until continued
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def start(kind: str, cpu: int | None, workdir: Path, upstream: Server, baseline: Baseline | None = None) -> Server:
    """One candidate server of ``kind`` in front of ``upstream`` (see the module docstring)."""
    url = upstream.url + "/v1"
    if kind in peers.PEERS:
        python = peers.python_for(kind)
        assert python is not None, f"{kind} is not installed"
        return Server(kind, cpu, workdir, upstream=url, ready_path=peers.BY_KIND[kind].ready_path, python=python)
    if kind == "baseline":
        assert baseline is not None, "the baseline candidate needs a baseline tree"
        return Server(kind, cpu, workdir, upstream=url, tree=baseline.tree, env=baseline.env())
    return Server(kind, cpu, workdir, upstream=url)


def crowd_kinds(kinds: tuple[str, ...], crowd: int) -> list[str]:
    """The bystanders' kinds: ``crowd`` servers cycling over the candidates' served kinds."""
    served = [k for k in kinds if k != "direct"]
    return [served[i % len(served)] for i in range(crowd)] if served else []


@contextlib.contextmanager
def alone(srv: dict[str, Server | None], kind: str) -> Iterator[None]:
    """Every candidate server but ``kind``'s paused while the block runs (quiet mode: the one
    measured has the candidate core to itself, however many peers are installed and up; the
    upstream is never paused), all resumed after it."""
    others = [s for name, s in srv.items() if s is not None and name not in ("upstream", kind)]
    try:
        for server in others:
            server.pause()
        yield
    finally:
        for server in others:
            server.resume()


@contextlib.contextmanager
def servers(workdir: Path, kinds: tuple[str, ...], baseline: Baseline | None = None,
            crowd: int = 0) -> Iterator[dict[str, Server | None]]:
    """The upstream plus one server per candidate kind (``direct`` has none) and ``crowd``
    bystanders (keys ``crowd-0``, ``crowd-1``, ...); ``baseline``: the tree served as the
    ``baseline`` kind."""
    near, far = cores()
    started: list[Server] = []
    try:
        upstream = Server("upstream", near, workdir, ready_path="/v1/chat/completions")
        started.append(upstream)
        out: dict[str, Server | None] = {"upstream": upstream, "direct": None}
        for kind in kinds:
            if kind != "direct":
                out[kind] = start(kind, far, workdir, upstream, baseline)
                started.append(out[kind])  # type: ignore[arg-type]
        for i, kind in enumerate(crowd_kinds(kinds, crowd)):
            out[f"crowd-{i}"] = start(kind, far, workdir / f"crowd-{i}", upstream, baseline)
            started.append(out[f"crowd-{i}"])  # type: ignore[arg-type]
        yield out
    finally:
        for server in reversed(started):
            server.stop()
