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
#
# The HTTP API's role (POSTGRES_API_USER, default orderflow_api; made only when its password is
# given, in POSTGRES_API_PASSWORD_FILE or POSTGRES_API_PASSWORD): it connects to the
# application's database and reads and writes the rows of every table the application's role
# creates there later (`orderflow init`), through default privileges: SELECT, INSERT, UPDATE,
# DELETE and the sequences, nothing else. It cannot create, alter or drop a table or a schema,
# nor truncate one, so the process facing the web holds credentials of its own that can change
# rows and no structure.
set -eu
from_file() {  # VARIABLE: set from the file VARIABLE_FILE names (the compose secret), if any
    eval "file=\${${1}_FILE:-} value=\${${1}:-}"
    if [ -n "$file" ]; then
        if [ -n "$value" ]; then
            echo "init-app-user: both $1 and ${1}_FILE are set" >&2
            exit 1
        fi
        value=$(cat "$file")
        export "$1=$value"
    fi
    unset file value
}
from_file POSTGRES_APP_PASSWORD
: "${POSTGRES_APP_PASSWORD:?POSTGRES_APP_PASSWORD is not set (see infra/secrets.sh)}"
from_file POSTGRES_API_PASSWORD
api=off
if [ -n "${POSTGRES_API_PASSWORD:-}" ]; then
    api=on
fi
api_user=${POSTGRES_API_USER:-orderflow_api}
app_user=${POSTGRES_APP_USER:-orderflow}
app_db=${POSTGRES_APP_DB:-orderflow}
isolate=on
if [ "${POSTGRES_KEEP_PUBLIC_CONNECT:-}" = 1 ]; then
    isolate=off
fi
psql -v ON_ERROR_STOP=1 --no-psqlrc --username "${POSTGRES_USER:-postgres}" --dbname postgres \
    -v app_user="$app_user" -v app_db="$app_db" -v isolate="$isolate" \
    -v api="$api" -v api_user="$api_user" <<'SQL'
\getenv app_password POSTGRES_APP_PASSWORD
CREATE ROLE :"app_user" LOGIN PASSWORD :'app_password' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE DATABASE :"app_db" OWNER :"app_user";
REVOKE ALL ON DATABASE :"app_db" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"app_db" TO :"app_user";
\if :isolate
REVOKE CONNECT ON DATABASE postgres FROM PUBLIC;
REVOKE CONNECT ON DATABASE template1 FROM PUBLIC;
\endif
\if :api
\getenv api_password POSTGRES_API_PASSWORD
CREATE ROLE :"api_user" LOGIN PASSWORD :'api_password' NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT;
GRANT CONNECT ON DATABASE :"app_db" TO :"api_user";
\connect :"app_db"
ALTER DEFAULT PRIVILEGES FOR ROLE :"app_user" GRANT USAGE ON SCHEMAS TO :"api_user";
ALTER DEFAULT PRIVILEGES FOR ROLE :"app_user"
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"api_user";
ALTER DEFAULT PRIVILEGES FOR ROLE :"app_user" GRANT USAGE, SELECT ON SEQUENCES TO :"api_user";
\endif
SQL
