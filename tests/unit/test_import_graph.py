"""The shape of the house: no import circles, no import from a lower layer up to a higher one, and
docs/architecture.md lists exactly the modules the tree has.

Imports are read from the source (``ast``), module level and inside functions alike: an import
inside a function that closes a circle is still a circle, only a hidden one.
"""
import ast
import re
from pathlib import Path
from typing import Dict, List, Set

from helpers.paths import ROOT

ROOT_PATH = Path(ROOT)
PACKAGES = ("megatron", "tasks", "tools")
ENTRY_POINTS = ("pretrain_gpt.py", "finetune_t0.py")
# Modules that start or drive a run: nothing below them may import them. (megatron.config's other
# modules hold flags as data the model and checkpoint layers read, e.g. moe_flags.)
TOP = ("megatron.train", "megatron.config.parser", "megatron.config.arguments",
       "megatron.runtime.initialize", "pretrain_gpt", "finetune_t0", "tasks", "tools")
# The library layers: data, model, parallelism, schedules, tokenizers, checkpoints.
LIBRARY = ("megatron.data", "megatron.model", "megatron.parallel", "megatron.schedules",
           "megatron.tokenizer", "megatron.checkpoint")
# Leaves (every module of megatron.utils too): import no module of the project (beyond other
# leaves).
LEAVES = ("megatron.errors", "megatron.utils", "megatron.runtime.process_exit")


def _module_files() -> Dict[str, Path]:
    files = [p for package in PACKAGES for p in (ROOT_PATH / package).rglob("*.py")]
    files += [ROOT_PATH / name for name in ENTRY_POINTS]
    modules = {}
    for path in files:
        parts = list(path.relative_to(ROOT_PATH).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: Dict[str, Path]):
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> Dict[str, Set[str]]:
    """``module -> the project's modules it imports`` (every import statement, anywhere)."""
    modules = _module_files()
    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(_resolve(a.name, modules) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for alias in node.names:
                    targets.add(_resolve(f"{base}.{alias.name}", modules) or _resolve(base, modules))
        targets.discard(None)
        targets.discard(module)
        graph[module] = targets
    return graph


def import_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def _within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_walk_sees_imports_inside_functions_and_finds_a_planted_cycle():
    graph = import_graph()
    assert "megatron.checkpoint.engine" in graph["megatron.train.resume"]
    assert {"megatron.errors", "megatron.checkpoint.format"} <= graph["megatron.checkpoint.reader"]
    planted = {k: set(v) for k, v in graph.items()}
    planted["megatron.errors"].add("megatron.train.loop")  # errors -> train.loop -> ... -> errors
    assert any("megatron.errors" in c and "megatron.train.loop" in c for c in import_cycles(planted))


def test_no_import_cycle():
    cycles = import_cycles(import_graph())
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_lower_layer_imports_a_higher_one():
    graph = import_graph()
    upward = sorted(f"{m} imports {t}" for m, targets in graph.items() for t in targets
                    if _within(m, LIBRARY) and _within(t, TOP))
    assert not upward, "library modules import run drivers: " + "; ".join(upward)
    leaf_imports = sorted(f"{m} imports {t}" for m, targets in graph.items() for t in targets
                          if _within(m, LEAVES) and not _within(t, LEAVES))
    assert not leaf_imports, "leaf modules import the project: " + "; ".join(leaf_imports)


def test_architecture_doc_lists_the_modules_of_the_tree():
    """Every module under megatron/ is named in docs/architecture.md by its path, and every
    megatron/ path named there exists."""
    text = (ROOT_PATH / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"megatron/[\w/]+\.py", text))
    tree = {str(p.relative_to(ROOT_PATH)) for p in (ROOT_PATH / "megatron").rglob("*.py")
            if p.name != "__init__.py"}
    assert not sorted(tree - named), f"modules missing from docs/architecture.md: {sorted(tree - named)}"
    assert not sorted(named - tree), f"docs/architecture.md names modules that do not exist: " \
                                     f"{sorted(named - tree)}"
