"""uvicorn's keep-alive timeout with one timer a connection, not one a request.

uvicorn's httptools protocol arms a timer (``loop.call_later(timeout_keep_alive, ...)``) when a
response completes and cancels it at the next bytes of the connection
(``_unset_keepalive_if_required``): a timer made, started, stopped and closed for every request
(about 2 us in uvloop). ``KeepAliveTimer`` keeps the timer armed across requests: a response
completing notes when the connection went idle, bytes arriving note that it is not idle, and the
timer, when it fires, closes the connection only if it has been idle for ``timeout_keep_alive``
seconds; else it is armed again for what is left (idle), or dropped until the next response
completes (a request in progress). The connection closes when uvicorn's would: ``timeout_keep_alive``
seconds after its last response, with no byte since.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class KeepAliveTimer(HttpToolsProtocol):
    """``HttpToolsProtocol`` whose keep-alive timer (``timeout_keep_alive_task``) is kept across
    the requests of a connection (module docstring)."""

    _idle_since: float | None = None
    """Loop time the connection's last response completed with no request after it (``None``: a
    request in progress, or none answered yet)."""

    def _unset_keepalive_if_required(self) -> None:
        """Bytes came (uvicorn calls this from ``data_received``): not idle. The timer stays."""
        self._idle_since = None

    def on_response_complete(self) -> None:
        """uvicorn's (``HttpToolsProtocol.on_response_complete``: the request count, reading
        resumed), the keep-alive timer armed only when none is. A pipelined request waiting:
        uvicorn's own, which starts it (how differs across the versions pyproject admits:
        ``_start_asgi_task`` came in 0.47) and arms no timer (``_unset_keepalive_if_required``
        here: not idle)."""
        if self.pipeline:
            HttpToolsProtocol.on_response_complete(self)
            return
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self._keep_alive_due)

    def _keep_alive_due(self) -> None:
        """The timer fired: uvicorn's ``timeout_keep_alive_handler`` (it closes the connection) once
        idle ``timeout_keep_alive`` seconds; armed again for what is left when idle for less."""
        self.timeout_keep_alive_task = None
        idle_since = self._idle_since
        if idle_since is None:
            return  # a request in progress: its response arms the timer again
        left = idle_since + self.timeout_keep_alive - self.loop.time()
        if left > 0:  # (a millisecond at least: uvloop runs a shorter timer at once, again and again)
            self.timeout_keep_alive_task = self.loop.call_later(max(left, 0.001), self._keep_alive_due)
            return
        self.timeout_keep_alive_handler()

    def connection_lost(self, exc: Exception | None) -> None:
        """uvicorn's, the timer cancelled (it would hold the protocol until it fired)."""
        task = self.timeout_keep_alive_task
        if task is not None:
            task.cancel()
            self.timeout_keep_alive_task = None
        super().connection_lost(exc)
