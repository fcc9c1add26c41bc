"""The read API of ``storage.store.Store`` (the read routes, the CLI, the archive): ``storage.reads``
queries, each on a connection of its own. Errors are translated by ``Store._read``."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

from sqlalchemy.ext.asyncio import AsyncConnection

from storage import reads, session_lists
from storage.records import (
    ArtifactInfo,
    BranchRecord,
    MessageRecord,
    RequestRecord,
    SessionFilter,
    SessionRecord,
    SessionSummary,
)


class ReadQueries:
    """Mixed into ``Store``: uses its ``_read`` (a connection, errors translated)."""

    def _read(self, operation: str) -> AbstractAsyncContextManager[AsyncConnection]:
        raise NotImplementedError

    async def list_sessions(
        self, tenant: str | None, limit: int, after: str | None = None, after_tenant: str | None = None,
        where: SessionFilter | None = None,
    ) -> tuple[list[SessionSummary], bool]:
        """A keyset page of sessions, newest first, and ``has_more``; see ``reads.list_sessions``.
        ``tenant=None`` is an admin listing of every tenant; ``where`` filters. Raises ``InvalidCursor``."""
        async with self._read("list_sessions") as conn:
            return await reads.list_sessions(conn, tenant, limit, after, after_tenant, where)

    async def find_session(self, session_id: str, tenant: str | None) -> SessionRecord | None:
        """The tenant's session ``session_id`` (``tenant=None``: admin, newest match)."""
        async with self._read("find_session") as conn:
            return await reads.find_session(conn, session_id, tenant)

    async def session_summary(self, session: SessionRecord) -> SessionSummary:
        """Counts, token sums and last model of ``session``."""
        async with self._read("session_summary") as conn:
            return await reads.session_summary(conn, session)

    async def branch_leaf(self, session_pk: int, leaf_hash: str | None) -> MessageRecord | None:
        """The message ``leaf_hash``, or (``None``) the newest leaf of the session."""
        async with self._read("branch_leaf") as conn:
            return await reads.branch_leaf(conn, session_pk, leaf_hash)

    async def list_branch_messages(
        self, session_pk: int, leaf_hash: str, after_seq: int | None, limit: int
    ) -> tuple[list[MessageRecord], bool]:
        """Root-to-``leaf_hash`` messages with ``seq > after_seq``, by seq, and ``has_more``."""
        async with self._read("list_branch_messages") as conn:
            return await reads.list_branch_messages(conn, session_pk, leaf_hash, after_seq, limit)

    async def branch_message_ids(self, session_pk: int, leaf_hash: str) -> list[int]:
        """Ids of the root-to-``leaf_hash`` messages, by seq (for ``messages_by_ids`` pages)."""
        async with self._read("branch_message_ids") as conn:
            return await reads.branch_message_ids(conn, session_pk, leaf_hash)

    async def messages_by_ids(self, session_pk: int, ids: list[int]) -> list[MessageRecord]:
        """The session's messages with these ids, by seq."""
        async with self._read("messages_by_ids") as conn:
            return await reads.messages_by_ids(conn, session_pk, ids)

    async def get_message_by_hash(self, session_pk: int, chain_hash: str) -> MessageRecord | None:
        """The message of the session with this chain hash, or ``None``."""
        async with self._read("get_message_by_hash") as conn:
            return await reads.get_message_by_hash(conn, session_pk, chain_hash)

    async def list_requests(self, session_pk: int, limit: int, after: str | None) -> tuple[list[RequestRecord], bool]:
        """The session's request records, oldest first, and ``has_more``; see ``reads.list_requests``
        (the cursor is looked up in this session only). Raises ``InvalidCursor``."""
        async with self._read("list_requests") as conn:
            return await reads.list_requests(conn, session_pk, limit, after)

    async def list_branches(self, session_pk: int, limit: int, after: str | None) -> tuple[list[BranchRecord], bool]:
        """A page of the session's branches, newest activity first, and ``has_more``; see
        ``session_lists.list_branches`` (``after``: a leaf hash of this session). Raises ``InvalidCursor``."""
        async with self._read("list_branches") as conn:
            return await session_lists.list_branches(conn, session_pk, limit, after)

    async def list_session_artifacts(
        self, session_pk: int, limit: int, after: str | None
    ) -> tuple[list[ArtifactInfo], bool]:
        """A page of the artifacts the session stored, oldest first, and ``has_more``; see
        ``session_lists.list_artifacts`` (``after``: an artifact id of this session). Raises ``InvalidCursor``."""
        async with self._read("list_session_artifacts") as conn:
            return await session_lists.list_artifacts(conn, session_pk, limit, after)
