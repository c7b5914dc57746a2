"""Two Iris processes on one data folder: a command whose chat another deletes while it
runs, and a delete beside another program reading the history. The other process is a
second connection to the same real SQLite file, made at the moment the audit found."""

from __future__ import annotations

import importlib
import sqlite3
from pathlib import Path

import pytest

from iris_desktop.core.store import Store

from support.helpers import one_sentence, run_cli

PLANTED = "quokka-zanzibar-4711"


def _history(capsys, tmp_path: Path, messages: int = 12) -> tuple[Path, int]:
    """A data folder whose history holds one chat of ``messages`` messages."""
    data = tmp_path / "home"
    assert run_cli(capsys, "--data-dir", data, "threads")[0] == 0  # makes the database
    with Store(data / "iris.db") as store:
        thread = store.create_thread("Holiday notes")
        store.add_messages(thread, [
            {"role": "user" if i % 2 == 0 else "assistant",
             "content": f"message {i} about the {PLANTED} trip"} for i in range(messages)])
    return data, thread


def _delete_elsewhere(db: Path, thread: int) -> None:
    """Another Iris process deletes the chat (its own connection, committed)."""
    with Store(db) as other:
        other.delete_thread(thread)


def _gone_said(code: int, err: str, thread: int) -> None:
    assert code == 1, err
    assert one_sentence(err), err
    assert f"no thread {thread}" in err and "deleted by another Iris window or command" in err
    assert "bug" not in err and "unexpected" not in err


def test_context_of_a_chat_deleted_while_the_model_loads_says_so(capsys, tmp_path, monkeypatch):
    """Before: "unexpected error (ThreadGone: no thread N); this is a bug in Iris", from the
    engine's first read of a chat deleted after the command checked it was there."""
    context = importlib.import_module("iris_desktop.commands.context")  # (the package's
    # ``context`` is the command's function)
    data, thread = _history(capsys, tmp_path)
    loads = []

    def load_meanwhile(host, args):  # the model loads: another process deletes the chat
        loads.append(thread)
        _delete_elsewhere(data / "iris.db", thread)

    monkeypatch.setattr(context, "_maybe_load_model", load_meanwhile)
    code, out, err = run_cli(capsys, "--data-dir", data, "context", thread, "--no-model")
    assert loads == [thread]
    _gone_said(code, err, thread)
    assert out == ""


def test_a_delete_of_a_chat_another_process_deleted_first_says_so(capsys, tmp_path, monkeypatch):
    """Two deletes of one chat at once (a window's and a command's): the later one said
    "unexpected error (ThreadGone …); this is a bug in Iris"."""
    data, thread = _history(capsys, tmp_path)
    counted = Store.message_count

    def count_meanwhile(store, thread_id, *args, **kwargs):  # read after the check
        result = counted(store, thread_id, *args, **kwargs)
        _delete_elsewhere(data / "iris.db", thread_id)
        return result

    monkeypatch.setattr(Store, "message_count", count_meanwhile)
    code, out, err = run_cli(capsys, "--data-dir", data, "delete", thread, "--yes")
    _gone_said(code, err, thread)
    assert out == ""


@pytest.mark.parametrize("fmt", ["json", "md"])
def test_an_export_racing_a_delete_is_refused_and_keeps_the_earlier_file(
        capsys, tmp_path, monkeypatch, fmt):
    """Before: the title with no message, exit 0, "exported thread N", and with -o the
    empty export replaced an earlier good one."""
    data, thread = _history(capsys, tmp_path)
    target = tmp_path / f"notes.{fmt}"
    code, _, err = run_cli(capsys, "--data-dir", data, "export", thread, "--format", fmt,
                           "-o", target)
    assert code == 0, err
    good = target.read_bytes()
    assert PLANTED.encode() in good

    reads = []
    cut_off = Store.cut_off_replies

    def read_after_a_delete(store, thread_id):  # a statement after the title's
        if not reads:
            _delete_elsewhere(data / "iris.db", thread_id)
        reads.append(thread_id)
        return cut_off(store, thread_id)

    monkeypatch.setattr(Store, "cut_off_replies", read_after_a_delete)
    code, out, err = run_cli(capsys, "--data-dir", data, "export", thread, "--format", fmt,
                             "-o", target)
    assert reads, "the export read no cut-off replies"
    _gone_said(code, err, thread)
    assert "exported" not in err and out == ""
    assert target.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("notes")) == [target.name]


def _files_holding(folder: Path, text: bytes) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and text in p.read_bytes())


def test_a_delete_beside_a_reader_says_its_text_stays_until_the_next_open(
        capsys, tmp_path, monkeypatch):
    """Before: "deleted", exit 0, and the chat's text readable in iris.db (the truncating
    checkpoint was refused by the reader's snapshot, and its answer thrown away), with
    nothing to overwrite it later."""
    monkeypatch.setattr("iris_desktop.core.store.BUSY_TIMEOUT_S", 0.2)  # (not 10 s per wait)
    data, thread = _history(capsys, tmp_path, messages=40)
    db = data / "iris.db"
    assert _files_holding(data, PLANTED.encode()) == ["iris.db"]
    window = sqlite3.connect(db)  # another process with the history open (idle)
    reader = sqlite3.connect(db, isolation_level=None)  # another program reading it
    try:
        window.execute("SELECT count(*) FROM threads").fetchone()
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM messages").fetchone()[0] == 40
        code, out, err = run_cli(capsys, "--data-dir", data, "delete", thread, "--yes")
        assert code == 0, err
        assert out.startswith(f"deleted thread {thread}")
        assert one_sentence(err), err
        assert "deleted" in err and "stays readable in iris.db" in err
        assert "another program reading the history" in err
        with Store(db) as store:  # the chat is gone for every reader after the delete
            with pytest.raises(KeyError):
                store.thread(thread)
        reader.execute("COMMIT")
        reader.close()
        assert _files_holding(data, PLANTED.encode()), "nothing was left to overwrite"
        code, _, err = run_cli(capsys, "--data-dir", data, "threads")  # the next command
        assert code == 0, err
        assert _files_holding(data, PLANTED.encode()) == []
        assert not (data / "iris.db-wipe").exists()
    finally:
        reader.close()
        window.close()


def test_the_window_says_a_delete_beside_a_reader_leaves_its_text_for_now(
        make_window, qtbot, data_dir, monkeypatch):
    """The window's delete, as the CLI's: before, the chat left the list and nothing said
    its text was still readable in iris.db."""
    pytest.importorskip("pytestqt")
    from PySide6.QtWidgets import QMessageBox

    from iris_desktop.paths import app_paths

    from support.fakes import ScriptedRuntime

    monkeypatch.setattr("iris_desktop.core.store.BUSY_TIMEOUT_S", 0.2)
    db = app_paths(data_dir).ensure().db_path
    with Store(db) as store:
        kept, plans = store.create_thread("Shopping"), store.create_thread("Holiday plans")
        for thread in (kept, plans):
            store.add_messages(thread, [{"role": "user", "content": f"the {PLANTED} trip"},
                                        {"role": "assistant", "content": "noted"}])
    window = make_window(ScriptedRuntime([]))
    qtbot.waitUntil(lambda: window.threads.list.count() == 2, timeout=5_000)
    reader = sqlite3.connect(db, isolation_level=None)  # another program reading
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM messages").fetchone()
        window.threads_control.delete_thread(plans)

        def boxes():
            return [b for b in window.findChildren(QMessageBox, "failure") if b.isVisible()]

        qtbot.waitUntil(lambda: bool(boxes()), timeout=10_000)
    finally:
        reader.close()
    box = boxes()[0]
    assert box.windowTitle() == "Chat deleted"
    assert box.text().startswith("“Holiday plans” was deleted, but not everything kept for it.")
    assert "stays readable in iris.db until another program reading the history" in box.text()
    qtbot.waitUntil(lambda: window.threads.list.count() == 1, timeout=10_000)
    box.close()
