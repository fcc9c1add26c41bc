"""The API's documentation pages, served without internet: Swagger UI at ``/docs`` and ReDoc at
``/redoc``, their JavaScript, CSS and icon from ``/docs/assets/`` (``ASSETS_URL``).

FastAPI's own pages load those assets from a CDN, so without internet ``/docs`` was a blank page
(issue 20). The assets come pinned from the ``fastapi-offline`` package (its ``static`` folder: Swagger
UI's bundle and CSS, ReDoc's standalone bundle, the favicon); the pages are FastAPI's
(``fastapi.openapi.docs``) pointed at them, and ReDoc's Google fonts are left out.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.security import HTTPBearer
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"
"""``swagger-ui-bundle.js``, ``swagger-ui.css``, ``redoc.standalone.js``, ``favicon.png``."""
ASSETS_URL = "/docs/assets"
DOCS_URL, REDOC_URL, OAUTH2_REDIRECT_URL = "/docs", "/redoc", "/docs/oauth2-redirect"

KEY_IN_SCHEMA = Depends(HTTPBearer(
    auto_error=False, scheme_name="key",
    description="A client key of this proxy (an admin key reads every tenant), as `Authorization: Bearer KEY`."))
"""The read and limits routes' key as the schema declares it (HTTP bearer: the Authorize button of
``/docs``, so "Try it out" sends the key). A router dependency (``proxy.app``) for the schema only: it
refuses nothing (``auto_error=False``); ``proxy.routes.auth.Authenticator`` decides who may read what."""

router = APIRouter(include_in_schema=False)


def _assets(request: Request) -> str:
    return f"{request.scope.get('root_path', '')}{ASSETS_URL}"


def _openapi_url(request: Request) -> str:
    return f"{request.scope.get('root_path', '')}{request.app.openapi_url}"


@router.get(DOCS_URL)
async def swagger_ui(request: Request) -> HTMLResponse:
    assets = _assets(request)
    return get_swagger_ui_html(
        openapi_url=_openapi_url(request), title=f"{request.app.title} - Swagger UI",
        oauth2_redirect_url=OAUTH2_REDIRECT_URL, swagger_js_url=f"{assets}/swagger-ui-bundle.js",
        swagger_css_url=f"{assets}/swagger-ui.css", swagger_favicon_url=f"{assets}/favicon.png",
        swagger_ui_parameters=request.app.swagger_ui_parameters,
    )


@router.get(OAUTH2_REDIRECT_URL)
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get(REDOC_URL)
async def redoc(request: Request) -> HTMLResponse:
    assets = _assets(request)
    return get_redoc_html(
        openapi_url=_openapi_url(request), title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{assets}/redoc.standalone.js", redoc_favicon_url=f"{assets}/favicon.png",
        with_google_fonts=False,
    )


def install(app: FastAPI) -> None:
    """Serve the pages and their assets on ``app`` (made with ``docs_url=None, redoc_url=None``)."""
    app.include_router(router)
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")
