"""Structured logs: one JSON object per line, with the request and session ids of the current request.

Fields of every line: ``ts`` (UTC, ISO 8601, milliseconds), ``level``, ``logger``, ``msg``; then
``request_id`` and ``session_id`` when a request is being served (``bind`` sets them), then the
``extra={...}`` fields of the call, then ``exc`` (the traceback) when there is one.

Two rules hold whatever the caller passes:

- never a key: extra fields whose name says credential (``authorization``, ``api_key``, ...) are
  dropped, and anything shaped like a bearer token or an ``sk-`` key is masked in every string;
- never message content unless ``Settings.log_message_content``: extra fields named like content
  (``content``, ``messages``, ``body``, ...) are replaced by their length in characters.

The request context is a ``ContextVar`` holding one mutable dict per request, created by
``request_context()`` (the metrics middleware opens it around every HTTP request). Tasks spawned
while serving copy the context, so they share the dict: ``bind`` in the pipeline is visible to
the middleware's access line and to the log lines of background tasks of the same request.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

CONTEXT_FIELDS = ("request_id", "session_id")
"""Request context fields written on every line when present (in this order)."""
SECRET_FIELDS = frozenset({"authorization", "api_key", "key", "token", "password", "secret", "upstream_api_key"})
"""Extra field names that are never written."""
CONTENT_FIELDS = frozenset({"content", "messages", "message", "body", "prompt", "reply", "arguments", "text"})
"""Extra field names written only when ``log_message_content`` is on (else their length in chars)."""
_SECRET_PATTERN = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}|\bsk-[A-Za-z0-9_-]{8,}")
_RESERVED = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime", "taskName"}

_context: ContextVar[dict[str, str] | None] = ContextVar("context_proxy_request", default=None)


@contextmanager
def request_context() -> Iterator[dict[str, str]]:
    """Open a fresh request context (a dict shared with the tasks the request spawns)."""
    fields: dict[str, str] = {}
    token = _context.set(fields)
    try:
        yield fields
    finally:
        _context.reset(token)


def bind(**fields: Any) -> None:
    """Add ``fields`` (e.g. ``request_id=..., session_id=..., model=...``) to the current request
    context; does nothing outside a request. ``None`` values are skipped."""
    current = _context.get()
    if current is not None:
        current.update({k: str(v) for k, v in fields.items() if v is not None})


def current_context() -> dict[str, str]:
    """A copy of the current request context (empty outside a request)."""
    current = _context.get()
    return dict(current) if current else {}


def mask_secrets(text: str) -> str:
    """``text`` with bearer tokens and ``sk-`` keys replaced by ``***``."""
    return _SECRET_PATTERN.sub(lambda m: (m.group(1) or "") + "***", text)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line (see the module docstring for the fields and rules)."""

    def __init__(self, *, log_message_content: bool = False) -> None:
        super().__init__()
        self.log_message_content = log_message_content

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": mask_secrets(record.getMessage()),
        }
        context = current_context()
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None) or context.get(name)
            if value:
                out[name] = str(value)
        for name, value in vars(record).items():
            if name in _RESERVED or name in out or name.startswith("_"):
                continue
            if name.lower() in SECRET_FIELDS:
                continue
            if name.lower() in CONTENT_FIELDS and not self.log_message_content:
                out[name + "_chars"] = len(value) if isinstance(value, (str, list, bytes)) else None
                continue
            out[name] = mask_secrets(value) if isinstance(value, str) else value
        if record.exc_info:
            out["exc"] = mask_secrets(self.formatException(record.exc_info))
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """Human-readable lines (``--log-format text``), same masking of keys."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        context = current_context()
        line = super().format(record)
        ids = " ".join(f"{k}={context[k]}" for k in CONTEXT_FIELDS if context.get(k))
        return mask_secrets(f"{line} [{ids}]" if ids else line)


def configure_logging(
    level: str = "info", fmt: str = "json", *, log_message_content: bool = False, stream: TextIO | None = None
) -> logging.Handler:
    """Send every log record (ours, uvicorn's, libraries') to ``stream`` (default stderr) in
    ``fmt`` (``json`` or ``text``) at ``level``; replaces the root logger's handlers.

    Returns the installed handler (tests remove it). Raises ``ValueError`` for an unknown format
    or level. Call once per process (``context-proxy serve`` does), never at import time.
    """
    if fmt not in ("json", "text"):
        raise ValueError(f"unknown log format {fmt!r} (json or text)")
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(log_message_content=log_message_content) if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    # httpx logs every upstream request at INFO, a second line per request beside our access log
    # (and a measurable share of a small request's CPU): keep its warnings, and all at debug
    logging.getLogger("httpx").setLevel(numeric if numeric <= logging.DEBUG else max(numeric, logging.WARNING))
    return handler
