#!/bin/sh
# render-definitions.sh TEMPLATE OUTPUT
#
# Writes TEMPLATE to OUTPUT with each password placeholder `@HASH:VARIABLE@` replaced by
# RabbitMQ's salted SHA-256 hash of the password in the file VARIABLE_FILE names (a compose
# secret, as the official images' *_FILE variables) or else in the environment variable VARIABLE
# (rabbit_password_hashing_sha256: base64(salt ++ sha256(salt ++ password)), salt 4 random
# bytes). Passwords never reach another file, an argument list or the log; an unset or empty
# one is an error, and so is a password given both ways. Needs sh, openssl, base64, head, cat
# and sed (all in the rabbitmq image).
set -eu

template=$1
output=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM

cp "$template" "$work/rendered"
# Variable names are single words: splitting the list on whitespace is what is wanted.
# shellcheck disable=SC2013
for variable in $(grep -o '@HASH:[A-Z][A-Z0-9_]*@' "$template" | sed 's/^@HASH:\(.*\)@$/\1/' | sort -u); do
    # $variable matched [A-Z][A-Z0-9_]*, so the evals only read that variable and its _FILE.
    eval "password=\${$variable:-}"
    eval "password_file=\${${variable}_FILE:-}"
    if [ -n "$password_file" ]; then
        if [ -n "$password" ]; then
            echo "render-definitions: both $variable and ${variable}_FILE are set" >&2
            exit 1
        fi
        if [ ! -r "$password_file" ]; then
            echo "render-definitions: ${variable}_FILE names no readable file" >&2
            exit 1
        fi
        password=$(cat "$password_file")
    fi
    if [ -z "$password" ]; then
        echo "render-definitions: $variable is not set (see infra/secrets.sh)" >&2
        exit 1
    fi
    head -c 4 /dev/urandom > "$work/salt"
    # printf is a shell builtin: the password is never in an argument list.
    { cat "$work/salt"; printf '%s' "$password"; } | openssl dgst -sha256 -binary > "$work/digest"
    hash=$(cat "$work/salt" "$work/digest" | base64 | tr -d '\n')
    sed "s|@HASH:$variable@|$hash|g" "$work/rendered" > "$work/next"
    mv "$work/next" "$work/rendered"
done
unset password password_file
if grep -q '@HASH:' "$work/rendered"; then
    echo "render-definitions: a password placeholder is malformed" >&2
    exit 1
fi
umask 077
cp "$work/rendered" "$output"
