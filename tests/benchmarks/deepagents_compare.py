"""The shared traces through Deep Agents' own summarization middleware (issue 7, item 5), so the
proxy's compression sits next to the design's reference implementation.

    python -m tests.benchmarks.deepagents_compare < '{"traces": [path, ...], "windows": [16384, ...]}'

prints one JSON object ``{"version", "rows": [...]}``. It runs with a Python that has
``deepagents`` (optional: ``compression.deepagents_python`` finds one; it is never installed by
the benchmark, whose environment stays as the tests have it).

Each trace is replayed request by request, as an agent would send it, through
``deepagents.middleware.summarization.create_summarization_middleware`` (its model-aware defaults:
the thresholds come from the model profile's ``max_input_tokens``, set to the window; history
offloaded to a ``FilesystemBackend`` in a temporary folder). The model is scripted:
``wrap_model_call``'s handler records the messages the model would get and answers "ok"; the
summarizer is the same deterministic one as the proxy's fake provider
(``tests.fakes.responders.summary_text``: a structured summary keeping ``FACT:`` lines), so both
sides' summaries weigh the same. The middleware's state update (its summarization event) is
carried to the next request, as the agent's graph would. Tokens are counted with
``tests.fakes.tokens`` like the proxy's rows. A forwarded prompt over the window counts as an
overflow (no provider enforces it here).

Each trace runs twice: with the middleware's own token counter (``counter: "default"``, LangChain's
``count_tokens_approximately``, what a Deep Agents user gets) and with the proxy's counter
(``counter: "proxy"``, ``tests.fakes.tokens`` as above), so a difference in when each side
summarizes is not a difference in counting. On the shared traces the approximate count is the lower
(about 4 characters a token): the default middleware summarizes later and forwards some prompts
over the window.
"""

from __future__ import annotations

import itertools
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

import orjson

from tests.benchmarks.traces import load_trace, prefix_share, request_points
from tests.fakes.responders import build_prompt, summary_text
from tests.fakes.tokens import TOKENS_PER_REPLY, count_message_tokens

SUMMARY_SUBSTRING = "summarize the conversation"
"""What the fake provider's summarizer looks for to name the session intent (``FakeState``)."""


def _tokens(messages: list[dict[str, Any]]) -> int:
    return TOKENS_PER_REPLY + sum(count_message_tokens(m) for m in messages)


def replay(path: Path, window: int, counter: str = "default") -> dict[str, Any]:
    """One trace at one window through the middleware; a row like ``compression.replay``'s.
    ``counter``: ``default`` (the middleware's own) or ``proxy`` (the counter of the rows)."""
    from deepagents.backends import FilesystemBackend
    from deepagents.middleware.summarization import create_summarization_middleware
    from langchain.agents.middleware.types import ModelRequest, ModelResponse
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import (
        AIMessage,
        convert_to_messages,
        convert_to_openai_messages,
    )

    trace = load_trace(path)
    summaries: list[int] = []

    def summarizer(messages: Any) -> str:
        plain = convert_to_openai_messages(messages)
        summaries.append(_tokens(plain))
        return summary_text(build_prompt({"messages": plain}, SUMMARY_SUBSTRING), SUMMARY_SUBSTRING)

    model = GenericFakeChatModel(messages=iter([]), profile={"max_input_tokens": window})
    state: dict[str, Any] = {}
    client: list[int] = []
    forwarded: list[int] = []
    bodies: list[bytes] = []
    with tempfile.TemporaryDirectory(prefix="bench-deepagents-") as tmp:
        options: dict[str, Any] = {}
        if counter == "proxy":
            options["token_counter"] = lambda messages, **_: _tokens(convert_to_openai_messages(messages))
        middleware = create_summarization_middleware(model, FilesystemBackend(root_dir=tmp, virtual_mode=True),
                                                     summarizer=summarizer, **options)
        for i in request_points(trace):
            messages = convert_to_messages(trace[:i])
            seen: dict[str, Any] = {}

            def handler(request: Any, seen: dict[str, Any] = seen) -> Any:
                seen["messages"] = request.messages
                return ModelResponse(result=[AIMessage(content="ok")])

            request = ModelRequest(model=model, messages=messages, system_message=None, tools=[],
                                   state={"messages": messages, **state}, runtime=None)
            out = middleware.wrap_model_call(request, handler)
            command = getattr(out, "command", None)
            if command is not None and command.update:
                state.update({k: v for k, v in command.update.items() if k != "messages"})
            sent = convert_to_openai_messages(seen["messages"])
            client.append(_tokens(trace[:i]))
            forwarded.append(_tokens(sent))
            bodies.append(orjson.dumps(sent))
    shares = [prefix_share(a, b) for a, b in itertools.pairwise(bodies)]
    passthrough, fwd, summary_tokens = sum(client), sum(forwarded), sum(summaries)
    return {
        "trace": path.stem, "window": window, "counter": counter, "turns": len(client),
        "passthrough_tokens": passthrough, "forwarded_tokens": fwd,
        "forwarded_ratio": fwd / passthrough if passthrough else None,
        "summary_calls": len(summaries), "summary_prompt_tokens": summary_tokens,
        "upstream_total_ratio": (fwd + summary_tokens) / passthrough if passthrough else None,
        "overflows_without": sum(t > window for t in client),
        "overflows_with": sum(t > window for t in forwarded),
        "prefix_stability": sum(shares) / len(shares) if shares else None,
        "per_turn_forwarded": forwarded,
    }


def main() -> None:
    job = orjson.loads(sys.stdin.buffer.read())
    rows = [replay(Path(p), w, c) for c in job.get("counters", ["default", "proxy"]) for p in job["traces"]
            for w in job["windows"]]
    sys.stdout.write(orjson.dumps({"version": version("deepagents"), "rows": rows}).decode())


if __name__ == "__main__":
    main()
