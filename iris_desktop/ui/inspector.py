"""The context inspector dock: the exact next request, the summary chain, compaction
events and a chart of prompt tokens per request. It shows ``views.inspector_report``."""

from __future__ import annotations

import time
from typing import Any

from PySide6.QtCore import QObject, QSettings, Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDockWidget,
    QFrame,
    QGroupBox,
    QHeaderView,
    QLabel,
    QMainWindow,
    QScrollArea,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from iris_desktop.core.budget_lines import counter_label
from iris_desktop.core.views import tokens
from iris_desktop.ui.meter import PromptChart

#: the largest share of the window's width the inspector takes beside the conversation
INSPECTOR_SHARE = 0.4
#: its first width, in characters of its text: the next request's columns with the start of
#: each message, and the three tabs' names (it opened 256 pixels wide at 1400×900: the table
#: showed no message and "Compactions" was cut)
FIRST_WIDTH_CHARS = 76
#: ui-state.ini's mark that the inspector has had its first width: after it, the width is the
#: one the window's saved state brings back (the user's)
SIZED_KEY = "inspector/sized"

EVENT_COLUMNS = (
    ("created_at", "When"), ("trigger", "Trigger"), ("outcome", "Outcome"), ("path", "Path"),
    ("turns_archived", "Turns archived"), ("tokens_before", "Tokens before"),
    ("tokens_after", "Tokens after"), ("kept_turns", "Kept turns"),
    ("summary_tokens", "Summary tokens"), ("duration_s", "Duration (s)"), ("error", "Error"),
)


def _item(value: Any, align_right: bool = False) -> QTableWidgetItem:
    if isinstance(value, float) and value > 1e9:  # a timestamp
        text = time.strftime("%Y-%m-%d %H:%M", time.localtime(value))
    elif isinstance(value, float):
        text = f"{value:.2f}"
    elif isinstance(value, int):
        text = f"{value:,}"
    else:
        text = "" if value is None else str(value)
    item = QTableWidgetItem(text)
    item.setFlags(Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsEnabled)
    if align_right:
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


def _reranked(fact: dict[str, Any]) -> str:
    """The recall line's word on the cross-encoder (``views.rerank_fact``)."""
    return "reranked" if fact.get("reranked") else f"not reranked: {fact.get('rerank_reason') or 'unknown'}"


def _table(columns: list[str]) -> QTableWidget:
    table = QTableWidget(0, len(columns))
    table.setTabKeyNavigation(False)  # Tab goes on to the next part of the inspector
    table.setHorizontalHeaderLabels(columns)
    table.verticalHeader().setVisible(False)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setWordWrap(False)
    table.horizontalHeader().setStretchLastSection(True)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    return table


def _messages_words(request: list[dict[str, Any]]) -> str:
    """What the request holds, the system message named apart ("the system prompt and 2
    messages": "3 messages" beside "2 verbatim" read as a miscount)."""
    system = sum(1 for m in request if m.get("role") == "system")
    rest = len(request) - system
    said = f"{rest:,} message{'' if rest == 1 else 's'}"
    return f"the system prompt and {said}" if system else said


class InspectorDock(QDockWidget):
    def __init__(self, parent=None):
        super().__init__("Context inspector", parent)
        self.setObjectName("inspector")
        self.report: dict[str, Any] | None = None
        self.thread_id: int | None = None  # the chat ``report`` is of
        self.tabs = QTabWidget()
        # a narrow dock scrolls its tabs rather than cut their names ("Compa…")
        self.tabs.setElideMode(Qt.TextElideMode.ElideNone)
        self.tabs.setUsesScrollButtons(True)
        self.tabs.setAccessibleName("Inspector pages")
        self.tabs.tabBar().setAccessibleName("Inspector pages")

        request_page = QWidget()
        self.request_label = QLabel("Open a thread to see its next request.")
        self.request_label.setWordWrap(True)
        self.request_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.request_table = _table(["Id", "Role", "Turn", "State", "Tokens", "Content"])
        self.request_table.setAccessibleName("Next request, message by message")
        layout = QVBoxLayout(request_page)
        layout.addWidget(self.request_label)
        layout.addWidget(self.request_table, 1)
        self.tabs.addTab(request_page, "Next request")

        self.summaries = QTreeWidget()
        self.summaries.setHeaderLabels(["Summary", "Turns", "Tokens", "Path", "Created"])
        self.summaries.setWordWrap(True)
        self.summaries.setAccessibleName("Summaries")
        self.tabs.addTab(self.summaries, "Summaries")

        self.events = _table([label for _, label in EVENT_COLUMNS])
        self.events.setAccessibleName("Compaction events")
        self.tabs.addTab(self.events, "Compactions")

        # the chart stays in view under whichever table is open
        chart_box = QGroupBox("Prompt tokens per request")
        self.chart = PromptChart()
        self.chart_label = QLabel("")
        self.chart_label.setWordWrap(True)
        layout = QVBoxLayout(chart_box)
        layout.addWidget(self.chart, 1)
        layout.addWidget(self.chart_label)
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.setObjectName("inspector-splitter")
        # a short dock scrolls the chart and its legend rather than draw one over the other
        self.chart_scroll = chart_scroll = QScrollArea()
        chart_scroll.setObjectName("chart-scroll")
        chart_scroll.setWidgetResizable(True)
        chart_scroll.setFrameShape(QFrame.Shape.NoFrame)
        chart_scroll.setWidget(chart_box)
        chart_scroll.setAccessibleName("Prompt tokens per request")
        self.chart.setAccessibleName("Chart of prompt tokens per request")
        splitter.addWidget(self.tabs)
        splitter.addWidget(chart_scroll)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 1)
        self.setWidget(splitter)

    def show_report(self, report: dict[str, Any] | None, thread_id: int | None = None) -> None:
        """``report`` (None: no chat open), of chat ``thread_id``."""
        self.report, self.thread_id = report, thread_id
        if report is None:
            self.request_label.setText("Open a thread to see its next request.")
            for table in (self.request_table, self.events):
                table.setRowCount(0)
            self.summaries.clear()
            self.chart.set_points({"values": [], "compactions": [], "window": 0})
            return
        self._show_request(report)
        self._show_summaries(report["summaries"])
        self._show_events(report["events"])
        b = report.get("breakdown") or {}
        self.chart.set_points(report["chart"], b.get("threshold"))
        values = report["chart"]["values"]
        # the chart's legend is this label, under it: nothing is painted over its axes
        self.chart_label.setText(
            f"{len(values)} request(s), last {tokens(values[-1])} prompt tokens; "
            f"{len(report['chart']['compactions'])} compaction(s), each an orange line. "
            "The red line: the meter's red line (compaction is due once a request reaches it, "
            "or sooner, when the oldest turns no longer fit the budget)." if values else "")

    def show_counting(self) -> None:
        """Another chat's report is being made: the one shown (of the chat open before)
        goes, and what is happening is said (a long chat's first count takes seconds)."""
        self.show_report(None)
        self.request_label.setText("Counting this chat's messages for its next request…")

    def _show_request(self, report: dict[str, Any]) -> None:
        b = report.get("breakdown")
        if report.get("error"):
            text = report["error"]
        elif b:
            states = ", ".join(f"{n:,} {s}" for s, n in sorted(report["states"].items()))
            text = (
                f"Next request: {_messages_words(report['request'])}, "
                f"{tokens(report['predicted_prompt_tokens'])} of the {tokens(b['window'])}-token window ("
                + ("exact, " if report.get("exact") else "estimated, ")
                + f"counted with {counter_label(report['counter'])}). "
                f"System {tokens(b['system'])}, tools {tokens(b['tools'])}, summary "
                f"{tokens(b['summary'])}, recall {tokens(b.get('recall', 0))}"
                + (f" ({len(report.get('recalled_ids') or [])} summarized messages: "
                   + ", ".join(f"#{m['id']} {m['speaker']}" for m in report.get("recalled") or [])
                   + "; " + _reranked(report.get("rerank") or {})
                   + ")" if report.get("recalled_ids") else "")
                + f", history {tokens(b['history'])}, draft {tokens(b['draft'])}. "
                f"Protected turns: {report['protect_turns']}"
                + (" (fallback)" if report["fallback"] else "")
                + (f". Compaction due ({', '.join(report['triggers'])})."
                   if report["compaction_due"] else ". Compaction not due.")
                + (f"\nStored messages: {states}." if states else "")
                + (f"\nNote: {report['embedder_problem']}." if report.get("embedder_problem") else "")
                # what is left out and why, whole (the label wraps; nothing is cut)
                + (f"\n{report['dropped']['why']}" if report.get("dropped") else ""))
        else:
            text = ""
        self.request_label.setText(text)
        rows = report.get("request") or []
        table = self.request_table
        table.setUpdatesEnabled(False)
        table.setRowCount(len(rows))
        for i, row in enumerate(rows):
            table.setItem(i, 0, _item(row["id"] if row["id"] is not None else "–"))
            table.setItem(i, 1, _item(row["role"]))
            table.setItem(i, 2, _item(row["turn"]))
            table.setItem(i, 3, _item(row["state"]))
            table.setItem(i, 4, _item(row["tokens"], align_right=True))
            table.setItem(i, 5, _item(row["preview"]))
            if row["state"] == "recalled":  # which messages, one a line
                table.item(i, 5).setToolTip("\n".join(
                    f"#{m['id']} {m['speaker']}: {m['preview']}"
                    for m in report.get("recalled") or []))
        table.setUpdatesEnabled(True)

    def _show_summaries(self, summaries: list[dict[str, Any]]) -> None:
        self.summaries.clear()
        for s in summaries:
            created = time.strftime("%Y-%m-%d %H:%M", time.localtime(s["created_at"]))
            prev = f" (after #{s['prev_id']})" if s["prev_id"] else ""
            top = QTreeWidgetItem([f"#{s['id']}{prev}", s["turns"], f"{s['tokens']:,}", s["path"],
                                   created])
            for label, value in s["fields"]:
                child = QTreeWidgetItem([label, "", "", "", ""])
                child.setFirstColumnSpanned(True)
                leaf = QTreeWidgetItem([value])
                leaf.setFirstColumnSpanned(True)
                child.addChild(leaf)
                top.addChild(child)
            self.summaries.addTopLevelItem(top)
            top.setExpanded(s is summaries[-1])
        if not summaries:  # across every column: the first alone cut it to "No …"
            item = QTreeWidgetItem(["No summary yet: nothing has been compacted."])
            self.summaries.addTopLevelItem(item)
            item.setFirstColumnSpanned(True)

    def _show_events(self, events: list[dict[str, Any]]) -> None:
        self.events.clearSpans()
        if not events:  # a row across the table says so, rather than an empty grid
            self.events.setRowCount(1)
            self.events.setItem(0, 0, _item("No compaction yet: this chat has not been summarized."))
            self.events.setSpan(0, 0, 1, len(EVENT_COLUMNS))
            return
        self.events.setRowCount(len(events))
        for i, event in enumerate(events):
            for j, (key, _) in enumerate(EVENT_COLUMNS):
                value = event.get(key)
                item = _item(value, align_right=isinstance(value, (int, float)))
                if key == "error" and value:  # a narrow column cuts it: the whole text here
                    item.setToolTip(str(value))
                self.events.setItem(i, j, item)


class InspectorWidth(QObject):
    """The width of ``dock`` docked beside the conversation in ``window``: the first time it
    opens in this data folder, :data:`FIRST_WIDTH_CHARS` (marked in ``state``); afterwards
    the window's saved state's. Never more than :data:`INSPECTOR_SHARE` of the window,
    whenever it opens or the window is resized (the window's ``resizeEvent`` calls
    :meth:`fit`), so that the conversation keeps the rest (restored open at 800 pixels, it
    left the conversation 160). No event filter on the window: one ran Python for its every
    event (two a repaint of any part of it: 614 calls in ui_latency's switch of chats), each
    one taking the GIL, which it waits for while another thread holds it."""

    def __init__(self, window: QMainWindow, dock: QDockWidget, state: QSettings):
        super().__init__(window)
        self.window, self.dock, self.state = window, dock, state
        dock.visibilityChanged.connect(lambda visible: visible and self.fit())

    def fit(self) -> None:
        window, dock = self.window, self.dock
        beside = window.dockWidgetArea(dock) in (Qt.DockWidgetArea.LeftDockWidgetArea,
                                                 Qt.DockWidgetArea.RightDockWidgetArea)
        if not beside or not dock.isVisible() or dock.isFloating():
            return
        most = int(window.width() * INSPECTOR_SHARE)
        width = dock.width()
        if not self.state.value(SIZED_KEY, False, type=bool):
            self.state.setValue(SIZED_KEY, True)
            width = max(width, dock.fontMetrics().averageCharWidth() * FIRST_WIDTH_CHARS)
        if min(width, most) != dock.width():
            window.resizeDocks([dock], [min(width, most)], Qt.Orientation.Horizontal)
