"""Fixtures of the viewer's browser tests: one proxy under uvicorn (SQLite) over the strict fake
provider, seeded once per module (``tests.ui.seed``), and one headless Chromium per module; each
test opens its own tab (its own ``sessionStorage``, so each signs in)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import BrowserContext, ConsoleMessage, Page

from proxy.app import create_app
from proxy.routes.auth import tenant_of
from proxy.settings import Settings
from tests.fakes.anthropic import create_fake_anthropic
from tests.fakes.server import UvicornServer
from tests.fakes.upstream import create_fake_upstream
from tests.support.real_server import CLIENT_KEY, Proxy, Upstream
from tests.support.shared import SHARED_DIR, tiktoken_cache_dir
from tests.ui.browser import browser_context
from tests.ui.seed import MODELS_YAML, Seeded, seed_large, seed_messages, seed_sessions

OTHER_KEY = "sk-viewer-other-tenant-0123456789"
ADMIN_KEY = "sk-viewer-admin-0123456789"


@dataclass
class Viewer:
    proxy: Proxy
    seeded: Seeded

    @property
    def ui(self) -> str:
        return self.proxy.url + "/ui/"


@pytest.fixture(scope="module")
def viewer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Viewer]:
    if not (SHARED_DIR / "traces").is_dir():
        pytest.skip(f"{SHARED_DIR}/traces is absent (the shared traces live there)")
    data = tmp_path_factory.mktemp("viewer")
    database_url = f"sqlite+aiosqlite:///{data}/viewer.sqlite3"
    (data / "models.yaml").write_text(MODELS_YAML)
    app, state = create_fake_upstream()
    anthropic_app, anthropic_state = create_fake_anthropic()
    with UvicornServer(app) as upstream_server, UvicornServer(anthropic_app) as anthropic_server:
        upstream = Upstream(upstream_server, state)
        settings = Settings(upstream_url=upstream.url, database_url=database_url,
                            anthropic_upstream_url=anthropic_server.url,
                            anthropic_upstream_api_key="sk-ant-provider-held",
                            tiktoken_cache_dir=tiktoken_cache_dir(), upstream_api_key="sk-provider-held",
                            client_api_keys=f"{CLIENT_KEY},{OTHER_KEY}", admin_api_keys=ADMIN_KEY,
                            models_file=str(data / "models.yaml"))
        with UvicornServer(create_app(settings)) as server:
            proxy = Proxy(server, settings)
            seeded = seed_sessions(proxy, upstream, SHARED_DIR / "traces", OTHER_KEY)
            seed_messages(proxy, anthropic_state, CLIENT_KEY)
            seed_large(database_url, tenant_of(CLIENT_KEY, settings.tenant_salt))
            yield Viewer(proxy, seeded)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    with browser_context(tmp_path_factory.mktemp("chromium-profile")) as context:
        yield context


@pytest.fixture
def tab(browser: BrowserContext) -> Iterator[Page]:
    """A new tab; after the test, it must have logged no script error and no Content-Security-Policy
    violation (a refused inline script or style would be one) to the console. Failed calls to the read
    API (the tests' 401, 404 and 503 answers) are the only errors allowed: a failed load of the viewer's
    own files or of the icon (``/ui/...``, ``/favicon.ico``) is one."""
    page = browser.new_page()
    errors: list[str] = []

    def console(m: ConsoleMessage) -> None:
        if m.type == "error" and not (m.text.startswith("Failed to load resource") and _api_call(m.location.get("url", ""))):
            errors.append(f"{m.text} ({m.location.get('url')})")

    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.on("console", console)
    page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 and not _api_call(r.url) else None)
    try:
        yield page
    finally:
        page.close()
    assert errors == []


def _api_call(url: str) -> bool:
    """Whether ``url`` is a call to the read API, not one of the viewer's files or its icon."""
    path = urlsplit(url).path
    return bool(path) and not path.startswith("/ui") and path != "/favicon.ico"


def screenshots_dir() -> Path | None:
    """``CONTEXT_PROXY_UI_SCREENSHOTS``: where the tests save the main pages' screenshots, if set."""
    named = os.environ.get("CONTEXT_PROXY_UI_SCREENSHOTS")
    return Path(named) if named else None
