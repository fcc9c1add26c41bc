"""``FakeState``: what tests inspect and control on the fake upstream.

The state is shared between the test thread and the server thread; tests mutate it between
requests (plain attribute writes, list appends), the server reads it per request.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.read_tool import respond_read_tool
from tests.fakes.responders import DEFAULT_RESPONDERS, Responder
from tests.fakes.styles import OverflowStyle, style_for
from tests.fakes.tokens import DEFAULT_WINDOW_TOKENS, parse_fake_model
from tests.fakes.validation import ValidationPolicy

CHAT_PATH = "/v1/chat/completions"


@dataclass
class ReceivedRequest:
    """One request as the fake upstream received it, plus what it answered.

    ``json`` is the parsed body (None when not JSON); ``body`` the raw bytes; ``timestamp`` in
    seconds since the epoch. ``status`` and ``outcome`` are filled once answered; outcome is
    one of ``ok``, ``overflow``, ``truncated``, ``invalid``, ``too_large``, ``rate_limited``,
    or ``fault``.
    """

    method: str
    path: str
    query: str
    headers: dict[str, str]
    json: Any = field(repr=False)
    body: bytes = field(repr=False)
    timestamp: float
    is_summary: bool = False
    prompt_tokens: int | None = None
    status: int | None = None
    outcome: str | None = None
    reply: dict[str, Any] | None = None


Fault = tuple[Any, ...]
"""``("status", code, body[, headers])`` | ``("sse", parts)`` (HTTP 200, an event stream of exactly
``parts``) | ``("cut_stream", after_n_chunks)`` | ``("stall", seconds)`` (headers sent, then
silence) | ``("delay", seconds)`` (before answering)."""


@dataclass
class FakeState:
    """Controls and records of one fake upstream.

    Model resolution: ``fake-<window>-<style>`` names carry both; any other model uses
    ``windows.get(model, default_window_tokens)`` and ``styles.get(model, "openai")``
    (``windows``/``styles`` also override fake names). ``output_caps`` / ``default_output_cap_tokens``
    bound ``max_tokens`` (case 031; 16,384 like GPT-4o). ``tpm_limit`` (tokens per minute, case
    032) and ``max_body_bytes`` (case 019) are off by default. ``fail_next`` faults are consumed
    one per request by every path except ``GET /v1/models``.

    Streaming controls: ``chunk_delay_s`` between chunks; when ``stream_gate`` (anything with
    ``is_set()``, e.g. ``threading.Event``) is set, a stream sends ``stream_gate_after_chunks``
    chunks, sets ``first_chunk_sent`` and waits until the gate is set (at most
    ``stream_gate_timeout_s``).
    """

    requests: list[ReceivedRequest] = field(default_factory=list)
    script: deque[dict[str, Any]] = field(default_factory=deque)
    fail_next: list[Fault] = field(default_factory=list)
    responders: list[Responder] = field(default_factory=lambda: [DEFAULT_RESPONDERS[0], respond_read_tool, *DEFAULT_RESPONDERS[1:]])
    windows: dict[str, int] = field(default_factory=dict)
    styles: dict[str, str] = field(default_factory=dict)
    hidden_windows: set[str] = field(default_factory=set)
    default_window_tokens: int = DEFAULT_WINDOW_TOKENS
    output_caps: dict[str, int] = field(default_factory=dict)
    count_factors: dict[str, float] = field(default_factory=dict)
    """Per model: the provider counts ``ceil(factor x`` the tiktoken count``)`` (a Claude-like
    tokenizer, case 043), in its usage, its overflow errors and against its window."""
    default_output_cap_tokens: int | None = 16_384
    allow_developer: bool = False
    extra_roles: tuple[str, ...] = ()
    """Roles accepted besides system/user/assistant/tool (e.g. ``("ipython",)``, issue 15)."""
    reject_max_completion_tokens: bool = False
    reject_max_tokens: bool = False
    tpm_limit: int | None = None
    tpm_retry_after_s: int = 7
    max_body_bytes: int | None = None
    summary_substring: str = "summarize the conversation"
    summary_drop_substring: str | None = None
    """Lines containing this are left out of summaries (details only the archive keeps)."""
    read_tool_loop: bool = False
    """The model keeps calling the proxy's read tool whenever it is offered (bounded-rounds tests)."""
    read_tool_search: bool = True
    """The model searches with the read tool's ``query`` when offered (False: it only pages)."""
    chunk_delay_s: float = 0.0
    stream_gate: Any = None
    stream_gate_after_chunks: int = 1
    stream_gate_timeout_s: float = 10.0
    first_chunk_sent: threading.Event = field(default_factory=threading.Event)
    _counter: Any = field(default_factory=lambda: itertools.count(1), repr=False)

    def reset(self) -> None:
        """Forget all requests and restore every control to its default."""
        fresh = FakeState()
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(fresh, name))

    @property
    def chat_requests(self) -> list[ReceivedRequest]:
        """Requests to ``POST /v1/chat/completions``."""
        return [r for r in self.requests if r.path == CHAT_PATH]

    @property
    def summary_requests(self) -> list[ReceivedRequest]:
        """Chat requests recognised as summarization requests."""
        return [r for r in self.chat_requests if r.is_summary]

    @property
    def model_requests(self) -> list[ReceivedRequest]:
        """Chat requests that are not summarization requests."""
        return [r for r in self.chat_requests if not r.is_summary]

    def window_for(self, model: str) -> int:
        """Context window in tokens of ``model``."""
        if model in self.windows:
            return self.windows[model]
        parsed = parse_fake_model(model)
        return parsed[0] if parsed else self.default_window_tokens

    def style_name_for(self, model: str) -> str:
        """Overflow style name of ``model``."""
        if model in self.styles:
            return self.styles[model]
        parsed = parse_fake_model(model)
        return parsed[1] if parsed else "openai"

    def style_for(self, model: str) -> OverflowStyle:
        return style_for(self.style_name_for(model))

    def policy_for(self, model: str) -> ValidationPolicy:
        return ValidationPolicy(
            allow_developer=self.allow_developer,
            extra_roles=self.extra_roles,
            reject_max_completion_tokens=self.reject_max_completion_tokens,
            reject_max_tokens=self.reject_max_tokens,
            output_cap_tokens=self.output_caps.get(model, self.default_output_cap_tokens),
        )

    def pop_fault(self) -> Fault | None:
        return self.fail_next.pop(0) if self.fail_next else None

    def next_request_id(self) -> str:
        """A request id full of digits (``req_8a7f3c9e12345...``), unique per request."""
        return f"req_8a7f3c9e12345{next(self._counter):06d}"

    def record(self, **fields: Any) -> ReceivedRequest:
        request = ReceivedRequest(timestamp=time.time(), **fields)
        self.requests.append(request)
        return request
