"""The container image's build and start steps, run for real without a Docker engine.

The build context is assembled from the Dockerfile's own build-stage ``COPY`` lines, then
``deploy/container/install.sh`` (what the build stage runs) installs the project non-editable into
a fresh virtual environment (dependencies from the package index) and bakes tiktoken's files in,
copied from ``TIKTOKEN_SEED_DIR`` (the shared offline copies) instead of downloaded.
``deploy/container/start.sh`` (the image's entrypoint) then serves on a free port against SQLite.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO_DIR, SHARED_DIR
from tests.support.ports import free_port


def _build_stage_copies() -> list[tuple[list[str], str]]:
    """``(sources, destination)`` of each ``COPY`` in the Dockerfile's first stage."""
    text = (REPO_DIR / "Dockerfile").read_text().replace("\\\n", " ")
    copies: list[tuple[list[str], str]] = []
    stages = 0
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "FROM":
            stages += 1
        elif words[0] == "COPY" and stages == 1:
            copies.append((words[1:-1], words[-1]))
    return copies


def _assemble_context(root: Path) -> Path:
    """Copy what the build stage copies, with its WORKDIR (``/src``) mapped to ``root``."""
    root.mkdir()
    for sources, dest in _build_stage_copies():
        for source in sources:
            src = REPO_DIR / source
            target = root / dest / (src.name if dest.endswith("/") else "")
            target.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copyfile(src, target)
    return root


UI_FILES = {p.name for p in (REPO_DIR / "proxy" / "ui").iterdir() if p.is_file()}


def venv_ui(venv: Path) -> Path:
    """The installed ``proxy/ui`` directory of ``venv``."""
    return next(venv.glob("lib/python*/site-packages/proxy/ui"))


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CONTEXT_PROXY_", "PYTHON", "VIRTUAL_ENV", "TIKTOKEN", "PIP_"))}
    return env | extra


@pytest.mark.skipif(not (SHARED_DIR / "tiktoken").is_dir(),
                    reason=f"install.sh would download tiktoken's files: it needs them in {SHARED_DIR / 'tiktoken'}")
def test_install_and_start_scripts_in_a_clean_environment(tmp_path: Path) -> None:
    context = _assemble_context(tmp_path / "src")
    venv = tmp_path / "opt" / "context-proxy"
    install = subprocess.run(
        ["sh", "deploy/container/install.sh", str(context)],
        cwd=context, capture_output=True, text=True, timeout=600, check=False,
        env=_clean_env(VENV_DIR=str(venv), TIKTOKEN_SEED_DIR=str(SHARED_DIR / "tiktoken"), PYTHON=sys.executable),
    )
    assert install.returncode == 0, install.stdout + install.stderr
    # Installed, not linked to the source tree.
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import proxy, storage; print(proxy.__file__, storage.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), check=True).stdout
    assert all(str(venv) in path for path in where.split()), where
    assert len(list((venv / "tiktoken").iterdir())) == 2

    port = free_port()
    start = REPO_DIR / "deploy" / "container" / "start.sh"
    env = _clean_env(VENV_DIR=str(venv), CONTEXT_PROXY_HOST="127.0.0.1", CONTEXT_PROXY_PORT=str(port),
                     CONTEXT_PROXY_DATABASE_URL=f"sqlite:///{tmp_path / 'proxy.db'}",
                     CONTEXT_PROXY_UPSTREAM_URL="http://127.0.0.1:9/v1", CONTEXT_PROXY_SHUTDOWN_GRACE_S="5")
    proc = subprocess.Popen(["sh", str(start)], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "exited"
            try:
                health = httpx.get(url + "/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the proxy did not start"
                time.sleep(0.2)
        assert health.json() == {"status": "ok"}
        ready = httpx.get(url + "/readyz", timeout=5)
        assert ready.status_code == 200 and ready.json()["database"] is True
        # The baked tiktoken files are what the proxy counts with (no download, no estimate).
        families = {f.name: f for f in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=5).text)}
        exact = {s.labels["encoding"]: s.value for s in families["context_proxy_tokenizer_exact"].samples}
        assert exact == {"o200k_base": 1.0}
        # The web viewer's files are package data: the installed proxy serves them.
        for name in ("", "app.js", "style.css"):
            page = httpx.get(f"{url}/ui/{name}", timeout=5)
            assert page.status_code == 200 and page.headers["content-security-policy"], name
        assert (UI_FILES - {p.name for p in (venv_ui(venv)).iterdir()}) == set()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    # The entrypoint runs any other command of the CLI.
    listed = subprocess.run(["sh", str(start), "sessions", "list", "--json"], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert listed.returncode == 0, listed.stderr
    assert '"data": []' in listed.stdout


def test_the_build_context_holds_what_pip_install_needs() -> None:
    sources = [s for srcs, _ in _build_stage_copies() for s in srcs]
    assert {"pyproject.toml", "README.md", "proxy", "storage", "deploy/container"} <= set(sources)
