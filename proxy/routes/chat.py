"""``POST /v1/chat/completions``: the one route the defenses apply to."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from proxy.pipeline import Buffered
from proxy.routes.body import read_body

router = APIRouter()


@router.post("/v1/chat/completions", tags=["openai"], summary="Chat completions (forwarded, logged, compacted)")
async def chat_completions(request: Request) -> Response:
    state = request.app.state.proxy
    tenant = state.auth.chat_tenant(request.headers)
    raw = await read_body(request, state.settings.max_body_bytes)
    outcome = await state.pipeline.handle(raw, request.headers, request.headers.items(), tenant)
    if isinstance(outcome, Buffered):
        return Response(outcome.body, status_code=outcome.status, headers=outcome.headers)
    return StreamingResponse(outcome.chunks, status_code=outcome.status, headers=outcome.headers)
