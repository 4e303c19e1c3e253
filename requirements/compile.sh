#!/usr/bin/env bash
# Regenerate the lock files from pyproject.toml (and build.in) after a dependency changes:
#   bash requirements/compile.sh            keep every pin that still fits, add what is new
#   bash requirements/compile.sh --upgrade  take the newest releases that fit
# Needs uv (`pip install uv`). The locks hold hashes and universal markers, for Python 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."
compile() {  # output, then uv arguments
    local out=$1
    shift
    uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
        --custom-compile-command "bash requirements/compile.sh" \
        "$@" -o "$out" pyproject.toml requirements/build.in
}
compile requirements/runtime.lock "$@"
compile requirements/dev.lock --extra dev "$@"
compile requirements/fuzz.lock --extra dev --extra fuzz "$@"
