"""``FakeAnthropicState``: what a test scripts, configures and inspects on the fake provider.

Shared between the test's thread and the server's (plain attribute writes and list appends
between requests; the cache has its own lock).

Model windows (tokens): ``windows[model]`` if set, else a ``fake-<window>[-<anything>]`` name
(``fake-4k-anthropic``: 4,096; ``fake-200000-anthropic``: 200,000; the rule of
``tests.fakes.tokens.parse_fake_model``), else ``default_window_tokens`` (200,000: the context
window the models overview gives current Claude models by default).

Faults, consumed one per ``/v1/messages*`` request after the header checks (``fail_next``)::

    ("status", 529)                          the documented error envelope, default message per status
    ("status", 429, "message", {"retry-after": "7"})   with a message and extra headers
    ("stream_error", "overloaded_error", "Overloaded")  a 200 stream: message_start, ping, then event: error
    ("delay", seconds)                       wait, then answer normally
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.anthropic.cache import PromptCache
from tests.fakes.anthropic.replies import Reply, Responder, echo_responder
from tests.fakes.anthropic.thinking import ThinkingSigner
from tests.fakes.tokens import parse_fake_model

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
DEFAULT_WINDOW_TOKENS = 200_000
MAX_BODY_BYTES = 32 * 1024 * 1024
"""The documented request size limit of the Messages and Token Counting APIs (32 MB)."""

Fault = tuple[Any, ...]


@dataclass
class ReceivedRequest:
    """One request as received (``raw`` bytes, parsed ``json`` or None, lower-case ``headers``)
    and what was answered: ``status``, ``outcome`` (``ok``, ``invalid``, ``unauthorized``,
    ``too_large``, ``overflow``, ``fault``, ``not_found``), ``error`` (the error message),
    ``usage`` and ``response`` (the Message object or the count)."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    raw: bytes = field(repr=False)
    json: Any = field(repr=False)
    timestamp: float
    status: int | None = None
    outcome: str | None = None
    error: str | None = None
    input_tokens: int | None = None
    usage: dict[str, Any] | None = None
    response: Any = field(default=None, repr=False)


@dataclass
class FakeAnthropicState:
    """Controls and records of one fake Anthropic provider (see the module docstring).

    ``api_keys``: None accepts any non-empty key; a set accepts only those. ``extra_fields``:
    top-level body fields accepted besides the SDK's. ``chunk_delay_s``: pause between stream
    events. ``thinking_secret``: the HMAC key of signatures (random per state).
    """

    requests: list[ReceivedRequest] = field(default_factory=list)
    script: deque[Reply | Responder] = field(default_factory=deque)
    responder: Responder = echo_responder
    fail_next: list[Fault] = field(default_factory=list)
    windows: dict[str, int] = field(default_factory=dict)
    default_window_tokens: int = DEFAULT_WINDOW_TOKENS
    max_body_bytes: int = MAX_BODY_BYTES
    api_keys: set[str] | None = None
    extra_fields: set[str] = field(default_factory=set)
    min_cacheable_tokens: int = 0
    chunk_delay_s: float = 0.0
    thinking_secret: bytes = field(default_factory=lambda: os.urandom(32), repr=False)
    cache: PromptCache = field(default_factory=PromptCache, repr=False)
    output_room_checked: bool = True
    """The API's checks of the reply's room: input + ``max_tokens`` within the window, ``max_tokens``
    above a thinking budget (``False``: the shared cases' fake checks the prompt alone)."""
    issued: dict[str, bytes] = field(default_factory=dict, repr=False)
    """Thinking blocks of the shared cases' convention (``thinking.issue_case_blocks``): signature
    (or redacted ``data``) -> the prefix it was issued against."""

    def reset(self) -> None:
        """Forget requests, script and cache; restore every control (a new secret too)."""
        fresh = FakeAnthropicState()
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(fresh, name))

    @property
    def signer(self) -> ThinkingSigner:
        return ThinkingSigner(self.thinking_secret)

    @property
    def message_requests(self) -> list[ReceivedRequest]:
        return [r for r in self.requests if r.path == MESSAGES_PATH]

    def window_for(self, model: str) -> int:
        if model in self.windows:
            return self.windows[model]
        parsed = parse_fake_model(model)
        return parsed[0] if parsed else self.default_window_tokens

    def pop_fault(self) -> Fault | None:
        return self.fail_next.pop(0) if self.fail_next else None

    def next_reply(self, request: ReceivedRequest) -> Reply:
        entry: Reply | Responder = self.script.popleft() if self.script else self.responder
        return entry if isinstance(entry, Reply) else entry(request)

    def record(self, **fields: Any) -> ReceivedRequest:
        request = ReceivedRequest(timestamp=time.time(), **fields)
        self.requests.append(request)
        return request
