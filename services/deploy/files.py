"""Every committed deployment file that is generated from the code, and what it should say (the
HTTP API's OpenAPI document among them)."""

from __future__ import annotations

from services.api.app import openapi_document
from services.deploy.envfile import compose_settings, env_example
from services.deploy.mongodb import init_script
from services.deploy.observability import observability_files
from services.deploy.rabbitmq import DEFAULT_APPS, definitions, render
from services.deploy.secretfiles import secrets_script

COMPOSE_HUB = "orderflow"
"""The task hub (and RabbitMQ vhost, and MongoDB database) of the compose deployment."""


def generated_files() -> dict[str, str]:
    """Path relative to the repository root -> the content the code generates for it."""
    return {
        ".env.example": env_example(),
        "infra/compose/settings.yml": compose_settings(),
        "infra/rabbitmq/definitions.json": render(
            definitions(COMPOSE_HUB, COMPOSE_HUB, apps=DEFAULT_APPS)
        ),
        "infra/mongodb/init-orderflow.js": init_script(COMPOSE_HUB),
        "infra/secrets.sh": secrets_script(DEFAULT_APPS),
        "docs/openapi.json": openapi_document(),
        **observability_files(),
    }
