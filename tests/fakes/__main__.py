"""``python -m tests.fakes [--host H] [--port P]``: the strict fake providers as one local server.

To try the proxy without a provider key (or offline): OpenAI's chat completions (and the rest of
``tests.fakes.upstream``'s routes) under ``/v1``, Anthropic's Messages API at ``/v1/messages`` and
``/v1/messages/count_tokens``, each the same strict fake the tests use, answering every request
(its default replies; overflow errors when a request passes the model's window, as the providers
send them). Point the proxy at it::

    python -m tests.fakes --port 9000 &
    context-proxy serve --upstream-url http://127.0.0.1:9000/v1 --anthropic-upstream-url http://127.0.0.1:9000

It prints ``PORT <n>`` first (``--port 0``, the default: a free port), then the two base URLs.
What it received is kept for the last ``KEEP_REQUESTS`` requests of each fake (the tests' fakes keep
all; a server left running must not grow without bound).
"""

from __future__ import annotations

import argparse
import socket
import sys
from typing import Any

import uvicorn

from tests.fakes.anthropic import create_fake_anthropic
from tests.fakes.upstream import create_fake_upstream

KEEP_REQUESTS = 1000
"""Received requests kept per fake (the oldest are forgotten)."""
ANTHROPIC_PATHS = ("/v1/messages",)
"""Path prefixes answered by the Anthropic fake; everything else by the OpenAI one."""


class FakeProviders:
    """One ASGI app: ``/v1/messages…`` to the Anthropic fake, the rest to the OpenAI fake."""

    def __init__(self) -> None:
        self.openai, self.openai_state = create_fake_upstream()
        self.anthropic, self.anthropic_state = create_fake_anthropic()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.openai(scope, receive, send)  # answers startup and shutdown
            return
        anthropic = scope.get("path", "").startswith(ANTHROPIC_PATHS)
        await (self.anthropic if anthropic else self.openai)(scope, receive, send)
        state = self.anthropic_state if anthropic else self.openai_state
        if len(state.requests) > KEEP_REQUESTS:
            del state.requests[:-KEEP_REQUESTS]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fakes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    args = parser.parse_args(argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    print(f"PORT {port}", flush=True)
    print(f"OpenAI (--upstream-url): http://{args.host}:{port}/v1", flush=True)
    print(f"Anthropic (--anthropic-upstream-url): http://{args.host}:{port}", flush=True)
    config = uvicorn.Config(FakeProviders(), log_level="warning", ws="none", lifespan="auto")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main(sys.argv[1:])
