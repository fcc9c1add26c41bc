"""The row values ``Store`` writes for a new message and a request record, every value storable.

Shared by both ways the end-of-request write runs (``storage.store``: SQLAlchemy statements;
``storage.sqlite.end_write``: driver statements on a SQLite file), so both write the same rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from math import isfinite
from typing import Any

from storage.records import NewMessage, RequestRecord
from storage.values import COUNT_MAX, TOKENS_MAX, clamp_count

MESSAGE_ROW_KEYS = ("session_pk", "chain_hash", "parent_hash", "seq", "role", "message", "internal", "created_at")
"""The keys of ``message_rows``' rows (the columns of a new message row)."""
REQUEST_ROW_KEYS = tuple(f.name for f in dataclasses.fields(RequestRecord))
"""The columns of a request row, as ``request_values`` gives them (``created_at`` included)."""

RecordItem = tuple[int, list[dict[str, Any]], dict[str, Any], datetime, tuple[int, ...] | None]
"""An end-of-request write: ``(session_pk, message rows, request row values, now, client_seqs)``
(``client_seqs``: see ``record_item``)."""


def record_item(session_pk: int, new_messages: Sequence[NewMessage], record: RequestRecord, now: datetime,
                client_rows: int | None) -> RecordItem:
    """The rows of ``Store.append_and_record``, and ``client_seqs``: the seqs of the first
    ``client_rows`` of ``new_messages`` (the client's, whose count the record is to show:
    ``added_counts``; ``None``: the record's counts stand)."""
    return (session_pk, message_rows(session_pk, new_messages, now), request_values(record, now), now,
            client_seqs(new_messages, client_rows))


def client_seqs(new_messages: Sequence[NewMessage], client_rows: int | None) -> tuple[int, ...] | None:
    """The seqs of the first ``client_rows`` of ``new_messages`` (``None``: ``None``)."""
    return None if client_rows is None else tuple(m.seq for m in new_messages[:client_rows])


def added_counts(seqs: Sequence[int], rows: int, inserted: int) -> tuple[int, int | None]:
    """A request record's ``(added_messages, first_added_seq)`` when its write of ``rows`` message
    rows inserted ``inserted`` of them, the first ones being the client's messages at ``seqs``:
    the client's messages it inserted, and the seq of the first (``None``: none). The rows are one
    chain, parents first, and the log is prefix-closed (a row is stored only after its parent,
    a write's rows in one transaction), so those already stored are a prefix of them and the
    inserted ones the last ``inserted``. Not so when the chain has a gap (a refused key's cleanup
    deleted a message while another request of the session was in flight: ``storage.refused``):
    then the counts may name a stored seq, as the looked-up prefix did before."""
    added = max(0, inserted - (rows - len(seqs)))
    return added, seqs[len(seqs) - added] if added else None


def request_values(record: RequestRecord, now: datetime) -> dict[str, Any]:
    """The request row of ``record`` (``created_at`` ``None``: ``now``), every value storable:
    counts clamped to the columns (``COUNT_MAX``, tokens ``TOKENS_MAX``; a non-finite count stored
    as ``None``, or 0 where the column needs one), a non-finite latency as 0. Text and JSON need
    nothing here: their column types store any ``str`` and any JSON (``storage.values``)."""
    return dict(zip(REQUEST_ROW_KEYS, request_tuple(record, now), strict=True))


def request_tuple(record: RequestRecord, now: datetime) -> tuple[Any, ...]:
    """``request_values``' values in ``REQUEST_ROW_KEYS`` order, built without a dict (the
    SQLite end-of-request write binds them by position, ``storage.sqlite.end_write``). A count
    already as stored (an ``int`` within its column; ``None`` where the column takes one) is
    taken as is, without ``_count``'s call (which gives it back unchanged)."""
    r = record
    added_messages, first_added_seq = r.added_messages, r.first_added_seq
    latency, status, retries = r.latency_ms, r.status, r.overflow_retries
    tokens_client, tokens_forwarded = r.tokens_client, r.tokens_forwarded
    return (
        r.id, r.session_pk, r.model,
        status if type(status) is int and -COUNT_MAX <= status <= COUNT_MAX else _count(status, COUNT_MAX, 0),
        latency if type(latency) is not float or isfinite(latency) else 0.0,  # (``finite``'s, inline)
        r.stream, r.usage,
        added_messages if type(added_messages) is int and -COUNT_MAX <= added_messages <= COUNT_MAX
        else _count(added_messages, COUNT_MAX, 0),
        first_added_seq if first_added_seq is None or (type(first_added_seq) is int and
                                                      -COUNT_MAX <= first_added_seq <= COUNT_MAX)
        else _count(first_added_seq, COUNT_MAX, None),
        tokens_client if tokens_client is None or (type(tokens_client) is int and
                                                  -TOKENS_MAX <= tokens_client <= TOKENS_MAX)
        else _count(tokens_client, TOKENS_MAX, None),
        tokens_forwarded if tokens_forwarded is None or (type(tokens_forwarded) is int and
                                                        -TOKENS_MAX <= tokens_forwarded <= TOKENS_MAX)
        else _count(tokens_forwarded, TOKENS_MAX, None),
        r.defenses, r.event_ids, r.error,
        r.created_at or now,
        r.finish_reason,
        retries if type(retries) is int and -COUNT_MAX <= retries <= COUNT_MAX else _count(retries, COUNT_MAX, 0),
    )


def _count(value: Any, maximum: int, default: int | None) -> Any:
    """A count as stored: ``clamp_count``'s (the usual in-range int skips the call), ``None`` as ``default``."""
    if value is None:
        return default
    if type(value) is int and -maximum <= value <= maximum:
        return value
    value = clamp_count(value, maximum)
    return default if value is None else value


def message_rows(session_pk: int, new_messages: Sequence[NewMessage], now: datetime) -> list[dict[str, Any]]:
    """The message rows of ``new_messages`` (keys ``MESSAGE_ROW_KEYS``)."""
    return [
        {
            "session_pk": session_pk,
            "chain_hash": m.chain_hash,
            "parent_hash": m.parent_hash,
            "seq": m.seq,
            "role": m.role,
            "message": m.message,
            "internal": m.internal,
            "created_at": now,
        }
        for m in new_messages
    ]
