"""The provider side: ``client.Upstream`` (pool slots, URLs) over a ``transport.UpstreamTransport``
(``aiohttp_transport`` in production, ``httpx_transport`` for an injected httpx transport);
``headers`` (what goes up and comes back), ``urls`` (where a request may go). Callers see our
``UpstreamError``s only, never aiohttp's or httpx's."""
