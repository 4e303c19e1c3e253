"""The deployment files generated from the code: current, least-privilege, password-free."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from services.cli.main import main
from services.deploy.files import COMPOSE_HUB, generated_files
from services.deploy.mongodb import PASSWORD_VARIABLE, indexes, init_script
from services.deploy.rabbitmq import (
    definitions,
    fill_passwords,
    password_hash,
    password_variables,
    render,
)
from shared.broker.access import SERVICE_ROLES, Resources, grant
from shared.broker.topology import Names
from shared.domain.workflow import AGENTS

ROOT = Path(__file__).resolve().parents[2]
RENDER = ROOT / "infra" / "rabbitmq" / "render-definitions.sh"


# -- the committed files are what the code generates


@pytest.mark.parametrize("relative", sorted(generated_files()))
def test_the_committed_file_is_what_the_code_generates(relative: str) -> None:
    committed = (ROOT / relative).read_text()
    assert committed == generated_files()[relative], (
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


def test_the_env_example_documents_every_setting_and_every_password_compose_needs() -> None:
    text = (ROOT / ".env.example").read_text()
    compose = (ROOT / "docker-compose.yml").read_text()
    needed = set(re.findall(r"\$\{(\w+_PASSWORD)", compose))
    given = set(re.findall(r"^(\w+_PASSWORD)=$", text, re.M))  # placeholders: empty
    assert needed <= given
    assert "# ORDERFLOW_STEP_TIMEOUT_S=10.0" in text
    assert "# ORDERFLOW_COMPENSATE_ON=\n" in text  # None: empty
    assert "# ORDERFLOW_REMOTE_OUTAGE=false" in text


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
    "submission": (
        set(),
        {N.dead_letters, N.retry(N.orders), N.alerts, N.status},
        {N.orders},
    ),
    "scheduler": (
        {REPLY_Q},
        {N.exchange, N.alerts, N.status, REPLY_Q},
        {N.replies, REPLY_Q},
    ),
    "supervisor": (set(), {N.alerts, N.status}, set()),
    # An agent sets a failed request aside in its own queue's retry queue, and nobody else's.
    **{
        f"agent-{a}": (
            set(),
            {N.dead_letters, N.retry(N.agent(a)), N.alerts, N.replies},
            {N.agent(a)},
        )
        for a in AGENTS
    },
    "operator": (set(), {N.exchange}, DLQS),
    "shop": ({OWN_STATUS_Q}, {N.submit, OWN_STATUS_Q}, {N.status, OWN_STATUS_Q}),
}
KEYS = [REPLY_Q, OWN_STATUS_Q, OTHER_STATUS_Q, N.orders, "#", f"{H}.status.#", f"{H}.reply.#"]
# (user, exchange) -> routing keys it may publish with, and bind with.
TOPIC_USES: dict[tuple[str, str], tuple[set[str], set[str]]] = {
    ("submission", N.status): ({OWN_STATUS_Q, OTHER_STATUS_Q, f"{H}.status.#"}, set()),
    ("scheduler", N.status): ({OWN_STATUS_Q, OTHER_STATUS_Q, f"{H}.status.#"}, set()),
    ("supervisor", N.status): ({OWN_STATUS_Q, OTHER_STATUS_Q, f"{H}.status.#"}, set()),
    ("scheduler", N.replies): (set(), {REPLY_Q, f"{H}.reply.#"}),
    **{(f"agent-{a}", N.replies): ({REPLY_Q, f"{H}.reply.#"}, set()) for a in AGENTS},
    ("shop", N.status): (set(), {OWN_STATUS_Q}),
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
    document["topic_permissions"] = [
        t for t in document["topic_permissions"] if t["user"] != "shop"
    ]
    problems = permission_problems(document)
    assert any(p.startswith("agent-payment read: extra") for p in problems)
    assert "shop has no topic permission on h.status (so: any key)" in problems
    assert "shop uses h.status without topic permissions" in problems


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


# -- MongoDB: the init script


def test_the_init_script_makes_the_adapters_indexes() -> None:
    names = [spec.options["name"] for spec in indexes()]
    assert "state_claimable" in names and "inbox_expiry" in names and len(set(names)) == len(names)
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
    assert refused == {"error": f"{PASSWORD_VARIABLE} is not set (see .env.example)"}
