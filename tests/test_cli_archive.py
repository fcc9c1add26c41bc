"""proxy/cli.py ``archive`` and ``sessions``: the same lines as ``GET /sessions/{id}/archive``, paged
with ``--offset``/``--limit``; sessions listed with their tenant and addressed by it."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from proxy.cli import app
from tests.support.real_server import Proxy
from tests.test_cli import logged_session, runner  # noqa: F401 - fixtures


def test_archive_pages_are_the_rest_documents_lines(runner: CliRunner, logged_session: str, proxy: Proxy) -> None:
    db = ["--database-url", logged_session]
    with proxy.http() as http:
        rest = http.get("/sessions/cli-session/archive").text
    whole = runner.invoke(app, ["archive", "cli-session", *db])
    assert whole.exit_code == 0 and whole.output == rest
    lines = rest.split("\n")[:-1]
    page = runner.invoke(app, ["archive", "cli-session", "--offset", "4", "--limit", "3", *db])
    assert page.exit_code == 0 and page.output.split("\n")[:-1] == lines[4:7]
    tenant = json.loads(runner.invoke(app, ["sessions", "list", "--json", *db]).output)["data"][0]["tenant"]
    assert tenant.startswith("t_")
    assert runner.invoke(app, ["archive", "cli-session", "--tenant", tenant, *db]).output == rest
    shown = json.loads(runner.invoke(app, ["sessions", "show", "cli-session", "--tenant", tenant, *db]).output)
    assert shown["tenant"] == tenant
    missing = runner.invoke(app, ["sessions", "show", "cli-session", "--tenant", "t_nobody", *db])
    assert missing.exit_code == 1 and "t_nobody" in missing.output
    assert runner.invoke(app, ["archive", "cli-session", "--leaf", "0" * 64, *db]).exit_code == 1
