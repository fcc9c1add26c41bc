"""The row values ``Store`` writes for a new message and a request record, every value storable.

Shared by both ways the end-of-request write runs (``storage.store``: SQLAlchemy statements;
``storage.sqlite.end_write``: driver statements on a SQLite file), so both write the same rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from storage.records import NewMessage, RequestRecord
from storage.values import COUNT_MAX, TOKENS_MAX, clamp_count, finite

MESSAGE_ROW_KEYS = ("session_pk", "chain_hash", "parent_hash", "seq", "role", "message", "internal", "created_at")
"""The keys of ``message_rows``' rows (the columns of a new message row)."""
REQUEST_ROW_KEYS = tuple(f.name for f in dataclasses.fields(RequestRecord))
"""The columns of a request row, as ``request_values`` gives them (``created_at`` included)."""

RecordItem = tuple[int, list[dict[str, Any]], dict[str, Any], datetime]
"""An end-of-request write: ``(session_pk, message rows, request row values, now)``."""

_COUNT_FIELDS = ("status", "added_messages", "first_added_seq", "overflow_retries")
_TOKEN_FIELDS = ("tokens_client", "tokens_forwarded")


def record_item(session_pk: int, new_messages: Sequence[NewMessage], record: RequestRecord, now: datetime,
                added: tuple[int, int | None] | None) -> RecordItem:
    """The rows of ``Store.append_and_record`` (``added``: see ``request_values``)."""
    return session_pk, message_rows(session_pk, new_messages, now), request_values(record, now, added), now


def request_values(record: RequestRecord, now: datetime, added: tuple[int, int | None] | None) -> dict[str, Any]:
    """The request row of ``record`` (``created_at`` ``None``: ``now``; ``added``: the message
    counts to store instead of the record's), every value storable: counts clamped to the
    columns (``COUNT_MAX``, tokens ``TOKENS_MAX``; a non-finite count stored as ``None``, or 0
    where the column needs one), a non-finite latency as 0. Text and JSON need nothing here:
    their column types store any ``str`` and any JSON (``storage.values``)."""
    values = {name: getattr(record, name) for name in REQUEST_ROW_KEYS}
    values["created_at"] = record.created_at or now
    if added is not None:
        values["added_messages"], values["first_added_seq"] = added
    for names, maximum in ((_COUNT_FIELDS, COUNT_MAX), (_TOKEN_FIELDS, TOKENS_MAX)):
        for name in names:
            value = values[name]
            if value is not None and (type(value) is not int or not -maximum <= value <= maximum):
                values[name] = clamp_count(value, maximum)  # (the usual in-range int skips the call)
    for name in ("status", "added_messages", "overflow_retries"):
        if values[name] is None:
            values[name] = 0
    if type(values["latency_ms"]) is float:
        values["latency_ms"] = finite(values["latency_ms"])
    return values


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
