"""End-to-end tests run on the real-server tier: ``tests.support.real_server`` (registered for the
whole suite by ``tests/conftest.py``) defines the fixtures ``upstream``, ``proxy_factory``,
``proxy``, ``plain_proxy``, ``any_proxy``. The names below are re-exported for the test files
that import them from here; new code imports ``tests.support.real_server``."""

from __future__ import annotations

from tests.support.real_server import CLIENT_KEY, Proxy, Upstream, wait_logged

__all__ = ["CLIENT_KEY", "Proxy", "Upstream", "wait_logged"]
