"""The compose deployment's hardening, checked statically (no Docker engine runs here): who
reaches whom over which network, the containers' privileges (read-only root filesystems with
their writable paths declared, capabilities, no-new-privileges, memory and pids limits), the
images' versions and digests, and the secrets (files, as compose requires for read-only
containers, each written by infra/secrets.sh). Each check returns the problems it finds and has a
case showing that it can fail."""

from __future__ import annotations

import copy
import itertools
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployment.secretfiles import secrets
from tests.unit.test_compose import COMPOSE, DOCKERFILE, STORE_USERS, dockerfile_images

ROOT = Path(__file__).resolve().parents[2]
RABBITMQ_CONF = (ROOT / "infra" / "rabbitmq" / "rabbitmq.conf").read_text()
ENTRYPOINT = (ROOT / "infra" / "rabbitmq" / "entrypoint.sh").read_text()
AGENTS = {"agent-inventory", "agent-payment", "agent-shipping"}
SERVERS = {"rabbitmq", "mongodb", "postgres"}


def services(compose: dict[str, Any] = COMPOSE) -> dict[str, dict[str, Any]]:
    return dict(compose["services"])


def networks_of(svc: dict[str, Any]) -> set[str]:
    found = svc.get("networks") or {}
    return set(found) if isinstance(found, dict | list) else set()


# -- networks: each container reaches only what it talks to

TALKS_TO: dict[str, set[str]] = {
    "init": {"rabbitmq", "mongodb", "postgres"},
    "submission": {"rabbitmq", "mongodb", "postgres"},
    "scheduler": {"rabbitmq", "mongodb", "postgres"},
    "supervisor": {"rabbitmq", "mongodb", "postgres"},
    **{agent: {"rabbitmq", "mongodb", "postgres", "remote"} for agent in AGENTS},
    # `orderflow audit` reads the remote stand-in's ledger (with the operator token).
    "operator": {"rabbitmq", "mongodb", "postgres", "remote"},
    "shop": {"rabbitmq"},
    # The HTTP API: the broker (as an application, and as the operator for dead letters) and
    # the store; browsers reach it through its published port.
    "api": {"rabbitmq", "mongodb", "postgres"},
    # The notifier (profile `notifier`): the alert feed, its inbox and the alerts' states, and
    # the webhooks outside, through its own gateway network.
    "notifier": {"rabbitmq", "mongodb", "postgres"},
    "remote": set(),
    "rabbitmq": set(),
    "mongodb": set(),
    "postgres": set(),
    # The profile `observability`: Prometheus scrapes over the monitoring network (port 9100)
    # and Jaeger receives spans there; Grafana queries both.
    "prometheus": set(),
    "jaeger": set(),
    "grafana": {"prometheus", "jaeger"},
}
"""Who opens a connection to whom, from the code: every `orderflow serve` process but the remote
stand-in opens the store and the broker (shared/bootstrap.Runtime.open), the agents call the
remote service (services/agents), `orderflow init` and the operator's commands open both, an
application (`orderflow submit`) only the broker. The servers call nobody."""
MONITORING = "monitoring"
"""The network of every serving process's /metrics and /healthz (port 9100), for a scraper."""
EXPECTED_NETWORKS = {
    "broker": {
        "rabbitmq",
        "init",
        "submission",
        "scheduler",
        "supervisor",
        "operator",
        "api",
        "notifier",
    }
    | AGENTS,
    "apps": {"rabbitmq", "shop"},
    "store": {"mongodb", "postgres", "api"} | STORE_USERS,
    "remote": {"remote", "operator"} | AGENTS,
    MONITORING: {
        "remote",
        "submission",
        "scheduler",
        "supervisor",
        "api",
        "notifier",
        "prometheus",
        "jaeger",
    }
    | AGENTS,
    "ingress": {"rabbitmq"},
    "web": {"api"},
    "notify": {"notifier"},
    "grafana-prometheus": {"grafana", "prometheus"},
    "grafana-jaeger": {"grafana", "jaeger"},
    "grafana-web": {"grafana"},
    "prometheus-web": {"prometheus"},
    "jaeger-web": {"jaeger"},
}
PUBLISHED = {
    "rabbitmq": {"127.0.0.1:5672:5672", "127.0.0.1:15672:15672"},
    "api": {"127.0.0.1:8000:8000"},
    "prometheus": {"127.0.0.1:9090:9090"},
    "grafana": {"127.0.0.1:3000:3000"},
    "jaeger": {"127.0.0.1:16686:16686"},
}
GATEWAYS = {"ingress", "web", "grafana-web", "prometheus-web", "jaeger-web", "notify"}
"""The networks that route out: each for one server's ports published on 127.0.0.1, and the
notifier's, for the webhooks it calls."""


ADDED_PROFILES = {"tools", "notifier", "observability"}
"""Profiles that add services beside the rest, unlike the stores' alternatives."""


def together(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two services can run at once: not when their profiles are alternatives (the
    stores: `mongodb` or `postgres`). Every other profile (`tools`, `notifier`, `observability`)
    runs beside anything."""
    pa = set(a.get("profiles") or []) - ADDED_PROFILES
    pb = set(b.get("profiles") or []) - ADDED_PROFILES
    return not (pa and pb and not pa & pb)


def reachable(
    compose: dict[str, Any], *, skip: frozenset[str] = frozenset()
) -> set[tuple[str, str]]:
    """Pairs of services that run at once and share a network (either may open a connection to
    the other)."""
    every = services(compose)
    members: dict[str, set[str]] = {}
    for name, svc in every.items():
        for network in networks_of(svc) - skip:
            members.setdefault(network, set()).add(name)
    return {
        (a, b)
        for group in members.values()
        for a, b in itertools.permutations(group, 2)
        if together(every[a], every[b])
    }


ISOLATED = {"shop", "remote"}
"""Beside the servers they talk to, these reach nobody: an application (a tenant) and the
stand-in for the outside world."""


def membership_problems(compose: dict[str, Any]) -> list[str]:
    problems = []
    for name, svc in services(compose).items():
        if not networks_of(svc):
            problems.append(f"{name} is on the default network (every container's)")
    for network, options in (compose.get("networks") or {}).items():
        internal = bool((options or {}).get("internal"))
        if network in GATEWAYS:
            if internal:
                problems.append(f"{network} must route out (its ports on 127.0.0.1)")
        elif not internal:
            problems.append(f"network {network} is not internal: its members can reach out")
        members = {n for n, svc in services(compose).items() if network in networks_of(svc)}
        if members != EXPECTED_NETWORKS.get(network):
            problems.append(f"network {network} holds {sorted(members)}")
    return problems


def reach_problems(compose: dict[str, Any]) -> list[str]:
    """Beyond the monitoring network (where only port 9100 is meant), a container reaches only
    what it talks to, or a fellow client of the same server (they share its network)."""
    allowed = {(a, b) for a, targets in TALKS_TO.items() for b in targets}
    allowed |= {(b, a) for a, b in allowed}
    allowed |= {
        (a, b)
        for a, b in itertools.permutations(set(TALKS_TO) - SERVERS - ISOLATED, 2)
        if TALKS_TO[a] & TALKS_TO[b]
    }
    pairs = reachable(compose, skip=frozenset({MONITORING}))
    return [f"{a} reaches {b}, which it never talks to" for a, b in sorted(pairs - allowed)]


def port_problems(compose: dict[str, Any]) -> list[str]:
    problems = []
    for name, svc in services(compose).items():
        ports = set(map(str, svc.get("ports") or []))
        if ports != PUBLISHED.get(name, set()):
            problems.append(f"{name} publishes {sorted(ports)}")
        if ports and not GATEWAYS & networks_of(svc):
            problems.append(f"{name} publishes ports from internal networks only")
    return problems


def network_problems(compose: dict[str, Any]) -> list[str]:
    return membership_problems(compose) + reach_problems(compose) + port_problems(compose)


def test_each_container_reaches_only_what_it_talks_to() -> None:
    assert network_problems(COMPOSE) == []
    pairs = reachable(COMPOSE, skip=frozenset({MONITORING}))
    assert {b for a, b in pairs if a == "shop"} == {"rabbitmq"}
    assert {a for a, b in pairs if b in ("mongodb", "postgres")} == STORE_USERS | {"api"}
    assert {a for a, b in pairs if b == "remote"} == AGENTS | {"operator"}
    assert set(TALKS_TO) == set(services())


def test_the_network_check_can_fail() -> None:
    bad = copy.deepcopy(COMPOSE)
    bad["services"]["shop"]["networks"] = ["apps", "store"]  # a shop next to the database
    bad["services"]["remote"]["networks"] = ["remote", "broker", MONITORING]
    bad["networks"]["store"] = {}  # and the store routes out
    del bad["services"]["init"]["networks"]
    problems = network_problems(bad)
    assert "network store is not internal: its members can reach out" in problems
    assert "shop reaches mongodb, which it never talks to" in problems
    assert "remote reaches rabbitmq, which it never talks to" in problems
    assert "init is on the default network (every container's)" in problems
    bad = copy.deepcopy(COMPOSE)
    bad["services"]["mongodb"]["ports"] = ["27017:27017"]
    assert network_problems(bad) == [
        "mongodb publishes ['27017:27017']",
        "mongodb publishes ports from internal networks only",
    ]


# -- privileges: read-only, no capabilities beyond the entrypoints', limits

CAPABILITIES = {
    # As root, each server's entrypoint walks its data directory and chowns it to the server's
    # user (CHOWN, and DAC_READ_SEARCH to enter the server's own 0700 directories), then drops
    # to that user with gosu (SETUID, SETGID). RabbitMQ's also chowns the rendered definitions,
    # and its healthcheck (root) reads the Erlang cookie (rabbitmq's, 0400: DAC_READ_SEARCH).
    # MongoDB's (infra/mongodb/entrypoint.sh) first copies the replica set's keyfile secret,
    # whatever its host mode (DAC_READ_SEARCH), and hands the copy to mongodb (CHOWN).
    "rabbitmq": {"CHOWN", "DAC_READ_SEARCH", "SETGID", "SETUID"},
    "mongodb": {"CHOWN", "DAC_READ_SEARCH", "SETGID", "SETUID"},
    "postgres": {"CHOWN", "DAC_READ_SEARCH", "SETGID", "SETUID"},
}
"""Capabilities given back after `cap_drop: [ALL]`; the orderflow image (user 10001) needs none."""
WRITABLE = {
    # rabbitmq: its data (mnesia/khepri, the Erlang cookie), the rendered definitions
    # (entrypoint.sh), mktemp's work directory (render-definitions.sh), log files.
    "rabbitmq": {"/var/lib/rabbitmq", "/run/orderflow", "/tmp", "/var/log/rabbitmq"},
    # mongod: its data, its socket and pid file and the entrypoint's parsed config (/tmp), the
    # keyfile's copy, 0400 and mongodb's (/run/orderflow); /data/configdb is the image's
    # anonymous volume.
    "mongodb": {"/data/db", "/run/orderflow", "/tmp"},
    # postgres: its data, its socket and lock file, psql's heredocs during init.
    "postgres": {"/var/lib/postgresql/data", "/var/run/postgresql", "/tmp"},
    "remote": {"/data", "/tmp"},  # the ledger (SQLite, with its -wal and -shm files)
    "prometheus": {"/prometheus", "/tmp"},  # its time-series database
    "grafana": {"/var/lib/grafana", "/tmp"},  # its own database, sessions and plugins
}
"""Every path a container writes: a volume or a tmpfs (the root filesystem is read-only)."""
MEMORY_CAP = {"rabbitmq": 1 << 30, "mongodb": 1 << 30, "postgres": 1 << 30}
DEFAULT_MEMORY_CAP = 512 << 20
PIDS_CAP = {"rabbitmq": 1024, "mongodb": 512, "postgres": 512}
DEFAULT_PIDS_CAP = 128


def size(value: object) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    match = re.fullmatch(r"(\d+)([kmg]?)b?", str(value).lower())
    assert match, value
    return int(match.group(1)) * units.get(match.group(2), 1)


def writable_paths(svc: dict[str, Any]) -> set[str]:
    paths = {str(entry).split(":")[0] for entry in svc.get("tmpfs") or []}
    for mount in map(str, svc.get("volumes") or []):
        _, target, *options = mount.split(":")
        if "ro" not in options:
            paths.add(target)
    return paths


def privilege_problems(compose: dict[str, Any]) -> list[str]:
    problems = []
    for name, svc in services(compose).items():
        if svc.get("read_only") is not True:
            problems.append(f"{name}: the root filesystem is writable")
        if svc.get("cap_drop") != ["ALL"]:
            problems.append(f"{name}: capabilities are not all dropped")
        extra = set(svc.get("cap_add") or []) - CAPABILITIES.get(name, set())
        if extra:
            problems.append(f"{name}: capabilities {sorted(extra)} given back")
        if "no-new-privileges:true" not in (svc.get("security_opt") or []):
            problems.append(f"{name}: may gain privileges (no-new-privileges)")
        if "privileged" in svc or svc.get("network_mode") == "host" or "pid" in svc:
            problems.append(f"{name}: shares the host's privileges or namespaces")
        memory = svc.get("mem_limit")
        if memory is None or size(memory) > MEMORY_CAP.get(name, DEFAULT_MEMORY_CAP):
            problems.append(f"{name}: memory limit {memory}")
        pids = svc.get("pids_limit")
        if not isinstance(pids, int) or not 0 < pids <= PIDS_CAP.get(name, DEFAULT_PIDS_CAP):
            problems.append(f"{name}: pids limit {pids}")
        if writable_paths(svc) != WRITABLE.get(name, {"/tmp"}):
            problems.append(f"{name}: writes {sorted(writable_paths(svc))}")
    return problems


def test_every_container_runs_read_only_unprivileged_and_limited() -> None:
    assert privilege_problems(COMPOSE) == []
    # The broker's rendered definitions are written where it loads them from, on its tmpfs.
    loaded = re.search(r"^load_definitions = (\S+)$", RABBITMQ_CONF, re.M)
    assert loaded is not None
    assert f"output=${{ORDERFLOW_DEFINITIONS_OUTPUT:-{loaded.group(1)}}}" in ENTRYPOINT
    assert str(Path(loaded.group(1)).parent) in WRITABLE["rabbitmq"]
    # Its memory alarm sits below the container's limit.
    watermark = re.search(r"^vm_memory_high_watermark\.absolute = (\d+)$", RABBITMQ_CONF, re.M)
    assert watermark is not None
    assert int(watermark.group(1)) < size(COMPOSE["services"]["rabbitmq"]["mem_limit"])


def test_the_privilege_check_can_fail() -> None:
    bad = copy.deepcopy(COMPOSE)
    bad["services"]["scheduler"]["read_only"] = False
    bad["services"]["scheduler"]["cap_add"] = ["NET_ADMIN"]
    bad["services"]["postgres"]["cap_add"] = ["CHOWN", "SYS_ADMIN"]
    bad["services"]["mongodb"]["security_opt"] = []
    bad["services"]["rabbitmq"]["mem_limit"] = "8g"
    bad["services"]["rabbitmq"]["tmpfs"] = ["/tmp"]  # the definitions have nowhere to go
    del bad["services"]["shop"]["pids_limit"]
    assert privilege_problems(bad) == [
        "rabbitmq: memory limit 8g",
        "rabbitmq: writes ['/tmp', '/var/lib/rabbitmq']",
        "mongodb: may gain privileges (no-new-privileges)",
        "postgres: capabilities ['SYS_ADMIN'] given back",
        "scheduler: the root filesystem is writable",
        "scheduler: capabilities ['NET_ADMIN'] given back",
        "shop: pids limit None",
    ]


# -- images: patched releases, pinned by digest

DIGEST = re.compile(r"^(?P<name>[\w./-]+):(?P<tag>[\w.-]+)@sha256:(?P<digest>[0-9a-f]{64})$")
PATCHED = {
    # CVE-2025-14847 (unauthenticated memory disclosure): fixed in 8.0.17. Stay on 8.0.
    "mongo": ((8, 0), (8, 0, 17)),
    # CVE-2025-1094 (psql quoting): fixed in 16.7. A new major needs pg_upgrade: stay on 16.
    "postgres": ((16,), (16, 7)),
    # 3.13 is out of community support; 4.x is the supported series.
    "rabbitmq": ((4,), (4, 0, 0)),
    "python": ((3, 11), (3, 11, 0)),
    # The profile `observability`: Prometheus's 3.5 LTS line, Grafana 12, Jaeger 1.x (v1's
    # all-in-one, one container with OTLP and in-memory storage).
    "prom/prometheus": ((3, 5), (3, 5, 0)),
    "grafana/grafana": ((12,), (12, 1, 0)),
    "jaegertracing/all-in-one": ((1,), (1, 76, 0)),
}
"""Image -> (the release line it must stay on, the lowest patched release)."""
FOUND_DIGESTS = {
    "rabbitmq:4.3.5-management": "06fb591136a49e861e01aaaf9ce45085839ca23c35913d45a1e83519bb9778ca",
    "mongo:8.0.17": "9814652e33f0cf8b9fddea8b46dfc9d8e19b130dcfdd7b510ca58bb0d40c8b71",
    "postgres:16.15-bookworm": "bb3e1a57e5407e0a5280b4211980a5e537f4abd234a87014ac979849a78dd825",
    "python:3.11.16-slim-bookworm": (
        "528257d48c1da0dcecc2e725d1ae34498d60c965f1241e39cd6a85a8859bdf84"
    ),
    "prom/prometheus:v3.5.0": "63805ebb8d2b3920190daf1cb14a60871b16fd38bed42b857a3182bc621f4996",
    "grafana/grafana:12.1.0": "6ac590e7cabc2fbe8d7b8fc1ce9c9f0582177b334e0df9c927ebd9670469440f",
    "jaegertracing/all-in-one:1.76.0": (
        "ab6f1a1f0fb49ea08bcd19f6b84f6081d0d44b364b6de148e1798eb5816bacac"
    ),
}
"""The digests in use, each one published for its tag (where it was found: the design
decisions, docs/decisions/). A bump changes this table too, with the digest
`docker buildx imagetools inspect` prints for the tag: a digest typed from nowhere fails here."""


def version_of(tag: str) -> tuple[int, ...]:
    match = re.match(r"v?(\d+(\.\d+)*)", tag)  # prom/prometheus tags its releases v3.5.0
    assert match, tag
    return tuple(int(part) for part in match.group(1).split("."))


def image_problems(images: list[str]) -> list[str]:
    problems = []
    for image in images:
        if image.startswith("orderflow:"):
            continue  # built here, from infra/Dockerfile
        pinned = DIGEST.match(image)
        if pinned is None:
            problems.append(f"{image}: not pinned by tag and digest")
            continue
        name, tag = pinned.group("name"), pinned.group("tag")
        if FOUND_DIGESTS.get(f"{name}:{tag}") != pinned.group("digest"):
            problems.append(f"{image}: a digest not recorded as found for {name}:{tag}")
        line, lowest = PATCHED.get(name, ((), ()))
        version = version_of(tag)
        if not line:
            problems.append(f"{image}: no patched release recorded for {name}")
        elif version[: len(line)] != line or version < lowest:
            problems.append(f"{image}: {name} must be {'.'.join(map(str, lowest))} or later")
    return problems


def all_images() -> list[str]:
    return [str(svc["image"]) for svc in services().values()] + dockerfile_images(DOCKERFILE)


def test_every_image_is_a_patched_release_pinned_by_digest() -> None:
    assert image_problems(all_images()) == []
    names = {image.split(":")[0] for image in all_images()}
    assert {"rabbitmq", "mongo", "postgres", "python", "orderflow"} | {
        "prom/prometheus",
        "grafana/grafana",
        "jaegertracing/all-in-one",
    } == names
    # The Dockerfile's two stages share one base.
    assert len(set(dockerfile_images(DOCKERFILE))) == 1


def test_the_image_check_can_fail() -> None:
    digest = FOUND_DIGESTS["mongo:8.0.17"]
    assert (
        image_problems(
            [
                "mongo:8.0.4",  # the vulnerable release, by tag
                f"mongo:8.0.4@sha256:{digest}",  # a digest of another tag
                "postgres:16.6-bookworm@sha256:" + "1" * 64,
                "rabbitmq:3.13.7-management@sha256:" + "2" * 64,
                "postgres:17.2@sha256:" + "3" * 64,
            ]
        )
        == [
            "mongo:8.0.4: not pinned by tag and digest",
            f"mongo:8.0.4@sha256:{digest}: a digest not recorded as found for mongo:8.0.4",
            f"mongo:8.0.4@sha256:{digest}: mongo must be 8.0.17 or later",
            "postgres:16.6-bookworm@sha256:" + "1" * 64 + ": a digest not recorded as found for "
            "postgres:16.6-bookworm",
            "postgres:16.6-bookworm@sha256:" + "1" * 64 + ": postgres must be 16.7 or later",
            "rabbitmq:3.13.7-management@sha256:" + "2" * 64 + ": a digest not recorded as found "
            "for rabbitmq:3.13.7-management",
            "rabbitmq:3.13.7-management@sha256:" + "2" * 64 + ": rabbitmq must be 4.0.0 or later",
            "postgres:17.2@sha256:"
            + "3" * 64
            + ": a digest not recorded as found for postgres:17.2",
            "postgres:17.2@sha256:" + "3" * 64 + ": postgres must be 16.7 or later",
        ]
    )


REMOVED_IN_4 = re.compile(
    r"ha-mode|ha-params|ha-sync|ha-promote|queue-master-locator|cluster_partition_handling"
    r"|mirroring_|x-queue-version|management_agent\.disable_metrics_collector"
)
"""Classic queue mirroring (removed in 4.0), partition handling (a no-op in 4.3), CQv1."""


def test_the_broker_configuration_holds_nothing_rabbitmq_4_removed() -> None:
    definitions = (ROOT / "infra" / "rabbitmq" / "definitions.json").read_text()
    assert not REMOVED_IN_4.search(RABBITMQ_CONF + definitions)
    # One policy only, lifting the dead-letter queues' delivery limit (issue 33): no 4.x-removed
    # key hides in a policy.
    policies = yaml.safe_load(definitions)["policies"]
    assert [set(p["definition"]) for p in policies] == [{"delivery-limit"}]
    assert REMOVED_IN_4.search('{"policies": [{"definition": {"ha-mode": "all"}}]}')


# -- secrets: files, each one written by infra/secrets.sh


def secret_problems(compose: dict[str, Any]) -> list[str]:
    problems = []
    declared = compose.get("secrets") or {}
    written = {secret.name for secret in secrets()}
    if set(declared) != written:
        problems.append(
            f"compose's secrets and infra/secrets.sh's differ: {sorted(set(declared) ^ written)}"
        )
    for name, secret in declared.items():
        if set(secret) != {"file"}:
            # compose copies any other kind into the container, which a read-only one refuses.
            problems.append(f"secret {name} is not a file (compose refuses it when read-only)")
        elif secret["file"] != f"${{SECRETS_DIR:-./secrets}}/{name}":
            problems.append(f"secret {name} is read from {secret['file']}")
    for name, svc in services(compose).items():
        for entry in svc.get("secrets") or []:
            source = entry if isinstance(entry, str) else entry["source"]
            if source not in declared:
                problems.append(f"{name} uses the undeclared secret {source}")
    return problems


def test_every_secret_is_a_file_the_secrets_script_writes() -> None:
    assert secret_problems(COMPOSE) == []


def test_the_secret_check_can_fail() -> None:
    bad = copy.deepcopy(COMPOSE)
    bad["secrets"]["store_url"] = {"environment": "ORDERFLOW_STORE_URL"}
    bad["secrets"]["extra"] = {"file": "/etc/shadow"}
    bad["services"]["shop"]["secrets"].append("nonexistent")
    assert secret_problems(bad) == [
        "compose's secrets and infra/secrets.sh's differ: ['extra']",
        "secret store_url is not a file (compose refuses it when read-only)",
        "secret extra is read from /etc/shadow",
        "shop uses the undeclared secret nonexistent",
    ]


@pytest.mark.parametrize("name", sorted(WRITABLE))
def test_the_writable_paths_are_this_services_own(name: str) -> None:
    """A named volume holds data; a tmpfs holds what a restart may lose."""
    svc = services()[name]
    named = set(COMPOSE.get("volumes") or {})
    for mount in map(str, svc.get("volumes") or []):
        source, *_ = mount.split(":")
        assert source in named or mount.endswith(":ro"), mount
