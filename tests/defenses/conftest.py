"""Fixtures of the defense tests: one real tiktoken counter (o200k_base from the shared cache)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(Path(__file__).resolve().parents[3] / "shared" / "tiktoken"))


@pytest.fixture(scope="session")
def counter():
    from proxy.tokens.counter import TokenCounter

    c = TokenCounter("o200k_base")
    if not c.exact:  # a public clone without ../shared: the expected figures are exact counts
        from tests.support.shared import NO_ENCODINGS_REASON

        pytest.skip(NO_ENCODINGS_REASON)
    return c
