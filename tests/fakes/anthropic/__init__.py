"""A strict fake of Anthropic's Messages API, for tests: ``create_fake_anthropic() -> (app, state)``.

``app`` is a raw ASGI application: run it under ``tests.fakes.server.UvicornServer`` (a real
socket) or call it in-process through an ASGI transport. ``state``
(``FakeAnthropicState``) holds the script, the controls and every request received.

It follows Anthropic's published behaviour (the API docs and the official SDK's types), not what
the proxy expects; each module names its sources:

- ``app``: routes (``POST /v1/messages``, ``POST /v1/messages/count_tokens``), header checks,
  order of checks, the context window;
- ``validation``: body checks and their wording; ``turns``: turns and tool pairing;
- ``thinking``: signing and verifying thinking blocks; ``cache``: prompt-cache emulation;
- ``tokens``: the counting rule and the prompt's segments; ``compose``: reply → Message;
- ``wire``: the Message object and the stream's events; ``errors``: the error envelope;
- ``replies``: what a test scripts; ``state``: controls, faults and records.
"""

from __future__ import annotations

from tests.fakes.anthropic.app import FakeAnthropic
from tests.fakes.anthropic.replies import (
    Reply,
    Responder,
    echo_responder,
    redacted_thinking,
    reply,
    text,
    thinking,
    tool_use,
)
from tests.fakes.anthropic.state import FakeAnthropicState, ReceivedRequest

__all__ = [
    "FakeAnthropic", "FakeAnthropicState", "ReceivedRequest", "Reply", "Responder", "create_fake_anthropic",
    "echo_responder", "redacted_thinking", "reply", "text", "thinking", "tool_use",
]


def create_fake_anthropic(state: FakeAnthropicState | None = None) -> tuple[FakeAnthropic, FakeAnthropicState]:
    """A new fake provider and its state."""
    state = state or FakeAnthropicState()
    return FakeAnthropic(state), state
