"""Benchmarks against the anchors, measured side by side in one run (issue 7).

    python -m tests.benchmarks --out DIR            # full
    python -m tests.benchmarks --quick --out DIR    # under 3 minutes on 2 cores
    python -m tests.benchmarks --compare REV --out DIR   # REV's proxy beside this one (baseline.py)

Sections (each a module with ``run(cfg) -> dict``): ``overhead`` (pass-through latency, requests/s
and CPU per request against a direct call, a raw aiohttp relay and the proxy, servers in their own
processes), ``pipeline`` (the proxy's own CPU time per request against history length),
``storage_growth`` (database bytes after replaying each shared trace), ``compression`` (tokens
forwarded on real traces at 16k/32k/128k windows). ``report`` writes ``report.md``, the plots,
``results.json`` and the README's Performance section.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[2]
SHARED_ENV = "CONTEXT_PROXY_BENCH_SHARED"
"""Where ``shared/`` is (traces, tiktoken files) when not beside the repository: set for the
baseline's child process, which runs in a temporary copy of another tree."""
SHARED_DIR = Path(os.environ.get(SHARED_ENV) or REPO_DIR.parent / "shared")
TRACES_DIR = SHARED_DIR / "traces"
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED_DIR / "tiktoken"))


def optional_python(modules: str | tuple[str, ...], env_var: str) -> str | None:
    """An interpreter that can import ``modules`` (an optional comparison's packages): this one, else
    the one the environment variable ``env_var`` names if it can; ``None`` when neither can."""
    names = (modules,) if isinstance(modules, str) else modules
    if all(importlib.util.find_spec(name) is not None for name in names):
        return sys.executable
    other = os.environ.get(env_var)
    probe = f"import importlib.util, sys; sys.exit(any(importlib.util.find_spec(n) is None for n in {names!r}))"
    if other and subprocess.run([other, "-c", probe], capture_output=True, check=False).returncode == 0:
        return other
    return None
