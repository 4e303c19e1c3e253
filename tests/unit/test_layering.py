"""The runtime (services/, shared/) imports nothing from the harnesses (harness/) or the
deployment generators (deployment/): they exercise and deploy it from outside.

Only the `orderflow` commands that run a harness may import one, and `serve` and `up`, which
start runtime processes, import the remote stand-in inside the command that runs it. Checked
twice: statically, every import statement of every runtime module; and for real, the modules a
fresh interpreter loads when it imports every other runtime module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("services", "shared")
OUTSIDE = ("harness", "deployment")

RUNNERS = {
    "services.cli.bench": "harness.bench",
    "services.cli.deploy": "deployment",
    "services.cli.nemesis": "harness.nemesis",
    "services.cli.simulate": "harness.simulation",
}
"""The commands that run a harness, and the one each may import at its top."""
LAZY = {"services.cli.serve", "services.cli.up"}
"""Commands that start runtime processes and also run the stand-in: only inside a function."""


def runtime_modules(packages: tuple[str, ...] = RUNTIME) -> list[str]:
    modules = []
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def is_outside(name: str) -> bool:
    return name.split(".", maxsplit=1)[0] in OUTSIDE


def imports_of(module: str) -> list[tuple[str, bool]]:
    """(imported module, at the module's top level) for every import statement of `module`."""
    path = ROOT / Path(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(source.read_text(), str(source))
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, id(node) in top))
    return found


def test_the_walk_sees_the_runtime_and_the_commands() -> None:
    modules = runtime_modules()
    assert "services.scheduler.service" in modules and "shared.domain.states" in modules
    assert set(RUNNERS) | LAZY <= set(modules)
    assert not any(is_outside(m) for m in modules)


@pytest.mark.parametrize("module", runtime_modules())
def test_a_runtime_module_imports_no_harness(module: str) -> None:
    outside = [(name, top) for name, top in imports_of(module) if is_outside(name)]
    if module in RUNNERS:
        allowed = RUNNERS[module]
        wrong = [n for n, _ in outside if n != allowed and not n.startswith(allowed + ".")]
        assert not wrong, f"{module} runs {allowed} and imports {wrong} too"
    elif module in LAZY:
        assert not [n for n, top in outside if top], (
            f"{module} starts runtime processes: import the stand-in inside its command"
        )
    else:
        assert not outside, f"{module} is runtime code and imports {[n for n, _ in outside]}"


def test_importing_the_runtime_loads_no_harness() -> None:
    """What a real process loads: every runtime module but the harness runners, imported in a
    fresh interpreter, brings in no module of harness/ or deployment/."""
    # (`__main__` runs the CLI when imported; the module it imports, main, is in the list.)
    wanted = [m for m in runtime_modules() if m not in RUNNERS and not m.endswith("__main__")]
    script = (
        "import importlib, sys\n"
        f"for name in {wanted!r}:\n"
        "    importlib.import_module(name)\n"
        f"print('\\n'.join(m for m in sys.modules if m.split('.')[0] in {OUTSIDE!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], f"the runtime loaded {done.stdout.split()}"


AMQP_CLIENTS = ("aio_pika", "aiormq")
AMQP_CODEC = "pamqp"
CODEC_USERS = {"shared.broker.wire", "shared.broker.memory.objects"}
"""The AMQP codec: the wire's tolerant decoding and header sizes, and the memory broker's frames,
which it encodes and decodes as a client's so that what arrives is what a socket would give."""


@pytest.mark.parametrize("module", runtime_modules((*RUNTIME, *OUTSIDE)))
def test_only_the_rabbitmq_adapter_imports_an_amqp_client(module: str) -> None:
    """The code above the broker port (shared/broker/port.py) knows neither aio-pika nor aiormq;
    the memory adapter imitates neither."""
    adapter = module.startswith("shared.broker.rabbitmq")
    for name, _ in imports_of(module):
        root = name.split(".", maxsplit=1)[0]
        if root in AMQP_CLIENTS:
            assert adapter, f"{module} imports {name}: only shared/broker/rabbitmq may"
        if root == AMQP_CODEC:
            assert adapter or module in CODEC_USERS, f"{module} imports {name}"
