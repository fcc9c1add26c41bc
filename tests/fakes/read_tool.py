"""The fake model's use of context-proxy's read tool, the way a real model would use it.

When the last user message asks ``QUESTION: <key>``, the answer (``FACT: <key>=…``) is not in the
prompt, the request offers a tool with a ``reference`` parameter (the proxy's read tool), and the
prompt names stored content (an artifact id or an archive URL) not yet read in this prompt, the
model calls the tool with that reference; after reading, ``respond_question`` answers from what
was read. With ``state.read_tool_loop`` it calls the tool whenever offered (to test the bound).
"""

from __future__ import annotations

import re
from typing import Any

from tests.fakes.responders import Prompt, Reply

ARTIFACT = re.compile(r"\bart_[0-9a-f]{32}\b")
ARCHIVE = re.compile(r"/sessions/[^/\s`'\"?]+/archive")
QUESTION = re.compile(r"QUESTION:\s*([A-Za-z0-9_.\-]+)")


def read_tool_name(body: dict[str, Any]) -> str | None:
    for tool in body.get("tools") or ():
        fn = tool.get("function") or {}
        if "reference" in ((fn.get("parameters") or {}).get("properties") or {}):
            return fn.get("name")
    return None


def _already_read(prompt: Prompt, name: str) -> set[str]:
    refs = set()
    for m in prompt.messages:
        for call in m.get("tool_calls") or ():
            if (call.get("function") or {}).get("name") == name:
                refs.add(call["function"].get("arguments", ""))
    return refs


def respond_read_tool(prompt: Prompt, state: Any) -> Reply | None:
    if prompt.is_summary:
        return None
    name = read_tool_name(prompt.body)
    if name is None:
        return None
    refs = list(dict.fromkeys(ARTIFACT.findall(prompt.text) + ARCHIVE.findall(prompt.text)))
    question = QUESTION.search(prompt.last_user_text)
    if not state.read_tool_loop and (question is None or f"FACT: {question.group(1)}=" in prompt.text):
        return None
    last = prompt.messages[-1]
    more = CONTINUE.search(last.get("content") or "") if last.get("role") == "tool" else None
    if more is not None:  # the last read was cut: read on, as its header says
        ref = ARTIFACT.search(last["content"]) or ARCHIVE.search(last["content"])
        return _call(prompt, name, ref.group(0) if ref else refs[0], int(more.group(1)))
    if state.read_tool_loop and refs:
        ref = refs[0]
    else:
        done = " ".join(_already_read(prompt, name))
        unread = [r for r in refs if r not in done]
        if not unread:
            return None
        ref = unread[0]
    return _call(prompt, name, ref, 0)


CONTINUE = re.compile(r"continue with offset=(\d+)")


def _call(prompt: Prompt, name: str, ref: str, offset: int) -> Reply:
    n = sum(1 for m in prompt.messages for _ in (m.get("tool_calls") or ()))
    call = {"id": f"call_read_{n}", "type": "function",
            "function": {"name": name, "arguments": f'{{"reference": "{ref}", "offset": {offset}, "limit": 2000}}'}}
    return Reply(None, [call])
