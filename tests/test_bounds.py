"""proxy/bounds.py: the one table of the app's memos and caches names bounds that exist."""

from __future__ import annotations

import importlib
import inspect

import pytest

from proxy.bounds import BOUNDS, Bound
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
    assert len({b.constant for b in BOUNDS}) == len(BOUNDS)
