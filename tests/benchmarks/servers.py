"""The servers of the overhead benchmark, each run in a process of its own, pinned to one core.

    python -m tests.benchmarks.servers KIND --cpu N [--upstream URL] [--workdir DIR]

prints ``PORT <n>`` on stdout once its socket is bound (127.0.0.1, port 0), then serves until
SIGTERM. ``KIND``:

- ``upstream``: ``UpstreamProtocol``, a raw HTTP/1.1 server (asyncio protocol, no ASGI server)
  answering every request with one fixed chat completion, or a fixed SSE stream (one chunk an
  event) when the body asks for ``"stream":true`` (``POST /v1/messages``: one fixed Anthropic
  Message, or its event stream); it shares its core with the load generator,
  so it must cost far less than any candidate (an ASGI app under uvicorn cost 0.07 ms a request);
- ``floor``: ``Relay``, a raw ASGI app relaying request and response bytes to ``--upstream`` with
  one shared ``aiohttp.ClientSession``; parses nothing (the least a Python proxy can do);
- ``proxy``: ``proxy.app.create_app`` with real settings (session log on SQLite in ``--workdir``,
  compaction on), on its default aiohttp transport: the app alone, for profiling (the overhead
  section serves the proxy as ``python -m proxy.cli serve``, see ``candidates.SERVED``);
- ``proxy-httpx``: the same on httpx's own ``AsyncHTTPTransport`` (the transport issue 2 rejected);
- (the other peers are not served here: each runs as its own command line, ``peers.command``);
- ``litellm``: LiteLLM's proxy app (``litellm.proxy.proxy_server.app``, optional: run with a Python
  that has ``litellm[proxy]``), one model routed to ``--upstream``, no master key, no database.

The others run under uvicorn with the same options as ``context-proxy serve`` (no access log; uvloop and
httptools when installed, as ``uvicorn[standard]`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import Any

import orjson

REPLY_CONTENT = "The quick brown fox jumps over the lazy dog. " * 4
COMPLETION = orjson.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": "bench-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY_CONTENT}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 120, "completion_tokens": 40, "total_tokens": 160},
})
MESSAGE = orjson.dumps({
    "id": "msg_bench", "type": "message", "role": "assistant", "model": "bench-model",
    "content": [{"type": "text", "text": REPLY_CONTENT}], "stop_reason": "end_turn", "stop_sequence": None,
    "usage": {"input_tokens": 120, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 40},
})
"""The fixed Anthropic Message answered to ``POST /v1/messages`` (the Messages rows)."""
STREAM_EVENTS = 20
"""Events of the fixed SSE stream (one word each, then a finish chunk, a usage chunk and [DONE])."""


def _sse() -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
        body: dict[str, Any] = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000,
                                "model": "bench-model", "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage:
            body["usage"] = usage
        return b"data: " + orjson.dumps(body) + b"\n\n"

    words = REPLY_CONTENT.split()[:STREAM_EVENTS - 1]
    parts = [chunk({"role": "assistant", "content": ""})] + [chunk({"content": w + " "}) for w in words]
    parts += [chunk({}, "stop"), chunk({}, usage={"prompt_tokens": 120, "completion_tokens": 40, "total_tokens": 160}),
              b"data: [DONE]\n\n"]
    return b"".join(parts)


def _messages_sse() -> list[bytes]:
    """Anthropic's event sequence for ``MESSAGE`` (message_start, a text block of ``STREAM_EVENTS``
    deltas, message_delta, message_stop), one event a part."""
    def event(name: str, data: dict[str, Any]) -> bytes:
        return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    usage = {"input_tokens": 120, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1}
    start = {"id": "msg_bench", "type": "message", "role": "assistant", "model": "bench-model", "content": [],
             "stop_reason": None, "stop_sequence": None, "usage": usage}
    words = REPLY_CONTENT.split()[:STREAM_EVENTS - 1]
    parts = [event("message_start", {"type": "message_start", "message": start}),
             event("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}})]
    parts += [event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": w + " "}}) for w in words]
    parts += [event("content_block_stop", {"type": "content_block_stop", "index": 0}),
              event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                      "usage": {"output_tokens": 40}}),
              event("message_stop", {"type": "message_stop"})]
    return parts


SSE_BODY = _sse()
SSE_PARTS = [p + b"\n\n" for p in SSE_BODY.split(b"\n\n") if p]


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


_JSON_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
              + str(len(COMPLETION)).encode() + b"\r\n\r\n")
_SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
_SSE_CHUNKS = [f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in SSE_PARTS] + [b"0\r\n\r\n"]
_MESSAGE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                 + str(len(MESSAGE)).encode() + b"\r\n\r\n")
_MESSAGES_SSE_CHUNKS = [f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in _messages_sse()] + [b"0\r\n\r\n"]


class UpstreamProtocol(asyncio.Protocol):
    """The fake upstream, one instance a connection: reads requests with a ``Content-Length``
    body (what the candidates and the load generator send), answers ``COMPLETION`` or, when the
    body says ``"stream":true``, the SSE events of ``SSE_PARTS`` as one write (one chunk) each."""

    def __init__(self) -> None:
        self.buf = b""
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            at, size = head.find(b"\r\ncontent-length:"), 0
            if at >= 0:
                eol = head.find(b"\r\n", at + 2)
                size = int(head[at + 17:eol if eol >= 0 else len(head)])
            if len(self.buf) < end + 4 + size:
                return
            body, self.buf = self.buf[end + 4:end + 4 + size], self.buf[end + 4 + size:]
            messages = head.startswith(b"post /v1/messages")  # Anthropic's Messages API (the Messages rows)
            if b'"stream":true' in body:
                self.transport.write(_SSE_HEAD)
                for chunk in _MESSAGES_SSE_CHUNKS if messages else _SSE_CHUNKS:
                    self.transport.write(chunk)
            else:
                self.transport.write(_MESSAGE_HEAD + MESSAGE if messages else _JSON_HEAD + COMPLETION)


class Relay:
    """The floor: relays bytes to ``upstream_url`` + path with aiohttp's client, parsing nothing."""

    def __init__(self, upstream_url: str) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self.session: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        import aiohttp

        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256), auto_decompress=False)
        body = await _read_body(receive)
        headers = {"content-type": "application/json", "authorization": "Bearer bench"}
        async with self.session.request(scope["method"], self.upstream_url + scope["path"].removeprefix("/v1"),
                                        data=body, headers=headers) as resp:
            out = [(b"content-type", resp.headers.get("content-type", "application/json").encode())]
            await send({"type": "http.response.start", "status": resp.status, "headers": out})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})


BENCH_CLIENT_KEY = "sk-bench-client-0123456789"
"""The bearer key the load generator sends (LiteLLM's proxy checks it as its master key)."""


def litellm_app(upstream_url: str, workdir: Path) -> Any:
    """LiteLLM's proxy with a config (JSON is YAML) routing ``bench-model`` to ``upstream_url``; the
    model cost map is the packaged one (no network) and its logging at errors only."""
    config = {"model_list": [{"model_name": "bench-model", "litellm_params": {
        "model": "openai/bench-model", "api_base": upstream_url, "api_key": "sk-bench-upstream"}}],
        "litellm_settings": {"drop_params": True, "set_verbose": False}}
    path = workdir / "litellm-config.yaml"
    path.write_bytes(orjson.dumps(config))
    os.environ.update({"CONFIG_FILE_PATH": str(path), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
                       "LITELLM_MASTER_KEY": BENCH_CLIENT_KEY})  # the key the load generator sends
    from litellm.proxy.proxy_server import app

    return app


def build_app(kind: str, upstream_url: str | None, workdir: Path) -> Any:
    """The ASGI app of ``kind`` (see the module docstring)."""
    assert upstream_url, f"{kind} needs --upstream"
    if kind == "floor":
        return Relay(upstream_url)
    if kind == "litellm":
        return litellm_app(upstream_url, workdir)
    import httpx

    from proxy.app import create_app
    from proxy.settings import Settings
    from proxy.telemetry.logs import configure_logging

    settings = Settings(upstream_url=upstream_url, database_url=f"sqlite:///{workdir / (kind + '.db')}",
                        tiktoken_cache_dir=os.environ.get("TIKTOKEN_CACHE_DIR"))
    configure_logging(settings.log_level, settings.log_format, log_message_content=settings.log_message_content)
    transport = None
    if kind == "proxy-httpx":
        limits = httpx.Limits(max_connections=settings.upstream_pool_size, max_keepalive_connections=settings.upstream_pool_size)
        transport = httpx.AsyncHTTPTransport(limits=limits)
    return create_app(settings, upstream_transport=transport)


def _listen() -> socket.socket:
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only when the
    # listening socket says TCP; with proto 0 Nagle + delayed ACKs add ~40 ms per response.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)  # connections queue from now on, before the server serves them
    return sock


def serve_upstream() -> None:
    """Serve ``UpstreamProtocol`` (on uvloop when installed) until SIGTERM."""
    import signal

    sock = _listen()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(UpstreamProtocol, sock=sock)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        print(f"PORT {sock.getsockname()[1]}", flush=True)
        await stop.wait()
        server.close()

    try:
        import uvloop
    except ImportError:
        asyncio.run(serve())
    else:
        uvloop.run(serve())


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["upstream", "floor", "proxy", "proxy-httpx", "litellm"])
    parser.add_argument("--cpu", type=int, default=None)
    parser.add_argument("--upstream", default=None)
    parser.add_argument("--workdir", default=".")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.kind == "upstream":
        serve_upstream()
        return
    sock = _listen()
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    os.dup2(2, 1)  # anything printed later (LiteLLM's banner) goes to the log, not to a pipe nobody reads
    app = build_app(args.kind, args.upstream, Path(args.workdir))
    config = uvicorn.Config(app, log_level="warning", access_log=False, log_config=None, ws="none",
                            timeout_graceful_shutdown=1, backlog=2048, timeout_keep_alive=75)
    if args.kind.startswith("proxy"):  # as ``context-proxy serve``: gc tuned once the app started
        from proxy.server.process import ProxyServer
        from proxy.settings import Settings

        server: uvicorn.Server = ProxyServer(config, gc_young_threshold=Settings.model_fields["gc_young_threshold"].default)
    else:
        server = uvicorn.Server(config)
    server.run(sockets=[sock])  # on uvloop when installed, as ``context-proxy serve`` (uvicorn's loop="auto")
    sys.exit(0)


if __name__ == "__main__":
    main()
