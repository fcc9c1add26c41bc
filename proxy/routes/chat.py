"""``POST /v1/chat/completions``: the one route the defenses apply to.

Documented here for the OpenAPI schema; served by ``proxy.routes.chat_fast.serve_chat`` (the app's
``ChatFastPath`` middleware calls it before FastAPI's routing, so this handler only runs when the
app is assembled without that middleware).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy.routes.chat_fast import serve_chat

router = APIRouter()


@router.post("/v1/chat/completions", tags=["openai"], summary="Chat completions (forwarded, logged, compacted)")
async def chat_completions(request: Request) -> Response:
    return _Served()


class _Served(Response):
    """Hands the untouched request (its body not yet read) to ``serve_chat``."""

    def __init__(self) -> None:
        super().__init__()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await serve_chat(scope, receive, send)
