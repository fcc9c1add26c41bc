"""The session log as the pipeline uses it: name the session, append what a request adds, log the reply.

A session is named by the ``X-Session-Id`` header, else derived from the tenant and the chain hash
of the conversation's first user message (which covers the system prompt before it), so every
request of one conversation lands in one session without any client change. Conversations that
start the same way share a session and become branches of its message tree.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from proxy.chat import chain_hash, message_digest
from storage.records import NewMessage, RequestRecord, SessionRecord
from storage.store import Store

log = logging.getLogger("context_proxy.log")

MAX_SESSION_ID_CHARS = 200


def derive_session_id(tenant: str, messages: list[dict[str, Any]], chain_hashes: list[str]) -> str:
    """``sess_`` + 24 hex of SHA-256(tenant, chain hash of the first user message).

    Without a user message, the first message anchors the session.
    """
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), 0)
    anchor = chain_hashes[first_user] if chain_hashes else ""
    return "sess_" + hashlib.sha256(f"{tenant}:{anchor}".encode()).hexdigest()[:24]


def new_id(prefix: str) -> str:
    """A random id for records outside the projection (requests); never used inside it."""
    return f"{prefix}_{secrets.token_hex(12)}"


def now() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class LoggedRequest:
    """What a request added to the log: ``added`` new messages starting at ``first_added_seq``."""

    added: int
    first_added_seq: int | None


class SessionLog:
    """Appends to the append-only log through ``Store``; all methods are short transactions."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def open_session(self, tenant: str, session_id: str) -> SessionRecord:
        return await self.store.get_or_create_session(tenant, session_id, now())

    async def append_request(
        self, session: SessionRecord, messages: list[dict[str, Any]], chain: list[str]
    ) -> LoggedRequest:
        """Store the messages of ``messages`` not yet in the session's log (by chain hash)."""
        stored = await self.store.stored_prefix_len(session.pk, chain)
        if stored >= len(messages):
            return LoggedRequest(0, None)
        new = [
            NewMessage(
                chain_hash=chain[i],
                parent_hash=chain[i - 1] if i else None,
                seq=i,
                role=str(messages[i].get("role")),
                message=messages[i],
            )
            for i in range(stored, len(messages))
        ]
        added = await self.store.append_messages(session.pk, new, now())
        return LoggedRequest(added, stored)

    async def append_reply(
        self, session: SessionRecord, parent: str | None, seq: int, reply: dict[str, Any], *, internal: bool = False
    ) -> str:
        """Store the assistant reply after ``parent``; returns its chain hash."""
        h = chain_hash(parent, message_digest(reply))
        await self.store.append_messages(
            session.pk,
            [NewMessage(chain_hash=h, parent_hash=parent, seq=seq, role=str(reply.get("role", "assistant")), message=reply, internal=internal)],
            now(),
        )
        return h

    async def record_request(self, record: RequestRecord) -> None:
        await self.store.add_request(record)

    async def expand_internal(
        self, session: SessionRecord, messages: list[dict[str, Any]], digests: list[str], chain: list[str]
    ) -> tuple[list[dict[str, Any]], list[str], list[str]] | None:
        """The client's messages with the proxy's earlier internal rounds put back where they happened.

        An internal round is stored as internal messages whose parent is the message after which it
        ran; the chain continues through them, so the reply that followed (and the client's echo
        of it) hash identically. Returns ``None`` when the session has no internal rounds.
        """
        internal = await self.store.list_internal_messages(session.pk)
        if not internal:
            return None
        children: dict[str | None, Any] = {}
        for record in internal:
            children.setdefault(record.parent_hash, record)
        out_m: list[dict[str, Any]] = []
        out_d: list[str] = []
        out_c: list[str] = []
        parent: str | None = None
        shifted = False
        for i, message in enumerate(messages):
            h = chain_hash(parent, digests[i]) if shifted else chain[i]
            out_m.append(message)
            out_d.append(digests[i])
            out_c.append(h)
            while h in children:
                record = children[h]
                out_m.append(record.message)
                out_d.append(message_digest(record.message))
                out_c.append(record.chain_hash)
                h = record.chain_hash
                shifted = True
            parent = h
        return (out_m, out_d, out_c) if shifted else None

    async def append_internal(self, session: SessionRecord, parent: str | None, seq: int, messages: list[dict[str, Any]]) -> str | None:
        """Store the proxy's own rounds after ``parent`` (marked internal); returns the last chain hash."""
        new = []
        for i, message in enumerate(messages):
            h = chain_hash(parent, message_digest(message))
            new.append(NewMessage(chain_hash=h, parent_hash=parent, seq=seq + i, role=str(message.get("role")), message=message, internal=True))
            parent = h
        if new:
            await self.store.append_messages(session.pk, new, now())
        return parent
