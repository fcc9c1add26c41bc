"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

router = APIRouter()


@router.get("/healthz", tags=["health"], summary="The process is alive")
async def healthz() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get("/readyz", tags=["health"], summary="The database is reachable")
async def readyz(request: Request) -> JSONResponse:
    store = request.app.state.proxy.store
    ok = store is not None and await store.ping()
    return JSONResponse({"status": "ready" if ok else "not ready", "database": ok}, status_code=200 if ok else 503)
