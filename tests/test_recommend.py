"""A good model in one click, for this computer (issue #47 item 1): ``runtime.recommend``
with made-up machines, and the welcome panel's card with pytest-qt
(QT_QPA_PLATFORM=offscreen) against the loopback hub of ``tests/support/hub_server.py``: a fresh
start shows the recommendation and contacts nothing, one click downloads it and switches
to it, a failed download is one sentence and resumes."""

from __future__ import annotations

import hashlib
import threading

import pytest

from iris_desktop.runtime.gpu import Device
from iris_desktop.runtime.hub import RECOMMENDED, download_target, downloading
from iris_desktop.runtime.recommend import (
    PREFERENCE,
    Machine,
    recommend,
    speed_class,
    usable_gpu,
)
from iris_desktop.units import file_size, memory_size

GiB = 2**30
QWEN_15B = "Qwen/Qwen2.5-1.5B-Instruct-GGUF"
QWEN_7B = "bartowski/Qwen2.5-7B-Instruct-GGUF"
LLAMA_3B = "bartowski/Llama-3.2-3B-Instruct-GGUF"
LLAMA_3B_FILE = "Llama-3.2-3B-Instruct-Q4_K_M.gguf"

pytestmark = pytest.mark.usefixtures("no_proxy_no_keyring")


def gpu(free_gib: float, kind: str = "gpu", name: str = "NVIDIA GeForce RTX 4060") -> Device:
    return Device("CUDA0", name, kind, "CUDA", int(free_gib * GiB), 8 * GiB, index=1)


# -- the rule, on made-up machines ----------------------------------------------------------


def test_a_small_laptop_gets_a_small_step_up_at_a_usable_speed():
    rec = recommend(Machine(4 * GiB, 2), 8192)
    assert rec.model.repo == QWEN_15B and rec.speed == "usable" and not rec.on_gpu
    assert rec.button_text == "Download Qwen2.5 1.5B Instruct (1.1 GB)"
    assert rec.why == ("It fits in your 4 GB of memory with room for an 8,192-token window; on your "
                       "2 CPU cores it runs at a usable speed.")
    assert rec.memory_bytes <= 2 * GiB  # at most half the memory: headroom for the rest


def test_16_gb_takes_the_best_model_the_cores_run_well():
    rec = recommend(Machine(16 * GiB, 8), 8192)
    assert rec.model.repo == QWEN_7B and rec.speed == "usable"
    assert rec.button_text == "Download Qwen2.5 7B Instruct (4.7 GB)"
    assert rec.why.startswith("It fits in your 16 GB of memory with room for an 8,192-token window")
    # the same memory on two cores: the larger models would be slow, so a smaller one
    two = recommend(Machine(16 * GiB, 2), 8192)
    assert two.model.repo == QWEN_15B and two.speed == "usable"


def test_8_gb_leaves_out_the_7b_model_and_prefers_a_permissive_3b():
    rec = recommend(Machine(8 * GiB, 4), 8192)
    assert rec.model.repo == LLAMA_3B and rec.model.file == LLAMA_3B_FILE
    assert rec.button_text == "Download Llama 3.2 3B Instruct (2.0 GB)"
    assert rec.memory_bytes <= 4 * GiB


def test_a_gpu_with_8_gb_free_runs_the_7b_model_fast():
    rec = recommend(Machine(16 * GiB, 4, gpu(8)), 8192)
    assert rec.model.repo == QWEN_7B and rec.on_gpu and rec.speed == "fast"
    assert rec.why == ("It fits in your 16 GB of memory with room for an 8,192-token window; it fits "
                       "whole in the 8 GB free on your GPU (NVIDIA GeForce RTX 4060), where Iris checks "
                       "its answers against the CPU's at the first use.")
    # the same computer without the GPU: the CPU decides, and four cores are not enough for 7B
    assert recommend(Machine(16 * GiB, 4), 8192).model.repo != QWEN_7B


def test_a_gpu_too_small_for_the_whole_model_is_not_claimed():
    rec = recommend(Machine(8 * GiB, 4, gpu(2)), 8192)
    assert not rec.on_gpu and "GPU" not in rec.why
    assert rec.model.repo == recommend(Machine(8 * GiB, 4), 8192).model.repo


def test_too_little_memory_for_any_keeps_the_bundled_model_and_says_so():
    rec = recommend(Machine(2 * GiB, 4), 8192)
    assert rec.model is None and rec.button_text == "" and rec.file is None
    assert rec.why == ("Your 2 GB of memory leaves no room for a larger model (the smallest, Llama 3.2 1B "
                       "Instruct, needs 1 GB with an 8,192-token window: more than half of it), so keep "
                       "the bundled model.")


def test_when_every_model_that_fits_would_be_slow_the_bundled_one_stays():
    rec = recommend(Machine(3 * GiB, 1), 8192)
    assert rec.model is None
    assert "would be slow on your 1 CPU core" in rec.why and "bundled model" in rec.why


def test_unknown_memory_suggests_nothing():
    rec = recommend(Machine(None, 8), 8192)
    assert rec.model is None and "cannot tell how much memory" in rec.why


def test_n_ctx_0_judges_each_model_at_its_trained_context():
    rec = recommend(Machine(16 * GiB, 8), 0)
    assert rec.model is not None and rec.n_ctx == rec.model.context_length
    assert f"{rec.n_ctx:,}-token window" in rec.why


def test_the_speed_rule():
    assert speed_class(500_000_000, 2) == "fast"  # 0.25 GB a core
    assert speed_class(1_100_000_000, 2) == "usable"  # 0.55 GB a core
    assert speed_class(2_000_000_000, 2) == "slow"  # 1 GB a core
    assert speed_class(4_700_000_000, 16) == "usable"  # bandwidth: never fast over 3 GB on a CPU
    assert speed_class(4_700_000_000, 1, on_gpu=True) == "fast"


def test_the_gpu_is_the_one_model_gpu_auto_would_take():
    discrete, integrated = gpu(6), gpu(12, "igpu", "Intel Iris Xe")
    assert usable_gpu([integrated], platform="linux") is None
    assert usable_gpu([integrated], platform="darwin") is integrated
    assert usable_gpu([integrated, discrete], platform="darwin") is discrete
    assert usable_gpu([discrete], {discrete.label: "its answers differed"}, platform="linux") is None
    assert usable_gpu([gpu(0)], platform="linux") is None  # memory not reported


def test_every_recommended_model_is_ranked_and_memory_reads_as_sold():
    assert set(PREFERENCE) == {rec.repo for rec in RECOMMENDED}
    assert (memory_size(16 * GiB), memory_size(int(7.5 * GiB)), memory_size(4 * GiB)) == ("16 GB", "7.5 GB", "4 GB")
    assert (memory_size(572 * 2**20), memory_size(int(15.6 * GiB))) == ("572 MB", "16 GB")
    # a file's size counts as the download and the file manager do (10**6, 10**9)
    assert (file_size(491_400_000), file_size(2_100_000_000), file_size(12_345), file_size(99)) == (
        "491 MB", "2.10 GB", "12 kB", "99 bytes")


def test_this_computer_is_read_without_a_gpu_when_model_gpu_is_off(monkeypatch):
    import iris_desktop.runtime.devices as devices

    def no(*_a, **_k):
        raise AssertionError("model.gpu off lists no device")

    monkeypatch.setattr(devices, "list_devices", no)
    machine = Machine.this_computer("off")
    assert machine.gpu is None and machine.cores >= 1 and machine.memory_bytes > 0
    assert recommend(machine).why  # a sentence either way


# -- the welcome panel's card, against the loopback hub ------------------------------------

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402
from support.hub_server import HubServer, gguf_bytes  # noqa: E402

#: the fake computer of the card's tests: the pick is Llama 3.2 3B
LAPTOP = Machine(8 * GiB, 4)



@pytest.fixture
def laptop(monkeypatch):
    monkeypatch.setattr(Machine, "this_computer", classmethod(lambda cls, *a, **k: LAPTOP))
    return LAPTOP


@pytest.fixture
def server(tmp_path):
    with HubServer({LLAMA_3B: {LLAMA_3B_FILE: gguf_bytes(tmp_path, "Llama 3.2 3B Instruct", 256 * 1024)}}) as s:
        yield s



@pytest.fixture
def windows(make_window):
    """The window and its host; recall by meaning off even on the bundled model."""

    def make(overrides=None, runtime="scripted"):
        runtime = ScriptedRuntime(["Hello."] * 4) if runtime == "scripted" else runtime
        window = make_window(runtime, {"context.recall_semantic": "false", **(overrides or {})})
        return window, window.host

    return make


def test_a_fresh_start_shows_the_recommendation_and_contacts_nothing(qtbot, windows, server, connects):
    window, host = windows({"models.hub_url": server.url})  # this computer, as it is
    card, control = window.welcome.recommend, window.models.recommend
    qtbot.waitUntil(lambda: control.recommendation is not None, timeout=20_000)
    rec = control.recommendation
    assert window.welcome_control.showing and card.isVisible()
    assert "is small" in card.text.text() and "refuses or misreads personal requests" in card.text.text()
    assert rec.why in card.text.text()
    if rec.model is not None:
        assert card.button.isVisible() and card.button.text() == rec.button_text
        assert rec.model.title in card.text.text() and "127.0.0.1" in card.privacy.text()
    else:
        assert not card.button.isVisible() and "bundled model" in rec.why

    window.menus.actions["download-model"].trigger()  # Model ▸ Download… marks the same model
    dialog = window.models.downloads
    marked = [dialog.rows[r]["file"] for r in range(dialog.table.rowCount())
              if dialog.table.item(r, 6).text().endswith("Recommended for this computer")]
    assert marked == ([rec.model.file] if rec.model else [])
    qtbot.wait(200)
    assert connects == [] and server.requests == [], "a plain start contacts nothing"


def test_the_card_shows_only_while_the_bundled_model_is_in_use(qtbot, windows, server, laptop, tmp_path):
    other = tmp_path / "mine.gguf"
    other.write_bytes(b"GGUF")  # the scripted runtime answers: only the setting matters here
    window, _host = windows({"models.hub_url": server.url, "model.path": str(other)})
    control = window.models.recommend
    qtbot.waitUntil(lambda: control.recommendation is not None, timeout=20_000)
    assert not window.welcome.recommend.isVisible()
    assert control.recommended_file() == (LLAMA_3B, LLAMA_3B_FILE)  # Model ▸ Download… still marks it


def test_too_little_memory_shows_why_the_bundled_model_stays_and_no_button(qtbot, windows, server, monkeypatch):
    monkeypatch.setattr(Machine, "this_computer", classmethod(lambda cls, *a, **k: Machine(2 * GiB, 4)))
    window, _host = windows({"models.hub_url": server.url})
    card, control = window.welcome.recommend, window.models.recommend
    qtbot.waitUntil(lambda: control.recommendation is not None, timeout=20_000)
    assert card.isVisible() and not card.button.isVisible()
    assert "is small" in card.text.text() and "so keep the bundled model." in card.text.text()
    assert control.recommended_file() is None and server.requests == []


def test_one_click_downloads_the_model_and_switches_to_it(qtbot, windows, server, laptop):
    window, host = windows({"models.hub_url": server.url})
    card = window.welcome.recommend
    qtbot.waitUntil(lambda: card.button.isVisible(), timeout=20_000)
    assert card.button.text() == "Download Llama 3.2 3B Instruct (2.0 GB)"
    target = download_target(host.paths.models_dir, LLAMA_3B, LLAMA_3B_FILE)

    server.delay_s = 0.05  # about a second: the progress shows
    qtbot.mouseClick(card.button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: card.progress.isVisible() and " of " in card.progress_label.text(), timeout=10_000)
    assert card.stop_button.isVisible() and not card.button.isEnabled()
    assert host.settings["model.path"] == "bundled"  # the bundled model stays until the file is there
    qtbot.waitUntil(lambda: card.status.text().startswith("Iris now uses"), timeout=30_000)
    assert card.status.text() == "Iris now uses Llama 3.2 3B Instruct."
    assert hashlib.sha256(target.read_bytes()).hexdigest() == server.sha256(LLAMA_3B, LLAMA_3B_FILE)
    assert host.settings["model.path"] == str(target) and str(target) in host.paths.config_path.read_text()
    assert not card.button.isVisible() and card.isVisible()  # it says what happened until the user moves on
    assert [r["path"] for r in server.served("hub")][-1].endswith(f"/resolve/main/{LLAMA_3B_FILE}")


def test_a_failed_download_is_one_sentence_and_the_button_resumes_it(qtbot, windows, server, laptop,
                                                                      monkeypatch):
    monkeypatch.setattr(downloading, "RESUME_PAUSE_S", 0.0)
    window, host = windows({"models.hub_url": server.url})
    card = window.welcome.recommend
    qtbot.waitUntil(lambda: card.button.isVisible(), timeout=20_000)
    server.drop_every = 100_000  # the connection keeps dropping: the resumes run out
    qtbot.mouseClick(card.button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: card.button.isEnabled(), timeout=20_000)
    text = card.status.text()
    assert text.endswith("; what arrived is kept, and the button resumes it.") and ". " not in text  # one sentence
    assert card.button.text().startswith("Resume Llama 3.2 3B Instruct (")
    assert host.settings["model.path"] == "bundled" and window.model_state == "ready"
    target = download_target(host.paths.models_dir, LLAMA_3B, LLAMA_3B_FILE)
    done = target.with_name(target.name + ".partial").stat().st_size
    assert 0 < done < len(server.repos[LLAMA_3B][LLAMA_3B_FILE]) and not target.exists()

    server.drop_every = None  # the network is back: one click goes on from there
    qtbot.mouseClick(card.button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: card.status.text().startswith("Iris now uses"), timeout=30_000)
    assert any(r["range"] == f"bytes={done}-" for r in server.served("files"))
    assert host.settings["model.path"] == str(target)


def test_a_download_that_ends_during_a_reply_switches_when_the_reply_ends(qtbot, windows, server, laptop):
    reply = " ".join(f"word{i}" for i in range(40))
    window, host = windows({"models.hub_url": server.url}, runtime=ScriptedRuntime([reply], delay_s=0.05))
    card = window.welcome.recommend
    qtbot.waitUntil(lambda: card.button.isVisible(), timeout=20_000)
    server.gate = threading.Event()  # the file host waits: the download is under way
    qtbot.mouseClick(card.button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(server.served("files")) == 1, timeout=10_000)
    window.composer.set_text("Hi")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.generating, timeout=5_000)
    server.gate.set()
    qtbot.waitUntil(lambda: "when this reply ends" in card.status.text() or not window.generating, timeout=20_000)
    assert window.generating, "the download should end while the reply is written"
    assert host.settings["model.path"] == "bundled"  # never swapped under a reply
    qtbot.waitUntil(lambda: card.status.text().startswith("Iris now uses"), timeout=30_000)
    assert host.settings["model.path"] == str(download_target(host.paths.models_dir, LLAMA_3B, LLAMA_3B_FILE))


def test_the_switched_model_is_a_real_gguf_that_loads(qtbot, windows, tmp_path, laptop, model_path,
                                                      base_model_path):
    """No scripted runtime: the bundled model loads at start, the loopback hub serves
    gemma-3-270m as the recommended file, and one click makes llama.cpp load it."""
    pick = recommend(LAPTOP, 1024)  # at a 1,024-token window the laptop's pick is another model
    repo, file = pick.file
    with HubServer({repo: {file: base_model_path.read_bytes()}}) as served:
        # the bundled model's file under its own name: a fresh start, without assembling it again
        window, host = windows({"models.hub_url": served.url, "model.path": str(model_path),
                                "model.n_ctx": "1024", "model.q8_weights": "false", "model.gpu": "off"},
                               runtime=None)
        card = window.welcome.recommend
        qtbot.waitUntil(lambda: card.button.isVisible(), timeout=20_000)
        assert card.button.text() == pick.button_text
        qtbot.mouseClick(card.button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: card.status.text().startswith(("Iris now uses", pick.model.title)), timeout=120_000)
        assert card.status.text() == f"Iris now uses {pick.model.title}."
        target = download_target(host.paths.models_dir, repo, file)
        assert host.settings["model.path"] == str(target)
        assert window.app_state.model_info["path"] == str(target)
        assert window.app_state.model_info["architecture"] == "gemma3"  # llama.cpp loaded the served file
