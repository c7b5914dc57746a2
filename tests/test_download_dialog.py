"""Model ▸ Download… with pytest-qt (QT_QPA_PLATFORM=offscreen), against the loopback hub
of ``tests/support/hub_server.py``; and nothing contacted before the user asks: every socket
connect of the process is recorded while the app starts, chats and opens the dialog.
"""

from __future__ import annotations

import hashlib
import time

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QDialogButtonBox  # noqa: E402

from iris_desktop.host import Host  # noqa: E402
from iris_desktop.runtime.hub import RECOMMENDED, download_target  # noqa: E402
from iris_desktop.ui import hub_worker  # noqa: E402
from iris_desktop.ui.download_dialog import DownloadDialog  # noqa: E402
from iris_desktop.ui.main_window import main_window  # noqa: E402

from support.fakes import ScriptedRuntime  # noqa: E402
from support.hub_server import HubServer, gguf_bytes  # noqa: E402

QWEN = "Qwen/Qwen2.5-1.5B-Instruct-GGUF"
QWEN_FILE = "qwen2.5-1.5b-instruct-q4_k_m.gguf"


pytestmark = pytest.mark.usefixtures("no_proxy_no_keyring")


@pytest.fixture
def server(tmp_path):
    repos = {QWEN: {QWEN_FILE: gguf_bytes(tmp_path, "Qwen2.5 1.5B Instruct", 512 * 1024),
                    "qwen2.5-1.5b-instruct-q8_0.gguf": gguf_bytes(tmp_path, "Q8", 64 * 1024)},
             "Qwen/Qwen2.5-3B-Instruct-GGUF": {"qwen2.5-3b-instruct-q4_k_m.gguf": gguf_bytes(tmp_path, "3B", 4096)}}
    with HubServer(repos, downloads={QWEN: 10, "Qwen/Qwen2.5-3B-Instruct-GGUF": 5}) as s:
        yield s



def make_window(qtbot, tmp_path, overrides=None):
    host = Host(tmp_path / "data", {"context.recall_semantic": "false", **(overrides or {})},
                runtime=ScriptedRuntime(["Hello Dana, and hello Biscuit!"] * 4), compact=False)
    window = main_window(host)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.model_state == "ready", timeout=30_000)
    return window, host


def close(window, host):
    window.shutdown()
    host.close()


def test_a_plain_start_a_chat_and_the_dialog_contact_nothing(qtbot, tmp_path, server, connects, model_path,
                                                              capsys):
    window, host = make_window(qtbot, tmp_path, {"models.hub_url": server.url})
    try:
        window.composer.set_text("Hi! My name is Dana and my dog is called Biscuit.")
        qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: not window.generating, timeout=30_000)
        qtbot.waitUntil(lambda: window.background.idle, timeout=20_000)
        window.menus.actions["download-model"].trigger()  # Model ▸ Download…
        dialog = window.models.downloads
        assert dialog is not None and dialog.isVisible()
        assert dialog.table.rowCount() == len(RECOMMENDED)
        assert server.url.removeprefix("http://") in dialog.privacy.text()
        qtbot.wait(200)
        assert connects == [], "nothing is contacted before the user asks"
        assert server.requests == []

        dialog.search_edit.setText("qwen")
        qtbot.mouseClick(dialog.search_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: dialog.repos.count() == 3, timeout=10_000)
        assert {a for a in connects if isinstance(a, tuple) and a[0] != "lookup"} == {server.hub.server_address}
    finally:
        close(window, host)

    # a chat from the command line on the bundled model: no socket either
    from iris_desktop.cli import main

    connects.clear()
    code = main(["--data-dir", str(tmp_path / "cli"), "--set", "model.max_tokens=4",
                 "--set", "context.recall_semantic=false", "chat", "--model", str(model_path), "Hi"])
    assert code == 0, capsys.readouterr().err
    assert connects == []


def test_recommended_models_show_size_context_and_whether_they_fit(qtbot, tmp_path, server):
    dialog = DownloadDialog(server.url, tmp_path / "models", 8192)
    qtbot.addWidget(dialog)
    dialog.show()
    rows = [[dialog.table.item(r, c).text() for c in range(dialog.table.columnCount())]
            for r in range(dialog.table.rowCount())]
    qwen3b = next(row for row in rows if row[1] == "qwen2.5-3b-instruct-q4_k_m.gguf")
    assert qwen3b[2] == "Q4_K_M" and qwen3b[3].startswith("about 2.10 GB") and qwen3b[4] == "32,768"
    # memory as sold, like the fits column: 2.10 GB of weights + 302 MB of KV cache at 8,192
    # tokens is 2.41 × 10**9 bytes
    assert qwen3b[5] == "2.2 GB" and qwen3b[6].startswith("fits (")
    assert qwen3b[6].startswith(("fits", "too big"))
    assert server.requests == []

    qtbot.mouseClick(dialog.sizes_button, Qt.MouseButton.LeftButton)  # the user asks: the hub's sizes
    qtbot.waitUntil(lambda: not dialog.calls.busy, timeout=10_000)
    rows = [[dialog.table.item(r, c).text() for c in range(dialog.table.columnCount())]
            for r in range(dialog.table.rowCount())]
    qwen3b = next(row for row in rows if row[1] == "qwen2.5-3b-instruct-q4_k_m.gguf")
    served = len(server.repos["Qwen/Qwen2.5-3B-Instruct-GGUF"]["qwen2.5-3b-instruct-q4_k_m.gguf"])
    assert qwen3b[3] == f"{served / 1e3:,.0f} kB"  # the loopback hub's small file, exactly
    assert any("/tree/" in r["path"] for r in server.requests)


def test_download_stop_resume_and_use_this_model(qtbot, tmp_path, server):
    window, host = make_window(qtbot, tmp_path, {"models.hub_url": server.url})
    try:
        dialog = window.models.open_download()
        dialog.search_edit.setText("1.5b")
        qtbot.keyClick(dialog.search_edit, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: dialog.repos.count() == 2, timeout=10_000)
        dialog.repos.setCurrentRow(1)  # its files
        qtbot.waitUntil(lambda: dialog.table.rowCount() == 2, timeout=10_000)
        files = [dialog.table.item(r, 1).text() for r in range(2)]
        dialog.table.selectRow(files.index(QWEN_FILE))
        assert dialog.download_button.isEnabled() and dialog.download_button.text() == "Download"

        server.delay_s = 0.06  # ~2 MB in 64 KiB chunks: about two seconds
        qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: dialog.progress.value() > 0 and " of " in dialog.progress_label.text(),
                        timeout=10_000)
        assert dialog.stop_button.isVisible() and not dialog.download_button.isEnabled()
        qtbot.mouseClick(dialog.stop_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: dialog.cancel is None, timeout=10_000)
        assert dialog.status.text().startswith("Stopped at ")
        assert dialog.download_button.text() == "Resume" and dialog.download_button.isEnabled()
        assert dialog.discard_button.isVisible()  # or the user removes what arrived
        assert dialog.box is None  # a stop asks nothing: the partial stays for Resume
        target = download_target(host.paths.models_dir, QWEN, QWEN_FILE)
        partial = target.with_name(target.name + ".partial")
        done = partial.stat().st_size
        assert 0 < done < len(server.repos[QWEN][QWEN_FILE]) and not target.exists()

        server.delay_s = 0.0
        qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: dialog.use_button.isVisible(), timeout=20_000)
        assert server.served("files")[-1]["range"] == f"bytes={done}-"
        assert hashlib.sha256(target.read_bytes()).hexdigest() == server.sha256(QWEN, QWEN_FILE)
        assert dialog.status.text().startswith("Downloaded and verified")

        qtbot.mouseClick(dialog.use_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: window.models.job is None and window.models.pending is None, timeout=30_000)
        assert host.settings["model.path"] == str(target)
        assert str(target) in host.paths.config_path.read_text()
    finally:
        close(window, host)


def test_a_failed_download_asks_whether_to_keep_the_partial_file(qtbot, tmp_path, server):
    dialog = DownloadDialog(server.url, tmp_path / "models", 4096)
    qtbot.addWidget(dialog)
    dialog.show()
    row = next(r for r in range(dialog.table.rowCount()) if dialog.table.item(r, 1).text() == QWEN_FILE)
    dialog.table.selectRow(row)
    server.wrong_checksum = True
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.box is not None and dialog.box.isVisible(), timeout=20_000)
    assert "is not the file the hub lists" in dialog.status.text()
    box = dialog.box
    assert box.objectName() == "partial-question" and "It is not used" in box.informativeText()
    target = download_target(tmp_path / "models", QWEN, QWEN_FILE)
    assert not target.exists() and target.with_name(target.name + ".partial").exists()
    remove = next(b for b in box.buttons() if b.text() == "Remove it")
    qtbot.mouseClick(remove, Qt.MouseButton.LeftButton)
    assert not target.with_name(target.name + ".partial").exists()
    assert dialog.status.text().startswith("Removed the partial file")
    assert dialog.download_button.text() == "Download" and not dialog.discard_button.isVisible()


def test_remove_partial_after_stop(qtbot, tmp_path, server):
    dialog = DownloadDialog(server.url, tmp_path / "models", 4096)
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.table.selectRow(next(r for r in range(dialog.table.rowCount())
                                if dialog.table.item(r, 1).text() == QWEN_FILE))
    server.delay_s = 0.06
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.progress.value() > 0, timeout=10_000)
    qtbot.mouseClick(dialog.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.cancel is None, timeout=10_000)
    target = download_target(tmp_path / "models", QWEN, QWEN_FILE)
    assert target.with_name(target.name + ".partial").exists()
    qtbot.mouseClick(dialog.discard_button, Qt.MouseButton.LeftButton)
    assert not target.with_name(target.name + ".partial").exists()
    assert not target.with_name(target.name + ".partial.json").exists()
    assert dialog.download_button.text() == "Download" and not dialog.discard_button.isVisible()


def test_a_token_saved_from_the_dialog_opens_a_gated_repository(qtbot, tmp_path, server):
    server.gated, server.token = {QWEN}, "hf_from_the_dialog"
    dialog = DownloadDialog(server.url, tmp_path / "models", 4096)
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.search_edit.setText("1.5b")
    qtbot.mouseClick(dialog.search_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.repos.count() == 2, timeout=10_000)
    assert dialog.repos.item(1).text().endswith("(gated)")
    dialog.repos.setCurrentRow(1)
    qtbot.waitUntil(lambda: "save a token" in dialog.status.text(), timeout=10_000)

    qtbot.mouseClick(dialog.token_button, Qt.MouseButton.LeftButton)
    box = dialog.box
    assert box.objectName() == "hub-token" and "127.0.0.1" in box.labelText()
    box.setTextValue("hf_from_the_dialog")
    qtbot.mouseClick(box.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok),
                     Qt.MouseButton.LeftButton)
    assert dialog.status.text().startswith("Token saved in the keyring")
    dialog.repos.setCurrentRow(0)
    dialog.repos.setCurrentRow(1)
    qtbot.waitUntil(lambda: dialog.table.rowCount() == 2, timeout=10_000)
    assert server.served("hub")[-1]["authorization"] == "Bearer hf_from_the_dialog"


def test_closing_the_dialog_stops_the_download_and_keeps_what_arrived(qtbot, tmp_path, server):
    dialog = DownloadDialog(server.url, tmp_path / "models", 4096)
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.table.selectRow(next(r for r in range(dialog.table.rowCount())
                                if dialog.table.item(r, 1).text() == QWEN_FILE))
    server.delay_s = 0.06
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.progress.value() > 0, timeout=10_000)
    dialog.reject()  # Close (or Esc) while it downloads
    assert not dialog.isVisible() and not dialog.calls.thread.is_alive()
    target = download_target(tmp_path / "models", QWEN, QWEN_FILE)
    partial = target.with_name(target.name + ".partial")
    assert partial.exists() and 0 < partial.stat().st_size < len(server.repos[QWEN][QWEN_FILE])
    assert not target.exists()

    again = DownloadDialog(server.url, tmp_path / "models", 4096)  # opened again: Resume
    qtbot.addWidget(again)
    again.show()
    again.table.selectRow(next(r for r in range(again.table.rowCount())
                               if again.table.item(r, 1).text() == QWEN_FILE))
    assert again.download_button.text() == "Resume" and "downloaded before" in again.status.text()
    server.delay_s = 0.0
    qtbot.mouseClick(again.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: again.use_button.isVisible(), timeout=20_000)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == server.sha256(QWEN, QWEN_FILE)
    again.table.clearSelection()
    again.table.selectRow(next(r for r in range(again.table.rowCount())
                               if again.table.item(r, 1).text() == QWEN_FILE))
    assert again.status.text().startswith("Already downloaded and verified")
    assert again.use_button.isVisible() and not again.download_button.isEnabled()


def open_repo(qtbot, dialog, text="1.5b"):
    dialog.search_edit.setText(text)
    qtbot.mouseClick(dialog.search_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.repos.count() == 2, timeout=10_000)
    dialog.repos.setCurrentRow(1)
    qtbot.waitUntil(lambda: not dialog.calls.busy and dialog.table.rowCount() > 0, timeout=10_000)


def pick(dialog, file):
    dialog.table.clearSelection()
    dialog.table.selectRow(next(r for r, row in enumerate(dialog.rows) if row["file"] == file))


def test_stop_and_closing_end_a_stalled_download_at_once(qtbot, tmp_path, server, monkeypatch):
    """The file host stops sending mid-file and holds the connection: Stop ends the
    download within a moment as a Stop (it took 4 minutes and then asked about the
    partial file), the progress line says nothing arrives, and closing the dialog does
    not hold the window (it waited 5 s, and the download went on behind it)."""
    monkeypatch.setattr(hub_worker, "STALE_S", 0.5)
    server.stall_at, server.hold_s = [300_000], 60
    dialog = DownloadDialog(server.url, tmp_path / "models", 4096)
    qtbot.addWidget(dialog)
    dialog.show()
    pick(dialog, QWEN_FILE)
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: server.stalled.is_set(), timeout=10_000)
    qtbot.waitUntil(lambda: "nothing received for" in dialog.progress_label.text(), timeout=5_000)
    assert dialog.progress_label.text().startswith("300 kB of ")
    began = time.monotonic()
    qtbot.mouseClick(dialog.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.cancel is None, timeout=3_000)
    assert time.monotonic() - began < 1.5
    assert dialog.status.text().startswith("Stopped at ") and dialog.box is None
    assert dialog.download_button.text() == "Resume"

    server.stalled.clear()
    server.stall_at = [600_000]
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)  # Resume, then it stalls again
    target = download_target(tmp_path / "models", QWEN, QWEN_FILE)
    partial = target.with_name(target.name + ".partial")
    qtbot.waitUntil(lambda: server.stalled.is_set() and partial.stat().st_size == 600_000, timeout=10_000)
    began = time.monotonic()
    dialog.reject()
    assert time.monotonic() - began < 1.5 and not dialog.isVisible()
    qtbot.waitUntil(lambda: not dialog.calls.thread.is_alive(), timeout=2_000)
    assert partial.stat().st_size == 600_000 and not target.exists()


def test_two_files_of_one_name_in_two_folders_are_told_apart(qtbot, tmp_path, server):
    data = server.repos[QWEN]["qwen2.5-1.5b-instruct-q8_0.gguf"]
    server.repos[QWEN].update({"a/model-q4_k_m.gguf": data, "b/model-q4_k_m.gguf": data[:-1] + b"\1"})
    dialog = DownloadDialog(server.url, tmp_path / "models", 4096)
    qtbot.addWidget(dialog)
    dialog.show()
    open_repo(qtbot, dialog)
    pick(dialog, "a/model-q4_k_m.gguf")
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.use_button.isVisible(), timeout=20_000)
    assert dialog.path.parent.name == "a"

    pick(dialog, "b/model-q4_k_m.gguf")  # the same name in another folder: not downloaded yet
    assert not dialog.status.text().startswith("Already downloaded")
    assert dialog.download_button.isEnabled() and not dialog.use_button.isVisible()
    pick(dialog, "a/model-q4_k_m.gguf")
    assert dialog.status.text().startswith("Already downloaded and verified")


def test_the_hubs_names_are_shown_as_text_and_unsafe_ones_are_not_listed(qtbot, tmp_path, server):
    """A file list's names with tags, a bidi override, ``..`` or an absolute path: the
    labels are plain text, and a name that cannot be a path here is not listed (selecting
    one raised a traceback out of a Qt callback, and Download did nothing)."""
    server.extra_entries = [
        {"type": "file", "path": '<h1 style="color:red">BIG</h1><a href="https://evil.example/">x</a>-q4_k_m.gguf',
         "size": 1000},
        {"type": "file", "path": "model-\u202efgg.exe-q4_k_m.gguf", "size": 1000},
        {"type": "file", "path": "../../../../etc/evil.gguf", "size": 1000},
        {"type": "file", "path": "/abs/evil.gguf", "size": 1000},
        {"type": "file", "path": "R&D <b model-q4_k_m.gguf", "size": 1000},
        {"type": "file", "path": "R&D model-q4_k_m.gguf", "size": 1000},
    ]
    dialog = DownloadDialog(server.url, tmp_path / "models", 4096)
    qtbot.addWidget(dialog)
    dialog.show()
    open_repo(qtbot, dialog)
    assert dialog.status.textFormat() == Qt.TextFormat.PlainText
    assert dialog.progress_label.textFormat() == Qt.TextFormat.PlainText
    assert sorted(row["file"] for row in dialog.rows) == sorted([QWEN_FILE, "qwen2.5-1.5b-instruct-q8_0.gguf",
                                                                 "R&D model-q4_k_m.gguf"])
    said = dialog.status.text()
    assert "5 more are not listed: their names cannot be kept as files here" in said, said
    assert "\u202e" not in said
    pick(dialog, "R&D model-q4_k_m.gguf")
    assert dialog.status.text().endswith("(no sha256 listed: checked by its size and GGUF header only)")

    # a row whose name cannot be a path (were one to get there) says so, and Download stays off
    dialog._fill([{"repo": QWEN, "file": "../x\u202e.gguf", "size": 1, "cells": ["../x\u202e.gguf"] * 8,
                   "tip": QWEN, "about": "../x\u202e.gguf"}])
    dialog.table.selectRow(0)
    assert "is not a file name in a repository" in dialog.status.text() and "\u202e" not in dialog.status.text()
    assert "\\u202e" in dialog.table.item(0, 1).text() and not dialog.download_button.isEnabled()


def test_a_repository_whose_every_gguf_name_is_unsafe_says_so_in_one_sentence(tmp_path):
    """A review: "org/repo holds no GGUF file. 2 more are not listed: …" contradicted
    itself."""
    from iris_desktop.runtime.hub.client import HubFile
    from iris_desktop.ui.hub_worker import file_rows

    files = [HubFile("org/repo", path, 1000, "main") for path in ("../evil.gguf", "/abs/x.gguf")]
    rows, said = file_rows("org/repo", files, None, tmp_path)
    assert rows == [] and said.startswith("None of the 2 GGUF file(s) in org/repo can be listed: "
                                          "their names cannot be kept as files here (")
