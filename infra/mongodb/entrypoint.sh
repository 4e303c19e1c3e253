#!/bin/sh
# The MongoDB container's entrypoint: install the replica set's key where mongod accepts it,
# then hand over to the image's own entrypoint (which drops to the mongodb user).
#
# mongod refuses a keyfile that its group or others may read, and reads it as the mongodb user.
# A compose file secret is a bind mount with the host file's owner and mode (compose ignores a
# secret's uid, gid and mode outside Swarm), so the key is copied, as root, to the tmpfs
# /run/orderflow: mode 0400, owned by mongodb. Reading the secret whatever its host mode takes
# DAC_READ_SEARCH, handing the copy over takes CHOWN; both are in the service's cap_add already.
#
# The copy goes to the path the command's `--keyFile` names; MONGO_KEYFILE_SOURCE is the secret
# (default /run/secrets/mongo_keyfile). Without `--keyFile` nothing is copied.
set -eu
source=${MONGO_KEYFILE_SOURCE:-/run/secrets/mongo_keyfile}
unset MONGO_KEYFILE_SOURCE

keyfile=
previous=
for arg in "$@"; do
    case $previous in
        --keyFile) keyfile=$arg ;;
    esac
    case $arg in
        --keyFile=*) keyfile=${arg#--keyFile=} ;;
    esac
    previous=$arg
done

if [ -n "$keyfile" ]; then
    if [ ! -s "$source" ]; then
        echo "entrypoint: the replica set's key $source is missing or empty (sh infra/secrets.sh)" >&2
        exit 1
    fi
    # A new file, 0600 from the start (no moment where others may read it), renamed into place
    # (the directory is root's and not sticky: an older copy, mongodb's, is replaced).
    copy=$(mktemp "$(dirname "$keyfile")/.keyfile.XXXXXX")
    cat "$source" > "$copy"
    # The mode first: once the file is mongodb's, root could change it only with FOWNER.
    chmod 400 "$copy"
    if [ "$(id -u)" = 0 ]; then
        chown mongodb:mongodb "$copy"
    fi
    mv -f "$copy" "$keyfile"
fi
exec docker-entrypoint.sh "$@"
