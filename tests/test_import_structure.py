"""The package's structure as its imports draw it: no import circle, and every import runs down the layers.

Every import of the package's own modules counts, also those inside functions (an import inside a function hides
a circle from Python, not from the design). A layer may import from the layers below it, never from above."""
import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nnunetv2_meddisseg"

#: the layers, lowest first: each names the package's top-level modules and subpackages in it
LAYERS: List[Set[str]] = [
    {"errors"},  # the user's-mistake error every part raises
    {"cli", "environment"},  # ground floor: argument helpers, the environment
    {"files", "torch_files", "module_wrappers", "logged_command", "plans_architecture"},  # files, torch files and
    # modules, subprocesses, the plans' architecture entry
    {"blocks", "losses"},
    {"architectures"},
    {"training", "datasets"},
    {"evaluation", "planning", "sharing", "deploy"},
    {"ablation", "pretraining"},
    {"nnunet_trainers"},                              # the trainer catalogue nnU-Net imports
    {"trainer_path", "demo", "__init__"},             # commands on top
]


def module_imports() -> Dict[str, Set[str]]:
    """``{module: the package's modules it imports}``, every import counted."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: Dict[str, Set[str]] = {name: set() for name in modules}

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                found = resolve(target) if target.startswith(PACKAGE.name) else ""
                if found and found != name and not (name.startswith(found + ".") and
                                                    modules[found].name == "__init__.py"):
                    graph[name].add(found)
    return graph


def group(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_top_level_module_has_a_layer():
    graph = module_imports()
    placed = set().union(*LAYERS)
    assert {group(m) for m in graph} <= placed, {group(m) for m in graph} - placed


def test_no_import_circle():
    graph = module_imports()
    state: Dict[str, int] = {}

    def visit(module: str, path: List[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target] if target in path else [module, target]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_imports_run_down_the_layers():
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    upward = sorted(f"{m} -> {t}" for m, targets in module_imports().items() for t in targets
                    if group(m) != group(t) and layer[group(t)] >= layer[group(m)])
    assert not upward, "imports running up or sideways:\n" + "\n".join(upward)
