"""Thresholds (proxy/defenses/config.py): DESIGN.md defaults, fallback, learned limits."""

from __future__ import annotations

import pytest

from proxy.defenses.config import DefenseConfig
from proxy.settings import Settings


def test_from_settings_uses_design_defaults():
    cfg = DefenseConfig.from_settings(Settings(), 32_000)
    assert cfg.trigger_tokens == 27_200 and cfg.keep_tokens == 3_200 and cfg.keep_messages is None
    assert cfg.truncate_args_tools == frozenset({"write_file", "edit_file", "Write", "Edit", "MultiEdit"})
    assert (cfg.truncate_args_max_chars, cfg.truncate_args_keep_chars) == (2000, 20)
    assert cfg.offload_tool_threshold_tokens == 8_000 and cfg.offload_user_tokens == 50_000
    assert cfg.patch_dangling_tool_calls == "compacted" and cfg.enabled


def test_unknown_window_falls_back_to_170000_and_6_messages():
    cfg = DefenseConfig.from_settings(Settings(), None)
    assert cfg.trigger_tokens == 170_000 and cfg.keep_messages == 6 and cfg.keep_tokens is None
    assert cfg.offload_tool_threshold_tokens == 20_000


@pytest.mark.parametrize(
    ("window", "learned", "expected"),
    [(128_000, 8192, 8192), (4096, 8192, 4096), (None, 8192, 8192), (4096, None, 4096)],
)
def test_with_window_keeps_the_smaller_limit(window, learned, expected):
    assert DefenseConfig(context_window_tokens=window).with_window(learned).context_window_tokens == expected
