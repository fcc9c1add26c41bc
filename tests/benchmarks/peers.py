"""The optional peers of the overhead section (issue 21): which exist, how each is served, and how
to install it.

Each peer is measured when a Python that has it is at hand: this interpreter, else the one its
environment variable (``Peer.env``, ``CONTEXT_PROXY_BENCH_<NAME>_PYTHON``) names; in a virtual
environment of its own, since each pins its own versions of httpx, starlette or pydantic::

    python3 -m venv .bench-cliff && .bench-cliff/bin/pip install cliffcompaction==0.1.0
    CONTEXT_PROXY_BENCH_CLIFFCOMPACTION_PYTHON=.bench-cliff/bin/python python -m tests.benchmarks ...

Each runs as its operator runs it (its own CLI; LiteLLM as its proxy app under uvicorn,
``servers.litellm_app``) in front of the benchmark's fake upstream, configured so that it forwards
every request once: no summary call to the upstream (each summarizes or compacts above a size, set
above any request here), no cache answering in its place (headroom's semantic cache off, as in the
issue's table), no rate limit refusing the load, no network call of its own (update checks,
telemetry, remote price lists). ``command`` gives the command line and environment of each.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tests.benchmarks import optional_python


@dataclass(frozen=True)
class Peer:
    """One optional peer: ``kind`` (the candidate's name in results), ``name`` (its row in the peer
    table), ``modules`` (what its Python must import), ``dist`` (its distribution, for the version
    measured), ``install`` (the pip line), ``env`` (the variable naming a Python that has it),
    ``ready_path`` (a path it answers once serving: ``GET``, or ``POST`` under ``/v1/``)."""

    kind: str
    name: str
    modules: tuple[str, ...]
    dist: str
    install: str
    ready_path: str

    @property
    def env(self) -> str:
        return f"CONTEXT_PROXY_BENCH_{self.kind.upper().replace('-', '_')}_PYTHON"


NEVER_TOKENS = 1_000_000_000
"""Each peer's summary or compaction trigger in the benchmark (tokens, or a window in tokens): above
any request, so it never summarizes (a summary call would be an upstream round trip the others do
not make) while every request still goes through its whole per-request path (JSON parse, token
estimate, session lookup, plan), as it does below its default trigger."""

PEER_LIST = (
    Peer("awecompress", "awecompress", ("awecompress",), "awecompress", "pip install awecompress==0.2.0", "/"),
    Peer("cliffcompaction", "cliffcompaction", ("cliffcompaction",), "cliffcompaction",
         "pip install cliffcompaction==0.1.0", "/__cliff__/status"),
    Peer("context-guardian", "context-guardian", ("context_guardian",), "context-guardian",
         "pip install context-guardian==0.12.0", "/guardian/health"),
    Peer("headroom", "headroom-ai", ("headroom", "fastapi", "uvicorn"), "headroom-ai",
         "pip install 'headroom-ai[proxy]==0.42.0'", "/readyz"),
    Peer("litellm", "LiteLLM proxy", ("litellm",), "litellm", "pip install 'litellm[proxy]'",
         "/health/liveliness"),
)
PEERS = tuple(p.kind for p in PEER_LIST)
"""Optional peers, in the order they are measured (``optional_kinds``)."""
BY_KIND = {p.kind: p for p in PEER_LIST}
CLI_PEERS = ("awecompress", "cliffcompaction", "context-guardian", "headroom")
"""Peers run as their own command line (``command``); LiteLLM's app is served by ``servers``."""


def python_for(kind: str) -> str | None:
    """The interpreter that runs peer ``kind``: this one if it has the peer's modules, else the one
    its variable names if that has them; ``None``: not measured."""
    peer = BY_KIND[kind]
    return optional_python(peer.modules, peer.env)


def status(kind: str) -> str | None:
    """``None`` when the optional peer ``kind`` is measured, else why not and how to install it."""
    if python_for(kind) is None:
        peer = BY_KIND[kind]
        return (f"not installed (optional: `{peer.install}` in the test environment, or in a venv of its own "
                f"named by {peer.env})")
    return None


def optional_kinds() -> tuple[str, ...]:
    """The optional peers this run can measure, in ``PEERS`` order."""
    return tuple(kind for kind in PEERS if python_for(kind) is not None)


def version(kind: str) -> str | None:
    """The installed version of peer ``kind`` in the Python that runs it (``None``: not installed)."""
    python = python_for(kind)
    if python is None:
        return None
    probe = f"import importlib.metadata as m; print(m.version({BY_KIND[kind].dist!r}))"
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def command(kind: str, python: str, port: int, upstream: str, workdir: Path) -> tuple[list[str], dict[str, str]]:
    """The command line and the environment variables (added to the run's) that serve the CLI peer
    ``kind`` (``CLI_PEERS``) on ``127.0.0.1:port`` in front of ``upstream`` (the fake upstream's base
    URL, without ``/v1``), its state in ``workdir``; ``ValueError`` for another kind.

    - awecompress: ``awecompress serve`` with a config file (``thresholdTokens``: ``NEVER_TOKENS``;
      its summary store in ``workdir``); it appends the client's path to ``upstream``.
    - cliffcompaction: ``cliff serve`` (its console script's module) with both upstreams (it picks
      one by path and appends the path), ``--threshold NEVER_TOKENS`` (its compaction is local, but
      never triggered either); no state on disk.
    - context-guardian: its console script's ``main()``, configured by environment as documented:
      ``GUARDIAN_UPSTREAM_URL`` (with ``/v1``: it appends the path after ``/v1/``), the window
      ``GUARDIAN_NUM_CTX=NEVER_TOKENS``, no window probe of the upstream
      (``GUARDIAN_DETECT_CONTEXT=0``: it would ``GET /v1/models`` and ``/props``), no PyPI version
      check; its data directory (spans, logs) in ``workdir``. Its access and upstream log lines stay on.
    - headroom: ``headroom proxy`` with both upstream URLs (it appends ``/v1/...``), ``--no-cache``
      (its semantic cache would answer repeated requests itself), ``--no-rate-limit`` (60 requests
      a minute by default), ``--no-telemetry`` and ``--no-subscription-tracking`` (they poll
      provider sites); ``HOME`` in ``workdir`` (its ``~/.headroom`` state), the LiteLLM price list
      it loads read locally, the Hugging Face hub offline (its Kompress model is not downloaded;
      the benchmark's requests have nothing it would compress). Optimization stays on (its mode
      ``cache``: earlier turns frozen)."""
    host = "127.0.0.1"
    if kind == "awecompress":
        config = workdir / "awecompress.json"
        config.write_bytes(orjson.dumps({"port": port, "host": host, "upstream": upstream,
                                         "thresholdTokens": NEVER_TOKENS, "dbPath": str(workdir / "awecompress.db")}))
        return ([python, "-m", "awecompress.cli", "serve", "--port", str(port), "--host", host, "--config", str(config)],
                {"AWECOMPRESS_CONFIG_DIR": str(workdir)})
    if kind == "cliffcompaction":
        return ([python, "-m", "cliffcompaction", "serve", "--host", host, "--port", str(port), "--openai-upstream", upstream,
                 "--anthropic-upstream", upstream, "--threshold", str(NEVER_TOKENS)], {})
    if kind == "context-guardian":
        return ([python, "-c", "from context_guardian import main; main()"],
                {"GUARDIAN_HOST": host, "GUARDIAN_PORT": str(port), "GUARDIAN_UPSTREAM_URL": upstream + "/v1",
                 "GUARDIAN_NUM_CTX": str(NEVER_TOKENS), "GUARDIAN_DETECT_CONTEXT": "0", "GUARDIAN_VERSION_CHECK": "0",
                 "GUARDIAN_DATA_DIR": str(workdir / "context-guardian")})
    if kind == "headroom":
        return ([python, "-m", "headroom.cli", "proxy", "--host", host, "--port", str(port), "--openai-api-url", upstream,
                 "--anthropic-api-url", upstream, "--no-cache", "--no-rate-limit", "--no-telemetry",
                 "--no-subscription-tracking"],
                {"HOME": str(workdir / "headroom-home"), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"})
    raise ValueError(f"{kind} is not a peer served by its own command line")


def install_note() -> str:
    """How to measure the optional peers (the README's note): one sentence per peer."""
    parts = [f"{p.name}: `python3 -m venv .bench-{p.kind} && .bench-{p.kind}/bin/{p.install}`, then "
             f"`{p.env}=.bench-{p.kind}/bin/python`" for p in PEER_LIST]
    return ("The peers are measured when a Python with each is at hand, named by its variable on the command line ("
            + "; ".join(parts) + "). Each is served by its own command in front of the same fake upstream, its "
            "summary or compaction trigger above any request (it forwards every request once), headroom's cache off.")


def status_note(ov: dict[str, Any]) -> str:
    """One sentence of an overhead section (``overhead.run``): each optional peer measured (and its
    version) or why not."""
    status, versions = ov.get("peer_status") or {}, ov.get("peer_versions") or {}
    return "Peers: " + "; ".join(
        f"{BY_KIND[k].name} " + (status[k] if status.get(k) else f"measured ({versions.get(k) or 'version unknown'})")
        for k in PEERS) + "."
