#!/bin/sh
# The broker container's entrypoint: render the definitions' password hashes from the
# environment, then hand over to the image's own entrypoint (which drops to the rabbitmq user).
set -eu
/etc/orderflow/render-definitions.sh /etc/orderflow/definitions.json /etc/rabbitmq/definitions.json
chown rabbitmq:rabbitmq /etc/rabbitmq/definitions.json
# The broker needs only the hashes: no plain password stays in its environment.
for var in $(env | sed -n 's/^\(RABBITMQ_[A-Z_]*_PASSWORD\)=.*/\1/p'); do
    unset "$var"
done
exec docker-entrypoint.sh "$@"
