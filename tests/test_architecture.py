"""The shape of the code, checked: the layers (core and runtime never import each other,
nor Qt: Anki's and napari's rule; the host joins them), no import cycle anywhere (``TYPE_CHECKING`` imports included),
small UI modules, short core functions (or a stated reason), one place that computes
windows and counters, and one place that loads models."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import iris_desktop

PACKAGE = Path(__file__).resolve().parent.parent / "iris_desktop"
#: "about 400 lines" per UI module (issue 10), with a little slack for a docstring
UI_MODULE_LINES = 420
#: "about 60 lines" per core function, unless its docstring says why it is longer
CORE_FUNCTION_LINES = 60
LONG_REASON = "Long because"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_imports(path: Path, type_checking: bool = False) -> set[str]:
    """Modules of the package that ``path`` imports (module level and inside functions
    alike); ``if TYPE_CHECKING:`` blocks too when ``type_checking``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inside = path.resolve().is_relative_to(PACKAGE.parent)
    package = "" if not inside else (
        module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path))
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("iris_desktop"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("iris_desktop"):
                found.add(name)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def graph(type_checking: bool = True) -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in runtime_imports(path, type_checking):
            # "from iris_desktop.core import x" may name a module or an attribute
            while imported not in modules and "." in imported:
                imported = imported.rsplit(".", 1)[0]
            if imported in modules and imported != name:
                targets.add(imported)
        edges[name] = targets
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_package_has_no_import_cycle_type_checking_imports_included():
    edges = graph(type_checking=True)
    # package __init__ files re-export their modules; a cycle through them is not a design
    # cycle, so they are left out of the walk
    edges = {k: {t for t in v if not PACKAGE.joinpath(*t.split(".")[1:], "__init__.py").exists()}
             for k, v in edges.items()}
    assert find_cycle(edges) is None, " → ".join(find_cycle(edges) or [])


def test_a_type_checking_import_counts(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from iris_desktop.ui.main_window import MainWindow\n")
    assert runtime_imports(source) == set()
    assert runtime_imports(source, type_checking=True) == {"iris_desktop.ui.main_window"}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else module


def test_core_and_runtime_never_import_each_other():
    """core states what it needs of a model (core.ports); runtime needs only the shared
    token vocabulary (iris_desktop.tokens); the host joins them."""
    crossing = []
    for path in PACKAGE.rglob("*.py"):
        source = layer_of(module_name(path))
        for imported in runtime_imports(path, type_checking=True):
            target = layer_of(imported)
            if {source, target} == {"core", "runtime"}:
                crossing.append(f"{module_name(path)} imports {imported}")
    assert crossing == []


def test_core_and_runtime_import_neither_the_host_nor_the_ui_nor_the_cli():
    above = ("iris_desktop.host", "iris_desktop.ui", "iris_desktop.commands", "iris_desktop.cli")
    found = []
    for package in ("core", "runtime"):
        for path in (PACKAGE / package).rglob("*.py"):
            found += [f"{module_name(path)} imports {i}" for i in runtime_imports(path, True)
                      if i.startswith(above)]
    assert found == []


#: what loads a model, an embedder or a KV state store: only the host does
LOADERS = ("LocalModel", "RemoteRuntime", "Embedder", "KVStateStore", "ThreadCache",
           "load_runtime", "connect_server")


def test_the_cli_and_the_model_thread_drive_the_host_and_load_nothing_themselves():
    faces = {"the CLI's commands": sorted((PACKAGE / "commands").glob("*.py")),
             "ui/model_thread.py": [PACKAGE / "ui" / "model_thread.py"]}
    for face, paths in faces.items():
        imports: set[str] = set()
        for path in paths:
            imports |= runtime_imports(path)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
                a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
            assert not names & set(LOADERS), f"{path.name} uses {sorted(names & set(LOADERS))}"
        assert "iris_desktop.host" in imports, face
        assert not {i for i in imports if i in ("iris_desktop.runtime.model",
                                                 "iris_desktop.runtime.embedder",
                                                 "iris_desktop.runtime.kv_store")}, face


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_ui_module_is_over_about_400_lines():
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines())
             for p in (PACKAGE / "ui").glob("*.py")}
    assert {n: s for n, s in sizes.items() if s > UI_MODULE_LINES} == {}


def test_core_functions_are_short_or_say_why():
    long = []
    for path in (PACKAGE / "core").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            length = node.end_lineno - node.lineno + 1
            doc = ast.get_docstring(node) or ""
            if length > CORE_FUNCTION_LINES and LONG_REASON not in doc:
                long.append(f"{path.name}:{node.name} ({length} lines)")
    assert long == []


def test_only_the_planner_computes_windows_and_counters():
    """window_for / counter_for live in core.planner and nowhere else calls them."""
    for path in PACKAGE.rglob("*.py"):
        if path.name == "planner.py":
            continue
        text = path.read_text(encoding="utf-8")
        for name in ("window_for(", "counter_for(", "tools_system_prompt("):
            if name == "tools_system_prompt(" and path.name == "toolcalls.py":
                continue
            assert name not in text, f"{path.relative_to(PACKAGE)} calls {name}"


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    found[f"{node.name}.{item.name}"] = item
    return found


def test_a_turn_goes_from_the_ui_to_the_agent_without_a_lambda():
    """Issue 43: a GUI send becomes a Turn (core.turns), a TurnJob on the model thread,
    ``Host.run`` and ``Agent.run_turn`` (one match): each step a named call."""
    path_of_a_send = {
        "ui/turn_control.py": ["TurnControl.send", "TurnControl._start"],
        "ui/model_thread.py": ["ModelThread.run_turn", "ModelWorker.run_turn"],
        "host.py": ["Host.run", "Host.send", "Host.regenerate", "Host.edit", "Host.continue_reply"],
        "core/agent.py": ["Agent.run_turn"],
    }
    for relative, names in path_of_a_send.items():
        functions = _functions(PACKAGE / relative)
        for name in names:
            assert name in functions, f"{relative}: {name}"
            lambdas = [n for n in ast.walk(functions[name]) if isinstance(n, ast.Lambda)]
            assert lambdas == [], f"{relative}: {name} holds a lambda"
    run_turn = _functions(PACKAGE / "core/agent.py")["Agent.run_turn"]
    assert any(isinstance(n, ast.Match) for n in ast.walk(run_turn))


def test_no_stop_or_give_way_parameter_is_typed_any():
    """Cancellation is one protocol (core.turns.Stop), not ``Any``."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for arg in [*node.args.args, *node.args.kwonlyargs]:
                if arg.arg in ("cancel", "give_way", "idle", "stop") and isinstance(
                        arg.annotation, ast.Name) and arg.annotation.id == "Any":
                    found.append(f"{module_name(path)}.{node.name}({arg.arg})")
    assert found == []


#: no module anywhere in the package over this many lines (issue 43)
MODULE_LINES = 900
#: no function anywhere over this many lines, whatever its docstring says (issue 43)
FUNCTION_LINES = 100
#: the settings catalogue: one declaration per setting, read top to bottom
LARGE_BY_NATURE = {"settings.py"}
#: being split (issue 43): remove each entry as its split lands
KNOWN_LARGE: set[str] = set()
KNOWN_LONG: set[str] = set()


def large_modules(root: Path) -> dict[str, int]:
    """Modules under ``root`` over MODULE_LINES lines, by path relative to it."""
    sizes = {p.relative_to(root).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in root.rglob("*.py")}
    return {name: size for name, size in sizes.items() if size > MODULE_LINES}


def long_functions(root: Path) -> dict[str, int]:
    """Functions under ``root`` over FUNCTION_LINES lines, as ``path:name``."""
    found = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES:
                    found[f"{path.relative_to(root).as_posix()}:{node.name}"] = length
    return found


def test_no_module_is_over_900_lines():
    large = {name: size for name, size in large_modules(PACKAGE).items()
             if name not in LARGE_BY_NATURE | KNOWN_LARGE}
    assert large == {}, (f"modules over {MODULE_LINES} lines: {large}; "
                         f"known and being split: {sorted(KNOWN_LARGE)}")


def test_no_function_is_over_100_lines():
    long = {name: size for name, size in long_functions(PACKAGE).items()
            if name not in KNOWN_LONG}
    assert long == {}, (f"functions over {FUNCTION_LINES} lines: {long}; "
                        f"known and being split: {sorted(KNOWN_LONG)}")


def test_the_size_rules_see_a_long_module_and_function_in_any_package(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    (tmp_path / "any" / "where").mkdir(parents=True)
    (tmp_path / "any" / "where" / "big.py").write_text(
        f"def long():\n{body}\n" + "\n" * MODULE_LINES, encoding="utf-8")
    assert list(large_modules(tmp_path)) == ["any/where/big.py"]
    assert long_functions(tmp_path) == {"any/where/big.py:long": FUNCTION_LINES + 1}


#: where a file may be renamed over another: the one atomic writer, and the store's own
#: swaps of the database file (salvage, restore, encryption conversion)
RENAMERS = {"files.py", "core/store/recovery.py", "core/store/cipher.py"}


def test_os_replace_only_in_the_atomic_writer_and_the_stores_database_swaps():
    """Issue 43: about ten hand-written "write a private file atomically" existed (five
    without fsync); every whole-file write now goes through iris_desktop/files.py."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        relative = str(path.relative_to(PACKAGE))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr in ("replace", "rename")
                    and isinstance(node.value, ast.Name) and node.value.id == "os"
                    and relative not in RENAMERS):
                found.append(f"{relative}:{node.lineno}")
    assert found == []


def test_core_and_runtime_do_not_load_pyside6():
    """Every module of core/ and runtime/ (subpackages included), imported in a fresh
    process, loads neither PySide6 nor shiboken."""
    modules = ["iris_desktop", "iris_desktop.paths", "iris_desktop.settings", "iris_desktop.cli"]
    for package in ("core", "runtime"):
        path = [f"{iris_desktop.__path__[0]}/{package}"]
        modules += [m.name for m in pkgutil.walk_packages(path, prefix=f"iris_desktop.{package}.")]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "loaded = [m for m in sys.modules if m.startswith('PySide6') or m.startswith('shiboken')]\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert any(".tools." in m for m in modules) and any(".remote." in m for m in modules)
