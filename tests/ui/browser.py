"""Debian's Chromium driven by Playwright (the Python package; its own browsers are never
downloaded: no ``playwright install``), headless and kept off the network.

The binary: ``CONTEXT_PROXY_TEST_CHROMIUM`` (``.ci/run`` installs Debian's ``chromium`` and sets
it), else ``/usr/bin/chromium``. Missing, the tests skip saying so, except in CI (``CI=true``) or
when the variable names it: then they fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, sync_playwright

DEFAULT = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def chromium() -> Path:
    """The Chromium binary, or skip (fail in CI or when ``CONTEXT_PROXY_TEST_CHROMIUM`` names one)."""
    named = os.environ.get("CONTEXT_PROXY_TEST_CHROMIUM")
    path = Path(named) if named else DEFAULT
    if path.is_file() and os.access(path, os.X_OK):
        return path
    reason = (f"Chromium is not installed at {path} (apt-get install -y chromium; .ci/run installs it, or set "
              "CONTEXT_PROXY_TEST_CHROMIUM)")
    if named or os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(reason)
    pytest.skip(reason)


@contextmanager
def browser_context(user_data_dir: Path) -> Iterator[BrowserContext]:
    """A headless Chromium with a fresh profile in ``user_data_dir``, closed on exit."""
    binary = chromium()
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(user_data_dir), executable_path=str(binary), headless=True, args=ARGS,
            viewport={"width": 1280, "height": 900}, service_workers="block")
        try:
            yield context
        finally:
            context.close()
