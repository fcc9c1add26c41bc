"""docker-compose.yml: the proxy plus PostgreSQL, consistent with the settings and the image."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import (
    HEALTH_PATHS,
    REPO_DIR,
    check_settings_values,
    unknown_settings,
)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((REPO_DIR / "docker-compose.yml").read_text())


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def test_every_proxy_variable_is_a_setting(compose: dict[str, Any]) -> None:
    env = _env(compose["services"]["proxy"])
    assert unknown_settings(env) == []
    assert [k for k in env if k.startswith("CONTEXT_PROXY_")], "compose sets no proxy settings"
    check_settings_values({k: v for k, v in env.items() if "${" not in v})


def test_proxy_waits_for_a_healthy_postgres_with_a_named_volume(compose: dict[str, Any]) -> None:
    services = compose["services"]
    postgres, proxy = services["postgres"], services["proxy"]
    assert proxy["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    volume = postgres["volumes"][0].split(":")[0]
    assert volume in compose["volumes"], "the database volume must be a named volume"
    # The proxy's database URL names the postgres service and its credentials.
    url = _env(proxy)["CONTEXT_PROXY_DATABASE_URL"]
    pg_env = _env(postgres)
    match = re.fullmatch(r"postgresql://([^:]+):([^@]+)@([^:/]+):(\d+)/(\w+)", url)
    assert match, url
    assert match.groups() == (pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"], "postgres", "5432", pg_env["POSTGRES_DB"])


def test_port_and_healthcheck_agree(compose: dict[str, Any]) -> None:
    proxy = compose["services"]["proxy"]
    port = int(_env(proxy)["CONTEXT_PROXY_PORT"])
    published = [str(p).split(":") for p in proxy["ports"]]
    assert ["8000", str(port)] in published, "the stack serves on host port 8000"
    probe = " ".join(proxy["healthcheck"]["test"])
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", probe)
    assert url and int(url.group(1)) == port and url.group(2) in HEALTH_PATHS
    assert _env(proxy)["CONTEXT_PROXY_HOST"] == "0.0.0.0"


def test_stop_grace_period_exceeds_the_shutdown_grace(compose: dict[str, Any]) -> None:
    proxy = compose["services"]["proxy"]
    grace_s = float(_env(proxy)["CONTEXT_PROXY_SHUTDOWN_GRACE_S"])
    assert int(proxy["stop_grace_period"].rstrip("s")) > grace_s
