"""Preferences, generated from ``settings.SETTINGS``: one page per section, one field per
key. A key added to SETTINGS gets a field here with no change to this file.

Every edit is parsed with ``Setting.parse``; a bad value is marked at its field with
SettingsError's message and OK is disabled. Under the pages, a live breakdown shows what
the candidate values do to the current thread's next request, before anything is applied.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from PySide6.QtCore import QEvent, QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QDialogButtonBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.core.budget_lines import threshold_note
from iris_desktop.core.views import (
    BudgetPreview,
    changed_keys,
    locked_reason,
    parse_fields,
    settings_sections,
)
from iris_desktop.settings import PINNED, SETTINGS, Setting, Settings, SettingsError, write_config_values
from iris_desktop.ui.accessibility import name_controls
from iris_desktop.ui.boxes import plain_box
from iris_desktop.ui.budget_box import BudgetBox
from iris_desktop.ui.discard import AsksBeforeDiscarding
from iris_desktop.ui.gpu_info import DevicesBox, GpuFacts
from iris_desktop.ui.screen_fit import fit_to_screen
from iris_desktop.ui.setting_field import SettingField
from iris_desktop.ui.theme import apply_appearance

#: pages whose section name is not a word a user would look for
PAGE_TITLES = {"ui": "Appearance"}
#: the pages whose settings change the token budget (the live breakdown shows under them)
BUDGET_SECTIONS = {"context", "model", "tools", "chat"}


class SettingsDialog(AsksBeforeDiscarding, QDialog):
    """``preview(candidate, callback)`` computes a BudgetPreview off the GUI thread.
    Cancel, Escape or closing asks before changes not applied are thrown away."""

    changes_name = "your changes to Preferences"
    discard_detail = "They are not applied or saved."

    applied = Signal(object)  # the keys that changed

    def __init__(
        self,
        settings: Settings,
        preview: Callable[[Settings, Callable[[BudgetPreview], None]], None] | None = None,
        parent=None,
        limits: Callable[[Settings], dict[str, str]] | None = None,
        gpu: GpuFacts | None = None,
        reload: Callable[[], Settings] | None = None,
        trying: Collection[str] = (),
    ):
        super().__init__(parent)
        self.setWindowTitle("Preferences")
        self.setObjectName("preferences")
        self.settings = settings
        self._preview = preview
        #: reads the settings again after a save (the file may hold what others wrote)
        self._reload = reload
        self._limits = limits
        self._trying = trying  # the model.* keys of a model chosen in the window, loading
        #: the devices llama.cpp found and the plan, under model.gpu (None: not shown)
        self.gpu = gpu
        self.devices_label: QLabel | None = None
        self._finished = False
        self.fields: dict[str, SettingField] = {}
        self.errors: dict[str, str] = {}
        self.shown: dict[str, Any] = {}  # each field's value as shown (below): kept unless changed
        #: the fields edited or restored here since the last save: written even when equal
        #: to the value read at opening (`config set` elsewhere may have changed the file)
        self.touched: set[str] = set()
        self.tabs = QTabWidget()
        self.tabs.setElideMode(Qt.TextElideMode.ElideNone)  # scrolls rather than cut a name
        self.tabs.setUsesScrollButtons(True)
        pages = settings_sections()
        self.sections = [section for section, _, _ in pages]
        for section, title, items in pages:
            title = PAGE_TITLES.get(section, title)
            self.tabs.addTab(self._page(section, title, items), title)
        self.tabs.setAccessibleName("Preferences pages")
        self.tabs.tabBar().setAccessibleName("Preferences pages")

        box = BudgetBox(self.fontMetrics().lineSpacing())
        self.breakdown, self.meter = box.breakdown, box.meter
        self.budget_box = box  # on the pages whose settings spend the window's tokens
        self.tabs.currentChanged.connect(
            lambda i: box.setVisible(self.sections[i] in BUDGET_SECTIONS))

        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Apply
            | QDialogButtonBox.StandardButton.Cancel)
        self.ok_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.apply_button = self.buttons.button(QDialogButtonBox.StandardButton.Apply)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self.apply_button.clicked.connect(self.apply)
        self.ok_button.setAccessibleName("OK: apply and close")
        self.apply_button.setAccessibleName("Apply")
        self.buttons.button(QDialogButtonBox.StandardButton.Cancel).setAccessibleName(
            "Cancel: close without applying")

        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(box)  # as tall as its lines need (``budget_box.Sentences``)
        layout.addWidget(self.buttons)
        self._debounce = QTimer(self, singleShot=True, interval=120)
        self._debounce.timeout.connect(self._request_preview)
        #: the theme and text size shown now (they change as they are chosen)
        self._look = (settings["ui.theme"], settings["ui.font_size"])
        self._look_timer = QTimer(self, singleShot=True, interval=150)
        self._look_timer.timeout.connect(self.show_look)
        self.last_preview: BudgetPreview | None = None
        self._asked = 0  # the budgets asked for (_request_preview)
        self._finished = False
        self.shown = self.raw_values(every=True)
        self.touched.clear()  # what setting up the editors emitted
        self.validate()
        self._request_preview()
        name_controls(self)  # the rest (the tab bar's scroll buttons) from what they show
        self.fit_to_screen()

    def fit_to_screen(self) -> None:
        """About 110 characters by 52 lines, but never larger than the screen's free area
        (the pages and the budget scroll), at any text size."""
        fm = self.fontMetrics()
        fit_to_screen(self, QSize(fm.horizontalAdvance("0") * 110, fm.height() * 52))

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:  # ui.font_size applied while open
            self.fit_to_screen()

    def _page(self, section: str, title: str, items: list[Setting]) -> QWidget:
        body = QWidget()
        layout = QVBoxLayout(body)
        if section == "ui":  # what "applies at once" means here
            note = QLabel("Theme and text size change the window at once, while you choose; "
                          "OK or Apply keeps them, Cancel goes back.")
            note.setObjectName("appearance-note")
            note.setWordWrap(True)
            layout.addWidget(note)
        for setting in items:
            field = SettingField(setting, self.settings.values.get(setting.key, setting.default),
                                 locked_reason(self.settings, setting.key, self._trying)
                                 if setting.key in self.settings.sources else None)
            field.changed.connect(lambda key=setting.key: self.touched.add(key))
            field.changed.connect(self._changed)
            self.fields[setting.key] = field
            layout.addWidget(field)
            line = QFrame()
            line.setFrameShape(QFrame.Shape.HLine)
            line.setFrameShadow(QFrame.Shadow.Sunken)
            layout.addWidget(line)
            if setting.key == "model.gpu" and self.gpu is not None:
                layout.addWidget(self._devices_box())
        restore = QPushButton("Restore defaults")
        restore.setObjectName(f"restore-{section}")
        restore.setAccessibleName(f"Restore the defaults of {title}")
        restore.clicked.connect(lambda: self.restore_defaults(section))
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(restore)
        layout.addLayout(row)
        layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(body)
        scroll.setAccessibleName(f"{title} settings")
        return scroll

    def _devices_box(self) -> DevicesBox:
        """Read-only, under model.gpu: the devices llama.cpp found and the plan for the
        current model at the dialog's model.n_ctx and model.gpu (:class:`DevicesBox`)."""
        self.devices_box = box = DevicesBox(self.gpu, self._gpu_candidate)
        self.devices_label = box.label
        self.gpu.request(self.settings)
        return box

    def _gpu_candidate(self) -> Settings | None:
        """The candidate settings the plan follows as they are edited; None once the dialog
        is closed, or while model.gpu or model.n_ctx is invalid (the last plan stays)."""
        candidate, errors = parse_fields(self.settings, self.raw_values())
        return None if self._finished or {"model.gpu", "model.n_ctx"} & set(errors) else candidate

    def show_devices(self) -> None:
        if self.devices_label is not None:
            self.devices_box.refresh()

    # -- state --

    def raw_values(self, every: bool = False) -> dict[str, Any]:
        """The fields changed here (``every``: all): the rest keep the stored value exactly (min_p 0.025 shows 0.03)."""
        raws = {k: f.raw() for k, f in self.fields.items() if not f.locked}
        return raws if every else {k: raw for k, raw in raws.items() if raw != self.shown.get(k)}

    def has_changes(self) -> bool:
        """A field shows something else than it did when opened or last applied."""
        return not self._finished and bool(self.raw_values())

    def candidate(self) -> Settings:
        return parse_fields(self.settings, self.raw_values())[0]

    def changed(self) -> list[str]:
        return changed_keys(self.settings, self.candidate())

    def validate(self) -> bool:
        candidate, self.errors = parse_fields(self.settings, self.raw_values())
        if self._limits is not None:  # what the model cannot honour, with both numbers
            self.errors = {**self._limits(candidate), **self.errors}
        for key, field in self.fields.items():  # under its label: without the key before it
            error = (self.errors.get(key) or "").removeprefix(f"{key}: ")
            field.set_error(error[:1].upper() + error[1:] or None)
        for index, section in enumerate(self.sections):  # a page with an error says so
            title = self.tabs.tabText(index).removesuffix(" ⚠")
            wrong = any(SETTINGS[k].section == section for k in self.errors)
            self.tabs.setTabText(index, f"{title} ⚠" if wrong else title)
        if "context.compaction_threshold" in self.fields:  # a red line above the budget
            self.fields["context.compaction_threshold"].set_note(threshold_note(candidate.values))
        ok = not self.errors
        self.ok_button.setEnabled(ok)
        self.apply_button.setEnabled(ok and bool(self.changed()))
        return ok

    def _changed(self) -> None:
        self.validate()
        self.show_devices()
        self._debounce.start()
        self._look_timer.start()

    # -- appearance, shown at once --

    def show_look(self) -> None:
        """The theme and text size chosen (valid ones), on the whole app at once: a
        preview that Apply or OK keeps and Cancel takes back."""
        look = (self.candidate()["ui.theme"], self.candidate()["ui.font_size"])
        if look != self._look and not self._finished:
            self._look = look
            apply_appearance(QApplication.instance(), *look)

    def _take_back_look(self) -> None:
        """The look of the settings in force again (Cancel after a preview)."""
        if self._look != (self.settings["ui.theme"], self.settings["ui.font_size"]):
            self._look = (self.settings["ui.theme"], self.settings["ui.font_size"])
            apply_appearance(QApplication.instance(), *self._look)

    def restore_defaults(self, section: str) -> None:
        for key, field in self.fields.items():
            if SETTINGS[key].section == section and not field.locked and key not in PINNED:
                field.set_value(SETTINGS[key].default)
                self.touched.add(key)
        self._changed()

    # -- live breakdown --

    def _request_preview(self) -> None:
        if self._preview is None:
            return
        self._asked += 1  # an answer to an earlier request is not shown (values since changed)
        if self.errors:
            pages = {self.tabs.tabText(self.sections.index(SETTINGS[k].section)) for k in self.errors}
            for field in self.fields.values():  # no figure of a window no longer asked for
                field.editor.set_window(None, {})
            self.budget_box.show_fix(f"Fix the marked values to see the budget ({', '.join(sorted(pages))}).")
            return
        asked = self._asked
        self._preview(self.candidate(), lambda preview: asked == self._asked and self.show_preview(preview))

    def show_preview(self, preview: BudgetPreview) -> None:
        if self._finished:
            return  # the answer came back after the dialog closed
        self.last_preview = preview
        values = self.candidate().values
        for field in self.fields.values():
            field.editor.set_window(preview.window, values)
        self.budget_box.show_preview(preview, values)

    # -- saving --

    def apply(self) -> bool:
        """Write the changed keys to the TOML file; emits ``applied(keys)``."""
        if not self.validate():
            return False
        candidate = self.candidate()
        keys, path, v = changed_keys(self.settings, candidate), self.settings.config_path, candidate.values
        written = keys + [k for k in SETTINGS if k in self.touched and k not in keys
                          and not self.fields[k].locked]
        try:  # all or none; a default is removed from the file rather than pinned there
            if path is not None and written:
                write_config_values(path, {k: None if v[k] == SETTINGS[k].default and k not in PINNED
                                           else v[k] for k in written})
        except (SettingsError, OSError) as exc:  # a file Iris cannot edit or write: said
            self.refusal = plain_box(QMessageBox(QMessageBox.Icon.Warning, "Preferences not saved",
                                                 f"Nothing was saved: {str(exc).rstrip('.')}.", parent=self))
            self.refusal.open()
            return False
        self.settings, self.shown = candidate, self.raw_values(every=True)
        self.touched.clear()
        try:  # what is in force now: `config set` elsewhere may have changed other keys
            fresh = self._reload() if self._reload is not None else candidate
        except Exception:  # saved; the file could not be read back: what was saved
            fresh = candidate
        self.rebase(fresh)
        if keys:
            self.applied.emit(keys)
        return True

    def rebase(self, settings: Settings) -> None:
        """``settings`` (read again after Apply, or the file changed elsewhere while open)
        become what the dialog starts from: each field not edited since the last save shows
        its value there, an edited one keeps what was typed, and the budget follows (after
        Apply it still showed the values read at opening, on a window no longer in force)."""
        before, touched = self.settings, set(self.touched)
        self.settings = settings
        for key, field in self.fields.items():
            if (field.locked or key in touched or field.raw() != self.shown.get(key)
                    or settings.values[key] == before.values.get(key)):
                continue
            field.set_value(settings.values[key])
            self.shown[key] = field.raw()
        self.touched = touched  # setting the editors is no edit of the user's
        self.validate()
        self.show_devices()
        self._debounce.stop()
        self._request_preview()

    def accept(self) -> None:
        if self.apply():
            super().accept()

    def done(self, result: int) -> None:
        self._look_timer.stop()
        if result != QDialog.DialogCode.Accepted:
            self._take_back_look()
        self._finished = True
        super().done(result)
