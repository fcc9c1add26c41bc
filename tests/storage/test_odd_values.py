"""Nothing logged is lost on odd input (issue 16, item 11), on SQLite and PostgreSQL: text with NUL,
lone surrogates, BOM and U+0010 in every text and JSON column reads back as written; huge counts
are bounded instead of failing the write; a refused request record keeps its messages; a failed
insert's log line carries no content; retention deleting an active session loses no turn."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import io
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from proxy.conversation.canonical import digests_and_chain
from proxy.forward.session_log import SessionLog, settle
from proxy.telemetry.logs import JsonFormatter
from storage.errors import StorageError
from storage.records import ArtifactRecord, EventRecord, NewMessage, RequestRecord
from storage.retention import RetentionPolicy, run_retention
from storage.store import Store
from tests.support.values import nested, same

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
ODD = "a\x00b \ud800 \udfff \ufeffBOM \x10 \x100 \x10u0041 end\x00"
"""NUL (PostgreSQL text refuses it), lone surrogates (no UTF-8 holds them), a BOM, our escape
character alone and followed by what its escapes look like."""
HUGE = {"big": 2**64 + 1, "neg": -(2**70), "u64": 2**64 - 1, "f": 1.8446744073709552e19, "s": ODD, ODD: [ODD]}
"""JSON orjson refuses (integers beyond 64 bits, surrogates) beside JSON it takes."""


def _hash(i: int | str) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def _messages(n: int, text: str, start: int = 0) -> list[NewMessage]:
    return [
        NewMessage(chain_hash=_hash(i), parent_hash=_hash(i - 1) if i else None, seq=i, role="user",
                   message={"role": "user", "content": f"{text} {i}"})
        for i in range(start, start + n)
    ]


def _record(request_id: str, session_pk: int, **fields: Any) -> RequestRecord:
    base: dict[str, Any] = {"id": request_id, "session_pk": session_pk, "model": "m", "status": 200, "latency_ms": 1.0,
                            "stream": False, "usage": None, "added_messages": 0, "first_added_seq": None,
                            "tokens_client": None, "tokens_forwarded": None, "error": None, "finish_reason": "stop"}
    return RequestRecord(**(base | fields))


async def test_odd_text_and_json_read_back_as_written_in_every_column(store: Store) -> None:
    session = await store.get_or_create_session(ODD, ODD, T0)
    assert (session.tenant, session.session_id) == (ODD, ODD)
    assert (await store.get_or_create_session(ODD, ODD, T0)).pk == session.pk  # found again by the odd id
    no_nul = ODD.replace("\x00", "")  # (the read API's find_session answers None for a NUL id at once)
    other = await store.get_or_create_session(ODD, no_nul, T0)
    found = await store.find_session(no_nul, ODD)
    assert found is not None and found.pk == other.pk != session.pk
    message = {"role": ODD, "content": ODD * 40, "extra": HUGE}  # long: SQLite compresses it
    row = NewMessage(chain_hash=_hash("m"), parent_hash=None, seq=0, role=ODD, message=message)
    record = _record(ODD + "req", session.pk, model=ODD, usage=HUGE, error=ODD, finish_reason=ODD,
                     defenses=[ODD], event_ids=[ODD])
    assert await store.append_and_record(session.pk, [row], record, T0) == 1
    stored = await store.get_message_by_hash(session.pk, _hash("m"))
    assert stored is not None and (stored.role, stored.message) == (ODD, message)
    requests, _ = await store.list_requests(session.pk, 10, None)
    assert len(requests) == 1
    got = requests[0]
    assert (got.id, got.model, got.usage, got.error, got.finish_reason, got.defenses, got.event_ids) == (
        ODD + "req", ODD, HUGE, ODD, ODD, [ODD], [ODD])
    summary = await store.session_summary(session)
    assert summary.last_model == ODD and summary.message_count == 1

    event = EventRecord(id=ODD + "ev", session_pk=session.pk, kind=ODD, anchor_hash=_hash("m"),
                        payload={"summary": ODD * 40, "n": HUGE}, tokens_before=2**63, tokens_after=-(2**70),
                        created_at=T0)
    await store.add_event(event)
    (read,) = await store.list_events(session.pk)
    assert (read.id, read.kind, read.payload) == (event.id, ODD, event.payload)

    content = ODD * 100
    await store.put_artifacts([ArtifactRecord(id=ODD + "art", tenant=ODD, session_pk=session.pk, media_type=ODD,
                                              content=content, size_bytes=2**70, line_count=2**40, created_at=T0)])
    artifact = await store.get_artifact(ODD + "art", ODD)
    assert artifact is not None and (artifact.content, artifact.media_type) == (content, ODD)

    assert await store.set_learned_window(ODD, ODD, ODD, 100_000, ODD, T0, None)
    limit = await store.get_learned_limit(ODD, ODD, ODD)
    assert limit is not None and (limit.model, limit.source, limit.context_window_tokens) == (ODD, ODD, 100_000)
    assert [x.model for x in await store.list_learned_limits(tenant=ODD, model=ODD)] == [ODD]


async def test_a_message_nested_deeper_than_orjson_writes_reads_back_as_written(store: Store) -> None:
    """A logged turn whose tool input nests past orjson's writer (254) and past its reader (1,024),
    among other turns: stored (on SQLite written inline, or not, by its size: measuring it does not
    recurse either; compressed when long), read back equal. Before, the write failed: orjson's
    depth error, then the stdlib fallback's ``RecursionError`` (and SQLite's size check's)."""
    session = await store.get_or_create_session("t", "deep", T0)
    deep = [{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                               "input": {"a": nested(depth, ODD), "n": HUGE}}]}
            for depth in (300, 1100, 5000)]
    rows = [NewMessage(chain_hash=_hash(i), parent_hash=_hash(i - 1) if i else None, seq=i, role="assistant",
                       message=message) for i, message in enumerate(deep)]
    assert await store.append_and_record(session.pk, rows, _record("deep-req", session.pk), T0) == 3
    for i, message in enumerate(deep):
        stored = await store.get_message_by_hash(session.pk, _hash(i))
        assert stored is not None and same(stored.message, message)
    listed, _ = await store.list_branch_messages(session.pk, _hash(2), None, 10)
    assert len(listed) == 3 and all(same(m.message, d) for m, d in zip(listed, deep, strict=True))


async def test_plain_text_is_stored_unchanged(store: Store) -> None:
    """Only odd values are escaped: everything else is stored as it is (no cost, no change)."""
    session = await store.get_or_create_session("tenant", "plain ünïcödé id", T0)
    assert (await store.find_session("plain ünïcödé id", "tenant")) == session


async def test_huge_counts_are_bounded_and_the_messages_kept(store: Store) -> None:
    """``max_tokens`` of 3,000,000,000 overflowed PostgreSQL's INTEGER and 2^63 SQLite's: the
    whole end-of-request write, the client's messages with it, was rolled back."""
    count_max, tokens_max = 2**31 - 1, 2**40 - 1  # storage.values.COUNT_MAX, TOKENS_MAX
    session = await store.get_or_create_session("t", "huge", T0)
    for i, (client, forwarded) in enumerate([(3_000_000_000, 2**63), (2**64 + 5, -(2**63) - 1)]):
        record = _record(f"req_{i}", session.pk, tokens_client=client, tokens_forwarded=forwarded, status=2**40,
                         first_added_seq=2**63, latency_ms=float("inf"), usage={"prompt_tokens": 2**80})
        assert await store.append_and_record(session.pk, _messages(2, "secret", 2 * i), record, T0) == 2
    requests, _ = await store.list_requests(session.pk, 10, None)
    assert [(r.tokens_client, r.tokens_forwarded) for r in requests] == [
        (3_000_000_000, tokens_max), (tokens_max, -tokens_max)]
    assert {r.status for r in requests} == {count_max} and {r.latency_ms for r in requests} == {0.0}
    assert requests[0].usage == {"prompt_tokens": 2**80}
    summary = await store.session_summary(session)
    assert summary.message_count == 4 and summary.tokens_client_total == 3_000_000_000 + tokens_max
    assert await store.set_learned_window("t", "u", "m", 10**30, "overflow", T0, None)
    limit = await store.get_learned_limit("t", "u", "m")
    assert limit is not None and limit.context_window_tokens == tokens_max


async def test_a_refused_request_record_does_not_lose_the_messages(store: Store) -> None:
    session = await store.get_or_create_session("t", "refused", T0)
    await store.append_and_record(session.pk, _messages(2, "first"), _record("req_same", session.pk), T0)
    with pytest.raises(StorageError):  # the id is taken: the record is refused, and said so
        await store.append_and_record(session.pk, _messages(2, "second", 2), _record("req_same", session.pk), T0)
    assert await store.stored_prefix_len(session.pk, [_hash(i) for i in range(4)]) == 4


async def test_a_failed_insert_logs_no_content(store: Store) -> None:
    """The failure's log line (as the pipeline writes it: ``exc_info``) held SQLAlchemy's
    ``[parameters: ...]`` and the driver's text (PostgreSQL's ``Key (id)=(...)``)."""
    secret = "SECRET-7f3a"
    session = await store.get_or_create_session("t", "logged", T0)
    record = _record(f"req_{secret}", session.pk, model=f"model {secret}", error=f"error {secret}")
    await store.append_and_record(session.pk, _messages(1, secret), record, T0)
    with pytest.raises(StorageError) as caught:
        await store.append_and_record(session.pk, _messages(2, secret, 1), record, T0)
    lines = {}
    for content in (False, True):
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        handler.setFormatter(JsonFormatter(log_message_content=content))
        logger = logging.getLogger(f"test_odd_values.{content}")
        logger.addHandler(handler)
        logger.propagate = False
        try:
            logger.error("logging the reply failed: %s", caught.value, exc_info=caught.value)
        finally:
            logger.removeHandler(handler)
        lines[content] = stream.getvalue()
    assert "IntegrityError" in lines[False]  # the error class and our context are kept
    assert secret not in lines[False] and "parameters: (" not in lines[False]
    assert "parameters: (" not in lines[True]  # parameters hidden even then (SQLAlchemy's hide_parameters)


async def test_retention_deleting_an_active_session_loses_no_turn(database_url: str) -> None:
    """A cached session row whose pk retention deleted left the next 30 s of turns unloggable."""
    store = await Store.open(database_url, pool_size=5)
    log = SessionLog(store)
    try:
        turns: list[dict[str, Any]] = []
        for turn in range(3):
            session = await log.open_session("tenant", "active")
            turns.append({"role": "user", "content": f"question {turn}"})
            _, chain = digests_and_chain(turns)
            reply = {"role": "assistant", "content": f"answer {turn}"}
            record = _record(f"req_{turn}", session.pk)
            if turn == 2:  # the request's messages written first, then the session deleted under it
                await log.append_request(session, turns, chain)
                await run_retention(database_url, RetentionPolicy(max_age_days=1), now=datetime.now(UTC) + timedelta(days=9))
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            log.finish(session, turns, chain, [], reply, record, with_request=True, then=functools.partial(settle, done))
            await done
            if turn == 0:
                await run_retention(database_url, RetentionPolicy(max_age_days=1), now=datetime.now(UTC) + timedelta(days=9))
            turns.append(reply)
        now_session = await store.find_session("active", "tenant")
        assert now_session is not None
        leaf = await store.branch_leaf(now_session.pk, None)
        assert leaf is not None
        messages, _ = await store.list_branch_messages(now_session.pk, leaf.chain_hash, None, 100)
        # turns 1 and 2 (after the deletions) are whole: the conversation up to the last reply
        assert [m.message["content"] for m in messages] == [
            "question 0", "answer 0", "question 1", "answer 1", "question 2", "answer 2"]
        requests, _ = await store.list_requests(now_session.pk, 10, None)
        assert [r.id for r in requests] == ["req_2"]
    finally:
        await store.close()


def test_text_log_format_withholds_database_error_text_too() -> None:
    """The text format (``--log-format text``) writes tracebacks through the same rule."""
    import sqlalchemy as sa

    from proxy.telemetry.logs import TextFormatter

    secret = "-".join(["SECRET", "1"])  # (not in the traceback's source lines)
    engine = sa.create_engine("sqlite://")
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x TEXT PRIMARY KEY)")
            conn.execute(sa.text("INSERT INTO t VALUES (:x)"), {"x": secret})
            conn.execute(sa.text("INSERT INTO t VALUES (:x)"), {"x": secret})
    except sa.exc.IntegrityError as exc:
        error = exc
    record = logging.makeLogRecord({"msg": "failed", "levelno": logging.ERROR, "levelname": "ERROR",
                                    "exc_info": (type(error), error, error.__traceback__)})
    logging.Formatter().format(record)  # another handler formatted it first: its text is cached
    text = TextFormatter().format(record)
    assert "IntegrityError" in text and secret not in text
    assert secret in TextFormatter(log_message_content=True).format(record)  # (no hide_parameters here)
