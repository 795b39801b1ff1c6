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
# The layers, lowest first (docs/architecture.md draws them): a module may import its own layer
# and the layers below it, never one above.
LAYERS = (("megatron.errors",),
          ("megatron.utils",),
          ("megatron.runtime",),
          ("megatron.schedules", "megatron.tokenizer"),
          ("megatron.data",),
          ("megatron.parallel",),
          ("megatron.model",),
          ("megatron.checkpoint",),
          ("megatron.optim", "megatron.metrics"),
          ("megatron.config",),
          ("megatron.train",),
          ("pretrain_gpt", "finetune_t0", "tasks", "tools"))
# Leaves: import no module of the project beyond other leaves.
LEAVES = ("megatron.errors", "megatron.utils")
LAZY_MARK = "# lazy:"


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


def package_of(module: str) -> str:
    """``megatron.data.curriculum.index`` -> ``megatron.data``; a top-level module is its own."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "megatron" else parts[0]


def package_graph(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    """``graph`` with each module replaced by its package (:func:`package_of`)."""
    packages: Dict[str, Set[str]] = {}
    for module, targets in graph.items():
        packages.setdefault(package_of(module), set()).update(
            package_of(t) for t in targets if package_of(t) != package_of(module))
    for targets in list(packages.values()):
        for t in targets:
            packages.setdefault(t, set())
    return packages


def test_no_package_cycle():
    """Packages (and the top-level modules, such as megatron/errors.py) form no circle either:
    two modules of different packages may not close one through a third package."""
    cycles = import_cycles(package_graph(import_graph()))
    assert not cycles, "package circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_package_walk_finds_the_errors_utils_circle():
    """The circle the package walk is for: megatron/errors.py once imported a module of
    megatron/utils/ whose sibling imported errors (two leaves importing each other)."""
    graph = {k: set(v) for k, v in import_graph().items()}
    graph["megatron.errors"].add("megatron.utils.rank_utils")
    assert ["megatron.errors", "megatron.utils"] in import_cycles(package_graph(graph))


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer."""
    for index, prefixes in enumerate(LAYERS):
        if _within(module, prefixes):
            return index
    raise AssertionError(f"{module} is in no layer of LAYERS: add its package there")


def upward_edges(graph: Dict[str, Set[str]]) -> List[str]:
    """``"A imports B"`` for every import from a lower layer to a higher one."""
    return sorted(f"{m} imports {t}" for m, targets in graph.items() for t in targets
                  if layer_of(t) > layer_of(m))


def unmarked_lazy_imports() -> List[str]:
    """``path:line`` of every import of a project module inside a function whose line does not
    say why it is deferred (``# lazy: REASON``): a hidden dependency otherwise."""
    modules = _module_files()
    found = []
    for _module, path in modules.items():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines), str(path))
        local = set()
        for function in ast.walk(tree):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                local.update(node for node in ast.walk(function)
                             if isinstance(node, (ast.Import, ast.ImportFrom)))
        for node in local:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            if (isinstance(node, ast.ImportFrom) and node.level) or \
                    any(_resolve(name, modules) for name in names):
                if LAZY_MARK not in lines[node.lineno - 1]:
                    found.append(f"{path.relative_to(ROOT_PATH)}:{node.lineno}")
    return sorted(found)


def test_every_module_is_in_a_layer_and_the_walk_sees_an_upward_edge():
    graph = import_graph()
    for module in graph:
        layer_of(module)
    planted = {k: set(v) for k, v in graph.items()}
    planted["megatron.data.builder"].add("megatron.model.gpt_model")
    assert set(upward_edges(planted)) - set(upward_edges(graph)) == {
        "megatron.data.builder imports megatron.model.gpt_model"}


def test_no_lower_layer_imports_a_higher_one():
    upward = upward_edges(import_graph())
    assert not upward, "imports up the layers (tests/unit/test_import_graph.py LAYERS): " \
        + "; ".join(upward)
    graph = import_graph()
    leaf_imports = sorted(f"{m} imports {t}" for m, targets in graph.items() for t in targets
                          if _within(m, LEAVES) and not _within(t, LEAVES))
    assert not leaf_imports, "leaf modules import the project: " + "; ".join(leaf_imports)


def test_function_local_project_imports_say_why():
    unmarked = unmarked_lazy_imports()
    assert not unmarked, (f"{len(unmarked)} imports of project modules inside functions without "
                          f"'{LAZY_MARK} REASON' on their line (move them to the top of the "
                          f"module, or say why they wait): " + ", ".join(unmarked))


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


def test_no_module_takes_a_name_megatron_core_installs_in_the_namespace():
    """megatron-core ships ``megatron.core`` and, from 0.17, ``megatron.training`` (also
    ``legacy``, ``inference``) in the shared ``megatron`` namespace: a module or package of ours
    with such a name would shadow theirs or be shadowed, depending on ``sys.path``."""
    reserved = {"core", "training", "legacy", "inference"}
    ours = {p.relative_to(ROOT_PATH / "megatron").parts[0].removesuffix(".py")
            for p in (ROOT_PATH / "megatron").iterdir() if not p.name.startswith((".", "__"))}
    assert not ours & reserved, sorted(ours & reserved)
    assert not (ROOT_PATH / "megatron" / "__init__.py").exists()  # a namespace package


# Below megatron/config/ no module takes or reads the parsed flags (an argparse.Namespace named
# ``args``): typed configs are built from them in megatron/config/run_config.py and passed down.
BELOW_CONFIG = ("megatron.errors", "megatron.utils", "megatron.runtime", "megatron.schedules",
                "megatron.tokenizer", "megatron.data", "megatron.parallel", "megatron.model",
                "megatron.checkpoint", "megatron.optim", "megatron.metrics")
# module -> why it may take or read ``args``
ARGS_ALLOWED = {
    "megatron.utils.typed_config": "config_from_args is the one bridge from the parsed flags to a "
                                   "typed config; only megatron/config/ and above call it",
}


def args_uses(source: str) -> List[str]:
    """``line N: ...`` for every function parameter named ``args`` and every ``args.<attr>`` of
    ``source``. A ``*args`` pass-through (positional arguments handed on, not the flags) and an
    exception's ``e.args`` are not counted."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            for param in a.posonlyargs + a.args + a.kwonlyargs + ([a.kwarg] if a.kwarg else []):
                if param.arg == "args":
                    found.append(f"line {node.lineno}: {getattr(node, 'name', 'lambda')}(args)")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "args":
            found.append(f"line {node.lineno}: args.{node.attr}")
    return sorted(found)


def test_the_args_walk_sees_a_parameter_and_a_read_but_not_a_pass_through():
    source = ("def f(x, args):\n    return args.seed\n"
              "def g(*args, **kwargs):\n    return h(*args)\n"
              "def k(e):\n    return e.args\n")
    assert args_uses(source) == ["line 1: f(args)", "line 2: args.seed"]


def test_no_module_below_config_reads_the_parsed_flags():
    modules = _module_files()
    below = {m: p for m, p in modules.items() if _within(m, BELOW_CONFIG)}
    allowed = dict(ARGS_ALLOWED)
    offenders = {m: args_uses(p.read_text()) for m, p in sorted(below.items())}
    offenders = {m: uses for m, uses in offenders.items() if uses}
    unexpected = {m: uses for m, uses in offenders.items() if m not in allowed}
    assert not unexpected, (
        "modules below megatron/config/ take or read the parsed flags (pass a typed config, "
        "megatron/config/run_config.py): " + "; ".join(
            f"{m} ({', '.join(uses[:3])}{', ...' if len(uses) > 3 else ''})"
            for m, uses in unexpected.items()))
    stale = sorted(m for m in allowed if m not in offenders)
    assert not stale, f"allowed to read args but no longer do (remove them from the lists): {stale}"
