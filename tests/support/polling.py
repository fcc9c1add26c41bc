"""Polling with a deadline: every wait in the tests ends.

``wait_for(check, timeout_s=5.0)`` calls ``check()`` every ``interval_s`` until it returns a
truthy value and returns that value; at the deadline it returns the last (falsy) value, so the
caller's ``assert`` shows what was seen. ``wait_for_async`` is the same for a coroutine function
(or a plain function) polled without blocking the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_INTERVAL_S = 0.02


def wait_for(check: Callable[[], T], timeout_s: float = DEFAULT_TIMEOUT_S,
             interval_s: float = DEFAULT_INTERVAL_S) -> T:
    """Poll ``check`` until truthy or ``timeout_s`` seconds passed; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


async def wait_for_async(check: Callable[[], Awaitable[T]] | Callable[[], T], timeout_s: float = DEFAULT_TIMEOUT_S,
                         interval_s: float = DEFAULT_INTERVAL_S) -> T:
    """``wait_for`` on the event loop: ``check`` may be a coroutine function; sleeps with
    ``asyncio.sleep`` between calls."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        value = await result if inspect.isawaitable(result) else result
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(interval_s)
