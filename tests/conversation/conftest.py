"""Fixtures of the conversation-model tests: a token counter (exact or its byte estimate: these
tests compare structure and relative costs, never exact figures)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proxy.tokens.counter import TokenCounter

os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(Path(__file__).resolve().parents[3] / "shared" / "tiktoken"))


@pytest.fixture(scope="session")
def counter() -> TokenCounter:
    return TokenCounter("o200k_base")
