"""Fixtures of the reliability tests: the real-server tier's (``tests.support.real_server``: fake
upstream, proxy under uvicorn, both databases; registered by ``tests/conftest.py``) plus a tally
every test adds its figures to (cases, faults, requests, rows checked), printed at the end and
read by ``python -m tests.reliability``."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.app import create_app
from proxy.server.http_guard import server_options
from proxy.settings import Settings
from tests.conftest import SHARED_DIR
from tests.fakes.server import UvicornServer
from tests.reliability.probes import TALLY
from tests.support.real_server import Upstream


@pytest.fixture
def sqlite_database_url(tmp_path: Path, sqlite_template: Path) -> str:
    """A fresh migrated SQLite database (for tests whose subject does not depend on the database)."""
    path = tmp_path / "context-proxy.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def bounded(upstream: Upstream, sqlite_database_url: str) -> Iterator[Callable[..., UvicornServer]]:
    """``bounded(**settings)``: the proxy with those settings under uvicorn with ``server_options``
    (what ``context-proxy serve`` runs), in this process; stopped after the test."""
    started: list[UvicornServer] = []

    def make(**overrides: Any) -> UvicornServer:
        settings = Settings(upstream_url=upstream.url, database_url=sqlite_database_url,
                            tiktoken_cache_dir=str(SHARED_DIR / "tiktoken"), **overrides)
        server = UvicornServer(create_app(settings), **server_options(settings)).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture(scope="session", autouse=True)
def reliability_tally() -> Iterator[None]:
    """Write the figures to ``$CONTEXT_PROXY_RELIABILITY_TALLY`` (a JSON file) when set."""
    yield
    out = os.environ.get("CONTEXT_PROXY_RELIABILITY_TALLY")
    if out:
        with open(out, "w") as f:
            json.dump(TALLY.as_dict(), f, indent=2, sort_keys=True)
