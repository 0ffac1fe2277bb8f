"""``bandpilot api`` (the REST API and dashboard) and ``bandpilot tokens ...`` (per-tenant bearer tokens).

Token commands need shell access to the store: they are how the first admin token is made."""

from __future__ import annotations

import getpass
import json
from typing import Optional

import typer

from bandpilot.cli.common import cli_store
from bandpilot.cli.main import app

tokens_app = typer.Typer(help="API bearer tokens: create, list, revoke (stored hashed in the queue store).",
                         no_args_is_help=True)
app.add_typer(tokens_app, name="tokens")

STORE_OPT = typer.Option(None, "--store", envvar="BANDPILOT_STORE", help="Store URL (sqlite:///FILE, a file path or postgresql://...).")


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no passwd entry (containers)
        return "cli"


@app.command("api")
def api_cmd(
    store: Optional[str] = STORE_OPT,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0 for every interface)."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port to listen on."),
    sample_s: float = typer.Option(60.0, "--sample-s", min=0.0, help="Fragmentation sample period (0: only after batches)."),
    workers: int = typer.Option(1, "--workers", min=1, max=64, help="Server processes (PostgreSQL stores)."),
    token_ttl: float = typer.Option(5.0, "--token-ttl", min=0.0,
                                    help="Seconds a valid token is trusted without a lookup; revocations elsewhere take this long."),
    dispatch_s: float = typer.Option(10.0, "--dispatch-s", min=0.0, envvar="BANDPILOT_DISPATCH_S",
                                     help="Run a batch this often when something pending fits (0: off, "
                                          "when `bandpilot serve` or `bandpilot dispatch` assigns instead)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model for the batches (default: models:/bandpilot-CLUSTER@champion)."),
    profile: str = typer.Option("recommended", "--profile", help="Scheduler profile of the batches: recommended | slurm-like | fifo-greedy, or a profile YAML file (docs/guide/profiles.md)."),
) -> None:
    """Serve the REST API (OpenAPI docs at /docs) and the web dashboard (/) until SIGTERM or Ctrl-C;
    pending requests are assigned every --dispatch-s seconds with the cluster's champion model."""
    from bandpilot.api.server import POOL, serve
    from bandpilot.cli.common import store_url
    from bandpilot.queue import Store

    s = Store(store_url(store), create=False, pool_size=POOL if workers == 1 else None)  # the server's own: opened once
    if not s.initialized:
        s.spec  # noqa: B018 - raises the "run `bandpilot cluster init`" error
    from bandpilot.scheduling.profile import get_profile

    get_profile(profile)  # a bad profile: one line, before the server starts
    from bandpilot.config import model_uri

    uri = model or model_uri(s.spec.name)
    loop = f"batches every {dispatch_s:g} s with {uri}" if dispatch_s else "no batches (--dispatch-s 0)"
    typer.echo(f"BandPilot API on http://{host}:{port}/ (docs /docs) for {s.spec.name} at {s.safe_url}; {loop}", err=True)
    if workers > 1:
        s.close()
    serve(s.url, host, port, workers=workers, sample_s=sample_s or None, token_ttl=token_ttl,
          dispatch_s=dispatch_s or None, model_uri=model, profile=profile, store=s if workers == 1 else None)


@tokens_app.command("create")
def create(
    tenant: str = typer.Option(..., "--tenant", help="Tenant the token acts for."),
    admin: bool = typer.Option(False, "--admin", help="May drain/undrain, manage tokens, read the audit log and every request."),
    name: Optional[str] = typer.Option(None, "--name", help="A label (who or what holds it)."),
    store: Optional[str] = STORE_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Create a token and print it once (only its SHA-256 is stored)."""
    from bandpilot.queue import audited, create_token

    s = cli_store(store)
    with audited(s, _actor(), "token.create", tenant, {"admin": admin, "name": name}):
        token, rec = create_token(s, tenant, admin=admin, name=name)
    if as_json:
        typer.echo(json.dumps({**rec, "token": token}, indent=2))
    else:
        typer.echo(token)
        typer.echo(f"token {rec['id']} for tenant {tenant}{' (admin)' if admin else ''}: shown once, store it now", err=True)


@tokens_app.command("list")
def list_(
    tenant: Optional[str] = typer.Option(None, "--tenant", help="Only this tenant's tokens."),
    include_revoked: bool = typer.Option(False, "--all", help="Include revoked tokens."),
    store: Optional[str] = STORE_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List tokens (ids, tenants, roles; never secrets)."""
    from bandpilot.queue import list_tokens

    rows = list_tokens(cli_store(store), tenant, include_revoked=include_revoked)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        typer.echo(f"{r['id']}  {r['tenant']:<20} {'admin' if r['admin'] else 'tenant':<6}  created {r['created']}"
                   f"{'  revoked ' + r['revoked'] if r['revoked'] else ''}{'  ' + r['name'] if r['name'] else ''}")


@tokens_app.command("revoke")
def revoke_cmd(
    token_id: Optional[str] = typer.Argument(None, help="Token id (the part after bp_)."),
    tenant: Optional[str] = typer.Option(None, "--tenant", help="Revoke every token of this tenant (delete it)."),
    store: Optional[str] = STORE_OPT,
) -> None:
    """Revoke a token, or all of a tenant's tokens."""
    from bandpilot.queue import audited, revoke

    s = cli_store(store)
    with audited(s, _actor(), "token.revoke" if token_id else "tenant.delete", token_id or tenant):
        ids = revoke(s, token_id=token_id, tenant=tenant)
    typer.echo(f"revoked {len(ids)} token(s): {', '.join(ids)}")
