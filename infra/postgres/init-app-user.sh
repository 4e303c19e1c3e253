#!/bin/sh
# Run once by the postgres image (/docker-entrypoint-initdb.d) on an empty data directory, as
# the superuser. Creates the application's role: it may log in and owns its database (where
# `orderflow init` creates the hub's schema), and nothing else: no superuser, no CREATEDB, no
# CREATEROLE, no connection to any other database. The password is read from the file
# POSTGRES_APP_PASSWORD_FILE names (the compose secret) or from POSTGRES_APP_PASSWORD, and given
# to psql through its environment (\getenv, psql 15+): it is never in an argument list.
#
# Other databases: PostgreSQL grants CONNECT on every database to PUBLIC, so the role could
# still open `postgres` and `template1` (and see their catalogs). The script revokes that from
# PUBLIC and grants CONNECT on the application's database to its role alone. Superusers are
# not affected, nor is CREATE DATABASE (which copies template1 without connecting to it); a
# role added later that needs `postgres` (a monitoring exporter, say) is granted CONNECT on it
# explicitly. POSTGRES_KEEP_PUBLIC_CONNECT=1 skips the revocation, for a server shared with
# roles that rely on it (the test suite's).
set -eu
if [ -n "${POSTGRES_APP_PASSWORD_FILE:-}" ]; then
    if [ -n "${POSTGRES_APP_PASSWORD:-}" ]; then
        echo "init-app-user: both POSTGRES_APP_PASSWORD and POSTGRES_APP_PASSWORD_FILE are set" >&2
        exit 1
    fi
    POSTGRES_APP_PASSWORD=$(cat "$POSTGRES_APP_PASSWORD_FILE")
    export POSTGRES_APP_PASSWORD
fi
: "${POSTGRES_APP_PASSWORD:?POSTGRES_APP_PASSWORD is not set (see infra/secrets.sh)}"
app_user=${POSTGRES_APP_USER:-orderflow}
app_db=${POSTGRES_APP_DB:-orderflow}
isolate=on
if [ "${POSTGRES_KEEP_PUBLIC_CONNECT:-}" = 1 ]; then
    isolate=off
fi
psql -v ON_ERROR_STOP=1 --no-psqlrc --username "${POSTGRES_USER:-postgres}" --dbname postgres \
    -v app_user="$app_user" -v app_db="$app_db" -v isolate="$isolate" <<'SQL'
\getenv app_password POSTGRES_APP_PASSWORD
CREATE ROLE :"app_user" LOGIN PASSWORD :'app_password' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE DATABASE :"app_db" OWNER :"app_user";
REVOKE ALL ON DATABASE :"app_db" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"app_db" TO :"app_user";
\if :isolate
REVOKE CONNECT ON DATABASE postgres FROM PUBLIC;
REVOKE CONNECT ON DATABASE template1 FROM PUBLIC;
\endif
SQL
