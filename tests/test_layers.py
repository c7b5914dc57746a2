"""core/ and runtime/ never import Qt (Anki's and napari's rule)."""

import pkgutil
import subprocess
import sys

import iris_desktop


def test_core_and_runtime_do_not_load_pyside6():
    modules = ["iris_desktop", "iris_desktop.paths", "iris_desktop.settings", "iris_desktop.cli"]
    for package in ("core", "runtime"):
        path = [f"{iris_desktop.__path__[0]}/{package}"]
        modules += [f"iris_desktop.{package}.{m.name}" for m in pkgutil.iter_modules(path)]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "loaded = [m for m in sys.modules if m.startswith('PySide6') or m.startswith('shiboken')]\n"
        "assert not loaded, loaded\n"
        "print(len(sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert len(modules) > 8
