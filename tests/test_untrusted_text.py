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
    dialog.url.setText("http://127.0.0.1:8080/v1?token=a@b")  # an @ after the host is no user
    assert ok.isEnabled() and dialog.warning.text() == ""
