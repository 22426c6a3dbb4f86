"""The package's layering: import-linter's layers contract (pyproject.toml) holds, and no import cycle exists.

Two import graphs are checked for cycles. The module-level graph is what Python runs when a module is imported:
every import outside functions (not under TYPE_CHECKING), plus the packages Python imports first (importing
`a.b.c` runs `a/__init__.py` and `a/b/__init__.py`). The full graph adds every import inside functions and every
type-only import (under TYPE_CHECKING) too, so neither a deferred import nor an annotation can hide a dependency
that points back up; only the package's own lazy attributes (`relay_tune.build`, a PEP 562 `__getattr__`) are left
out by leaving implicit parent-package edges out of it.

A function-level import needs a reason: an optional dependency (onnx, cuda-python, psycopg, matplotlib, ...), or
a start-up cost that a comment on the import (or on the line above its block of imports) names with the word
"start-up", e.g. `# start-up: optuna takes ~0.2 s to import; ...`. Anything else belongs at module level.
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
# Optional dependencies (pyproject.toml extras): imported where they are needed, never at module level.
OPTIONAL_PACKAGES = frozenset({
    "cuda", "psycopg", "matplotlib", "onnx", "onnxruntime", "optuna_dashboard", "nbclient", "nbformat", "ipykernel",
    "jupyter_client",
})
REASON_WORDS = ("start-up", "optional dependency")


def _modules(root: Path = ROOT) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _import_nodes(tree: ast.AST, type_only: bool = False) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement outside TYPE_CHECKING blocks, with whether it sits inside a function; with
    `type_only`, the imports under TYPE_CHECKING too (counted as deferred: Python never runs them)."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                if type_only:
                    visit(child, True)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append((child, deferred))
            visit(child, deferred or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    visit(tree, False)
    return found


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    """The project modules an import statement of module `name` imports (by name; parent packages not added)."""

    def nearest(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    if isinstance(node, ast.Import):
        return set(filter(None, (nearest(a.name) for a in node.names)))
    base = node.module or ""
    if node.level:
        parts = name.split(".")[: len(name.split(".")) - node.level + (1 if path.name == "__init__.py" else 0)]
        base = ".".join([*parts, base] if base else parts)
    targets = set()
    for alias in node.names:
        full = f"{base}.{alias.name}"
        found = nearest(full if full in modules else base)
        if found:
            targets.add(found)
    return targets


def _graph(modules: dict[str, Path], function_level: bool) -> dict[str, set[str]]:
    """Module-level graph (with the parent packages Python imports first), or the graph of all imports."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node, in_function in _import_nodes(ast.parse(path.read_text()), type_only=function_level):
            if in_function and not function_level:
                continue
            for target in _targets(name, path, node, modules):
                targets.add(target)
                if not function_level:  # importing a.b.c runs a/__init__.py and a/b/__init__.py first
                    parts = target.split(".")
                    targets.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p in modules)
        targets.discard(name)
        targets -= {p for p in targets if name.startswith(p + ".")}  # a module's own packages are already running
        graph[name] = targets
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def cycle_from(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := cycle_from(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := cycle_from(start, [start])):
            return found
    return None


def _unexplained_function_level_imports(modules: dict[str, Path], root: Path = ROOT) -> list[str]:
    """`path:line: import` for every function-level import without a reason (see the module docstring)."""
    bad = []
    for path in sorted(modules.values()):
        lines = path.read_text().splitlines()
        for node, in_function in _import_nodes(ast.parse("\n".join(lines))):
            if not in_function:
                continue
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if not (isinstance(node, ast.ImportFrom) and node.level) and all(
                    n.split(".")[0] in OPTIONAL_PACKAGES for n in names):
                continue
            # the import's own lines, then upwards over the block of imports it belongs to, to the comment above
            first = node.lineno - 1
            candidates = lines[first:node.end_lineno]
            while first > 0 and lines[first - 1].strip().startswith(("import ", "from ", ")")):
                first -= 1
            candidates.append(lines[first - 1] if first > 0 else "")
            if any("#" in c and any(w in c.split("#", 1)[1] for w in REASON_WORDS) for c in candidates):
                continue
            bad.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return bad


def test_no_module_level_import_cycle() -> None:
    found = _find_cycle(_graph(_modules(), function_level=False))
    assert found is None, "module-level import cycle: " + " -> ".join(found or ())


def test_no_import_cycle_counting_function_level_and_type_only_imports() -> None:
    found = _find_cycle(_graph(_modules(), function_level=True))
    assert found is None, "import cycle (function-level and type-only imports counted): " + " -> ".join(found or ())


def test_function_level_imports_have_a_reason() -> None:
    bad = _unexplained_function_level_imports(_modules())
    assert not bad, (
        "imports inside functions without an optional dependency or a `# start-up: ...` comment naming the cost "
        "(move them to module level):\n" + "\n".join(bad))


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """A module-level cycle, a cycle through function-level imports, a cycle through type-only imports, a cycle
    through a package's __init__, and a function-level import without a reason are each reported; commented and
    optional ones are not."""
    package = tmp_path / "relay_tune"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from relay_tune import b\n")
    (package / "b.py").write_text("import relay_tune.a\n")
    modules = _modules(tmp_path)
    assert _find_cycle(_graph(modules, function_level=False)) == ["relay_tune.a", "relay_tune.b", "relay_tune.a"]

    (package / "b.py").write_text(
        "def f():\n"
        "    # start-up: relay_tune.a takes long to import\n"
        "    import json\n"
        "    from relay_tune import a\n"
        "    import onnx\n"
        "\n"
        "def g():\n"
        "    import json\n")
    assert _find_cycle(_graph(modules, function_level=False)) is None
    assert _find_cycle(_graph(modules, function_level=True)) == ["relay_tune.a", "relay_tune.b", "relay_tune.a"]
    assert _unexplained_function_level_imports(modules, tmp_path) == ["relay_tune/b.py:8: import json"]

    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from relay_tune.a import A\n")
    assert _find_cycle(_graph(modules, function_level=False)) is None
    assert _find_cycle(_graph(modules, function_level=True)) == ["relay_tune.a", "relay_tune.b", "relay_tune.a"]
    assert _unexplained_function_level_imports(modules, tmp_path) == []

    (package / "sub").mkdir()
    (package / "sub" / "__init__.py").write_text("from relay_tune.sub import c\n")
    (package / "sub" / "c.py").write_text("")
    (package / "b.py").write_text("")
    (package / "a.py").write_text("from relay_tune.sub.c import *\n")
    (package / "sub" / "c.py").write_text("import relay_tune.a\n")
    modules = _modules(tmp_path)
    assert _find_cycle(_graph(modules, function_level=False)) is not None


def test_help_loads_neither_the_compilers_nor_the_tuner() -> None:
    """`relay-tune --help` (the parser of every command) imports no compiler, tuner, LLVM, Optuna or XGBoost."""
    probe = (
        "import sys\n"
        "from relay_tune.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = ('relay_tune.compile', 'relay_tune.records', 'relay_tune.kernel', 'relay_tune.tuning', "
        "'relay_tune.codegen', 'relay_tune.runtime', 'llvmlite', 'optuna', 'xgboost', 'pandas')\n"
        "print(sorted({m.split('.')[0] if not m.startswith('relay_tune') else '.'.join(m.split('.')[:2]) "
        "for m in sys.modules if m.startswith(heavy)}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_command_lines_search_choices_are_the_tuners() -> None:
    from relay_tune import cli
    from relay_tune.tuning.tune_model import SEARCH_STRATEGIES

    assert cli.SEARCH_STRATEGIES == SEARCH_STRATEGIES


def test_import_linter_contracts_hold() -> None:
    lint = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(lint).exists():
        pytest.fail("lint-imports is not installed: pip install -e '.[test]'")
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_the_compiler_loads_neither_the_tuner_nor_optuna() -> None:
    """Importing the model compiler and building a small model with a tuning log imports no module of the tuner
    (`relay_tune.tuning`, its package `__init__` included) and not Optuna: the compiler reads logs through the
    record store only."""
    probe = (
        "import sys, json, tempfile, pathlib\n"
        "import numpy as np\n"
        "import relay_tune.compile\n"
        "from relay_tune.text import parse_module\n"
        "mod = parse_module('#[version = \"0.0.5\"]\\n"
        "def @main(%x: Tensor[(3, 5), float32], %w: Tensor[(7, 5), float32]) {\\n"
        "  nn.relu(nn.dense(%x, %w))\\n}')\n"
        "log = pathlib.Path(tempfile.mkdtemp()) / 'empty.jsonl'\n"
        "log.write_text('')\n"
        "model = relay_tune.compile.build(mod, params={'w': np.ones((7, 5), 'float32')}, logs=str(log))\n"
        "assert model.run(x=np.ones((3, 5), 'float32')).shape == (3, 7)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'optuna' or m.startswith(('optuna.', "
        "'relay_tune.tuning')))))\n"
    )
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", probe], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
