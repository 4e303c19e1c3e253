"""The deployment files generated from the code: current, least-privilege, password-free."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from deployment.files import COMPOSE_HUB, generated_files
from deployment.mongodb import (
    API_ACTIONS,
    API_PASSWORD_VARIABLE,
    API_ROLE,
    API_USER,
    PASSWORD_FILE_VARIABLE,
    PASSWORD_VARIABLE,
    indexes,
    init_script,
)
from deployment.rabbitmq import (
    BrokerLimits,
    definitions,
    fill_passwords,
    password_hash,
    password_variable,
    password_variables,
    queues_needed,
    render,
)
from deployment.secretfiles import secrets
from services.api.app import openapi_document
from services.cli.main import main
from shared.broker.access import SERVICE_ROLES, Resources, grant
from shared.broker.private import STATUS_QUEUES_PER_APP
from shared.broker.topology import Names
from shared.domain.workflow import AGENTS

ROOT = Path(__file__).resolve().parents[2]
RENDER = ROOT / "infra" / "rabbitmq" / "render-definitions.sh"
ENTRYPOINT = ROOT / "infra" / "rabbitmq" / "entrypoint.sh"
SECRETS_SCRIPT = ROOT / "infra" / "secrets.sh"


# -- the committed files are what the code generates


@pytest.mark.parametrize("relative", sorted(generated_files(openapi_document(), main)))
def test_the_committed_file_is_what_the_code_generates(relative: str) -> None:
    committed = (ROOT / relative).read_text()
    assert committed == generated_files(openapi_document(), main)[relative], (
        f"{relative} is out of date: run `orderflow deploy write` and commit the result"
    )


def test_write_check_reports_a_stale_file_and_write_fixes_it(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["deploy", "write", "--root", str(tmp_path)]).exit_code == 0
    fresh = runner.invoke(main, ["deploy", "write", "--check", "--root", str(tmp_path)])
    assert fresh.exit_code == 0, fresh.output
    example = tmp_path / ".env.example"
    example.write_text(example.read_text().replace("# ORDERFLOW_PREFETCH=32\n", ""))
    stale = runner.invoke(main, ["deploy", "write", "--check", "--root", str(tmp_path)])
    assert stale.exit_code == 1 and ".env.example" in stale.output


def test_the_env_example_documents_every_setting_and_holds_no_password() -> None:
    text = (ROOT / ".env.example").read_text()
    compose = (ROOT / "docker-compose.yml").read_text()
    # Passwords are secret files now: nothing in compose interpolates one from .env.
    assert not re.findall(r"\$\{(\w*(?:PASSWORD|TOKEN)\w*)", compose)
    assert not re.findall(r"^\w*(?:PASSWORD|TOKEN)\w*=", text, re.M)
    assert "sh infra/secrets.sh" in text and "COMPOSE_PROFILES=mongodb" in text
    assert "# ORDERFLOW_STEP_TIMEOUT_S=10.0" in text
    assert "# ORDERFLOW_COMPENSATE_ON=\n" in text  # None: empty
    assert "# ORDERFLOW_REMOTE_OUTAGE=false" in text
    assert "# ORDERFLOW_STORE_URL: set by docker-compose.yml" in text


# -- the secret files: infra/secrets.sh


def run_secrets_script(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(SECRETS_SCRIPT), *args],
        env={"PATH": os.environ["PATH"], "SECRETS_DIR": str(directory)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_secrets_script_writes_every_secret_once_and_the_urls_from_them(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "secrets"
    done = run_secrets_script(directory)
    assert done.returncode == 0, done.stderr
    names = {secret.name for secret in secrets()}
    assert {p.name for p in directory.iterdir()} == names
    assert directory.stat().st_mode & 0o777 == 0o700
    assert all((directory / n).stat().st_mode & 0o777 == 0o644 for n in names)
    values = {n: (directory / n).read_text() for n in names}
    assert not any(v and v in done.stdout + done.stderr for v in values.values())
    # What only the operator can give (the notifier's targets) is written empty, never made up;
    # a value of the operator's is kept.
    given = {s.name for s in secrets() if s.given}
    assert given == {"notify_webhook_url", "notify_slack_url", "notify_pagerduty_routing_key"}
    assert all(values[n] == "" for n in given)
    random = [
        s.name
        for s in secrets()
        if s.url is None
        and s.account is None
        and s.name not in ("store_url", "store_api_url")
        and not s.given
    ]
    assert all(re.fullmatch(r"[0-9a-f]{64}", values[n]) for n in random)
    assert len({values[n] for n in random}) == len(random)  # each its own
    admin = values["rabbitmq_admin_password"]
    assert values["rabbitmq_admin_url"] == f"amqp://orderflow-admin:{admin}@rabbitmq:5672/orderflow"
    shop = values["rabbitmq_app_shop_password"]
    assert values["rabbitmq_app_shop_url"] == f"amqp://shop:{shop}@rabbitmq:5672/orderflow"
    # The replica set's name: the driver finds every member from the one the URL names.
    assert values["store_url"] == (
        f"mongodb://orderflow:{values['mongo_app_password']}@mongodb:27017/orderflow"
        "?authSource=orderflow&replicaSet=rs0"
    )
    # The API's store user is its own.
    assert values["store_api_url"] == (
        f"mongodb://orderflow_api:{values['mongo_api_password']}@mongodb:27017/orderflow"
        "?authSource=orderflow&replicaSet=rs0"
    )
    # The remote stand-in's account of the hub: the agents' key and the schedulers' fence key.
    assert values["remote_accounts"] == (
        f"orderflow:{values['remote_account_key']}:{values['remote_fence_key']}"
    )
    web = values["rabbitmq_app_web_password"]
    assert values["rabbitmq_app_web_url"] == f"amqp://web:{web}@rabbitmq:5672/orderflow"
    # The replica set's key is mongod's keyfile format (base64 characters, 6 to 1024 of them).
    assert re.fullmatch(r"[A-Za-z0-9+/=]{6,1024}", values["mongo_keyfile"])
    # Again, for the other store, after a password was changed by hand: passwords are kept,
    # the URLs follow them.
    (directory / "rabbitmq_admin_password").write_text("chosen-by-hand\n")
    (directory / "notify_slack_url").write_text("https://hooks.example/T/B/x\n")
    assert run_secrets_script(directory, "postgres").returncode == 0
    assert (directory / "notify_slack_url").read_text() == "https://hooks.example/T/B/x\n"
    assert (directory / "mongo_app_password").read_text() == values["mongo_app_password"]
    assert (directory / "mongo_keyfile").read_text() == values["mongo_keyfile"]
    assert (directory / "rabbitmq_admin_url").read_text() == (
        "amqp://orderflow-admin:chosen-by-hand@rabbitmq:5672/orderflow"
    )
    assert (directory / "store_url").read_text() == (
        f"postgresql://orderflow:{values['postgres_app_password']}@postgres:5432/orderflow"
    )
    assert (directory / "store_api_url").read_text() == (
        f"postgresql://orderflow_api:{values['postgres_api_password']}@postgres:5432/orderflow"
    )


def test_the_secrets_script_refuses_a_password_a_url_cannot_hold(tmp_path: Path) -> None:
    directory = tmp_path / "secrets"
    directory.mkdir()
    (directory / "rabbitmq_operator_password").write_text("p@ss/word")
    done = run_secrets_script(directory)
    assert done.returncode == 1 and "rabbitmq_operator_password must be URL-safe" in done.stderr
    assert "p@ss/word" not in done.stderr
    assert run_secrets_script(directory, "sqlite").returncode == 2


def test_the_secrets_script_keeps_a_key_of_your_own_in_mongods_format(tmp_path: Path) -> None:
    directory = tmp_path / "secrets"
    directory.mkdir()
    # `openssl rand -base64 …`, as MongoDB's documentation makes one: lines, padding.
    own = "c2VjcmV0LWtleS1vZi15b3VyLW93bg==\nbW9yZS1saW5lcw+/\n"
    (directory / "mongo_keyfile").write_text(own)
    done = run_secrets_script(directory)
    assert done.returncode == 0, done.stderr
    assert (directory / "mongo_keyfile").read_text() == own
    for bad, why in [("not-base64!", "base64 characters only"), ("abc\n de", "6 to 1024")]:
        (directory / "mongo_keyfile").write_text(bad)
        refused = run_secrets_script(directory)
        assert refused.returncode == 1 and why in refused.stderr, refused.stderr
        assert bad not in refused.stderr
    (directory / "mongo_keyfile").write_text("A" * 1025)
    assert "6 to 1024" in run_secrets_script(directory).stderr


# -- RabbitMQ: password hashes


def test_the_hash_is_rabbitmqs_salted_sha256() -> None:
    # The example in RabbitMQ's documentation of password hashing.
    salt = bytes.fromhex("908DC60A")
    assert password_hash("test12", salt) == "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"
    assert password_hash("test12") != password_hash("test12")  # a fresh salt each time


def salted(hash_b64: str, password: str) -> bool:
    raw = base64.b64decode(hash_b64)
    return raw[4:] == hashlib.sha256(raw[:4] + password.encode()).digest()


@pytest.fixture
def renderer() -> str:
    if shutil.which("openssl") is None or shutil.which("sh") is None:
        pytest.skip("sh and openssl are needed to run infra/rabbitmq/render-definitions.sh")
    return str(RENDER)


def test_the_container_script_renders_the_same_hashes(renderer: str, tmp_path: Path) -> None:
    template = tmp_path / "template.json"
    template.write_text(render(definitions("h", "h", apps=("shop",))))
    passwords = {v: f"pw-{v.lower()}-é" for v in password_variables(template.read_text())}
    out = tmp_path / "out.json"
    done = subprocess.run(
        ["sh", renderer, str(template), str(out)],
        env={"PATH": os.environ["PATH"], **passwords},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert out.stat().st_mode & 0o077 == 0  # readable by its owner only
    users = json.loads(out.read_text())["users"]
    assert len(users) == len(passwords) == len(SERVICE_ROLES) + 1
    placeholders = json.loads(template.read_text())["users"]
    for user, placeholder in zip(users, placeholders, strict=True):
        variable = placeholder["password_hash"].removeprefix("@HASH:").removesuffix("@")
        assert salted(user["password_hash"], passwords[variable]), user["name"]
    assert len({u["password_hash"][:8] for u in users}) == len(users)  # salts differ
    assert not any(p in out.read_text() + done.stdout + done.stderr for p in passwords.values())
    # The Python twin (tests) agrees with the script.
    filled = json.loads(fill_passwords(template.read_text(), passwords))
    for user, variable in zip(filled["users"], passwords, strict=True):
        assert salted(user["password_hash"], passwords[variable])


def test_the_container_script_reads_password_files(renderer: str, tmp_path: Path) -> None:
    template = tmp_path / "template.json"
    template.write_text(render(definitions("h", "h", apps=("shop2",))))
    variables = password_variables(template.read_text())
    env = {"PATH": os.environ["PATH"]}
    for variable in variables:
        (tmp_path / variable).write_text(f"file-{variable.lower()}\n")  # a trailing newline
        env[f"{variable}_FILE"] = str(tmp_path / variable)
    out = tmp_path / "out.json"
    done = subprocess.run(["sh", renderer, str(template), str(out)], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    for user, variable in zip(json.loads(out.read_text())["users"], variables, strict=True):
        assert salted(user["password_hash"], f"file-{variable.lower()}"), user["name"]
    # Both ways at once is refused, as the official images refuse VAR and VAR_FILE together.
    both = env | {variables[0]: "also-in-the-environment"}
    done = subprocess.run(
        ["sh", renderer, str(template), str(tmp_path / "again.json")],
        env=both,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and f"both {variables[0]} and {variables[0]}_FILE" in done.stderr


def test_the_entrypoint_leaves_no_password_in_the_brokers_environment(
    renderer: str, tmp_path: Path
) -> None:
    """Every RABBITMQ_*_PASSWORD (digits in the name too) and *_PASSWORD_FILE is gone before the
    image's entrypoint runs; the definitions were rendered from them."""
    folder = tmp_path / "etc"
    folder.mkdir()
    for script in (ENTRYPOINT, RENDER):
        shutil.copy(script, folder / script.name)
    (folder / "definitions.json").write_text(render(definitions("h", "h", apps=("shop2",))))
    fake = tmp_path / "bin"
    fake.mkdir()
    image_entrypoint = fake / "docker-entrypoint.sh"
    image_entrypoint.write_text('#!/bin/sh\nenv > "$ENV_SEEN"\n')
    image_entrypoint.chmod(0o755)
    variables = password_variables((folder / "definitions.json").read_text())
    assert "RABBITMQ_APP_SHOP2_PASSWORD" in variables  # the name the old loop missed
    (tmp_path / "operator").write_text("from-a-file")
    env = {
        "PATH": f"{fake}:{os.environ['PATH']}",
        "ENV_SEEN": str(tmp_path / "seen"),
        "ORDERFLOW_DEFINITIONS_OUTPUT": str(tmp_path / "rendered.json"),
        **{v: f"secret-{n}" for n, v in enumerate(variables)},
    }
    del env["RABBITMQ_OPERATOR_PASSWORD"]
    env["RABBITMQ_OPERATOR_PASSWORD_FILE"] = str(tmp_path / "operator")
    if (
        os.geteuid() == 0
        and shutil.which("id")
        and subprocess.run(["id", "rabbitmq"], capture_output=True).returncode
    ):
        pytest.skip("as root the entrypoint chowns to the rabbitmq user, which is missing here")
    done = subprocess.run(
        ["sh", str(folder / "entrypoint.sh"), "rabbitmq-server"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = (tmp_path / "seen").read_text()
    assert not re.findall(r"^RABBITMQ_\w*PASSWORD\w*=", seen, re.M), seen
    assert "secret-" not in seen and "from-a-file" not in seen
    users = json.loads((tmp_path / "rendered.json").read_text())["users"]
    operator = next(u for u in users if u["name"] == "h-operator")
    assert salted(operator["password_hash"], "from-a-file")


def test_the_container_script_refuses_a_missing_password(renderer: str, tmp_path: Path) -> None:
    template = tmp_path / "template.json"
    template.write_text(render(definitions("h", "h", apps=())))
    passwords = dict.fromkeys(password_variables(template.read_text()), "secret-one")
    passwords["RABBITMQ_OPERATOR_PASSWORD"] = ""
    done = subprocess.run(
        ["sh", renderer, str(template), str(tmp_path / "out.json")],
        env={"PATH": os.environ["PATH"], **passwords},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert "RABBITMQ_OPERATOR_PASSWORD is not set" in done.stderr
    assert "secret-one" not in done.stderr + done.stdout
    assert not (tmp_path / "out.json").exists()


# -- RabbitMQ: least privilege, checked against a table of what each process does


H = "h"
N = Names(H)
TOPOLOGY = set(N.exchanges()) | set(N.durable_queues())
REPLY_Q = f"{H}.reply.scheduler-1a2b3c.0123456789ab"
OWN_STATUS_Q = f"{H}.status.shop.0123456789ab"
OTHER_STATUS_Q = f"{H}.status.other.0123456789ab"
UNIVERSE = (
    TOPOLOGY
    | {REPLY_Q, OWN_STATUS_Q, OTHER_STATUS_Q, "amq.default", "amq.topic", "amq.direct"}
    | {n.replace(f"{H}.", "h2.", 1) for n in TOPOLOGY}  # another hub's, in the same vhost
    | {f"{H}.orders.extra", f"{H}.status", f"x{H}.orders"}
)
DLQS = {N.dlq(q) for q in N.input_queues()}

# What each process does in the code (see the docstring of shared/broker/access.py, and the
# system test that runs every process under these permissions): configure, write, read.
USES: dict[str, tuple[set[str], set[str], set[str]]] = {
    "admin": (TOPOLOGY, TOPOLOGY, TOPOLOGY),
    # Submission dead-letters into its own DLQ, and declares an application's status queue
    # and binds it to `status` for it (write on the queue, read on the exchange).
    "submission": (
        {OWN_STATUS_Q, OTHER_STATUS_Q},
        {N.dlq(N.orders), N.retry(N.orders), N.alerts, N.status, OWN_STATUS_Q, OTHER_STATUS_Q},
        {N.orders, N.status},
    ),
    "scheduler": (
        {REPLY_Q},
        {N.exchange, N.alerts, N.status, REPLY_Q},
        {N.replies, REPLY_Q},
    ),
    "supervisor": (set(), {N.alerts, N.status}, set()),
    # An agent sets a failed request aside in its own queue's retry queue, and dead-letters into
    # its own queue's DLQ, and nobody else's.
    **{
        f"agent-{a}": (
            set(),
            {N.dlq(N.agent(a)), N.retry(N.agent(a)), N.alerts, N.replies},
            {N.agent(a)},
        )
        for a in AGENTS
    },
    # The operator replays through each input queue's own replay exchange, never `direct`, and
    # reads the alert feed (`alerts follow`), never the alerts exchange (which it could bind);
    # it tells an application of an order it cancelled (`orders cancel`).
    "operator": (
        set(),
        {N.replay(q) for q in N.input_queues()} | {N.status},
        DLQS | {N.alert_feed, N.alert_dead_letters},
    ),
    # The notifier reads the alert feed and sets aside, in the feed's own dead-letter
    # exchange, what a webhook refused: nothing else.
    "notifier": (set(), {N.alert_dead_letters}, {N.alert_feed}),
    # The HTTP API's operator endpoints: the input queues' dead letters (list, show, replay,
    # purge) and the Cancelled status of an order it cancels; never the alert feed.
    "api": (set(), {N.replay(q) for q in N.input_queues()} | {N.status}, DLQS),
    # An application declares no queue and reads no exchange: submission declares and binds
    # its status queues (one that could declare filled the vhost: issue 33).
    "shop": (set(), {N.submit}, {OWN_STATUS_Q}),
}
KEYS = [REPLY_Q, OWN_STATUS_Q, OTHER_STATUS_Q, N.orders, "#", f"{H}.status.#", f"{H}.reply.#"]
# (user, exchange) -> routing keys it may publish with, and bind with.
TOPIC_USES: dict[tuple[str, str], tuple[set[str], set[str]]] = {
    # Submission binds exactly one status queue per key: never a wildcard key.
    ("submission", N.status): (
        {OWN_STATUS_Q, OTHER_STATUS_Q, f"{H}.status.#"},
        {OWN_STATUS_Q, OTHER_STATUS_Q},
    ),
    ("scheduler", N.status): ({OWN_STATUS_Q, OTHER_STATUS_Q, f"{H}.status.#"}, set()),
    ("supervisor", N.status): ({OWN_STATUS_Q, OTHER_STATUS_Q, f"{H}.status.#"}, set()),
    ("operator", N.status): ({OWN_STATUS_Q, OTHER_STATUS_Q, f"{H}.status.#"}, set()),
    ("api", N.status): ({OWN_STATUS_Q, OTHER_STATUS_Q, f"{H}.status.#"}, set()),
    ("scheduler", N.replies): (set(), {REPLY_Q}),
    **{(f"agent-{a}", N.replies): ({REPLY_Q, f"{H}.reply.#"}, set()) for a in AGENTS},
}


def matching(regex: str, names: set[str] | list[str]) -> set[str]:
    """What RabbitMQ's permission check allows: an unanchored regex search."""
    return {n for n in names if re.search(regex, n)}


def permission_problems(document: dict[str, Any]) -> list[str]:
    problems = []
    role_of = {u["name"]: u["name"].removeprefix(f"{H}-") for u in document["users"]}
    for p in document["permissions"]:
        role = role_of[p["user"]]
        for kind, expected in zip(("configure", "write", "read"), USES[role], strict=True):
            allowed = matching(p[kind], UNIVERSE)
            if allowed != expected:
                problems.append(
                    f"{role} {kind}: extra {sorted(allowed - expected)}, "
                    f"missing {sorted(expected - allowed)}"
                )
    topics = {(role_of[t["user"]], t["exchange"]): t for t in document["topic_permissions"]}
    for (role, exchange), (write, read) in TOPIC_USES.items():
        t = topics.get((role, exchange))
        if t is None:
            problems.append(f"{role} has no topic permission on {exchange} (so: any key)")
            continue
        if matching(t["write"], KEYS) != write or matching(t["read"], KEYS) != read:
            problems.append(f"{role} on {exchange}: topic keys differ")
    # A user with plain read or write on a topic exchange and no topic permission there may
    # use any routing key: only the admin, which declares the topology, is trusted so.
    for p in document["permissions"]:
        role = role_of[p["user"]]
        for exchange in (N.replies, N.status):
            uses = re.search(p["write"], exchange) or re.search(p["read"], exchange)
            if uses and role != "admin" and (role, exchange) not in topics:
                problems.append(f"{role} uses {exchange} without topic permissions")
    return problems


def test_each_user_gets_exactly_what_its_process_uses() -> None:
    document = definitions(H, "v", apps=("shop",))
    assert {u["name"] for u in document["users"]} == {f"{H}-{r}" for r in SERVICE_ROLES} | {"shop"}
    assert permission_problems(document) == []
    assert all(p["vhost"] == "v" for p in document["permissions"])
    assert not matching("|".join(p["write"] for p in document["permissions"]), ["amq.default"])


def test_the_permission_check_can_fail() -> None:
    document = definitions(H, "v", apps=("shop",))
    agent = next(p for p in document["permissions"] if p["user"] == f"{H}-agent-payment")
    agent["read"] = ".*"
    shop = next(p for p in document["permissions"] if p["user"] == "shop")
    shop["read"] = f"^({H}\\.status|{H}\\.status\\.shop\\..+)$"
    document["topic_permissions"] = [
        t for t in document["topic_permissions"] if t["user"] != f"{H}-submission"
    ]
    problems = permission_problems(document)
    assert any(p.startswith("agent-payment read: extra") for p in problems)
    assert "shop read: extra ['h.status'], missing []" in problems
    assert "shop uses h.status without topic permissions" in problems
    assert "submission has no topic permission on h.status (so: any key)" in problems


def test_regexes_are_anchored_and_escaped() -> None:
    resources = Resources(exact=("a.b",), prefixes=("a.c.",))
    assert resources.regex() == r"^(a\.b|a\.c\..+)$"
    assert matching(resources.regex(), ["a.b", "axb", "a.b.c", "a.c.", "a.c.d", "xa.b"]) == {
        "a.b",
        "a.c.d",
    }
    assert Resources().regex() == "^$" and not matching("^$", ["x", "amq.default"])
    with pytest.raises(ValueError, match="no role"):
        grant(N, "billing")


def test_the_definitions_set_vhost_and_user_limits() -> None:
    limits = BrokerLimits(
        vhost_max_connections=40,
        vhost_max_queues=100,
        service_max_connections=3,
        service_max_channels=9,
        app_max_connections=2,
        app_max_channels=5,
    )
    document = definitions(H, "v", apps=("shop",), limits=limits)
    assert document["parameters"] == [
        {
            "vhost": "v",
            "component": "vhost-limits",
            "name": "limits",
            "value": {"max-connections": 40, "max-queues": 100},
        }
    ]
    by_name = {u["name"]: u["limits"] for u in document["users"]}
    assert by_name.pop("shop") == {"max-connections": 2, "max-channels": 5}
    assert list(by_name.values()) == [{"max-connections": 3, "max-channels": 9}] * len(
        SERVICE_ROLES
    )
    assert len(by_name) == len(SERVICE_ROLES)
    # The defaults leave every compose service room to scale, and are set in the committed file.
    committed = json.loads((ROOT / "infra" / "rabbitmq" / "definitions.json").read_text())
    defaults = BrokerLimits()
    assert all(u["limits"]["max-connections"] >= 16 for u in committed["users"])
    assert committed["parameters"][0]["value"]["max-queues"] == defaults.vhost_max_queues
    with pytest.raises(ValueError, match="app_max_channels must be a positive integer"):
        BrokerLimits(app_max_channels=0)


def test_the_vhost_queue_limit_leaves_room_for_every_status_queue_and_reply_queue() -> None:
    """No application declares a queue, submission at most STATUS_QUEUES_PER_APP for each:
    the vhost's queue limit must hold those, the hub's own and a reply queue per scheduler
    connection, or a scheduler could be left without its reply queue."""
    limits = BrokerLimits(service_max_connections=10)
    apps = ("shop", "web", "pos")
    needed = len(N.durable_queues()) + 3 * STATUS_QUEUES_PER_APP + 10
    assert queues_needed(N, apps, limits) == needed
    definitions(H, "v", apps=apps, limits=replace(limits, vhost_max_queues=needed))
    with pytest.raises(ValueError, match=f"leaves a scheduler no room.* need {needed}"):
        definitions(H, "v", apps=apps, limits=replace(limits, vhost_max_queues=needed - 1))
    # The defaults hold the compose deployment's applications with room to spare.
    assert queues_needed(N, ("shop", "web"), BrokerLimits()) < BrokerLimits().vhost_max_queues
    runner = CliRunner()
    small = runner.invoke(main, ["deploy", "rabbitmq-definitions", "--vhost-max-queues", "20"])
    assert small.exit_code == 2 and "leaves a scheduler no room" in small.output


def test_two_users_never_share_a_name_or_a_password_variable() -> None:
    # Both spellings map to one variable: the generator refuses the pair, not the name alone.
    assert password_variable("shop-eu", app=True) == password_variable("shop_eu", app=True)
    assert password_variable("shop-eu", app=True) == "RABBITMQ_APP_SHOP_EU_PASSWORD"
    definitions(H, "v", apps=("shop-eu", "shop_us"))
    with pytest.raises(ValueError, match="RABBITMQ_APP_SHOP_EU_PASSWORD"):
        definitions(H, "v", apps=("shop-eu", "shop_eu"))
    with pytest.raises(ValueError, match="two users would be named 'h-admin'"):
        definitions(H, "v", apps=("h-admin",))
    # Service roles and applications live apart (APP_): an application named like a role is fine.
    document = definitions(H, "v", apps=("scheduler",))
    variables = password_variables(render(document))
    assert len(variables) == len(set(variables)) == len(SERVICE_ROLES) + 1
    runner = CliRunner()
    refused = runner.invoke(
        main, ["deploy", "rabbitmq-definitions", "--app", "shop-eu", "--app", "shop_eu"]
    )
    assert refused.exit_code == 2 and "would share the password variable" in refused.output


def test_the_definitions_command() -> None:
    runner = CliRunner()
    done = runner.invoke(
        main, ["deploy", "rabbitmq-definitions", "--hub", "shop1", "--app", "web", "--app", "pos"]
    )
    assert done.exit_code == 0, done.output
    document = json.loads(done.output)
    assert document["vhosts"] == [{"name": "shop1"}]
    assert {"web", "pos", "shop1-scheduler"} <= {u["name"] for u in document["users"]}
    assert "RABBITMQ_APP_WEB_PASSWORD" in password_variables(done.output)
    bad = runner.invoke(main, ["deploy", "rabbitmq-definitions", "--app", "a.b"])
    assert bad.exit_code == 2
    limited = runner.invoke(main, ["deploy", "rabbitmq-definitions", "--app-max-connections", "3"])
    assert limited.exit_code == 0, limited.output
    shop = next(u for u in json.loads(limited.output)["users"] if u["name"] == "shop")
    assert shop["limits"]["max-connections"] == 3
    zero = runner.invoke(main, ["deploy", "rabbitmq-definitions", "--vhost-max-queues", "0"])
    assert zero.exit_code == 2


# -- MongoDB: the init script


def test_the_init_script_makes_the_adapters_indexes() -> None:
    names = [spec.options["name"] for spec in indexes()]
    assert "state_claimable" in names and "inbox_expiry_late" in names
    assert len(set(names)) == len(names)
    script = init_script("orderflow")
    assert all(f'"name": "{name}"' in script for name in names)
    # MongoDB compares a partial filter as written: the script keeps the adapter's key order,
    # or `orderflow init` after it would meet an index of the same name with "other" options.
    for spec in indexes():
        if "partialFilterExpression" in spec.options:
            assert json.dumps(spec.options["partialFilterExpression"]) in script
    assert '{"process_state": "Pending", "locked_by": null}' in script


NODE_STUB = """
const calls = [];
const collection = (name) => ({
  createIndex: (keys, options) => calls.push(["index", name, keys, options]),
});
const database = (name) => ({
  getUser: () => null,
  createUser: (user) => calls.push(["user", name, user]),
  getRole: () => null,
  createRole: (role) => calls.push(["role", name, role]),
  updateUser: () => calls.push(["update"]),
  getCollection: (c) => collection(name + "." + c),
});
globalThis.db = { getSiblingDB: database };
try {
  require(process.argv[2]);
} catch (e) {
  console.log(JSON.stringify({ error: e.message }));
  process.exit(0);
}
console.log(JSON.stringify({ calls }));
"""


def run_in_node(script: Path, tmp_path: Path, env: dict[str, str]) -> dict[str, Any]:
    stub = tmp_path / "stub.js"
    stub.write_text(NODE_STUB)
    done = subprocess.run(
        ["node", str(stub), str(script)], capture_output=True, text=True, env=env, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


READ_WRITE_HUB = {"role": "readWrite", "db": COMPOSE_HUB}


def test_the_init_script_runs_creating_a_hub_only_user_and_every_index(tmp_path: Path) -> None:
    if shutil.which("node") is None:
        pytest.skip("node is needed to run the init script against a stub database")
    script = tmp_path / "init.js"
    script.write_text(init_script(COMPOSE_HUB))
    path = {"PATH": os.environ["PATH"]}
    result = run_in_node(script, tmp_path, path | {PASSWORD_VARIABLE: "app-secret"})
    users = [c for c in result["calls"] if c[0] == "user"]
    assert users == [
        [
            "user",
            COMPOSE_HUB,
            {
                "user": "orderflow",
                "pwd": "app-secret",
                "roles": [{"role": "readWrite", "db": "orderflow"}],
            },
        ]
    ]
    made = [(c[1], c[2], c[3]) for c in result["calls"] if c[0] == "index"]
    assert made == [(f"{COMPOSE_HUB}.{s.collection}", s.keys, s.options) for s in indexes()]
    refused = run_in_node(script, tmp_path, path)
    assert refused == {"error": f"{PASSWORD_VARIABLE} is not set (see infra/secrets.sh)"}
    # The compose secret: the file MONGO_APP_PASSWORD_FILE names (its trailing newline dropped).
    (tmp_path / "password").write_text("from-the-file\n")
    from_file = run_in_node(
        script, tmp_path, path | {PASSWORD_FILE_VARIABLE: str(tmp_path / "password")}
    )
    assert [c[2]["pwd"] for c in from_file["calls"] if c[0] == "user"] == ["from-the-file"]
    both = path | {PASSWORD_FILE_VARIABLE: str(tmp_path / "password"), PASSWORD_VARIABLE: "x"}
    assert "both" in run_in_node(script, tmp_path, both)["error"]


def test_the_init_script_gives_the_api_a_user_of_its_own_for_documents_only(
    tmp_path: Path,
) -> None:
    if shutil.which("node") is None:
        pytest.skip("node is needed to run the init script against a stub database")
    script = tmp_path / "init.js"
    script.write_text(init_script(COMPOSE_HUB))
    env = {"PATH": os.environ["PATH"], PASSWORD_VARIABLE: "app", API_PASSWORD_VARIABLE: "api"}
    calls = run_in_node(script, tmp_path, env)["calls"]
    [role] = [c[2] for c in calls if c[0] == "role"]
    assert role["privileges"] == [
        {"resource": {"db": COMPOSE_HUB, "collection": ""}, "actions": list(API_ACTIONS)}
    ]
    assert not {"createIndex", "dropCollection", "createCollection"} & set(API_ACTIONS)
    users = {c[2]["user"]: c[2] for c in calls if c[0] == "user"}
    assert users[API_USER] == {
        "user": API_USER,
        "pwd": "api",
        "roles": [{"role": API_ROLE, "db": COMPOSE_HUB}],
    }
    assert users["orderflow"]["roles"] == [READ_WRITE_HUB]
