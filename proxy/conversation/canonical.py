"""The canonical form of a chat message, its digest and chain hashes; the roles chat knows.

Messages stay plain dicts (unknown fields survive untouched: the proxy never parses a client's
body into a model that drops fields). ``proxy.conversation.digest_memo.DigestMemo`` reuses the
digests of lists seen before.

The canonical form (used only for hashing, never forwarded) ignores what SDKs add or drop when
they echo an assistant reply back: ``None`` versus absent, ``refusal: null``, empty
``annotations``/``tool_calls`` lists, the streaming-only ``index`` of a tool call, and an
assistant's ``content`` of ``None`` versus ``""`` (both mean "no text"). So the reply the proxy
logs and the client's echo of it hash the same.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any, Protocol

import orjson

from proxy.json_depth import DeepBudget, deep_budget, write_deep


class HashMemo(Protocol):
    """A memo of digests and chain hashes (``proxy.conversation.digest_memo.DigestMemo``)."""

    def digests_and_chain(self, messages: list[dict[str, Any]]) -> tuple[list[str], list[str]]: ...


ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
"""Roles the proxy understands (OpenAI's API reference). They are not a whitelist: a message with
any other role (Llama's ``ipython``, a vendor's own) is forwarded, logged and counted as it came,
and which roles are valid is the provider's decision (issue 15). The defenses treat such a message
as opaque: never rewritten, never separated from the message before it (``is_known_role``)."""


def is_known_role(message: dict[str, Any]) -> bool:
    """True when ``message``'s ``role`` is one of ``ROLES`` (a non-string role is unknown)."""
    role = message.get("role")
    return role.__class__ is str and role in ROLES


_EMPTY_DROPPED = frozenset({"tool_calls", "annotations", "audio", "refusal", "function_call", "reasoning_content"})


def _canonical_tool_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    fn = call.get("function")
    if "index" not in call and None not in call.values() and (not isinstance(fn, dict) or None not in fn.values()):
        return call  # already canonical (the common case: no copy)
    out = {k: v for k, v in call.items() if v is not None and k != "index"}
    fn = out.get("function")
    if isinstance(fn, dict):
        out["function"] = {k: v for k, v in fn.items() if v is not None}
    return out


def _already_canonical(message: dict[str, Any], role: Any) -> bool:
    """True when ``canonical`` would change nothing (checked without copying)."""
    for key, value in message.items():
        if value is None or (key in _EMPTY_DROPPED and not value):
            return False
        if key == "tool_calls" and not (isinstance(value, list) and all(_canonical_tool_call(c) is c for c in value)):
            return False
        if key == "content" and role == "assistant" and value == "":
            return False
    return True


def canonical(message: dict[str, Any]) -> dict[str, Any]:
    """Return the canonical form of ``message`` (the input itself when already canonical; never mutated).

    Rules: drop keys whose value is ``None``; drop empty ``tool_calls``/``annotations``/``audio``/
    ``refusal``/``function_call``; for assistant messages treat ``content`` ``""`` as absent;
    drop ``index`` inside tool calls.
    """
    role = message.get("role")
    if _already_canonical(message, role):
        return message
    out: dict[str, Any] = {}
    for key, value in message.items():
        if value is None:
            continue
        if key in _EMPTY_DROPPED and not value:
            continue
        if key == "content" and role == "assistant" and value == "":
            continue
        if key == "tool_calls" and isinstance(value, list):
            value = [_canonical_tool_call(c) for c in value]
        out[key] = value
    return out


def canonical_bytes(message: dict[str, Any]) -> bytes:
    """Canonical JSON bytes of ``message``: sorted keys, compact, UTF-8 (orjson's, at any depth:
    ``proxy.json_depth``)."""
    c = canonical(message)
    try:
        return orjson.dumps(c, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:  # nested deeper than orjson writes: the bytes it would write
        return write_deep(exc, c, sort_keys=True)


def message_digest(message: dict[str, Any]) -> str:
    """Hex SHA-256 of the canonical bytes: identifies a message's content regardless of position."""
    return hashlib.sha256(canonical_bytes(message)).hexdigest()


def chain_hash(parent_hash: str | None, digest: str) -> str:
    """Hex SHA-256 over the parent's chain hash and this message's digest.

    Identifies a message together with everything before it, so an event anchored on a chain
    hash applies exactly to requests whose history contains that prefix.
    """
    return hashlib.sha256(f"{parent_hash or ''}:{digest}".encode()).hexdigest()


def digests_and_chain(messages: list[dict[str, Any]], memo: HashMemo | None = None) -> tuple[list[str], list[str]]:
    """Return ``(digests, chain_hashes)`` for ``messages``, one of each per message.

    The same values as ``message_digest``/``chain_hash`` applied in order; with ``memo`` (the
    caller's ``DigestMemo``, e.g. the pipeline's) reusing what it hashed before: a client resends
    its whole history every turn, and hashing it again cost 3 ms per MB (measured by
    ``tests/benchmarks``, pipeline section). A message nested deeper than orjson writes is hashed
    all the same (``canonical_bytes``); raises ``orjson.JSONEncodeError`` for one orjson refuses
    for another reason (a lone surrogate, an integer beyond 64 bits: neither comes out of
    ``proxy.json_text.parse_json``).
    """
    if memo is None:
        return _hash_all(messages, budgeted=False)  # (no request's: an offline replay's whole session)
    return memo.digests_and_chain(messages)


OFF_LOOP_DIGEST_BYTES = 8 << 20
"""Request bodies of at least this many bytes are hashed in a worker thread (``digests_off_loop``)."""
OFF_LOOP_DIGEST_MESSAGES = 20_000
"""Message lists of at least this many messages are hashed in a worker thread too (0.4 s of hashing
on the event loop when cold; such a list is past ``MEMO_MAX_BYTES``, so the memo keeps it briefly)."""


async def digests_off_loop(messages: list[dict[str, Any]], body_bytes: int,
                           memo: HashMemo | None = None) -> tuple[list[str], list[str]]:
    """``digests_and_chain(messages, memo)``, the same values; for a big request (``body_bytes``, the
    request body's size, at least ``OFF_LOOP_DIGEST_BYTES``, or ``OFF_LOOP_DIGEST_MESSAGES``
    messages) hashed in a worker thread without the memo (whose lock would stall the event loop's
    other requests meanwhile; such a list is past the memo's bound anyway), so the loop keeps serving
    other clients (hashlib releases the GIL on large buffers, and the Python loop yields it every
    switch interval). Raises what ``digests_and_chain`` raises."""
    done = digests_now(messages, body_bytes, memo)
    if done is not None:
        return done
    return await asyncio.to_thread(_hash_all, list(messages))


def digests_now(messages: list[dict[str, Any]], body_bytes: int,
                memo: HashMemo | None = None) -> tuple[list[str], list[str]] | None:
    """What ``digests_off_loop`` answers for a small request (hashed here, on the loop), without a
    coroutine; ``None`` for a big one (await ``digests_off_loop`` for it). Raises what
    ``digests_and_chain`` raises."""
    if body_bytes < OFF_LOOP_DIGEST_BYTES and len(messages) < OFF_LOOP_DIGEST_MESSAGES:
        return memo.digests_and_chain(messages) if memo is not None else _hash_all(messages)  # (``digests_and_chain``)
    return None


def _hash_all(messages: list[dict[str, Any]], *, budgeted: bool = True) -> tuple[list[str], list[str]]:
    """``message_digest``/``chain_hash`` of ``messages`` in order: a request's hashing, the first
    walk of its content, so its deep fallback is budgeted (``json_depth.deep_budget``: raises
    ``DeepBudgetExceeded`` past it) and, once done under it, the budget's decision is made; not
    ``budgeted``, any depth is hashed whatever it costs (no request waits on it)."""
    digests: list[str] = []
    chain: list[str] = []
    parent: str | None = None
    budget: DeepBudget | None = None
    for message in messages:
        c = canonical(message)
        try:
            raw = orjson.dumps(c, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError as exc:  # nested deeper than orjson writes (``canonical_bytes``)
            budget = budget or (deep_budget() if budgeted else None)
            raw = write_deep(exc, c, sort_keys=True, budget=budget)
        d = hashlib.sha256(raw).hexdigest()
        parent = chain_hash(parent, d)
        digests.append(d)
        chain.append(parent)
    if budget is not None:
        budget.decided = True
    return digests, chain


def text_of(content: Any) -> str:
    """The text of a message's ``content``: a string as is; text parts of a list joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif isinstance(part.get("content"), str):
                    parts.append(part["content"])
        return "\n".join(parts)
    return str(content)
