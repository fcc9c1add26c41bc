"""Helpers shared by the test tiers (one copy each).

- ``polling``: ``wait_for`` / ``wait_for_async``, polling with a deadline.
- ``ports``: ``free_port()``, a loopback port nothing listens on.
- ``asgi``: ``StreamingASGITransport`` (an httpx transport that runs an ASGI app in-process and
  streams its body) and ``LifespanManager`` (runs an app's ASGI lifespan).
- ``inprocess``: the in-process tier: the proxy app and the fake provider joined by those
  transports, no sockets (fixtures ``fake_provider``, ``inprocess_factory``, ``inprocess_proxy``;
  see that module's docstring).
- ``sockets``: ``recv_until`` / ``read_response``, raw-socket reads with a deadline.
- ``real_server``: the real-server tier (fixtures ``upstream``, ``proxy_factory``, ``proxy``,
  ``plain_proxy``, ``any_proxy``; ``wait_logged``).
- ``shared``: the test data of ``../shared`` (encodings, traces, cases) and the markers that skip,
  with the reason, the tests that need it when it is absent.
"""
