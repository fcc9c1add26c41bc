"""The overhead section's server processes: the upstream, one per candidate, and the crowd.

Candidates (``kind``): ``proxy`` and ``baseline`` run as their tree's ``python -m proxy.cli serve``
(``SERVED``); ``awecompress`` as ``python -m awecompress.cli serve`` of a Python that has it
(optional, ``CONTEXT_PROXY_BENCH_AWECOMPRESS_PYTHON``); the others (``floor``, ``proxy-httpx``,
``litellm``) as ``python -m tests.benchmarks.servers KIND``. Every candidate is pinned to the
candidate core; the upstream to the load generator's core.

Crowded mode (``servers(..., crowd=N)``): ``N`` more servers of the candidates' own kinds
(bystanders, each with its own database and log) are up on the candidate core for the whole run,
idle while the measured candidate serves, as when many peers are installed and started side by
side (issue 21: nine processes, context-proxy's CPU per request doubled).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from tests.benchmarks import REPO_DIR, optional_python

if TYPE_CHECKING:
    from tests.benchmarks.baseline import Baseline

SERVED = ("proxy", "baseline")
"""Candidates run as their tree's ``python -m proxy.cli serve`` (what an operator runs: the HTTP
guard, the garbage-collector tuning and uvicorn's options of that tree), with the same flags and
environment; ``awecompress`` runs as its own CLI; the others are ``tests.benchmarks.servers`` kinds."""
PEERS = ("awecompress", "litellm")
"""Optional peers, measured when a Python that has them is at hand (``optional_kinds``)."""
CROWD_SIZE = 8
"""Servers on the candidate core in crowded mode, candidates included (issue 21's first run: seven
candidate servers beside the upstream and the load generator)."""

AWECOMPRESS_PYTHON_ENV = "CONTEXT_PROXY_BENCH_AWECOMPRESS_PYTHON"
"""A Python with ``awecompress`` installed (``pip install awecompress==0.2.0`` in a venv of its own)."""
AWECOMPRESS_NEVER_TOKENS = 1_000_000_000
"""awecompress's ``thresholdTokens`` in the benchmark: above any request, so it never summarizes
(a summary call would be an upstream round trip the others do not make) while every request still
goes through its whole per-request path (JSON parse, the SQLite lookup of the session's frozen
summary, the plan), as it does below its default threshold of 60,000 estimated tokens."""
LITELLM_PYTHON_ENV = "CONTEXT_PROXY_BENCH_LITELLM_PYTHON"
"""A Python with ``litellm[proxy]`` installed, when the test environment has none (LiteLLM pins
its own versions of httpx, openai and pydantic: a virtual environment of its own is cleaner)."""


def litellm_python() -> str | None:
    """The interpreter that runs LiteLLM's proxy: this one if it has ``litellm``, else the one
    named by ``CONTEXT_PROXY_BENCH_LITELLM_PYTHON`` if that has it; ``None``: not measured."""
    return optional_python("litellm", LITELLM_PYTHON_ENV)


def awecompress_python() -> str | None:
    """The interpreter that runs awecompress: this one if it has it, else the one named by
    ``CONTEXT_PROXY_BENCH_AWECOMPRESS_PYTHON`` if that has it; ``None``: not measured."""
    return optional_python("awecompress", AWECOMPRESS_PYTHON_ENV)


PEER_PYTHONS = {"awecompress": awecompress_python, "litellm": litellm_python}
PEER_INSTALL = {"awecompress": ("pip install awecompress==0.2.0", AWECOMPRESS_PYTHON_ENV),
                "litellm": ("pip install 'litellm[proxy]'", LITELLM_PYTHON_ENV)}


def peer_status(kind: str) -> str | None:
    """``None`` when the optional peer ``kind`` is measured, else why not."""
    if PEER_PYTHONS[kind]() is None:
        install, env = PEER_INSTALL[kind]
        return f"not installed (optional: `{install}` in the test environment, or set {env} to a Python that has it)"
    return None


def optional_kinds() -> tuple[str, ...]:
    """The optional peers this run can measure, in ``PEERS`` order."""
    return tuple(kind for kind in PEERS if PEER_PYTHONS[kind]() is not None)


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


def awecompress_command(python: str, port: int, upstream: str, workdir: Path) -> list[str]:
    """``awecompress serve`` in front of ``upstream`` (the upstream's base URL without ``/v1``:
    awecompress appends the client's path), its config file and summary store in ``workdir``
    (``thresholdTokens``: ``AWECOMPRESS_NEVER_TOKENS``)."""
    config = workdir / "awecompress.json"
    config.write_bytes(orjson.dumps({"port": port, "host": "127.0.0.1", "upstream": upstream,
                                     "thresholdTokens": AWECOMPRESS_NEVER_TOKENS,
                                     "dbPath": str(workdir / "awecompress.db")}))
    return [python, "-m", "awecompress.cli", "serve", "--port", str(port), "--host", "127.0.0.1", "--config", str(config)]


class Server:
    """A candidate's server process; ``url`` is its base URL (``http://127.0.0.1:P``).

    ``kind`` in ``SERVED``: ``python -m proxy.cli serve`` of ``tree`` (this repository when
    ``None``; ``env`` its environment), pinned to ``cpu``; ``awecompress``: its CLI run by
    ``python``; else a ``tests.benchmarks.servers`` process of this repository, which prints its
    port. ``workdir`` holds its log (``KIND.log``) and database."""

    def __init__(self, kind: str, cpu: int | None, workdir: Path, upstream: str | None = None,
                 ready_path: str = "/healthz", python: str = sys.executable, tree: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.kind = kind
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = open(workdir / f"{kind}.log", "wb")  # noqa: SIM115 (open while the server runs; stop() closes it)
        env = dict(env or os.environ)
        pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
        if kind in SERVED or kind == "awecompress":
            assert upstream, f"{kind} needs an upstream"
            port = free_port()
            if kind == "awecompress":
                env["AWECOMPRESS_CONFIG_DIR"] = str(workdir)
                cmd = awecompress_command(python, port, upstream.removesuffix("/v1"), workdir)
            else:
                env.setdefault("CONTEXT_PROXY_TIKTOKEN_CACHE_DIR", env.get("TIKTOKEN_CACHE_DIR", ""))
                # the Messages rows: the same fake upstream, without /v1 (a tree without the setting ignores it)
                env["CONTEXT_PROXY_ANTHROPIC_UPSTREAM_URL"] = upstream.removesuffix("/v1")
                cmd = serve_command(python, port, upstream, workdir / f"{kind}.db")
            self.proc = subprocess.Popen(cmd, cwd=tree or REPO_DIR, stdout=self.log, stderr=self.log, env=env,
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

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


READY_PATHS = {"litellm": "/health/liveliness", "awecompress": "/"}


def start(kind: str, cpu: int | None, workdir: Path, upstream: Server, baseline: Baseline | None = None) -> Server:
    """One candidate server of ``kind`` in front of ``upstream`` (see the module docstring)."""
    url = upstream.url + "/v1"
    if kind in PEERS:
        python = PEER_PYTHONS[kind]()
        assert python is not None, f"{kind} is not installed"
        return Server(kind, cpu, workdir, upstream=url, ready_path=READY_PATHS[kind], python=python)
    if kind == "baseline":
        assert baseline is not None, "the baseline candidate needs a baseline tree"
        return Server(kind, cpu, workdir, upstream=url, tree=baseline.tree, env=baseline.env())
    return Server(kind, cpu, workdir, upstream=url)


def crowd_kinds(kinds: tuple[str, ...], crowd: int) -> list[str]:
    """The bystanders' kinds: ``crowd`` servers cycling over the candidates' served kinds."""
    served = [k for k in kinds if k != "direct"]
    return [served[i % len(served)] for i in range(crowd)] if served else []


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
