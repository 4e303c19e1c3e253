"""The compose deployment's secrets, and `infra/secrets.sh`, which writes them.

Every password, token and connection URL reaches its container as a compose secret: a file under
`/run/secrets/`, never an environment variable. They are file-based (`secrets: name: file:`)
because compose copies an environment-sourced secret into the container, which a read-only root
filesystem refuses (compose says so at `up`: "`file` is the sole supported option"). Each file
lives in `${SECRETS_DIR:-./secrets}` on the host (ignored by git and by the image build).

`sh infra/secrets.sh [mongodb|postgres]` writes a random value for every password and token that
has no file yet (an existing file is never changed), then the connection URLs that embed them:
each orderflow container reads its own broker URL and the store URL as settings, through
`ORDERFLOW_SECRETS_DIR` (pydantic-settings' secrets directory: file `orderflow_rabbitmq_url` is
`ORDERFLOW_RABBITMQ_URL`).

MongoDB runs as a one-member replica set (`REPLICA_SET`): its members authenticate to each other
with the shared key in `mongo_keyfile` (random like a password; a key of your own must be in
mongod's keyfile format, which the script checks), and the store URL names the set, so the driver
finds every member from the one it is given.
"""

from __future__ import annotations

from dataclasses import dataclass

from deployment.rabbitmq import DEFAULT_APPS, password_variable, user_names
from shared.broker.access import SERVICE_ROLES

HUB = "orderflow"
"""The compose deployment's hub, RabbitMQ vhost and database (deployment.files)."""
BROKER = "rabbitmq:5672"
URL_SAFE = "A-Za-z0-9._~-"
"""Characters a value may hold: it goes into a URL unescaped."""
REPLICA_SET = "rs0"
"""The compose MongoDB's replica set (`mongod --replSet`, infra/mongodb/replica-set.js)."""
KEYFILE = "mongo_keyfile"
"""The secret holding the replica set's key (`mongod --keyFile`, through
infra/mongodb/entrypoint.sh)."""
KEY_CHARACTERS = "A-Za-z0-9+/="
"""What mongod accepts in a keyfile besides whitespace (the base64 alphabet), 6 to 1024 of them."""


@dataclass(frozen=True)
class Secret:
    name: str
    """The compose secret, and its file's name."""
    what: str
    """What it is, for the script's and compose's comments."""
    url: tuple[str, str, str] | None = None
    """A URL built from another secret: (before, the secret holding the password, after)."""
    given: bool = False
    """A value only the operator can give (a webhook's URL): written empty when it has no file
    (empty: unset), never made up."""
    account: tuple[str, str, str] | None = None
    """The remote stand-in's entry of an account, built from two other secrets: (the account,
    the secret holding its key, the one holding its fence key) (harness/remote/accounts.py)."""


def broker_password(role: str, *, app: bool = False) -> str:
    """`rabbitmq_scheduler_password`: the secret of a broker user's password (its file is what
    the broker container's `RABBITMQ_SCHEDULER_PASSWORD_FILE` names)."""
    return password_variable(role, app=app).lower()


def broker_url(role: str, *, app: bool = False) -> str:
    """`rabbitmq_scheduler_url`: the secret of a broker user's connection URL."""
    return broker_password(role, app=app).removesuffix("_password") + "_url"


STORE_URLS = {
    "mongodb": (
        "mongodb://orderflow:",
        "mongo_app_password",
        f"@mongodb:27017/orderflow?authSource=orderflow&replicaSet={REPLICA_SET}",
    ),
    "postgres": ("postgresql://orderflow:", "postgres_app_password", "@postgres:5432/orderflow"),
}
"""The store URL of each profile: the application user's, as `orderflow init` and every process
use it."""
API_STORE_URLS = {
    "mongodb": (
        "mongodb://orderflow_api:",
        "mongo_api_password",
        f"@mongodb:27017/orderflow?authSource=orderflow&replicaSet={REPLICA_SET}",
    ),
    "postgres": (
        "postgresql://orderflow_api:",
        "postgres_api_password",
        "@postgres:5432/orderflow",
    ),
}
"""The HTTP API's store URL of each profile: a user of its own that reads and writes rows, and
changes no structure (infra/postgres/init-app-user.sh, infra/mongodb/init-orderflow.js)."""
PROFILE_URLS = {"store_url": STORE_URLS, "store_api_url": API_STORE_URLS}
"""The URL secrets that depend on the store profile."""

STORE_SECRETS = [
    Secret(
        "mongo_root_password", "MongoDB's root user (profile mongodb; creates the app user once)"
    ),
    Secret("mongo_app_password", "MongoDB user `orderflow`: readWrite on the hub's database only"),
    Secret(KEYFILE, "MongoDB's replica-set key: its members authenticate to each other with it"),
    Secret("postgres_password", "PostgreSQL's superuser `postgres` (profile postgres)"),
    Secret("postgres_app_password", "PostgreSQL role `orderflow`: owns database `orderflow` only"),
    Secret(
        "mongo_api_password",
        "MongoDB user `orderflow_api` (the HTTP API): the hub's documents only, no structure",
    ),
    Secret(
        "postgres_api_password",
        "PostgreSQL role `orderflow_api` (the HTTP API): rows of database `orderflow` only",
    ),
]

NOTIFY_SECRETS = [
    Secret(name, f"the notifier's {what} (write it here; empty: none)", given=True)
    for name, what in (
        ("notify_webhook_url", "generic JSON webhook URL"),
        ("notify_slack_url", "Slack incoming-webhook URL"),
        ("notify_pagerduty_routing_key", "PagerDuty Events v2 routing key"),
    )
]
"""The notifier's targets (profile `notifier`): URLs and a key that may carry a credential,
so secrets like the others, which only the operator can fill in."""


REMOTE_ACCOUNT_SECRETS = [
    Secret("remote_account_key", "the key the agents call the remote stand-in with (the hub's)"),
    Secret("remote_fence_key", "the key the schedulers sign fencing tokens with (not the agents)"),
    Secret(
        "remote_accounts",
        "the remote stand-in's account of the hub: its key and fence key",
        account=(HUB, "remote_account_key", "remote_fence_key"),
    ),
]
"""The hub's account at the remote stand-in: the agents hold its key, the schedulers its fence
key, the stand-in both (harness/remote/accounts.py)."""


def secrets(apps: tuple[str, ...] = DEFAULT_APPS) -> list[Secret]:
    """Every secret of the compose deployment, passwords and tokens before the URLs."""
    users = user_names(HUB)
    found = [
        Secret(broker_password(role), f"RabbitMQ user {users[role]}'s password")
        for role in SERVICE_ROLES
    ]
    found += [
        Secret(broker_password(app, app=True), f"RabbitMQ user {app}'s password (an application)")
        for app in apps
    ]
    found += STORE_SECRETS
    found.append(
        Secret("remote_admin_token", "bearer token of the remote stand-in's /admin and /ledger")
    )
    found += REMOTE_ACCOUNT_SECRETS
    found += NOTIFY_SECRETS
    found.append(Secret("grafana_admin_password", "Grafana's `admin` (profile observability)"))
    found += [
        Secret(
            broker_url(role),
            f"{users[role]}'s broker URL",
            (f"amqp://{users[role]}:", broker_password(role), f"@{BROKER}/{HUB}"),
        )
        for role in SERVICE_ROLES
    ]
    found += [
        Secret(
            broker_url(app, app=True),
            f"{app}'s broker URL",
            (f"amqp://{app}:", broker_password(app, app=True), f"@{BROKER}/{HUB}"),
        )
        for app in apps
    ]
    found.append(Secret("store_api_url", "the HTTP API's store URL of the chosen profile"))
    found.append(Secret("store_url", "the store URL of the chosen profile (mongodb or postgres)"))
    return found


def secrets_script(apps: tuple[str, ...] = DEFAULT_APPS) -> str:
    """`infra/secrets.sh`: POSIX sh, od and tr, run from anywhere in the repository."""
    lines = [
        "#!/bin/sh",
        "# Generated by `orderflow deploy write` (deployment/secretfiles.py): do not edit.",
        "#",
        "# sh infra/secrets.sh [mongodb|postgres]",
        "#",
        "# Writes the compose deployment's secret files into ${SECRETS_DIR:-secrets} (relative to",
        "# the repository, as docker-compose.yml reads them): a random value for each password,",
        "# token and key without a file (an existing file is kept: put your own value there",
        "# first if you like, URL-safe; a key in mongod's keyfile format), then the connection",
        "# URLs built from them (rewritten every run, so run it again after changing a password",
        "# file). The directory is for its owner only; the files are readable by the containers'",
        "# users (a compose file secret is a bind mount).",
        "set -eu",
        "",
        "store=${1:-mongodb}",
        "case $store in",
        "    mongodb | postgres) ;;",
        '    *) echo "usage: sh infra/secrets.sh [mongodb|postgres]" >&2; exit 2 ;;',
        "esac",
        'cd "$(dirname "$0")/.."',
        "dir=${SECRETS_DIR:-secrets}",
        'mkdir -p "$dir"',
        'chmod 700 "$dir"',
        "umask 022",
        "",
        "random_secret() {  # NAME: 32 random bytes as hex, unless NAME has a value already",
        '    if [ -s "$dir/$1" ]; then',
        "        return 0",
        "    fi",
        '    od -An -N32 -tx1 /dev/urandom | tr -d " \\n" > "$dir/$1.new"',
        '    mv "$dir/$1.new" "$dir/$1"',
        '    echo "secrets: wrote $dir/$1"',
        "}",
        "",
        "url_secret() {  # NAME BEFORE PASSWORD-SECRET AFTER",
        '    password=$(cat "$dir/$3")',
        "    case $password in",
        f"        '' | *[!{URL_SAFE}]*)",
        f'            echo "secrets: $dir/$3 must be URL-safe ({URL_SAFE})" >&2',
        "            exit 1",
        "            ;;",
        "    esac",
        "    # printf is a builtin: the password is in no argument list.",
        '    printf "%s%s%s" "$2" "$password" "$4" > "$dir/$1.new"',
        '    mv "$dir/$1.new" "$dir/$1"',
        "}",
        "",
        "given_secret() {  # NAME: empty (unset) unless it has a file; the operator fills it in",
        '    if [ ! -e "$dir/$1" ]; then',
        '        : > "$dir/$1"',
        '        echo "secrets: wrote $dir/$1 (empty: write its value there to use it)"',
        "    fi",
        "}",
        "",
        "account_secret() {  # NAME ACCOUNT KEY-SECRET FENCE-SECRET: the remote's entry",
        '    key=$(cat "$dir/$3")',
        '    fence=$(cat "$dir/$4")',
        '    for value in "$key" "$fence"; do',
        "        case $value in",
        f"            '' | *[!{URL_SAFE}]*)",
        f'                echo "secrets: $dir/$3 and $dir/$4 must be URL-safe ({URL_SAFE})" >&2',
        "                exit 1",
        "                ;;",
        "        esac",
        '        if [ "${#value}" -lt 16 ]; then',
        '            echo "secrets: $dir/$3 and $dir/$4 must hold 16 characters or more" >&2',
        "            exit 1",
        "        fi",
        "    done",
        '    if [ "$key" = "$fence" ]; then',
        '        echo "secrets: $dir/$3 and $dir/$4 must differ" >&2',
        "        exit 1",
        "    fi",
        '    printf "%s:%s:%s" "$2" "$key" "$fence" > "$dir/$1.new"',
        '    mv "$dir/$1.new" "$dir/$1"',
        "    unset key fence value",
        "}",
        "",
        "keyfile_check() {  # NAME: what mongod accepts as a keyfile (it ignores whitespace)",
        "    key=$(tr -d ' \\t\\n\\r\\f\\v' < \"$dir/$1\")",
        "    case $key in",
        f"        *[!{KEY_CHARACTERS}]*)",
        '            echo "secrets: $dir/$1 must hold base64 characters only'
        f' ({KEY_CHARACTERS})" >&2',
        "            exit 1",
        "            ;;",
        "    esac",
        '    if [ "${#key}" -lt 6 ] || [ "${#key}" -gt 1024 ]; then',
        '        echo "secrets: $dir/$1 must hold 6 to 1024 base64 characters" >&2',
        "        exit 1",
        "    fi",
        "    unset key",
        "}",
        "",
    ]
    for secret in secrets(apps):
        if secret.given:
            lines.append(f"given_secret {secret.name}  # {secret.what}")
        elif secret.url is None and secret.account is None and secret.name not in PROFILE_URLS:
            lines.append(f"random_secret {secret.name}  # {secret.what}")
    # 64 hex digits: in the base64 alphabet, so a valid key; one of your own is checked.
    lines += [f"keyfile_check {KEYFILE}", ""]
    for secret in secrets(apps):
        if secret.account is not None:
            lines.append(f"account_secret {secret.name} {' '.join(secret.account)}")
    for secret in secrets(apps):
        if secret.url is not None:
            before, password, after = secret.url
            lines.append(f"url_secret {secret.name} '{before}' {password} '{after}'")
    lines += ["", "case $store in"]
    for store in STORE_URLS:
        lines.append(f"    {store})")
        for name, urls in PROFILE_URLS.items():
            before, password, after = urls[store]
            lines.append(f"        url_secret {name} '{before}' {password} '{after}'")
        lines.append("        ;;")
    lines += [
        "esac",
        "unset password",
        "# Readable by the containers' users (postgres, mongodb and orderflow run unprivileged).",
        "chmod 644 \\",
        *[f'    "$dir/{secret.name}" \\' for secret in secrets(apps)[:-1]],
        f'    "$dir/{secrets(apps)[-1].name}"',
        'echo "secrets: $dir holds every secret of docker-compose.yml (store: $store)"',
    ]
    return "\n".join(lines) + "\n"
