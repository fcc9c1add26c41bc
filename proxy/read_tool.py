"""The proxy's own tools: read back offloaded or summarized content, and (opt-in) compact.

Behind a proxy the model has no tool that reaches the proxy's storage, so a stub that names an
artifact would be a dead end. When a forwarded request carries a stub or a summary, the proxy
appends one function tool of its own after the client's tools (same position and form every
time, so the prompt prefix stays cacheable) and serves calls to it itself, from the database.

References are accepted as the model sees them: an artifact id (``art_…``), its read URL
(``/artifacts/art_…?offset=…``), or the archive URL (``/sessions/{id}/archive``). A reference is
served only if it appears in the request the model was given (so a model cannot read another
session's or tenant's data by guessing ids) and, for artifacts, belongs to the tenant.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.archive import render_archive
from proxy.chat import text_of
from storage.records import SessionRecord
from storage.store import Store

ARTIFACT_RE = re.compile(r"\bart_[0-9a-f]{32}\b")
ARCHIVE_RE = re.compile(r"/sessions/([^/\s`'\"?]+)/archive")
DEFAULT_LIMIT_LINES = 200
MAX_LIMIT_LINES = 2000


@functools.lru_cache(maxsize=8)
def read_tool_schema(name: str) -> dict[str, Any]:
    """The read tool, in OpenAI's function-tool shape. One object per name, shared by every
    request that offers the tool (callers copy before changing it; none does)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": (
                "Read content that context-proxy moved out of this conversation to keep it inside the "
                "context window: an offloaded tool result or message (its artifact id, e.g. art_…, or its "
                "/artifacts/… URL) or the archive of summarized earlier messages (/sessions/…/archive). "
                "Use it when you need details that a '[context-proxy]' stub or summary says were stored. "
                "Read in parts with offset (first line, from 0) and limit (number of lines)."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "reference": {"type": "string", "description": "Artifact id, /artifacts/… URL, or /sessions/…/archive URL."},
                    "offset": {"type": "integer", "description": "First line to read, counted from 0.", "minimum": 0},
                    "limit": {"type": "integer", "description": f"Lines to read (default {DEFAULT_LIMIT_LINES}).", "minimum": 1},
                },
                "required": ["reference"],
            },
        },
    }


@functools.lru_cache(maxsize=8)
def compact_tool_schema(name: str) -> dict[str, Any]:
    """The opt-in manual compaction tool (one shared object per name, as ``read_tool_schema``)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": (
                "Compact this conversation now: context-proxy summarizes the earlier messages (they stay "
                "readable in the archive). Call it between tasks, when earlier details are no longer needed."
            ),
            "parameters": {"type": "object", "properties": {}},
        },
    }


def references_in(messages: Sequence[dict[str, Any]]) -> tuple[set[str], set[str]]:
    """Artifact ids and archive session ids named anywhere in ``messages``' text."""
    artifacts: set[str] = set()
    archives: set[str] = set()
    for m in messages:
        text = text_of(m.get("content"))
        if "art_" in text:
            artifacts.update(ARTIFACT_RE.findall(text))
        if "/archive" in text:
            archives.update(ARCHIVE_RE.findall(text))
    return artifacts, archives


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """Arguments of one read call, checked."""

    reference: str
    offset: int
    limit: int


def parse_arguments(arguments: str) -> ReadRequest | str:
    """The call's arguments, or an error text for the model."""
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return "[context-proxy] The arguments were not valid JSON; pass {\"reference\": \"art_…\"}."
    if not isinstance(args, dict) or not isinstance(args.get("reference"), str):
        return "[context-proxy] 'reference' (a string) is required."
    offset = args.get("offset", 0)
    limit = args.get("limit", DEFAULT_LIMIT_LINES)
    offset = offset if isinstance(offset, int) and offset >= 0 else 0
    limit = min(limit, MAX_LIMIT_LINES) if isinstance(limit, int) and limit > 0 else DEFAULT_LIMIT_LINES
    return ReadRequest(args["reference"].strip(), offset, limit)


SEGMENT_CHARS = 2000
"""Lines longer than this are read as consecutive segments of this many characters, each counted
as one line, so a single 100k-character line (minified JSON) can be read in parts too."""


def _lines(text: str) -> list[str]:
    out: list[str] = []
    for line in text.splitlines():
        if len(line) <= SEGMENT_CHARS:
            out.append(line)
        else:
            out.extend(line[i : i + SEGMENT_CHARS] for i in range(0, len(line), SEGMENT_CHARS))
    return out


def _slice(text: str, offset: int, limit: int, max_chars: int, what: str) -> str:
    lines = _lines(text)
    part = lines[offset : offset + limit]
    body = "\n".join(part)
    if len(body) > max_chars:
        body = body[:max_chars]
        shown = body.count("\n") + 1
        note = f"(cut at {max_chars} characters; continue with offset={offset + shown - 1})"
    else:
        shown = len(part)
        note = f"continue with offset={offset + shown}" if offset + shown < len(lines) else "end of content"
    head = f"[context-proxy] {what}, lines {offset}-{offset + max(shown, 1) - 1} of {len(lines)} ({note}):"
    return head + "\n" + body


async def serve_read(
    store: Store,
    tenant: str,
    session: SessionRecord,
    arguments: str,
    visible: tuple[set[str], set[str]],
    max_chars: int,
) -> str:
    """The tool result for one read call: the requested lines, or a short explanation.

    ``visible`` are the references present in the request the model saw; anything else reads
    nothing (same answer as a missing id, so ids cannot be probed).
    """
    request = parse_arguments(arguments)
    if isinstance(request, str):
        return request
    artifacts, archives = visible
    ref = request.reference
    art = ARTIFACT_RE.search(ref)
    if art is not None:
        if art.group(0) in artifacts:
            record = await store.get_artifact(art.group(0), tenant)
            if record is not None:
                return _slice(record.content, request.offset, request.limit, max_chars, f"artifact {record.id}")
        return f"[context-proxy] Nothing stored under {art.group(0)} for this conversation."
    archive = ARCHIVE_RE.search(ref)
    if archive is not None and archive.group(1) == session.session_id and archive.group(1) in archives:
        leaf = await store.branch_leaf(session.pk, None)
        messages = []
        if leaf is not None:
            messages, _ = await store.list_branch_messages(session.pk, leaf.chain_hash, None, 10**9)
        text = render_archive(session.session_id, messages, await store.list_events(session.pk))
        return _slice(text, request.offset, request.limit, max_chars, f"archive of session {session.session_id}")
    return "[context-proxy] Unknown reference; pass an artifact id (art_…) or the archive URL named in this conversation."
