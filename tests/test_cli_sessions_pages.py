"""proxy/cli.py ``sessions list --after``: pages through every tenant's sessions by the cursor the
previous page printed, also where two tenants use one session id (issue 16 item 14)."""

from __future__ import annotations

import json
from collections.abc import Callable

from typer.testing import CliRunner

from proxy.cli import app
from tests.e2e.test_read_api import settled
from tests.e2e.test_read_api_sessions import OTHER_KEY, chat
from tests.support.real_server import Proxy
from tests.test_cli import runner  # noqa: F401 - fixtures


def test_sessions_list_pages_by_cursor_across_tenants_sharing_an_id(
    runner: CliRunner, proxy_factory: Callable[..., Proxy]
) -> None:
    proxy = proxy_factory(compaction_enabled=False)
    with proxy.http() as a, proxy.http(OTHER_KEY) as b:
        for key, http, session_id in [(None, a, "Y"), (None, a, "X"), (OTHER_KEY, b, "X"), (None, a, "W")]:
            chat(proxy.client() if key is None else proxy.client(key), session_id, "hi " + session_id)
            settled(http, session_id, 1)
    db = ["--database-url", proxy.settings.database_url]
    everyone = json.loads(runner.invoke(app, ["sessions", "list", "--json", *db]).output)["data"]
    assert [s["id"] for s in everyone] == ["W", "X", "X", "Y"]
    seen, after = [], []
    for _ in everyone:
        result = runner.invoke(app, ["sessions", "list", "--json", "--limit", "1", *after, *db])
        assert result.exit_code == 0, result.output
        page = json.loads(result.output)
        seen += [(s["tenant"], s["id"]) for s in page["data"]]
        assert page["last_id"] == f"{page['data'][-1]['tenant']}:{page['data'][-1]['id']}"
        if not page["has_more"]:
            break
        after = ["--after", page["last_id"]]
    assert seen == [(s["tenant"], s["id"]) for s in everyone]
    table = runner.invoke(app, ["sessions", "list", "--limit", "2", *db])
    assert table.exit_code == 0 and f"--after '{everyone[1]['tenant']}:X'" in table.output
    missing = runner.invoke(app, ["sessions", "list", "--after", "t_nobody:X", *db])
    assert missing.exit_code == 1 and "names no session" in missing.output
