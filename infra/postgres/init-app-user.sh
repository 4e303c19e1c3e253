#!/bin/sh
# Run once by the postgres image (/docker-entrypoint-initdb.d) on an empty data directory, as
# the superuser. Creates the application's role: it may log in and owns its database (where
# `orderflow init` creates the hub's schema), and nothing else: no superuser, no CREATEDB, no
# CREATEROLE, no access to other databases. The password is read from the environment by psql
# itself (\getenv, psql 15+): it is never in an argument list or a file.
set -eu
: "${POSTGRES_APP_PASSWORD:?POSTGRES_APP_PASSWORD is not set (see .env.example)}"
app_user=${POSTGRES_APP_USER:-orderflow}
app_db=${POSTGRES_APP_DB:-orderflow}
psql -v ON_ERROR_STOP=1 --no-psqlrc --username "${POSTGRES_USER:-postgres}" --dbname postgres \
    -v app_user="$app_user" -v app_db="$app_db" <<'SQL'
\getenv app_password POSTGRES_APP_PASSWORD
CREATE ROLE :"app_user" LOGIN PASSWORD :'app_password' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE DATABASE :"app_db" OWNER :"app_user";
REVOKE ALL ON DATABASE :"app_db" FROM PUBLIC;
SQL
