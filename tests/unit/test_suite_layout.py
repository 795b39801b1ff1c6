"""The test suite's own rules (tests/README.md), read from the source with ``ast`` (nothing is
imported or run):

* a test that starts a process carries the ``launch`` marker, and only such a test: directly (a
  call of ``subprocess``/``os`` process functions or of a helper that makes one, such as
  ``helpers.launch.run_deepspeed``), through a module function, or through a fixture (its own, or
  conftest's, at any depth); the marker is ``pytestmark = pytest.mark.launch`` on a module whose
  every test launches, else ``@pytest.mark.launch`` on the test;
* a module with such a test lives in tests/e2e/, every other one in tests/unit/;
* no test module imports another test module (shared code lives in tests/helpers/);
* conftest's SLOW_FILES_FIRST and the child scripts the tests launch name files that exist.
"""
import ast
import os
import re
from typing import Dict, Iterator, List, Optional, Set, Tuple

from helpers.paths import ROOT, TESTS

# process-starting functions of the standard library: module -> function names (or prefixes*)
PROCESS_FUNCTIONS = {
    "subprocess": {"run", "Popen", "call", "check_call", "check_output", "getoutput",
                   "getstatusoutput"},
    "os": {"system", "popen", "fork", "forkpty", "spawn*", "exec*", "posix_spawn*"},
    "pty": {"spawn", "fork"},
    "multiprocessing": {"Process", "Pool", "get_context"},
    "torch.multiprocessing": {"spawn", "start_processes", "Process", "Pool", "get_context"},
}


def _is_process_function(module: str, name: str) -> bool:
    return any(name == f or (f.endswith("*") and name.startswith(f[:-1]))
               for f in PROCESS_FUNCTIONS.get(module, ()))


def _parse(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


class Module:
    """One source file: which of its top-level names (functions, classes, assignments) start a
    process, given the names ``known`` to (helpers' functions that do)."""

    def __init__(self, tree: ast.Module, known: Set[str]):
        self.tree, self.known = tree, set(known)
        self.direct = set()  # names imported from the process modules: from os import system
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in PROCESS_FUNCTIONS:
                self.direct |= {a.asname or a.name for a in node.names
                                if _is_process_function(node.module, a.name)}
        self.defs = {}
        for stmt in tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs[stmt.name] = stmt
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    for n in ast.walk(target):
                        if isinstance(n, ast.Name):
                            self.defs[n.id] = stmt
        self.launching = set(known) | self.direct
        grown = True
        while grown:  # module functions calling module functions, at any depth
            grown = False
            for name, node in self.defs.items():
                if name not in self.launching and self.starts_process(node):
                    self.launching.add(name)
                    grown = True

    def starts_process(self, node: ast.AST) -> bool:
        """Whether ``node`` refers to a process function or to a name that reaches one."""
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in self.launching:
                return True
            if isinstance(n, ast.Attribute):
                if n.attr in self.known:  # a helper through its module: launch.run_deepspeed
                    return True
                if isinstance(n.value, ast.Name) and _is_process_function(n.value.id, n.attr):
                    return True
        return False


def launching_helpers() -> Set[str]:
    """The functions of tests/helpers/ that start a process (directly or through each other)."""
    directory = os.path.join(TESTS, "helpers")
    trees = [_parse(os.path.join(directory, f)) for f in sorted(os.listdir(directory))
             if f.endswith(".py")]
    known: Set[str] = set()
    while True:
        found = set(known)
        for tree in trees:
            module = Module(tree, known)
            found |= {n for n in module.launching - module.direct
                      if isinstance(module.defs.get(n), (ast.FunctionDef, ast.AsyncFunctionDef))}
        if found == known:
            return known
        known = found


def _fixture(func: ast.AST) -> Optional[Tuple[str, bool]]:
    """(fixture name, autouse) when ``func`` is a pytest fixture."""
    for dec in getattr(func, "decorator_list", []):
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            name, autouse = func.name, False
            for kw in dec.keywords if isinstance(dec, ast.Call) else []:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                    name = kw.value.value
                if kw.arg == "autouse" and isinstance(kw.value, ast.Constant):
                    autouse = bool(kw.value.value)
            return name, autouse
    return None


def _arguments(func) -> List[str]:
    a = func.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


def _fixtures_used(node) -> List[str]:
    """The fixtures ``node`` (a test, fixture or class) names: its arguments, usefixtures marks and
    request.getfixturevalue calls."""
    used = _arguments(node) if not isinstance(node, ast.ClassDef) else []
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                n.func.attr in ("usefixtures", "getfixturevalue"):
            used += [a.value for a in n.args if isinstance(a, ast.Constant)]
    return used


def _has_launch_mark(nodes) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "launch" and
               isinstance(n.value, ast.Attribute) and n.value.attr == "mark"
               for node in nodes for n in ast.walk(node))


class Fixtures:
    """Fixtures by name (a module's own shadow conftest's) and which of them start a process."""

    def __init__(self, modules: List[Module]):
        self.uses: Dict[str, List[str]] = {}
        self.body: Dict[str, bool] = {}
        self.autouse: Set[str] = set()
        for module in modules:  # later modules win
            for stmt in module.tree.body:
                info = _fixture(stmt)
                if info:
                    self.uses[info[0]] = _fixtures_used(stmt)
                    self.body[info[0]] = module.starts_process(stmt)
                    if info[1]:
                        self.autouse.add(info[0])
        self.launching = {name for name, launches in self.body.items() if launches}
        grown = True
        while grown:
            grown = False
            for name, uses in self.uses.items():
                if name not in self.launching and any(u in self.launching for u in uses):
                    self.launching.add(name)
                    grown = True


def collect_tests(path: str, known: Set[str], conftest: Module) -> Iterator[Tuple[str, bool, bool]]:
    """(test id, starts a process, carries the launch marker) of each test function in ``path``."""
    module = Module(_parse(path), known)
    fixtures = Fixtures([conftest, module])
    module_marked = any(isinstance(s, ast.Assign) and
                        any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)
                        and _has_launch_mark([s.value]) for s in module.tree.body)
    autouse = any(f in fixtures.launching for f in fixtures.autouse)
    rel = os.path.relpath(path, ROOT)
    for stmt in module.tree.body:
        found = []
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                stmt.name.startswith("test"):
            found.append((stmt.name, stmt, None))
        elif isinstance(stmt, ast.ClassDef) and stmt.name.startswith("Test"):
            found += [(f"{stmt.name}::{f.name}", f, stmt) for f in stmt.body
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and f.name.startswith("test")]
        for name, func, cls in found:
            uses = _fixtures_used(func) + (_fixtures_used(cls) if cls else [])
            launches = (autouse or module.starts_process(func)
                        or any(u in fixtures.launching for u in uses))
            marked = (module_marked or _has_launch_mark(func.decorator_list)
                      or bool(cls and _has_launch_mark(cls.decorator_list)))
            yield f"{rel}::{name}", launches, marked


def _test_files(folder: str) -> List[str]:
    directory = os.path.join(TESTS, folder)
    return sorted(os.path.join(directory, f) for f in os.listdir(directory)
                  if f.startswith("test_") and f.endswith(".py"))


def _all_tests() -> List[Tuple[str, bool, bool]]:
    known = launching_helpers()
    conftest = Module(_parse(os.path.join(TESTS, "conftest.py")), known)
    return [t for folder in ("unit", "e2e") for path in _test_files(folder)
            for t in collect_tests(path, known, conftest)]


# ------------------------------------------------------------------ the checks
def test_the_launch_helpers_are_found():
    """The analysis sees the helpers every launch goes through (else it would find nothing)."""
    assert {"run_deepspeed", "run_single_process", "run_ranks", "run_layout"} <= launching_helpers()


def test_every_test_that_starts_a_process_carries_the_launch_marker_and_no_other():
    tests = _all_tests()
    assert len(tests) > 500
    unmarked = [test for test, launches, marked in tests if launches and not marked]
    assert not unmarked, ("these tests start a process (directly, through a module function or a "
                          "fixture) without the launch marker (pytestmark = pytest.mark.launch on "
                          f"the module, or @pytest.mark.launch on the test): {unmarked}")
    stale = [test for test, launches, marked in tests if marked and not launches]
    assert not stale, ("these tests carry the launch marker but start no process (the fast set "
                       f"-m 'not launch' would miss them): {stale}")


def test_modules_that_launch_are_in_e2e_and_the_others_in_unit():
    by_module: Dict[str, Set[bool]] = {}
    for test, launches, _ in _all_tests():
        by_module.setdefault(test.split("::")[0], set()).add(launches)
    misplaced = [m for m, kinds in by_module.items()
                 if (m.startswith("tests/unit/") and True in kinds)
                 or (m.startswith("tests/e2e/") and True not in kinds)]
    for directory, _, files in os.walk(TESTS):  # test modules anywhere else
        if directory not in (os.path.join(TESTS, "unit"), os.path.join(TESTS, "e2e")):
            misplaced += [os.path.relpath(os.path.join(directory, f), ROOT) for f in files
                          if f.startswith("test_") and f.endswith(".py")]
    assert not misplaced, f"move these modules (launching ones to tests/e2e/): {misplaced}"


def test_no_test_module_imports_another_test_module():
    imports = []
    for folder in ("unit", "e2e", "helpers", "scripts"):
        directory = os.path.join(TESTS, folder)
        for f in sorted(os.listdir(directory)):
            if not f.endswith(".py"):
                continue
            for node in ast.walk(_parse(os.path.join(directory, f))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                imports += [f"tests/{folder}/{f}: {n}" for n in names
                            if re.match(r"(tests\.)?(unit\.|e2e\.)?(test_|conftest)", n)]
    assert not imports, f"shared code belongs in tests/helpers/: {imports}"


def test_slow_files_first_and_the_launched_scripts_exist():
    tree = _parse(os.path.join(TESTS, "conftest.py"))
    slow, = [ast.literal_eval(s.value) for s in tree.body if isinstance(s, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "SLOW_FILES_FIRST" for t in s.targets)]
    missing = [f for f in slow if not os.path.isfile(os.path.join(TESTS, f))]
    scripts = set()
    for path in _test_files("e2e"):
        with open(path, encoding="utf-8") as f:
            scripts |= set(re.findall(r"[\"'](tests/scripts/\w+\.py)[\"']", f.read()))
    assert scripts, "the e2e tests launch child scripts from tests/scripts/"
    missing += [s for s in sorted(scripts) if not os.path.isfile(os.path.join(ROOT, s))]
    assert not missing, missing


def test_the_analysis_sees_a_launch_through_a_fixture(tmp_path):
    """The check itself: a test that launches through a module function and a fixture of a fixture
    counts as launching; one that only parses does not."""
    source = '''
import pytest
from helpers.launch import run_deepspeed

def _train(flags):
    return run_deepspeed("pretrain_gpt.py", flags)

@pytest.fixture
def run(tmp_path):
    return _train([str(tmp_path)])

@pytest.fixture
def records(run):
    return run.stdout

def test_reads_records(records):
    assert records

@pytest.mark.launch
def test_marked(tmp_path):
    import subprocess
    subprocess.run(["true"])

def test_parses_only():
    assert int("1") == 1
'''
    path = tmp_path / "test_example.py"
    path.write_text(source)
    known = launching_helpers()
    conftest = Module(_parse(os.path.join(TESTS, "conftest.py")), known)
    got = {t.split("::")[-1]: (launches, marked) for t, launches, marked in
           collect_tests(str(path), known, conftest)}
    assert got == {"test_reads_records": (True, False), "test_marked": (True, True),
                   "test_parses_only": (False, False)}
