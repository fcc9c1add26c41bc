"""Strict request checks of the fake Anthropic provider, in the API's pydantic-style wording.

``check_body(body, endpoint, beta, extra_fields)`` raises ``ApiError`` (400
``invalid_request_error``) for the first fault, in this order:

1. the body is a JSON object; no top-level field outside the SDK's request types
   (``anthropic/types/message_create_params.py`` / ``message_count_tokens_params.py``, plus
   ``temperature``, ``top_k``, ``top_p`` that the API reference documents for older models, plus
   the beta types' fields (``types/beta/message_create_params.py``) when the request is a beta
   one: ``?beta=true`` or an ``anthropic-beta`` header; plus the test's ``extra_fields``):
   ``{field}: Extra inputs are not permitted`` (the API's wording in
   anthropics/claude-code#4378, Aider-AI/aider#3367);
2. required fields: ``model``, ``messages``, and ``max_tokens`` on ``/v1/messages`` only (the
   count-tokens request has none): ``{field}: Field required`` (tickernelz/opencode-mem#50);
   ``max_tokens`` an integer ≥ 0 (0 is documented: it warms the cache, no output);
3. ``messages`` non-empty (``messages: at least one message is required``); each a dict whose
   ``role`` is ``user``, ``assistant`` or ``system`` and whose ``content`` is a string or a list;
   an empty string content only for the final assistant message
   (``messages.{i}: all messages must have non-empty content except for the optional final
   assistant message``, anthropics/claude-code#4416);
4. blocks: unknown keys of the block types the SDK defines (``text_block_param.py``,
   ``tool_use_block_param.py``, ``tool_result_block_param.py``, ``thinking_block_param.py``,
   ``redacted_thinking_block_param.py``, ``image_block_param.py``, ``document_block_param.py``):
   ``messages.{i}.content.{j}.{type}.{key}: Extra inputs are not permitted`` (the path form of
   anthropics/claude-code#4378); empty text: ``messages: text content blocks must be non-empty``
   (anthropics/claude-code#59812); whitespace-only: ``messages: text content blocks must contain
   non-whitespace text`` (anthropics/claude-code#23352); the same two for ``system`` blocks;
5. at most 4 ``cache_control`` blocks over tools, system and messages (top-level
   ``cache_control`` takes one of them): ``A maximum of 4 blocks with cache_control may be
   provided. Found {n}.`` (tghamm/Anthropic.SDK#50);
6. ``thinking``: ``enabled`` needs ``budget_tokens`` ≥ 1024
   (``thinking.enabled.budget_tokens: Input should be greater than or equal to 1024``,
   themaximalist/llm.js#30) below ``max_tokens`` (``\\`max_tokens\\` must be greater than
   \\`thinking.budget_tokens\\`. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking#max-tokens-and-context-window-size``,
   router-for-me/CLIProxyAPI#413).

Tool pairing is ``turns.py``'s, thinking signatures ``thinking.py``'s. Not checked: tool
definitions' JSON Schema, ``tool_choice`` shape, image sources, model names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tests.fakes.anthropic.errors import invalid
from tests.fakes.anthropic.tokens import blocks_of

MESSAGES_FIELDS = frozenset({
    "model", "messages", "max_tokens", "cache_control", "container", "diagnostics", "inference_geo", "metadata",
    "output_config", "service_tier", "speed", "stop_sequences", "system", "thinking", "tool_choice", "tools",
    "user_profile_id", "workspace_id", "stream", "temperature", "top_k", "top_p",
})
COUNT_TOKENS_FIELDS = frozenset({
    "model", "messages", "cache_control", "output_config", "speed", "system", "thinking", "tool_choice", "tools",
    "user_profile_id", "workspace_id",
})
BETA_FIELDS = frozenset({
    "billing_policy", "compaction", "context_management", "fallback_credit_token", "fallbacks", "mcp_servers", "thread",
})
BLOCK_KEYS = {
    "text": {"type", "text", "cache_control", "citations"},
    "tool_use": {"type", "id", "name", "input", "cache_control", "caller", "toolset_name"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control", "toolset_name"},
    "thinking": {"type", "thinking", "signature"},
    "redacted_thinking": {"type", "data"},
    "image": {"type", "source", "cache_control", "transformations"},
    "document": {"type", "source", "cache_control", "citations", "context", "title"},
}
"""Keys each block type may carry; other block types (server tools, search results) are not checked."""
MAX_CACHE_BREAKPOINTS = 4
MIN_THINKING_BUDGET_TOKENS = 1024
ROLES = ("user", "assistant", "system")


def check_body(body: Any, endpoint: str, beta: bool, extra_fields: Iterable[str] = (), *,
               output_room: bool = True) -> None:
    """Raise the API's 400 for the first fault of ``body`` (see the module docstring).
    ``output_room``: ``max_tokens`` must exceed a thinking budget (``False``: a case whose rules
    do not check it)."""
    if not isinstance(body, dict):
        raise invalid("Input should be a valid dictionary or object to extract fields from")
    allowed = (MESSAGES_FIELDS if endpoint == "messages" else COUNT_TOKENS_FIELDS) | set(extra_fields)
    if beta:
        allowed |= BETA_FIELDS
    for key in body:
        if key not in allowed:
            raise invalid(f"{key}: Extra inputs are not permitted")
    required = ("model", "messages", "max_tokens") if endpoint == "messages" else ("model", "messages")
    for key in required:
        if key not in body:
            raise invalid(f"{key}: Field required")
    if not isinstance(body["model"], str):
        raise invalid("model: Input should be a valid string")
    if endpoint == "messages":
        max_tokens = body["max_tokens"]
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            raise invalid("max_tokens: Input should be a valid integer")
        if max_tokens < 0:
            raise invalid("max_tokens: Input should be greater than or equal to 0")
        if "stream" in body and not isinstance(body["stream"], bool):
            raise invalid("stream: Input should be a valid boolean")
    _check_system(body.get("system"))
    _check_messages(body["messages"])
    _check_cache_breakpoints(body)
    _check_thinking(body, endpoint if output_room else "count_tokens")  # (count_tokens has no max_tokens)


def _check_text(block: dict[str, Any], where: str) -> None:
    value = block.get("text")
    if not isinstance(value, str):
        raise invalid(f"{where}.text: Input should be a valid string")
    if value == "":
        raise invalid(f"{where.split('.')[0]}: text content blocks must be non-empty")
    if not value.strip():
        raise invalid(f"{where.split('.')[0]}: text content blocks must contain non-whitespace text")


def _check_system(system: Any) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise invalid("system: Input should be a valid list")
    for j, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise invalid(f"system.{j}.type: Input should be 'text'")
        _check_keys(block, f"system.{j}")
        _check_text(block, f"system.{j}")


def _check_keys(block: dict[str, Any], where: str) -> None:
    kind = block.get("type")
    allowed = BLOCK_KEYS.get(kind) if isinstance(kind, str) else None
    if allowed is None:
        return
    for key in block:
        if key not in allowed:
            raise invalid(f"{where}.{kind}.{key}: Extra inputs are not permitted")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise invalid("messages: Input should be a valid list")
    if not messages:
        raise invalid("messages: at least one message is required")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages.{i}: Input should be a valid dictionary")
        for key in message:
            if key not in ("role", "content"):
                raise invalid(f"messages.{i}.{key}: Extra inputs are not permitted")
        if message.get("role") not in ROLES:
            raise invalid(f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'")
        if "content" not in message:
            raise invalid(f"messages.{i}.content: Field required")
        content = message["content"]
        if not isinstance(content, str | list):
            raise invalid(f"messages.{i}.content: Input should be a valid string")
        final_assistant = i == len(messages) - 1 and message["role"] == "assistant"
        if not content and not final_assistant:
            raise invalid(f"messages.{i}: all messages must have non-empty content except for the optional final assistant message")
        for j, block in enumerate(blocks_of(content) if content else []):
            where = f"messages.{i}.content.{j}"
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                raise invalid(f"{where}: Input should be a valid dictionary or object to extract fields from")
            _check_keys(block, where)
            if block["type"] == "text":
                _check_text(block, where)
            if block["type"] == "tool_result" and isinstance(block.get("content"), list):
                for k, inner in enumerate(block["content"]):
                    if isinstance(inner, dict) and inner.get("type") == "text":
                        _check_text(inner, f"{where}.content.{k}")


def _cache_marked(items: Any) -> int:
    return sum(1 for item in items if isinstance(item, dict) and item.get("cache_control") is not None)


def _check_cache_breakpoints(body: dict[str, Any]) -> None:
    found = _cache_marked(body.get("tools") or [])
    system = body.get("system")
    found += _cache_marked(system) if isinstance(system, list) else 0
    for message in body["messages"]:
        content = message.get("content")
        found += _cache_marked(content) if isinstance(content, list) else 0
    found += 1 if body.get("cache_control") is not None else 0
    if found > MAX_CACHE_BREAKPOINTS:
        raise invalid(f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {found}.")


def _check_thinking(body: dict[str, Any], endpoint: str) -> None:
    config = body.get("thinking")
    if config is None:
        return
    if not isinstance(config, dict) or config.get("type") not in ("enabled", "adaptive", "disabled"):
        raise invalid("thinking: Input tag found using 'type' does not match any of the expected tags: 'enabled', 'disabled', 'adaptive'")
    if config["type"] != "enabled":
        return
    budget = config.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise invalid("thinking.enabled.budget_tokens: Field required")
    if budget < MIN_THINKING_BUDGET_TOKENS:
        raise invalid(f"thinking.enabled.budget_tokens: Input should be greater than or equal to {MIN_THINKING_BUDGET_TOKENS}")
    if endpoint == "messages" and body["max_tokens"] <= budget:
        raise invalid(
            "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at "
            "https://docs.claude.com/en/docs/build-with-claude/extended-thinking#max-tokens-and-context-window-size"
        )
