"""OpenAI wire shapes the fake upstream sends: chat.completion objects and stream chunks.

Streams follow OpenAI's order: a first delta with ``role`` and ``content: ""``; content in
several small deltas; each tool call as ``index`` + ``id`` + ``name`` (empty ``arguments``)
then its arguments in pieces; a final chunk with ``finish_reason`` and an empty delta; with
``stream_options.include_usage`` every chunk carries ``usage: null`` and a last chunk has
``choices: []`` and the usage; then ``data: [DONE]``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests.fakes.responders import Reply

SYSTEM_FINGERPRINT = "fp_fake0c0ffee"
ARGUMENT_PIECE_CHARS = 12


def usage_object(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """OpenAI's ``usage`` with the detail objects the SDK knows."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
    }


def completion_object(reply: Reply, *, completion_id: str, created: int, model: str,
                      usage: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """A full non-streaming ``chat.completion`` object for ``reply``."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None, "annotations": []}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    message.update(reply.extra)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": finish_reason or reply.finish_reason}],
        "usage": usage,
        "service_tier": "default",
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }


def content_pieces(text: str) -> list[str]:
    """``text`` cut into small deltas of about three words each (whitespace kept)."""
    words = re.findall(r"\s*\S+\s*", text) or ([text] if text else [])
    return ["".join(words[i:i + 3]) for i in range(0, len(words), 3)]


def first_chunk(*, completion_id: str, created: int, model: str, include_usage: bool) -> dict[str, Any]:
    """OpenAI's first chunk of a stream: a role-only delta (``content: ""``, ``refusal: null``)."""
    out: dict[str, Any] = {
        "id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
        "service_tier": "default", "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "refusal": None},
                     "logprobs": None, "finish_reason": None}],
    }
    if include_usage:
        out["usage"] = None
    return out


def stream_chunks(reply: Reply, *, completion_id: str, created: int, model: str,
                  usage: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The chunk objects of a streamed reply; ``usage`` given means include_usage was asked."""
    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "service_tier": "default", "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if usage is not None:
            out["usage"] = None
        return out

    chunks = [first_chunk(completion_id=completion_id, created=created, model=model, include_usage=usage is not None)]
    for key, value in reply.extra.items():
        chunks.append(chunk({key: value}))
    for piece in content_pieces(reply.content or ""):
        chunks.append(chunk({"content": piece}))
    for index, call in enumerate(reply.tool_calls or []):
        head = {"index": index, "id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""}}
        chunks.append(chunk({"tool_calls": [head]}))
        arguments = call["function"].get("arguments") or ""
        for start in range(0, len(arguments), ARGUMENT_PIECE_CHARS):
            piece = arguments[start:start + ARGUMENT_PIECE_CHARS]
            chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    chunks.append(chunk({}, reply.finish_reason))
    if usage is not None:
        final = chunk({})
        final["choices"], final["usage"] = [], usage
        chunks.append(final)
    return chunks


def sse_data(obj: Any) -> bytes:
    """One server-sent event ``data: <json>`` with its blank-line terminator."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
