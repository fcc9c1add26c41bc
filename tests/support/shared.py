"""``../shared``, the test data next to the repository (not part of it), and the skips without it.

It holds tiktoken's encoding files (``tiktoken/``), agent traces (``traces/``) and provider cases
(``cases/``); README, "Quick start", says where it comes from. A public clone has none of them:
the proxy then counts with its byte estimate and the fake provider with its fallback
(``tests.fakes.tokens``), and tests that need the data skip with the reason. Nothing here
downloads: an encoding file is used only when present and matching the SHA-256 tiktoken pins.

- ``SHARED_DIR``, ``TRACES_DIR``, ``CASES_DIR``; ``tiktoken_cache_dir()``: ``$TIKTOKEN_CACHE_DIR``
  as the tests started, else ``../shared/tiktoken``: the directory to give the proxy
  (``Settings.tiktoken_cache_dir``); it may lack the files;
- ``has_exact_encoding(name="o200k_base")``: the file is there and intact;
- markers (``skipif`` with the reason): ``needs_exact_encodings`` for tests whose expected
  figures are exact tiktoken counts, ``needs_traces`` and ``needs_cases`` for the data.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from proxy.tokens.encodings import ENCODING_FILES, cache_file_for

REPO_DIR = Path(__file__).resolve().parents[2]
SHARED_DIR = REPO_DIR.parent / "shared"
TRACES_DIR = SHARED_DIR / "traces"
CASES_DIR = SHARED_DIR / "cases"


def shared_tiktoken_dir() -> Path:
    return SHARED_DIR / "tiktoken"


TIKTOKEN_DIR = os.environ.get("TIKTOKEN_CACHE_DIR") or str(SHARED_DIR / "tiktoken")
"""Read once, when the tests start: the app and tests may change the variable later."""


def tiktoken_cache_dir() -> str:
    return TIKTOKEN_DIR


def has_exact_encoding(name: str = "o200k_base", cache_dir: str | None = None) -> bool:
    """Whether ``name``'s file is in ``cache_dir`` (default ``tiktoken_cache_dir()``) and matches
    its pinned SHA-256 (else tiktoken would try to download it)."""
    path = cache_file_for(name, cache_dir or tiktoken_cache_dir())
    try:
        data = Path(path).read_bytes()
    except OSError:
        return False
    return hashlib.sha256(data).hexdigest() == ENCODING_FILES[name][1]


def exact_encodings_available() -> bool:
    return all(has_exact_encoding(name) for name in ENCODING_FILES)


NO_ENCODINGS_REASON = (
    f"needs tiktoken's exact encoding files (in {shared_tiktoken_dir()} or $TIKTOKEN_CACHE_DIR; "
    "see README, 'Quick start'): without them token counts are estimates"
)

needs_exact_encodings = pytest.mark.skipif(not exact_encodings_available(), reason=NO_ENCODINGS_REASON)

NO_TRACES_REASON = f"needs the shared agent traces in {TRACES_DIR} (see README, 'Quick start')"
NO_CASES_REASON = f"needs the shared provider cases in {CASES_DIR} (see README, 'Quick start')"

needs_traces = pytest.mark.skipif(not TRACES_DIR.is_dir(), reason=NO_TRACES_REASON)
needs_cases = pytest.mark.skipif(not CASES_DIR.is_dir(), reason=NO_CASES_REASON)
