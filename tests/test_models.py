"""Model profiles: the built-in table by name (prefixes, dates, globs), file overrides, invalid
files, and windows learned from overflow errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.compaction.models import ModelProfile, ModelProfiles, candidate_names


@pytest.fixture(scope="module")
def builtin() -> ModelProfiles:
    return ModelProfiles(None)


@pytest.mark.parametrize(
    ("model", "window", "output"),
    [
        ("gpt-4o", 128_000, 16_384),
        ("gpt-4o-2024-08-06", 128_000, 16_384),
        ("openai/gpt-4o-mini", 128_000, 16_384),
        ("gpt-4.1-mini-2025-04-14", 1_047_576, 32_768),
        ("gpt-5", 400_000, 128_000),
        ("gpt-5-chat-latest", 128_000, 16_384),
        ("o1", 200_000, 100_000),
        ("o3-mini-2025-01-31", 200_000, 100_000),
        ("o4-mini", 200_000, 100_000),
        ("gpt-4-turbo-2024-04-09", 128_000, 4_096),
        ("gpt-4", 8_192, 8_192),
        ("gpt-4-0613", 8_192, 8_192),
        ("gpt-3.5-turbo-0125", 16_385, 4_096),
        ("claude-3-haiku-20240307", 200_000, 4_096),
        ("claude-3-5-sonnet-20241022", 200_000, 8_192),
        ("openrouter/anthropic/claude-3.7-sonnet", 200_000, 64_000),
        ("claude-sonnet-4-20250514", 200_000, 64_000),
        ("claude-opus-4-1-20250805", 200_000, 32_000),
        ("us.anthropic.claude-sonnet-4-20250514-v1:0", 200_000, 64_000),
        ("claude-3-5-sonnet-v2@20241022", 200_000, 8_192),
        ("gemini-1.5-pro-002", 2_097_152, 8_192),
        ("models/gemini-2.0-flash", 1_048_576, 8_192),
        ("gemini-2.5-flash", 1_048_576, 65_536),
        ("deepseek-chat", 131_072, 8_192),
        ("deepseek/deepseek-reasoner", 131_072, 65_536),
        ("Qwen/Qwen2.5-72B-Instruct", 32_768, 8_192),
        ("qwen2.5:7b", 32_768, 8_192),
        ("Qwen/Qwen3-235B-A22B-Instruct-2507", 262_144, None),
        ("meta-llama/Llama-3.3-70B-Instruct", 131_072, None),
        ("Meta-Llama-3.1-8B-Instruct", 131_072, None),
        ("llama3.1:8b", 131_072, None),
        ("llama-3.1-8b-instant", 131_072, None),
        ("llama3-70b-8192", 8_192, None),
        ("accounts/fireworks/models/llama-v3p1-70b-instruct", 131_072, None),
        ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", 1_048_576, None),
        ("mistral-large-latest", 131_072, None),
        ("codestral-2501", 256_000, None),
    ],
)
def test_builtin_table(builtin: ModelProfiles, model: str, window: int, output: int | None) -> None:
    assert builtin.lookup(model) == ModelProfile(window, output, "builtin")


@pytest.mark.parametrize("model", ["fake-2k-openai", "my-finetune", "", "text-davinci-003x"])
def test_unknown_models_have_no_profile(builtin: ModelProfiles, model: str) -> None:
    assert builtin.lookup(model) is None
    assert builtin.resolve(model, None) is None


def test_candidate_names_strip_prefixes_and_dates() -> None:
    assert candidate_names("OpenAI/GPT-4o-2024-08-06") == ["openai/gpt-4o-2024-08-06", "gpt-4o-2024-08-06", "gpt-4o"]
    assert candidate_names("claude-3-5-sonnet@20240620")[-1] == "claude-3-5-sonnet"


def test_yaml_mapping_overrides_builtin_and_adds_globs(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        "fake-16k-*: {context_window_tokens: 16384, max_output_tokens: 1024}\n"
        "fake-16k-special: {context_window_tokens: 12000}\n"
        "gpt-4o: {context_window_tokens: 64000, max_output_tokens: 4096}\n"
        "local-gguf-model: {context_window_tokens: 2048}\n"
    )
    profiles = ModelProfiles(str(path))
    assert profiles.lookup("fake-16k-vllm") == ModelProfile(16384, 1024, "config")
    assert profiles.lookup("fake-16k-special") == ModelProfile(12000, None, "config")  # exact beats glob
    assert profiles.lookup("gpt-4o-2024-11-20") == ModelProfile(64000, 4096, "config")
    assert profiles.lookup("LOCAL-GGUF-MODEL") == ModelProfile(2048, None, "config")
    assert profiles.lookup("gpt-4.1") == ModelProfile(1_047_576, 32_768, "builtin")
    assert profiles.lookup("fake-8k-vllm") is None


def test_json_list_file(tmp_path: Path) -> None:
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": [
        {"pattern": "fake-*", "context_window_tokens": 131072},
        {"model": "fake-2k-*", "context_window_tokens": 2048, "max_output_tokens": None},
    ]}))
    profiles = ModelProfiles(str(path))
    assert profiles.lookup("fake-2k-openai") == ModelProfile(2048, None, "config")  # more literal chars wins
    assert profiles.lookup("fake-32k-openai") == ModelProfile(131072, None, "config")


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("bad.yaml", "gpt-4o: {context_window_tokens: [", "not valid YAML"),
        ("bad.json", "{", "not valid JSON"),
        ("neg.yaml", "gpt-4o: {context_window_tokens: -5}", "positive integer"),
        ("missing.yaml", "gpt-4o: {max_output_tokens: 100}", "context_window_tokens"),
        ("str.yaml", "gpt-4o: {context_window_tokens: '128k'}", "positive integer"),
        ("scalar.yaml", "just a string", "expected a mapping or a list"),
        ("entry.yaml", "gpt-4o: 128000", "must be a mapping"),
        ("nopattern.json", '[{"context_window_tokens": 1000}]', "no pattern"),
    ],
)
def test_invalid_models_file_is_a_clear_error(tmp_path: Path, name: str, text: str, problem: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=problem) as info:
        ModelProfiles(str(path))
    assert str(path) in str(info.value)


def test_missing_models_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        ModelProfiles(str(tmp_path / "nope.yaml"))


def test_learned_window_wins_only_when_smaller(builtin: ModelProfiles) -> None:
    assert builtin.resolve("gpt-4o", None) == ModelProfile(128_000, 16_384, "builtin")
    assert builtin.resolve("gpt-4o", 32_000) == ModelProfile(32_000, 16_384, "learned")
    assert builtin.resolve("gpt-4o", 8_000) == ModelProfile(8_000, 8_000, "learned")  # output capped at the window
    assert builtin.resolve("gpt-4o", 500_000) == ModelProfile(128_000, 16_384, "builtin")
    assert builtin.resolve("fake-2k-openai", 2048) == ModelProfile(2048, None, "learned")
    assert builtin.resolve("fake-2k-openai", 0) is None
