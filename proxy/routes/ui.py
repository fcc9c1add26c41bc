"""The web viewer at ``/ui``: static files (HTML, ES modules, CSS) from the package's ``ui``
directory, no build step. The pages call the read API with the key the user signs in with (kept
in the tab's ``sessionStorage``); nothing here reads a key or the store.

Every ``/ui`` response carries ``SECURITY_HEADERS``: a Content-Security-Policy that runs only the
viewer's own scripts (no inline script, no ``eval``, no plugin, no framing, no ``<base>``), and
headers that stop MIME sniffing and referrers. ``/ui`` is not in the OpenAPI schema (it is HTML).

``router``: ``GET /`` redirects (307) to the viewer, ``GET /favicon.ico`` answers the viewer's icon
(``favicon.svg``), so a browser pointed at the proxy's root finds a page and logs no 404.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from starlette.datastructures import MutableHeaders
from starlette.responses import FileResponse, RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UI_DIR = Path(__file__).resolve().parent.parent / "ui"
"""The viewer's files (package data: ``pyproject.toml`` ships ``proxy/ui/*``)."""
FAVICON = UI_DIR / "favicon.svg"

router = APIRouter(include_in_schema=False)

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; "
       "require-trusted-types-for 'script'; trusted-types 'none'")  # any HTML sink (innerHTML, ...) throws
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-cache",
}


class SecuredFiles:
    """``app`` (the static files) with ``SECURITY_HEADERS`` on every response it starts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, secured)


def ui_app() -> SecuredFiles:
    """The ``/ui`` mount: ``index.html`` at ``/ui/``, the other files by name."""
    return SecuredFiles(StaticFiles(directory=UI_DIR, html=True))


@router.get("/")
async def root(request: Request) -> RedirectResponse:
    """307 to ``/ui/`` (under the app's ``root_path``)."""
    return RedirectResponse(f"{request.scope.get('root_path', '')}/ui/", status_code=307)


@router.get("/favicon.ico")
async def favicon() -> FileResponse:
    """The viewer's icon, an SVG (``image/svg+xml``), with ``SECURITY_HEADERS``."""
    return FileResponse(FAVICON, media_type="image/svg+xml", headers=SECURITY_HEADERS)
