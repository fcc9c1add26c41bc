"""Thinking blocks: the fake signs the ones it emits and verifies the ones sent back.

Published behaviour (https://platform.claude.com/docs/en/build-with-claude/extended-thinking;
``anthropic/types/thinking_block.py``: "pass them back exactly as received"): with thinking on,
the ``thinking`` and ``redacted_thinking`` blocks of the latest assistant turn must come back
unmodified, and ``redacted_thinking.data`` unchanged. The API also binds a block to the
conversation it was made in (anomalyco/opencode#48637: "The block is bound to a different
conversation ... The `system` prompt differs from the one this block was created with"); how it
binds is not published, so the fake's binding is its own:

    signature = base64("FK1" + mac_text[16] + mac_bound[16])          (redacted: data = base64("FKR" + nonce[16] + mac_text + mac_bound))
    mac_text  = HMAC-SHA256(secret, kind + thinking text | nonce)[:16]
    mac_bound = HMAC-SHA256(secret, kind + prefix digest + thinking text | nonce)[:16]

where the *prefix* is the conversation before the block: the system blocks, then every turn
(``turns.py``: same-role messages merged) and the blocks of its own turn before it, each block
canonical (``tokens.canonical``) and thinking blocks left out (earlier turns' thinking may be
dropped, as the docs allow). The secret is the state's (``FakeAnthropicState.thinking_secret``).

Checks, only when ``thinking.type`` is ``enabled`` or ``adaptive``; wording as the API answers
it in public reports:

- a signature that does not decode, or whose ``mac_text`` fails in an earlier turn, or whose
  ``mac_bound`` fails in any turn (the block moved to another conversation, or what came before
  it changed: ding113/claude-code-hub#518; openclaw/openclaw#90108, rejected on every call after
  a compaction kept a tail's stale blocks; the API's newer ``drop_block`` behaviour drops them
  instead, earendil-works/pi#9391: either way a proxy must not send them)::

    messages.{i}.content.{j}: Invalid `signature` in `thinking` block
- a latest-turn block whose text changed, or a latest-turn ``redacted_thinking`` whose ``data``
  is not exactly as sent (anthropics/claude-code#19539, #63203)::

    messages.{i}.content.{j}: `thinking` or `redacted_thinking` blocks in the latest assistant message cannot be modified. These blocks must remain as they were in the original response.
- with ``thinking.type`` ``enabled``, a last user turn that starts with ``tool_result`` whose
  assistant turn does not start with a thinking block (NoeFabris/opencode-antigravity-auth#73)::

    messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{type}`. When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks from previous turns. To avoid this requirement, disable `thinking`. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from typing import Any

from tests.fakes.anthropic.errors import invalid
from tests.fakes.anthropic.tokens import blocks_of, canonical, compact
from tests.fakes.anthropic.turns import Turn

THINKING_KINDS = ("thinking", "redacted_thinking")
MAC_BYTES = 16


def _is_thinking(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") in THINKING_KINDS


def conversation_prefix(system: Any, turns: list[Turn], turn_index: int, block_index: int) -> bytes:
    """sha256 of the canonical conversation before block ``block_index`` of turn ``turn_index``."""
    parts: list[Any] = [[canonical(b) for b in blocks_of(system)]]
    for t, turn in enumerate(turns[:turn_index + 1]):
        blocks = turn.blocks if t < turn_index else turn.blocks[:block_index]
        parts.append({"role": turn.role, "content": [canonical(b) for _, _, b in blocks if not _is_thinking(b)]})
    return hashlib.sha256(compact(parts).encode()).digest()


class ThinkingSigner:
    """Makes and checks signatures and redacted data with one secret (see the module docstring)."""

    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret or os.urandom(32)

    def _mac(self, *parts: bytes) -> bytes:
        return hmac.new(self.secret, b"\0".join(parts), hashlib.sha256).digest()[:MAC_BYTES]

    def sign(self, thinking: str, prefix: bytes) -> str:
        payload = thinking.encode()
        return base64.b64encode(b"FK1" + self._mac(b"thinking", payload) + self._mac(b"bound", prefix, payload)).decode()

    def redacted_data(self, prefix: bytes) -> str:
        nonce = os.urandom(MAC_BYTES)
        macs = self._mac(b"redacted", nonce) + self._mac(b"bound", prefix, nonce)
        return base64.b64encode(b"FKR" + nonce + macs).decode()

    def check(self, block: dict[str, Any], prefix: bytes) -> str:
        """``ok``, ``malformed`` (not ours), ``modified`` (text or data changed) or ``rebound``."""
        if block.get("type") == "thinking":
            raw, tag = _decode(block.get("signature")), b"FK1"
            payload = str(block.get("thinking", "")).encode()
            macs = raw[3:] if raw is not None and raw[:3] == tag and len(raw) == 3 + 2 * MAC_BYTES else None
            kind = b"thinking"
        else:
            raw, tag = _decode(block.get("data")), b"FKR"
            ok = raw is not None and raw[:3] == tag and len(raw) == 3 + 3 * MAC_BYTES
            payload = raw[3:3 + MAC_BYTES] if ok and raw is not None else b""
            macs = raw[3 + MAC_BYTES:] if ok and raw is not None else None
            kind = b"redacted"
        if macs is None:
            return "malformed"
        if not hmac.compare_digest(macs[:MAC_BYTES], self._mac(kind, payload)):
            return "modified"
        if not hmac.compare_digest(macs[MAC_BYTES:], self._mac(b"bound", prefix, payload)):
            return "rebound"
        return "ok"


def _decode(value: Any) -> bytes | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def thinking_mode(body: dict[str, Any]) -> str | None:
    config = body.get("thinking")
    return config.get("type") if isinstance(config, dict) else None


def case_signature(thinking: str) -> str:
    """The signature of the shared cases' convention (``../shared/cases``): ``sig-`` + the first 32
    hex digits of sha256 of the thinking text."""
    return "sig-" + hashlib.sha256(thinking.encode()).hexdigest()[:32]


def issue_case_blocks(body: dict[str, Any], turns: list[Turn], issued: dict[str, bytes]) -> None:
    """Record the prefix each thinking block of a client's request was issued against (its own
    request's: the shared cases' convention), by its ``signature`` (or ``data``), in ``issued``."""
    for t, turn in enumerate(turns):
        for j, (_, _, block) in enumerate(turn.blocks):
            if _is_thinking(block):
                key = block.get("signature") if block.get("type") == "thinking" else block.get("data")
                if isinstance(key, str):
                    issued[key] = conversation_prefix(body.get("system"), turns, t, j)


def _case_verdict(block: dict[str, Any], prefix: bytes, issued: dict[str, bytes]) -> str | None:
    """The verdict on a block issued by the shared cases' convention (``None``: not one of them)."""
    key = block.get("signature") if block.get("type") == "thinking" else block.get("data")
    if not isinstance(key, str) or key not in issued:
        return None
    if block.get("type") == "thinking" and key != case_signature(str(block.get("thinking", ""))):
        return "modified"
    return "ok" if hmac.compare_digest(issued[key], prefix) else "rebound"


def verify_thinking(body: dict[str, Any], turns: list[Turn], signer: ThinkingSigner,
                    issued: dict[str, bytes] | None = None) -> None:
    """Raise the API's 400 for a thinking block that did not come back as it was made, or that
    comes after a prefix other than the one it was made over (in any turn: the binding the API
    enforces, openclaw/openclaw#90108 "Invalid signature in thinking block" on every call after a
    compaction kept stale blocks; ``issued``: blocks of the shared cases' convention)."""
    mode = thinking_mode(body)
    if mode not in ("enabled", "adaptive"):
        return
    assistant_turns = [t for t, turn in enumerate(turns) if turn.role == "assistant"]
    latest = assistant_turns[-1] if assistant_turns else -1
    for t in assistant_turns:
        for j, (i, k, block) in enumerate(turns[t].blocks):
            if not _is_thinking(block):
                continue
            prefix = conversation_prefix(body.get("system"), turns, t, j)
            verdict = _case_verdict(block, prefix, issued or {}) or signer.check(block, prefix)
            redacted_in_latest = t == latest and block.get("type") == "redacted_thinking" and verdict != "ok"
            if (t == latest and verdict == "modified") or redacted_in_latest:
                raise invalid(
                    f"messages.{i}.content.{k}: `thinking` or `redacted_thinking` blocks in the latest assistant "
                    "message cannot be modified. These blocks must remain as they were in the original response."
                )
            if verdict != "ok":
                raise invalid(f"messages.{i}.content.{k}: Invalid `signature` in `thinking` block")
    if mode == "enabled" and latest >= 0 and latest == len(turns) - 2 and turns[-1].role == "user":
        first_user = turns[-1].blocks[0][2] if turns[-1].blocks else None
        head_i, head_k, head = turns[latest].blocks[0] if turns[latest].blocks else (0, 0, {})
        if isinstance(first_user, dict) and first_user.get("type") == "tool_result" and not _is_thinking(head):
            found = head.get("type") if isinstance(head, dict) else type(head).__name__
            raise invalid(
                f"messages.{head_i}.content.{head_k}.type: Expected `thinking` or `redacted_thinking`, but found `{found}`. "
                "When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the "
                "lastmost set of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks from "
                "previous turns. To avoid this requirement, disable `thinking`. Please consult our documentation at "
                "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
            )
