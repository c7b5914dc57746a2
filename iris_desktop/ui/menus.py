"""The menu bar and what its items open: preferences, About, the app's folders."""

from __future__ import annotations

import html
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, QUrl
from PySide6.QtGui import QAction, QDesktopServices, QGuiApplication, QKeySequence
from PySide6.QtWidgets import QMessageBox

from iris_desktop import __version__
from iris_desktop.settings import SETTINGS
from iris_desktop.ui.settings_dialog import SettingsDialog

if TYPE_CHECKING:
    from iris_desktop.ui.main_window import MainWindow


class Menus(QObject):
    """Builds the menu bar; the actions call the window's controllers."""

    def __init__(self, window: MainWindow):
        super().__init__(window)
        self.window = window
        self.settings_dialog: SettingsDialog | None = None
        self.reload_box: QMessageBox | None = None
        self._build()

    def _action(self, menu, text: str, slot, shortcut=None, name: str | None = None) -> QAction:
        action = QAction(text, self.window)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.triggered.connect(slot)
        if name:
            action.setObjectName(name)
        menu.addAction(action)
        return action

    def _build(self) -> None:
        w = self.window
        threads, models = w.threads_control, w.models
        bar = w.menuBar()
        m = bar.addMenu("&File")
        self._action(m, "&New chat", threads.new_chat, "Ctrl+N", "new-chat")
        self._action(m, "&Import conversation…", threads.import_dialog, None, "import")
        self._action(m, "&Export chat…", threads.export_dialog, None, "export")
        self._action(m, "&Compact chat now", w.turns.compact_now, "Ctrl+Shift+K", "compact-now")
        m.addSeparator()
        self._action(m, "&Quit", w.close, "Ctrl+Q", "quit")
        m = bar.addMenu("&Edit")
        self._action(m, "&Copy", self.copy, QKeySequence.StandardKey.Copy, "copy")
        self._action(m, "&Find…", self.focus_search, "Ctrl+F", "find")
        m.addSeparator()
        pref = self._action(m, "&Preferences…", self.preferences, "Ctrl+,", "preferences")
        pref.setMenuRole(QAction.MenuRole.PreferencesRole)
        m = bar.addMenu("&View")
        toggle = w.inspector.toggleViewAction()
        toggle.setText("Context &inspector")
        toggle.setShortcut(QKeySequence("Ctrl+I"))
        m.addAction(toggle)
        m = bar.addMenu("&Model")
        self._action(m, "&Models…", models.open_library, "Ctrl+Shift+M", "models")
        self._action(m, "&Open GGUF…", models.choose_file, None, "load-model")
        self._action(m, "&Server…", models.open_server, None, "server")
        self._action(m, "&Reload", models.load, None, "reload-model")
        m = bar.addMenu("&Help")
        self._action(m, "&About Iris Desktop", self.about, None, "about")
        self._action(m, "Model &licenses", self.licenses, None, "licenses")
        paths = w.session.paths
        self._action(m, "Open &data folder", lambda: self.open_path(paths.data_dir))
        self._action(m, "Open &log", lambda: self.open_path(paths.log_path))

    # -- edit --

    def copy(self) -> None:
        focus = QGuiApplication.focusObject()
        view = self.window.view
        if focus is not None and focus is not view and hasattr(focus, "copy"):
            focus.copy()
            return
        entry = view.current_entry()
        if entry is not None:
            view.delegate.copy(entry)

    def focus_search(self) -> None:
        search = self.window.threads.search
        search.setFocus()
        search.selectAll()

    # -- preferences --

    def preferences(self) -> SettingsDialog:
        w = self.window
        dialog = SettingsDialog(w.session.settings, w.context.preview, w,
                                limits=w.context.limit_problems)
        dialog.applied.connect(self.settings_applied)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.settings_dialog = dialog
        dialog.open()
        return dialog

    def settings_applied(self, keys: list[str]) -> None:
        w = self.window
        w.reload_settings()
        w.context.rebuild()
        reload = [k for k in keys if SETTINGS[k].needs_reload]
        if reload and w.models.state != "none":
            box = QMessageBox(QMessageBox.Icon.Question, "Reload the model?",
                              "These changes need the model to be reloaded: "
                              + ", ".join(reload) + ".\nReload it now, in the background?",
                              QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, w)
            box.setObjectName("reload-confirm")
            box.finished.connect(
                lambda result: result == QMessageBox.StandardButton.Yes and w.models.load())
            self.reload_box = box
            box.open()

    # -- help --

    def about_text(self) -> str:
        try:
            import llama_cpp

            llama = llama_cpp.__version__
        except Exception as exc:  # the GUI still starts without llama.cpp
            llama = f"not available ({exc})"
        import PySide6
        from PySide6.QtCore import qVersion

        from iris_desktop.runtime.bundled import BUNDLED_MODEL
        from iris_desktop.runtime.embedder import EMBEDDING_MODEL

        models = self.window.models
        info = models.info
        model = (f"{info['name']} ({info['file']}, {info.get('file_type') or '?'}, n_ctx "
                 f"{info['n_ctx']:,}, chat format {info.get('chat_format') or '?'})"
                 + (", a base model" if info.get("base_model") else "")
                 if info else f"none ({models.error or 'not loaded'})")
        licenses = [f"{bundled.display_name} (bundled): {bundled.license} ({bundled.license_url})"
                    for bundled in (BUNDLED_MODEL, EMBEDDING_MODEL)]
        if info and info["file"] != BUNDLED_MODEL.file_name:
            licenses.insert(0, f"{info['name']} (in use): {info.get('license') or '?'}")
        return (f"<h3>Iris Desktop {__version__}</h3>"
                "<p>Offline, private chat with a local model and an honest context engine.</p>"
                f"<p>Iris {__version__}<br>llama.cpp (llama-cpp-python) {llama}<br>"
                f"Qt {qVersion()} (PySide6 {PySide6.__version__})<br>"
                f"Python {sys.version.split()[0]}<br>Model: {html.escape(model)}</p>"
                "<p>Model licenses:<br>" + "<br>".join(html.escape(x) for x in licenses) + "</p>"
                "<p>The full license texts ship with the app (Help ▸ Model licenses).</p>"
                f"<p>Data: {html.escape(str(self.window.session.paths.data_dir))}</p>")

    def about(self) -> None:
        box = QMessageBox(QMessageBox.Icon.Information, "About Iris Desktop", self.about_text(),
                          parent=self.window)
        box.setObjectName("about")
        box.open()

    def licenses(self) -> QMessageBox:
        """The bundled models' full license texts."""
        from iris_desktop.runtime.bundled import BUNDLED_MODEL
        from iris_desktop.runtime.embedder import EMBEDDING_MODEL

        parts = []
        for model in (BUNDLED_MODEL, EMBEDDING_MODEL):
            try:
                text = model.license_text()
            except OSError as exc:
                text = f"(the license file is missing: {exc}) See {model.license_url}"
            parts.append(f"{model.display_name} — {model.license}\n{model.source}\n\n{text}")
        box = QMessageBox(QMessageBox.Icon.Information, "Model licenses",
                          "The models that ship with Iris and their licenses.", parent=self.window)
        box.setObjectName("licenses")
        box.setDetailedText(("\n\n" + "=" * 60 + "\n\n").join(parts))
        box.open()
        return box

    @staticmethod
    def open_path(path: Path) -> None:
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(path)))
