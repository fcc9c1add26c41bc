"""The read API's per-session lists beside the log: branches and artifacts (tenant-scoped as
``proxy.routes.read``: another tenant's session or artifact is a 404), and one artifact's lines.

Lists use OpenAI's list shape (``object: "list"``, ``data``, ``first_id``, ``last_id``,
``has_more``) with ``limit`` and ``after`` (the previous page's ``last_id``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import JSONResponse

from proxy.errors import BadRequest, NotFound
from proxy.routes.read import TENANT_QUERY, list_response, session_of, unix_seconds
from storage.errors import InvalidCursor
from storage.records import BranchRecord

router = APIRouter(tags=["read"])


def branch_json(b: BranchRecord) -> dict[str, Any]:
    """``{"object": "session.branch", "leaf", "message_count", "last_activity" (unix s), "newest"}``."""
    return {
        "object": "session.branch",
        "leaf": b.leaf_hash,
        "message_count": b.message_count,
        "last_activity": unix_seconds(b.last_activity),
        "newest": b.newest,
    }


@router.get(
    "/sessions/{session_id}/branches",
    summary="Branches (leaves), newest activity first; a leaf is usable as ?leaf= on /messages and /archive",
)
async def list_branches(
    request: Request,
    session_id: str,
    limit: int = Query(20, ge=1, le=100),
    after: str | None = Query(None, description="The previous page's last_id (a leaf's chain hash)"),
    tenant: str | None = TENANT_QUERY,
) -> JSONResponse:
    session = await session_of(request, session_id, tenant)
    try:
        rows, has_more = await request.app.state.proxy.store.list_branches(session.pk, limit, after)
    except InvalidCursor:
        raise BadRequest(f"'after' is not a message id of this session: {after}", param="after") from None
    return list_response([branch_json(b) for b in rows], has_more, [b.leaf_hash for b in rows])


@router.get("/artifacts/{artifact_id}", summary="Stored content by line range")
async def get_artifact(
    request: Request,
    artifact_id: str,
    offset: int = Query(0, ge=0, description="First line (0-based)"),
    limit: int = Query(2000, ge=1, le=100_000, description="Number of lines"),
) -> JSONResponse:
    state = request.app.state.proxy
    tenant = state.auth.reader(request.headers)
    artifact = await state.store.get_artifact(artifact_id, tenant)
    if artifact is None:
        raise NotFound(f"No artifact '{artifact_id}'.")
    lines = artifact.content.splitlines(keepends=True)
    window = lines[offset : offset + limit]
    return JSONResponse(
        {
            "id": artifact.id,
            "object": "artifact",
            "media_type": artifact.media_type,
            "size_bytes": artifact.size_bytes,
            "line_count": artifact.line_count,
            "offset": offset,
            "limit": limit,
            "returned_lines": len(window),
            "has_more": offset + len(window) < len(lines),
            "content": "".join(window),
        }
    )
