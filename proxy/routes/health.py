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
    state = request.app.state.proxy
    reachable = await state.store.ping()
    ok = reachable and state.migrated
    body = {"status": "ready" if ok else "not ready", "database": reachable, "migrated": state.migrated}
    return JSONResponse(body, status_code=200 if ok else 503)
