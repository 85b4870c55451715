"""The layers of app/ (docs/design.md, Code map): each loads only the layers beneath it.

core (the rules) <- kube (Kubernetes I/O) <- runtime (state over time) <- ops (writers,
/debug) <- web (the HTTP face); app/base (metrics, background tasks) is used by every layer
but the rules and loads none of them; app/server.py assembles everything. The rules load
nothing else, so they stay testable without a cluster, a loop or a socket.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"

# What each layer must never import (a prefix of a module name).
FORBIDDEN = {
    "core": (
        "app.runtime",
        "app.web",
        "app.ops",
        "app.kube",
        "app.server",
        "app.cli",
        "app.config",
    ),
    "base": (
        "app.core",
        "app.kube",
        "app.runtime",
        "app.ops",
        "app.web",
        "app.kubectl",
        "app.server",
        "app.service",
        "app.cli",
        "app.config",
        "app.flags",
    ),
    "runtime": ("app.ops", "app.web", "app.server", "app.service", "app.cli"),
    "kube": ("app.runtime", "app.ops", "app.web", "app.server", "app.service", "app.cli"),
    "ops": ("app.web", "app.server", "app.service", "app.cli"),
    "web": ("app.server", "app.service", "app.cli"),
    # `kubectl gang` runs on a user's machine: it may reuse the pure rules (app/core),
    # never the extender's runtime, HTTP face, operations, its async client or config.
    "kubectl": (
        "app.runtime",
        "app.web",
        "app.ops",
        "app.kube",
        "app.server",
        "app.service",
        "app.cli",
        "app.config",
        "app.flags",
    ),
}
# Third-party I/O (and the event loop) the rules must not load either.
IO_LIBRARIES = ("kubernetes", "urllib3", "aiohttp", "fastapi", "starlette", "uvicorn", "asyncio")

# How long a unit may grow before it is doing more than one job (issue: a house a
# newcomer can live in). Split by responsibility when one of these fails.
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 250
MAX_CONSTRUCTOR_PARAMETERS = 6


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports in functions count too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _modules(layer: str) -> list[Path]:
    """Every module of a layer, its feature folders included (app/core/topology/, ...)."""
    return sorted((APP / layer).rglob("*.py"))


def _dotted(path: Path) -> str:
    """app/core/topology/domains.py -> app.core.topology.domains (a package: its folder)."""
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_module_lives_in_a_layer() -> None:
    # Top level: the entry points and the one configuration (a newcomer starts here).
    top = {p.name for p in APP.glob("*.py")}
    assert top == {
        "__init__.py",
        "__main__.py",
        "cli.py",
        "config.py",
        "flags.py",
        "server.py",
        "service.py",
    }
    assert {p.name for p in APP.iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "base",
        "core",
        "runtime",
        "web",
        "ops",
        "kube",
        "kubectl",
    }


def test_each_layer_imports_only_what_lies_beneath_it() -> None:
    broken = [
        f"{path.relative_to(APP.parent)} imports {name}"
        for layer, forbidden in FORBIDDEN.items()
        for path in _modules(layer)
        for name in sorted(_imports(path))
        if _within(name, forbidden) or (layer == "core" and name.split(".")[0] in IO_LIBRARIES)
    ]
    assert broken == []


def _within(name: str, packages: tuple[str, ...]) -> bool:
    """`name` is one of `packages` or inside one (app.kubectl is not inside app.kube)."""
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_the_kubectl_plugin_loads_no_extender_machinery() -> None:
    # Prefixes are matched at dots: app.kubectl may not load app.kube, yet is not app.kube.
    assert _within("app.kube.http", FORBIDDEN["kubectl"])
    assert not _within("app.kubectl.api", FORBIDDEN["kubectl"])
    plugin = [_dotted(p) for p in _modules("kubectl")]
    program = f"import sys\nimport {', '.join(plugin)}\nprint('\\n'.join(sorted(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    ).stdout.split()
    assert [m for m in loaded if _within(m, FORBIDDEN["kubectl"])] == []


def test_the_rules_load_no_io_at_run_time() -> None:
    # A fresh interpreter: this test session has long imported everything.
    core = [_dotted(p) for p in _modules("core")]
    program = (
        f"import sys\nimport {', '.join(core)}\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith(('app', *sys.argv[1:])))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", program, *IO_LIBRARIES],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert set(core) <= set(loaded)
    io = [
        m
        for m in loaded
        if (m.startswith("app.") and not m.startswith("app.core"))
        or m.split(".")[0] in IO_LIBRARIES
    ]
    assert io == [], f"the rules load the runtime, the HTTP face or Kubernetes I/O: {io}"


def _all_modules() -> list[Path]:
    return sorted(APP.rglob("*.py"))


def test_no_unit_outgrows_one_job() -> None:
    too_long: list[str] = []
    for path in _all_modules():
        text = path.read_text()
        where = path.relative_to(APP.parent)
        if (lines := text.count("\n")) > MAX_MODULE_LINES:
            too_long.append(f"{where}: {lines} lines (module limit {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
                if size > limit:
                    too_long.append(
                        f"{where}:{node.lineno} {node.name}: {size} lines (limit {limit})"
                    )
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                count = len(node.args.posonlyargs) + len(node.args.args) - 1
                count += len(node.args.kwonlyargs)
                if count > MAX_CONSTRUCTOR_PARAMETERS:
                    too_long.append(
                        f"{where}:{node.lineno} __init__ takes {count} parameters "
                        f"(limit {MAX_CONSTRUCTOR_PARAMETERS}): group collaborators"
                    )
    assert too_long == []
