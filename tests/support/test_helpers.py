"""``tests.support.polling``, ``sockets`` and ``ports``: every wait ends, with what was seen."""

from __future__ import annotations

import socket
import time

import pytest

from tests.support.polling import wait_for, wait_for_async
from tests.support.ports import free_port
from tests.support.sockets import read_response, recv_until


def test_wait_for_returns_the_first_truthy_value_or_the_last_at_the_deadline() -> None:
    calls = iter([0, 0, 7])
    assert wait_for(lambda: next(calls), 5, 0.001) == 7
    started = time.monotonic()
    assert wait_for(list, 0.05, 0.01) == []
    assert time.monotonic() - started < 1


async def test_wait_for_async_takes_coroutines_and_plain_functions() -> None:
    seen: list[int] = []

    async def check() -> int:
        seen.append(1)
        return len(seen) >= 3 and len(seen)

    assert await wait_for_async(check, 5, 0.001) == 3
    assert await wait_for_async(lambda: None, 0.02, 0.005) is None


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_recv_until_fails_when_the_peer_is_silent_or_closes() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhel")
        with pytest.raises(AssertionError, match=r"within 0\.1 s"):
            recv_until(a, lambda got: b"lo" in got, 0.1)
        b.sendall(b"lo")
        b.close()
        with pytest.raises(AssertionError, match="closed the connection first"):
            recv_until(a, lambda got: False, 1)


def test_read_response_reads_head_and_body() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\n")
        b.sendall(b"hello")
        status, head, body = read_response(a, 2)
    assert (status, body) == (404, b"hello") and head.startswith(b"HTTP/1.1 404")
