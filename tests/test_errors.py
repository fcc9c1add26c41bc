"""proxy/errors.py: the tree's envelopes and ``client_error``, the one place an unanswered
exception becomes the client's error (a storage error's 503 included)."""

from __future__ import annotations

import logging

import orjson
import pytest

from proxy.errors import (
    ProxyBusy,
    ProxyError,
    StorageUnavailableError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from proxy.routes.errors import client_error
from storage.errors import StorageError, StorageUnavailable


class _Counter:
    def __init__(self) -> None:
        self.where: list[str] = []

    def database_error(self, where: str) -> None:
        self.where.append(where)


def test_ours_is_answered_as_it_is() -> None:
    busy = ProxyBusy("full")
    assert client_error(busy, _Counter()) is busy
    body = busy.body()
    assert orjson.loads(body) == {"error": {"message": "full", "type": "service_unavailable", "param": None,
                                            "code": "proxy_busy"}}
    assert busy.asgi_headers(body) == [(b"content-type", b"application/json"),
                                       (b"content-length", str(len(body)).encode()), (b"retry-after", b"1")]


@pytest.mark.parametrize("exc", [StorageError("password=secret in the DSN"), StorageUnavailable("down")])
def test_a_storage_error_is_a_503_counted_and_its_text_never_shown(exc: StorageError,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    counter = _Counter()
    with caplog.at_level(logging.ERROR, logger="context_proxy.app"):
        error = client_error(exc, counter)
    assert isinstance(error, StorageUnavailableError) and error.status == 503
    assert error.code == "database_unavailable" and str(exc) not in error.message
    assert counter.where == ["request"]
    assert str(exc) not in caplog.text  # logged by class only


def test_anything_else_is_a_500_without_detail(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="context_proxy.app"):
        error = client_error(RuntimeError("key sk-abcdefghijkl leaked?"), _Counter())
    assert type(error) is ProxyError and error.status == 500 and "sk-" not in error.message


def test_the_upstream_errors_share_one_base() -> None:
    for cls, status, code in ((UpstreamUnreachable, 502, "upstream_unreachable"), (UpstreamTimeout, 504, "upstream_timeout")):
        err = cls("x")
        assert isinstance(err, UpstreamError) and (err.status, err.type, err.code) == (status, "upstream_error", code)
