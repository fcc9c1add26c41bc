"""proxy/offline/settings_doc.py: the README's configuration reference is generated from ``Settings``."""

from __future__ import annotations

from pathlib import Path

from proxy.offline.settings_doc import (
    MARKER_END,
    MARKER_START,
    REGENERATE_COMMAND,
    extract_block,
    main,
    render_table,
)
from proxy.settings import Settings

REPO_DIR = Path(__file__).resolve().parent.parent


def test_one_row_per_setting_with_variable_default_and_meaning() -> None:
    rows = render_table().splitlines()[2:]
    assert len(rows) == len(Settings.model_fields)
    by_name = {row.split("|")[1].strip(" `"): [c.strip() for c in row.split("|")[2:-1]] for row in rows}
    assert by_name["port"] == ["`CONTEXT_PROXY_PORT`", "`8000`", "Port to bind."]
    assert by_name["upstream_api_key"][1] == "(unset)"
    assert by_name["compaction_enabled"][1] == "`true`"
    assert by_name["client_api_keys"][1] == '`""`'
    assert all(cells[2] for cells in by_name.values()), "every setting needs a description"
    assert "|" not in by_name["patch_dangling_tool_calls"][2].replace("\\|", "")


def test_write_and_check_modes(tmp_path: Path) -> None:
    doc = tmp_path / "README.md"
    doc.write_text(f"# Title\n\n{MARKER_START}\nold table\n{MARKER_END}\n\nafter\n")
    assert main(["--check", str(doc)]) == 1
    assert main(["--write", str(doc)]) == 0
    text = doc.read_text()
    assert extract_block(text) == render_table()
    assert text.startswith("# Title\n\n") and text.endswith(f"{MARKER_END}\n\nafter\n")
    assert main(["--check", str(doc)]) == 0
    assert main(["--write"]) == 2


def test_readme_configuration_reference_is_current() -> None:
    readme = REPO_DIR / "README.md"
    assert readme.is_file(), "README.md is missing"
    block = extract_block(readme.read_text(encoding="utf-8"))
    assert block is not None, f"README.md lacks the markers {MARKER_START} / {MARKER_END}"
    assert block == render_table(), f"README.md's configuration reference is stale; regenerate it with: {REGENERATE_COMMAND}"
