"""The model library: GGUF files this computer already has, used in place (never copied).

:func:`discover_models` lists the bundled model, the models downloaded with Model ▸
Download… (``runtime.hub``), the GGUF files in other local-LLM
apps' folders (LM Studio, Ollama, the Hugging Face hub cache, GPT4All, Jan), files
opened before and folders the user added. Each :class:`ModelEntry` says what the GGUF
header says (architecture, parameters, quantization, trained context, chat template)
and estimates the memory the model needs at a chosen ``n_ctx``. Only headers are read
(:func:`~.gguf.read_gguf_info`, over a memory map), never the weights; that costs about
0.1 s per file (most of it skipping the vocabulary), so call this off the GUI thread.

Where the apps keep their models, on every OS unless said (sources are cited in each
``_<app>_roots`` docstring; ``~`` is ``%USERPROFILE%`` on Windows):

- LM Studio: ``<home>/models/<publisher>/<repo>/*.gguf``, ``<home>`` being ``~/.lmstudio``
  (older: ``~/.cache/lm-studio``) or what ``~/.lmstudio-home-pointer`` names; the
  ``downloadsFolder`` of ``<home>/settings.json`` when set.
- Ollama: ``$OLLAMA_MODELS`` or ``~/.ollama/models`` (Linux service:
  ``/usr/share/ollama/.ollama/models``); ``manifests/<host>/<ns>/<model>/<tag>`` JSON
  naming a ``blobs/sha256-<hex>`` GGUF.
- Hugging Face: ``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or
  ``${XDG_CACHE_HOME:-~/.cache}/huggingface/hub``; ``models--<org>--<repo>/snapshots/*/``.
- GPT4All: ``modelPath`` in ``GPT4All.ini``, else Linux
  ``${XDG_DATA_HOME:-~/.local/share}/nomic.ai/GPT4All``, macOS
  ``~/Library/Application Support/nomic.ai/GPT4All``, Windows
  ``%LOCALAPPDATA%\\nomic.ai\\GPT4All``; the Python bindings' ``~/.cache/gpt4all``.
- Jan: ``<data folder>/llamacpp/models/<id>/`` (older: ``<data folder>/models/``), the
  data folder being ``$JAN_DATA_FOLDER``, the ``data_folder`` of its settings.json, or
  ``<data>/Jan/data`` with ``<data>`` = ``$JAN_DATA_ROOT``, Linux ``~/.local/share``
  (older builds ``~/.config``), macOS ``~/Library/Application Support``, Windows
  ``%APPDATA%``; the oldest Jan used ``~/jan/models``.

Walks are bounded (a depth per app, :data:`MAX_ENTRIES_PER_ROOT` directory entries per
folder tree, :data:`MAX_MODELS` results) and skip hidden folders, so a huge or looping
tree costs little. A file whose header is unusable is still listed, with ``error`` set,
so the UI can say why; a valid GGUF that is not a chat model (a vision projector, a
LoRA adapter, an embedding model, a vocabulary-only file) is skipped.
"""

from __future__ import annotations

import configparser
import itertools
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from iris_desktop.files import atomic_write, read_json_object
from iris_desktop.paths import make_private_dir

from .bundled import BUNDLED_MODEL, bundled_status
from .gguf import GGUFError, GGUFInfo, per_layer, read_gguf_info

log = logging.getLogger("iris.runtime.library")

__all__ = [
    "DEFAULT_N_CTX",
    "SOURCES",
    "ModelEntry",
    "describe_model",
    "discover_models",
    "is_base_model",
    "kv_cache_bytes",
    "parameter_count",
]

SOURCES = ("bundled", "download", "lmstudio", "ollama", "huggingface", "gpt4all", "jan", "file")
DEFAULT_N_CTX = 8192
#: bytes per KV-cache element: llama.cpp's default cache type is f16
KV_BYTES_PER_ELEMENT = 2
#: directory entries looked at per folder tree before the walk gives up
MAX_ENTRIES_PER_ROOT = 20_000
#: models listed at most
MAX_MODELS = 500
#: manifests larger than this are not Ollama manifests
_MAX_MANIFEST_BYTES = 1 << 20

_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_QUANT_IN_NAME = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32)(?![A-Za-z0-9])", re.IGNORECASE)
_OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
_OLLAMA_DIGEST = re.compile(r"^sha256[:-][0-9a-f]{64}$")


@dataclass(frozen=True)
class ModelEntry:
    """One model the user can pick. ``as_json()`` is what the UI and the CLI show."""

    path: Path
    name: str
    source: str
    architecture: str | None = None
    parameters: int | None = None
    quantization: str | None = None
    #: the file's size (all parts of a split model)
    size_bytes: int | None = None
    #: the trained context (``<arch>.context_length``)
    context_length: int | None = None
    chat_template: bool = False
    #: weights + KV cache at ``n_ctx`` (llama.cpp's compute buffers come on top)
    memory_estimate_bytes: int | None = None
    kv_cache_bytes: int | None = None
    n_ctx: int = DEFAULT_N_CTX
    #: a pretrained model rather than an instruction-tuned one (:func:`is_base_model`)
    base_model: bool | None = None
    #: bundled model only: written and sha256-verified in the models folder
    verified: bool | None = None
    #: bundled model only: the file exists in the models folder
    assembled: bool | None = None
    #: Ollama's own name for it, as ``ollama list`` shows it (``llama3.2:3b``)
    ollama_name: str | None = None
    #: ``org/repo`` (Hugging Face) or ``publisher/repo`` (LM Studio) the file came from
    repo: str | None = None
    split_count: int = 1
    #: the path is in the ``recent`` list given to :func:`discover_models`
    recent: bool = False
    #: why the file cannot be used; the other fields are then mostly None
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["path"] = str(self.path)
        return data


# ---------------------------------------------------------------------------
# what a header says


def parameter_count(infos: list[GGUFInfo]) -> int:
    """``general.parameter_count`` when stated, else the tensor elements of all parts.

    A converter may write out a copy of tied embeddings as ``output.weight`` (Qwen2.5
    0.5B's official GGUF does: 630M elements for a 494M model), while other models
    really have a separate output matrix of the same shape (Llama 3). The copy is left
    out only when ``general.size_label`` ("0.5B") is closer to the count without it.
    """
    stated = infos[0].metadata.get("general.parameter_count")
    if isinstance(stated, int) and not isinstance(stated, bool) and stated > 0:
        return stated
    total = sum(info.tensor_elements for info in infos)
    copy = sum(info.output_copy_elements for info in infos)
    label = _size_label_count(infos[0].metadata.get("general.size_label"))
    if copy and label and abs(total - copy - label) < abs(total - label):
        return total - copy
    return total


def _size_label_count(label: Any) -> int | None:
    """"0.5B" -> 500_000_000; None for anything else ("8x7B", "7B-A1B", missing)."""
    if not isinstance(label, str):
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMBT])", label.strip(), re.IGNORECASE)
    if not match:
        return None
    scale = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}[match.group(2).upper()]
    return int(float(match.group(1)) * scale)


def kv_cache_bytes(info: GGUFInfo, n_ctx: int, bytes_per_element: int = KV_BYTES_PER_ELEMENT) -> int | None:
    """The KV cache llama.cpp allocates for ``n_ctx`` tokens, from the header:
    per layer, KV heads × (key size + value size) × bytes per element × ``n_ctx``.

    KV heads is ``<arch>.attention.head_count_kv`` (default: ``head_count``); the key
    and value sizes are ``attention.key_length`` / ``value_length`` when present, else
    ``embedding_length / head_count``. Layers without attention heads (recurrent
    layers of hybrid models) hold no KV cache. A sliding-window model counts a full
    cache for every layer, as Iris loads it (``swa_full=True``). None when the header
    lacks the geometry.
    """
    layers = info.arch_key("block_count")
    if not isinstance(layers, int) or layers <= 0:
        return None
    heads = per_layer(info.arch_key("attention.head_count"), layers)
    if heads is None:
        return None
    kv_heads = per_layer(info.arch_key("attention.head_count_kv"), layers) or heads
    embedding = info.arch_key("embedding_length")
    key_length = info.arch_key("attention.key_length")
    value_length = info.arch_key("attention.value_length")
    per_token = 0
    for n_heads, n_kv in zip(heads, kv_heads, strict=True):
        if n_heads <= 0 or n_kv <= 0:
            continue
        head_size = embedding // n_heads if isinstance(embedding, int) else 0
        k = key_length if isinstance(key_length, int) else head_size
        v = value_length if isinstance(value_length, int) else head_size
        per_token += n_kv * (k + v)
    return per_token * bytes_per_element * n_ctx


_BASE_WORDS = frozenset({"base", "pt", "pretrain", "pretrained", "foundation"})
_INSTRUCT_WORDS = frozenset({"instruct", "instruction", "chat", "it", "sft", "dpo", "rlhf", "orpo", "kto",
                             "assistant", "conversational", "thinking", "reasoning"})


def _words(*texts: Any) -> set[str]:
    return {w for text in texts if isinstance(text, str) for w in re.split(r"[^a-z0-9]+", text.lower()) if w}


def is_base_model(info: GGUFInfo, file_name: str = "") -> bool:
    """A pretrained (base) model rather than an instruction-tuned one.

    Base when the file has no chat template; otherwise when ``general.finetune`` (set
    by llama.cpp's converter from the model's name: "Instruct", "it", "Chat", ...) says
    base, or, with no finetune at all, when the name, ``general.basename``,
    ``general.type`` or the file name says base ("base", "pt", "pretrained") and nothing
    says instruct. Without such evidence a model with a template counts as instruct:
    the UI's "base" mark and compaction's extractive-only path need a reason.
    """
    if not info.chat_template:
        return True
    finetune = info.metadata.get("general.finetune")
    if isinstance(finetune, str) and finetune.strip():
        words = _words(finetune)
        return bool(words & _BASE_WORDS) and not words & _INSTRUCT_WORDS
    md = info.metadata
    words = _words(md.get("general.name"), md.get("general.basename"), md.get("general.type"),
                   file_name.removesuffix(".gguf"))
    return bool(words & _BASE_WORDS) and not words & _INSTRUCT_WORDS


def not_a_chat_model(info: GGUFInfo) -> str | None:
    """Why a valid GGUF is no model to chat with; None when it is one. The library leaves
    such a file out, and ``LocalModel.load`` refuses it (an embedding model loaded as the
    chat model failed every send with llama.cpp's "Memory is not initialized")."""
    kind = info.metadata.get("general.type")
    if isinstance(kind, str) and kind not in ("", "model"):
        return f"general.type is {kind!r}"  # "adapter" (LoRA), "mmproj", ...
    if info.architecture == "clip":
        return "a vision projector"
    if info.tensor_count == 0:
        return "a vocabulary-only file"
    pooling = info.arch_key("pooling_type")
    if isinstance(pooling, int) and pooling > 0:
        return "an embedding model"
    return None


# ---------------------------------------------------------------------------
# describing one file


@dataclass(frozen=True)
class _Found:
    """A candidate file, before its header is read."""

    path: Path
    source: str
    repo: str | None = None
    ollama_name: str | None = None


def _effective_ctx(n_ctx: int, trained: int | None) -> int:
    # as LocalModel.load: 0 means the trained context
    return n_ctx if n_ctx > 0 else (trained or 4096)


def _split_parts(path: Path) -> list[Path]:
    """All parts of a split model named ``*-00001-of-0000N.gguf``; ``[path]`` otherwise."""
    match = _SPLIT.match(path.name)
    if not match or int(match.group("index")) != 1:
        return [path]
    count = int(match.group("count"))
    return [path.with_name(f"{match.group('stem')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _read_parts(parts: list[Path]) -> list[GGUFInfo]:
    infos = []
    for i, part in enumerate(parts, 1):
        try:
            infos.append(read_gguf_info(part))
        except GGUFError as exc:
            prefix = f"part {i} of {len(parts)} ({part.name}): " if len(parts) > 1 else ""
            raise GGUFError(parts[0], prefix + exc.reason) from None
    return infos


def _display_name(found: _Found, info: GGUFInfo | None) -> str:
    if found.ollama_name:
        return found.ollama_name
    if info is not None and info.name:
        return info.name
    match = _SPLIT.match(found.path.name)
    stem = match.group("stem") if match else found.path.stem
    # Jan names every file model.gguf; its folder is the model's id
    return found.path.parent.name if stem == "model" and found.path.parent.name else stem


def _quantization(info: GGUFInfo, file_name: str) -> str | None:
    if info.file_type:
        return info.file_type
    match = _QUANT_IN_NAME.search(file_name)
    return match.group(1).upper() if match else None


def _file_size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


#: ggml's Q5_0 type, and the bytes of a 32-weight block in Q5_0 and in Q8_0: with
#: ``model.q8_weights`` the model is loaded from an exact Q8_0 copy (``runtime.weights``)
_Q5_0, _Q5_0_BLOCK, _Q8_0_BLOCK = 6, 22, 34


def _copy_growth(info: GGUFInfo) -> int:
    """How many bytes more the 8-bit copy of ``info``'s Q5_0 weights holds than the file."""
    q5 = sum(t.nbytes or 0 for t in info.tensors if t.ggml_type == _Q5_0)
    return q5 // _Q5_0_BLOCK * (_Q8_0_BLOCK - _Q5_0_BLOCK)


def _entry_from(found: _Found, n_ctx: int, q8_weights: bool = True
                ) -> tuple[ModelEntry, str | None]:
    """The entry for ``found`` and, for a valid GGUF that is no chat model, why not. The
    memory estimate counts the weights as they are loaded: from the 8-bit copy when
    ``q8_weights`` (an audit: the bundled model's "~559 MB" left out the 146 MB more its
    copy holds)."""
    parts = _split_parts(found.path)
    common = dict(path=found.path, source=found.source, repo=found.repo, ollama_name=found.ollama_name,
                  split_count=len(parts))
    try:
        infos = _read_parts(parts)
    except GGUFError as exc:
        return ModelEntry(name=_display_name(found, None), size_bytes=_file_size(found.path),
                          n_ctx=n_ctx, error=exc.reason, **common), None
    info = infos[0]
    ctx = _effective_ctx(n_ctx, info.context_length)
    weights = sum(i.size_bytes - i.header_size for i in infos)
    if q8_weights and len(infos) == 1:  # (a split file is loaded as it is)
        weights += _copy_growth(info)
    kv = kv_cache_bytes(info, ctx)
    entry = ModelEntry(
        name=_display_name(found, info),
        architecture=info.architecture,
        parameters=parameter_count(infos),
        quantization=_quantization(info, found.path.name),
        size_bytes=sum(i.size_bytes for i in infos),
        context_length=info.context_length,
        chat_template=bool(info.chat_template),
        memory_estimate_bytes=weights + kv if kv is not None else None,
        kv_cache_bytes=kv,
        n_ctx=ctx,
        base_model=is_base_model(info, found.path.name),
        **common,
    )
    return entry, not_a_chat_model(info)


def describe_model(path: str | os.PathLike[str], *, source: str = "file", n_ctx: int = DEFAULT_N_CTX,
                   repo: str | None = None, ollama_name: str | None = None,
                   q8_weights: bool = True) -> ModelEntry:
    """Describe one GGUF from its header. Never raises for a bad file: the entry then
    has ``error`` (also for a valid GGUF that is not a chat model)."""
    entry, not_chat = _entry_from(_Found(Path(path), source, repo, ollama_name), n_ctx, q8_weights)
    return replace(entry, error=f"not a chat model: {not_chat}") if not_chat else entry


def _bundled_entry(models_dir: Path, n_ctx: int, q8_weights: bool = True) -> ModelEntry:
    """The bundled model, described from its header once verified, else from
    :data:`~.bundled.BUNDLED_MODEL` (weights counted as the whole file)."""
    status = bundled_status(models_dir)
    path = Path(status["path"])
    if status["verified"]:
        entry = describe_model(path, source="bundled", n_ctx=n_ctx, q8_weights=q8_weights)
        return replace(entry, name=BUNDLED_MODEL.display_name, verified=True, assembled=True)
    m = BUNDLED_MODEL
    ctx = _effective_ctx(n_ctx, m.context_length)
    kv = m.block_count * m.head_count_kv * 2 * m.head_size * KV_BYTES_PER_ELEMENT * ctx
    missing = [p["requirement"] for p in status["parts"] if p["problem"]]
    error = None
    if missing and not status["present"]:
        error = f"the bundled model's packages are missing or damaged: {', '.join(missing)}"
    return ModelEntry(
        path=path, name=m.display_name, source="bundled", architecture=m.architecture,
        parameters=m.parameters, quantization=m.quantization, size_bytes=m.size,
        context_length=m.context_length, chat_template=m.chat_template,
        memory_estimate_bytes=m.size + kv, kv_cache_bytes=kv, n_ctx=ctx, base_model=False,
        verified=False, assembled=status["present"], error=error,
    )


# ---------------------------------------------------------------------------
# walking folders


class _Budget:
    """How many more directory entries a walk may look at."""

    def __init__(self) -> None:
        self.left = MAX_ENTRIES_PER_ROOT


def _is_model_file(name: str) -> bool:
    lower = name.lower()
    if not lower.endswith(".gguf") or lower.startswith(("mmproj", "incomplete-")):
        return False  # vision projectors; GPT4All's unfinished downloads
    match = _SPLIT.match(name)
    return match is None or int(match.group("index")) == 1


def _walk(root: Path, max_depth: int, budget: _Budget, want: Callable[[str], bool]) -> Iterator[Path]:
    """Files under ``root`` whose name ``want``s, sorted, at most ``max_depth`` folders
    down, skipping hidden entries; stops when ``budget`` runs out. Folder symlinks are
    followed (people link model folders); the depth bound stops loops."""
    stack = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        if budget.left <= 0:
            log.info("%s: stopped walking after %d entries", root, MAX_ENTRIES_PER_ROOT)
            return
        try:
            with os.scandir(folder) as it:
                entries = sorted(itertools.islice(it, budget.left), key=lambda e: e.name)
        except OSError:
            continue
        budget.left -= len(entries)
        subfolders = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                is_dir = entry.is_dir()
            except OSError:
                continue
            if is_dir:
                if depth < max_depth:
                    subfolders.append((Path(entry.path), depth + 1))
            elif want(entry.name):
                yield Path(entry.path)
        stack.extend(reversed(subfolders))


def _folder_models(root: Path, source: str, max_depth: int, repo_levels: int = 0) -> Iterator[_Found]:
    """GGUFs in a plain folder tree; ``repo_levels`` leading folders name the repo
    (LM Studio's ``<publisher>/<repo>/``)."""
    for path in _walk(root, max_depth, _Budget(), _is_model_file):
        rel = path.relative_to(root).parts[:-1]
        repo = "/".join(rel[:repo_levels]) if repo_levels and len(rel) >= repo_levels else None
        yield _Found(path, source, repo=repo)


def _hf_models(root: Path) -> Iterator[_Found]:
    """``models--org--repo/snapshots/<revision>/**.gguf`` (symlinks into ``blobs/``)."""
    budget = _Budget()
    try:
        with os.scandir(root) as it:
            names = [e.name for e in itertools.islice(it, budget.left)]
    except OSError:
        return
    budget.left -= len(names)
    for name in sorted(n for n in names if n.startswith("models--")):
        repo = name.removeprefix("models--").replace("--", "/")
        for path in _walk(root / name / "snapshots", 3, budget, _is_model_file):
            yield _Found(path, "huggingface", repo=repo)


def _ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    """As ``ollama list`` shows it: ``llama3.2:3b``, ``user/model:tag``, ``hf.co/org/repo:tag``."""
    if host == "registry.ollama.ai":
        return f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
    return f"{host}/{namespace}/{model}:{tag}"


def _ollama_blob(root: Path, manifest: Path) -> Path | None:
    """The GGUF blob a manifest's model layer points at (None: not a model manifest)."""
    try:
        if manifest.stat().st_size > _MAX_MANIFEST_BYTES:
            return None
        layers = json.loads(manifest.read_text("utf-8")).get("layers")
    except (OSError, ValueError, AttributeError):
        return None
    for layer in layers if isinstance(layers, list) else []:
        if isinstance(layer, dict) and layer.get("mediaType") == _OLLAMA_MODEL_LAYER:
            digest = layer.get("digest")
            if isinstance(digest, str) and _OLLAMA_DIGEST.match(digest):  # never a path
                return root / "blobs" / digest.replace(":", "-")
    return None


def _ollama_models(root: Path) -> Iterator[_Found]:
    """``manifests/<host>/<namespace>/<model>/<tag>`` JSON -> ``blobs/sha256-<hex>``."""
    manifests = root / "manifests"
    for manifest in _walk(manifests, 3, _Budget(), lambda name: True):
        parts = manifest.relative_to(manifests).parts
        if len(parts) != 4:
            continue
        blob = _ollama_blob(root, manifest)
        if blob is not None:
            yield _Found(blob, "ollama", ollama_name=_ollama_name(*parts))


# ---------------------------------------------------------------------------
# where each app keeps its models


@dataclass(frozen=True)
class _UserDirs:
    """The per-user folders apps resolve their data folders from."""

    home: Path
    data: Path  # Linux XDG data, macOS Application Support, Windows %APPDATA% (roaming)
    local: Path  # Windows %LOCALAPPDATA%; ``data`` elsewhere
    config: Path  # Linux XDG config; ``data`` elsewhere
    cache: Path  # $XDG_CACHE_HOME or ~/.cache (on every OS, as huggingface_hub does)
    platform: str


def _env_path(env: Mapping[str, str], name: str) -> Path | None:
    value = env.get(name, "").strip()
    return Path(value).expanduser() if value else None


def _user_dirs(home: Path, env: Mapping[str, str], platform: str) -> _UserDirs:
    cache = _env_path(env, "XDG_CACHE_HOME") or home / ".cache"
    if platform == "darwin":
        support = home / "Library" / "Application Support"
        return _UserDirs(home, support, support, support, cache, platform)
    if platform.startswith("win"):
        roaming = _env_path(env, "APPDATA") or home / "AppData" / "Roaming"
        local = _env_path(env, "LOCALAPPDATA") or home / "AppData" / "Local"
        return _UserDirs(home, roaming, local, roaming, cache, platform)
    data = _env_path(env, "XDG_DATA_HOME") or home / ".local" / "share"
    config = _env_path(env, "XDG_CONFIG_HOME") or home / ".config"
    return _UserDirs(home, data, data, config, cache, platform)


def _lmstudio_roots(dirs: _UserDirs) -> list[Path]:
    """LM Studio's home is ``~/.lmstudio`` (older: ``~/.cache/lm-studio``) unless
    ``~/.lmstudio-home-pointer`` names another; models are in ``<home>/models`` or the
    ``downloadsFolder`` of ``<home>/settings.json`` (Settings → My Models).
    Sources: https://lmstudio.ai/docs/app/basics/import-model ("~/.lmstudio/models/
    publisher/model/model-file.gguf"); lmstudio-ai/lmstudio-bug-tracker#553 (the home
    pointer, the two homes) and lmstudio-ai/lms#50 (``$HOME/.cache/lm-studio/models``).
    """
    homes = []
    try:
        pointer = (dirs.home / ".lmstudio-home-pointer").read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        pointer = ""
    if pointer:
        homes.append(Path(pointer.splitlines()[0]).expanduser())
    homes += [dirs.home / ".lmstudio", dirs.home / ".cache" / "lm-studio"]
    roots = []
    for home in homes:
        folder = read_json_object(home / "settings.json").get("downloadsFolder")
        if isinstance(folder, str) and folder.strip():
            roots.append(Path(folder).expanduser())
        roots.append(home / "models")
    return roots


def _ollama_roots(dirs: _UserDirs, env: Mapping[str, str]) -> list[Path]:
    """``$OLLAMA_MODELS``, else ``~/.ollama/models`` (macOS, Windows, Linux user installs);
    the Linux service runs as user ``ollama`` with ``/usr/share/ollama/.ollama/models``.
    Source: https://github.com/ollama/ollama/blob/main/docs/faq.md#where-are-models-stored
    """
    roots = [p for p in [_env_path(env, "OLLAMA_MODELS")] if p]
    roots.append(dirs.home / ".ollama" / "models")
    if dirs.platform.startswith("linux"):
        roots.append(Path("/usr/share/ollama/.ollama/models"))
    return roots


def _hf_roots(dirs: _UserDirs, env: Mapping[str, str]) -> list[Path]:
    """``$HF_HUB_CACHE`` (legacy ``$HUGGINGFACE_HUB_CACHE``), else ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub`` or ``~/.cache/huggingface/hub``, on every OS.
    Source: https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables
    and https://huggingface.co/docs/huggingface_hub/guides/manage-cache
    """
    roots = [p for p in (_env_path(env, "HF_HUB_CACHE"), _env_path(env, "HUGGINGFACE_HUB_CACHE")) if p]
    hf_home = _env_path(env, "HF_HOME")
    if hf_home:
        roots.append(hf_home / "hub")
    roots.append(dirs.cache / "huggingface" / "hub")
    return roots


def _gpt4all_roots(dirs: _UserDirs) -> list[Path]:
    """The desktop app's download path: ``modelPath`` in ``GPT4All.ini`` (Qt settings:
    Linux ``~/.config/nomic.ai/``, macOS ``~/.config/gpt4all.io/``, Windows
    ``%APPDATA%\\nomic.ai\\``), else Qt's AppLocalDataLocation (Linux
    ``~/.local/share/nomic.ai/GPT4All``, macOS ``~/Library/Application Support/nomic.ai/
    GPT4All``, Windows ``%LOCALAPPDATA%\\nomic.ai\\GPT4All``); the Python bindings use
    ``~/.cache/gpt4all``. Sources: nomic-ai/gpt4all gpt4all-bindings/python/docs/
    gpt4all_desktop/settings.md ("Download Path"), nomic-ai/gpt4all#3485 (settings and
    models folders per OS), gpt4all-chat/src/download.cpp (``settings.value("modelPath")``).
    """
    if dirs.platform == "darwin":
        ini = dirs.home / ".config" / "gpt4all.io" / "GPT4All.ini"
    else:
        ini = dirs.config / "nomic.ai" / "GPT4All.ini"
    roots = []
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read(ini, encoding="utf-8")
        custom = parser.get("General", "modelPath", fallback="").strip().strip('"')
    except (configparser.Error, UnicodeDecodeError):
        custom = ""
    if custom:
        roots.append(Path(custom).expanduser())
    roots += [dirs.local / "nomic.ai" / "GPT4All", dirs.home / ".cache" / "gpt4all"]
    return roots


def _jan_roots(dirs: _UserDirs, env: Mapping[str, str]) -> list[Path]:
    """Jan's data folder: ``$JAN_DATA_FOLDER``, the ``data_folder`` of its settings.json
    (in ``<data>/jan.ai.app/``, older ``<config>/Jan/``), else ``<data>/Jan/data`` where
    ``<data>`` is ``$JAN_DATA_ROOT`` or the OS data folder; older Linux builds used
    ``~/.config/Jan/data`` and the oldest ``~/jan``. Models are in ``llamacpp/models/<id>/``
    (older: ``models/``). Sources: https://jan.ai/docs/data-folder; janhq/jan
    src-tauri/src/core/app/{commands,paths,constants}.rs; extensions/llamacpp-extension
    (``migrateLegacyModels``: ``<data folder>/models`` -> ``llamacpp/models``).
    """
    data_root = _env_path(env, "JAN_DATA_ROOT") or dirs.data
    folders = [p for p in [_env_path(env, "JAN_DATA_FOLDER")] if p]
    for settings in (data_root / "jan.ai.app" / "settings.json", dirs.config / "Jan" / "settings.json",
                     data_root / "Jan" / "settings.json"):
        folder = read_json_object(settings).get("data_folder")
        if isinstance(folder, str) and folder.strip():
            folders.append(Path(folder).expanduser())
    folders += [data_root / "Jan" / "data", dirs.config / "Jan" / "data", dirs.home / "jan"]
    return [folder / sub for folder in folders for sub in (Path("llamacpp", "models"), Path("models"))]


def _unique(paths: Iterable[Path]) -> list[Path]:
    seen: set[str] = set()
    out = []
    for path in paths:
        key = os.path.normcase(os.path.abspath(path))
        if key not in seen:
            seen.add(key)
            out.append(path)
    return out


def _app_candidates(dirs: _UserDirs, env: Mapping[str, str]) -> Iterator[_Found]:
    for root in _unique(_lmstudio_roots(dirs)):
        yield from _folder_models(root, "lmstudio", 3, repo_levels=2)
    for root in _unique(_ollama_roots(dirs, env)):
        yield from _ollama_models(root)
    for root in _unique(_hf_roots(dirs, env)):
        yield from _hf_models(root)
    for root in _unique(_gpt4all_roots(dirs)):
        yield from _folder_models(root, "gpt4all", 1)
    for root in _unique(_jan_roots(dirs, env)):
        yield from _folder_models(root, "jan", 2)


def _user_candidates(paths: Iterable[str | os.PathLike[str]]) -> Iterator[_Found]:
    """Files as given (even missing ones, which then list with an error); folders walked."""
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            yield from _folder_models(path, "file", 2)
        else:
            yield _Found(path, "file")


# ---------------------------------------------------------------------------
# the library


def _real(path: Path) -> str:
    return os.path.normcase(os.path.realpath(path))


def discover_models(
    home: str | os.PathLike[str] | None = None,
    extra_paths: Iterable[str | os.PathLike[str]] = (),
    models_dir: str | os.PathLike[str] | None = None,
    recent: Iterable[str | os.PathLike[str]] = (),
    *,
    n_ctx: int = DEFAULT_N_CTX,
    env: Mapping[str, str] | None = None,
    platform: str | None = None,
    q8_weights: bool = True,
) -> list[ModelEntry]:
    """Every model Iris can offer, in this order: the bundled one (with ``models_dir``,
    listed even before it is assembled), downloaded ones (``models_dir/downloads``,
    source ``download``), other apps' GGUFs (LM Studio, Ollama, Hugging
    Face, GPT4All, Jan), other GGUFs in ``models_dir``, ``recent`` files, then
    ``extra_paths`` (files or folders). A file found twice (same real path) is listed
    once, under its first source, with ``recent`` set when it is also in ``recent``.

    ``home`` (default ``Path.home()``), ``env`` (default ``os.environ``) and
    ``platform`` (default ``sys.platform``) decide where the apps' folders are; the
    memory estimates are for ``n_ctx`` (0: each model's trained context). Reads
    headers only and never writes.
    """
    env = os.environ if env is None else env
    dirs = _user_dirs(Path(home) if home is not None else Path.home(), env, platform or sys.platform)
    recent = list(recent)
    recent_keys = {_real(Path(p).expanduser()) for p in recent}
    models = Path(models_dir) if models_dir is not None else None
    entries: list[ModelEntry] = []
    seen: set[str] = set()
    if models is not None:
        bundled = _bundled_entry(models, n_ctx, q8_weights)
        seen.add(_real(bundled.path))
        entries.append(replace(bundled, recent=_real(bundled.path) in recent_keys))
    from iris_desktop.runtime.hub.records import MAX_FOLDERS  # (hub imports this module)

    candidates = itertools.chain(
        # what Model ▸ Download… fetched: <models>/downloads/<org>/<repo>/<file> (runtime.hub),
        # <org>/<repo>/ and the folders of the file in its repository
        _folder_models(models / "downloads", "download", 2 + MAX_FOLDERS, repo_levels=2)
        if models is not None else (),
        _app_candidates(dirs, env),
        _folder_models(models, "file", 1) if models is not None else (),
        _user_candidates(recent),
        _user_candidates(extra_paths),
    )
    for found in candidates:
        key = _real(found.path)
        if key in seen:
            continue
        seen.add(key)
        entry, not_chat = _entry_from(found, n_ctx, q8_weights)
        if not_chat:
            log.debug("%s: skipped, %s", found.path, not_chat)
            continue
        entries.append(replace(entry, recent=key in recent_keys))
        if len(entries) >= MAX_MODELS:
            log.info("model library: stopped at %d models", MAX_MODELS)
            break
    return entries


# ---------------------------------------------------------------------------
# files opened before

#: how many opened files are remembered
MAX_RECENT = 20


def read_recent(record: str | os.PathLike[str]) -> list[str]:
    """The GGUF paths opened before, newest first ([] when the record is missing or
    unreadable: it is a convenience, never a reason to fail)."""
    try:
        data = json.loads(Path(record).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [p for p in data if isinstance(p, str)][:MAX_RECENT] if isinstance(data, list) else []


def remember_recent(record: str | os.PathLike[str], model_path: str | os.PathLike[str]) -> None:
    """Put ``model_path`` first in the record (a private file, replaced atomically)."""
    record = Path(record)
    entry = str(Path(model_path).expanduser())
    paths = [entry, *(p for p in read_recent(record) if p != entry)][:MAX_RECENT]
    make_private_dir(record.parent)
    atomic_write(record, json.dumps(paths, indent=1))

