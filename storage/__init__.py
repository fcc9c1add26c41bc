"""Storage of context-proxy: SQLAlchemy Core tables, the async ``Store``, alembic migrations.

All SQL lives in this package; it never imports ``proxy``. Entry points: ``storage.store.Store``,
``storage.migrate.upgrade``, ``storage.engine.make_async_url``.
"""
