"""What a server or a file says reaches the window as text, never as HTML.

Qt guesses whether a label's text is HTML (``Qt.AutoText``). Before, a server that
answered its model list with an HTML error page put a big green "Connected" and a
clickable "re-enter your API key" link to another site into the window's "The model
could not be loaded" box; a model named with tags was drawn in the status bar. Against
a real HTTP server on 127.0.0.1; real widgets under ``QT_QPA_PLATFORM=offscreen``.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QLabel, QMessageBox  # noqa: E402

from support.misbehaving_server import MisbehavingServer  # noqa: E402
from support.windows import make_window  # noqa: E402, F401 (a fixture)

PAGE = (b"<html><body><h1 style='color:green'>Connected: counts exact</h1>"
        b"<a href='https://evil.example/login'>Click to re-enter your API key</a></body></html>")


class _ErrorPage(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(500)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def error_page_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ErrorPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_a_servers_error_page_is_shown_as_text_and_the_box_offers_the_server_dialog(
        make_window, qtbot, error_page_server):  # noqa: F811
    window = make_window(None, {"model.backend": "openai", "model.base_url": error_page_server})
    assert window.model_state == "failed"
    qtbot.waitUntil(lambda: window.models.box is not None and window.models.box.isVisible(),
                    timeout=10_000)
    box = window.models.box
    informative = box.findChild(QLabel, "qt_msgbox_informativelabel")
    assert informative.textFormat() == Qt.TextFormat.PlainText
    assert "Click to re-enter your API key" in box.informativeText()  # said, as text
    assert [b.text() for b in box.buttons()
            if box.buttonRole(b) == QMessageBox.ButtonRole.AcceptRole] == ["Server…"]
    box.reject()


def test_a_model_named_with_tags_is_shown_as_text_in_the_status_bar(make_window, qtbot):  # noqa: F811
    name = "<font color=green size=6>local model (offline)"
    with MisbehavingServer("normal", model=name) as server:
        window = make_window(None, {"model.backend": "openai", "model.base_url": server.base_url,
                                    "model.name": name})
        assert window.model_state == "ready", window.app_state.model_error
        assert window.model_label.textFormat() == Qt.TextFormat.PlainText
        assert window.model_label.text().startswith(name)
        assert window.where_label.textFormat() == Qt.TextFormat.PlainText


def test_the_server_dialog_refuses_an_address_with_a_password_as_it_is_typed(qtbot):
    from PySide6.QtWidgets import QDialogButtonBox

    from iris_desktop.ui.server_dialog import ServerDialog

    dialog = ServerDialog()
    qtbot.addWidget(dialog)
    dialog.url.setText("http://alice:hunter2@127.0.0.1:8080/v1")
    ok = dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)
    assert not ok.isEnabled() and not dialog.test_button.isEnabled()
    assert "API key in Model ▸ Server…" in dialog.warning.text()
    assert "hunter2" not in dialog.warning.text()
    dialog.url.setText("http://127.0.0.1:8080/v1/a@b")  # an @ after the host is no user
    assert ok.isEnabled() and dialog.warning.text() == ""
    # a query string is refused as typed too (a key in it would be kept in config.toml)
    dialog.url.setText("http://127.0.0.1:8080/v1?token=a@b")
    assert not ok.isEnabled() and "query string" in dialog.warning.text()
    assert "token=" not in dialog.warning.text()


# -- text that draws in another order than stored ------------------------------------------

RLO, PDF, LRI, PDI = "\u202e", "\u202c", "\u2066", "\u2069"


def test_a_bidi_override_is_shown_as_an_escape_in_the_list_the_transcript_and_the_boxes(
        make_window, qtbot, data_dir):  # noqa: F811
    """Before, a chat titled ``invoice‮gpj.exe`` was listed, and asked about in the
    delete box, as "invoiceexe.jpg", and a reply's ``rm -rf ⁦…⁩`` drew its words in
    another order than the ones stored ("Trojan Source"); the CLI showed escapes. Now
    the window shows the explicit embeddings, overrides and isolates as escapes too,
    and keeps joiners and marks that are part of the writing (emoji, Hebrew)."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QInputDialog, QLineEdit

    from iris_desktop.core.store import Store
    from iris_desktop.paths import app_paths
    from iris_desktop.ui.threads import TITLE_ROLE

    title = f"invoice{RLO}gpj.exe"
    reply = f"Run `rm -rf {LRI}tmp/x{PDI}` then say 👩\u200d💻 \u200fשלום {RLO}olleh{PDF}"
    with Store(app_paths(data_dir).ensure().db_path) as store:
        thread = store.create_thread(title)
        store.add_messages(thread, [{"role": "user", "content": f"open {title}"},
                                    {"role": "assistant", "content": reply}])
    window = make_window()
    qtbot.waitUntil(lambda: window.threads.list.count() == 1, timeout=10_000)
    item = window.threads.list.item(0)
    assert item.text() == "invoice\\u202egpj.exe" and item.data(TITLE_ROLE) == title
    window.open_thread(thread)
    qtbot.waitUntil(lambda: len(window.view.transcript.entries()) == 2, timeout=10_000)
    view = window.view
    shown = [view.delegate._doc(e, 400).toPlainText() for e in view.transcript.entries()]
    assert shown[0] == "open invoice\\u202egpj.exe"
    assert "rm -rf \\u2066tmp/x\\u2069" in shown[1] and "\\u202eolleh\\u202c" in shown[1]
    assert "👩\u200d💻 \u200fשלום" in shown[1]  # the writing itself stays as it is
    assert not any(c in "".join(shown) for c in (RLO, PDF, LRI, PDI))
    # the delete box names the chat as listed; the rename field holds the title as stored
    window.threads.list.setCurrentItem(item)
    window.threads.list.setFocus()
    asked = []

    def answer() -> None:  # the real rename dialog, as a user meets it
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, QInputDialog):
            QTimer.singleShot(50, answer)
            return
        asked.append(dialog.findChild(QLineEdit).text())
        dialog.reject()

    QTimer.singleShot(50, answer)
    window.threads._on_current(window.threads.renameRequested)  # F2 on the chat
    qtbot.waitUntil(lambda: bool(asked), timeout=5_000)
    assert asked == [title]
    box = window.threads_control.delete_dialog(thread, title)
    assert "“invoice\\u202egpj.exe”" in box.text() and RLO not in box.text()
    box.reject()


def test_a_tool_card_and_a_summary_show_bidi_overrides_as_escapes(transcript_view, qtbot):
    from iris_desktop.core.views import Entry

    source = f"access = 'user{RLO} {LRI}// admin only{PDI}'"
    entries = [Entry("tool", "m:1", 1, "tool", 1, source, tool_name="read_file",
                     arguments=f'{{"path": "a{RLO}yp.sh"}}'),
               Entry("divider", "s:1", None, "", 1, "", title=f"Summary of {RLO}olleh",
                     fields=[("Facts", f"x{RLO}y")])]
    transcript_view.transcript.set_entries(entries)
    transcript_view.transcript.expanded.update({"m:1", "s:1"})
    delegate = transcript_view.delegate
    card = delegate._doc(entries[0], 400).toPlainText()
    assert "a\\u202eyp.sh" in card and "user\\u202e \\u2066// admin only\\u2069" in card
    assert RLO not in card and LRI not in card
    summary = delegate._doc(entries[1], 400).toPlainText()
    assert "x\\u202ey" in summary and RLO not in summary
    assert RLO not in delegate._divider_title(entries[1], transcript_view.rect())[0]
