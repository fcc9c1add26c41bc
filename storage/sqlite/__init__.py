"""How ``storage.store.Store`` runs on a SQLite file, behind the same interface as on PostgreSQL.

- ``file``: ``SqliteFile``, the engines and threads of one file: small transactions inline on the
  event loop's thread, others on store threads; WAL checkpoints.
- ``batch``: ``DeferredBatch``, small writes nothing waits on but a future, committed together.
- ``end_write``: ``SqliteEndWrite``, the end-of-request write (``Store.append_and_record``)
  queued in the batch and run by driver statements.
- ``driver``: ``DriverStatement``, a SQLAlchemy statement compiled once, run on ``sqlite3``.
"""
