r"""Coverage-guided fuzzing of `decode` and what runs on a refused body (atheris, libFuzzer).

The check on each input is `tests/fuzz/decode_check.check` (its docstring says what it
asserts); this file only runs it under the fuzzer, with the orderflow modules instrumented.
pydantic's core is compiled and is not instrumented: the fuzzer is guided by the Python checks
before and after validation (the strict JSON reader, redaction, the text rules), not inside it.

Setup (atheris 3.0 has a wheel for CPython 3.11; requirements/fuzz.lock pins it):

    python3 -m venv /tmp/fuzz-venv
    /tmp/fuzz-venv/bin/pip install --require-hashes -r requirements/fuzz.lock
    /tmp/fuzz-venv/bin/pip install --no-deps --no-build-isolation -e .

A run, from the repository root (`python -m`: the harness imports `tests.fuzz`). The seed
corpus is generated, not committed; libFuzzer adds what it finds to the first directory, which
can be kept and reused across runs. It stops at the first failure and writes the input to the
artifact prefix:

    mkdir -p /tmp/fuzz-artifacts
    /tmp/fuzz-venv/bin/python -m tests.fuzz.fuzz_decode --make-corpus /tmp/fuzz-corpus
    nice -n 10 /tmp/fuzz-venv/bin/python -m tests.fuzz.fuzz_decode /tmp/fuzz-corpus \
        -dict=tests/fuzz/json.dict -max_len=8192 -max_total_time=660 -rss_limit_mb=4096 \
        -timeout=10 -print_final_stats=1 -artifact_prefix=/tmp/fuzz-artifacts/

Bodies up to decode's limit and past it (one byte chooses the type; `-len_control=0` tries
long inputs at once instead of growing towards them): the same with
`-max_len=65600 -len_control=0`. Replay one input, or minimise a failing one:

    /tmp/fuzz-venv/bin/python -m tests.fuzz.fuzz_decode /tmp/fuzz-artifacts/crash-…
    /tmp/fuzz-venv/bin/python -m tests.fuzz.fuzz_decode -minimize_crash=1 -runs=30000 \
        -artifact_prefix=/tmp/fuzz-min/ /tmp/fuzz-artifacts/crash-…

Keep every finding, minimised, in `tests/fuzz/regressions/` (`python -m pytest
tests/unit/test_fuzz_regressions.py` replays them without atheris).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import atheris  # type: ignore[import-untyped]

INSTRUMENTED = ["shared", "tests.fuzz.decode_check"]
"""Imported only under `instrument_imports`: nothing before `main` may import them."""


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[1] == "--make-corpus":
        from tests.fuzz.seeds import write_corpus

        count = write_corpus(Path(argv[2]))
        print(f"{count} seed inputs written to {argv[2]}")
        return
    # What startswith/endswith compare against guides the mutations too. Not the "RegEx" hook:
    # its pattern proxy takes no `pos`, which the json module passes (`_w(s, 0)`).
    atheris.enabled_hooks.add("str")
    with atheris.instrument_imports(include=INSTRUMENTED):
        from tests.fuzz.decode_check import check
    # libFuzzer runs argv[0] through the shell for -minimize_crash, -fork and -merge: under
    # `python -m`, argv[0] is this file, which is not executable, so name the command instead.
    command = f"{shlex.quote(sys.executable)} -m tests.fuzz.fuzz_decode"
    atheris.Setup([command, *argv[1:]], check)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
