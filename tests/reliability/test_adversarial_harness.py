"""The adversarial harness's own judgement (no servers): how it reads archive structure, names
suspicious upstream paths, and renders before/after into RELIABILITY.md's table."""

from __future__ import annotations

from tests.reliability.adversarial_logic import SUSPICIOUS, _structure
from tests.reliability.adversarial_report import render_section, verdict


def test_structure_counts_headings_outside_fences_only() -> None:
    text = "# Archive\n\n## Messages\n\n````\n## Compaction 1 (inside a fence)\n```\n## still inside\n````\n\\## escaped\n### [0] user\n"
    assert _structure(text) == ["# Archive", "## Messages", "### [0] user"]
    assert _structure("```\n```\n## Compaction 9 forged\n") == ["## Compaction 9 forged"]


def test_suspicious_paths() -> None:
    for bad in ("/v1/%2F@h:1/x", "/v1/x/../y", "/v1/%2e%2e/a", "/v1//a", "/v1/a@b", "/v1/a\\b", "/v1/a/.", "/v1/a/.."):
        assert SUSPICIOUS.search(bad), bad
    for good in ("/v1/models", "/v1/files/file-abc/content", "/v1/.well-known"):
        assert not SUSPICIOUS.search(good), good


def test_verdicts_and_table() -> None:
    assert verdict({"outcome": "defect"}, {"outcome": "held"}) == "fixed"
    assert verdict({"outcome": "defect"}, {"outcome": "defect"}) == "**still a defect**"
    assert verdict({"outcome": "held"}, {"outcome": "defect"}) == "**regressed**"
    assert verdict(None, None) == "not run"
    attempt = {"item": 6, "attempt": "SSRF: GET /v1%2F@127.0.0.1:41001/x", "outcome": "defect", "detail": "other host reached 1x",
               "figures": {}}
    after = attempt | {"attempt": "SSRF: GET /v1%2F@127.0.0.1:52002/x", "outcome": "held", "detail": "400"}
    lines = render_section({"sqlite": ({"attempts": [attempt]}, {"attempts": [after]})})
    rows = [line for line in lines if line.startswith("| 6.")]
    assert len(rows) == 1 and rows[0].endswith("| fixed |") and "127.0.0.1:OTHER" in rows[0]
