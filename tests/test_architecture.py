"""The layout's rules, checked on every run (issue 18 item 2; docs/ARCHITECTURE.md).

- The import-linter contracts of ``pyproject.toml`` (``[tool.importlinter]``: the layers, the
  leaves, storage never importing proxy, the defenses' purity, the core free of I/O libraries, no
  cycle) are all kept.
- The gate has teeth: the same contracts over a copy of the tree with one import added upward
  break, and the report names that import.
- No module passes the hard limit of 600 lines.
- No module-level mutable state (issue 18 item 4): no ``global`` statement, and no module-level
  container (a dict/list/set/deque literal or call, a ``proxy.cache`` memo) that its module
  mutates. A heuristic over the source (an object mutated from another module, or through a
  method of its own, goes unseen), so it catches the common shape: a memo dict at the top of a
  module. A constant written as one literal passes (a table filled by statements at import is
  reported too: write it as one literal).

import-linter reads the source (grimp parses it, nothing is imported), so the check costs well
under a second; it runs in a subprocess with its cache off, so it writes nothing in the tree.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODULE_HARD_LIMIT_LINES = 600

needs_importlinter = pytest.mark.skipif(importlib.util.find_spec("importlinter") is None,
                                        reason="import-linter is in the test extras: pip install -e '.[test]'")


def lint_imports(root: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """Run ``lint-imports`` over the packages under ``root`` with the contracts of ``config``;
    exit status 0 when every contract is kept."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    env = os.environ | {"PYTHONPATH": str(root), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", code, "--no-cache", str(config)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False)


@needs_importlinter
def test_every_import_contract_is_kept() -> None:
    result = lint_imports(REPO, REPO / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr


@needs_importlinter
def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    """A defense that imports the forward layer: the layers contract and the purity contract
    break, and the report names the new import."""
    for package in ("proxy", "storage"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    probe = tmp_path / "proxy" / "defenses" / "probe_violation.py"
    probe.write_text("from proxy.forward import pipeline  # an upward import\n")
    result = lint_imports(tmp_path, REPO / "pyproject.toml")
    assert result.returncode != 0, result.stdout
    assert "proxy.defenses.probe_violation -> proxy.forward.pipeline" in result.stdout
    assert "The defenses are pure" in result.stdout.split("Broken contracts")[-1]


@needs_importlinter
def test_storage_importing_proxy_breaks_a_contract(tmp_path: Path) -> None:
    for package in ("proxy", "storage"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "storage" / "probe_violation.py").write_text("import proxy.settings\n")
    result = lint_imports(tmp_path, REPO / "pyproject.toml")
    assert result.returncode != 0
    assert "storage.probe_violation -> proxy.settings" in result.stdout


def test_no_module_passes_the_hard_size_limit() -> None:
    too_long = {}
    for package in ("proxy", "storage"):
        for path in sorted((REPO / package).rglob("*.py")):
            lines = path.read_text(encoding="utf-8").count("\n")
            if lines > MODULE_HARD_LIMIT_LINES:
                too_long[str(path.relative_to(REPO))] = lines
    assert not too_long, f"modules over {MODULE_HARD_LIMIT_LINES} lines (split them by job): {too_long}"


CONTAINER_CALLS = frozenset({"dict", "list", "set", "OrderedDict", "deque", "defaultdict", "Counter",
                             "WeakValueDictionary", "WeakKeyDictionary", "BoundedCache", "Memo"})
MUTATING_METHODS = frozenset({"append", "appendleft", "extend", "insert", "pop", "popleft", "popitem", "clear",
                              "update", "setdefault", "add", "discard", "remove", "move_to_end", "put", "get_or_put"})


def _module_containers(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level to a mutable container."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        func = value.func if isinstance(value, ast.Call) else None
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp) or (
                called in CONTAINER_CALLS):
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def module_state_writes(source: str) -> list[str]:
    """Where a module writes module-level state: ``"NAME line N: how"`` for each ``global`` and each
    mutation (a mutating method call, an item or slice assigned or deleted) of a module-level container."""
    tree = ast.parse(source)
    containers = _module_containers(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found += [f"{name} line {node.lineno}: global" for name in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
              and node.func.value.id in containers and node.func.attr in MUTATING_METHODS):
            found.append(f"{node.func.value.id} line {node.lineno}: .{node.func.attr}()")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id in containers:
                    found.append(f"{target.value.id} line {node.lineno}: item written")
    return found


def test_the_state_check_sees_a_module_memo() -> None:
    memo = "_MEMO: dict[str, int] = {}\n\ndef f(k):\n    _MEMO[k] = 1\n    _MEMO.clear()\n"
    assert module_state_writes(memo) == ["_MEMO line 4: item written", "_MEMO line 5: .clear()"]
    assert module_state_writes("_N = 0\n\ndef f():\n    global _N\n    _N += 1\n") == ["_N line 4: global"]
    table = "TABLE = {'a': 1}\nTABLE['b'] = 2\n\ndef f(k):\n    return TABLE.get(k)\n"
    assert module_state_writes(table) == ["TABLE line 2: item written"]  # at import: still reported (move it into the literal)
    assert module_state_writes("def f():\n    seen = {}\n    seen['a'] = 1\n") == []


def test_no_module_level_mutable_state() -> None:
    found = {}
    for package in ("proxy", "storage"):
        for path in sorted((REPO / package).rglob("*.py")):
            writes = module_state_writes(path.read_text(encoding="utf-8"))
            if writes:
                found[str(path.relative_to(REPO))] = writes
    assert not found, ("module-level state written (make it instance state of an object its owner builds, "
                       f"bound in its docstring): {found}")
