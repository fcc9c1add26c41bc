"""The proxy's own tools as the model sees them: their schemas (OpenAI's function-tool shape, or
Anthropic's ``{name, description, input_schema}``: ``messages_tool``) and
a read call's arguments, checked (``parse_arguments``: a ``ReadRequest`` or an error text for the
model; every number a call passes is bounded here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.json_text import parse_json
from proxy.tools.search import DEFAULT_MATCHES, MAX_MATCHES, MAX_SEARCH_OFFSET, Query, compile_query

DEFAULT_LIMIT_LINES = 200
MAX_LIMIT_LINES = 2000


def read_tool_schema(name: str) -> dict[str, Any]:
    """The read tool named ``name``, in OpenAI's function-tool shape (a new object each call: its
    owner, ``proxy.compaction.offer.OwnToolOffer``, builds it once and shares it)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": (
                "Search and read content that context-proxy moved out of this conversation to keep it inside "
                "the context window: offloaded tool results or messages (artifact ids, e.g. art_…, or "
                "/artifacts/… URLs) and the archive of summarized earlier messages (/sessions/…/archive). "
                "Search first: pass query (words; a line matches when it contains them) to find lines in all "
                "stored content, or in one reference; then read around a match with reference, offset "
                "(first line, from 0) and limit (number of lines)."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string",
                              "description": "Words to search for (case-insensitive); best matches first."},
                    "regex": {"type": "boolean", "description": "Treat query as a regular expression."},
                    "reference": {"type": "string", "description": (
                        "Artifact id, /artifacts/… URL, or /sessions/…/archive URL; without query, read it by lines.")},
                    "offset": {"type": "integer", "description": (
                        "First line to read (from 0), or with query the first match to list."), "minimum": 0},
                    "limit": {"type": "integer", "description": (
                        f"Lines to read (default {DEFAULT_LIMIT_LINES}), or with query matches to list "
                        f"(default {DEFAULT_MATCHES})."), "minimum": 1},
                },
            },
        },
    }


def messages_tool(schema: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI function tool (``read_tool_schema``'s shape) in Anthropic's custom-tool shape:
    ``{"name", "description", "input_schema"}`` (the SDK's ``ToolParam``; a new object)."""
    fn = schema["function"]
    return {"name": fn["name"], "description": fn["description"], "input_schema": fn["parameters"]}


def compact_tool_schema(name: str) -> dict[str, Any]:
    """The opt-in manual compaction tool named ``name`` (a new object each call, as ``read_tool_schema``)."""
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


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """Arguments of one read call, checked. ``query`` ``None``: read ``reference`` by lines."""

    reference: str | None
    offset: int
    limit: int
    query: Query | None = None


def parse_arguments(arguments: str) -> ReadRequest | str:
    """The call's arguments, or an error text for the model."""
    try:
        args = parse_json(arguments or "{}")
    except orjson.JSONDecodeError:
        return ("[context-proxy] The arguments were not valid JSON; pass {\"query\": \"words\"} or "
                "{\"reference\": \"art_…\"}.")
    if not isinstance(args, dict):
        return "[context-proxy] Pass an object: {\"query\": \"words\"} or {\"reference\": \"art_…\"}."
    reference = args.get("reference")
    query_text = args.get("query")
    if reference is not None and not isinstance(reference, str):
        return "[context-proxy] 'reference' must be a string (art_… or /sessions/…/archive)."
    if query_text is not None and not isinstance(query_text, str):
        return "[context-proxy] 'query' must be a string of words."
    if not (reference or "").strip() and not (query_text or "").strip():
        return "[context-proxy] Pass 'query' (words to search for) and/or 'reference' (art_… or /sessions/…/archive)."
    query = None
    if query_text is not None and query_text.strip():
        compiled = compile_query(query_text, args.get("regex") is True)
        if isinstance(compiled, str):
            return compiled
        query = compiled
    default, most = (DEFAULT_MATCHES, MAX_MATCHES) if query is not None else (DEFAULT_LIMIT_LINES, MAX_LIMIT_LINES)
    offset = args.get("offset", 0)
    limit = args.get("limit", default)
    offset = offset if isinstance(offset, int) and not isinstance(offset, bool) and 0 <= offset < 10**9 else 0
    if query is not None:
        offset = min(offset, MAX_SEARCH_OFFSET)
    limit = min(limit, most) if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else default
    ref = reference.strip() if isinstance(reference, str) and reference.strip() else None
    return ReadRequest(ref, offset, limit, query)
