"""The fake model's use of context-proxy's read tool, the way a real model would use it.

When the last user message asks ``QUESTION: <key>``, the answer (``FACT: <key>=…``) is not in the
prompt, and the request offers a tool with a ``reference`` parameter (the proxy's read tool):

- the tool offers ``query`` (issue 17): the model searches for ``FACT <key>`` over everything
  stored; when the result says there are more matches (``next_offset=N``) it asks for them; when
  the search found nothing it falls back to paging;
- else (or after a fruitless search) it pages: it calls the tool with the first reference (an
  artifact id or an archive URL) named in the prompt and not yet read, from offset 0, and reads on
  while a result says ``continue with offset=N``.

After reading, ``respond_question`` answers from what was read. With ``state.read_tool_loop`` it
pages whenever the tool is offered (to test the bound). ``state.read_tool_search = False`` makes it
page even when it could search (the issue's "before" behaviour, for comparison).
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests.fakes.responders import Prompt, Reply

ARTIFACT = re.compile(r"\bart_[0-9a-f]{32}\b")
ARCHIVE = re.compile(r"/sessions/[^/\s`'\"?]+/archive")
QUESTION = re.compile(r"QUESTION:\s*([A-Za-z0-9_.\-]+)")
CONTINUE = re.compile(r"continue with offset=(\d+)")
NEXT = re.compile(r"next_offset=(\d+)")


def read_tool(body: dict[str, Any]) -> tuple[str | None, bool]:
    """``(name, offers query)`` of the read tool the request offers, or ``(None, False)``: a chat
    body's function tools or a Messages body's ``{name, description, input_schema}`` tools."""
    for tool in body.get("tools") or ():
        fn = tool.get("function") or tool  # (the shapes the validators let through: objects or absent)
        props = (fn.get("parameters") or fn.get("input_schema") or {}).get("properties")
        if isinstance(props, dict) and "reference" in props:
            return fn.get("name"), "query" in props
    return None, False


def read_tool_name(body: dict[str, Any]) -> str | None:
    return read_tool(body)[0]


def _calls(prompt: Prompt, name: str) -> list[dict[str, Any]]:
    out = []
    for m in prompt.messages:
        for call in m.get("tool_calls") or ():
            if (call.get("function") or {}).get("name") == name:
                try:
                    out.append(json.loads(call["function"].get("arguments") or "{}"))
                except ValueError:
                    out.append({})
    return out


def respond_read_tool(prompt: Prompt, state: Any) -> Reply | None:
    if prompt.is_summary:
        return None
    name, searchable = read_tool(prompt.body)
    if name is None:
        return None
    question = QUESTION.search(prompt.last_user_text)
    if not state.read_tool_loop and (question is None or f"FACT: {question.group(1)}=" in prompt.text):
        return None
    last = prompt.messages[-1]
    last_text = (last.get("content") or "") if last.get("role") == "tool" else ""
    if searchable and state.read_tool_search and question is not None and not state.read_tool_loop:
        query = f"FACT {question.group(1)}"
        searches = [c for c in _calls(prompt, name) if c.get("query") == query]
        if not searches:
            return _call(prompt, name, {"query": query})
        more = NEXT.search(last_text) if searches and _calls(prompt, name)[-1].get("query") == query else None
        if more is not None:
            return _call(prompt, name, {"query": query, "offset": int(more.group(1))})
        # the search found nothing: page, as without search
    refs = list(dict.fromkeys(ARTIFACT.findall(prompt.text) + ARCHIVE.findall(prompt.text)))
    more = CONTINUE.search(last_text) if last_text and NEXT.search(last_text) is None else None
    if more is not None:  # the last read was cut: read on, as its header says
        ref = ARTIFACT.search(last_text) or ARCHIVE.search(last_text)
        return _page(prompt, name, ref.group(0) if ref else refs[0], int(more.group(1)))
    if state.read_tool_loop and refs:
        ref = refs[0]
    else:
        done = {c.get("reference") for c in _calls(prompt, name) if "query" not in c}
        unread = [r for r in refs if r not in done]
        if not unread:
            return None
        ref = unread[0]
    return _page(prompt, name, ref, 0)


def _page(prompt: Prompt, name: str, ref: str, offset: int) -> Reply:
    return _call(prompt, name, {"reference": ref, "offset": offset, "limit": 2000})


def _call(prompt: Prompt, name: str, args: dict[str, Any]) -> Reply:
    n = sum(1 for m in prompt.messages for _ in (m.get("tool_calls") or ()))
    call = {"id": f"call_read_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    return Reply(None, [call])
