"""Strict request validation of the fake upstream (what a strict provider rejects).

``validate_chat_request(body, style, policy)`` returns ``None`` for an acceptable body or a
``Rejection`` (HTTP status, JSON body) worded as the shared cases quote the providers:

- parameters: ``stream_options`` without ``stream: true`` (case 029, OpenAI);
  ``max_completion_tokens`` / ``max_tokens`` refused by policy (case 028, Azure and reasoning
  models); output above the model's cap (case 031, ``invalid_value``);
- roles: system, user, assistant, tool (+ developer when allowed, + ``extra_roles``: e.g.
  ``ipython`` for vLLM serving a Llama 3.x template). ``developer`` otherwise gets case 026's
  wording, every role under style ``deepseek`` too; any other role OpenAI's published 400
  (``Invalid value: 'wizard'. Supported values are: ...``, ``param`` ``messages[1].role``, ``code``
  ``invalid_value``; as OpenAI answered in public reports and as independent OpenAI-compatible
  servers reproduce it);
  ``name`` on a non-user message under style ``xai`` (case 023);
- tools: ``tools`` an array of objects, each ``function`` an object whose ``name`` is a string and
  whose ``parameters`` (a JSON Schema) is an object when given, refused in OpenAI's wording for a
  wrong type (``Invalid type for 'tools[0].function.parameters': expected an object, but got a
  string instead.``, ``param`` the path, ``code`` ``invalid_type``);
- content parts: OpenAI part types; Anthropic ``tool_use``/``tool_result`` blocks only under
  style ``anthropic`` (case 002), paired message to message as Anthropic requires (case 022);
- tool pairing: each ``tool`` message answers an id of the nearest preceding assistant
  ``tool_calls`` (OpenAI wording), each call answered before the next non-tool message and
  before the end, no id declared or answered twice. An unanswered call is refused in OpenAI's
  wording, which lists the unanswered ``tool_call_id``s verbatim (so a provider error can echo a
  client's string), or in DeepSeek's, which lists none (case 004), under style ``deepseek``.
  ``content`` null and ``""`` are both fine on tool-call messages (case 025).

Error envelopes follow the style: Anthropic's under ``anthropic``, xAI's under ``xai``, else
OpenAI's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OPENAI_PART_TYPES = ("text", "image_url", "input_audio", "file", "refusal")
ANTHROPIC_BLOCK_TYPES = ("tool_use", "tool_result", "image")


@dataclass(frozen=True)
class Rejection:
    """A refused request: HTTP ``status`` and the JSON ``body`` to send."""

    status: int
    body: Any


@dataclass(frozen=True)
class ValidationPolicy:
    """Switches of the strict validator (copied from ``FakeState`` per request)."""

    allow_developer: bool = False
    reject_max_completion_tokens: bool = False
    reject_max_tokens: bool = False
    output_cap_tokens: int | None = None
    extra_roles: tuple[str, ...] = ()
    """Roles accepted besides the standard ones (a provider whose chat template knows them)."""


class _Invalid(Exception):
    def __init__(self, message: str, param: Any = None, code: Any = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def _envelope(style: str, exc: _Invalid) -> Rejection:
    if style == "anthropic":
        return Rejection(400, {"type": "error", "error": {"type": "invalid_request_error", "message": exc.message}})
    if style == "xai":
        return Rejection(400, {"code": "Client specified an invalid argument", "error": exc.message})
    return Rejection(400, {"error": {"message": exc.message, "type": "invalid_request_error", "param": exc.param, "code": exc.code}})


def validate_chat_request(body: Any, style: str, policy: ValidationPolicy) -> Rejection | None:
    """None when ``body`` is acceptable, else the provider's 400 (see module docstring)."""
    try:
        _check_params(body, policy)
        _check_tools(body.get("tools"))
        messages = body["messages"]
        _check_roles_and_parts(messages, style, policy)
        _check_tool_pairing(messages, style)
        if style == "anthropic":
            _check_anthropic_blocks(messages)
    except _Invalid as exc:
        return _envelope(style, exc)
    return None


def _check_params(body: Any, policy: ValidationPolicy) -> None:
    if not isinstance(body, dict):
        raise _Invalid("We could not parse the JSON body of your request.", code=None)
    if not isinstance(body.get("model"), str):
        raise _Invalid("you must provide a model parameter", param="model", code=None)
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise _Invalid("'messages' is a required property and must be a non-empty array.", param="messages", code=None)
    if body.get("stream_options") is not None and body.get("stream") is not True:
        raise _Invalid(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options", code=None,
        )
    if policy.reject_max_completion_tokens and "max_completion_tokens" in body:
        raise _Invalid("Unrecognized request argument supplied: max_completion_tokens", code=None)
    if policy.reject_max_tokens and "max_tokens" in body:
        raise _Invalid(
            "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
            param="max_tokens", code="unsupported_parameter",
        )
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise _Invalid(f"Invalid '{key}': integer below minimum value. Expected a value >= 1, but got {value} instead.", param=key, code="integer_below_min_value")
        cap = policy.output_cap_tokens
        if cap is not None and value > cap:
            raise _Invalid(
                f"{key} is too large: {value}. This model supports at most {cap} completion tokens, "
                f"whereas you provided {value}.",
                param=key, code="invalid_value",
            )


def _type_name(value: Any) -> str:
    """How OpenAI's wrong-type errors name ``value``'s JSON type (``a string``, ``null``...)."""
    kinds = {bool: "a boolean", int: "an integer", float: "a decimal", str: "a string", list: "an array", dict: "an object"}
    return kinds.get(type(value), "null")


def _wrong_type(where: str, expected: str, value: Any) -> _Invalid:
    return _Invalid(f"Invalid type for '{where}': expected {expected}, but got {_type_name(value)} instead.",
                    param=where, code="invalid_type")


def _check_tools(tools: Any) -> None:
    """``tools`` absent or an array of objects whose ``function`` (when given) is an object with a
    string ``name`` (when given) and an object ``parameters`` (when given, not null)."""
    if tools is None:
        return
    if not isinstance(tools, list):
        raise _wrong_type("tools", "an array", tools)
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _wrong_type(f"tools[{i}]", "an object", tool)
        fn = tool.get("function")
        if fn is None:
            continue
        if not isinstance(fn, dict):
            raise _wrong_type(f"tools[{i}].function", "an object", fn)
        if fn.get("name") is not None and not isinstance(fn["name"], str):
            raise _wrong_type(f"tools[{i}].function.name", "a string", fn["name"])
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise _wrong_type(f"tools[{i}].function.parameters", "an object", fn["parameters"])


def _check_roles_and_parts(messages: list[Any], style: str, policy: ValidationPolicy) -> None:
    allowed = ["system", "user", "assistant", "tool"] + (["developer"] if policy.allow_developer else []) + list(policy.extra_roles)
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _Invalid(f"Invalid type for 'messages[{i}]': expected an object.", param=f"messages[{i}]", code="invalid_type")
        role = message.get("role")
        if role not in allowed:
            raise _role_refused(message, i, style)
        if style == "xai" and "name" in message and role != "user":
            raise _Invalid("Only messages of role 'user' can have a name.")
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise _Invalid("Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'.", param=f"messages.[{i}].tool_call_id", code="missing_required_parameter")
        content = message.get("content")
        if content is None and role != "assistant":
            raise _Invalid("Invalid value for 'content': expected a string, got null.", param=f"messages.[{i}].content", code=None)
        if content is None and role == "assistant" and not message.get("tool_calls"):
            raise _Invalid("Invalid value for 'content': expected a string, got null.", param=f"messages.[{i}].content", code=None)
        if isinstance(content, list):
            accepted = OPENAI_PART_TYPES + (ANTHROPIC_BLOCK_TYPES if style == "anthropic" else ())
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in accepted:
                    supported = ", ".join(f"'{t}'" for t in accepted)
                    raise _Invalid(
                        f"Invalid value: '{kind}'. Supported values are: {supported}.",
                        param=f"messages[{i}].content[{j}].type", code="invalid_value",
                    )


def _role_refused(message: dict[str, Any], i: int, style: str) -> _Invalid:
    role = message.get("role")
    if role == "developer" or style == "deepseek":  # case 026 (DeepSeek's serde wording)
        return _Invalid(f"messages[{i}].role: unknown variant `{role}`, expected one of `system`, `user`, `assistant`, `tool`")
    if "role" not in message:
        return _Invalid(f"Missing required parameter: 'messages[{i}].role'.", param=f"messages[{i}].role", code="missing_required_parameter")
    if not isinstance(role, str):  # OpenAI's pattern for a wrong type (its exact words for a role: not published)
        return _wrong_type(f"messages[{i}].role", "a string", role)
    return _Invalid(
        f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'.",
        param=f"messages[{i}].role", code="invalid_value",
    )


def _check_tool_pairing(messages: list[dict[str, Any]], style: str) -> None:
    seen_ids: set[str] = set()
    pending: list[str] = []  # ids of the open tool_calls block not yet answered
    declared: set[str] = set()  # ids of the open block
    block_open = False
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not block_open or call_id not in declared:
                raise _Invalid(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                    "message with 'tool_calls'.",
                    param=f"messages.[{i}].role", code=None,
                )
            if call_id not in pending:
                raise _Invalid(f"Duplicate tool message for tool_call_id '{call_id}' in messages[{i}].", param=f"messages.[{i}].tool_call_id", code=None)
            pending.remove(call_id)
            continue
        if pending:
            raise _dangling(style, pending, i)
        block_open = False
        tool_calls = message.get("tool_calls") if role == "assistant" else None
        if tool_calls:
            ids = [(call or {}).get("id") for call in tool_calls]
            for call_id in ids:
                if not isinstance(call_id, str) or not call_id:
                    raise _Invalid(f"Missing required parameter: 'messages[{i}].tool_calls[].id'.", param=f"messages[{i}].tool_calls", code="missing_required_parameter")
                if call_id in seen_ids:
                    raise _Invalid(f"Duplicate value for 'tool_call_id' of {call_id} in message[{i}]", param=f"messages[{i}].tool_calls", code=None)
                seen_ids.add(call_id)
            pending, declared, block_open = list(ids), set(ids), True
    if pending:
        raise _dangling(style, pending, len(messages))


def _dangling(style: str, unanswered: list[str], index: int) -> _Invalid:
    """The refusal of unanswered tool calls; ``index``: the message found where a ``tool`` message
    was due (``len(messages)`` at the end, a guess: OpenAI's param for that case is not published)."""
    prefix = "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'."
    if style == "deepseek":
        return _Invalid(prefix + " (insufficient tool messages following tool_calls message)")
    return _Invalid(
        f"{prefix} The following tool_call_ids did not have response messages: {', '.join(unanswered)}",
        param=f"messages.[{index}].role", code=None,
    )


def _blocks(message: dict[str, Any], kind: str, key: str) -> list[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [part.get(key) for part in content if isinstance(part, dict) and part.get("type") == kind]


def _check_anthropic_blocks(messages: list[dict[str, Any]]) -> None:
    for i, message in enumerate(messages):
        uses = _blocks(message, "tool_use", "id") if message.get("role") == "assistant" else []
        if uses:
            following = messages[i + 1] if i + 1 < len(messages) else {}
            results = _blocks(following, "tool_result", "tool_use_id") if following.get("role") == "user" else []
            missing = [u for u in uses if u not in results]
            if missing:
                raise _Invalid(
                    f"messages.{i}: tool_use ids were found without tool_result blocks immediately after: "
                    f"{', '.join(missing)}. Each tool_use block must have a corresponding tool_result block in the next message."
                )
        results = _blocks(message, "tool_result", "tool_use_id") if message.get("role") == "user" else []
        if results:
            previous = messages[i - 1] if i > 0 else {}
            declared = _blocks(previous, "tool_use", "id") if previous.get("role") == "assistant" else []
            unexpected = [r for r in results if r not in declared]
            if unexpected:
                raise _Invalid(
                    f"messages.{i}.content.0: unexpected tool_use_id found in tool_result blocks: "
                    f"{', '.join(unexpected)}. Each tool_result block must have a corresponding tool_use block in the previous message."
                )
