"""The model library: real (tiny, valid) GGUF files placed where LM Studio, Ollama, the
Hugging Face cache, GPT4All and Jan keep theirs, under a temporary home."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from iris_desktop.files import read_json_object
from iris_desktop.runtime import library
from iris_desktop.runtime.bundled import BUNDLED_MODEL, ensure_bundled_model
from iris_desktop.runtime.gguf import per_layer, read_gguf_info
from iris_desktop.runtime.library import (
    ModelEntry,
    describe_model,
    discover_models,
    is_base_model,
    kv_cache_bytes,
    parameter_count,
)

from support.gguf_fixtures import hf_model, ollama_model, tiny_metadata, tiny_model, write_gguf

MIB = 1024 * 1024
REQUIRED_KEYS = {"path", "name", "source", "architecture", "parameters", "quantization", "size_bytes",
                 "context_length", "chat_template", "memory_estimate_bytes"}



def info_of(tmp: Path, metadata: dict, tensors=(("token_embd.weight", (64, 16)),)):
    return read_gguf_info(write_gguf(tmp / "m.gguf", metadata, tensors))


@pytest.fixture
def home(tmp_path) -> Path:
    home = tmp_path / "home"
    tiny_model(home / ".lmstudio/models/acme/tiny-chat-GGUF/tiny-chat-Q8_0.gguf", "LM Tiny")
    tiny_model(home / ".cache/lm-studio/models/old/legacy-GGUF/legacy.Q8_0.gguf", "LM Legacy")
    ollama_model(home / ".ollama/models", ("registry.ollama.ai", "library", "tiny", "3b"),
                 tiny_metadata("Ollama Tiny"))
    hf_model(home / ".cache/huggingface/hub", "org/tiny-GGUF", "tiny-Q8_0.gguf", revisions=("rev1", "rev2"))
    tiny_model(home / ".local/share/nomic.ai/GPT4All/gpt4all-tiny.Q4_0.gguf", "GPT4All Tiny", file_type=2)
    tiny_model(home / ".local/share/Jan/data/llamacpp/models/tiny-jan/model.gguf", None)
    tiny_model(home / "jan/models/old-jan/old-jan.gguf", "Jan Old")
    return home


def by_source(entries: list[ModelEntry]) -> dict[str, list[ModelEntry]]:
    out: dict[str, list[ModelEntry]] = {}
    for entry in entries:
        out.setdefault(entry.source, []).append(entry)
    return out


def discover(home: Path, **kw) -> list[ModelEntry]:
    kw.setdefault("env", {})
    kw.setdefault("platform", "linux")
    return discover_models(home, **kw)


# -- discovery ------------------------------------------------------------------------


def test_lists_the_models_of_every_app_with_their_metadata(home):
    found = by_source(discover(home))
    assert [e.name for e in found["lmstudio"]] == ["LM Tiny", "LM Legacy"]
    assert [e.repo for e in found["lmstudio"]] == ["acme/tiny-chat-GGUF", "old/legacy-GGUF"]
    [ollama] = found["ollama"]
    assert (ollama.name, ollama.ollama_name) == ("tiny:3b", "tiny:3b")
    assert ollama.path.name.startswith("sha256-")
    [hf] = found["huggingface"]  # two snapshots, one blob: listed once
    assert (hf.name, hf.repo) == ("HF Tiny", "org/tiny-GGUF")
    [gpt4all] = found["gpt4all"]
    assert (gpt4all.name, gpt4all.quantization) == ("GPT4All Tiny", "Q4_0")
    assert [e.name for e in found["jan"]] == ["tiny-jan", "Jan Old"]  # Jan's model.gguf: its folder's name
    for entry in found["lmstudio"] + found["ollama"] + found["huggingface"] + found["gpt4all"] + found["jan"]:
        assert entry.error is None
        assert (entry.architecture, entry.context_length, entry.chat_template) == ("llama", 4096, True)
        assert entry.parameters == 64 * 16
        assert entry.size_bytes == entry.path.stat().st_size
        assert entry.base_model is False
        assert REQUIRED_KEYS <= set(entry.as_json())
        json.dumps(entry.as_json())


def test_a_file_that_is_not_a_gguf_is_listed_with_an_error_and_the_others_still_list(home):
    notes = home / ".lmstudio/models/acme/notes/notes.gguf"
    notes.parent.mkdir(parents=True)
    notes.write_text("these are my notes, not a model\n")
    entries = discover(home)
    [broken] = [e for e in entries if e.path == notes]
    assert broken.source == "lmstudio"
    assert broken.error == "not a GGUF file (a model file starts with 'GGUF'; this one with 'thes')"
    assert broken.architecture is None and broken.memory_estimate_bytes is None
    assert broken.size_bytes == notes.stat().st_size
    assert len([e for e in entries if e.error is None]) == 7


def test_valid_ggufs_that_are_not_chat_models_are_skipped(home):
    folder = home / ".lmstudio/models/acme/tiny-chat-GGUF"
    tiny_model(folder / "mmproj-tiny-f16.gguf")
    write_gguf(folder / "adapter.gguf", tiny_metadata(**{"general.type": "adapter"}))
    write_gguf(folder / "embed.gguf", tiny_metadata(arch="bert", template=None, **{"bert.pooling_type": 1}))
    tiny_model(home / ".local/share/nomic.ai/GPT4All/incomplete-big.gguf")
    names = {e.path.name for e in discover(home)}
    assert not names & {"mmproj-tiny-f16.gguf", "adapter.gguf", "embed.gguf", "incomplete-big.gguf"}
    assert describe_model(folder / "embed.gguf").error == "not a chat model: an embedding model"


def test_a_split_model_is_listed_once_with_all_its_parts(home):
    folder = home / ".lmstudio/models/acme/big-GGUF"
    first = write_gguf(folder / "big-Q8_0-00001-of-00002.gguf", tiny_metadata("Big"))
    second = write_gguf(folder / "big-Q8_0-00002-of-00002.gguf", tiny_metadata("Big"),
                        tensors=(("output.weight", (64, 32)),))
    [big] = [e for e in discover(home) if e.name == "Big"]
    assert (big.path, big.split_count) == (first, 2)
    assert big.size_bytes == first.stat().st_size + second.stat().st_size
    assert big.parameters == 64 * 16 + 64 * 32
    second.unlink()
    [big] = [e for e in discover(home) if e.path == first]
    assert big.error.startswith("part 2 of 2 (big-Q8_0-00002-of-00002.gguf): file not found")


def test_the_same_file_is_listed_once_under_its_first_source(home, tmp_path):
    lm = home / ".lmstudio/models/acme/tiny-chat-GGUF/tiny-chat-Q8_0.gguf"
    link = tmp_path / "elsewhere.gguf"
    link.symlink_to(lm)
    entries = discover(home, recent=[link], extra_paths=[lm.parent])
    [entry] = [e for e in entries if e.name == "LM Tiny"]
    assert (entry.source, entry.recent) == ("lmstudio", True)


def test_recent_files_and_extra_folders(home, tmp_path):
    mine = tiny_model(tmp_path / "downloads/mine.gguf", "Mine")
    extra = tiny_model(tmp_path / "shelf/sub/shelf.gguf", "Shelf")
    gone = tmp_path / "gone.gguf"
    entries = {e.path: e for e in discover(home, recent=[mine, gone], extra_paths=[tmp_path / "shelf"])}
    assert (entries[mine].source, entries[mine].recent) == ("file", True)
    assert (entries[extra].source, entries[extra].recent) == ("file", False)
    assert entries[gone].error == "file not found"


def test_a_download_kept_in_a_folder_of_its_repository_is_listed(tmp_path, monkeypatch):
    """Downloads keep their repository's folders (two files of one name in two folders
    overwrote each other): the library finds them there too."""
    monkeypatch.setattr(library, "_bundled_entry", lambda models, n_ctx, q8=True: ModelEntry(
        path=models / "bundled.gguf", name="bundled", source="bundled"))
    models = tmp_path / "models"
    nested = tiny_model(models / "downloads/Org/Repo-GGUF/q4/a/model.gguf", "Nested")
    top = tiny_model(models / "downloads/Org/Repo-GGUF/model.gguf", "Top")
    found = {e.path: e for e in discover(tmp_path / "home", models_dir=models)}
    assert found[nested].source == found[top].source == "download"
    assert found[nested].repo == "Org/Repo-GGUF"


def test_walks_are_bounded(tmp_path, monkeypatch):
    home = tmp_path / "home"
    tiny_model(home / ".lmstudio/models/a/b/c/d/too-deep.gguf")
    assert discover(home) == []
    for i in range(30):
        tiny_model(home / f".lmstudio/models/pub/repo{i:02d}/m{i:02d}.gguf", f"M{i:02d}")
    assert len(discover(home)) == 30
    monkeypatch.setattr(library, "MAX_ENTRIES_PER_ROOT", 40)
    assert 0 < len(discover(home)) < 30


def test_an_ollama_manifest_never_points_outside_the_blobs_folder(tmp_path):
    home = tmp_path / "home"
    secret = tiny_model(tmp_path / "secret.gguf")
    manifest = home / ".ollama/models/manifests/registry.ollama.ai/library/evil/latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                                "digest": f"sha256:../../../../{secret.name}"}]}))
    assert discover(home) == []


# -- where the apps' folders are: overrides and other OSes ----------------------------


def test_the_apps_own_overrides_are_honoured(tmp_path):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    ollama_model(elsewhere / "ollama", ("registry.ollama.ai", "someone", "tool", "latest"), tiny_metadata("O"))
    hf_model(elsewhere / "hf-cache", "org/env-GGUF", "env.gguf")
    hf_model(elsewhere / "hf-home" / "hub", "org/home-GGUF", "home.gguf")
    tiny_model(elsewhere / "xdg-data/nomic.ai/GPT4All/xdg.gguf", "GPT4All XDG")
    tiny_model(elsewhere / "jan-data/llamacpp/models/j/model.gguf", "Jan Env")
    (home / ".lmstudio-home-pointer").parent.mkdir(parents=True)
    (home / ".lmstudio-home-pointer").write_text(f"{elsewhere / 'lms-home'}\n")
    tiny_model(elsewhere / "lms-home/models/p/r/pointed.gguf", "LM Pointed")
    (elsewhere / "lms-home/settings.json").write_text(json.dumps({"downloadsFolder": str(elsewhere / "lms-dl")}))
    tiny_model(elsewhere / "lms-dl/p/r/downloaded.gguf", "LM Downloaded")
    ini = home / ".config/nomic.ai/GPT4All.ini"
    ini.parent.mkdir(parents=True)
    ini.write_text(f"[General]\nmodelPath={elsewhere / 'g4a-custom'}\n")
    tiny_model(elsewhere / "g4a-custom/custom.gguf", "GPT4All Custom")
    env = {"OLLAMA_MODELS": str(elsewhere / "ollama"), "HF_HUB_CACHE": str(elsewhere / "hf-cache"),
           "HF_HOME": str(elsewhere / "hf-home"), "XDG_DATA_HOME": str(elsewhere / "xdg-data"),
           "JAN_DATA_FOLDER": str(elsewhere / "jan-data")}
    names = {(e.source, e.name) for e in discover(home, env=env)}
    assert names == {("ollama", "someone/tool:latest"), ("huggingface", "HF Tiny"),
                     ("gpt4all", "GPT4All XDG"), ("gpt4all", "GPT4All Custom"), ("jan", "Jan Env"),
                     ("lmstudio", "LM Pointed"), ("lmstudio", "LM Downloaded")}
    assert {e.repo for e in discover(home, env=env) if e.source == "huggingface"} == {"org/env-GGUF",
                                                                                       "org/home-GGUF"}


def test_macos_folders(tmp_path):
    home = tmp_path / "home"
    support = home / "Library/Application Support"
    tiny_model(support / "nomic.ai/GPT4All/mac.gguf", "GPT4All Mac")
    tiny_model(support / "Jan/data/llamacpp/models/m/model.gguf", "Jan Mac")
    tiny_model(home / ".lmstudio/models/p/r/lm.gguf", "LM Mac")
    names = {(e.source, e.name) for e in discover(home, platform="darwin")}
    assert names == {("gpt4all", "GPT4All Mac"), ("jan", "Jan Mac"), ("lmstudio", "LM Mac")}


def test_windows_folders(tmp_path):
    home = tmp_path / "home"
    tiny_model(home / "AppData/Local/nomic.ai/GPT4All/win.gguf", "GPT4All Win")
    tiny_model(home / "AppData/Roaming/Jan/data/llamacpp/models/w/model.gguf", "Jan Win")
    roaming = tmp_path / "Roaming"
    (roaming / "jan.ai.app").mkdir(parents=True)
    (roaming / "jan.ai.app/settings.json").write_text(json.dumps({"data_folder": str(tmp_path / "D/jan")}))
    tiny_model(tmp_path / "D/jan/llamacpp/models/moved/model.gguf", "Jan Moved")
    assert {(e.source, e.name) for e in discover(home, platform="win32")} == {
        ("gpt4all", "GPT4All Win"), ("jan", "Jan Win")}
    assert {(e.source, e.name) for e in discover(home, platform="win32", env={"APPDATA": str(roaming)})} == {
        ("gpt4all", "GPT4All Win"), ("jan", "Jan Moved")}


# -- what the header says -------------------------------------------------------------


def test_the_memory_estimate_is_weights_plus_kv_cache(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", tiny_metadata(), tensors=(("token_embd.weight", (256, 16)),
                                                                      ("blk.0.attn_q.weight", (64, 64))))
    entry = describe_model(path, n_ctx=1024)
    weights = (256 * 16 + 64 * 64) * 4  # F32 tensor data
    kv = 4 * 2 * (32 + 32) * 2 * 1024  # layers × KV heads × (K + V head size) × f16 × n_ctx
    assert (entry.kv_cache_bytes, entry.memory_estimate_bytes) == (kv, weights + kv) == (1 * MIB, 1 * MIB + 32768)
    assert describe_model(path, n_ctx=0).n_ctx == 4096  # 0: the trained context


def test_kv_cache_uses_key_and_value_lengths_and_per_layer_head_counts(tmp_path):
    info = info_of(tmp_path, tiny_metadata(**{"llama.attention.key_length": 48,
                                               "llama.attention.value_length": 16}))
    assert kv_cache_bytes(info, 100) == 4 * 2 * (48 + 16) * 2 * 100
    hybrid = info_of(tmp_path, tiny_metadata(**{"llama.attention.head_count_kv": [2, 0, 2, 0]}))
    assert kv_cache_bytes(hybrid, 100) == 2 * 2 * (32 + 32) * 2 * 100  # recurrent layers hold no KV
    no_geometry = info_of(tmp_path, {"general.architecture": "odd"})
    assert kv_cache_bytes(no_geometry, 100) is None


def test_a_per_layer_hyperparameter_is_one_int_for_all_or_one_per_layer():
    # one reading of GGUF's per-layer values for the library's estimate and the GPU plan
    assert per_layer(8, 3) == [8, 8, 8]
    assert per_layer([2, 0, 2], 3) == [2, 0, 2]
    assert per_layer([2, 0], 3) is None  # another length
    assert per_layer(True, 3) is None and per_layer([1, "2", 3], 3) is None and per_layer(None, 3) is None


def test_a_settings_file_that_only_helps_is_read_as_an_object_or_nothing(tmp_path):
    # one lenient read for the other apps' settings here and the hub's download records
    path = tmp_path / "settings.json"
    assert read_json_object(path) == {}  # missing
    for text, expected in (('{"downloadsFolder": "/m"}', {"downloadsFolder": "/m"}), ("[1]", {}),
                           ("{not json", {}), ("", {})):
        path.write_text(text, encoding="utf-8")
        assert read_json_object(path) == expected
    path.write_bytes(b'{"a": "\xff"}')  # not UTF-8
    assert read_json_object(path) == {}
    assert read_json_object(tmp_path) == {}  # a folder


def test_parameter_count(tmp_path):
    embd, out = ("token_embd.weight", (64, 16)), ("output.weight", (64, 16))
    assert parameter_count([info_of(tmp_path, tiny_metadata(), (embd, out))]) == 2048
    stated = tiny_metadata(**{"general.parameter_count": 7_000})
    assert parameter_count([info_of(tmp_path, stated, (embd,))]) == 7_000
    # an output matrix shaped like the embeddings is a tied copy only if the size label says so
    tied = tiny_metadata(**{"general.size_label": "1K"})
    assert parameter_count([info_of(tmp_path, tied, (embd, out))]) == 1024
    untied = tiny_metadata(**{"general.size_label": "2K"})
    assert parameter_count([info_of(tmp_path, untied, (embd, out))]) == 2048


@pytest.mark.parametrize(("metadata", "file_name", "base"), [
    ({}, "", False),
    ({"tokenizer.chat_template": None}, "", True),  # no template: base
    ({"general.finetune": "Instruct-AWQ"}, "", False),
    ({"general.finetune": "it"}, "", False),
    ({"general.finetune": "base"}, "", True),
    ({"general.finetune": None, "general.name": "Mistral 7B Base"}, "", True),
    ({"general.finetune": None, "general.name": "Gemma 3 1b"}, "gemma-3-1b-pt-Q8_0.gguf", True),
    ({"general.finetune": None, "general.name": "Tiny"}, "tiny-Q8_0.gguf", False),  # no evidence
    ({"general.finetune": None, "general.name": "Base Chat 7B"}, "", False),  # says both: not base
])
def test_base_model_heuristic(tmp_path, metadata, file_name, base):
    md = tiny_metadata()
    for key, value in metadata.items():
        if value is None:
            md.pop(key, None)
        else:
            md[key] = value
    assert is_base_model(info_of(tmp_path, md), file_name) is base


# -- the bundled model ----------------------------------------------------------------


def test_the_bundled_model_is_listed_before_it_is_assembled(tmp_path):
    [entry] = discover(tmp_path / "home", models_dir=tmp_path / "models")
    assert (entry.source, entry.assembled, entry.verified, entry.error) == ("bundled", False, False, None)
    assert entry.path == tmp_path / "models" / BUNDLED_MODEL.file_name
    assert (entry.architecture, entry.quantization, entry.context_length) == ("qwen2", "Q4_K_M", 32768)
    assert entry.kv_cache_bytes == 96 * MIB
    assert not (tmp_path / "models").exists()  # listing never writes


MODEL_CACHE = Path(os.environ.get("IRIS_TEST_MODEL_CACHE", Path.home() / ".cache" / "iris-desktop-tests"))


@pytest.fixture(scope="module")
def qwen_models_dir() -> Path:
    """The real bundled model, written once per machine (sha256-checked) and shared."""
    return ensure_bundled_model(MODEL_CACHE / "models").parent


def test_the_real_bundled_qwen_from_its_header(qwen_models_dir, tmp_path):
    entry = discover(tmp_path / "home", models_dir=qwen_models_dir)[0]
    info = read_gguf_info(entry.path)
    assert (entry.source, entry.verified, entry.assembled) == ("bundled", True, True)
    assert (entry.architecture, entry.quantization, entry.context_length) == ("qwen2", "Q4_K_M", 32768)
    assert entry.parameters == 494_032_768  # ~494M, as published (the file also holds a tied copy)
    assert entry.chat_template is True and entry.base_model is False
    # 24 layers × 2 KV heads × (64 + 64) head size × 2 bytes (f16) × 8192 tokens = 96 MiB
    assert entry.kv_cache_bytes == 24 * 2 * (64 + 64) * 2 * 8192 == 96 * MIB
    # as loaded: its Q5_0 weights from the 8-bit copy (model.q8_weights, on), 22 → 34
    # bytes a block of 32
    q5 = sum(t.nbytes for t in info.tensors if t.ggml_type == 6)
    assert entry.memory_estimate_bytes == (BUNDLED_MODEL.size - info.header_size + q5 // 22 * 12
                                           + 96 * MIB)


def test_a_model_trained_for_less_than_the_default_n_ctx_loads_at_its_own(tmp_path, monkeypatch):
    """Before (an audit): Models… offered a model trained for 4,096 tokens, then refused
    it ("model.n_ctx: 8,192 tokens is more than the model was trained for") until n_ctx
    was lowered by hand. Nobody chose 8,192 for it: it loads at its own 4,096. An n_ctx
    the user did choose is still refused in one sentence."""
    from iris_desktop.host import load_runtime
    from iris_desktop.paths import app_paths
    from iris_desktop.runtime.model import LocalModel
    from iris_desktop.settings import SettingsError, load_settings

    old = tiny_model(tmp_path / "old-4k.gguf")  # trained for 4,096
    asked = []

    class Asked(Exception):
        pass

    def load(cls, path, **kw):  # what llama.cpp would be asked for; no model is made
        asked.append(kw["n_ctx"])
        raise Asked

    monkeypatch.setattr(LocalModel, "load", classmethod(load))
    paths = app_paths(tmp_path / "data").ensure()
    default = load_settings(paths.config_path, {}, {"model.path": str(old)})
    assert default.source("model.n_ctx") == "default" and default["model.n_ctx"] == 8192
    with pytest.raises(Asked):
        load_runtime(default, paths)
    assert asked == [4096]
    chosen = load_settings(paths.config_path, {}, {"model.path": str(old), "model.n_ctx": "8192"})
    with pytest.raises(SettingsError, match="more than the model was trained for"):
        load_runtime(chosen, paths)


def test_the_memory_estimate_counts_the_8_bit_copy_the_model_is_loaded_from(model_path):
    """An audit: the bundled model's estimate ("~559 MB at n_ctx 8,192") counted its
    weights as stored in the file, while ``model.q8_weights`` (on) loads them from an
    8-bit copy 146 MB larger. The estimate counts the copy when it is on."""
    from iris_desktop.runtime.weights import expected_size

    info = read_gguf_info(model_path)
    with_copy = library.describe_model(model_path, n_ctx=8192)
    as_stored = library.describe_model(model_path, n_ctx=8192, q8_weights=False)
    grown = with_copy.memory_estimate_bytes - as_stored.memory_estimate_bytes
    copy_larger = expected_size(info) - model_path.stat().st_size
    assert copy_larger > 100_000_000  # the bundled model has Q5_0 weights
    assert abs(grown - copy_larger) < 1 << 20  # the headers differ by a few bytes only
