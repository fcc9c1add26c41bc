"""The proxy's own tools: ``read_tool`` (read and search stored content), ``search`` (the search
itself), ``archive`` (a session rendered as text), ``own_tools`` (keeping the proxy's calls from
the client)."""
