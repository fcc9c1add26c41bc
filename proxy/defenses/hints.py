"""What stubs and summaries tell the model about finding cut content again (pure text, part of the
prompt prefix: keep it stable)."""

from __future__ import annotations

import urllib.parse


def search_hint(tool_name: str, reference: str | None = None) -> str:
    """The sentence stubs and summaries carry about searching (part of the prompt prefix: a pure
    function of its arguments, keep it stable)."""
    ref = f', "reference": "{reference}"' if reference else ""
    return f'Search it first with `{tool_name}` {{"query": "words"{ref}}}, then read around a match.'


def archive_url(session_id: str) -> str:
    """The archive's URL as the summary names it: the id percent-encoded (every reserved
    character, ``%`` included), so it is one path segment that ``GET /sessions/{id}/archive``
    decodes back to the id, and a pattern over URLs finds it whole."""
    return f"/sessions/{urllib.parse.quote(session_id, safe='')}/archive"
