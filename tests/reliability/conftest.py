"""Fixtures of the reliability tests: the real-server tier's (``tests.support.real_server``: fake
upstream, proxy under uvicorn, both databases; registered by ``tests/conftest.py``) plus a tally
every test adds its figures to (cases, faults, requests, rows checked), printed at the end and
read by ``python -m tests.reliability``."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.probes import TALLY


@pytest.fixture
def sqlite_database_url(tmp_path: Path, sqlite_template: Path) -> str:
    """A fresh migrated SQLite database (for tests whose subject does not depend on the database)."""
    path = tmp_path / "context-proxy.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="session", autouse=True)
def reliability_tally() -> Iterator[None]:
    """Write the figures to ``$CONTEXT_PROXY_RELIABILITY_TALLY`` (a JSON file) when set."""
    yield
    out = os.environ.get("CONTEXT_PROXY_RELIABILITY_TALLY")
    if out:
        with open(out, "w") as f:
            json.dump(TALLY.as_dict(), f, indent=2, sort_keys=True)
