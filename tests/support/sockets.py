"""Raw-socket reads with a deadline: a server that stops talking, or closes early, fails the test
instead of hanging it.

``recv_until(sock, done, timeout_s=10.0)`` reads until ``done(received)`` is true and returns
everything received; raises ``AssertionError`` (with the tail of what came) when the peer closes
first or ``timeout_s`` seconds pass. ``read_response(sock, timeout_s)`` reads one HTTP/1.1
response with a ``content-length`` and returns ``(status, head, body)``. Both leave the socket's
own timeout changed.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def recv_until(sock: socket.socket, done: Callable[[bytes], bool], timeout_s: float = 10.0,
               received: bytes = b"") -> bytes:
    """Bytes from ``sock`` (after ``received``) until ``done`` holds; see the module docstring."""
    deadline = time.monotonic() + timeout_s
    while not done(received):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no complete answer within {timeout_s} s; got {received[-300:]!r}")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            raise AssertionError(f"the peer closed the connection first; got {received[-300:]!r}")
        received += chunk
    return received


def read_response(sock: socket.socket, timeout_s: float = 10.0) -> tuple[int, bytes, bytes]:
    """``(status, head, body)`` of one response framed by ``content-length`` (0 when absent)."""
    deadline = time.monotonic() + timeout_s
    data = recv_until(sock, lambda got: b"\r\n\r\n" in got, timeout_s)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                   if line.lower().startswith(b"content-length:")), 0)
    body = recv_until(sock, lambda got: len(got) >= length, max(deadline - time.monotonic(), 0.001), body)
    return int(head.split(b" ")[1]), head, body
