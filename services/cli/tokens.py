"""`orderflow tokens create|revoke|list`: the HTTP API's tokens (what they do:
`services/operator/tokens.py`)."""

from __future__ import annotations

import json
from datetime import datetime

import click
from rich.table import Table

from services.cli.operations import run_operations
from services.cli.render import plain, plain_console, shown
from services.cli.settings import pass_settings
from services.operator.tokens import (
    checked_name,
    create_token,
    list_tokens,
    revoke_token,
)
from shared.config import Settings
from shared.domain.timing import utcnow
from shared.domain.tokens import ApiToken, Role


@click.group()
def tokens() -> None:
    """API tokens (kept hashed: a secret is shown once, when it is made)."""


@tokens.command("create")
@click.option(
    "--role",
    required=True,
    type=click.Choice([r.value for r in Role]),
    help="shop: submits and follows its own orders; viewer: reads what an operator reads; "
    "operator: reads and acts.",
)
@click.option(
    "--name",
    required=True,
    help="Who holds it (1-64 letters, digits, '.', '_', '-'; a shop's: 1-23 lower-case letters, "
    "digits, '_', '-', as it prefixes its order ids); the order history records it as who "
    "acted. One active token per name.",
)
@click.option("--json", "as_json", is_flag=True, help='Print {"name", "role", "token"}.')
@pass_settings()
def tokens_create(settings: Settings, role: str, name: str, as_json: bool) -> None:
    """Make a token and print its secret, this once: the store keeps only its digest."""
    name = checked_name(name, Role(role))  # before any server is asked
    token, secret = run_operations(
        settings, lambda ops: create_token(ops.store, name, Role(role), now=utcnow())
    )
    if as_json:
        click.echo(json.dumps({"name": token.name, "role": token.role.value, "token": secret}))
        return
    # The secret alone on stdout (for a pipe); what it is, on stderr.
    click.echo(
        f"token {token.name!r} (role {token.role.value}) created; its secret follows and "
        "cannot be shown again: keep it now (if it is lost, revoke the token and make another)",
        err=True,
    )
    click.echo(secret)


@tokens.command("revoke")
@click.argument("name")
@pass_settings()
def tokens_revoke(settings: Settings, name: str) -> None:
    """Revoke the active token NAME: the API refuses it from its next request on (the name
    may then be given to a new token)."""
    run_operations(settings, lambda ops: revoke_token(ops.store, name, now=utcnow()))
    click.echo(plain(f"revoked token {name!r}"))


@tokens.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (never a secret or digest).")
@pass_settings()
def tokens_list(settings: Settings, as_json: bool) -> None:
    """Every token, active and revoked, newest first: name, role, when made and revoked."""
    found = run_operations(settings, lambda ops: list_tokens(ops.store))
    if as_json:
        click.echo(json.dumps({"tokens": [_public(t) for t in found]}))
        return
    active = sum(t.active for t in found)
    table = Table(title=f"{len(found)} token(s), {active} active, newest first")
    for column in ("name", "role", "created", "revoked"):
        table.add_column(column, no_wrap=True, overflow="fold")  # each short, copied whole
    for t in found:
        revoked = "" if t.revoked_at is None else _when(t.revoked_at)
        table.add_row(shown(t.name), t.role.value, _when(t.created_at), revoked)
    plain_console().print(table)


def _public(token: ApiToken) -> dict[str, str | None]:
    """What a listing shows of a token: never its digest."""
    revoked = None if token.revoked_at is None else token.revoked_at.isoformat()
    return {
        "name": token.name,
        "role": token.role.value,
        "created_at": token.created_at.isoformat(),
        "revoked_at": revoked,
    }


def _when(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")
