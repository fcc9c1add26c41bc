"""The guarded HTTP server (``proxy.server.http_guard.server_options``, what ``context-proxy serve`` runs)
with the official openai SDK as the client: a streamed chat, a non-streamed chat with a ~5 MB body
and ``models.list`` passed through, against the fake upstream. The guards (header and body
bounds, deadlines, the connection cap, the body budget) must not get in a real client's way."""

from __future__ import annotations

import openai

from proxy.app import create_app
from proxy.server.http_guard import server_options
from proxy.settings import Settings
from tests.conftest import SHARED_DIR
from tests.e2e.conftest import Upstream
from tests.fakes.server import UvicornServer


def test_the_openai_sdk_through_the_guarded_server(upstream: Upstream, sqlite_database_url: str) -> None:
    # small bounds around what the SDK sends: 8 KiB of headers, a 10 MiB budget for the 5 MB body
    settings = Settings(upstream_url=upstream.url, database_url=sqlite_database_url, tiktoken_cache_dir=str(SHARED_DIR / "tiktoken"),
                        http_max_header_bytes=8 * 1024, http_max_headers=40, http_max_connections=8,
                        max_held_body_bytes=10 * 1024 * 1024, max_body_bytes=8 * 1024 * 1024)
    with UvicornServer(create_app(settings), **server_options(settings)) as server, openai.OpenAI(
        base_url=server.url + "/v1", api_key="sk-test-sdk-guard-0123456789", max_retries=0, timeout=60,
    ) as client:
        upstream.state.script.append({"role": "assistant", "content": "streamed through the guard"})
        stream = client.chat.completions.create(model="gpt-4o", stream=True,
                                                messages=[{"role": "user", "content": "stream please"}])
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert text == "streamed through the guard"

        big = "lorem ipsum " * (5_000_000 // 12)  # a ~5 MB body
        upstream.state.script.append({"role": "assistant", "content": "read it all"})
        done = client.chat.completions.create(model="fake-2000000-openai", messages=[{"role": "user", "content": big}])
        assert done.choices[0].message.content == "read it all"
        # read whole through the guards (the proxy then offloads the oversized message upstream)
        assert b"[context-proxy]" in upstream.state.chat_requests[-1].body

        models = client.models.list()
        assert [m.id for m in models.data]  # passed through from the fake's /v1/models
