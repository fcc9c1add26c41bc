"""The read tool's search over one document, for the read API and the web viewer (tenant-scoped
as ``proxy.routes.read_scope``): a session's archive, or one artifact. Matches carry the line numbers
``?offset=`` takes on ``GET /sessions/{id}/archive`` and ``GET /artifacts/{id}``.

Answer: ``{"object": "list", "data": [{"object": "search.match", "line", "text", "score",
"context": [{"line", "text"}]}], "total", "stopped", "has_more"}``, best first (more query words,
then later lines); ``total`` counts the matching lines seen, ``stopped`` says the time budget ran
out first. A query the search refuses (empty, too long, a pattern RE2 will not run) is a 400.
At most ``Settings.read_api_max_concurrent_searches`` searches run at once; more wait their turn.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import JSONResponse

from proxy.errors import BadRequest
from proxy.routes.read_scope import LEAF_QUERY, TENANT_QUERY, artifact_of, session_branch
from proxy.tools.document_search import Found, QueryRefused, search_archive, search_artifact
from proxy.tools.search import MAX_MATCHES, MAX_QUERY_CHARS, MAX_SEARCH_OFFSET

router = APIRouter(tags=["read"])

Q = Query(..., min_length=1, max_length=MAX_QUERY_CHARS, description="Words (a line matches one; more rank first), "
          "or with regex=true one RE2 pattern; case-insensitive")
REGEX = Query(False, description="q is an RE2 pattern")
OFFSET = Query(0, ge=0, le=MAX_SEARCH_OFFSET, description="Matches to skip (best first)")
LIMIT = Query(20, ge=1, le=MAX_MATCHES, description="Matches to return")


def _answer(found: Found, offset: int) -> JSONResponse:
    data: list[dict[str, Any]] = [
        {"object": "search.match", "line": hit.line, "text": hit.text, "score": hit.score,
         "context": [{"line": n, "text": text} for n, text in (*hit.before, *hit.after)]}
        for hit in found.hits
    ]
    return JSONResponse({"object": "list", "data": data, "total": found.total, "stopped": found.stopped,
                         "has_more": offset + len(data) < found.total})


@router.get("/sessions/{session_id}/archive/search", summary="Search the archive (the read tool's search)")
async def archive_search(
    request: Request, session_id: str, q: str = Q, regex: bool = REGEX, offset: int = OFFSET, limit: int = LIMIT,
    leaf: str | None = LEAF_QUERY,
    tenant: str | None = TENANT_QUERY,
) -> JSONResponse:
    session, tip = await session_branch(request, session_id, leaf, tenant)
    state = request.app.state.proxy
    try:
        found = await search_archive(state.store, session, tip, q, slots=state.searches, regex=regex, offset=offset,
                                     limit=limit)
    except QueryRefused as exc:
        raise BadRequest(str(exc), param="q") from None
    return _answer(found, offset)


@router.get("/artifacts/{artifact_id}/search", summary="Search one artifact (the read tool's search)")
async def artifact_search(
    request: Request, artifact_id: str, q: str = Q, regex: bool = REGEX, offset: int = OFFSET, limit: int = LIMIT,
) -> JSONResponse:
    try:
        found = await search_artifact(lambda: artifact_of(request, artifact_id), q,
                                      slots=request.app.state.proxy.searches, regex=regex, offset=offset, limit=limit)
    except QueryRefused as exc:
        raise BadRequest(str(exc), param="q") from None
    return _answer(found, offset)
