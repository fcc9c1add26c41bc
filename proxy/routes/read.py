"""The read API: sessions, their log, compaction events, archive and artifacts (tenant-scoped).

Lists use OpenAI's list shape (``object: "list"``, ``data``, ``first_id``, ``last_id``,
``has_more``) with ``limit`` and ``after``. Another tenant's session or artifact is a 404,
indistinguishable from one that does not exist.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import JSONResponse, PlainTextResponse

from proxy.archive import render_archive
from proxy.errors import BadRequest, NotFound
from storage.errors import InvalidCursor
from storage.records import EventRecord, MessageRecord, RequestRecord, SessionRecord, SessionSummary

router = APIRouter(tags=["read"])


def _list(data: list[dict[str, Any]], has_more: bool) -> JSONResponse:
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        }
    )


def _ts(value: Any) -> int:
    return int(value.timestamp())


def session_json(s: SessionSummary) -> dict[str, Any]:
    return {
        "id": s.session.session_id,
        "object": "session",
        "created_at": _ts(s.session.created_at),
        "updated_at": _ts(s.session.updated_at),
        "message_count": s.message_count,
        "request_count": s.request_count,
        "event_count": s.event_count,
        "branch_count": s.branch_count,
        "tokens_client_total": s.tokens_client_total,
        "tokens_forwarded_total": s.tokens_forwarded_total,
        "last_model": s.last_model,
    }


def message_json(m: MessageRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"id": m.chain_hash, "object": "session.message", "seq": m.seq, "created_at": _ts(m.created_at)}
    for key in ("role", "content", "tool_calls", "tool_call_id", "name"):
        if key in m.message:
            out[key] = m.message[key]
    for key, value in m.message.items():
        if key not in out and key not in ("role",):
            out[key] = value
    out["internal"] = m.internal
    return out


def event_json(e: EventRecord) -> dict[str, Any]:
    return {
        "id": e.id,
        "object": "session.event",
        "kind": e.kind,
        "anchor_hash": e.anchor_hash,
        "created_at": _ts(e.created_at),
        "tokens_before": e.tokens_before,
        "tokens_after": e.tokens_after,
        "payload": e.payload,
    }


async def _session(request: Request, session_id: str) -> SessionRecord:
    state = request.app.state.proxy
    tenant = state.auth.reader(request.headers)
    session = await state.store.find_session(session_id, tenant)
    if session is None:
        raise NotFound(f"No session '{session_id}'.")
    return session


@router.get("/sessions", summary="Sessions, newest first")
async def list_sessions(request: Request, limit: int = Query(20, ge=1, le=100), after: str | None = None) -> JSONResponse:
    state = request.app.state.proxy
    tenant = state.auth.reader(request.headers)
    try:
        rows, has_more = await state.store.list_sessions(tenant, limit, after)
    except InvalidCursor:
        raise BadRequest(f"'after' is not a session id you can see: {after}", param="after") from None
    return _list([session_json(s) for s in rows], has_more)


@router.get("/sessions/{session_id}", summary="One session: counts, tokens, timestamps, branches")
async def get_session(request: Request, session_id: str) -> JSONResponse:
    session = await _session(request, session_id)
    return JSONResponse(session_json(await request.app.state.proxy.store.session_summary(session)))


@router.get("/sessions/{session_id}/messages", summary="The log in order (one branch: the newest by default)")
async def list_messages(
    request: Request,
    session_id: str,
    limit: int = Query(100, ge=1, le=1000),
    after: str | None = None,
    leaf: str | None = Query(None, description="Chain hash of the branch's last message (default: newest branch)"),
) -> JSONResponse:
    store = request.app.state.proxy.store
    session = await _session(request, session_id)
    tip = await store.branch_leaf(session.pk, leaf)
    if tip is None:
        if leaf is not None:
            raise NotFound(f"No message '{leaf}' in this session.")
        return _list([], False)
    after_seq = None
    if after is not None:
        anchor = await store.get_message_by_hash(session.pk, after)
        if anchor is None:
            raise BadRequest(f"'after' is not a message id of this session: {after}", param="after")
        after_seq = anchor.seq
    rows, has_more = await store.list_branch_messages(session.pk, tip.chain_hash, after_seq, limit)
    return _list([message_json(m) for m in rows], has_more)


def request_json(r: RequestRecord) -> dict[str, Any]:
    out = {k: getattr(r, k) for k in RequestRecord.__dataclass_fields__ if k not in ("session_pk", "created_at")}
    out["object"] = "session.request"
    out["created_at"] = _ts(r.created_at) if r.created_at else None
    return out


@router.get("/sessions/{session_id}/requests", summary="Request records: model, status, latency, usage, finish reason, defenses")
async def list_requests(
    request: Request, session_id: str, limit: int = Query(100, ge=1, le=1000), after: str | None = None
) -> JSONResponse:
    session = await _session(request, session_id)
    rows, has_more = await request.app.state.proxy.store.list_requests(session.pk, limit, after)
    return _list([request_json(r) for r in rows], has_more)


@router.get("/sessions/{session_id}/events", summary="Compaction events")
async def list_events(request: Request, session_id: str) -> JSONResponse:
    session = await _session(request, session_id)
    events = await request.app.state.proxy.store.list_events(session.pk)
    return _list([event_json(e) for e in events], False)


@router.get("/sessions/{session_id}/archive", summary="The log rendered as Markdown", response_class=PlainTextResponse)
async def archive(request: Request, session_id: str, leaf: str | None = None) -> PlainTextResponse:
    store = request.app.state.proxy.store
    session = await _session(request, session_id)
    tip = await store.branch_leaf(session.pk, leaf)
    messages: list[MessageRecord] = []
    if tip is not None:
        messages, _ = await store.list_branch_messages(session.pk, tip.chain_hash, None, 10**9)
    text = render_archive(session.session_id, messages, await store.list_events(session.pk))
    return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")


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
