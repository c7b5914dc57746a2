"""Simulated GPU failures beyond the first-use check (audit a12's "not there yet"): a GPU
that fails in the middle of a reply, a Reload planned against the memory the old model
still holds, the free memory Preferences and Models… read, and the welcome card's words.

There is no GPU here: :mod:`support.gpu` simulates one (the real bundled model loaded on
this CPU, a made-up device whose free memory is its total less what the open "GPU" models
hold). Everything but the device is real: the model, llama.cpp's errors as its log says
them, the SQLite history, the window."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest

from iris_desktop.cli import main
from iris_desktop.generation import GenerationRequest
from iris_desktop.runtime import llama_binding
from iris_desktop.runtime.errors import GpuFailed, ModelError
from iris_desktop.runtime.gpu import Device, GiB, GpuChecks, MiB, device_line
from iris_desktop.runtime.model import LocalModel
from iris_desktop.settings import load_settings

from support.gpu import SimulatedGpu, simulate_gpu
from support.windows import settle

#: 1.5 GiB: the whole bundled model at n_ctx 1,024 (731 MiB by the plan) fits with the
#: 512 MiB margin, but not beside a copy of itself (the 720 MiB an open one holds)
GPU = Device("Vulkan0", "Fake Arc", "gpu", "Vulkan", 1536 * MiB, 1536 * MiB, index=1, driver="Mesa 23.2")
HI = GenerationRequest([{"role": "user", "content": "Hi"}], max_tokens=16, temperature=0)
LOST = ("Fake Arc, the GPU it runs on, failed during the reply (the driver lost the device; llama_decode "
        "returned -3); Iris runs the model on the CPU until it restarts, and checks the GPU again then")
#: why the GPU is off for the rest of the run (the plan's reason, the status bar's notice)
OFF_FOR_THIS_RUN = ("Fake Arc is off for Iris: it failed during a reply (the driver lost the device; llama_decode "
                    "returned -3); it stays off until Iris restarts, which checks it again")


@pytest.fixture
def fake_gpu(monkeypatch) -> SimulatedGpu:
    return simulate_gpu(monkeypatch, GPU)


def _checked(data) -> None:
    """The first-use check already passed on this GPU and driver (it is not what is tested)."""
    GpuChecks(data / "gpu-checks.json").record(GPU, True, "the same top token at all 8 steps")


# -- a GPU that fails in the middle of a reply ----------------------------------------------------


def test_a_gpu_that_fails_mid_reply_is_switched_off_and_the_next_load_runs_on_the_cpu(model_path, tmp_path,
                                                                                       fake_gpu):
    """Before: "llama_decode returned -3", the GPU kept: every next reply failed the same
    way, at every start. Now: the reply's text so far came; the sentence names the GPU,
    llama.cpp's error and what Iris did; the GPU is recorded off; the next load is the CPU's."""
    record = tmp_path / "gpu-checks.json"
    _checked(tmp_path)
    model = LocalModel.load(model_path, n_ctx=1024, gpu="auto", gpu_checks=record)
    pieces = []
    try:
        assert model.gpu.describe() == "GPU: Fake Arc · 25/25 layers"
        fake_gpu.fail_after = 3  # the prompt and two tokens
        with pytest.raises(GpuFailed) as failed:
            for piece in model.stream(HI):
                pieces.append(piece)
        assert pieces and str(failed.value) == LOST and model.gpu_failed == LOST
    finally:
        model.close()
    entry = json.loads(record.read_text())["checks"]["Fake Arc|Mesa 23.2"]
    assert entry["agrees"] is False
    assert entry["detail"] == "it failed during a reply: the driver lost the device; llama_decode returned -3"
    fake_gpu.fail_after = None
    again = LocalModel.load(model_path, n_ctx=1024, gpu="auto", gpu_checks=record)
    try:
        assert again.gpu.describe() == "CPU" and again.gpu.notice
        assert again.gpu.reason == OFF_FOR_THIS_RUN
        assert "".join(again.stream(HI))
    finally:
        again.close()
    assert fake_gpu.loads[-1] == 0


def test_a_cpu_failure_and_a_stop_on_the_gpu_switch_nothing_off(model_path, tmp_path, fake_gpu):
    """Only llama.cpp's decode failing on a GPU plan counts: the same error on the CPU is
    said as it was ("llama_decode returned -3"), and a Stop (llama.cpp aborting the decode
    on purpose, "returned 2") is a stop."""
    record = tmp_path / "gpu-checks.json"
    _checked(tmp_path)
    cpu = LocalModel.load(model_path, n_ctx=1024, gpu="off", gpu_checks=record)
    try:
        fake_gpu.fail_after = 1
        with pytest.raises(RuntimeError) as failed:
            "".join(cpu.stream(HI))
        assert not isinstance(failed.value, GpuFailed) and str(failed.value) == "llama_decode returned -3"
        assert cpu.gpu_failed is None
    finally:
        cpu.close()
    fake_gpu.fail_after = None
    model = LocalModel.load(model_path, n_ctx=1024, gpu="auto", gpu_checks=record)
    try:
        stop = threading.Event()
        generation = model.stream(replace(HI, cancel=stop, progress=lambda done, total: stop.set()))
        assert "".join(generation) == "" and generation.stats.finish_reason == "cancelled"
        assert model.gpu_failed is None and "".join(model.stream(HI))  # still on the GPU
    finally:
        model.close()
    assert json.loads(record.read_text())["checks"]["Fake Arc|Mesa 23.2"]["agrees"] is True


def test_the_window_keeps_the_reply_says_why_and_reloads_the_model_on_the_cpu(make_window, qtbot, model_path,
                                                                              data_dir, fake_gpu):
    """Before: the window kept the GPU model, and every next reply failed the same way
    until the user found Model ▸ Reload and the next start. Now: the text so far stays
    (marked failed), the transcript says the sentence, and the model is loaded again on
    the CPU at once, said in the status bar."""
    data_dir.mkdir(parents=True)
    _checked(data_dir)
    window = make_window(None, overrides={"model.path": str(model_path), "model.n_ctx": "1024",
                                          "model.q8_weights": "false", "model.max_tokens": "16",
                                          "model.temperature": "0", "context.recall_semantic": "false"})
    assert window.models.info["device"] == "GPU: Fake Arc · 25/25 layers"
    fake_gpu.fail_after = 3
    window.turns.send("Hi")
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    qtbot.waitUntil(lambda: window.model_state == "ready" and window.models.info["device"] == "CPU",
                    timeout=60_000)
    settle(qtbot, window)
    shown = window.view.transcript.entries()
    reply = next(e for e in shown if e.role == "assistant")
    assert reply.status == "error" and reply.text
    assert any(e.kind == "notice" and e.text == f"The model failed: {LOST}" for e in shown)
    assert "Fake Arc is off for Iris: it failed during a reply" in window.models.info["device_notice"]
    assert fake_gpu.loads[-1] == 0 and not fake_gpu.open  # the GPU model was closed
    fake_gpu.fail_after = None
    window.turns.send("Hi again")  # the next reply runs, on the CPU
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    settle(qtbot, window)
    last = window.view.transcript.entries()[-1]
    assert last.role == "assistant" and last.status == "complete" and last.text


def test_chat_says_the_gpu_failed_and_the_next_run_checks_it_again(capsys, model_path, tmp_path, fake_gpu,
                                                                   monkeypatch):
    """Before: "iris-desktop: The model failed: llama_decode returned -3", and the next
    run failed the same way; then every later run used the CPU until the GPU's driver
    changed, for what may have been a one-off. Now: the sentence (the CPU until Iris
    restarts, the GPU checked again then); the next run checks the GPU against the CPU
    again and, as it agrees, runs on it, with no notice of a GPU off."""
    from iris_desktop.runtime import gpu_records as gpu

    data = tmp_path / "d"
    data.mkdir()
    _checked(data)
    args = ["--data-dir", str(data), "--set", f"model.path={model_path}", "--set", "model.n_ctx=1024",
            "--set", "model.q8_weights=false", "--set", "context.recall_semantic=false",
            "--set", "model.max_tokens=16"]
    fake_gpu.fail_after = 3
    code = main([*args, "chat", "Hi"])
    out, err = capsys.readouterr()
    assert code != 0 and out.strip() and "Traceback" not in err
    assert f"iris-desktop: The model failed: {LOST}\n" in err
    assert ("iris-desktop: the next run checks the GPU again first; 'iris-desktop chat --thread 1 "
            "--regenerate' asks") in err
    fake_gpu.fail_after = None
    monkeypatch.setattr(gpu, "THIS_RUN", "the next run", raising=False)  # another process
    loads = len(fake_gpu.loads)
    code = main([*args, "chat", "--thread", "1", "--regenerate"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip() and "off for Iris" not in err
    assert fake_gpu.loads[loads:] == [0, 25, 25]  # the first-use check (CPU, GPU), then the model


def test_chat_after_a_second_run_failing_in_use_says_the_gpu_stays_off(capsys, model_path, tmp_path,
                                                                      fake_gpu, monkeypatch):
    """The second run in a row whose GPU fails in use keeps it off until its driver
    changes: ``chat`` no longer says "the next run checks the GPU again first" then (it did,
    and the next run planned the CPU)."""
    from iris_desktop.runtime import gpu_records as gpu

    data = tmp_path / "d"
    data.mkdir()
    _checked(data)
    args = ["--data-dir", str(data), "--set", f"model.path={model_path}", "--set", "model.n_ctx=1024",
            "--set", "model.q8_weights=false", "--set", "context.recall_semantic=false",
            "--set", "model.max_tokens=16"]
    said = []
    for run in ("the first run", "the second run"):
        monkeypatch.setattr(gpu, "THIS_RUN", run, raising=False)  # another process each time
        fake_gpu.fail_after = 3
        code = main([*args, "chat", "Hi"])
        out, err = capsys.readouterr()
        assert code != 0 and out.strip() and "Traceback" not in err
        said.append(err)
    assert "the next run checks the GPU again first" in said[0]
    assert "the next run checks the GPU again first" not in said[1]
    assert "in 2 runs of Iris in a row; Iris runs the model on the CPU until the GPU's driver changes" in said[1]
    assert "'iris-desktop chat --thread 2 --regenerate' asks for the reply again" in said[1]
    fake_gpu.fail_after = None
    monkeypatch.setattr(gpu, "THIS_RUN", "the third run", raising=False)
    loads = len(fake_gpu.loads)
    code = main([*args, "chat", "--thread", "2", "--regenerate"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip()
    assert fake_gpu.loads[loads:] == [0]  # the CPU at once: no check, no GPU load


# -- a GPU that fails during a warm-up --------------------------------------------------------------

WARMING = ("Fake Arc, the GPU it runs on, failed during a warm-up (the driver lost the device; llama_decode "
           "returned -3); Iris runs the model on the CPU until it restarts, and checks the GPU again then")
WARM_UP_OFF = ("Fake Arc is off for Iris: it failed during a warm-up (the driver lost the device; llama_decode "
               "returned -3); it stays off until Iris restarts, which checks it again")
RELOADED = "The GPU failed during a warm-up, so Iris loaded the model again on the CPU"
GPU_OVERRIDES = {"model.n_ctx": "1024", "model.q8_weights": "false", "model.max_tokens": "8",
                 "model.temperature": "0", "context.recall_semantic": "false"}


def test_a_gpu_that_fails_during_a_warm_up_is_switched_off_as_in_a_reply(model_path, tmp_path, fake_gpu):
    """Before: a prefill's "llama_decode returned -3" was only logged (it is an
    optimisation), the GPU kept, and the next reply failed on it. Now: recorded off as a
    reply's failure is, said as a warm-up's; the next load is the CPU's."""
    record = tmp_path / "gpu-checks.json"
    _checked(tmp_path)
    model = LocalModel.load(model_path, n_ctx=1024, gpu="auto", gpu_checks=record)
    try:
        assert "".join(model.stream(HI))  # a reply's evaluations run
        fake_gpu.fail_warm_ups = True
        with pytest.raises(GpuFailed) as failed:
            model.prefill([{"role": "user", "content": "What is the capital of France?"}]).run()
        assert str(failed.value) == WARMING and model.gpu_failed == WARMING
    finally:
        model.close()
    entry = json.loads(record.read_text())["checks"]["Fake Arc|Mesa 23.2"]
    assert entry["agrees"] is False
    assert entry["detail"] == "it failed during a warm-up: the driver lost the device; llama_decode returned -3"
    again = LocalModel.load(model_path, n_ctx=1024, gpu="auto", gpu_checks=record)
    try:
        assert again.gpu.describe() == "CPU" and again.gpu.reason == WARM_UP_OFF
    finally:
        again.close()


def _loads_while_generating(window, monkeypatch) -> list[bool]:
    """Whether a turn was under way at each load the window started on its own."""
    seen: list[bool] = []
    load = window.models.load
    monkeypatch.setattr(window.models, "load", lambda: seen.append(window.generating) or load())
    return seen


def test_the_window_reloads_on_the_cpu_once_the_drafts_prefill_fails_on_the_gpu(
        make_window, qtbot, model_path, data_dir, fake_gpu, monkeypatch):
    """Before: the prefill while the user types failed on the GPU, was logged, and the
    window kept the GPU model: the reply sent next failed on it. Now: the model is loaded
    again on the CPU as soon as the prefill's failure is seen, said in the status bar; the
    draft is sent and answered on the CPU."""
    data_dir.mkdir(parents=True)
    _checked(data_dir)
    window = make_window(None, overrides={"model.path": str(model_path), **GPU_OVERRIDES})
    said: list[str] = []
    window.app_state.statusMessage.connect(lambda text, _ms: said.append(text))
    window.turns.send("Hi")  # a chat to type in, answered on the GPU
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    settle(qtbot, window)
    assert window.models.info["device"] == "GPU: Fake Arc · 25/25 layers"
    loads = _loads_while_generating(window, monkeypatch)
    fake_gpu.fail_warm_ups = True
    window.composer.set_text("What is the capital of France?")
    qtbot.waitUntil(lambda: window.model_state == "ready" and window.models.info["device"] == "CPU",
                    timeout=60_000)
    assert RELOADED in said and loads == [False]
    assert WARM_UP_OFF in window.models.info["device_notice"]
    assert fake_gpu.loads[-1] == 0 and not fake_gpu.open  # the GPU model was closed
    window.turns.send("What is the capital of France?")
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    settle(qtbot, window)
    replies = [e for e in window.view.transcript.entries() if e.role == "assistant"]
    assert [r.status for r in replies] == ["complete", "complete"] and replies[-1].text


def test_the_window_reloads_on_the_cpu_after_the_turn_whose_warm_up_failed(
        make_window, qtbot, model_path, data_dir, fake_gpu, monkeypatch):
    """The warm-up after a compaction runs once the reply is saved, still in the turn:
    its GPU failure (before: only logged) reloads the model on the CPU after the turn,
    never in its middle; the reply itself stays complete."""
    from iris_desktop.core.store import Store
    from iris_desktop.paths import app_paths

    from conftest import SYNTHETIC_CHAT

    data_dir.mkdir(parents=True)
    _checked(data_dir)
    with Store(app_paths(data_dir).ensure().db_path) as store:
        thread = store.create_thread("long")
        store.add_messages(thread, json.loads(SYNTHETIC_CHAT.read_text())["messages"][:60])
    window = make_window(None, overrides={"model.path": str(model_path), **GPU_OVERRIDES,
                                          "model.n_ctx": "2048", "model.max_tokens": "4",
                                          "context.summarizer": "extractive"})
    assert window.models.info["device"] == "GPU: Fake Arc · 25/25 layers"
    said: list[str] = []
    window.app_state.statusMessage.connect(lambda text, _ms: said.append(text))
    window.open_thread(thread)
    settle(qtbot, window)
    loads = _loads_while_generating(window, monkeypatch)
    fake_gpu.fail_warm_ups = True
    window.turns.send("What did we talk about?")
    qtbot.waitUntil(lambda: not window.generating, timeout=120_000)
    qtbot.waitUntil(lambda: window.model_state == "ready" and window.models.info["device"] == "CPU",
                    timeout=60_000)
    assert RELOADED in said and loads == [False]
    with Store(window.host.paths.db_path) as store:
        assert store.compaction_events(thread)  # the turn compacted, then warmed up
    settle(qtbot, window)
    reply = [e for e in window.view.transcript.entries() if e.role == "assistant"][-1]
    assert reply.status == "complete" and reply.text


# -- a Reload and the memory the old model holds ----------------------------------------------------


def _host(data, model_path, **more):
    from iris_desktop.host import Host

    return Host(data, {"model.path": str(model_path), "model.n_ctx": "1024", "model.q8_weights": "false",
                       "context.recall_semantic": "false", **more}, env={})


def test_a_reload_counts_the_gpu_memory_the_old_model_gives_back(model_path, tmp_path, fake_gpu):
    """Before: the reload's plan read the free memory while the old model still held its
    720 MB, so the model that fitted whole went to the CPU until the next start. Now: that
    memory is counted as free; the old model is closed before the new one loads (the plan
    needs it), and the new one runs whole on the GPU."""
    data = tmp_path / "d"
    data.mkdir()
    _checked(data)
    with _host(data, model_path) as host:
        first = host.load_model()
        assert first.gpu.describe() == "GPU: Fake Arc · 25/25 layers"
        second = host.load_model()  # Model ▸ Reload
        assert second.gpu.describe() == "GPU: Fake Arc · 25/25 layers"
        assert second.gpu.reason.endswith("counting the 720 MB the model in use gave back")
        assert first.closed and len(fake_gpu.open) == 1
        assert "".join(second.stream(HI))


def test_a_reload_that_fails_after_making_room_loads_the_old_model_again(model_path, tmp_path, fake_gpu):
    """The new model's load fails once the old one was closed for its memory: the old one
    is loaded again and answers (the error is still said); when it does not load either,
    one sentence says both, and that no model is loaded."""
    data = tmp_path / "d"
    data.mkdir()
    _checked(data)
    with _host(data, model_path) as host:
        old = host.load_model()
        fake_gpu.refused = {2048}
        with pytest.raises(ModelError, match="llama.cpp could not load the model"):
            host.load_model(host.settings.with_overrides({"model.n_ctx": "2048"}))
        again = host.runtime
        assert again is not None and again is not old and old.closed
        assert again.n_ctx == 1024 and again.gpu.describe() == "GPU: Fake Arc · 25/25 layers"
        assert "".join(again.stream(HI))
        fake_gpu.refused = {1024, 2048}
        with pytest.raises(ModelError) as failed:
            host.load_model(host.settings.with_overrides({"model.n_ctx": "2048"}))
        assert host.runtime is None
        said = str(failed.value)
        assert "it was closed to make room on Fake Arc for a model that did not load" in said
        assert said.endswith("no model is loaded; Model ▸ Reload tries again") and "\n" not in said


def test_the_window_reload_runs_the_model_whole_on_the_gpu(make_window, qtbot, model_path, data_dir, fake_gpu):
    """Model ▸ Reload in the window: the status bar's device after it (before: on the CPU,
    "the model does not fit on Fake Arc")."""
    data_dir.mkdir(parents=True)
    _checked(data_dir)
    window = make_window(None, overrides={"model.path": str(model_path), "model.n_ctx": "1024",
                                          "model.q8_weights": "false", "context.recall_semantic": "false"})
    assert window.models.info["device"] == "GPU: Fake Arc · 25/25 layers"
    loaded = window.models.info
    window.load_model()
    qtbot.waitUntil(lambda: window.model_state == "ready" and window.models.info is not loaded, timeout=60_000)
    assert window.models.info["device"] == "GPU: Fake Arc · 25/25 layers"
    assert len(fake_gpu.open) == 1


def test_the_window_goes_on_with_the_model_loaded_again_when_a_reload_fails(make_window, qtbot, model_path,
                                                                             data_dir, fake_gpu):
    """A reload that closed the model in use for its GPU memory, then failed: the window
    says so, and goes on with the model loaded again (its planner follows it: a send runs)."""
    from PySide6.QtWidgets import QMessageBox

    data_dir.mkdir(parents=True)
    _checked(data_dir)
    window = make_window(None, overrides={"model.path": str(model_path), "model.n_ctx": "1024",
                                          "model.q8_weights": "false", "model.max_tokens": "8",
                                          "context.recall_semantic": "false"})
    loaded = window.models.info
    fake_gpu.refused = {2048}
    window.app_state.set_settings(window.app_state.settings.with_overrides({"model.n_ctx": "2048"}))
    window.load_model()
    qtbot.waitUntil(lambda: window.model_state == "ready" and window.models.info is not loaded, timeout=60_000)
    box = window.findChild(QMessageBox, "model-error")
    assert box is not None and "could not be loaded again, so Iris goes on with" in box.text()
    assert "llama.cpp could not load the model" in box.informativeText()
    box.reject()
    assert window.models.info["device"] == "GPU: Fake Arc · 25/25 layers" and window.models.info["n_ctx"] == 1024
    window.turns.send("Hi")
    qtbot.waitUntil(lambda: not window.generating, timeout=60_000)
    settle(qtbot, window)
    last = window.view.transcript.entries()[-1]
    assert last.role == "assistant" and last.status == "complete" and last.text


# -- what Preferences and Models… read, and the welcome card --------------------------------------


def test_the_views_count_the_loaded_models_gpu_memory_as_free(model_path, tmp_path, fake_gpu):
    """Before: Preferences ▸ Model and Model ▸ Models… planned with the driver's free figure,
    which leaves out the loaded model's own buffers: "CPU only: does not fit" for the model
    that runs whole on the GPU. Now: counted back, and said."""
    from iris_desktop.ui import gpu_info

    settings = load_settings(None, {}, {"model.n_ctx": "1024"})
    model = LocalModel.load(model_path, n_ctx=1024, gpu="auto", devices=fake_gpu.devices())
    try:
        assert model.gpu.describe() == "GPU: Fake Arc · 25/25 layers"
        gpu_info.forget()
        found = gpu_info.cached_devices()
        arc = next(d for d in found if d.label == "Fake Arc")
        assert device_line(arc) == "Fake Arc (gpu, Vulkan): 1.5 GB free of 1.5 GB (with the loaded model's 720 MB)"
        assert gpu_info.fit_for(model_path, 1024, found, settings, {}) == "all 25 layers on GPU"
    finally:
        model.close()
        gpu_info.forget()
    # once it is closed, the driver's figure is the whole story again
    assert device_line(next(d for d in gpu_info.cached_devices() if d.label == "Fake Arc")) == \
        "Fake Arc (gpu, Vulkan): 1.5 GB free of 1.5 GB"
    gpu_info.forget()


def test_the_welcome_card_says_what_is_known_of_the_gpu_not_that_it_runs_fast():
    """Before: "it runs fast on your GPU (…, 8 GB free)", from the free memory alone. Now:
    that it fits there, and that its first use checks it."""
    from iris_desktop.runtime.recommend import Machine, recommend

    gpu = Device("Vulkan0", "NVIDIA GeForce RTX 4060", "gpu", "Vulkan", 8 * GiB, 8 * GiB, index=1)
    rec = recommend(Machine(16 * GiB, 4, gpu), 8192)
    assert rec.on_gpu and "fast" not in rec.why
    assert rec.why.endswith("it fits whole in the 8 GB free on your GPU (NVIDIA GeForce RTX 4060), where Iris "
                            "checks its answers against the CPU's at the first use.")


# -- a failure in use is for this run; a newer choice during a room-making load ------------------


def test_a_gpu_that_failed_mid_reply_is_off_for_this_run_and_checked_again_at_the_next(
        capsys, model_path, tmp_path, fake_gpu, monkeypatch):
    """Before: one failure in a reply (another app holding the GPU's memory once) switched
    the GPU off for good, "until its driver changes", and nothing could bring it back. Now:
    off for the rest of this run (a Reload plans the CPU, saying until when); `devices` says
    so; the first load of the next run checks the GPU again, and one that agrees runs there."""
    from iris_desktop.runtime import gpu_records as gpu

    record = tmp_path / "gpu-checks.json"
    _checked(tmp_path)
    model = LocalModel.load(model_path, n_ctx=1024, gpu="auto", gpu_checks=record)
    try:
        fake_gpu.fail_after = 3
        with pytest.raises(GpuFailed):
            "".join(model.stream(HI))
    finally:
        model.close()
    fake_gpu.fail_after = None
    same = LocalModel.load(model_path, n_ctx=1024, gpu="auto", gpu_checks=record)  # Reload, this run
    try:
        assert same.gpu.describe() == "CPU" and same.gpu.reason == OFF_FOR_THIS_RUN
    finally:
        same.close()
    assert main(["--data-dir", str(tmp_path), "--set", f"model.path={model_path}", "devices"]) == 0
    assert ("— it failed during a reply: the driver lost the device; llama_decode returned -3 (off for the run "
            "of Iris that saw it; the first load of a later run checks it against the CPU again)"
            in capsys.readouterr().out)
    monkeypatch.setattr(gpu, "THIS_RUN", "a later run", raising=False)  # Iris started again
    loads = len(fake_gpu.loads)
    later = LocalModel.load(model_path, n_ctx=1024, gpu="auto", gpu_checks=record)
    try:
        assert later.gpu.describe() == "GPU: Fake Arc · 25/25 layers"
        assert "".join(later.stream(HI))
    finally:
        later.close()
    assert fake_gpu.loads[loads:] == [0, 25, 25]  # the first-use check (CPU, GPU), then the model
    entry = json.loads(record.read_text())["checks"]["Fake Arc|Mesa 23.2"]
    assert entry["agrees"] is True and "run" not in entry


def _gate_loads_at(n_ctx: int, monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Loads at ``n_ctx`` wait for the returned ``gate``; ``entered`` is set when one does."""
    gate, entered = threading.Event(), threading.Event()
    inner = llama_binding.load_llama

    def gated(path, scratch, progress, cancel, device=None, **params):
        if params["n_ctx"] == n_ctx:
            entered.set()
            gate.wait(60)
        return inner(path, scratch, progress, cancel, device=device, **params)

    monkeypatch.setattr(llama_binding, "load_llama", gated)
    return gate, entered


@pytest.mark.parametrize("newer_loads", [True, False])
def test_a_newer_choice_during_a_load_that_closed_the_model_for_room(make_window, qtbot, model_path, data_dir,
                                                                     fake_gpu, monkeypatch, newer_loads):
    """A load that closed the model in use for its GPU memory is replaced by a newer choice
    while it runs: the model in use comes back (announced as loaded again). Before: that
    announcement ended the newer load in the window, saved the newer choice to config.toml
    before it had loaded, and the newer load's own result was then ignored: the window
    stayed "loading" for good. Now: the newer load goes on; its choice is saved once it has
    loaded, and never when it fails (the model loaded again goes on answering)."""
    data_dir.mkdir(parents=True)
    _checked(data_dir)
    window = make_window(None, overrides={"model.path": str(model_path), "model.n_ctx": "1024",
                                          "model.q8_weights": "false", "context.recall_semantic": "false"})
    assert window.models.info["device"] == "GPU: Fake Arc · 25/25 layers"
    config = window.models.paths.config_path
    gate, entered = _gate_loads_at(2048, monkeypatch)
    if not newer_loads:
        fake_gpu.refused = {1536}
    window.models._choose({"model.n_ctx": "2048"})  # needs the room: closes the model in use
    qtbot.waitUntil(entered.is_set, timeout=60_000)
    window.models._choose({"model.n_ctx": "1536"})  # the newer choice: the first is cancelled
    gate.set()
    qtbot.waitUntil(lambda: window.model_state != "loading", timeout=120_000)
    settle(qtbot, window)
    saved = config.read_text() if config.exists() else ""
    assert window.model_state == "ready" and window.composer._can_send
    if newer_loads:
        assert window.models.info["n_ctx"] == 1536 and "1536" in saved
    else:
        assert window.models.info["n_ctx"] == 1024 and "1536" not in saved and "2048" not in saved
        assert window.app_state.settings["model.n_ctx"] == 1024
    assert window.models.job is None and len(fake_gpu.open) == 1


def test_the_views_keep_their_figures_while_a_load_that_closed_the_model_runs(make_window, qtbot, model_path,
                                                                               data_dir, fake_gpu, monkeypatch,
                                                                               caplog):
    """Before: while a Reload that needed the GPU memory ran, the window's planner still
    counted with the model it had closed: every meter, states and inspector refresh failed
    "the model is closed", logged with a traceback, for the whole load. Now: they keep their
    figures quietly, and the new model's planner draws them once it has loaded."""
    import logging

    data_dir.mkdir(parents=True)
    _checked(data_dir)
    window = make_window(None, overrides={"model.path": str(model_path), "model.n_ctx": "1024",
                                          "model.q8_weights": "false", "context.recall_semantic": "false"})
    window.inspector.show()
    gate, entered = _gate_loads_at(2048, monkeypatch)
    window.app_state.set_settings(window.app_state.settings.with_overrides({"model.n_ctx": "2048"}))
    settle(qtbot, window)
    shown = window.meter.toolTip()
    window.load_model()
    qtbot.waitUntil(entered.is_set, timeout=60_000)
    assert window.app_state.planner.runtime.closed  # the room was made
    caplog.set_level(logging.INFO)
    asked = len(caplog.records)
    window.composer.set_text("How far is the Moon?")
    window.context.refresh()
    settle(qtbot, window)
    failed = [r for r in caplog.records[asked:] if r.exc_info or "job failed" in r.getMessage()]
    assert not failed, failed
    assert window.meter.toolTip() == shown  # kept
    gate.set()
    qtbot.waitUntil(lambda: window.model_state == "ready" and window.models.info["n_ctx"] == 2048,
                    timeout=120_000)
    settle(qtbot, window)
    assert not window.app_state.planner.runtime.closed and window.meter.toolTip() != shown
