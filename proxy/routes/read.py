"""The read API: sessions, their log, compaction events, archive and artifacts (tenant-scoped).

Lists use OpenAI's list shape (``object: "list"``, ``data``, ``first_id``, ``last_id``,
``has_more``) with ``limit`` and ``after``. Another tenant's session or artifact is a 404,
indistinguishable from one that does not exist.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse

from proxy.errors import BadRequest
from proxy.forward.session_log import MAX_SESSION_ID_CHARS
from proxy.routes.read_scope import (
    LEAF_CHARS,
    LEAF_QUERY,
    TENANT_QUERY,
    cursor_page,
    echo,
    list_response,
    reader_scope,
    session_branch,
    session_of,
    unix_seconds,
)
from proxy.tools.archive import stream_archive_lines
from storage.errors import InvalidCursor
from storage.records import (
    EventRecord,
    MessageRecord,
    RequestRecord,
    SessionFilter,
    SessionSummary,
)
from storage.store import Store

router = APIRouter(tags=["read"])


def session_json(s: SessionSummary, *, admin: bool = False) -> dict[str, Any]:
    """A session's JSON; for an admin it also names its ``tenant`` (the salted key hash, as stored)."""
    out = {
        "id": s.session.session_id,
        "object": "session",
        "api": s.session.api,
        "created_at": unix_seconds(s.session.created_at),
        "updated_at": unix_seconds(s.session.updated_at),
        "message_count": s.message_count,
        "request_count": s.request_count,
        "event_count": s.event_count,
        "branch_count": s.branch_count,
        "tokens_client_total": s.tokens_client_total,
        "tokens_forwarded_total": s.tokens_forwarded_total,
        "last_model": s.last_model,
    }
    if admin:
        out["tenant"] = s.session.tenant
    return out


def message_json(m: MessageRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"id": m.chain_hash, "object": "session.message", "seq": m.seq,
                           "created_at": unix_seconds(m.created_at)}
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
        "created_at": unix_seconds(e.created_at),
        "tokens_before": e.tokens_before,
        "tokens_after": e.tokens_after,
        "payload": e.payload,
    }


def admin_cursor(s: SessionSummary) -> str:
    """An admin's cursor for a session, ``<tenant>:<session id>``: several tenants may use one
    session id, and a tenant (``t_`` + hex, or ``anonymous``) holds no colon."""
    return f"{s.session.tenant}:{s.session.session_id}"


async def session_page(
    store: Store, scope: str | None, limit: int, after: str | None, admin: bool, where: SessionFilter | None = None
) -> tuple[list[SessionSummary], bool]:
    """A page of ``scope``'s sessions (``None``: every tenant) that ``where`` keeps, after the
    session ``after`` names: its id, or for an admin ``admin_cursor``'s ``<tenant>:<session id>``,
    and a plain id (the newest session of that id) where that names none. Raises ``InvalidCursor``."""
    if admin and after is not None and ":" in after:
        tenant, _, session_id = after.partition(":")
        try:
            return await store.list_sessions(scope, limit, session_id, tenant, where)
        except InvalidCursor:
            pass
    return await store.list_sessions(scope, limit, after, where=where)


SESSION_CURSOR_CHARS = 2 * MAX_SESSION_ID_CHARS + 1
"""Longest ``after`` of ``GET /sessions``: an admin's ``<tenant>:<session id>`` (a tenant is at most as
long as a session id here: ``TENANT_QUERY``'s bound)."""
UNIX_MAX = 253_402_300_799
"""The latest unix-seconds query value: the last second of year 9999."""


def _utc(seconds: int | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


@router.get("/sessions", summary="Sessions, newest first")
async def list_sessions(
    request: Request, limit: int = Query(20, ge=1, le=100), tenant: str | None = TENANT_QUERY,
    after: str | None = Query(None, max_length=SESSION_CURSOR_CHARS,
                              description="The previous page's last_id: a session id; for admins "
                              "<tenant>:<session id> (a plain id there means the newest session of that id)"),
    model: str | None = Query(None, min_length=1, max_length=200,
                              description="Only sessions with a request to this model (its exact name)"),
    updated_after: int | None = Query(None, ge=0, le=UNIX_MAX, description="Only sessions updated since (unix s)"),
    updated_before: int | None = Query(None, ge=0, le=UNIX_MAX, description="Only sessions updated before (unix s)"),
) -> JSONResponse:
    state = request.app.state.proxy
    scope, admin = reader_scope(request, tenant)
    if scope == "":
        return list_response([], False)
    where = SessionFilter(model, _utc(updated_after), _utc(updated_before))
    try:
        rows, has_more = await session_page(state.store, scope, limit, after, admin, where)
    except InvalidCursor:
        raise BadRequest(f"'after' is not a session id you can see: {echo(after or '')}", param="after") from None
    cursors = [admin_cursor(s) for s in rows] if admin else None
    return list_response([session_json(s, admin=admin) for s in rows], has_more, cursors)


@router.get("/sessions/{session_id}", summary="One session: counts, tokens, timestamps, branches")
async def get_session(request: Request, session_id: str, tenant: str | None = TENANT_QUERY) -> JSONResponse:
    session = await session_of(request, session_id, tenant)
    admin = reader_scope(request, tenant)[1]
    return JSONResponse(session_json(await request.app.state.proxy.store.session_summary(session), admin=admin))


@router.get("/sessions/{session_id}/messages", summary="The log in order (one branch: the newest by default)")
async def list_messages(
    request: Request,
    session_id: str,
    limit: int = Query(100, ge=1, le=1000),
    after: str | None = Query(None, max_length=LEAF_CHARS, description="The previous page's last_id (a message id)"),
    leaf: str | None = LEAF_QUERY,
    tenant: str | None = TENANT_QUERY,
) -> JSONResponse:
    store = request.app.state.proxy.store
    session, tip = await session_branch(request, session_id, leaf, tenant)
    if tip is None:
        return list_response([], False)
    after_seq = None
    if after is not None:
        anchor = await store.get_message_by_hash(session.pk, after)
        if anchor is None:
            raise BadRequest(f"'after' is not a message id of this session: {echo(after)}", param="after")
        after_seq = anchor.seq
    rows, has_more = await store.list_branch_messages(session.pk, tip, after_seq, limit)
    return list_response([message_json(m) for m in rows], has_more)


def request_json(r: RequestRecord) -> dict[str, Any]:
    out = {k: getattr(r, k) for k in RequestRecord.__dataclass_fields__ if k not in ("session_pk", "created_at")}
    out["object"] = "session.request"
    out["created_at"] = unix_seconds(r.created_at) if r.created_at else None
    return out


@router.get("/sessions/{session_id}/requests",
            summary="Request records: model, status, latency, usage, finish reason, defenses")
async def list_requests(
    request: Request, session_id: str, limit: int = Query(100, ge=1, le=1000),
    after: str | None = Query(None, max_length=200, description="The previous page's last_id (a request id)"),
    tenant: str | None = TENANT_QUERY,
) -> JSONResponse:
    session = await session_of(request, session_id, tenant)
    store = request.app.state.proxy.store
    rows, has_more = await cursor_page(store.list_requests(session.pk, limit, after), after, "a request id")
    return list_response([request_json(r) for r in rows], has_more)


@router.get("/sessions/{session_id}/events", summary="Compaction events")
async def list_events(request: Request, session_id: str, tenant: str | None = TENANT_QUERY) -> JSONResponse:
    session = await session_of(request, session_id, tenant)
    events = await request.app.state.proxy.store.list_events(session.pk)
    return list_response([event_json(e) for e in events], False)


ARCHIVE_CHUNK_BYTES = 64 * 1024
"""The archive is sent in chunks of about this many bytes (lines are never split)."""


async def _chunks(lines: AsyncIterator[str], offset: int, limit: int | None) -> AsyncIterator[bytes]:
    """Lines ``offset`` to ``offset + limit - 1`` (all from ``offset`` if no limit), each with its
    ``\n``, UTF-8, in chunks of about ``ARCHIVE_CHUNK_BYTES``."""
    buffer: list[bytes] = []
    size = 0
    try:
        n = 0
        async for line in lines:
            if n >= offset:
                if limit is not None and n >= offset + limit:
                    break
                data = (line + "\n").encode("utf-8", "backslashreplace")
                buffer.append(data)
                size += len(data)
                if size >= ARCHIVE_CHUNK_BYTES:
                    yield b"".join(buffer)
                    buffer, size = [], 0
            n += 1
        if buffer:
            yield b"".join(buffer)
    finally:
        await lines.aclose()  # type: ignore[attr-defined]


@router.get(
    "/sessions/{session_id}/archive",
    summary="The log as one Markdown document (streamed), or a page of its lines; line numbers never change",
    response_class=PlainTextResponse,
)
async def archive(
    request: Request,
    session_id: str,
    leaf: str | None = LEAF_QUERY,
    offset: int = Query(0, ge=0, le=10**9, description="First line (0-based)"),
    limit: int | None = Query(None, ge=1, le=100_000, description="Number of lines (default: to the end); "
                              "a page with fewer lines is the last"),
    tenant: str | None = TENANT_QUERY,
) -> StreamingResponse:
    store = request.app.state.proxy.store
    session, tip = await session_branch(request, session_id, leaf, tenant)
    lines = stream_archive_lines(store, session.session_id, session.pk, tip)
    chunks = _chunks(lines, offset, limit)
    first = await anext(chunks, b"")  # storage errors before the response starts answer as errors
    return StreamingResponse(_then(first, chunks), media_type="text/markdown; charset=utf-8")


async def _then(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        if first:
            yield first
        async for chunk in rest:
            yield chunk
    finally:
        await rest.aclose()  # type: ignore[attr-defined]
