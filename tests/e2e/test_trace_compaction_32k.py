"""Every shared trace at a 32k window the proxy knows from a models file (see
``test_trace_compaction``). On SQLite only: the 16k set already runs on both databases, and the
storage path does not depend on the window (CI time)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Upstream
from tests.e2e.test_trace_compaction import NO_TRACES, TRACES, run_trace


@pytest.fixture
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """This module's database: a fresh migrated SQLite file (overrides the two-database fixture)."""
    import shutil

    path = tmp_path / "context-proxy.db"
    shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
    yield f"sqlite:///{path}"


@pytest.mark.skipif(not TRACES, reason=NO_TRACES)
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem.split("__")[1])
def test_trace_replay_at_32k_with_a_known_window(path: Path, proxy_factory: Any, upstream: Upstream, tmp_path: Path) -> None:
    run_trace(path, 32_768, proxy_factory, upstream, tmp_path)
