"""SQL lives in the store only: outside ``iris_desktop/core/store/`` no module of the app
runs a statement (``execute``, ``executemany``, ``executescript``), opens a database
(``sqlite3.connect``), or reaches a Store's connection (``.conn``) or its sqlite-utils
``Database`` (``.db``) to query it. Read from the source with ``ast``, so nothing is
imported."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import iris_desktop

PACKAGE = Path(iris_desktop.__file__).parent
STORE = PACKAGE / "core" / "store"
STATEMENTS = {"execute", "executemany", "executescript"}


def modules(inside_store: bool) -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py")) if (STORE in path.parents) == inside_store]


def calls(path: Path) -> Iterator[tuple[str, int]]:
    """(what is called, line) for each statement run and each sqlite3.connect in ``path``,
    through any name sqlite3 or its connect is imported as."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    modules_as, connect_as = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules_as |= {a.asname or a.name for a in node.names if a.name == "sqlite3"}
        elif isinstance(node, ast.ImportFrom) and node.module == "sqlite3":
            connect_as |= {a.asname or a.name for a in node.names if a.name == "connect"}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute)
                and func.value.attr in ("conn", "db")):
            yield f".{func.value.attr}.{func.attr}", node.lineno
        if isinstance(func, ast.Attribute) and func.attr in STATEMENTS:
            yield func.attr, node.lineno
        elif (isinstance(func, ast.Attribute) and func.attr == "connect"
              and isinstance(func.value, ast.Name) and func.value.id in modules_as):
            yield "sqlite3.connect", node.lineno
        elif isinstance(func, ast.Name) and func.id in connect_as:
            yield "sqlite3.connect", node.lineno


def test_no_module_outside_the_store_runs_sql_or_connects():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}("
             for path in modules(inside_store=False) for what, line in calls(path)]
    assert found == []


def test_the_check_sees_the_stores_own_sql():
    """Not vacuous: the same walk finds the store's statements and its connections."""
    found = {what for path in modules(inside_store=True) for what, _ in calls(path)}
    assert {"execute", "executemany", "sqlite3.connect", ".db.query", ".conn.execute"} <= found
