"""The ``context-proxy`` command (typer): serve, database upgrade, and operator commands.

    context-proxy serve [--host H --port P --upstream-url URL --anthropic-upstream-url URL --database-url URL
                         --log-format json|text]
    context-proxy db upgrade
    context-proxy sessions list [--limit N] [--tenant T] [--json]
    context-proxy sessions show SESSION_ID [--tenant T]
    context-proxy archive SESSION_ID [--tenant T --offset N --limit N]  # as GET /sessions/{id}/archive
    context-proxy retention [--max-age-days N] [--max-bytes-per-tenant N] [--dry-run]
    context-proxy replay TRACE.jsonl --model M [--window N] [--plot FILE.png]

Operator commands read the database directly (``--database-url`` or ``CONTEXT_PROXY_DATABASE_URL``)
with admin scope: every tenant's sessions. Exit status 1 with a message on stderr when a session is
not found or the database cannot be read.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
import typer

from proxy.settings import Settings

if TYPE_CHECKING:  # imported where used: ``--help`` loads no storage
    from storage.records import SessionRecord
    from storage.store import Store

def _typer(text: str) -> typer.Typer:
    """A command group whose help is Markdown: a docstring's paragraphs are reflowed to the terminal."""
    return typer.Typer(help=text, no_args_is_help=True, rich_markup_mode="markdown")


app = _typer("context-proxy: an OpenAI-compatible proxy that keeps agents inside their context window.")
db_app = _typer("Database commands.")
sessions_app = _typer("Browse the stored sessions (all tenants).")
app.add_typer(db_app, name="db")
app.add_typer(sessions_app, name="sessions")
limits_app = _typer("What the proxy learned about models, per tenant: list and reset.")
app.add_typer(limits_app, name="limits")

T = TypeVar("T")
DATABASE_HELP = "sqlite:///PATH or postgresql://… (env CONTEXT_PROXY_DATABASE_URL)."


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with the given non-None command-line values on top. An
    invalid value exits (status 2) with one line per problem, naming the setting, not a traceback."""
    from pydantic import ValidationError

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        for error in exc.errors():
            name = ".".join(str(part) for part in error["loc"])
            typer.echo(f"error: setting {name} (CONTEXT_PROXY_{name.upper()}): {error['msg']}", err=True)
        raise typer.Exit(2) from None


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)


@app.command()
def serve(
    host: str | None = typer.Option(None, help="Address to bind (env CONTEXT_PROXY_HOST, default 127.0.0.1)."),
    port: int | None = typer.Option(None, help="Port (env CONTEXT_PROXY_PORT, default 8000)."),
    upstream_url: str | None = typer.Option(None, help="Provider base URL (env CONTEXT_PROXY_UPSTREAM_URL)."),
    anthropic_upstream_url: str | None = typer.Option(
        None, help="Anthropic Messages provider base URL, no /v1 (env CONTEXT_PROXY_ANTHROPIC_UPSTREAM_URL)."),
    database_url: str | None = typer.Option(None, help=DATABASE_HELP),
    log_format: str | None = typer.Option(None, help="json or text (env CONTEXT_PROXY_LOG_FORMAT, default json)."),
    shutdown_grace_s: float | None = typer.Option(
        None, help="Seconds in-flight streams get after SIGTERM (env CONTEXT_PROXY_SHUTDOWN_GRACE_S)."),
) -> None:
    """Run the proxy (migrates the database at start).

    On SIGTERM or Ctrl-C: stop accepting connections, let in-flight requests and streams finish
    within --shutdown-grace-s seconds, drain the log writes, close the database, exit 0.
    """
    import uvicorn

    from proxy.app import create_app
    from proxy.server.http_guard import server_options
    from proxy.server.process import run
    from proxy.telemetry.logs import configure_logging

    settings = load_settings(host=host, port=port, upstream_url=upstream_url,
                             anthropic_upstream_url=anthropic_upstream_url, database_url=database_url,
                             log_format=log_format, shutdown_grace_s=shutdown_grace_s)
    configure_logging(settings.log_level, settings.log_format, log_message_content=settings.log_message_content)
    # uvicorn handles SIGTERM while serving, then re-raises it once shut down: this handler makes
    # that (and a SIGTERM before uvicorn starts) a clean exit 0, as Kubernetes and Docker expect.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
        **server_options(settings),  # header bounds and deadlines, connection cap, keep-alive
    )
    run(config, gc_young_threshold=settings.gc_young_threshold)  # gc tuned once the app started


@db_app.command("upgrade")
def db_upgrade(
    database_url: str | None = typer.Option(None, help="Database URL (env CONTEXT_PROXY_DATABASE_URL)."),
) -> None:
    """Create or upgrade the schema to the newest migration."""
    from storage.migrate import upgrade

    settings = load_settings(database_url=database_url)
    asyncio.run(upgrade(settings.database_url))
    typer.echo("database is at the newest migration")


# --- operator commands over the store --------------------------------------------------------


def _with_store(database_url: str | None, use: Callable[[Store], Awaitable[T]]) -> T:
    """Run ``use(store)`` on a store opened on the configured database; storage errors exit 1."""
    from storage.errors import StorageError
    from storage.store import Store

    settings = load_settings(database_url=database_url)

    async def run() -> T:
        store = await Store.open(settings.database_url, pool_size=1)
        try:
            return await use(store)
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except StorageError as exc:
        typer.echo(f"error: cannot read the database: {exc}", err=True)
        raise typer.Exit(1) from exc


TENANT_HELP = "The session's tenant (t_…, as `sessions list` shows it); default: the newest session of that id."


async def _find(store: Store, session_id: str, tenant: str | None = None) -> SessionRecord:
    session = await store.find_session(session_id, tenant)
    if session is None:
        typer.echo(f"error: no session {session_id!r}" + (f" of tenant {tenant!r}" if tenant else ""), err=True)
        raise typer.Exit(1)
    return session


@sessions_app.command("list")
def sessions_list(
    limit: int = typer.Option(20, min=1, max=1000, help="Sessions to show, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print the API's list object instead of a table."),
    tenant: str | None = typer.Option(None, help="Only this tenant's sessions (t_…)."),
    after: str | None = typer.Option(None, help="Start after this session: the cursor the previous page printed "
                                     "(TENANT:SESSION_ID, as GET /sessions' last_id for admins)."),
    database_url: str | None = typer.Option(None, help=DATABASE_HELP),
) -> None:
    """Sessions, newest first: id, tenant, messages, requests, compactions, tokens sent and forwarded."""
    from proxy.routes.read import admin_cursor, session_json, session_page
    from storage.errors import InvalidCursor

    async def page(store: Store) -> tuple[list[Any], bool] | None:
        try:
            return await session_page(store, tenant, limit, after, True)
        except InvalidCursor:  # a StorageError, which _with_store reports as an unreadable database
            return None

    found = _with_store(database_url, page)
    if found is None:
        of_tenant = f" of tenant {tenant!r}" if tenant else ""
        typer.echo(f"error: --after {after!r} names no session{of_tenant}", err=True)
        raise typer.Exit(1)
    rows, has_more = found
    data = [session_json(s, admin=True) for s in rows]
    cursors = [admin_cursor(s) for s in rows]
    if as_json:
        listing = {"object": "list", "data": data, "first_id": cursors[0] if cursors else None,
                   "last_id": cursors[-1] if cursors else None, "has_more": has_more}
        typer.echo(orjson.dumps(listing, option=orjson.OPT_INDENT_2).decode())
        return
    typer.echo(f"{'session':<40} {'tenant':<36} {'msgs':>6} {'reqs':>6} {'events':>6} "
               f"{'tokens client':>14} {'forwarded':>12}  last model")
    for s in data:
        typer.echo(f"{s['id']:<40} {s['tenant']:<36} {s['message_count']:>6} {s['request_count']:>6} "
                   f"{s['event_count']:>6} "
                   f"{s['tokens_client_total']:>14,} {s['tokens_forwarded_total']:>12,}  {s['last_model'] or '-'}")
    if has_more:
        typer.echo(f"(more sessions: --after '{cursors[-1]}')")


@sessions_app.command("show")
def sessions_show(
    session_id: str = typer.Argument(..., help="The session id (X-Session-Id or the derived sess_…)."),
    tenant: str | None = typer.Option(None, help=TENANT_HELP),
    database_url: str | None = typer.Option(None, help=DATABASE_HELP),
) -> None:
    """One session as JSON: counts, tokens, timestamps, branches, and its compaction events."""
    from proxy.routes.read import event_json, session_json

    async def use(store: Store) -> dict[str, Any]:
        session = await _find(store, session_id, tenant)
        out = session_json(await store.session_summary(session), admin=True)
        events = await store.list_events(session.pk)
        out["events"] = [event_json(e) | {"payload": _short_payload(e.payload)} for e in events]
        return out

    typer.echo(orjson.dumps(_with_store(database_url, use), option=orjson.OPT_INDENT_2).decode())


@limits_app.command("list")
def limits_list(
    tenant: str | None = typer.Option(None, help="Only this tenant (t_…, as the read API shows it)."),
    model: str | None = typer.Option(None, help="Only this model."),
    limit: int = typer.Option(100, min=1, max=10_000, help="Rows to show, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print the API's list object instead of a table."),
    database_url: str | None = typer.Option(None, help=DATABASE_HELP),
) -> None:
    """Learned limits: the window learned from the provider, the estimate ratio, source, expiry."""
    from proxy.routes.limits import limit_json

    rows = _with_store(database_url, lambda store: store.list_learned_limits(tenant=tenant, model=model, limit=limit))
    data = [limit_json(r) for r in rows]
    if as_json:
        typer.echo(orjson.dumps({"object": "list", "data": data}, option=orjson.OPT_INDENT_2).decode())
        return
    typer.echo(f"{'tenant':<36} {'model':<32} {'window':>9} {'ratio':>6} {'source':<9} expires")
    now = datetime.now(UTC)
    for r in rows:
        window = f"{r.context_window_tokens:,}" if r.context_window_tokens is not None else "-"
        ratio = f"{r.estimate_ratio:.2f}" if r.estimate_ratio is not None else "-"
        expires = r.expires_at.isoformat(timespec="seconds") if r.expires_at is not None else "-"
        if r.expires_at is not None and r.expires_at <= now:
            expires += " (expired: not used)"
        typer.echo(f"{r.tenant:<36} {r.model[:32]:<32} {window:>9} {ratio:>6} {r.source or '-':<9} {expires}")


@limits_app.command("reset")
def limits_reset(
    tenant: str | None = typer.Option(None, help="Only this tenant's."),
    model: str | None = typer.Option(None, help="Only this model's."),
    everything: bool = typer.Option(False, "--all", help="Every learned limit (needed when no filter is given)."),
    database_url: str | None = typer.Option(None, help=DATABASE_HELP),
) -> None:
    """Forget learned limits; running proxies re-read theirs within a minute (or DELETE /limits)."""
    if tenant is None and model is None and not everything:
        typer.echo("error: give --tenant and/or --model, or --all to forget every learned limit", err=True)
        raise typer.Exit(2)
    deleted = _with_store(database_url, lambda store: store.delete_learned_limits(tenant=tenant, model=model))
    typer.echo(f"forgot {deleted} learned limit{'s' if deleted != 1 else ''}")


def _short_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """An event payload with the summary text cut to its first 200 chars (the archive has it all)."""
    summary = payload.get("summary")
    if isinstance(summary, str) and len(summary) > 200:
        return payload | {"summary": summary[:200] + f"… ({len(summary)} chars)"}
    return payload


@app.command()
def archive(
    session_id: str = typer.Argument(..., help="The session id."),
    leaf: str | None = typer.Option(None, help="Chain hash of the branch's last message (default: newest branch)."),
    tenant: str | None = typer.Option(None, help=TENANT_HELP),
    offset: int = typer.Option(0, min=0, help="First line to print (0-based)."),
    limit: int | None = typer.Option(None, min=1, help="Lines to print (default: to the end)."),
    database_url: str | None = typer.Option(None, help=DATABASE_HELP),
) -> None:
    """Print a session's archive (Markdown, as GET /sessions/{id}/archive): the log in order, a
    block per compaction where it happened; streamed page by page, lines numbered from 0."""
    from proxy.tools.archive import stream_archive_lines

    async def use(store: Store) -> None:
        session = await _find(store, session_id, tenant)
        tip = await store.branch_leaf(session.pk, leaf)
        if tip is None and leaf is not None:
            typer.echo(f"error: no message {leaf!r} in session {session_id!r}", err=True)
            raise typer.Exit(1)
        end = None if limit is None else offset + limit
        n = 0
        tip_hash = None if tip is None else tip.chain_hash
        async for line in stream_archive_lines(store, session.session_id, session.pk, tip_hash):
            if end is not None and n >= end:
                break
            if n >= offset:
                typer.echo(line)
            n += 1

    _with_store(database_url, use)


@app.command()
def retention(
    max_age_days: float | None = typer.Option(
        None, min=0, help="Delete sessions idle this long (env CONTEXT_PROXY_RETENTION_MAX_AGE_DAYS)."),
    max_bytes_per_tenant: int | None = typer.Option(
        None, min=0, help="Per-tenant byte cap (env CONTEXT_PROXY_RETENTION_MAX_BYTES_PER_TENANT)."),
    batch_size: int | None = typer.Option(
        None, min=1, help="Rows per delete transaction (env CONTEXT_PROXY_RETENTION_BATCH_SIZE)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Report what would be deleted; delete nothing."),
    database_url: str | None = typer.Option(None, help=DATABASE_HELP),
) -> None:
    """Delete old sessions (and a tenant's oldest past its byte cap) with their messages, events,
    requests and artifacts, in short batches. Prints the counts as JSON."""
    from storage.errors import StorageError
    from storage.retention import RetentionPolicy, run_retention

    settings = load_settings(database_url=database_url, retention_max_age_days=max_age_days,
                             retention_max_bytes_per_tenant=max_bytes_per_tenant, retention_batch_size=batch_size)
    policy = RetentionPolicy(settings.retention_max_age_days, settings.retention_max_bytes_per_tenant,
                             settings.retention_batch_size)
    if policy.max_age_days is None and policy.max_bytes_per_tenant is None:
        typer.echo("error: nothing to do: give --max-age-days and/or --max-bytes-per-tenant", err=True)
        raise typer.Exit(2)
    try:
        report = asyncio.run(run_retention(settings.database_url, policy, dry_run=dry_run))
    except StorageError as exc:
        typer.echo(f"error: retention failed: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(orjson.dumps(report.as_dict(), option=orjson.OPT_INDENT_2).decode())


@app.command()
def replay(
    trace: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSONL trace: one chat message per line."),
    model: str = typer.Option(..., help="Model the agent used (picks the context window from the model profiles)."),
    window: int | None = typer.Option(None, min=256, help="Context window in tokens (overrides the model profile)."),
    plot: Path | None = typer.Option(None, help="Write a PNG of tokens per turn with and without the proxy."),
    turns: bool = typer.Option(True, "--turns/--no-turns", help="Print one line per turn."),
) -> None:
    """Replay a recorded conversation through the projection offline and print what the proxy saves.

    No upstream is called: summaries come from a deterministic local summarizer, so the numbers
    are an offline estimate (cutoffs and token counts as the proxy computes them).
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from proxy.offline.replay import OFFLINE_LABEL, load_trace
    from proxy.offline.replay import replay as run_replay

    if plot is not None:  # before the replay, which may take minutes
        try:
            from proxy.offline.plot import plot_replay
        except ImportError as exc:  # matplotlib is the optional 'plot' extra
            typer.echo("error: --plot needs matplotlib: pip install matplotlib "
                       "(or, in a checkout of context-proxy, pip install -e '.[plot]')", err=True)
            raise typer.Exit(1) from exc
    settings = load_settings()
    try:
        messages = load_trace(trace)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    with Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), console=Console(stderr=True),
                  transient=True) as progress:
        task = progress.add_task("replay", total=None)
        report = run_replay(messages, model=model, settings=settings, window_tokens=window,
                            on_turn=lambda _r, total: progress.update(task, advance=1, total=total))
    _print_report(report, trace, turns, OFFLINE_LABEL)
    if plot is not None:
        plot_replay(report, plot, title=f"{trace.name} ({model})")
        typer.echo(f"plot written to {plot}")


def _print_report(report: Any, trace: Path, turns: bool, label: str) -> None:
    window = f"{report.window_tokens:,} tokens" if report.window_tokens else "unknown (fallback thresholds)"
    typer.echo(f"# {trace.name}: {len(report.turns)} requests, model {report.model}, context window {window}")
    typer.echo(f"# {label}" + ("" if report.exact_tokens else "; tiktoken unavailable, tokens estimated from bytes"))
    if turns:
        typer.echo(f"{'turn':>5} {'msgs':>5} {'without proxy':>14} {'with proxy':>11} {'saved':>6}  "
                   "compactions  overflow")
        for t in report.turns:
            saved = 1 - t.tokens_with / t.tokens_without if t.tokens_without else 0.0
            over = ("without" if t.overflow_without else "") + ("+WITH" if t.overflow_with else "")
            typer.echo(f"{t.turn:>5} {t.message_count:>5} {t.tokens_without:>14,} {t.tokens_with:>11,} {saved:>6.0%}  "
                       f"{','.join(t.compactions) or '-':<11}  {over or '-'}")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(report.compactions.items())) or "none"
    typer.echo("total:")
    typer.echo(f"  prompt tokens without the proxy: {report.tokens_without:,}")
    typer.echo(f"  prompt tokens with the proxy:    {report.tokens_with:,} ({report.saved_fraction:.1%} saved)")
    typer.echo(f"  summary calls the proxy would make: {report.summary_calls} "
               f"({report.summary_input_tokens:,} input tokens)")
    typer.echo(f"  compactions: {kinds}")
    applied = ", ".join(f"{k} {v}" for k, v in sorted(report.defenses_applied.items())) or "none"
    typer.echo(f"  requests changed, by defense: {applied}")
    typer.echo(f"  requests over the window: {report.overflows_without} without the proxy, "
               f"{report.overflows_with} with it")


if __name__ == "__main__":  # pragma: no cover
    app()
