"""Where the devices and model.gpu's plan are shown (issue #46 item 4): Preferences ▸ Model's
"Devices" block under model.gpu (and its "Check … again" button for a GPU that is off),
and Model ▸ Models…'s GPU column. The real dialogs, with
llama.cpp's device list replaced by made-up devices (this machine's llama.cpp is CPU-only,
which is the "no GPU" case as it is), and small GGUF headers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from iris_desktop.host import GPU_CHECKS_FILE
from iris_desktop.runtime import devices as runtime_devices
from iris_desktop.runtime.gguf import read_gguf_info
from iris_desktop.runtime.gpu import (
    NO_GPU,
    Device,
    GiB,
    GpuChecks,
    MiB,
    device_line,
    fit_text,
    memory_text,
    plan_model,
)
from iris_desktop.ui import gpu_info

from support.gguf_fixtures import tiny_metadata, write_gguf

CPU = Device("CPU", "Test CPU", "cpu", "CPU", 16 * GiB, 32 * GiB, index=0)


def gpu(free: int, total: int = 1 * GiB) -> Device:
    # 1 GiB in all: the plan keeps 512 MiB of it free, the rest is the budget
    return Device("Vulkan0", "Fake GeForce", "gpu", "Vulkan", free, total, index=1, driver="1.0")


def model_file(folder: Path, name: str = "tiny24", blocks: int = 24, embd: int = 64) -> Path:
    """A llama-shaped GGUF of ``blocks`` blocks (F32 zeros): about 50 KiB a block, its KV
    cache 128 bytes a token a block."""
    metadata = tiny_metadata(name)
    metadata.update({"llama.block_count": blocks, "llama.embedding_length": embd,
                     "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
                     "llama.feed_forward_length": embd * 2, "llama.context_length": 32768})
    tensors = [("token_embd.weight", (embd, 1000))]
    for i in range(blocks):
        tensors += [(f"blk.{i}.attn_q.weight", (embd, embd)), (f"blk.{i}.ffn_up.weight", (embd, embd * 2))]
    tensors += [("output.weight", (embd, 1000)), ("output_norm.weight", (embd,))]
    return write_gguf(folder / f"{name}.gguf", metadata, tensors)


@pytest.fixture
def fake_devices(monkeypatch):
    """Set ``fake_devices[:]`` to what llama.cpp "finds"; the cache starts empty."""
    found: list[Device] = [CPU]
    monkeypatch.setattr(runtime_devices, "list_devices", lambda: list(found))
    gpu_info.forget()
    yield found
    gpu_info.forget()


def open_preferences(window, qtbot):
    dialog = window.preferences()
    qtbot.waitUntil(lambda: dialog.last_preview is not None, timeout=5_000)
    qtbot.waitUntil(lambda: dialog.gpu.devices is not None, timeout=10_000)
    return dialog


def devices_text(dialog) -> str:
    return dialog.devices_label.text()


def test_memory_and_device_lines():
    assert memory_text(gpu(600 * MiB)) == "600 MB free of 1 GB"
    assert memory_text(Device("X", "X", "gpu")) == "memory not reported"
    assert device_line(gpu(3 * GiB, 8 * GiB)) == "Fake GeForce (gpu, Vulkan): 3 GB free of 8 GB"
    assert device_line(CPU) == "Test CPU (cpu): 16 GB free of 32 GB"


def test_preferences_model_says_plainly_that_there_is_no_gpu(make_window, qtbot, tmp_path, fake_devices):
    model = model_file(tmp_path)
    window = make_window(overrides={"model.path": str(model), "model.n_ctx": "2048"})
    dialog = open_preferences(window, qtbot)
    text = devices_text(dialog)
    assert "Test CPU (cpu): 16 GB free of 32 GB" in text
    assert NO_GPU == "No GPU found: the model runs on the CPU." and NO_GPU in text
    assert "Plan for tiny24.gguf at n_ctx 2,048, model.gpu auto:" in text
    # the block sits under model.gpu, on the Model page
    page = dialog.tabs.widget([dialog.tabs.tabText(i) for i in range(dialog.tabs.count())].index("Model"))
    assert page.isAncestorOf(dialog.devices_label)
    assert dialog.fields["model.gpu"].y() < dialog.devices_label.parentWidget().y()


def test_preferences_model_shows_a_full_and_a_partial_fit_as_n_ctx_changes(make_window, qtbot, tmp_path,
                                                                           fake_devices):
    model = model_file(tmp_path)
    device = gpu(512 * MiB + 60 * MiB)  # a budget of 60 MiB
    fake_devices[:] = [CPU, device]
    window = make_window(overrides={"model.path": str(model)})  # model.n_ctx editable
    dialog = open_preferences(window, qtbot)
    dialog.fields["model.n_ctx"].editor.spin.setValue(2048)
    text = devices_text(dialog)
    assert "Plan for tiny24.gguf at n_ctx 2,048, model.gpu auto:" in text
    assert "Fake GeForce (gpu, Vulkan): 572 MB free of 1 GB" in text
    assert "GPU: Fake GeForce · 25/25 layers: the whole model fits in the 572 MB free on Fake GeForce" in text
    assert NO_GPU not in text

    # a longer context: its KV cache no longer fits, the plan splits (the same planner's numbers)
    info = read_gguf_info(model)
    partial, _ = plan_model(info, 16384, [CPU, device], "auto")
    assert 0 < partial.layers < 25
    dialog.fields["model.n_ctx"].editor.spin.setValue(16384)
    text = devices_text(dialog)
    assert "Plan for tiny24.gguf at n_ctx 16,384, model.gpu auto:" in text
    assert f"GPU: Fake GeForce · {partial.layers}/25 layers: {partial.layers} of 25 layers fit" in text
    assert "the rest run on the CPU" in text

    # model.gpu off, then a layer count: the plan follows the dialog's values before Apply
    dialog.fields["model.gpu"].editor.set_value("off")
    assert "CPU: model.gpu is off: the CPU only" in devices_text(dialog)
    dialog.fields["model.gpu"].editor.set_value(3)
    assert "GPU: Fake GeForce · 3/25 layers: model.gpu asks for 3 layers" in devices_text(dialog)
    dialog.reject()


def test_preferences_model_with_a_gpu_too_small_for_one_layer(make_window, qtbot, tmp_path, fake_devices):
    fake_devices[:] = [CPU, gpu(520 * MiB)]  # 8 MiB over the margin: not even the output layer
    window = make_window(overrides={"model.path": str(model_file(tmp_path)), "model.n_ctx": "2048"})
    dialog = open_preferences(window, qtbot)
    assert "CPU: the model does not fit on Fake GeForce" in devices_text(dialog)
    dialog.reject()


def test_models_dialog_says_whether_each_model_fits_on_the_gpu(make_window, qtbot, tmp_path, fake_devices):
    small = model_file(tmp_path, "small", blocks=24)
    window = make_window(overrides={"model.path": str(small), "model.n_ctx": "16384"})
    column = 10  # the last: "GPU at n_ctx"

    def fits():
        dialog = window.models.open_library()
        qtbot.waitUntil(lambda: any(dialog.table.item(r, 0) and dialog.table.item(r, 0).toolTip() == str(small)
                                    for r in range(dialog.table.rowCount())), timeout=30_000)
        assert dialog.table.horizontalHeaderItem(column).text() == "GPU at n_ctx"
        rows = {dialog.table.item(r, 0).toolTip(): dialog.table.item(r, column).text()
                for r in range(dialog.table.rowCount())}
        dialog.reject()
        return rows[str(small)]

    assert fits() == "CPU only: no GPU"  # CPU-only llama.cpp, as on this machine
    gpu_info.forget()
    device = gpu(512 * MiB + 60 * MiB)
    fake_devices[:] = [CPU, device]
    partial, _ = plan_model(read_gguf_info(small), 16384, [CPU, device], "auto")
    assert 0 < partial.layers < 25 and fits() == f"{partial.layers}/25 layers on GPU"
    gpu_info.forget()
    fake_devices[:] = [CPU, gpu(8 * GiB, 8 * GiB)]
    assert fits() == "all 25 layers on GPU"
    gpu_info.forget()
    fake_devices[:] = [CPU, gpu(520 * MiB)]
    assert fits() == "CPU only: does not fit"


def test_fit_text_words(tmp_path):
    info = read_gguf_info(model_file(tmp_path))
    assert fit_text(None, [CPU]) == "–"  # an unreadable header
    assert fit_text(plan_model(info, 2048, [CPU, gpu(8 * GiB, 8 * GiB)], "off")[0],
                    [CPU, gpu(8 * GiB, 8 * GiB)]) == "CPU only: model.gpu off"
    assert fit_text(plan_model(info, 2048, [CPU], "auto")[0], [CPU]) == "CPU only: no GPU"


def test_the_views_plan_with_the_compute_buffer_a_load_measured(make_window, qtbot, tmp_path, fake_devices):
    """Where a load measured the compute buffer (gpu-compute.json beside gpu-checks.json),
    Preferences ▸ Model, Model ▸ Models… and the loader plan alike: here the estimate leaves
    no room for one layer, the measurement for all of them."""
    from iris_desktop.host import GPU_CHECKS_FILE
    from iris_desktop.runtime.gpu import MeasuredCompute, compute_key

    model = model_file(tmp_path)
    device = gpu(512 * MiB + 18 * MiB)
    fake_devices[:] = [CPU, device]
    window = make_window(overrides={"model.path": str(model), "model.n_ctx": "2048"})
    checks = window.host.paths.data_dir / GPU_CHECKS_FILE
    info = read_gguf_info(model)
    flash_attn = window.host.settings["model.flash_attn"]
    assert not plan_model(info, 2048, [CPU, device], "auto", flash_attn=flash_attn, gpu_checks=checks)[0].on_gpu
    MeasuredCompute.beside(checks).record(device, compute_key(info, 2048, flash_attn), 1 * MiB)
    plan, _ = plan_model(info, 2048, [CPU, device], "auto", flash_attn=flash_attn, gpu_checks=checks)
    assert plan.compute_measured and plan.layers == 25
    dialog = open_preferences(window, qtbot)
    assert "GPU: Fake GeForce · 25/25 layers: the whole model fits" in devices_text(dialog)
    dialog.reject()
    library = window.models.open_library()
    qtbot.waitUntil(lambda: any(library.table.item(r, 10) and library.table.item(r, 0).toolTip() == str(model)
                                for r in range(library.table.rowCount())), timeout=30_000)
    row = next(r for r in range(library.table.rowCount()) if library.table.item(r, 0).toolTip() == str(model))
    assert library.table.item(row, 10).text() == "all 25 layers on GPU"
    library.reject()


# -- Preferences ▸ Model's "Check … again" (the window's `devices --check-again`) --

OFF = ("it failed in use in 2 runs of Iris in a row, the last time during the reply "
       "(ErrorDeviceLost); it stays off until its driver changes")


def buttons(dialog):
    return {label: button for label, button in dialog.devices_box.buttons.items() if not button.isHidden()}


def test_a_gpu_that_is_off_can_be_checked_again_from_preferences(make_window, qtbot, tmp_path, data_dir,
                                                                 fake_devices):
    arc = gpu(4 * 1024**3, 8 * 1024**3)
    fake_devices[:] = [CPU, arc]
    data_dir.mkdir(parents=True)
    checks = GpuChecks(data_dir / GPU_CHECKS_FILE)
    checks.record(arc, False, "failed in use", reason=OFF, failed_runs=2)
    other = arc.__class__("Vulkan1", "Other GPU", "gpu", "Vulkan", 1, 1, index=2, driver="1.0")
    checks.record(other, True, "agreed with the CPU")
    window = make_window(overrides={"model.path": str(model_file(tmp_path)), "model.n_ctx": "2048"})
    dialog = open_preferences(window, qtbot)
    assert f"Fake GeForce is off for Iris: {OFF}" in dialog.devices_label.text()
    shown = buttons(dialog)
    assert list(shown) == ["Fake GeForce"] and shown["Fake GeForce"].text() == "Check Fake GeForce again"

    qtbot.mouseClick(shown["Fake GeForce"], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not buttons(dialog), timeout=10_000)  # its record gone, so is the button
    note = dialog.devices_box.note
    assert not note.isHidden() and note.text() == (
        "Forgot the first-use check of Fake GeForce: the next load of a model (Model ▸ Reload, or the "
        "next start) checks it against the CPU again, and uses it if it agrees.")
    assert "is off for Iris" not in dialog.devices_label.text()
    kept = json.loads((data_dir / GPU_CHECKS_FILE).read_text())["checks"]
    assert list(kept) == [GpuChecks.key(other)]  # the other GPU's record is kept as it was
    dialog.reject()


def test_a_record_that_cannot_be_written_is_said_and_nothing_changes(make_window, qtbot, tmp_path, data_dir,
                                                                     fake_devices):
    arc = gpu(4 * 1024**3, 8 * 1024**3)
    fake_devices[:] = [CPU, arc]
    data_dir.mkdir(parents=True)
    GpuChecks(data_dir / GPU_CHECKS_FILE).record(arc, False, "failed in use", reason=OFF, failed_runs=2)
    before = (data_dir / GPU_CHECKS_FILE).read_bytes()
    window = make_window(overrides={"model.path": str(model_file(tmp_path)), "model.n_ctx": "2048"})
    dialog = open_preferences(window, qtbot)
    button = buttons(dialog)["Fake GeForce"]
    (data_dir / GPU_CHECKS_FILE).write_bytes(b"{not json")  # damaged after the dialog read it
    button.click()
    note = dialog.devices_box.note
    qtbot.waitUntil(lambda: not note.isHidden(), timeout=10_000)
    assert note.text().startswith(f"Fake GeForce cannot be checked again: {data_dir / GPU_CHECKS_FILE} "
                                  "cannot be read or written (")
    assert note.text().endswith("); nothing was changed.")
    assert (data_dir / GPU_CHECKS_FILE).read_bytes() == b"{not json" and before
    assert button.isEnabled()
    dialog.reject()


def test_a_button_another_process_answered_already_says_so(make_window, qtbot, tmp_path, data_dir, fake_devices):
    """``devices --check-again`` ran while Preferences showed the button (an audit: the
    button still said "Forgot …", where the CLI says nothing is recorded)."""
    arc = gpu(4 * 1024**3, 8 * 1024**3)
    fake_devices[:] = [CPU, arc]
    data_dir.mkdir(parents=True)
    checks = GpuChecks(data_dir / GPU_CHECKS_FILE)
    checks.record(arc, False, "failed in use", reason=OFF, failed_runs=2)
    window = make_window(overrides={"model.path": str(model_file(tmp_path)), "model.n_ctx": "2048"})
    dialog = open_preferences(window, qtbot)
    button = buttons(dialog)["Fake GeForce"]
    assert checks.forget("Fake GeForce")  # what the command does in another process
    button.click()
    note = dialog.devices_box.note
    qtbot.waitUntil(lambda: not note.isHidden(), timeout=10_000)
    assert note.text() == ("No first-use check of Fake GeForce is recorded any more (another Iris process "
                           "forgot it): the next load of a model (Model ▸ Reload, or the next start) checks "
                           "it against the CPU again, and uses it if it agrees.")
    qtbot.waitUntil(lambda: not buttons(dialog), timeout=10_000)
    dialog.reject()
