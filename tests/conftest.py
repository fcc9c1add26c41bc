"""Shared fixtures: the shared data directory, a PostgreSQL server the tests start themselves,
and fresh migrated databases on SQLite and PostgreSQL.

The PostgreSQL fixture is our own (not pytest-postgresql's executor): it runs the machine's
``initdb``/``pg_ctl`` as the ``postgres`` user through ``runuser`` when the tests run as root
(initdb refuses root), on a free port, listening on 127.0.0.1 only, with trust authentication,
and removes the cluster at the end of the session. Missing binaries fail the tests (CI installs
them); they are never skipped.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.shared import REPO_DIR, SHARED_DIR

__all__ = ["DATABASES", "REPO_DIR", "SHARED_DIR"]

# ``../shared`` next to the repository: traces, cases, tiktoken's encoding files (README, "Quick
# start"); without it, tests that need them skip with the reason (``tests.support.shared``).
if (SHARED_DIR / "tiktoken").is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED_DIR / "tiktoken"))

pytest_plugins = ("tests.support.inprocess", "tests.support.real_server", "tests.support.anthropic_server")
"""The two tiers' fixtures for every test directory: in-process (``fake_provider``,
``inprocess_factory``, ``inprocess_proxy``) and real servers (``upstream``, ``proxy_factory``,
``proxy``, ``plain_proxy``, ``any_proxy``)."""

DATABASES = [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]
"""Parameters of the ``database_url`` fixture: every storage test runs on both."""


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` next to the repository (traces, tiktoken files); skips if it is absent."""
    if not SHARED_DIR.is_dir():
        pytest.skip(f"shared data directory {SHARED_DIR} is absent (traces and tiktoken files live there)")
    return SHARED_DIR


# --- PostgreSQL server ---------------------------------------------------------------------


def _pg_binary(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    pg_config = shutil.which("pg_config")
    if pg_config:
        bindir = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        candidate = Path(bindir) / name
        if candidate.is_file():
            return str(candidate)
    installed = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)
    if installed:
        return str(installed[0])
    pytest.fail(
        f"PostgreSQL binary {name!r} not found (PATH, pg_config --bindir, /usr/lib/postgresql/*/bin): "
        "install PostgreSQL (e.g. apt-get install postgresql) to run the storage tests",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL cluster for this test session; yields its admin URL
    ``postgresql://postgres@127.0.0.1:PORT/postgres``."""
    initdb, pg_ctl = _pg_binary("initdb"), _pg_binary("pg_ctl")
    as_postgres: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="context-proxy-pg-"))
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("running as root needs a 'postgres' user to run initdb as", pytrace=False)
        os.chown(root, user.pw_uid, user.pw_gid)
        as_postgres = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", free_port()

    def run(*args: str) -> None:
        done = subprocess.run([*as_postgres, *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            log = root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            pytest.fail(f"{args[0]} failed: {done.stderr or done.stdout}\n{tail}", pytrace=False)

    run(initdb, "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
    options = f"-h 127.0.0.1 -p {port} -k {root} -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    run(pg_ctl, "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60", "-o", options, "start")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_postgres, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def _pg_admin(server_url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql)


def _with_database(server_url: str, name: str) -> str:
    return server_url.rsplit("/", 1)[0] + "/" + name


def _migrate(url: str) -> None:
    from storage.migrate import upgrade

    asyncio.run(upgrade(url))


@pytest.fixture(scope="session")
def postgres_template(postgres_server: str) -> str:
    """Name of a migrated template database; test databases are cheap copies of it."""
    name = "context_proxy_template"
    _pg_admin(postgres_server, f"CREATE DATABASE {name}")
    _migrate(_with_database(postgres_server, name))
    return name


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated, empty SQLite file; test databases are copies of it."""
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    _migrate(f"sqlite:///{path}")
    return path


def _fresh_database(request: pytest.FixtureRequest, tmp_path: Path, migrated: bool) -> Iterator[str]:
    if request.param == "sqlite":
        path = tmp_path / "context-proxy.db"
        if migrated:
            shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    server = request.getfixturevalue("postgres_server")
    name = "test_" + uuid.uuid4().hex[:16]
    template = f" TEMPLATE {request.getfixturevalue('postgres_template')}" if migrated else ""
    _pg_admin(server, f"CREATE DATABASE {name}{template}")
    try:
        yield _with_database(server, name)
    finally:
        _pg_admin(server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL (as a user writes it) of a fresh, migrated, empty database: SQLite file or PostgreSQL."""
    yield from _fresh_database(request, tmp_path, migrated=True)


@pytest.fixture(params=DATABASES)
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of a fresh database with no schema at all (for migration tests)."""
    yield from _fresh_database(request, tmp_path, migrated=False)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[object]:
    """An open ``storage.store.Store`` on ``database_url``, closed after the test."""
    from storage.store import Store

    opened = await Store.open(database_url, pool_size=5)
    try:
        yield opened
    finally:
        await opened.close()
