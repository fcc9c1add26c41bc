"""Raw HTTP/1.1 over sockets, for tests where the bytes matter (issue 16, items 6 and 7).

``RawServer(reply)``: a listener on a free loopback port, in a daemon thread, that records every
connection and request it gets (``connections``, ``requests``: the raw head and body) and answers
each request with ``reply(head)`` (bytes of a whole response; the connection is then closed).
``raw_request(port, head)``: send ``head`` (a request with its headers, no body) as written, with
no client library to re-encode the target, and return ``(status, headers, body)``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence
from typing import Self


class RawServer:
    def __init__(self, reply: Callable[[bytes], bytes]) -> None:
        self.reply = reply
        self.connections = 0
        self.requests: list[bytes] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name=f"raw-{self.port}", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    body += chunk
                self.requests.append(head + b"\r\n\r\n" + body)
                conn.sendall(self.reply(head))
            except OSError:
                return

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def response(status: int, body: bytes, headers: Sequence[tuple[str, str]] = (), content_type: str = "application/json") -> bytes:
    """A whole HTTP/1.1 response that closes its connection."""
    lines = [f"HTTP/1.1 {status} X", f"content-type: {content_type}", f"content-length: {len(body)}", "connection: close",
             *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def raw_request(port: int, head: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` (request line and headers, CRLF-separated, without the blank line) and
    ``body`` to ``127.0.0.1:port``; ``(status, headers (lower-case names, last wins), body)``."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        extra = f"\r\ncontent-length: {len(body)}" if body else ""
        sock.sendall((head + extra + "\r\nconnection: close\r\n\r\n").encode("latin-1") + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    raw_head, _, raw_body = data.partition(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        raw_body = _unchunk(raw_body)
    return int(lines[0].split()[1]), headers, raw_body


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2:]
    return out
