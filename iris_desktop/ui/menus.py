"""The menu bar and what its items open: preferences, About, the app's folders.

The items that belong to another controller (New chat, Models…, Reload, …) are only
built here, as ``actions`` by name; the window connects them to the controllers."""

from __future__ import annotations

import html
import sys
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QSize, Qt, QUrl
from PySide6.QtGui import QAction, QDesktopServices, QFontMetrics, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QLineEdit,
    QMenuBar,
    QMessageBox,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from iris_desktop import __version__
from iris_desktop.paths import AppPaths
from iris_desktop.settings import SETTINGS, Settings
from iris_desktop.ui.app_state import AppState
from iris_desktop.ui.config_watch import ConfigWatch
from iris_desktop.ui.inspector import InspectorDock
from iris_desktop.ui.settings_dialog import SettingsDialog
from iris_desktop.ui.shortcuts import ShortcutsDialog
from iris_desktop.ui.transcript import TranscriptView


class Menus(QObject):
    """Builds the menu bar; ``actions`` (by object name) are the items the window
    connects to the other controllers. ``preview`` and ``limits`` serve the settings
    dialog (``ContextControl.preview``, ``.limit_problems``)."""

    def __init__(self, app_state: AppState, bar: QMenuBar, paths: AppPaths,
                 view: TranscriptView, search: QLineEdit, inspector: InspectorDock,
                 preview: Callable[[Settings, Callable], None],
                 limits: Callable[[Settings], dict[str, str]], parent: QWidget):
        super().__init__(parent)
        self.app_state = app_state
        self.paths = paths
        self.view = view
        self.search = search
        self.inspector = inspector
        self.preview = preview
        self.limits = limits
        self.parent_widget = parent  # the actions' owner; dialogs open over it
        self.actions: dict[str, QAction] = {}
        self.settings_dialog: SettingsDialog | None = None
        self.reload_box: QMessageBox | None = None
        self.shortcuts_dialog: ShortcutsDialog | None = None
        self.path_box: QMessageBox | None = None
        self.bar = bar
        self._build(bar)
        # `config set` in a terminal, an editor: the window follows the settings file
        self.config_watch = ConfigWatch(app_state, paths.config_path, self,
                                        describe=self.file_followed)

    def _action(self, menu, text: str, slot=None, shortcut=None, name: str | None = None) -> QAction:
        action = QAction(text, self.parent_widget)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        if slot is not None:
            action.triggered.connect(slot)
        if name:
            action.setObjectName(name)
            self.actions[name] = action
        menu.addAction(action)
        return action

    def _build(self, bar: QMenuBar) -> None:
        m = bar.addMenu("&File")
        self._action(m, "&New chat", None, "Ctrl+N", "new-chat")
        self._action(m, "&Import conversation…", None, None, "import")
        # an unzipped ChatGPT or Claude export, Jan's threads (ThreadControl.import_folder_dialog)
        self._action(m, "Import &folder…", None, None, "import-folder")
        self._action(m, "&Export chat…", None, None, "export")
        self._action(m, "&Compact chat now", None, "Ctrl+Shift+K", "compact-now")
        self._action(m, "Chat &settings…", None, None, "chat-settings")
        self._action(m, "&Rename chat…", None, None, "rename-chat")
        self._action(m, "&Delete chat…", None, None, "delete-chat")
        m.addSeparator()
        # disabled on a plain history, its tip then says how to encrypt it (ui.rekey_dialog)
        self._action(m, "Change history &passphrase…", None, None, "change-key")
        m.setToolTipsVisible(True)  # (only items with a tip of their own show one)
        m.addSeparator()
        self._action(m, "&Quit", None, "Ctrl+Q", "quit")
        m = bar.addMenu("&Edit")
        self._action(m, "&Copy", self.copy, QKeySequence.StandardKey.Copy, "copy")
        self._action(m, "&Find…", self.focus_search, "Ctrl+F", "find")
        m.addSeparator()
        pref = self._action(m, "&Preferences…", self.preferences, "Ctrl+,", "preferences")
        pref.setMenuRole(QAction.MenuRole.PreferencesRole)
        m = bar.addMenu("&View")
        toggle = self.inspector.toggleViewAction()
        toggle.setText("Context &inspector")
        toggle.setShortcut(QKeySequence("Ctrl+I"))
        m.addAction(toggle)
        m = bar.addMenu("&Model")
        self._action(m, "&Models…", None, "Ctrl+Shift+M", "models")
        self._action(m, "&Download…", None, None, "download-model")
        self._action(m, "&Open GGUF…", None, None, "load-model")
        self._action(m, "&Server…", None, None, "server")
        self._action(m, "&Reload", None, None, "reload-model")
        m = bar.addMenu("&Help")
        self._action(m, "&Keyboard shortcuts", self.shortcuts, "Ctrl+/", "shortcuts")
        self._action(m, "&About Iris Desktop", self.about, None, "about")
        self._action(m, "Model &licenses", self.licenses, None, "licenses")
        paths = self.paths
        self._action(m, "Open &data folder", lambda: self.open_path(paths.data_dir, "data folder"),
                     None, "open-data-folder")
        self._action(m, "Open lo&g", lambda: self.open_path(paths.log_path, "log"), None,
                     "open-log")

    # -- edit --

    def copy(self) -> None:
        """Edit ▸ Copy: what the focused widget has selected; in the transcript, the
        selected part of a message, else the whole message."""
        focus = QGuiApplication.focusObject()
        view = self.view
        if focus is not None and focus is not view and hasattr(focus, "copy"):
            focus.copy()
            return
        view.copy()

    def focus_search(self) -> None:
        search = self.search
        search.setFocus()
        search.selectAll()

    # -- preferences --

    def preferences(self) -> SettingsDialog:
        from iris_desktop.host import GPU_CHECKS_FILE
        from iris_desktop.ui.gpu_info import GpuFacts

        gpu = GpuFacts(self.paths.models_dir, self.paths.data_dir / GPU_CHECKS_FILE)
        try:  # the file as it is now: `config set` may have changed it since it was read
            settings = self.app_state.rebase_settings()  # a model being tried stays
        except Exception as exc:  # a file broken by hand meanwhile: the settings in force
            settings = self.app_state.settings
            self.app_state.show_message(f"The settings file could not be read again ({exc}); "
                                        "Preferences shows the settings in force", 10_000)
        trying = self.app_state.model_try
        dialog = SettingsDialog(settings, self.preview, self.parent_widget,
                                limits=self.limits, gpu=gpu, reload=self.app_state.rebase_settings,
                                trying=set(trying[0]) if trying else ())
        gpu.setParent(dialog)
        dialog.applied.connect(self.settings_applied)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.settings_dialog = dialog
        dialog.open()
        return dialog

    def settings_applied(self, keys: list[str]) -> None:
        # (the dialog's Apply read the file again into force: ``reload``, rebase_settings)
        if at_start := [k for k in keys if SETTINGS[k].at_start]:  # (saved without a word)
            self.app_state.show_message(f"Saved; in use when Iris starts again: "
                                        f"{', '.join(at_start)}", 30_000)
        reload = [k for k in keys if SETTINGS[k].needs_reload]
        if reload and self.app_state.model_state != "none":
            box = QMessageBox(QMessageBox.Icon.Question, "Reload the model?",
                              "These changes need the model to be reloaded: "
                              + ", ".join(reload) + ".\nReload it now, in the background?",
                              QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                              self.parent_widget)
            box.setObjectName("reload-confirm")
            reload_model = self.actions["reload-model"]  # Yes is Model ▸ Reload
            later = (f"Not in use yet: {', '.join(reload)} (the model keeps its old values until "
                     "Model ▸ Reload)")
            box.finished.connect(lambda result: reload_model.trigger()
                                 if result == QMessageBox.StandardButton.Yes
                                 else self.app_state.show_message(later, 30_000))
            self.reload_box = box
            box.open()

    def file_followed(self, keys: list[str]) -> str:
        """The settings file changed elsewhere and ``keys`` are in force; what to say of
        it (:class:`ConfigWatch` says it, with the file's problems, in one message): an open
        Preferences shows them where the user has not edited, a key the model reads at
        loading is said to wait for Model ▸ Reload (never reloaded mid-reply), and one read
        only at start (storage.encrypt) to wait for the next start (it was said "in
        force" while the history stayed as it was)."""
        dialog = self.settings_dialog
        try:
            if dialog is not None and dialog.isVisible():
                dialog.rebase(self.app_state.settings)
        except RuntimeError:  # closed, and deleted with it
            self.settings_dialog = None
        state = self.app_state.model_state
        start = [k for k in keys if SETTINGS[k].at_start]
        reload = [k for k in keys if SETTINGS[k].needs_reload and state != "none"]
        now = [k for k in keys if k not in reload and k not in start]
        said = [f"in force: {', '.join(now)}"] if now else []
        if reload:  # with no model loaded (its load failed) there are no old values
            said.append(f"not in use yet: {', '.join(reload)} " + (
                "(no model is loaded; Model ▸ Reload loads it with "
                + ("this value)" if len(reload) == 1 else "these values)") if state == "failed"
                else "(the model keeps its old values until Model ▸ Reload)"))
        if start:
            said.append(f"not in use until Iris starts again: {', '.join(start)}")
        return "The settings file changed; " + "; ".join(said)

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
        from iris_desktop.runtime.onnx_embedder import BGE_SMALL
        from iris_desktop.runtime.reranker import RERANKER

        info, error = self.app_state.model_info, self.app_state.model_error
        model = (f"{info['name']} ({info['file']}, {info.get('file_type') or '?'}, n_ctx "
                 f"{info['n_ctx']:,}, chat format {info.get('chat_format') or '?'})"
                 + (", a base model" if info.get("base_model") else "")
                 if info else f"none ({error or 'not loaded'})")
        licenses = [f"{bundled.display_name} (bundled): {bundled.license}"
                    + (f", {bundled.via}" if getattr(bundled, "via", "") else "") + f" ({bundled.license_url})"
                    for bundled in (BUNDLED_MODEL, BGE_SMALL, RERANKER, EMBEDDING_MODEL)]
        if info and info["file"] != BUNDLED_MODEL.file_name:
            licenses.insert(0, f"{info['name']} (in use): {info.get('license') or '?'}")
        return (f"<h3>Iris Desktop {__version__}</h3>"
                "<p>Offline, private chat with a local model and an honest context engine.</p>"
                f"<p>Iris {__version__}<br>llama.cpp (llama-cpp-python) {llama}<br>"
                f"Qt {qVersion()} (PySide6 {PySide6.__version__})<br>"
                f"Python {sys.version.split()[0]}<br>Model: {html.escape(model)}</p>"
                "<p>Model licenses:<br>" + "<br>".join(html.escape(x) for x in licenses) + "</p>"
                "<p>The full license texts ship with the app (Help ▸ Model licenses).</p>"
                f"<p>Data: {html.escape(str(self.paths.data_dir))}</p>")

    def shortcuts(self) -> ShortcutsDialog:
        """Help ▸ Keyboard shortcuts: every shortcut, from the menus' actions."""
        dialog = ShortcutsDialog(self.bar, self.parent_widget)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.shortcuts_dialog = dialog
        dialog.open()
        return dialog

    def about(self) -> None:
        box = QMessageBox(QMessageBox.Icon.Information, "About Iris Desktop", self.about_text(),
                          parent=self.parent_widget)
        box.setObjectName("about")
        box.open()

    def licenses(self) -> LicensesDialog:
        """The bundled models' full license texts (the chat model, recall's embedding model
        and reranker, with the package they come from, and the embedding model before it,
        kept to search older vectors until they are re-embedded)."""
        from iris_desktop.runtime.bundled import BUNDLED_MODEL
        from iris_desktop.runtime.embedder import EMBEDDING_MODEL
        from iris_desktop.runtime.onnx_embedder import BGE_SMALL
        from iris_desktop.runtime.reranker import RERANKER

        parts = []
        for model in (BUNDLED_MODEL, BGE_SMALL, RERANKER, EMBEDDING_MODEL):
            try:
                text = model.license_text()
            except OSError as exc:
                text = f"(the license file is missing: {exc}) See {model.license_url}"
            via = f", {model.via}" if getattr(model, "via", "") else ""
            parts.append(f"{model.display_name} — {model.license}{via}\n{model.source}\n\n{text}")
        box = LicensesDialog(("\n\n" + "=" * 60 + "\n\n").join(parts), self.parent_widget)
        box.open()
        return box

    def open_path(self, path: Path, what: str) -> QMessageBox | None:
        """Open ``path`` with the desktop's own application; where none can (no file
        manager, no launcher), say where it is, in text that can be selected and copied
        (``path_box``), rather than nothing."""
        if QDesktopServices.openUrl(QUrl.fromLocalFile(str(path))):
            return None
        box = QMessageBox(QMessageBox.Icon.Information, f"The {what} is here",
                          f"Iris could not open the {what}: this desktop has no application "
                          f"for it. It is here:\n\n{path}", parent=self.parent_widget)
        box.setObjectName("path-box")
        box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                    | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        copy = box.addButton("Copy the path", QMessageBox.ButtonRole.ActionRole)
        copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(str(path)))
        box.addButton(QMessageBox.StandardButton.Close)
        self.path_box = box
        box.open()
        return box


class LicensesDialog(QDialog):
    """Help ▸ Model licenses: the full texts (some 38,000 characters) in a window that can
    be resized and searched, not a message box's fixed five lines."""

    def __init__(self, text: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("licenses")
        self.setWindowTitle("Model licenses")
        self.view = QPlainTextEdit(self)
        self.view.setReadOnly(True)
        self.view.setPlainText(text)
        self.view.setAccessibleName("License texts")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("The models that ship with Iris and their licenses.", self))
        layout.addWidget(self.view, 1)
        layout.addWidget(buttons)
        from iris_desktop.ui.screen_fit import fit_to_screen

        fm = QFontMetrics(self.view.font())
        fit_to_screen(self, QSize(fm.horizontalAdvance("0") * 90, fm.lineSpacing() * 36))

    def detailedText(self) -> str:  # noqa: N802 (the message box's name, as before)
        return self.view.toPlainText()
