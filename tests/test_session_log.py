"""proxy/session_log.py helpers."""

from __future__ import annotations

import random

from proxy.session_log import new_id


def test_request_ids_stay_unique_whatever_seeds_random() -> None:
    """Hypothesis (and some libraries) reseed ``random``: ids drawn from it repeated, and a
    repeated request id failed that request's log write (a primary key)."""
    ids = set()
    try:
        for _ in range(50):
            random.seed(0)
            ids.add(new_id("req"))
    finally:
        random.seed()  # from system entropy again: later tests get no fixed sequence
    assert len(ids) == 50 and all(i.startswith("req_") and len(i) == 28 for i in ids)

