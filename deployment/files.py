"""Every committed deployment file that is generated from the code, and what it should say (the
HTTP API's OpenAPI document among them, which the caller hands in: the API builds it from its
own app, and the generators never import the API), and the documentation's reference pages
(`deployment.reference`: the settings, the CLI, the HTTP API)."""

from __future__ import annotations

import click

from deployment.envfile import compose_settings, env_example
from deployment.mongodb import init_script
from deployment.observability import observability_files
from deployment.rabbitmq import DEFAULT_APPS, definitions, render
from deployment.reference import reference_pages
from deployment.secretfiles import secrets_script
from shared.broker.asyncapi import asyncapi_document

COMPOSE_HUB = "orderflow"
"""The task hub (and RabbitMQ vhost, and MongoDB database) of the compose deployment."""


def generated_files(openapi: str, cli: click.Command) -> dict[str, str]:
    """Path relative to the repository root -> the content the code generates for it, with
    `openapi` the API's OpenAPI document (`services.api.app.openapi_document()`) and `cli` the
    `orderflow` command (`services.cli.main.main`)."""
    return {
        ".env.example": env_example(),
        "infra/compose/settings.yml": compose_settings(),
        "infra/rabbitmq/definitions.json": render(
            definitions(COMPOSE_HUB, COMPOSE_HUB, apps=DEFAULT_APPS)
        ),
        "infra/mongodb/init-orderflow.js": init_script(COMPOSE_HUB),
        "infra/secrets.sh": secrets_script(DEFAULT_APPS),
        "docs/openapi.json": openapi,
        "docs/reference/asyncapi.json": asyncapi_document(),
        **observability_files(),
        **reference_pages(openapi, cli),
    }
