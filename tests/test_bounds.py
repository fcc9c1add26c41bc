"""proxy/bounds.py: the one table of the app's memos and caches names bounds that exist."""

from __future__ import annotations

import importlib
import inspect

import pytest

from proxy.bounds import BOUNDS, Bound
from proxy.conversation.chat_codec import CHAT
from proxy.settings import Settings


def _value(constant: str) -> object:
    if constant.startswith("proxy.settings.Settings."):
        return Settings.model_fields[constant.rsplit(".", 1)[1]].default
    param = None
    if constant.endswith(")"):  # a parameter's default: module.Class(param)
        constant, _, param = constant[:-1].partition("(")
    module, _, name = constant.rpartition(".")
    value = getattr(importlib.import_module(module), name)
    return value if param is None else inspect.signature(value).parameters[param].default


@pytest.mark.parametrize("bound", BOUNDS, ids=lambda b: b.constant)
def test_every_bound_names_a_positive_constant(bound: Bound) -> None:
    value = _value(bound.constant)
    assert isinstance(value, (int, float)) and value > 0, bound


def test_no_memo_is_listed_twice() -> None:
    assert len({(b.what, b.owner) for b in BOUNDS}) == len(BOUNDS)


@pytest.mark.parametrize(("owner", "constant"), [
    ("CodecCounter._recent_tools", "proxy.tokens.priced.RECENT_TOOL_LISTS"),
    ("ProjectingCompactor._locks", "proxy.settings.Settings.max_held_body_bytes"),
    ("Metrics._children", "proxy.telemetry.metrics.MODEL_LABELS"),
    ("Authenticator._tenants", "proxy.routes.auth.TENANTS_KEPT"),
    ("Metrics._served", "proxy.telemetry.metrics.SERVED_KEPT"),
    ("JsonFormatter._access_texts", "proxy.telemetry.logs.ACCESS_TEXTS_KEPT"),
    ("Metrics._latency", "proxy.telemetry.metrics.LATENCY_KEPT"),
])
def test_the_memos_found_later_are_listed(owner: str, constant: str) -> None:
    assert any(b.owner == owner and b.constant == constant for b in BOUNDS)


def test_the_recent_tool_lists_stay_within_their_bound(tmp_path: object) -> None:
    from proxy.tokens.counter import TokenCounter
    from proxy.tokens.priced import RECENT_TOOL_LISTS

    counter = TokenCounter(cache_dir=str(tmp_path))  # no encoding there: the estimate, same memos
    for i in range(RECENT_TOOL_LISTS + 3):
        counter.bind(CHAT).count_tools([{"type": "function", "function": {"name": f"tool_{i}"}}])
    assert len(counter.bind(CHAT)._recent_tools) == RECENT_TOOL_LISTS


def test_the_listed_attributes_are_the_owners_state() -> None:
    from proxy.compaction.compactor import ProjectingCompactor
    from proxy.routes.auth import Authenticator
    from proxy.telemetry.metrics import Metrics

    assert "_children" in vars(Metrics()) and "_served" in vars(Metrics()) and "_latency" in vars(Metrics())
    assert "self._locks" in inspect.getsource(ProjectingCompactor.__init__)
    assert "self._tenants" in inspect.getsource(Authenticator.__init__)
    from proxy.telemetry.logs import JsonFormatter

    assert "_access_texts" in vars(JsonFormatter())
