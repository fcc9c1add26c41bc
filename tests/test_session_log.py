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


def test_a_forked_process_never_repeats_the_parents_ids() -> None:
    """Random bytes are read ahead (``_Entropy``): a child forked with some left over must not
    hand out the ones its parent hands out next."""
    import os

    new_id("req")  # the parent has bytes read ahead
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id's random part, then exit at once
        try:
            os.write(write, new_id("req")[-12:].encode())
        finally:
            os._exit(0)
    os.close(write)
    parent = new_id("req")[-12:]
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert len(child) == 12 and child != parent
