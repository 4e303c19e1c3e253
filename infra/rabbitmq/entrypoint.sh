#!/bin/sh
# The broker container's entrypoint: render the definitions' password hashes from the
# passwords (compose secrets, named by RABBITMQ_*_PASSWORD_FILE), then hand over to the
# image's own entrypoint (which drops to the rabbitmq user).
#
# The root filesystem is read-only: the rendered file goes to the tmpfs /run/orderflow
# (rabbitmq.conf loads it from there). ORDERFLOW_DEFINITIONS_OUTPUT overrides that path (tests).
set -eu
here=$(dirname "$0")
output=${ORDERFLOW_DEFINITIONS_OUTPUT:-/run/orderflow/definitions.json}
"$here/render-definitions.sh" "$here/definitions.json" "$output"
if [ "$(id -u)" = 0 ]; then
    chown rabbitmq:rabbitmq "$output"
fi
# The broker needs only the hashes: no password, nor where one is, stays in its environment.
# (Names may hold digits: RABBITMQ_APP_SHOP2_PASSWORD.)
for var in $(env | sed -n 's/^\(RABBITMQ_[A-Z0-9_]*_PASSWORD\(_FILE\)\{0,1\}\)=.*/\1/p'); do
    unset "$var"
done
exec docker-entrypoint.sh "$@"
