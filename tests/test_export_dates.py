"""An export keeps the chat's place in the list (an audit): a chat whose messages carry no
time (ChatGPT Exporter's files) exported as JSON and imported into another data folder
was listed at the time of that import; its export wrote no time of the thread."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from iris_desktop.core.store import Store
from iris_desktop.paths import app_paths

from conftest import FIXTURES
from support.helpers import one_sentence, run_cli

UNDATED = FIXTURES / "foreign" / "chatgpt" / "chatgpt-exporter-image-generation.json"
BEGAN = dt.datetime(2024, 3, 1, 9, 30, 15, 250_000).timestamp()
LAST = dt.datetime(2024, 3, 2, 18, 5, 0, 500_000).timestamp()


def times(store: Store, thread: int) -> tuple[float, float]:
    row = store.thread(thread)
    return row["created_at"], row["updated_at"]


def listed(store: Store) -> list[str]:
    return [t["title"] for t in store.threads()]


def test_an_undated_chat_keeps_its_place_through_a_json_export_and_import(capsys, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    code, out, err = run_cli(capsys, "--data-dir", first, "import", UNDATED)
    assert code == 0, err
    thread = int(out)
    with Store(first / "iris.db") as store:
        assert all(m["sent_at"] is None for m in store.messages(thread))  # no time said
        store.date_thread(thread, BEGAN, LAST)  # imported a while ago
    code, out, err = run_cli(capsys, "--data-dir", first, "export", thread, "-o", tmp_path / "e.json")
    assert code == 0, err
    exported = json.loads((tmp_path / "e.json").read_text())
    assert dt.datetime.fromisoformat(exported["created_at"]).timestamp() == pytest.approx(BEGAN, abs=1e-3)
    assert dt.datetime.fromisoformat(exported["updated_at"]).timestamp() == pytest.approx(LAST, abs=1e-3)
    with Store(app_paths(second).ensure().db_path) as store:
        older = store.create_thread("older")
        store.date_thread(older, BEGAN - 86_400 * 30, BEGAN - 86_400 * 30)
        store.add_message(store.create_thread("newer"), {"role": "user", "content": "hi"})
    code, out, err = run_cli(capsys, "--data-dir", second, "import", tmp_path / "e.json")
    assert code == 0, err
    copy = int(out)
    with Store(second / "iris.db") as store:
        assert times(store, copy) == (pytest.approx(BEGAN, abs=1e-3), pytest.approx(LAST, abs=1e-3))
        assert listed(store) == ["newer", "Fixture", "older"]  # not above "newer"
    # the same export again, here or where it came from: known, not stored twice
    for folder, twin in ((second, copy), (first, thread)):
        code, out, err = run_cli(capsys, "--data-dir", folder, "import", tmp_path / "e.json")
        assert code == 0 and out == "" and f"1 chat was imported before (thread {twin})" in err, err
    code, out, err = run_cli(capsys, "--data-dir", second, "export", copy)
    again = json.loads(out)
    assert (again["created_at"], again["updated_at"]) == (exported["created_at"], exported["updated_at"])


def test_a_chat_with_branches_keeps_its_place_too(tmp_path):
    from iris_desktop.core.conversation import export_messages, write_private
    from iris_desktop.core.foreign import import_conversations, load_conversations

    with Store(tmp_path / "a.db") as store:
        thread = store.create_thread("two answers")
        question, _ = store.add_messages(thread, [{"role": "user", "content": "Which way?"},
                                                  {"role": "assistant", "content": "Left."}])
        store.add_messages(thread, [{"role": "assistant", "content": "Right."}], parent_id=question)
        store.date_thread(thread, BEGAN, LAST)
        write_private(tmp_path / "tree.json", json.dumps(export_messages(store, thread)))
    with Store(tmp_path / "b.db") as store:
        [copy] = import_conversations(store, load_conversations(tmp_path / "tree.json")).ids
        assert times(store, copy) == (pytest.approx(BEGAN, abs=1e-3), pytest.approx(LAST, abs=1e-3))
        assert len(store.all_messages(copy)) == 3


@pytest.mark.parametrize("head", [
    {},  # an export written before the thread's times were
    {"created_at": "not a time", "updated_at": "2024-03-02T18:05:00"},
    {"created_at": 99_999_999_999_999},  # the year 5138
    {"created_at": True},
    {"updated_at": [2024]},
    {"created_at": 0, "updated_at": 0},  # a placeholder: the chat was listed last, in 1970
    {"created_at": -86_400},
])
def test_an_export_without_usable_thread_times_is_dated_by_its_messages_as_before(
        capsys, tmp_path, head):
    dated = [{"role": "user", "content": "Plan the trip", "created_at": "2023-05-01T10:00:00+00:00"},
             {"role": "assistant", "content": "Day one: Lisbon", "created_at": "2023-05-01T10:01:00+00:00"}]
    undated = [{"role": m["role"], "content": m["content"] + " (again)"} for m in dated]
    for name, messages in (("dated", dated), ("undated", undated)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"title": name, **head, "messages": messages}))
        before = dt.datetime.now().timestamp()
        code, out, err = run_cli(capsys, "--data-dir", tmp_path / "data", "import", path)
        assert code == 0 and "Traceback" not in err, err
        assert err == "" or one_sentence(err), err
        with Store(tmp_path / "data" / "iris.db") as store:
            began, last = times(store, int(out))
        if name == "dated":
            assert (began, last) == (dt.datetime(2023, 5, 1, 10, 0, tzinfo=dt.UTC).timestamp(),
                                     dt.datetime(2023, 5, 1, 10, 1, tzinfo=dt.UTC).timestamp())
        else:  # nothing says when: when it came in
            assert before - 1 <= began <= last
