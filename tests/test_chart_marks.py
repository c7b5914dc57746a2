"""One line style per meaning: on the meter the dashed line is the budget and the solid
red one the compaction threshold; the inspector's chart drew the threshold dashed and
called it "Dashed" (a newcomer audit). Now the chart's threshold is solid red, as on the
meter, and its legend says so. A real chart painted offscreen, its pixels read."""

from __future__ import annotations

from PySide6.QtGui import QColor

from iris_desktop.ui.meter import MARK_RED, PromptChart


def reddish(color: QColor) -> bool:
    return (color.red() > 150 and color.green() < 120 and color.blue() < 120
            and abs(color.red() - MARK_RED.red()) < 60)


def test_the_chart_draws_the_compaction_threshold_solid_red(qtbot):
    chart = PromptChart()
    qtbot.addWidget(chart)
    chart.resize(600, 240)
    chart.set_points({"values": [500, 900, 1200], "compactions": [], "window": 4096}, 3000)
    image = chart.grab().toImage()
    area = chart.regions()["plot"]
    y = round(area.bottom() - area.height() * 3000 / chart.top())
    xs = range(int(area.left()) + 2, int(area.right()) - 2)
    red = [x for x in xs if any(reddish(image.pixelColor(x, y + dy)) for dy in (-1, 0, 1))]
    assert len(red) == len(xs), f"{len(xs) - len(red)} gaps in the threshold's line"

