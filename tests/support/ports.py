"""``free_port()``: a loopback TCP port nothing listens on (bound to port 0, then released).

Another process may take it before the caller binds it; servers the tests run themselves bind
port 0 directly (``tests.fakes.server.UvicornServer``), this is for programs given a ``--port``.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
