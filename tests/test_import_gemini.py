"""Google Takeout's Gemini activity (My Activity ▸ Gemini Apps as JSON), imported
(``core/foreign_gemini.py``). Before, the file was refused by its name ("which Iris cannot
import yet"). Its questions become chats: by the conversation each names
(``details[].url``), else by time (a new chat after more than 30 minutes); Gemini's reply
is its ``safeHtmlItem`` HTML as text; the records that are no message are counted, and
said. Through the real CLI in-process into a real SQLite store, through ``Host`` and the
window's File ▸ Import. The file is constructed from what open-source readers measured on
real exports (``tests/fixtures/gemini/SOURCES.md``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_foreign_import import exported, imported, threads

from iris_desktop.core.foreign import import_conversations, load_conversations
from iris_desktop.core.foreign_gemini import GAP_S, _tamed, html_text

from support.helpers import one_sentence
from support.helpers import run_cli as run

TAKEOUT = Path(__file__).parent / "fixtures" / "gemini" / "MyActivity.json"
REFUSED = "iris-desktop: import refused, nothing was written: "
SAID = [
    "iris-desktop: imported 4 chats from a Google Takeout Gemini activity file",
    "iris-desktop: 4 Gemini activity records that are not messages were left out: Canvas "
    "documents created, feedback given, drafts chosen and the like.",
    "iris-desktop: 3 questions of the Gemini activity file name no conversation: put into "
    "chats by time, a new chat after more than 30 minutes without a question.",
    "iris-desktop: 1 image was left out: Iris imports text only."]


def record(title: str, time: str, html: str | list[str] | None = None, link: str | None = None) -> dict:
    """A record as Takeout writes one (SOURCES.md)."""
    made = {"header": "Gemini Apps", "title": title, "time": time, "products": ["Gemini Apps"],
            "activityControls": ["Gemini Apps Activity"]}
    if link:
        made["details"] = [{"name": link, "url": link}]
    if html is not None:
        made["safeHtmlItem"] = [{"html": h} for h in ([html] if isinstance(html, str) else html)]
    return made


def said(messages: list[dict]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages]


def written(tmp_path: Path, records: list, name: str = "MyActivity.json") -> Path:
    source = tmp_path / name
    source.write_text(json.dumps(records), encoding="utf-8")
    return source


def test_the_activity_file_becomes_chats_by_conversation_and_by_time(capsys):
    """Two conversations the records name (their questions interleaved in time: each its
    own chat, with its own replies), and three questions of 2025 that name none: the two
    18 minutes apart one chat, the one 2 h 38 min later another. Oldest first (Iris lists
    the newest on top); each message dated by its record; a reply of two ``safeHtmlItem``
    is both, joined; HTML is Markdown-ish text, its script dropped."""
    ids, err = imported(capsys, TAKEOUT)
    assert err.splitlines() == SAID and len(ids) == 4
    chats = [exported(capsys, thread) for thread in ids]
    assert [said(chat)[::2] for chat in chats] == [
        [("user", "How do I start a sourdough loaf?"), ("user", "Shorter, please")],
        [("user", "What is this bird?")],
        [("user", "How do I read a file in Python?"),
         ("user", "And how do I read it line by line without loading it all?")],
        [("user", "Plan three days of walking in the Dolomites in September"),
         ("user", "Make it a table of the three passes")]]
    assert [m.get("created_at") for m in chats[0]] == [
        "2025-03-02T14:12:50+00:00", "2025-03-02T14:12:50+00:00",
        "2025-03-02T14:31:29+00:00", "2025-03-02T14:31:29+00:00"]
    assert chats[0][1]["content"] == (
        "Mix **500 g** flour with 350 g water, rest an hour, then add 100 g active starter and "
        "10 g salt.\n\n1. Fold four times, 30 minutes apart.\n2. Shape, and proof overnight in "
        "the fridge.\n3. Bake at 250 °C.")
    assert chats[2][1]["content"] == (
        "Use the built-in `open()` and *read* it:\n\n```python\nwith open(\"notes.txt\", "
        "encoding=\"utf-8\") as f:\n    text = f.read()\n```\n\nThe **with** block closes the "
        "file — even on an error.")
    assert chats[2][3]["content"].endswith(
        "See [the tutorial](https://docs.python.org/3/tutorial/inputoutput.html).")
    assert chats[3][1]["content"] == (  # (two safeHtmlItem, joined; the script's gone)
        "## Day 1: Cortina\n\n- Morning: **Lago di Sorapis**\n- Afternoon: rest\n\n"
        "## Day 2 & 3\n\n1. Passo Giau\n2. Seceda\n  - take the cable car")
    assert chats[3][3]["content"] == ("Here they are:\n\n| Pass | Length |\n|---|---|\n"
                                      "| Rifugio Lagazuoi | 4.2 km |\n| Passo Giau | 3.1 km |\n"
                                      "| Passo Sella | 2.8 km |")  # (a Markdown table, shown so)
    assert {m.get("imported_from") for chat in chats for m in chat if m["role"] == "assistant"} == {"Gemini"}
    titles = {t["id"]: t["title"] for t in threads(capsys)}
    assert [titles[thread] for thread in ids] == [
        "How do I start a sourdough loaf?", "What is this bird?", "How do I read a file in Python?",
        "Plan three days of walking in the Dolomites in September"]


def test_the_same_file_again_and_a_later_takeout_add_only_what_is_new(capsys, tmp_path):
    """Imported again: every chat known (its messages and times), nothing added. A later
    Takeout, newest first with one more question (another conversation): only that one is
    added. One more question in a chat's conversation makes that chat another one (as a
    continued chat of any app's export does): it is added, the other chats known."""
    first, _ = imported(capsys, TAKEOUT)
    again, err = imported(capsys, TAKEOUT)
    assert again == [] and err.splitlines()[0] == (
        f"iris-desktop: 4 chats were imported before (thread {', '.join(map(str, first))}) and "
        "were not imported again; --again imports them anyway")
    records = json.loads(TAKEOUT.read_text(encoding="utf-8"))
    later = [record("Prompted Which boots for the Dolomites?", "2026-08-02T09:00:00.000Z",
                    "<p>Light hiking boots with a stiff sole.</p>",
                    "https://gemini.google.com/app/e41b7c90d25a3f68")] + records
    added, err = imported(capsys, written(tmp_path, later))
    assert len(added) == 1 and err.splitlines()[:2] == [
        "iris-desktop: imported 1 chat from a Google Takeout Gemini activity file",
        f"iris-desktop: 4 chats were imported before (thread {', '.join(map(str, first))}) and "
        "were not imported again; --again imports them anyway"]
    assert said(exported(capsys, added[0])) == [("user", "Which boots for the Dolomites?"),
                                                ("assistant", "Light hiking boots with a stiff sole.")]
    continued = [record("Prompted And a bigger bird?", "2025-03-02T17:25:00.000Z",
                        "<p>A <b>buzzard</b>.</p>")] + later
    grown, err = imported(capsys, written(tmp_path, continued, "MyActivity (1).json"))
    assert len(grown) == 1 and "4 chats were imported before" in err
    assert said(exported(capsys, grown[0]))[2:] == [("user", "And a bigger bird?"),
                                                    ("assistant", "A **buzzard**.")]
    assert len(threads(capsys)) == 6


def test_host_imports_the_file_into_its_sqlite_store(tmp_path):
    """As the window does: :func:`load_conversations` and :func:`import_conversations`
    on a real Host's store, a real SQLite file; the same file again is known."""
    from iris_desktop.host import Host

    from support.fakes import ScriptedRuntime

    host = Host(tmp_path / "data", runtime=ScriptedRuntime([]), compact=False)
    try:
        loaded = load_conversations(TAKEOUT)
        assert loaded.report() == [line.removeprefix("iris-desktop: ") for line in SAID]
        made = import_conversations(host.store, loaded)
        assert len(made.ids) == 4 and made.known == []
        assert sorted(t["messages"] for t in host.store.threads()) == [2, 4, 4, 4]
        again = import_conversations(host.store, load_conversations(TAKEOUT))
        assert again.ids == [] and sorted(again.known) == sorted(made.ids)
    finally:
        host.close()
    assert (tmp_path / "data").is_dir()


def test_questions_without_a_conversation_are_chats_by_a_gap_of_30_minutes(tmp_path):
    """Not a chat per question: 30 minutes apart are one chat, a second more is the next;
    the file's order (newest first) does not matter, nor a record that is no message
    between them; a question without a time is a chat of its own."""
    assert GAP_S == 30 * 60
    records = [record("Prompted third", "2026-01-01T11:00:01Z", "<p>3</p>"),
               record("Used Gemini Apps", "2026-01-01T10:40:00Z"),
               record("Prompted second", "2026-01-01T10:30:00Z", "<p>2</p>"),
               record("Prompted first", "2026-01-01T10:00:00Z", "<p>1</p>"),
               record("Prompted no time", "", "<p>?</p>")]
    loaded = load_conversations(written(tmp_path, records))
    assert [said(chat.messages)[::2] for chat in loaded.chats] == [
        [("user", "first"), ("user", "second")], [("user", "third")], [("user", "no time")]]
    assert loaded.notes[:2] == [
        "1 Gemini activity record that is not a message was left out: Canvas documents "
        "created, feedback given, drafts chosen and the like.",
        "4 questions of the Gemini activity file name no conversation: put into chats by "
        "time, a new chat after more than 30 minutes without a question."]


def test_a_question_naming_two_conversations_joins_the_one_going_on(tmp_path):
    """A record may name several conversations (91 of 1,980 measured): it goes with the
    first of them an earlier question named; a chat's questions need not be close in time;
    ``titleUrl`` names one too. Titles of other verbs (another language's), kept whole
    where Gemini replied; "Prompted " alone (a picture's question) is no user message."""
    one, two = "https://gemini.google.com/app/1111aaaa2222bbbb", "https://gemini.google.com/app/3333cccc4444dddd"
    both = record("Prompted both", "2026-02-01T09:00:00Z", "<p>b</p>", two)
    both["details"].insert(0, {"name": one, "url": one})
    asked = record("Prompted in two", "2026-01-05T09:00:00Z", "<p>c</p>")
    asked["titleUrl"] = two + "?hl=en"
    records = [both, record("Hai chiesto: ciao", "2026-01-20T09:00:00Z", "<p>Ciao!</p>"), asked,
               record("Prompted ", "2026-01-02T09:00:00Z", "<p>A robin.</p>", one),
               record("Prompted in one", "2026-01-01T09:00:00Z", "<p>a</p>", one)]
    records[3]["imageFile"] = "image_1.png"
    loaded = load_conversations(written(tmp_path, records))
    assert [said(chat.messages) for chat in loaded.chats] == [
        [("user", "in one"), ("assistant", "a"), ("assistant", "A robin."), ("user", "both"),
         ("assistant", "b")],
        [("user", "in two"), ("assistant", "c")],
        [("user", "Hai chiesto: ciao"), ("assistant", "Ciao!")]]


def test_a_file_of_no_questions_and_an_empty_list_are_refused_in_one_sentence(capsys, tmp_path):
    only = written(tmp_path, [record("Gave feedback: Good response", "2026-01-01T00:00:00Z"),
                              record("Created Trip plan", "2026-01-01T00:01:00Z")])
    code, out, err = run(capsys, "import", only)
    assert code == 2 and out == "" and one_sentence(err)
    assert err == (f"{REFUSED}{only}: the Google Takeout Gemini activity file holds no chat with "
                   "a text message (2 Gemini activity records that are not messages were left out: "
                   "Canvas documents created, feedback given, drafts chosen and the like)\n")
    empty = written(tmp_path, [], "empty.json")
    code, out, err = run(capsys, "import", empty)
    assert code == 2 and err == f"{REFUSED}{empty}: no messages\n"
    assert threads(capsys) == []


def test_takeouts_html_variant_is_refused_saying_to_choose_json(capsys, tmp_path):
    """``My Activity.html`` (Takeout's default): not parsed; one sentence says how to get
    the JSON. A card as Takeout writes it (SOURCES.md)."""
    card = ('<div class="outer-cell mdl-cell mdl-cell--12-col mdl-shadow--2dp"><div class="mdl-grid">'
            '<div class="header-cell mdl-cell mdl-cell--12-col"><p class="mdl-typography--title">'
            'Gemini Apps<br></p></div><div class="content-cell mdl-cell mdl-cell--6-col '
            'mdl-typography--body-1">Prompted&nbsp;hello<br>Jul 11, 2026, 12:00:47 PM MDT<br>'
            '<p>Hi!</p></div></div></div>')
    page = tmp_path / "My Activity.html"
    page.write_text(f'<html><head><meta charset="utf-8"><title>My Activity</title></head><body>'
                    f'<div class="mdl-grid">{card * 3}</div></body></html>', encoding="utf-8")
    code, out, err = run(capsys, "import", page)
    assert code == 2 and out == "" and one_sentence(err)
    assert err == (f"{REFUSED}{page}: this is Google Takeout's My Activity page for Gemini (HTML), "
                   "which Iris does not read; export it again choosing JSON as My Activity's format "
                   "in Takeout, and import its MyActivity.json\n")
    other = tmp_path / "page.html"
    other.write_text("<html><body><p>Gemini Apps</p></body></html>")
    code, _, err = run(capsys, "import", other)
    assert code == 2 and one_sentence(err) and "My Activity page" not in err


# -- hostile replies ----------------------------------------------------------------------------


def test_ten_thousand_nested_tags_and_a_5_mb_reply_are_imported(capsys, tmp_path):
    """No recursion, no indent of 10,000 levels, nothing dropped; a reply of 5 MB is
    imported whole (into the real store) and read back."""
    deep = ("<div><blockquote>" * 5_000 + "<b><i><code>" * 3_000 + "deep" + "</code></i></b>" * 3_000
            + "</blockquote></div>" * 5_000)
    lists = "<ul><li>" * 10_000 + "leaf" + "</li></ul>" * 10_000
    big = "<p>" + "word <b>bold</b> &amp; " * 230_000 + "</p>"
    assert len(big) > 5_000_000
    source = written(tmp_path, [record("Prompted big", "2026-01-01T10:02:00Z", big),
                                record("Prompted lists", "2026-01-01T10:01:00Z", lists),
                                record("Prompted deep", "2026-01-01T10:00:00Z", deep)])
    ids, err = imported(capsys, source)
    assert len(ids) == 1 and err.splitlines()[0].endswith("imported 1 chat from a Google "
                                                          "Takeout Gemini activity file")
    messages = exported(capsys, ids[0])
    assert messages[1]["content"] == "> ***`deep`***"
    leaf = messages[3]["content"].splitlines()
    assert len(leaf) == 10_000 and leaf[-1] == " " * 12 + "- leaf" and max(map(len, leaf)) == 18
    assert messages[5]["content"] == " ".join(["word **bold** &"] * 230_000)


@pytest.mark.parametrize("html,text", [
    ("<!--" * 200_000, ""),                          # an unclosed comment, 200,000 times
    ("<p>kept</p><!-- unclosed" + "<b>x" * 1_000, "kept"),  # (hides the rest, as in a browser)
    ("<a href='" * 200_000, "<a href='" * 200_000),  # a tag never closed
    ("<![CDATA[" * 100_000 + ">", "<![CDATA[" * 99_999),  # (the last one closes: dropped)
    ("<" * 1_000_000, "<" * 1_000_000),
    ("<?x" * 100_000, "<?x" * 100_000),
    ("<p>a < b and c > d</p>", "a < b and c > d"),
    ("<p>&lt;script&gt; is text</p><script>alert(1)</script><style>p {}</style>ok", "<script> is text\n\nok"),
])
def test_what_python_html_parser_reads_in_quadratic_time_is_tamed_first(html, text):
    """Python 3.11's html.parser reads an unclosed ``<!--`` or ``<a href='`` repeated in
    time growing with the square of the length (87 s for 1.6 MB): :func:`_tamed` leaves it
    nothing that is not closed before the next ``<`` (what is counted here, not timed),
    and the text is still right."""
    tamed = _tamed(html)
    opened = [i for i, c in enumerate(tamed) if c == "<"]
    assert all(tamed.find(">", i) >= 0 and (tamed.find("<", i + 1) < 0 or tamed.find(">", i)
                                           < tamed.find("<", i + 1)) for i in opened[:2_000])
    assert "<!" not in tamed and "<?" not in tamed
    assert html_text(html)[0] == text


# -- the window ---------------------------------------------------------------------------------


def test_file_import_in_the_window_reads_the_activity_file(qtbot, tmp_path, monkeypatch):
    """File ▸ Import conversation… with the Takeout file (offscreen): four chats listed,
    the newest open, the import's sentence shown."""
    pytest.importorskip("pytestqt")
    from iris_desktop.host import Host
    from iris_desktop.ui import thread_control
    from iris_desktop.ui.main_window import main_window

    from support.fakes import ScriptedRuntime

    monkeypatch.setattr(thread_control.QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(TAKEOUT), "")))
    host = Host(tmp_path / "data", runtime=ScriptedRuntime([]), compact=False)
    window = main_window(host)
    qtbot.addWidget(window)
    try:
        qtbot.waitUntil(lambda: window.model_state == "ready", timeout=10_000)
        shown: list[str] = []
        window.app_state.statusMessage.connect(lambda text, _ms: shown.append(text))
        window.menus.actions["import"].trigger()
        qtbot.waitUntil(lambda: window.threads.list.count() == 4 and window.thread_id is not None
                        and len(window.view.transcript.entries()) == 4, timeout=10_000)
        assert any(text.startswith("Imported 4 chats from a Google Takeout Gemini activity file.")
                   and "put into chats by time" in text for text in shown), shown
        newest = host.store.newest_thread_id([t["id"] for t in host.store.threads()])
        assert window.thread_id == newest
        assert host.store.threads() and {t["title"] for t in host.store.threads()} >= {
            "Plan three days of walking in the Dolomites in September"}
    finally:
        window.shutdown()
        host.close()
