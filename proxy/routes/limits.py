"""What the proxy learned about models (``proxy.compaction.limits``), for admin keys: list and reset.

``GET /limits`` lists learned limits (OpenAI's list shape; ``tenant``, ``model`` filter; at most
``limit`` rows, newest first); ``DELETE /limits`` forgets them (one tenant's and/or one model's,
or with ``all=true`` every one: a filter mistyped is a 400, not a reset of everything) in the
database and in this process (other replicas re-read within
``proxy.compaction.limits.REFRESH_S``). Any other key gets a 403.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import JSONResponse

from proxy.errors import BadRequest, Forbidden
from storage.records import LearnedLimitRecord

router = APIRouter(tags=["limits"])


def limit_json(r: LearnedLimitRecord) -> dict[str, Any]:
    """One learned limit as the API and ``context-proxy limits list --json`` show it (times in epoch seconds)."""
    return {
        "object": "learned_limit",
        "tenant": r.tenant,
        "upstream": r.upstream,
        "model": r.model,
        "context_window_tokens": r.context_window_tokens,
        "estimate_ratio": r.estimate_ratio,
        "source": r.source,
        "updated_at": int(r.updated_at.timestamp()),
        "expires_at": int(r.expires_at.timestamp()) if r.expires_at is not None else None,
    }


def _admin(request: Request) -> Any:
    state = request.app.state.proxy
    if state.auth.reader(request.headers) is not None:
        raise Forbidden("Learned limits are listed and reset with an admin key (CONTEXT_PROXY_ADMIN_API_KEYS).")
    return state


@router.get("/limits", summary="Learned limits (admin keys only)")
async def list_limits(request: Request, tenant: str | None = Query(None, max_length=200),
                      model: str | None = Query(None, max_length=1000),
                      limit: int = Query(100, ge=1, le=1000)) -> JSONResponse:
    state = _admin(request)
    rows = await state.store.list_learned_limits(tenant=tenant, model=model, limit=limit + 1)
    data = [limit_json(r) for r in rows[:limit]]
    return JSONResponse({"object": "list", "data": data, "has_more": len(rows) > limit})


@router.delete("/limits", summary="Forget learned limits (admin keys only)")
async def reset_limits(request: Request, tenant: str | None = Query(None, max_length=200),
                       model: str | None = Query(None, max_length=1000),
                       every: bool = Query(False, alias="all", description="Every learned limit "
                                           "(needed when no filter is given).")) -> JSONResponse:
    state = _admin(request)
    if tenant is None and model is None and not every:
        raise BadRequest("Give tenant and/or model, or all=true to forget every learned limit.", param="all")
    deleted = await state.store.delete_learned_limits(tenant=tenant, model=model)
    state.pipeline.compactor.forget_limits(tenant, model)
    return JSONResponse({"object": "learned_limits.reset", "deleted": deleted, "tenant": tenant, "model": model})
