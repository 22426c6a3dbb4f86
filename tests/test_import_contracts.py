"""The package's layering: import-linter's contracts (pyproject.toml) hold, and no module-level import cycle exists.

Function-level imports are left out of the cycle check on purpose: the command line imports its commands on use
(start-up time), and optional dependencies are imported where they are needed. The README's Architecture section
lists the function-level imports that still point up a layer.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("relay_tune", "search_space", "cost_model")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _module_level_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules that `name` imports when it is itself imported (not inside functions, not TYPE_CHECKING)."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()

    def nearest(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                targets.update(filter(None, (nearest(a.name) for a in child.names)))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = name.split(".")[: len(name.split(".")) - child.level + (1 if is_package else 0)]
                    base = ".".join([*parts, base] if base else parts)
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    found = nearest(full if full in modules else base)
                    if found:
                        targets.add(found)
            visit(child)

    visit(ast.parse(path.read_text()))
    targets.discard(name)
    return targets


def test_no_module_level_import_cycle() -> None:
    modules = _modules()
    graph = {name: _module_level_imports(name, path, modules) for name, path in modules.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def cycle_from(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt] if nxt in path else [*path, nxt]
            if nxt not in state and (found := cycle_from(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = cycle_from(start, [start])
            assert found is None, "module-level import cycle: " + " -> ".join(found)


def test_the_cycle_check_sees_a_cycle(tmp_path: Path) -> None:
    """The check above can fail: two modules that import each other at module level are reported."""
    modules = {"relay_tune.a": tmp_path / "a.py", "relay_tune.b": tmp_path / "b.py"}
    modules["relay_tune.a"].write_text("from relay_tune import b\n")
    modules["relay_tune.b"].write_text("import relay_tune.a\n\ndef f():\n    from relay_tune import a\n")
    assert _module_level_imports("relay_tune.a", modules["relay_tune.a"], modules) == {"relay_tune.b"}
    assert _module_level_imports("relay_tune.b", modules["relay_tune.b"], modules) == {"relay_tune.a"}


def test_import_linter_contracts_hold() -> None:
    lint = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(lint).exists():
        pytest.fail("lint-imports is not installed: pip install -e '.[test]'")
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout
