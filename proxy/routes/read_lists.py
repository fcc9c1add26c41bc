"""The read API's per-session lists beside the log: branches and artifacts (tenant-scoped as
``proxy.routes.read_scope``: another tenant's session or artifact is a 404), and one artifact's lines.

Lists use OpenAI's list shape (``object: "list"``, ``data``, ``first_id``, ``last_id``,
``has_more``) with ``limit`` and ``after`` (the previous page's ``last_id``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import JSONResponse

from proxy.routes.read_scope import TENANT_QUERY, artifact_of, cursor_page, list_response, session_of, unix_seconds
from storage.records import ArtifactInfo, BranchRecord

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
    after: str | None = Query(None, max_length=200, description="The previous page's last_id (a leaf's chain hash)"),
    tenant: str | None = TENANT_QUERY,
) -> JSONResponse:
    session = await session_of(request, session_id, tenant)
    store = request.app.state.proxy.store
    rows, has_more = await cursor_page(store.list_branches(session.pk, limit, after), after, "a leaf")
    return list_response([branch_json(b) for b in rows], has_more, [b.leaf_hash for b in rows])


def artifact_kind(media_type: str) -> str:
    """What an artifact holds, from its media type: ``text`` (a tool result or user message's text
    offloaded), ``image`` (an inline image offloaded), else ``media``."""
    if media_type.startswith("text/"):
        return "text"
    return "image" if media_type.startswith("image/") else "media"


def artifact_info_json(a: ArtifactInfo) -> dict[str, Any]:
    """``{"object": "session.artifact", "id", "bytes" (UTF-8 bytes of the content), "lines", "kind",
    "media_type", "message" (chain hash of the message it came from, or null: not recorded),
    "created_at" (unix s)}``."""
    return {
        "object": "session.artifact",
        "id": a.id,
        "bytes": a.size_bytes,
        "lines": a.line_count,
        "kind": artifact_kind(a.media_type),
        "media_type": a.media_type,
        "message": a.message_hash,
        "created_at": unix_seconds(a.created_at),
    }


@router.get(
    "/sessions/{session_id}/artifacts",
    summary="Artifacts the session offloaded, oldest first: size, kind, the message each came from",
)
async def list_artifacts(
    request: Request,
    session_id: str,
    limit: int = Query(20, ge=1, le=100),
    after: str | None = Query(None, max_length=200, description="The previous page's last_id (an artifact id)"),
    tenant: str | None = TENANT_QUERY,
) -> JSONResponse:
    session = await session_of(request, session_id, tenant)
    store = request.app.state.proxy.store
    rows, has_more = await cursor_page(store.list_session_artifacts(session.pk, limit, after), after, "an artifact id")
    return list_response([artifact_info_json(a) for a in rows], has_more)


@router.get("/artifacts/{artifact_id}", summary="Stored content by line range")
async def get_artifact(
    request: Request,
    artifact_id: str,
    offset: int = Query(0, ge=0, description="First line (0-based)"),
    limit: int = Query(2000, ge=1, le=100_000, description="Number of lines"),
) -> JSONResponse:
    artifact = await artifact_of(request, artifact_id)
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
