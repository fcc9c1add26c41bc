"""proxy/telemetry/logs.py: one JSON object per line, request/session ids, no content, no keys."""

from __future__ import annotations

import io
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from proxy.telemetry.logs import (
    JsonFormatter,
    LoopBatchingHandler,
    TextFormatter,
    bind_request,
    configure_logging,
    request_context,
    write_direct,
)
from tests.support.real_server import Proxy


@pytest.fixture
def captured() -> Iterator[Callable[..., list[dict]]]:
    """A JSON handler on the ``context_proxy`` loggers; call the fixture to read the lines so far."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("context_proxy")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def _format(formatter: logging.Formatter, msg: str, *args: object, exc: bool = False, **extra: object) -> str:
    record = logging.makeLogRecord({"name": "context_proxy.test", "levelname": "WARNING", "levelno": 30,
                                    "msg": msg, "args": args, **extra})
    if exc:
        try:
            raise RuntimeError("boom with sk-abcdefghijklmnop")
        except RuntimeError:
            record.exc_info = sys.exc_info()
    return formatter.format(record)


def test_a_line_is_one_json_object_with_the_request_context() -> None:
    with request_context():
        bind_request("req_1", "sess_1", "m")
        line = _format(JsonFormatter(), "forwarded %d tokens", 42, status=200)
    assert "\n" not in line
    out = json.loads(line)
    assert list(out)[:6] == ["ts", "level", "logger", "msg", "request_id", "session_id"]
    assert out["ts"].endswith("Z") and out["level"] == "warning" and out["logger"] == "context_proxy.test"
    assert out["msg"] == "forwarded 42 tokens" and out["status"] == 200
    assert (out["request_id"], out["session_id"]) == ("req_1", "sess_1")
    outside = json.loads(_format(JsonFormatter(), "no request"))
    assert "request_id" not in outside and "session_id" not in outside


@pytest.mark.parametrize("values", [("req_1", "sess_1", "gpt-4o"), ("req_2", "sess_2", None), (None, 7, 1.5),
                                    (None, None, None)])
def test_bind_request_binds_the_three_fields_as_text_in_order(values: tuple[object, object, object]) -> None:
    """``bind_request`` (the pipelines' call, by position) adds the request id, session id and
    model after what the context holds, in that order, as text, ``None`` skipped; nothing outside
    a request."""
    request_id, session_id, model = values
    with request_context() as context:
        context["route"] = "/v1/chat/completions"
        bind_request(request_id, session_id, model)
    named = (("request_id", request_id), ("session_id", session_id), ("model", model))
    assert list(context.items()) == [("route", "/v1/chat/completions"),
                                     *((k, str(v)) for k, v in named if v is not None)]
    bind_request("req_out", "sess_out", "m")  # outside a request: nothing to bind, no error
    with request_context() as after:
        assert after == {}


def test_the_timestamp_is_utc_to_the_millisecond_and_extras_keep_their_order() -> None:
    formatter = JsonFormatter()
    for created, text in [(1795988192.1239, "2026-11-29T21:36:32.123Z"), (1795988192.0, "2026-11-29T21:36:32.000Z"),
                          (1795988193.999, "2026-11-29T21:36:33.999Z"), (1795988192.5, "2026-11-29T21:36:32.500Z")]:
        record = logging.makeLogRecord({"name": "n", "levelname": "INFO", "msg": "m", "created": created,
                                        "zeta": 1, "alpha": 2, "mid": 3})
        out = json.loads(formatter.format(record))
        assert out["ts"] == text
        assert list(out)[-3:] == ["zeta", "alpha", "mid"]  # as the call gave them


def test_never_keys_and_no_content_unless_asked() -> None:
    line = _format(JsonFormatter(), "upstream said: Bearer sk-live-0123456789abcdef", exc=True,
                   authorization="Bearer sk-0123456789abcdef", api_key="sk-0123456789abcdef",
                   content="the user's secret plans", messages=[{"role": "user"}])
    out = json.loads(line)
    assert "0123456789abcdef" not in line and "sk-abcdefghijklmnop" not in line
    assert out["msg"] == "upstream said: Bearer ***"
    assert "authorization" not in out and "api_key" not in out
    assert "secret plans" not in line and out["content_chars"] == len("the user's secret plans")
    assert out["messages_chars"] == 1
    assert "RuntimeError: boom with ***" in out["exc"]
    shown = json.loads(_format(JsonFormatter(log_message_content=True), "x", content="the user's secret plans"))
    assert shown["content"] == "the user's secret plans"


@pytest.mark.parametrize("text", [
    "POST /v1/chat/completions 200", "", "Bearer abcdefgh12345", "BEARER\tabcdefgh12345", "token sk-abcdefgh12",
    "SK-ABCDEFGH12 and bearer", "xsk-abcdefgh12", "bearer short", "sk-short",
    "\u017fk-abcdefgh12",  # long s: IGNORECASE matches it as 's'
    "s\u212a-abcdefgh12",  # Kelvin sign: matches 'k'
    "caf\u00e9 Bearer abcdefgh12345", "caf\u00e9 au lait",
])
def test_masking_matches_the_pattern_with_or_without_its_shortcut(text: str) -> None:
    """``mask_secrets`` skips the pattern for ASCII text that cannot match; it masks exactly what
    the pattern masks, non-ASCII look-alikes of the letters included."""
    from proxy.telemetry.logs import _SECRET_PATTERN, mask_secrets

    assert mask_secrets(text) == _SECRET_PATTERN.sub(lambda m: (m.group(1) or "") + "***", text)
    # the shortcut names the pattern's literals ("bearer", "sk-"): a new form of key needs both changed
    assert _SECRET_PATTERN.pattern == r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}|\bsk-[A-Za-z0-9_-]{8,}"


@pytest.fixture
def root_json() -> Iterator[Callable[[str], io.StringIO]]:
    """``configure_logging`` into a ``StringIO`` (call with the level); the root logger restored after."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)

    def configure(level: str) -> io.StringIO:
        stream = io.StringIO()
        configure_logging(level, "json", stream=stream)
        return stream

    try:
        yield configure
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])


def test_text_format_and_configuration(root_json) -> None:  # type: ignore[no-untyped-def]
    with request_context():
        bind_request("req_2", None, None)
        line = _format(TextFormatter(), "hello key sk-0123456789abcdef")
    assert line.endswith("hello key *** [request_id=req_2]")
    with pytest.raises(ValueError):
        configure_logging("info", "xml")
    stream = root_json("warning")
    logging.getLogger("uvicorn.error").warning("from uvicorn")
    logging.getLogger("context_proxy.x").info("below the level")
    lines = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert [(x["logger"], x["msg"]) for x in lines] == [("uvicorn.error", "from uvicorn")]


def test_access_lines_carry_the_ids_of_the_chat_request(proxy: Proxy, captured: Callable[[], list[dict]]) -> None:
    with proxy.http() as http:
        resp = http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": [{"role": "user", "content": "private words"}]})
    assert resp.status_code == 200
    deadline = time.monotonic() + 5  # the access line is written once the last byte has gone out
    while True:
        chat = [x for x in captured() if x["logger"] == "context_proxy.access" and x.get("route") == "/v1/chat/completions"]
        if chat or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert len(chat) == 1
    assert chat[0]["request_id"] == resp.headers["x-context-proxy-request-id"]
    assert chat[0]["session_id"] == resp.headers["x-context-proxy-session-id"]
    assert chat[0]["status"] == 200 and chat[0]["duration_ms"] >= 0
    assert all("private words" not in json.dumps(x) for x in captured())


class _CountingStream(io.StringIO):
    """A text stream that counts its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


@pytest.fixture
def batching() -> Iterator[tuple[logging.Logger, LoopBatchingHandler, _CountingStream]]:
    """A logger of its own writing through a ``LoopBatchingHandler`` to a counting stream."""
    stream = _CountingStream()
    handler = LoopBatchingHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("context_proxy.test.batching")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    try:
        yield logger, handler, stream
    finally:
        logger.removeHandler(handler)


async def test_lines_of_one_loop_iteration_are_written_together_and_in_order(batching) -> None:  # type: ignore[no-untyped-def]
    import asyncio
    import threading

    logger, handler, stream = batching
    logger.info("one")
    logger.debug("two")
    assert stream.getvalue() == ""  # kept until this iteration ends
    await asyncio.sleep(0)
    assert stream.getvalue() == "INFO one\nDEBUG two\n" and stream.writes == 1
    logger.info("three")
    logger.warning("four")  # at once, after what was kept
    assert stream.getvalue().endswith("INFO three\nWARNING four\n")
    thread = threading.Thread(target=logger.info, args=("from a thread",))
    thread.start()
    thread.join()
    assert stream.getvalue().endswith("WARNING four\nINFO from a thread\n")  # no loop there: at once
    logger.info("five")
    handler.flush()  # what logging.shutdown does at exit
    assert stream.getvalue().endswith("INFO five\n")
    await asyncio.sleep(0)  # the scheduled flush finds nothing left
    assert stream.getvalue().count("five") == 1


def test_a_loop_gone_with_a_flush_queued_does_not_hold_the_lines_of_the_next(batching) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    logger, _, stream = batching
    first = asyncio.new_event_loop()

    def log_and_stop() -> None:
        logger.info("from the first loop")
        first.stop()  # the loop ends with this iteration: the flush it queued never runs

    first.call_soon(log_and_stop)
    first.run_forever()
    first.close()
    assert stream.getvalue() == ""

    async def log_and_yield() -> str:
        logger.info("from the second loop")
        await asyncio.sleep(0)
        return stream.getvalue()

    assert asyncio.run(log_and_yield()) == "INFO from the first loop\nINFO from the second loop\n"


async def test_the_direct_access_line_is_the_line_logging_writes(root_json) -> None:  # type: ignore[no-untyped-def]
    """``served`` writes its access line without a ``LogRecord`` when nothing could tell the
    difference (``write_direct``): the same JSON, field for field, as through ``logging``; with a
    filter on the way it goes through ``logging`` (and the filter applies); below the level, no line."""
    import asyncio

    from proxy.telemetry.metrics import Metrics, access_log, served

    stream = root_json("info")
    metrics = Metrics()

    def lines() -> list[dict]:
        return [json.loads(x) for x in stream.getvalue().splitlines()]

    class Tagging(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            record.tagged = True
            return "/drop" not in record.getMessage()

    records: list[str] = []
    make_record = access_log.makeRecord

    def recording(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        records.append(record.getMessage())
        return record

    access_log.makeRecord = recording  # type: ignore[method-assign]
    try:
        with request_context():
            bind_request("req_d", "sess_d", "m")
            served(metrics, "POST", "/v1/chat/completions", "m", 200, time.perf_counter())  # direct
            assert records == []  # no LogRecord made
            access_log.addFilter(tagging := Tagging())
            try:
                served(metrics, "POST", "/v1/chat/completions", "m", 200, time.perf_counter())  # through logging
                served(metrics, "POST", "/drop", "m", 200, time.perf_counter())  # filtered out
            finally:
                access_log.removeFilter(tagging)
            assert records == ["POST /v1/chat/completions 200", "POST /drop 200"]
            served(metrics, "GET", "/healthz", "", 200, time.perf_counter())  # a quiet route: DEBUG
    finally:
        del access_log.makeRecord
    await asyncio.sleep(0)
    direct, logged = lines()
    assert "tagged" not in direct and logged.pop("tagged") is True
    assert direct.pop("ts").endswith("Z") and logged.pop("ts").endswith("Z")
    assert direct.pop("duration_ms") >= 0 and logged.pop("duration_ms") >= 0
    assert list(direct.items()) == list(logged.items()) == [  # the same fields in the same order
        ("level", "info"), ("logger", "context_proxy.access"), ("msg", "POST /v1/chat/completions 200"),
        ("request_id", "req_d"), ("session_id", "sess_d"), ("route", "/v1/chat/completions"), ("status", 200)]
    stream = root_json("debug")
    served(metrics, "GET", "/healthz", "", 200, time.perf_counter())
    probe = logging.getLogger("context_proxy.test.direct")
    assert write_direct(probe, logging.INFO, "probe", {"k": 1})  # written without logging
    probe.addFilter(tagging)
    try:
        assert not write_direct(probe, logging.INFO, "probe", {"k": 2})  # a filter: left to logging
    finally:
        probe.removeFilter(tagging)
    for off in ("disabled", "propagate"):  # a disabled logger writes nothing; one not propagating: left to logging
        setattr(probe, off, off == "disabled")
        try:
            assert write_direct(probe, logging.INFO, "probe", {"k": 3}) is (off == "disabled")
        finally:
            setattr(probe, off, off != "disabled")
    logging.disable(logging.INFO)
    try:
        assert write_direct(probe, logging.INFO, "probe", {"k": 4})  # dropped, as logging drops it
    finally:
        logging.disable(logging.NOTSET)
    await asyncio.sleep(0)
    assert [(x["level"], x["msg"], x.get("k")) for x in lines()] == [("debug", "GET /healthz 200", None), ("info", "probe", 1)]


def _integrity_error() -> BaseException:
    import sqlalchemy.exc

    return sqlalchemy.exc.IntegrityError("INSERT INTO t VALUES (?)", ("the secret value",), Exception("UNIQUE failed: the secret value"))


@pytest.mark.parametrize("shape", ["alone", "cause", "group", "nested_group"])
def test_a_database_error_s_text_is_withheld_wherever_it_sits_in_the_traceback(shape: str) -> None:
    """Content logging off: a DB error's text (it quotes values) is withheld alone, as a cause,
    and as a member of an ``ExceptionGroup`` (a ``TaskGroup``'s error), nested or not."""
    from proxy.telemetry.logs import WITHHELD, format_exception

    db = _integrity_error()
    exc: BaseException
    if shape == "alone":
        exc = db
    elif shape == "cause":
        exc = RuntimeError("writing failed")
        exc.__cause__ = db
    elif shape == "group":
        exc = ExceptionGroup("tasks failed", [ValueError("other"), db])
    else:
        exc = ExceptionGroup("outer", [ExceptionGroup("inner", [db])])
    hidden = format_exception(exc, log_message_content=False)
    assert "the secret value" not in hidden and WITHHELD in hidden and "IntegrityError" in hidden
    assert "the secret value" in format_exception(exc, log_message_content=True)


@pytest.mark.parametrize("context", [None, {}, {"request_id": "req_1"}, {"session_id": "sess_2", "model": "m"},
                                     {"request_id": "req_1", "session_id": "sess ✓ \"quoted\""}])
@pytest.mark.parametrize(("level", "msg", "route"), [
    ("INFO", "POST /v1/chat/completions 200", "/v1/chat/completions"),
    ("DEBUG", "GET /healthz 200", "/healthz"),
    ("INFO", "POST Bearer abcdefghijkl 500", "/x/sk-abcdefghijkl"),  # masked either way
])
def test_the_access_line_is_the_generic_line(context: dict[str, str] | None, level: str, msg: str,
                                             route: str) -> None:
    """``JsonFormatter.access_line`` (the access line's own way, ``write_access``) writes what
    ``line`` writes for the same fields, in and out of a request context, secrets masked."""
    from proxy.telemetry.logs import JsonFormatter, _context

    formatter = JsonFormatter()
    created = time.time()
    token = _context.set(context)
    try:
        fast = formatter.access_line(created, level, "context_proxy.access", msg, route, 503, 12.5)
        generic = formatter.line(created, level, "context_proxy.access", msg,
                                 {"route": route, "status": 503, "duration_ms": 12.5})
    finally:
        _context.reset(token)
    assert fast == generic
    assert "abcdefghijkl" not in fast


@pytest.mark.parametrize("created", [0.0, 0.0005, 0.999, 0.9999999, 1.5, 1733343740.0, 1733343740.123456,
                                     1733343740.9999998, 1733343740.0009999, 4102444799.999, -2.25, -0.0004])
def test_a_timestamp_s_milliseconds_are_those_formatting_writes(created: float) -> None:
    """``JsonFormatter._timestamp`` takes a whole millisecond's text from a table; the text is
    what ``%03d`` writes of the truncated milliseconds (and the second's text, strftime's)."""
    second = int(created)
    expected = "%s.%03dZ" % (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)), (created - second) * 1000)  # noqa: UP031
    formatter = JsonFormatter()
    assert formatter._timestamp(created) == expected
    assert formatter._timestamp(created) == expected  # the second's text remembered


def test_the_access_line_s_remembered_texts_are_masked_and_bounded() -> None:
    """``access_line`` remembers the message and route of a (message, route) pair that masking
    leaves alone (a pair holding a key is masked every time and never kept: the key would stay in
    memory), at most ``ACCESS_TEXTS_KEPT`` pairs, none past ``ACCESS_TEXT_CHARS`` characters."""
    from proxy.telemetry.logs import ACCESS_TEXT_CHARS, ACCESS_TEXTS_KEPT

    formatter = JsonFormatter()
    msg, route = "POST Bearer abcdefghijkl 401", "/x/sk-abcdefghijkl"
    first = json.loads(formatter.access_line(1733343740.5, "INFO", "context_proxy.access", msg, route, 401, 1.5))
    again = json.loads(formatter.access_line(1733343740.5, "INFO", "context_proxy.access", msg, route, 401, 1.5))
    assert first == again and first["msg"] == "POST Bearer *** 401" and first["route"] == "/x/***"
    assert formatter._access_texts == {}  # the key is nowhere in memory
    plain = json.loads(formatter.access_line(1.0, "INFO", "a", "POST /v1/chat/completions 200", "/v1/chat/completions",
                                             200, 1.0))
    assert plain["msg"] == "POST /v1/chat/completions 200" and len(formatter._access_texts) == 1
    long_method = "X" * ACCESS_TEXT_CHARS
    formatter.access_line(1.0, "INFO", "a", f"{long_method} /v1/x 200", "/v1/x", 200, 1.0)
    assert len(formatter._access_texts) == 1  # too long: not kept
    for i in range(ACCESS_TEXTS_KEPT + 5):
        formatter.access_line(1.0, "INFO", "a", f"M{i} /v1/x 200", "/v1/x", 200, 1.0)
    assert 0 < len(formatter._access_texts) <= ACCESS_TEXTS_KEPT
