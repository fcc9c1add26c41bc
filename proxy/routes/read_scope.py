"""What every route of the read API shares: who may see what (tenant scope), the session,
branch or artifact a path names (a 404 when the caller cannot see it, indistinguishable from one
that does not exist), the shared query parameters, and OpenAI's list shape.

Values a client sent are echoed in error messages cut to ``ECHO_CHARS`` characters.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import Query, Request
from starlette.responses import JSONResponse

from proxy.errors import BadRequest, NotFound
from proxy.json_depth import dumps
from storage.errors import InvalidCursor
from storage.records import ArtifactRecord, SessionRecord

T = TypeVar("T")

LEAF_CHARS = 128
"""Longest ``leaf`` (and message ``after``) accepted, in characters: a chain hash is 64 hex digits."""
ECHO_CHARS = 80
"""Longest client value an error message repeats, in characters (longer ones are cut with a mark)."""

TENANT_QUERY = Query(None, max_length=200, description="Admins: the tenant (hash, as listed) whose session to address; "
                     "default the newest session of that id. Others: only their own tenant.")
LEAF_QUERY = Query(None, max_length=LEAF_CHARS,
                   description="Chain hash of the branch's last message (default: newest branch)")


def echo(value: str) -> str:
    """``value`` as an error message may repeat it: at most ``ECHO_CHARS`` characters and a mark."""
    return value if len(value) <= ECHO_CHARS else f"{value[:ECHO_CHARS]}… ({len(value)} chars)"


class AnyDepthJSONResponse(JSONResponse):
    """Starlette's ``JSONResponse``, for logged content: a body nested deeper than the stdlib's
    writer recurses (a tool call's input the provider nested 1,000 deep) is written by
    ``proxy.json_depth`` instead (orjson's compact text: the same JSON value)."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except RecursionError:
            return dumps(content)


def list_response(data: list[dict[str, Any]], has_more: bool, cursors: list[str] | None = None) -> JSONResponse:
    """OpenAI's list object (``AnyDepthJSONResponse``); ``first_id``/``last_id`` are the first and
    last item's ``id``, or of ``cursors`` (one per item) where an id alone does not name one item."""
    ids = [d["id"] for d in data] if cursors is None else cursors
    return AnyDepthJSONResponse(
        {
            "object": "list",
            "data": data,
            "first_id": ids[0] if ids else None,
            "last_id": ids[-1] if ids else None,
            "has_more": has_more,
        }
    )


async def cursor_page(page: Awaitable[tuple[list[T], bool]], after: str | None, what: str) -> tuple[list[T], bool]:
    """A page of a session's list; a cursor that names nothing of the session (``InvalidCursor``)
    is the client's error: a ``BadRequest`` naming ``after`` (``what``: what it should name)."""
    try:
        return await page
    except InvalidCursor:
        raise BadRequest(f"'after' is not {what} of this session: {echo(after or '')}", param="after") from None


def unix_seconds(value: Any) -> int:
    return int(value.timestamp())


def reader_scope(request: Request, tenant: str | None) -> tuple[str | None, bool]:
    """The tenant a call may see (``None``: every tenant) and whether the caller is an admin.
    ``tenant`` (the query parameter) narrows an admin's view; for anyone else it must be their own
    tenant, or nothing is visible (``""`` names no tenant)."""
    own = request.app.state.proxy.auth.reader(request.headers)
    if own is None:
        return tenant, True
    return (own if tenant in (None, own) else ""), False


async def session_of(request: Request, session_id: str, tenant: str | None = None) -> SessionRecord:
    """The session ``session_id`` the caller may see (``reader_scope``). Raises ``NotFound``."""
    state = request.app.state.proxy
    scope, _ = reader_scope(request, tenant)
    session = None if scope == "" else await state.store.find_session(session_id, scope)
    if session is None:
        raise NotFound(f"No session '{echo(session_id)}'.")
    return session


async def session_branch(request: Request, session_id: str, leaf: str | None,
                         tenant: str | None = None) -> tuple[SessionRecord, str | None]:
    """``(the session, the chain hash of its branch's last message)``: the branch ending at ``leaf``,
    or the newest (``None`` for a session with no message). Raises ``NotFound`` for a session the
    caller cannot see, or a ``leaf`` not in it."""
    session = await session_of(request, session_id, tenant)
    tip = await request.app.state.proxy.store.branch_leaf(session.pk, leaf)
    if tip is None and leaf is not None:
        raise NotFound(f"No message '{echo(leaf)}' in this session.")
    return session, None if tip is None else tip.chain_hash


async def artifact_of(request: Request, artifact_id: str) -> ArtifactRecord:
    """The artifact ``artifact_id`` of the caller's tenant (an admin: any). Raises ``NotFound``."""
    state = request.app.state.proxy
    artifact = await state.store.get_artifact(artifact_id, state.auth.reader(request.headers))
    if artifact is None:
        raise NotFound(f"No artifact '{echo(artifact_id)}'.")
    return artifact
