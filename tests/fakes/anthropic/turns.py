"""Conversation turns and tool pairing: what the API checks across messages.

Turns: "Consecutive ``user`` or ``assistant`` turns in your request will be combined into a
single turn" (``messages`` in ``anthropic/types/message_create_params.py``), so the fake merges
them and never rejects two same-role messages in a row, nor a first message from the assistant
(the API accepts it: anthropics/anthropic-sdk-typescript#622). ``system`` messages (allowed in
``messages`` by ``message_param.py``) are turns of their own.

Tool pairing, on turns (tool use docs, "Handling tool use and tool result content blocks": the
``tool_result`` blocks of the next user turn come first, before any text). Wording as the API
answers it in public reports:

- every ``tool_use`` id of an assistant turn must be answered by the *leading* ``tool_result``
  blocks of the next turn, else (anthropics/claude-code#5989, #2697; QwenLM/qwen-code#8165 for a
  text block placed before the result: same error)::

    messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: {ids}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.

  ``{i}``: the message holding the first unanswered ``tool_use``; ``{ids}``: comma-separated.
- every ``tool_result`` must answer a ``tool_use`` of the previous turn, else
  (anthropics/claude-code#13460, router-for-me/CLIProxyAPI#497)::

    messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.fakes.anthropic.errors import invalid
from tests.fakes.anthropic.tokens import blocks_of


@dataclass
class Turn:
    """Messages of one role merged: ``(message index, block index, block)`` in order."""

    role: str
    blocks: list[tuple[int, int, Any]] = field(default_factory=list)


def merge_turns(messages: list[dict[str, Any]]) -> list[Turn]:
    turns: list[Turn] = []
    for i, message in enumerate(messages):
        role = message.get("role", "")
        if not turns or turns[-1].role != role or role == "system":
            turns.append(Turn(role))
        turns[-1].blocks.extend((i, j, b) for j, b in enumerate(blocks_of(message.get("content"))))
    return turns


def _kind(block: Any) -> Any:
    return block.get("type") if isinstance(block, dict) else None


def check_tool_pairing(turns: list[Turn]) -> None:
    """Raise the API's 400 for the first pairing fault (see the module docstring)."""
    previous_uses: set[str] = set()
    for t, turn in enumerate(turns):
        if turn.role == "user":
            for i, j, block in turn.blocks:
                if _kind(block) == "tool_result" and block.get("tool_use_id") not in previous_uses:
                    raise invalid(
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding "
                        "`tool_use` block in the previous message."
                    )
        uses = [(i, b.get("id")) for i, _, b in turn.blocks if _kind(b) == "tool_use"] if turn.role == "assistant" else []
        previous_uses = {u for _, u in uses}
        if not uses:
            continue
        following = turns[t + 1] if t + 1 < len(turns) else None
        answered: set[Any] = set()
        if following is not None and following.role == "user":
            for _, _, block in following.blocks:
                if _kind(block) != "tool_result":
                    break
                answered.add(block.get("tool_use_id"))
        missing = [(i, u) for i, u in uses if u not in answered]
        if missing:
            ids = ", ".join(str(u) for _, u in missing)
            raise invalid(
                f"messages.{missing[0][0]}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{ids}. Each `tool_use` block must have a corresponding `tool_result` block in the next message."
            )
