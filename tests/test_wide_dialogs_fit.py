"""Model ▸ Models… and Model ▸ Download… open within the screen at any text size, their
Close and Use this model / Download buttons on it (they were 150 and 160 zeros wide:
2,250 and 2,400 px at 18 pt on a 1920-px screen, 1,200 and 1,280 px at the default size)."""
import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QRect  # noqa: E402
from PySide6.QtWidgets import QApplication, QDialog  # noqa: E402


def global_rect(widget) -> QRect:
    return QRect(widget.mapToGlobal(widget.rect().topLeft()), widget.size())


@pytest.mark.parametrize("points", [0, 18])
@pytest.mark.parametrize("action", ["models", "download-model"])
def test_models_and_download_dialogs_fit_the_screen(make_window, qtbot, points, action):
    window = make_window(overrides={"ui.font_size": str(points)})
    window.menus.actions[action].trigger()
    qtbot.waitUntil(lambda: any(isinstance(w, QDialog) and w.isVisible()
                                for w in QApplication.topLevelWidgets()), timeout=5_000)
    dialog = next(w for w in QApplication.topLevelWidgets() if isinstance(w, QDialog) and w.isVisible())
    available = dialog.screen().availableGeometry()
    assert dialog.width() <= available.width() and dialog.height() <= available.height(), (
        dialog.size(), available)
    for button in dialog.findChildren(type(window.composer.button)):
        if button.isVisible() and button.text() in ("Close", "Use this model", "Download"):
            assert available.contains(global_rect(button)), button.text()
    dialog.close()
