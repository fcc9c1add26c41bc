"""The ``context-proxy`` command (typer): serve, database upgrade, and operator commands."""

from __future__ import annotations

import asyncio
from typing import Any

import typer

from proxy.settings import Settings

app = typer.Typer(help="context-proxy: an OpenAI-compatible proxy that keeps agents inside their context window.", no_args_is_help=True)
db_app = typer.Typer(help="Database commands.", no_args_is_help=True)
app.add_typer(db_app, name="db")


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with the given non-None command-line values on top."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


@app.command()
def serve(
    host: str | None = typer.Option(None, help="Address to bind [env CONTEXT_PROXY_HOST, default 127.0.0.1]."),
    port: int | None = typer.Option(None, help="Port [env CONTEXT_PROXY_PORT, default 8000]."),
    upstream_url: str | None = typer.Option(None, help="Provider base URL [env CONTEXT_PROXY_UPSTREAM_URL]."),
    database_url: str | None = typer.Option(None, help="sqlite:///PATH or postgresql://… [env CONTEXT_PROXY_DATABASE_URL]."),
) -> None:
    """Run the proxy."""
    import uvicorn

    from proxy.app import create_app

    settings = load_settings(host=host, port=port, upstream_url=upstream_url, database_url=database_url)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        timeout_graceful_shutdown=30,
    )


@db_app.command("upgrade")
def db_upgrade(database_url: str | None = typer.Option(None, help="Database URL [env CONTEXT_PROXY_DATABASE_URL].")) -> None:
    """Create or upgrade the schema to the newest migration."""
    from storage.migrate import upgrade

    settings = load_settings(database_url=database_url)
    asyncio.run(upgrade(settings.database_url))
    typer.echo("database is at the newest migration")


if __name__ == "__main__":  # pragma: no cover
    app()
