"""Shared facts about the application that the deployment files must agree with."""

from __future__ import annotations

from pathlib import Path

from fastapi.routing import APIRoute

from proxy.offline.settings_doc import env_var
from proxy.routes import health
from proxy.settings import Settings

REPO_DIR = Path(__file__).resolve().parents[2]
SETTING_ENV_VARS = frozenset(env_var(name) for name in Settings.model_fields)
"""Every ``CONTEXT_PROXY_*`` variable the settings object reads."""
HEALTH_PATHS = frozenset(r.path for r in health.router.routes if isinstance(r, APIRoute))
"""The probe routes the application serves (``/healthz``, ``/readyz``)."""
DEFAULT_PORT = Settings.model_fields["port"].default


def unknown_settings(names: object) -> list[str]:
    """Names that look like settings (``CONTEXT_PROXY_`` prefix) but are not fields of ``Settings``."""
    return sorted(n for n in names if isinstance(n, str) and n.startswith("CONTEXT_PROXY_") and n not in SETTING_ENV_VARS)


def check_settings_values(env: dict[str, str]) -> None:
    """``Settings`` accepts these values (types parse): raises ``ValidationError`` otherwise."""
    fields = {name: env[env_var(name)] for name in Settings.model_fields if env_var(name) in env}
    Settings(**fields)
