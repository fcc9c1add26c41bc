"""Deep requests timed through the in-process app (``start_messages_inprocess``) on an upstream
that answers at once: Messages and chat bodies of tool inputs / vendor state nested 300-1000 deep,
each sent twice; prints the wall time of the request, whether the upstream got the client's bytes
and the containers the deep fallbacks walked (``DeepBudget.walked_total``). Not collected by the
suite; run it explicitly:

    PYTHONPATH=. python -m pytest -q -s -p no:randomly tests/benchmarks/deep_requests_timing.py
"""
from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

from tests.support.inprocess import start_messages_inprocess

try:
    from proxy.json_depth import DeepBudget
except ImportError:
    DeepBudget = None  # type: ignore

MSG_REPLY = json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                        "content": [{"type": "text", "text": "Done."}], "stop_reason": "end_turn",
                        "usage": {"input_tokens": 5, "output_tokens": 1}}).encode()
CHAT_REPLY = json.dumps({"id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": "Done."},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}).encode()
received: list[bytes] = []


async def upstream(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        m = await receive()
        chunks.append(m.get("body", b""))
        if not m.get("more_body"):
            break
    received.append(b"".join(chunks))
    out = MSG_REPLY if scope["path"].endswith("/messages") else CHAT_REPLY
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": out})


def deep_text(depth: int) -> str:
    return '{"x":' + "[" * depth + '{"a":1}' + "]" * depth + "}"


def body(blocks: int, depth: int) -> bytes:
    d = deep_text(depth)
    content = ",".join(f'{{"type":"tool_use","id":"t{i}","name":"f","input":{d}}}' for i in range(blocks))
    results = ",".join(f'{{"type":"tool_result","tool_use_id":"t{i}","content":"ok"}}' for i in range(blocks))
    return ('{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user","content":"hi"},'
            f'{{"role":"assistant","content":[{content}]}},{{"role":"user","content":[{results}]}}]}}').encode()


def chat_body(blocks: int, depth: int) -> bytes:
    vs = ",".join(deep_text(depth) for _ in range(blocks))
    return ('{"model":"gpt-4o","messages":[{"role":"user","content":"go"},'
            f'{{"role":"assistant","content":"x","vendor_state":[{vs}]}},{{"role":"user","content":"and?"}}]}}').encode()


CASES = [(3000, 600), (400, 300), (15, 600), (30, 1000)]


async def test_deep_requests_timing(tmp_path: Path, sqlite_template: Path) -> None:
    shutil.copyfile(sqlite_template, tmp_path / "log.db")
    out = []
    async with start_messages_inprocess(f"sqlite:///{tmp_path}/log.db", upstream) as http:
        for kind, path, make in [("messages", "/v1/messages", body), ("chat", "/v1/chat/completions", chat_body)]:
            for blocks, depth in CASES:
                raw = make(blocks, depth)
                for attempt in range(2):
                    w0 = DeepBudget.walked_total if DeepBudget else 0
                    t = time.perf_counter()
                    auth = {"authorization": "Bearer sk-client"} if kind == "chat" else {}
                    sid = f"{kind}{blocks}x{depth}{attempt}"
                    resp = await http.post(path, content=raw, headers={
                        "content-type": "application/json", "x-session-id": sid, **auth})
                    dt = time.perf_counter() - t
                    walked = (DeepBudget.walked_total - w0) if DeepBudget else -1
                    await asyncio.sleep(0.3)
                    got = await http.get(f"/sessions/{sid}/messages", headers=auth)
                    try:
                        logged = len(got.json()["data"]) if got.status_code == 200 else got.status_code
                    except RecursionError:  # (the stdlib's reader, here: logged all the same)
                        logged = "yes (deeper than json.loads reads)"
                    out.append(f"{kind:8s} {blocks:5d}x{depth:4d} {len(raw)/1e6:5.2f} MB: {dt*1000:8.1f} ms "
                               f"status {resp.status_code} same bytes {received[-1] == raw} walked {walked} "
                               f"logged {logged}")
    print("\n" + "\n".join(out))
