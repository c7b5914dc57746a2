"""The app's look, from the settings: ``ui.theme`` (system | light | dark) and
``ui.font_size`` (points; 0 = the system's size), applied at start and again whenever
Preferences change them, with no restart; and the window icon.

``system`` follows the computer through Qt's colour scheme (``QStyleHints.colorScheme``,
which changes live). Where the platform has no dark palette of its own (X11 without a
desktop's theme, the offscreen platform) Iris paints the dark scheme itself. ``light``
and ``dark`` also ask the platform for that scheme (``setColorScheme``: title bars on
Windows and macOS follow), and set a complete Fusion palette, so every widget follows.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QColor, QFont, QIcon, QPalette, QPixmap
from PySide6.QtWidgets import QApplication

from iris_desktop.ui.app_state import AppState

ICON_RESOURCE = "resources/icon.png"

Role, Group = QPalette.ColorRole, QPalette.ColorGroup

#: role → (normal, disabled) colours of each scheme
_COLORS: dict[str, dict[QPalette.ColorRole, tuple[str, str]]] = {
    "dark": {
        Role.Window: ("#2b2b2e", "#2b2b2e"),
        Role.WindowText: ("#e8e8ea", "#7c7c82"),
        Role.Base: ("#1e1e21", "#262629"),
        Role.AlternateBase: ("#26262a", "#26262a"),
        Role.ToolTipBase: ("#3a3a3f", "#3a3a3f"),
        Role.ToolTipText: ("#f0f0f2", "#9a9aa0"),
        Role.PlaceholderText: ("#8d8d94", "#606066"),
        Role.Text: ("#e8e8ea", "#7c7c82"),
        Role.Button: ("#35353a", "#2f2f33"),
        Role.ButtonText: ("#e8e8ea", "#7c7c82"),
        Role.BrightText: ("#ff7a7a", "#ff7a7a"),
        Role.Light: ("#4b4b51", "#3d3d42"),
        Role.Midlight: ("#404045", "#36363a"),
        Role.Mid: ("#2a2a2e", "#2a2a2e"),
        Role.Dark: ("#18181a", "#18181a"),
        Role.Shadow: ("#0c0c0d", "#0c0c0d"),
        Role.Highlight: ("#3b7ddd", "#4a4a50"),
        Role.HighlightedText: ("#ffffff", "#a0a0a6"),
        Role.Accent: ("#3b7ddd", "#4a4a50"),
        Role.Link: ("#6cb2ff", "#5a7a9a"),
        Role.LinkVisited: ("#b99cff", "#7a6a9a"),
    },
    "light": {
        Role.Window: ("#efeff1", "#efeff1"),
        Role.WindowText: ("#1c1c1f", "#9a9aa0"),
        Role.Base: ("#ffffff", "#f4f4f6"),
        Role.AlternateBase: ("#f5f5f7", "#f5f5f7"),
        Role.ToolTipBase: ("#ffffe1", "#ffffe1"),
        Role.ToolTipText: ("#1c1c1f", "#9a9aa0"),
        Role.PlaceholderText: ("#7c7c82", "#b4b4ba"),
        Role.Text: ("#1c1c1f", "#9a9aa0"),
        Role.Button: ("#e9e9ec", "#efeff1"),
        Role.ButtonText: ("#1c1c1f", "#9a9aa0"),
        Role.BrightText: ("#ffffff", "#ffffff"),
        Role.Light: ("#ffffff", "#ffffff"),
        Role.Midlight: ("#f6f6f8", "#f6f6f8"),
        Role.Mid: ("#b8b8bd", "#c8c8cc"),
        Role.Dark: ("#9e9ea3", "#b4b4b8"),
        Role.Shadow: ("#76767a", "#8c8c90"),
        Role.Highlight: ("#2f6fcf", "#c4c4c8"),
        Role.HighlightedText: ("#ffffff", "#7c7c82"),
        Role.Accent: ("#2f6fcf", "#c4c4c8"),
        Role.Link: ("#1a5fb4", "#7c94b4"),
        Role.LinkVisited: ("#6c3fa8", "#9a8ab4"),
    },
}


def palette(scheme: str) -> QPalette:
    """The complete palette of ``scheme`` (light | dark): every role, with disabled
    colours, and the inactive group the same as the active one."""
    pal = QPalette()
    for role, (normal, disabled) in _COLORS[scheme].items():
        for group in (Group.Active, Group.Inactive):
            pal.setColor(group, role, QColor(normal))
        pal.setColor(Group.Disabled, role, QColor(disabled))
    return pal


def painted_scheme(theme: str, system: Qt.ColorScheme, platform_dark: bool) -> str | None:
    """What Iris paints for ``theme``: light or dark, or None for the platform's own
    palette (``system`` when the platform already draws what the computer asks for)."""
    if theme in ("light", "dark"):
        return theme
    if system == Qt.ColorScheme.Dark and not platform_dark:
        return "dark"
    return None


#: what the application looked like before Iris changed it (its style and font)
_original: dict[str, Any] = {}


def apply_appearance(app: QApplication, theme: str, font_size: int,
                     system: Qt.ColorScheme | None = None) -> str:
    """Apply ``theme`` and ``font_size`` to the whole application; ``system`` is the
    computer's colour scheme (default: what Qt reports). Returns the scheme painted:
    light, dark, or system (the platform's own palette)."""
    hints = app.styleHints()
    if not _original:
        _original.update(style=app.style().name(), font=QFont(app.font()))
    if theme == "system":
        hints.unsetColorScheme()
    else:
        hints.setColorScheme(Qt.ColorScheme.Dark if theme == "dark" else Qt.ColorScheme.Light)
    # the platform's own look first; then Iris's palette on Fusion where it is needed
    if app.style().name().lower() != _original["style"].lower():
        app.setStyle(_original["style"])
    app.setPalette(QPalette())
    platform_dark = app.palette().color(Role.Window).lightness() < 128
    scheme = painted_scheme(theme, hints.colorScheme() if system is None else system,
                            platform_dark)
    if scheme is not None:
        if app.style().name().lower() != "fusion":
            app.setStyle("Fusion")
        app.setPalette(palette(scheme))
    font = QFont(_original["font"])
    if font_size:
        font.setPointSize(int(font_size))
    if app.font() != font:
        app.setFont(font)
    return scheme or "system"


def app_icon() -> QIcon:
    """The app's icon (the package's ``resources/icon.png``; empty if it is missing)."""
    data = resources.files("iris_desktop").joinpath(ICON_RESOURCE)
    pixmap = QPixmap()
    try:
        pixmap.loadFromData(data.read_bytes(), "PNG")
    except OSError:
        return QIcon()
    return QIcon(pixmap)


class Appearance(QObject):
    """Keeps the application's look on ``app_state``'s settings (``ui.theme``,
    ``ui.font_size``) and, for ``system``, on the computer's colour scheme."""

    def __init__(self, app_state: AppState, parent: QObject | None = None):
        super().__init__(parent)
        self.app_state = app_state
        self.applied: tuple[str, int] | None = None
        #: what was painted last: light, dark, or system
        self.scheme = ""
        self._applying = False
        app_state.settingsChanged.connect(lambda _settings: self.apply())
        app = QApplication.instance()
        if app is not None:
            app.styleHints().colorSchemeChanged.connect(self._system_changed)
        self.apply()

    def apply(self, force: bool = False) -> None:
        settings = self.app_state.settings
        wanted = (settings["ui.theme"], settings["ui.font_size"])
        app = QApplication.instance()
        if app is None or self._applying or (wanted == self.applied and not force):
            return
        self.applied = wanted
        self._applying = True  # asking for a scheme announces a change of it
        try:
            self.scheme = apply_appearance(app, *wanted)
        finally:
            self._applying = False

    def _system_changed(self, _scheme: Qt.ColorScheme) -> None:
        if self.applied is not None and self.applied[0] == "system":
            self.apply(force=True)
