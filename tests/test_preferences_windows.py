"""Preferences' two windows: the context the model is loaded with (``model.n_ctx``) and the
part of it Iris budgets (``context.window``), and a meter that a chat too large for the
values shown left empty. The real bundled model, a real history and settings file on a
fresh data folder, the real dialog edited as a user does (pytest-qt, offscreen); every
number the dialog's meter shows is compared with ``iris-desktop context --json`` run on
the same chat with the same candidate values (``--set``)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QLabel  # noqa: E402

from iris_desktop.paths import app_paths  # noqa: E402
from iris_desktop.settings import write_config_value  # noqa: E402

from support.helpers import chat_turns as chat  # noqa: E402
from support.helpers import run_cli  # noqa: E402
from support.windows import open_preferences, settle  # noqa: E402

#: the meter's numbers and what ``context --json`` calls them
REPORT_KEYS = {"window": "window", "budget": "budget", "system": "system_tokens",
               "tools": "tool_tokens", "summary": "summary_tokens", "recall": "recall_tokens",
               "history": "history_tokens", "draft": "draft_tokens", "available": "available",
               "free": "free", "threshold": "threshold_tokens"}




def type_into(qtbot, dialog, spin, text: str) -> None:
    """Type ``text`` over the spin box's value and leave it with Tab, as a user does; wait
    for the budget those values give."""
    before = dialog.last_preview
    spin.setFocus()
    spin.selectAll()
    qtbot.keyClicks(spin, text)
    qtbot.keyClick(spin, Qt.Key.Key_Tab)
    qtbot.waitUntil(lambda: dialog.last_preview is not before or not dialog.ok_button.isEnabled(),
                    timeout=10_000)


def engine_says(capsys, data_dir, thread, **candidate) -> tuple[int, dict]:
    """``iris-desktop context N --json`` with the candidate values (``--set``): (exit code,
    the JSON)."""
    sets = [arg for key, value in candidate.items() for arg in ("--set", f"{key}={value}")]
    code, out, _ = run_cli(capsys, "--data-dir", data_dir, *sets, "context", thread,
                           "--json")
    return code, json.loads(out)


def assert_meter_is_the_engines(meter, report) -> None:
    b = meter.breakdown
    assert {k: b[k] for k in REPORT_KEYS} == {k: report[v] for k, v in REPORT_KEYS.items()}
    assert b["ratio"] == report["token_budget_ratio"]
    assert b["used"] == report["predicted_prompt_tokens"]
    assert meter.estimated is not report["prompt_exact"]


@pytest.fixture
def window_on(make_window, qtbot, data_dir, model_path):
    def make(messages, **config):
        from iris_desktop.core.store import Store

        path = app_paths(data_dir).ensure()
        for key, value in {"model.path": str(model_path), "context.recall_semantic": False,
                           **config}.items():
            write_config_value(path.config_path, key, value)
        with Store(path.db_path) as store:
            thread = store.create_thread("seeded")
            store.add_messages(thread, messages)
        window = make_window(None)
        assert window.model_state == "ready", window.models.error
        window.open_thread(thread)
        settle(qtbot, window)
        return window, thread
    return make


def test_a_window_below_the_models_n_ctx_is_said_with_it_and_the_meter_is_the_engines(
        window_on, qtbot, capsys, data_dir):
    """Before: with context.window 4,096 below the loaded model's n_ctx of 8,192, the
    status bar said "8,192-token window" beside a meter of 4,096, and Preferences said
    only "Window 4,096 tokens (config)". Now Preferences says both in one line as the
    window is typed (and the meter beside the status bar's label says it in its tooltip),
    and every number of the dialog's meter is what `context --json` gives for that chat
    and those values."""
    window, thread = window_on(chat(6))
    dialog = open_preferences(window, qtbot)
    line = dialog.findChild(QLabel, "window-line")
    assert line.isVisible() and line.text() == (
        "Model loaded at 8,192 tokens (model.n_ctx); Iris uses all of them "
        "(context.window: auto).")
    code, report = engine_says(capsys, data_dir, thread)
    assert code == 0
    assert_meter_is_the_engines(dialog.meter, report)

    type_into(qtbot, dialog, dialog.fields["context.window"].editor.spin, "4096")
    qtbot.waitUntil(lambda: dialog.last_preview.window == 4096, timeout=10_000)
    assert line.text() == ("Model loaded at 8,192 tokens (model.n_ctx); Iris uses 4,096 of "
                           "them (context.window).")
    assert dialog.meter.breakdown["window"] == 4096
    assert line.text() in dialog.meter.toolTip()
    code, report = engine_says(capsys, data_dir, thread, **{"context.window": 4096})
    assert code == 0 and report["window"] == 4096
    assert_meter_is_the_engines(dialog.meter, report)
    # the ratio too: each figure is the engine's for the values shown, before Apply
    type_into(qtbot, dialog, dialog.fields["context.token_budget_ratio"].editor.spin, "0.5")
    qtbot.waitUntil(lambda: dialog.last_preview.ratio == 0.5, timeout=10_000)
    code, report = engine_says(capsys, data_dir, thread, **{"context.window": 4096,
                                                            "context.token_budget_ratio": 0.5})
    assert_meter_is_the_engines(dialog.meter, report)

    label = window.models.model_label
    assert label.text().endswith("· 8,192-token window · CPU"), label.text()
    assert dialog.apply()  # in force: the window's meter and the status bar's label say both
    qtbot.waitUntil(lambda: window.meter.breakdown is not None
                    and window.meter.breakdown["window"] == 4096, timeout=10_000)
    settle(qtbot, window)
    assert line.text() in window.meter.toolTip()
    # the label beside the meter follows (it said "8,192-token window" beside 4,096)
    qtbot.waitUntil(lambda: "· 4,096 of 8,192 tokens ·" in label.text(), timeout=10_000)
    dialog.reject()


def test_a_candidate_n_ctx_below_the_window_is_worded_as_the_candidate(
        window_on, qtbot, capsys, data_dir):
    """Before: model.n_ctx lowered to 2,048 in Preferences, with context.window 4,096,
    marked context.window on the Context page with "more than the loaded model's n_ctx
    of 2,048" (the loaded model holds 8,192) and nothing at the field just edited. Now
    model.n_ctx itself says what the reload would give, OK stays disabled as before, and
    once the window fits, the line and the meter are those of the reloaded model."""
    window, thread = window_on(chat(6), **{"context.window": 4096})
    dialog = open_preferences(window, qtbot)
    n_ctx = dialog.fields["model.n_ctx"]
    type_into(qtbot, dialog, n_ctx.editor.spin, "2048")
    qtbot.waitUntil(lambda: not dialog.ok_button.isEnabled(), timeout=10_000)
    assert n_ctx.error.text() == (
        "The model would reload at 2,048 tokens, fewer than context.window's "
        "4,096; use 4,096 or more, or lower context.window")
    assert not any("loaded model" in error for error in dialog.errors.values())
    assert "context.window" not in dialog.errors  # not edited: the field edited says it
    type_into(qtbot, dialog, dialog.fields["context.window"].editor.spin, "2048")
    qtbot.waitUntil(dialog.ok_button.isEnabled, timeout=10_000)
    qtbot.waitUntil(lambda: dialog.last_preview.window == 2048, timeout=10_000)
    assert not dialog.errors and not n_ctx.error.isVisible()
    line = dialog.findChild(QLabel, "window-line")
    assert line.text() == ("The model would reload at 2,048 tokens (model.n_ctx); Iris uses "
                           "all of them (context.window).")
    code, report = engine_says(capsys, data_dir, thread,
                               **{"model.n_ctx": 2048, "context.window": 2048})
    assert code == 0
    assert_meter_is_the_engines(dialog.meter, report)
    # the window raised past the reload's n_ctx: said at both fields, both edited here
    type_into(qtbot, dialog, dialog.fields["context.window"].editor.spin, "3000")
    qtbot.waitUntil(lambda: not dialog.ok_button.isEnabled(), timeout=10_000)
    assert dialog.errors["context.window"] == (
        "context.window: 3,000 tokens is more than the 2,048 tokens the model would reload at "
        "(model.n_ctx); lower it, or raise model.n_ctx")
    assert dialog.errors["model.n_ctx"].startswith("model.n_ctx: the model would reload at 2,048")
    dialog.reject()


def test_a_window_too_small_for_the_chat_says_why_in_the_meter(window_on, qtbot, capsys,
                                                               data_dir):
    """Before: context.window lowered so that the chat's system prompt and last turn no
    longer fit emptied the dialog's meter without a sentence (only the inspector said
    why), and once applied, the window's meter too. Now the dialog's meter and the line
    under it say the engine's reason, with what to do, the window's meter says the reason
    in its bar, and the bars come back when the window fits again."""
    messages = chat(2)
    messages[-2]["content"] = "please read this: " + "word " * 1200
    window, thread = window_on(messages)
    dialog = open_preferences(window, qtbot)
    assert dialog.meter.breakdown is not None
    problem = dialog.findChild(QLabel, "meter-problem")
    assert not problem.isVisible()
    type_into(qtbot, dialog, dialog.fields["context.window"].editor.spin, "1024")
    qtbot.waitUntil(lambda: dialog.last_preview.window == 1024, timeout=10_000)
    code, report = engine_says(capsys, data_dir, thread, **{"context.window": 1024})
    assert code == 3 and report["error"] == "too_large"
    expected = (f"Conversation too large: {report['message']}; raise context.window or "
                "context.token_budget_ratio for this chat to fit.")
    assert problem.isVisible() and problem.text() == expected
    assert dialog.meter.breakdown is None and dialog.meter.problem  # said in the bar too
    assert dialog.meter.accessibleDescription() == expected
    assert report["message"] not in dialog.breakdown.text()  # said once, under the bar
    assert dialog.apply()  # in force: the window's meter says it in its bar, not empty
    qtbot.waitUntil(lambda: window.meter.problem != "", timeout=10_000)
    assert window.meter.problem == f"Conversation too large: {report['message']}"
    assert window.meter.breakdown is None
    type_into(qtbot, dialog, dialog.fields["context.window"].editor.spin, "4096")
    qtbot.waitUntil(lambda: dialog.meter.breakdown is not None, timeout=10_000)
    assert not problem.isVisible() and not dialog.meter.problem
    assert dialog.apply()
    qtbot.waitUntil(lambda: window.meter.breakdown is not None, timeout=10_000)
    assert not window.meter.problem
    code, report = engine_says(capsys, data_dir, thread, **{"context.window": 4096})
    assert_meter_is_the_engines(dialog.meter, report)
    dialog.reject()


def test_the_line_names_where_each_number_comes_from():
    """The line's words for each source of the model's context (no display needed)."""
    from iris_desktop.ui.window_words import reload_problems, window_line

    assert window_line(4096, 4096, 8192, "server") == (
        "The server runs the model at 8,192 tokens; Iris uses 4,096 of them (context.window).")
    assert window_line(2048, "auto", 2048, "load") == (
        "The model would load at 2,048 tokens (model.n_ctx); Iris uses all of them "
        "(context.window: auto).")
    assert window_line(8192, "auto", None, "") == (
        "Window: 8,192 tokens (model.n_ctx; no model is loaded).")
    assert window_line(4096, 4096, None, "other") == "Window: 4,096 tokens (context.window)."
    current = {"context.window": 4096, "model.n_ctx": 8192}
    assert reload_problems({"context.window": 4096, "model.n_ctx": 2048}, current, 2048,
                           "load") == {"model.n_ctx": (
        "model.n_ctx: the model would load at 2,048 tokens, fewer than context.window's "
        "4,096; use 4,096 or more, or lower context.window")}
