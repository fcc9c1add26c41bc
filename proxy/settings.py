"""The one settings object. The only module that reads the environment.

Every field is settable by an environment variable ``CONTEXT_PROXY_<FIELD>`` (upper case) and,
for ``serve``, by the matching command-line option. Build it once at start and inject it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Runtime configuration of the proxy. Units are in the field names (``_s``, ``_tokens``, ...)."""

    # hide_input_in_errors: a bad value (a URL with credentials, a key) is never echoed in an error
    model_config = SettingsConfigDict(env_prefix="CONTEXT_PROXY_", extra="ignore", hide_input_in_errors=True)

    # --- serving ---
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, description="Port to bind.")
    upstream_url: str = Field("https://api.openai.com/v1", description="Base URL of the real provider (ends in /v1).")

    @field_validator("upstream_url")
    @classmethod
    def _upstream_url_valid(cls, value: str) -> str:
        """Normalised by ``proxy.upstream.urls.upstream_base``; its ``ValueError`` (no http/https,
        no host, user info, a query or a fragment) stops the start with a message naming the problem."""
        # imported here: the proxy's modules import settings, never the reverse at import time
        from proxy.upstream.urls import upstream_base

        return str(upstream_base(value))

    anthropic_upstream_url: str = Field(
        "https://api.anthropic.com",
        description="Base URL of the Anthropic Messages provider (no /v1: POST /v1/messages goes to this URL + "
        "/v1/messages, as the anthropic SDK and Claude Code build it).",
    )

    @field_validator("anthropic_upstream_url")
    @classmethod
    def _anthropic_upstream_url_valid(cls, value: str) -> str:
        """Normalised and checked as ``upstream_url`` is (``proxy.upstream.urls.upstream_base``); a URL
        ending in ``/v1`` is refused (the proxy appends ``/v1/messages``: it would send ``/v1/v1/...``)."""
        from proxy.upstream.urls import upstream_base

        base = str(upstream_base(value))
        if base.endswith("/v1"):
            raise ValueError("anthropic_upstream_url ends in /v1; give the base URL without it "
                             "(the proxy appends /v1/messages, as the anthropic SDK does)")
        return base

    database_url: str = Field(
        "sqlite:///./context-proxy.db",
        description="sqlite:///PATH or postgresql://USER:PASS@HOST/DB; the async driver is picked for you.",
    )
    log_level: str = Field("info", description="Log level of the proxy's JSON log lines.")
    log_message_content: bool = Field(False, description="Include message content in log lines (off: never logged).")

    # --- upstream client ---
    upstream_pool_size: int = Field(256, description="Maximum open connections to the upstream.")
    upstream_tenant_pool_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Share of upstream_pool_size one tenant may hold at once (a fraction; at least two connections, "
                    "or the whole pool if smaller: a request may hold a stream while its summary call needs another). "
        "A request that finds its share or the whole pool in use waits up to upstream_connect_timeout_s, then is "
        "answered 503 proxy_busy with retry-after.",
    )
    upstream_connect_timeout_s: float = Field(10.0, description="Seconds to open a connection to the upstream.")
    upstream_read_timeout_s: float = Field(
        600.0, description="Seconds to wait for the upstream between bytes (a stalled stream fails after this)."
    )
    max_body_bytes: int = Field(64 * 1024 * 1024, description="Largest request body accepted (413 above).")
    stream_log_max_bytes: int = Field(
        16 * 1024 * 1024,
        gt=0,
        description="Bytes of a streamed reply's event data reassembled for the log; past it the logged reply keeps "
        "what came before and is marked x_context_proxy.truncated (the client still gets every byte).",
    )
    max_held_body_bytes: int = Field(
        128 * 1024 * 1024,
        gt=0,
        description="Bytes of request bodies (as received) all requests of the process may hold at once, each until "
        "its response ends; a body that does not fit is refused with 503 proxy_busy and retry-after. The process's "
        "memory peaks at about 4-5 times this above its idle size (the body read, parsed, hashed, re-serialized and "
        "logged: measured with 60 MB bodies).",
    )
    database_pool_size: int = Field(
        10, description="Database connections per process (plus as many overflow); keep replicas x 2 x this under the "
                        "server's max_connections."
    )
    gc_young_threshold: int = Field(
        10_000,
        ge=0,
        description="Net allocations of container objects between two collections of Python's youngest "
        "garbage-collector generation, set for the whole process at start (Python's own default: 700; 0 leaves "
        "it). At 700 a collection ran every few requests and walked the objects of every request in flight: "
        "about 4% of a small chat request's instructions (callgrind, tests/benchmarks).",
    )
    max_pending_log_writes: int = Field(
        256,
        gt=0,
        description="Log writes (a request's messages, reply and record) that may wait for the database at once. "
        "Past it, new chat requests wait before they are read: when the database is slower than the traffic, "
        "memory stays bounded instead of holding an ever longer backlog (seen in a 200-stream load run).",
    )
    upstream_keepalive_s: float = Field(
        4.0, description="Seconds an idle upstream connection is kept for reuse (under common servers' 5 s keep-alive)."
    )
    database_failure_mode: Literal["closed", "open"] = Field(
        "closed",
        description="Database down while serving: 'closed' answers 503; 'open' forwards without logging or "
        "compaction (counted in metrics, warned in the x-context-proxy-warning header).",
    )

    # --- credentials ---
    upstream_api_key: str | None = Field(
        None, description="If set, the proxy sends this key upstream and accepts only client_api_keys."
    )
    anthropic_upstream_api_key: str | None = Field(
        None, description="If set, the proxy sends this key to the Anthropic upstream (as x-api-key) and accepts only "
        "client_api_keys, as upstream_api_key does for the OpenAI upstream.",
    )
    client_api_keys: str = Field(
        "", description="Comma-separated client keys accepted when upstream_api_key or anthropic_upstream_api_key "
        "is set."
    )
    admin_api_keys: str = Field("", description="Comma-separated keys that may read every tenant's sessions.")
    tenant_salt: str = Field(
        "context-proxy", description="Salt for the hash that identifies a tenant by its API key."
    )

    # --- model profiles and tokens ---
    models_file: str | None = Field(None, description="YAML/JSON file of model profiles overriding the built-in table.")
    tiktoken_cache_dir: str | None = Field(
        None, description="Directory of tiktoken's encoding files (sets TIKTOKEN_CACHE_DIR); never downloaded while "
                          "serving."
    )

    # --- defenses (DESIGN.md section 2; defaults are its numbers) ---
    compaction_enabled: bool = Field(True, description="Apply the defenses; off forwards every request as sent.")
    trigger_fraction: float = Field(0.85, description="Summarize when the prompt passes this share of the window.")
    keep_fraction: float = Field(0.10, description="Share of the window kept verbatim after a summary.")
    fallback_trigger_tokens: int = Field(170_000, description="Trigger for models without a profile.")
    fallback_keep_messages: int = Field(6, description="Messages kept for models without a profile.")
    truncate_args_max_chars: int = Field(2000, description="Old tool-call string arguments longer than this are "
                                                           "truncated.")
    truncate_args_keep_chars: int = Field(20, description="Characters of a truncated argument kept.")
    truncate_args_tools: str = Field(
        "write_file,edit_file,Write,Edit,MultiEdit",
        description="Comma-separated tools whose old arguments are truncated (Deep Agents' write_file and edit_file, "
        "Claude Code's Write, Edit and MultiEdit).")
    offload_tool_tokens: int = Field(20_000, description="Tool results over this many tokens are offloaded.")
    offload_user_tokens: int = Field(50_000, description="User messages over this many tokens are offloaded.")
    offload_window_fraction: float = Field(
        0.25, description="Also offload any single tool result over this share of the model's window."
    )
    preview_lines: int = Field(5, description="Lines kept at the head and at the tail of an offload preview.")
    preview_line_chars: int = Field(1000, description="Each preview line is cut at this many characters.")
    summary_model: str | None = Field(
        None, description="Model for chat summary calls (default: the request's model); Anthropic Messages requests "
        "are summarized by their own model.")
    summary_max_tokens: int = Field(2048, description="Token budget of a summary reply.")
    max_overflow_retries: int = Field(2, description="Retries after a context-overflow error.")
    learned_limit_ttl_s: float = Field(
        86_400.0,
        gt=0,
        description="Seconds a window learned from the provider (per tenant and model) is used; then it is learned "
        "again from the next overflow. List and reset them with `context-proxy limits`.",
    )
    patch_dangling_tool_calls: str = Field(
        "compacted",
        description="Synthetic answers for unanswered tool calls: 'compacted' (only in requests the proxy changed), "
                    "'always', 'never'.",
    )

    # --- operations (issue 6) ---
    log_format: str = Field("json", description="Log line format: 'json' (one JSON object per line) or 'text'.")
    shutdown_grace_s: float = Field(
        30.0, description="On SIGTERM, seconds in-flight requests and streams get to finish before they are cancelled."
    )
    http_keep_alive_s: float = Field(
        75.0,
        gt=0,
        description="Seconds an idle client connection is kept open. Longer than clients' own pool expiry (httpx, the "
        "openai SDK: 5 s) so the client always closes first: when both are 5 s, a request sent on a connection as the "
        "server closes it fails with a ReadError (seen under load). 75 s is nginx's default.",
    )
    http_max_connections: int = Field(
        1024,
        gt=0,
        description="Open client connections at most (lowered at start to fit the file-descriptor limit). Past it a "
        "new connection closes the one that has waited longest without a request in progress; when every one has a "
        "request in progress, the new one is answered 503 (retry-after: 1).",
    )
    http_max_header_bytes: int = Field(
        64 * 1024, gt=0, description="Bytes of a request's request line and header fields at most (431 above)."
    )
    http_max_headers: int = Field(100, gt=0, description="Header fields of a request at most (431 above).")
    http_header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Seconds a request's headers may take to arrive, from the connection (or a kept-alive "
        "connection's next first byte); then 408 and the connection is closed.",
    )
    http_body_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Seconds a request's body may take to arrive after its headers; then 408 and the connection is "
                    "closed.",
    )

    # --- the proxy's own tools (issue 4) ---
    read_tool_enabled: bool = Field(True, description="Offer the read tool when a forwarded request carries a stub or "
                                                      "summary.")
    read_tool_name: str = Field("context_proxy_read", description="Name of the proxy's read tool.")
    read_tool_max_rounds: int = Field(
        8, ge=1, le=64, description="Rounds of read-tool calls the proxy serves per request at most (a backstop to "
                                    "the token budget)."
    )
    read_tool_budget_fraction: float = Field(
        0.25, gt=0, le=0.9, description="Tokens the read tool's results may add to one request, as a fraction of the "
                                        "model's "
        "context window (all rounds together); a result that would not fit is cut, saying how to continue."
    )
    read_tool_scope: Literal["session", "tenant"] = Field(
        "session", description="What the read tool serves: 'session' (the current session's artifacts and archive) or "
        "'tenant' (any artifact of the tenant that the conversation names)."
    )
    read_api_max_concurrent_searches: int = Field(
        2, ge=1, le=64, description="Searches of the read API (GET /sessions/{id}/archive/search, "
        "/artifacts/{id}/search) run at once per process at most; up to 4 more per slot wait their turn, and past "
        "that a search is a 503 proxy_busy (so searches never take the worker threads that forwarding needs)."
    )
    compact_tool_enabled: bool = Field(
        False, description="Offer the manual compaction tool (also per request: header X-Context-Proxy-Compact-Tool: "
                           "on)."
    )
    compact_tool_name: str = Field("context_proxy_compact", description="Name of the proxy's manual compaction tool.")

    # --- retention (issue 5; applied by `context-proxy retention`) ---
    retention_max_age_days: float | None = Field(
        None, description="Sessions not updated for this many days are deleted by the retention command (unset: kept)."
    )
    retention_max_bytes_per_tenant: int | None = Field(
        None, description="Past this many stored bytes, a tenant's least recently updated sessions are deleted "
                          "(unset: no cap)."
    )
    retention_batch_size: int = Field(500, description="Rows deleted per retention transaction (a session is never "
                                                       "split).")
