"""Model profiles: each model's context window and output limit, in tokens.

Three sources, strongest last: the built-in table (``models_builtin.yaml``, provider model pages),
the user's models file (``Settings.models_file``), and a window *learned* from a provider's
overflow error ("maximum context length is N tokens", see ``proxy.compaction.overflow``). A learned window
wins only when it is smaller than the configured one: the provider's stated limit is
authoritative, while a larger number in an error (e.g. a total that includes output) must not
loosen a configured limit. Unknown models get ``None``; the caller then applies DESIGN.md's
fallback (trigger at 170,000 tokens, keep 6 messages).

File format (YAML or JSON), either a mapping ``pattern -> {context_window_tokens, max_output_tokens}``
or a list of ``{pattern, context_window_tokens, max_output_tokens}`` (``model`` or ``name`` may
stand for ``pattern``), optionally under a top-level ``models`` key. Patterns are fnmatch globs
(``fake-16k-*``) or exact names, matched case-insensitively.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import orjson
import yaml

Source = Literal["builtin", "config", "learned", "fallback"]


@dataclass(frozen=True)
class ModelProfile:
    """Limits of one model. ``max_output_tokens`` is ``None`` when unknown."""

    context_window_tokens: int
    max_output_tokens: int | None
    source: Source


@dataclass(frozen=True)
class _Rule:
    pattern: str
    profile: ModelProfile
    exact: bool
    literal_chars: int
    order: int


_DATE_SUFFIXES = (
    re.compile(r"-v\d+(:\d+)?$"),  # Bedrock "-v1:0"
    re.compile(r"[-@]\d{8}$"),  # "-20241022", Vertex "@20240620"
    re.compile(r"-\d{4}-\d{2}-\d{2}$"),  # "-2024-08-06"
    re.compile(r"-\d{4}$"),  # "-0613", "-2411"
    re.compile(r"[-:]latest$"),
)
_VENDOR_PREFIX = re.compile(r"^((us|eu|apac|global)\.)?(anthropic|meta|mistral|amazon|cohere|deepseek|qwen)\.")


def candidate_names(model: str) -> list[str]:
    """Names a model is matched under, most literal first: the name as sent (lower case), the
    last path segment (drops ``openai/``, ``openrouter/anthropic/``, ``accounts/x/models/``), that
    without a Bedrock vendor prefix, and that without date/version suffixes."""
    out = [model.strip().lower()]
    name = out[0].rsplit("/", 1)[-1]
    name = _VENDOR_PREFIX.sub("", name)
    out.append(name)
    changed = True
    while changed:
        changed = False
        for suffix in _DATE_SUFFIXES:
            stripped = suffix.sub("", name)
            if stripped != name and stripped:
                name, changed = stripped, True
    out.append(name)
    if ":" in name:  # Ollama tags: "llama3.1:8b"
        out.append(name.split(":", 1)[0])
    return list(dict.fromkeys(out))


def _int_field(entry: dict[str, Any], field: str, where: str, required: bool) -> int | None:
    value = entry.get(field)
    if value is None and not required:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{where}: {field} must be a positive integer, got {value!r}")
    return value


def _parse_rules(data: Any, source: Source, where: str) -> list[_Rule]:
    """Turn a loaded table into rules. Raises ``ValueError`` naming ``where`` and the problem."""
    if isinstance(data, dict) and isinstance(data.get("models"), (list, dict)):
        data = data["models"]
    if data is None:
        return []
    if isinstance(data, dict):
        items = []
        for pattern, entry in data.items():
            if not isinstance(entry, dict):
                raise ValueError(f"{where}: entry {pattern!r} must be a mapping, got {type(entry).__name__}")
            items.append((pattern, entry))
    elif isinstance(data, list):
        items = []
        for i, entry in enumerate(data):
            if not isinstance(entry, dict):
                raise ValueError(f"{where}: item {i} must be a mapping, got {type(entry).__name__}")
            pattern = entry.get("pattern", entry.get("model", entry.get("name")))
            items.append((pattern, entry))
    else:
        raise ValueError(f"{where}: expected a mapping or a list of model profiles, got {type(data).__name__}")
    rules = []
    for order, (pattern, entry) in enumerate(items):
        if not isinstance(pattern, str) or not pattern.strip():
            raise ValueError(f"{where}: entry {order} has no pattern (a model name or glob)")
        at = f"{where}: {pattern!r}"
        window = _int_field(entry, "context_window_tokens", at, required=True)
        output = _int_field(entry, "max_output_tokens", at, required=False)
        assert window is not None
        pattern = pattern.strip().lower()
        wild = sum(pattern.count(c) for c in "*?[]")
        rules.append(
            _Rule(pattern, ModelProfile(window, output, source), wild == 0, len(pattern) - wild, order)
        )
    return rules


LOOKUP_MEMO = 4096
"""Model names whose profile ``ModelProfiles.lookup`` remembers (client-chosen strings: bounded)."""
_MISSING = object()


def _best(rules: list[_Rule], names: list[str]) -> ModelProfile | None:
    """The most specific rule matching any of ``names``: exact names first, then the glob with the
    most literal characters, then the earliest in the table."""
    best: _Rule | None = None
    for rule in rules:
        hit = rule.pattern in names if rule.exact else any(fnmatch.fnmatchcase(n, rule.pattern) for n in names)
        if not hit:
            continue
        rank = (rule.exact, rule.literal_chars, -rule.order)
        if best is None or rank > (best.exact, best.literal_chars, -best.order):
            best = rule
    return best.profile if best else None


def load_table(path: str) -> Any:
    """Load a models file (YAML, or JSON by ``.json`` suffix). Raises ``ValueError`` naming the file."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"models file {path}: cannot read it ({exc.strerror or exc})") from exc
    try:
        if path.endswith(".json"):
            return orjson.loads(text)
        return yaml.safe_load(text)
    except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
        kind = "JSON" if path.endswith(".json") else "YAML"
        raise ValueError(f"models file {path}: not valid {kind}: {exc}") from exc


class ModelProfiles:
    """The model table: built-in profiles overridden by ``models_file`` (see the module docstring).

    Raises ``ValueError`` at construction if ``models_file`` is missing or invalid.
    """

    def __init__(self, models_file: str | None = None) -> None:
        builtin = yaml.safe_load(resources.files("proxy.compaction").joinpath("models_builtin.yaml").read_text())
        self._builtin = _parse_rules(builtin, "builtin", "models_builtin.yaml")
        self._config = (_parse_rules(load_table(models_file), "config", f"models file {models_file}")
                        if models_file else [])
        self._lookups: dict[str, ModelProfile | None] = {}

    def lookup(self, model: str) -> ModelProfile | None:
        """The profile for ``model``: the user's file first, then the built-in table; ``None`` if unknown.

        Memoized per model name (the tables do not change after construction; a scan of every
        glob cost about 0.1 ms a request); at most ``LOOKUP_MEMO`` names are remembered.
        """
        hit = self._lookups.get(model, _MISSING)
        if hit is not _MISSING:
            return hit  # type: ignore[return-value]
        names = candidate_names(model)
        profile = _best(self._config, names) or _best(self._builtin, names)
        if len(self._lookups) >= LOOKUP_MEMO:
            self._lookups.clear()
        self._lookups[model] = profile
        return profile

    def resolve(self, model: str, learned_tokens: int | None) -> ModelProfile | None:
        """``lookup(model)`` corrected by a window learned from the provider's overflow error.

        The learned window wins when the model is unknown or when it is smaller than the
        table's; ``max_output_tokens`` is kept from the table (capped at the learned window).
        """
        profile = self.lookup(model)
        if not learned_tokens or learned_tokens <= 0:
            return profile
        if profile is None:
            return ModelProfile(learned_tokens, None, "learned")
        if learned_tokens >= profile.context_window_tokens:
            return profile
        output = profile.max_output_tokens
        return replace(
            profile,
            context_window_tokens=learned_tokens,
            max_output_tokens=min(output, learned_tokens) if output else output,
            source="learned",
        )
