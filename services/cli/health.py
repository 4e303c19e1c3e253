"""`orderflow health`: is a running process up and connected? The container healthcheck.

It asks the process's `/healthz` (served beside `/metrics` on ORDERFLOW_METRICS_PORT): 200
while its broker connection is open and its store answers. Exit 0 healthy, 1 not. It imports
nothing but click, the standard library and the pure `shared.domain.text` (the answer is
shown escaped), so that `python -m services.cli.health`, what the compose healthchecks run
every few seconds, starts in a few tens of milliseconds.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

import click

from shared.domain.text import printable  # pure, standard library only: starts fast
from shared.masking import mask_credentials  # the same

UNHEALTHY = 1


@click.command()
@click.option(
    "--port",
    envvar="ORDERFLOW_METRICS_PORT",
    type=click.IntRange(0, 65535),
    default=0,
    show_default="ORDERFLOW_METRICS_PORT",
    help="The process's metrics port: asks http://127.0.0.1:PORT/healthz.",
)
@click.option("--url", help="Ask this URL instead (e.g. the remote service's /health).")
@click.option("--timeout", default=4.0, show_default=True, help="Seconds to wait for an answer.")
def health(port: int, url: str | None, timeout: float) -> None:
    """Exit 0 when the process answers healthy, 1 when it does not (or does not answer)."""
    if url is None:
        if not port:
            # Exit 1, not click's usage error 2: Docker reserves 2 in healthchecks.
            click.echo("unhealthy: no endpoint to ask (ORDERFLOW_METRICS_PORT is 0)", err=True)
            sys.exit(UNHEALTHY)
        url = f"http://127.0.0.1:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            body = answer.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        answer_text = exc.read().decode(errors="replace")
        click.echo(
            printable(mask_credentials(f"unhealthy: {url}: {exc.code} {answer_text}")), err=True
        )
        sys.exit(UNHEALTHY)
    except (urllib.error.URLError, OSError) as exc:
        click.echo(
            printable(mask_credentials(f"unhealthy: {url} does not answer: {exc}")), err=True
        )
        sys.exit(UNHEALTHY)
    click.echo(printable(body.strip()))


if __name__ == "__main__":
    health(prog_name="orderflow health")
