"""The configuration reference (a Markdown table), generated from ``proxy.settings.Settings``.

    python -m proxy.offline.settings_doc                    # print the table
    python -m proxy.offline.settings_doc --write README.md  # replace the block between the markers
    python -m proxy.offline.settings_doc --check README.md  # exit 1 if the block is stale

The block in the README lies between ``MARKER_START`` and ``MARKER_END``; a test compares it with
``render_table()`` so the documentation cannot drift from the settings object.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic_core import PydanticUndefined

from proxy.settings import Settings

MARKER_START = "<!-- settings:start -->"
MARKER_END = "<!-- settings:end -->"
REGENERATE_COMMAND = "python -m proxy.offline.settings_doc --write README.md"


def env_var(field_name: str) -> str:
    """The environment variable of a setting: ``CONTEXT_PROXY_`` + the field name in upper case."""
    prefix = str(Settings.model_config.get("env_prefix", ""))
    return (prefix + field_name).upper()


def _default(value: Any) -> str:
    if value is PydanticUndefined:
        return "(required)"
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str) and value == "":
        return '`""`'
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table() -> str:
    """The Markdown table: one row per setting, in declaration order (setting, environment
    variable, default, meaning). Ends with a newline."""
    rows = ["| Setting | Environment variable | Default | Meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        rows.append(
            f"| `{name}` | `{env_var(name)}` | {_cell(_default(field.default))} | {_cell(field.description or '')} |"
        )
    return "\n".join(rows) + "\n"


def extract_block(text: str) -> str | None:
    """The text between the markers (without them, stripped of surrounding blank lines), or
    ``None`` when either marker is missing."""
    start, end = text.find(MARKER_START), text.find(MARKER_END)
    if start < 0 or end < start:
        return None
    return text[start + len(MARKER_START) : end].strip("\n") + "\n"


def replace_block(text: str, table: str) -> str:
    """``text`` with the block between the markers replaced by ``table``.

    Raises ``ValueError`` if the markers are missing (add them where the reference belongs)."""
    start, end = text.find(MARKER_START), text.find(MARKER_END)
    if start < 0 or end < start:
        raise ValueError(f"markers {MARKER_START} ... {MARKER_END} not found")
    return text[: start + len(MARKER_START)] + "\n" + table + text[end:]


def main(argv: list[str]) -> int:
    """Command-line entry (see the module docstring); returns the exit status."""
    if not argv:
        sys.stdout.write(render_table())
        return 0
    if len(argv) != 2 or argv[0] not in ("--write", "--check"):
        sys.stderr.write("usage: python -m proxy.offline.settings_doc [--write FILE | --check FILE]\n")
        return 2
    path = Path(argv[1])
    text = path.read_text(encoding="utf-8")
    if argv[0] == "--check":
        if extract_block(text) != render_table():
            sys.stderr.write(f"{path}: configuration reference is stale; run: {REGENERATE_COMMAND}\n")
            return 1
        return 0
    path.write_text(replace_block(text, render_table()), encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
