"""Structured logs: one JSON object per line, with the request and session ids of the current request.

Fields of every line: ``ts`` (UTC, ISO 8601, milliseconds), ``level``, ``logger``, ``msg``; then
``request_id`` and ``session_id`` when a request is being served (``bind`` sets them), then the
``extra={...}`` fields of the call, then ``exc`` (the traceback) when there is one.

Two rules hold whatever the caller passes:

- never a key: extra fields whose name says credential (``authorization``, ``api_key``, ...) are
  dropped, and anything shaped like a bearer token or an ``sk-`` key is masked in every string;
- never message content unless ``Settings.log_message_content``: extra fields named like content
  (``content``, ``messages``, ``body``, ...) are replaced by their length in characters, and a
  traceback shows no database error's text (``DB_ERROR_MODULES``: a driver's message may quote
  the values it failed on, ``Key (id)=(...)``, ``invalid input ... $3: <value>``): its class only.

The request context is a ``ContextVar`` holding one mutable dict per request, created by
``request_context()`` (the metrics middleware opens it around every HTTP request). Tasks spawned
while serving copy the context, so they share the dict: ``bind`` in the pipeline is visible to
the middleware's access line and to the log lines of background tasks of the same request.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any, TextIO

import orjson

CONTEXT_FIELDS = ("request_id", "session_id")
"""Request context fields written on every line when present (in this order)."""
SECRET_FIELDS = frozenset({"authorization", "api_key", "key", "token", "password", "secret", "upstream_api_key",
                           "anthropic_upstream_api_key", "x-api-key", "x_api_key"})
"""Extra field names that are never written."""
CONTENT_FIELDS = frozenset({"content", "messages", "message", "body", "prompt", "reply", "arguments", "text"})
"""Extra field names written only when ``log_message_content`` is on (else their length in chars)."""
_SECRET_PATTERN = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}|\bsk-[A-Za-z0-9_-]{8,}")
_RESERVED = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime", "taskName"}
DB_ERROR_MODULES = frozenset({"sqlalchemy", "asyncpg", "sqlite3", "aiosqlite", "psycopg", "psycopg2", "alembic"})
"""Top-level packages whose exceptions' text is withheld from tracebacks unless content logging is on."""
WITHHELD = "(text withheld: a database error may quote the values it failed on; log_message_content shows it)"


def format_exception(exc_info: Any, *, log_message_content: bool) -> str:
    """The traceback of ``exc_info`` (a ``sys.exc_info()`` tuple or an exception) as ``logging``
    writes it, causes, contexts and an exception group's members included; unless
    ``log_message_content``, each exception of a ``DB_ERROR_MODULES`` package is written as its
    class, without its text."""
    exc = exc_info[1] if isinstance(exc_info, tuple) else exc_info
    if not isinstance(exc, BaseException):
        return ""
    te = traceback.TracebackException.from_exception(exc, capture_locals=False)
    if not log_message_content:
        seen: set[int] = set()
        stack: list[traceback.TracebackException] = [te]
        while stack:
            current = stack.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            module = (current.exc_type_module if hasattr(current, "exc_type_module")
                      else getattr(current.exc_type, "__module__", "")) or ""
            if module.split(".", 1)[0] in DB_ERROR_MODULES:
                current._str = WITHHELD  # type: ignore[attr-defined]  # the text ``format`` writes after the class name
                current.__notes__ = None
            stack.extend(t for t in (current.__cause__, current.__context__) if t is not None)
            stack.extend(getattr(current, "exceptions", None) or ())  # an ExceptionGroup's members
    return "".join(te.format()).rstrip("\n")

_context: ContextVar[dict[str, str] | None] = ContextVar("context_proxy_request", default=None)


@contextmanager
def request_context() -> Iterator[dict[str, str]]:
    """Open a fresh request context (a dict shared with the tasks the request spawns)."""
    fields, token = open_request_context()
    try:
        yield fields
    finally:
        close_request_context(token)


def open_request_context() -> tuple[dict[str, str], Token[dict[str, str] | None]]:
    """``request_context`` without a context manager, for the chat route's hot path: the fields
    and the token to give ``close_request_context`` (in a ``finally``)."""
    fields: dict[str, str] = {}
    return fields, _context.set(fields)


def close_request_context(token: Token[dict[str, str] | None]) -> None:
    _context.reset(token)


def bind_request(request_id: object, session_id: object, model: object) -> None:
    """Add the request's ``request_id``, ``session_id`` and ``model`` to the current request
    context (as text), in that order; ``None`` values are skipped; does nothing outside a request.
    The pipelines' call, once a request, by position (with keywords, a dict and a loop: 760 -> 340
    ns, timeit)."""
    current = _context.get()
    if current is not None:
        if request_id is not None:
            current["request_id"] = request_id if type(request_id) is str else str(request_id)
        if session_id is not None:
            current["session_id"] = session_id if type(session_id) is str else str(session_id)
        if model is not None:
            current["model"] = model if type(model) is str else str(model)


def current_context() -> dict[str, str]:
    """A copy of the current request context (empty outside a request)."""
    current = _context.get()
    return dict(current) if current else {}


def mask_secrets(text: str) -> str:
    """``text`` with bearer tokens and ``sk-`` keys replaced by ``***``.

    ASCII text with neither ``bearer`` nor ``sk-`` in it (any case) is returned without running the
    pattern: it cannot match, and most lines are such (the regex was about 1% of a small chat
    request's instructions, callgrind). Other text, non-ASCII included (under ``IGNORECASE``
    the pattern's ``s`` and ``k`` also match ``ſ`` and the Kelvin sign), goes through it."""
    if text.isascii():
        low = text.lower()
        if "bearer" not in low and "sk-" not in low:
            return text
    return _SECRET_PATTERN.sub(_masked, text)


def _masked(match: re.Match[str]) -> str:
    return (match.group(1) or "") + "***"


_LEVELS = {name: name.lower() for name in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")}
_MILLIS = tuple(".%03dZ" % millis for millis in range(1000))  # noqa: UP031
"""A timestamp's end for each whole millisecond, ``.000Z`` to ``.999Z`` (``JsonFormatter._timestamp``)."""
_PLAIN, _SKIP, _CONTENT = "plain", "skip", "content"
FIELD_KINDS_KEPT = 1024
"""Extra field names a ``JsonFormatter`` remembers the kind of (names are the code's own, few;
emptied whole when full)."""
ACCESS_TEXTS_KEPT = 1024
"""Access lines' (message, route) pairs whose masked text a ``JsonFormatter`` remembers
(``JsonFormatter.access_line``; pairs of at most ``ACCESS_TEXT_CHARS`` characters; emptied whole
when full)."""
ACCESS_TEXT_CHARS = 256
"""A longer access-line message or route (a client's odd method) is masked each time, never kept."""


def _field_kind(field: str) -> str:
    """``_SKIP`` (private, or a credential), ``_CONTENT`` (message content) or ``_PLAIN``."""
    low = field.lower()
    return _SKIP if field.startswith("_") or low in SECRET_FIELDS else _CONTENT if low in CONTENT_FIELDS else _PLAIN


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line (see the module docstring for the fields and rules)."""

    def __init__(self, *, log_message_content: bool = False) -> None:
        super().__init__()
        self.log_message_content = log_message_content
        self._second: tuple[int, str] = (-1, "")  # the whole second of the last line, and its text
        self._field_kinds: dict[str, str] = {}
        """Extra field name -> ``_field_kind`` (at most ``FIELD_KINDS_KEPT``)."""
        self._access_texts: dict[tuple[str, str], tuple[str, str]] = {}
        """(msg, route) -> (``mask_secrets(msg)``, ``mask_secrets(route)``) (``access_line``; at most
        ``ACCESS_TEXTS_KEPT``)."""

    def _timestamp(self, created: float) -> str:
        """``created`` (epoch seconds) as ``2026-11-29T21:36:32.123Z`` (milliseconds truncated);
        the text of the second is formatted once per second (there is a line a request)."""
        second = int(created)
        cached = self._second  # one tuple, swapped whole: threads may format at once
        if cached[0] != second:
            cached = self._second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        millis = int((created - second) * 1000)  # truncated, as ``%03d`` truncates
        if 0 <= millis < 1000:  # (always, from 1970 on)
            return cached[1] + _MILLIS[millis]  # half the time of formatting it with ``%`` (timeit)
        return "%s.%03dZ" % (cached[1], (created - second) * 1000)  # noqa: UP031

    def format(self, record: logging.LogRecord) -> str:
        fields = vars(record)
        extra = fields.keys() - _RESERVED  # the call's extra fields, usually a few: in their order
        ordered = sorted(extra, key=list(fields).index) if len(extra) > 1 else extra
        return self.line(record.created, record.levelname, record.name, record.getMessage(),
                         {name: fields[name] for name in ordered}, record, record.exc_info)

    def line(self, created: float, levelname: str, name: str, msg: str, extra: dict[str, Any],
             record: logging.LogRecord | None = None, exc_info: Any = None) -> str:
        """The JSON line of a record with these fields (``created``: epoch seconds; ``extra``: the
        call's extra fields, in order). ``format`` and ``write_direct`` both write through it."""
        out: dict[str, Any] = {
            "ts": self._timestamp(created),
            "level": _LEVELS.get(levelname) or levelname.lower(),
            "logger": name,
            "msg": mask_secrets(msg),
        }
        context = _context.get() or {}
        for field in CONTEXT_FIELDS:
            value = (getattr(record, field, None) if record is not None else extra.get(field)) or context.get(field)
            if value:
                out[field] = str(value)
        for field, value in extra.items():
            if field in out:
                continue
            kind = self._field_kinds.get(field)
            if kind is None:
                kind = _field_kind(field)
                if len(self._field_kinds) >= FIELD_KINDS_KEPT:
                    self._field_kinds.clear()
                self._field_kinds[field] = kind
            if kind is _SKIP:
                continue
            if kind is _CONTENT and not self.log_message_content:
                out[field + "_chars"] = len(value) if isinstance(value, (str, list, bytes)) else None
                continue
            out[field] = mask_secrets(value) if isinstance(value, str) else value
        if exc_info:
            out["exc"] = mask_secrets(self.formatException(exc_info))
        return orjson.dumps(out, default=str).decode()

    def access_line(self, created: float, levelname: str, name: str, msg: str, route: str, status: int,
                    duration_ms: float) -> str:
        """``line(created, levelname, name, msg, {"route": route, "status": status, "duration_ms":
        duration_ms})``, the access line of every request (``write_access``), without ``line``'s
        loops over the context and extra fields: these three are plain (no credential or content
        name), the request and session ids come from the request context only. The masked message
        and route are remembered by their text (``ACCESS_TEXTS_KEPT``: a request's two
        ``mask_secrets`` were a fifth of the line's instructions, callgrind)."""
        key = (msg, route)
        texts = self._access_texts.get(key)
        if texts is None:
            texts = (mask_secrets(msg), mask_secrets(route))
            # only texts masking left alone: a secret it hid must not stay in memory as a key
            if texts == key and len(msg) <= ACCESS_TEXT_CHARS and len(route) <= ACCESS_TEXT_CHARS:
                if len(self._access_texts) >= ACCESS_TEXTS_KEPT:
                    self._access_texts.clear()
                self._access_texts[key] = texts
        out: dict[str, Any] = {
            "ts": self._timestamp(created),
            "level": _LEVELS.get(levelname) or levelname.lower(),
            "logger": name,
            "msg": texts[0],
        }
        context = _context.get()
        if context:
            request_id = context.get("request_id")
            if request_id:
                out["request_id"] = str(request_id)
            session_id = context.get("session_id")
            if session_id:
                out["session_id"] = str(session_id)
        out["route"] = texts[1]
        out["status"] = status
        out["duration_ms"] = duration_ms
        return orjson.dumps(out, default=str).decode()

    def formatException(self, ei: Any) -> str:
        return format_exception(ei, log_message_content=self.log_message_content)


class TextFormatter(logging.Formatter):
    """Human-readable lines (``--log-format text``), same masking of keys."""

    def __init__(self, *, log_message_content: bool = False) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.log_message_content = log_message_content

    def formatException(self, ei: Any) -> str:
        return format_exception(ei, log_message_content=self.log_message_content)

    def format(self, record: logging.LogRecord) -> str:
        context = current_context()
        if record.exc_info:
            record.exc_text = None  # another formatter's cached text may hold what this one withholds
        line = super().format(record)
        ids = " ".join(f"{k}={context[k]}" for k in CONTEXT_FIELDS if context.get(k))
        return mask_secrets(f"{line} [{ids}]" if ids else line)


class LoopBatchingHandler(logging.StreamHandler):
    """A ``StreamHandler`` that writes the INFO and DEBUG lines of one event-loop iteration together.

    On the thread running an asyncio loop, such a line is kept until the end of the iteration
    (a ``call_soon``), then written with the others in one ``write`` and ``flush``: a line per
    request was a write and a flush per request (4 of the 10.6 us a line took, to a file; timeit).
    WARNING and above, and every line from other threads, are written at once, after anything
    kept (so the stream's order is the order of the records). ``flush`` (called at exit by
    ``logging.shutdown``) writes what is kept. A line is never held longer than the loop iteration
    that produced it.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._kept: list[str] = []
        self._scheduled_on: asyncio.AbstractEventLoop | None = None  # the loop a flush is queued on

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._keep(self.format(record), record.levelno)
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001  (as StreamHandler: a failing line must not fail the caller)
            self.handleError(record)

    def _keep(self, line: str, levelno: int) -> None:
        """Keep ``line`` for the end of the loop iteration, or write it at once (see the class)."""
        self._kept.append(line + self.terminator)
        loop = asyncio._get_running_loop()  # (``None`` off a loop: no exception raised and caught)
        if loop is None or levelno >= logging.WARNING:
            self.flush()
            return
        if self._scheduled_on is not loop:  # none queued, or on a loop that may be gone
            loop.call_soon(self._flush_kept)
            self._scheduled_on = loop

    def _flush_kept(self) -> None:
        """The queued flush: a broken stream is reported as logging reports it, not to the loop."""
        try:
            self.flush()
        except Exception:  # noqa: BLE001
            _report_logging_error()

    def flush(self) -> None:
        self.acquire()
        try:
            self._scheduled_on = None
            if self._kept:
                lines, self._kept = self._kept, []
                self.stream.write("".join(lines))
            if self.stream and hasattr(self.stream, "flush"):
                self.stream.flush()
        finally:
            self.release()


def write_direct(logger: logging.Logger, level: int, msg: str, extra: dict[str, Any]) -> bool:
    """Write ``logger.log(level, msg, extra=extra)``'s line without making a ``LogRecord``, when
    that writes the same line: ``logger`` is enabled for ``level``, and on the way up to the root
    no logger has a filter or a handler of its own, and the root has one ``LoopBatchingHandler``
    (no filter, level at most ``level``) with a ``JsonFormatter`` (``_direct_handler``). ``msg``
    has no ``%`` arguments; ``extra`` must not use ``LogRecord`` attribute names (``logging``
    refuses them; this does not check). Returns ``False``, writing nothing, in any other case (the
    caller then logs as usual). A line that fails to format or write is reported as ``logging``
    reports it, never raised.

    ``metrics.served`` (the line and the request's metrics) took 15-16 us of CPU through
    ``logging`` and 8.6-8.9 us with this (50,000 calls to ``/dev/null``, process CPU time, two runs
    each); the access line itself goes through ``write_access``. ``configure_logging`` installs the
    handler this needs.
    """
    if not logger.isEnabledFor(level):
        return True  # dropped, as ``logger.log`` drops it
    handler = _direct_handler(logger, level)
    if handler is None:
        return False
    try:
        _keep_direct(handler, handler.formatter.line(time.time(), logging.getLevelName(level), logger.name, msg, extra),
                     level)
    except RecursionError:
        raise
    except Exception:  # noqa: BLE001  (a failing line must not fail the caller)
        _report_logging_error()
    return True


def write_access(logger: logging.Logger, level: int, method: str, route: str, status: int, duration_s: float) -> bool:
    """``write_direct(logger, level, f"{method} {route} {status}", {"route": route, "status": status,
    "duration_ms": round(duration_s * 1000, 1)})``: a request's access line (``metrics.served``),
    the same line through ``JsonFormatter.access_line`` (fewer instructions than ``line``'s field
    loops: about a third of the line's, callgrind). Returns ``False``, writing nothing, when
    ``write_direct`` would."""
    if not logger.isEnabledFor(level):
        return True  # dropped, as ``logger.log`` drops it
    handler = _direct_handler(logger, level)
    if handler is None:
        return False
    try:
        line = handler.formatter.access_line(time.time(), logging.getLevelName(level), logger.name,
                                             f"{method} {route} {status}", route, status,
                                             round(duration_s * 1000, 1))
        _keep_direct(handler, line, level)
    except RecursionError:
        raise
    except Exception:  # noqa: BLE001  (a failing line must not fail the caller)
        _report_logging_error()
    return True


class _DirectHandler(LoopBatchingHandler):
    """(For the type checker: a ``LoopBatchingHandler`` whose formatter ``_direct_handler`` found a
    ``JsonFormatter``.)"""

    formatter: JsonFormatter


def _direct_handler(logger: logging.Logger, level: int) -> _DirectHandler | None:
    """The root's one ``LoopBatchingHandler`` with a ``JsonFormatter`` when ``logger``'s record at
    ``level`` (enabled) would reach it alone and unchanged (see ``write_direct``); else ``None``."""
    node: logging.Logger | None = logger
    root = logging.root
    while node is not root:
        if node is None or node.filters or node.handlers or not node.propagate or node.disabled:
            return None
        node = node.parent
    handlers = root.handlers
    if root.filters or len(handlers) != 1:
        return None
    handler = handlers[0]
    if (type(handler) is not LoopBatchingHandler or handler.filters or level < handler.level
            or type(handler.formatter) is not JsonFormatter):
        return None
    return handler  # type: ignore[return-value]  # its formatter checked just above


def _keep_direct(handler: LoopBatchingHandler, line: str, level: int) -> None:
    lock = handler.lock  # what ``Handler.acquire``/``release`` take, without their two calls
    if lock is None:
        handler._keep(line, level)
        return
    with lock:
        handler._keep(line, level)


def _report_logging_error() -> None:
    """Print the exception being handled to stderr, as ``Handler.handleError`` does (when
    ``logging.raiseExceptions``)."""
    if logging.raiseExceptions and sys.stderr:
        traceback.print_exc(file=sys.stderr)


def configure_logging(
    level: str = "info", fmt: str = "json", *, log_message_content: bool = False, stream: TextIO | None = None
) -> logging.Handler:
    """Send every log record (ours, uvicorn's, libraries') to ``stream`` (default stderr) in
    ``fmt`` (``json`` or ``text``) at ``level``; replaces the root logger's handlers.

    Returns the installed handler (tests remove it). Raises ``ValueError`` for an unknown format
    or level. Call once per process (``context-proxy serve`` does), never at import time. It also
    turns off, for the whole process, the caller, thread and process lookups of every log record
    (``logging._srcfile``, ``logThreads``, ``logProcesses``, ``logMultiprocessing``): neither format
    writes them, and records carry ``(unknown file)`` and line 0 from then on.
    """
    if fmt not in ("json", "text"):
        raise ValueError(f"unknown log format {fmt!r} (json or text)")
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    # Neither format writes the caller's file and line, the thread or the process: skip finding
    # them for every record (the logging HOWTO's "Optimization"). With the timestamp formatted
    # once a second, an access line went from 14 to 12 us (50,000 lines to /dev/null).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = LoopBatchingHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(log_message_content=log_message_content) if fmt == "json"
                         else TextFormatter(log_message_content=log_message_content))
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
