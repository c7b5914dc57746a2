"""The window's sentence after an import, in a real window (offscreen): an OpenAI message
list whose broken character was mended (session 66's review: its status read "1 broken
character … was replaced with �.." and never said the file was imported); a plain list
is said as before."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pytestqt")

from support.windows import settle  # noqa: E402


def imported_sentence(window, qtbot, source, word: str) -> str:
    shown: list[str] = []
    window.app_state.statusMessage.connect(lambda text, _ms: shown.append(text))
    window.threads_control.import_file(str(source))
    qtbot.waitUntil(lambda: window.threads.list.count() == 1, timeout=20_000)
    settle(qtbot, window)
    qtbot.waitUntil(lambda: any(word in t for t in shown), timeout=10_000)
    return next(t for t in shown if word in t)


def test_a_mended_message_list_says_it_was_imported_and_what_was_mended(make_window, qtbot, tmp_path):
    source = tmp_path / "lone.json"
    source.write_text('[{"role":"user","content":"hi \\ud83d there"},{"role":"assistant","content":"yo"}]')
    said = imported_sentence(make_window(), qtbot, source, "replaced")
    assert said.startswith("Imported lone.json. 1 broken character"), said
    assert ".." not in said and said.endswith("."), said


def test_a_plain_message_list_is_said_as_before(make_window, qtbot, tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]))
    assert imported_sentence(make_window(), qtbot, plain, "Imported") == "Imported plain.json."


def test_a_refused_import_says_why_in_a_box_of_whole_sentences(make_window, qtbot, tmp_path):
    """A newcomer audit (session 66): the box for a Windows-1252 file read "…save it as
    UTF-8 and import that file" with no full stop, and in words that did not say how."""
    from PySide6.QtWidgets import QMessageBox

    source = tmp_path / "cp1252-chats.json"
    source.write_bytes(json.dumps([{"role": "user", "content": "Un café ?"}], ensure_ascii=False)
                       .encode("cp1252"))
    window = make_window()
    window.threads_control.import_file(str(source))
    qtbot.waitUntil(lambda: bool(window.findChildren(QMessageBox, "failure")), timeout=20_000)
    box = window.findChildren(QMessageBox, "failure")[-1]
    assert box.windowTitle() == "Import failed"
    assert box.text().endswith("it looks like Windows-1252 text; open it in a text editor, save it "
                               "as UTF-8 and import that copy."), box.text()
    box.close()
