"""The Dockerfile: multi-stage, slim, non-root, tiktoken baked in, health check, a thin wrapper
around deploy/container/{install,start}.sh (which tests/test_packaging.py runs for real)."""

from __future__ import annotations

import re
import shlex

import pytest

from tests.deploy.conftest import (
    HEALTH_PATHS,
    REPO_DIR,
    check_settings_values,
    unknown_settings,
)


@pytest.fixture(scope="module")
def instructions() -> list[tuple[str, str]]:
    text = (REPO_DIR / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in instructions:
        if word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def test_multi_stage_slim_python_311(instructions: list[tuple[str, str]]) -> None:
    stages = [rest for word, rest in instructions if word == "FROM"]
    assert len(stages) >= 2
    assert all(s.startswith("python:3.11-slim") for s in stages)
    assert any(word == "COPY" and rest.startswith("--from=build") for word, rest in instructions)


def test_runs_as_non_root(instructions: list[tuple[str, str]]) -> None:
    users = [rest for word, rest in instructions if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")


def test_build_runs_the_install_script_and_start_script_is_the_entrypoint(instructions: list[tuple[str, str]]) -> None:
    runs = " ".join(rest for word, rest in instructions if word == "RUN")
    assert "deploy/container/install.sh" in runs
    copies = [rest for word, rest in instructions if word == "COPY"]
    assert "pyproject.toml README.md ./" in copies, "the project is installed from its own pyproject"
    entry = next(rest for word, rest in instructions if word == "ENTRYPOINT")
    start_copy = next(c for c in copies if "start.sh" in c)
    assert start_copy.split()[-1] in entry
    assert next(rest for word, rest in instructions if word == "CMD") == '["serve"]'


def test_environment_names_real_settings_and_bakes_tiktoken(instructions: list[tuple[str, str]]) -> None:
    env = _env(instructions)
    assert unknown_settings(env) == []
    check_settings_values(env)
    assert env["CONTEXT_PROXY_HOST"] == "0.0.0.0"
    assert env["TIKTOKEN_CACHE_DIR"] == env["CONTEXT_PROXY_TIKTOKEN_CACHE_DIR"] == "/opt/context-proxy/tiktoken"
    # install.sh's default tiktoken directory, in the venv copied to the runtime stage.
    install = (REPO_DIR / "deploy/container/install.sh").read_text()
    assert 'TIKTOKEN_DIR="${TIKTOKEN_DIR:-$VENV_DIR/tiktoken}"' in install
    assert env["VENV_DIR"] == "/opt/context-proxy"


def test_healthcheck_probes_healthz_on_the_configured_port(instructions: list[tuple[str, str]]) -> None:
    check = next(rest for word, rest in instructions if word == "HEALTHCHECK")
    assert "CMD" in check and "curl" not in check
    url = re.search(r"'http://127\.0\.0\.1:%s(/\w+)' % os\.environ\.get\('CONTEXT_PROXY_PORT'", check)
    assert url is not None and url.group(1) == "/healthz" and url.group(1) in HEALTH_PATHS
    exposed = [rest for word, rest in instructions if word == "EXPOSE"]
    assert exposed == [_env(instructions)["CONTEXT_PROXY_PORT"]]
