"""The fake upstream's other ``/v1`` paths: models, embeddings, responses, echo.

- ``GET /v1/models``: OpenAI's list; each model carries ``context_window`` (and vLLM's
  ``max_model_len``) unless named in ``state.hidden_windows``. Listed: one ``fake-8k-<style>``
  per overflow style, every model of ``state.windows`` and every model seen in a chat request.
- ``POST /v1/embeddings``: deterministic vectors (sha256 of the input), ``dimensions`` floats
  (default 8), ``encoding_format`` ``float`` or ``base64`` (little-endian float32, as the SDK asks).
- ``POST /v1/responses``: a minimal completed ``response`` echoing the input.
- ``ANY /v1/echo/{path}``: returns method, path, query, headers and the body (text and
  base64) so pass-through can be checked byte for byte; ``?status=N`` answers with status N;
  ``?stream=1`` answers as an event stream (a head event, the body in three base64 pieces,
  ``data: [DONE]``).
"""

from __future__ import annotations

import base64
import hashlib
import struct
import time
from typing import Any
from urllib.parse import parse_qs

from tests.fakes.asgi import Exchange, decode_headers, finish, send_part, start
from tests.fakes.styles import OVERFLOW_STYLES
from tests.fakes.tokens import count_text_tokens
from tests.fakes.wire import SSE_DONE, sse_data


async def list_models(ex: Exchange) -> None:
    state = ex.state
    names = [f"fake-8k-{style}" for style in OVERFLOW_STYLES]
    names += list(state.windows) + [r.json.get("model") for r in state.chat_requests
                                    if isinstance(r.json, dict) and isinstance(r.json.get("model"), str)]
    data = []
    for name in dict.fromkeys(names):
        entry: dict[str, Any] = {"id": name, "object": "model", "created": 1_700_000_000, "owned_by": "fake-upstream"}
        if name not in state.hidden_windows:
            entry["context_window"] = entry["max_model_len"] = state.window_for(name)
        data.append(entry)
    await ex.respond_json(200, {"object": "list", "data": data}, "ok")


def embedding_vector(text: str, dimensions: int) -> list[float]:
    """A deterministic unit-free vector in [-1, 1) from sha256(text)."""
    digest = b""
    counter = 0
    while len(digest) < dimensions * 2:
        digest += hashlib.sha256(f"{counter}:{text}".encode()).digest()
        counter += 1
    return [(int.from_bytes(digest[2 * i:2 * i + 2], "big") / 32768.0) - 1.0 for i in range(dimensions)]


async def embeddings(ex: Exchange) -> None:
    body = ex.body if isinstance(ex.body, dict) else {}
    inputs = body.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs:
        error = {"error": {"message": "'input' is a required property", "type": "invalid_request_error", "param": "input", "code": None}}
        return await ex.respond_json(400, error, "invalid")
    dimensions = int(body.get("dimensions") or 8)
    data = []
    for index, item in enumerate(inputs):
        vector = embedding_vector(str(item), dimensions)
        if body.get("encoding_format") == "base64":
            encoded: Any = base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
        else:
            encoded = vector
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    tokens = sum(count_text_tokens(str(i)) for i in inputs)
    await ex.respond_json(200, {"object": "list", "data": data, "model": body.get("model", ""),
                                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}, "ok")
    return None


async def responses(ex: Exchange) -> None:
    body = ex.body if isinstance(ex.body, dict) else {}
    text_in = body.get("input")
    text_in = text_in if isinstance(text_in, str) else str(text_in)
    text = "OK: " + " ".join(text_in.split())[:40]
    in_tokens, out_tokens = count_text_tokens(text_in), count_text_tokens(text)
    await ex.respond_json(200, {
        "id": "resp_" + ex.request_id[4:], "object": "response", "created_at": int(time.time()),
        "model": body.get("model", ""), "status": "completed", "error": None, "incomplete_details": None,
        "output": [{"type": "message", "id": "msg_" + ex.request_id[4:], "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}],
        "usage": {"input_tokens": in_tokens, "output_tokens": out_tokens, "total_tokens": in_tokens + out_tokens},
    }, "ok")


async def echo(ex: Exchange) -> None:
    query = ex.scope.get("query_string", b"").decode("latin-1")
    params = parse_qs(query)
    head = {
        "method": ex.scope["method"], "path": ex.scope["path"], "query": query,
        "headers": [list(pair) for pair in decode_headers(ex.scope)],
    }
    status = int(params.get("status", ["200"])[0])
    if params.get("stream", ["0"])[0] not in ("1", "true"):
        body = {**head, "body": ex.raw.decode("utf-8", "replace"), "body_b64": base64.b64encode(ex.raw).decode(),
                "body_sha256": hashlib.sha256(ex.raw).hexdigest()}
        return await ex.respond_json(status, body, "ok")
    ex.record.status, ex.record.outcome = status, "ok"
    await start(ex.send, status, {"content-type": "text/event-stream; charset=utf-8", **ex.headers})
    await send_part(ex.send, sse_data(head))
    third = max(1, -(-len(ex.raw) // 3))
    for offset in range(0, len(ex.raw), third):
        await send_part(ex.send, sse_data({"body_b64": base64.b64encode(ex.raw[offset:offset + third]).decode()}))
    await send_part(ex.send, SSE_DONE)
    await finish(ex.send)
    return None
