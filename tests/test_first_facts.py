"""Issue #44's last compaction promise: when turns must still be dropped, the first facts
of the chat (the names, numbers and requests of its earliest turns) go into the summary
first, and the window says in full, never cut off, what was dropped and why.

Real SQLite stores, the extractive summarizer for real, the scripted runtime where the
model writes the summary."""

from __future__ import annotations

import json
import random

import pytest

from iris_desktop.core.config import ContextParams
from iris_desktop.core.engine import ContextEngine
from iris_desktop.core.extractive import ExtractiveSummarizer
from iris_desktop.core.records import said_from_row
from iris_desktop.core.store import Store
from iris_desktop.core.summary import ConversationSummary
from iris_desktop.core.views import (
    budget_preview,
    dropped_report,
    dropped_status,
    inspector_report,
)
from iris_desktop.host import Host
from iris_desktop.tokens import HeuristicCounter

from support.fakes import ScriptedRuntime
from support.helpers import compactor_for, llm_json, run_cli

FIRST_TURN = [
    {"role": "user", "content": "Hello there. My name is Wiebke Okonkwo and I need to move my "
                                "piano to Aarhus on 14 March. Please keep my budget of 2,300 "
                                "euros in mind."},
    {"role": "assistant", "content": "Of course. A piano needs a specialist mover, so I will "
                                     "look for firms that can do it."},
]
#: what the first turn said, as the summary must still say it
FIRST_FACTS = ("Wiebke Okonkwo", "piano to Aarhus on 14 March", "budget of 2,300 euros")


def params(window=4096, **kw):
    return ContextParams(window=window, system_prompt="You are Iris.", **kw)


def later_turns(n: int, seed: int = 7) -> list[dict]:
    """Turns full of facts denser than the first turn's: a name, a sum, a train and a
    made-up place in every message, so a summary ranked by density alone prefers them."""
    rng = random.Random(seed)
    syllables = "ka lo mi ra te su no vi pe da zu fo".split()
    names = "Ilse Kofi Marta Jonas Teodor Annika Rui Sven Olga Piet".split()

    def word() -> str:
        return "".join(rng.choice(syllables) for _ in range(3))

    messages = []
    for i in range(n):
        a, b = rng.sample(names, 2)
        messages += [
            {"role": "user", "content": f"{a} Berg paid {i * 37 + 11} kroner to {b} for the "
                                        f"{word()} {word()} on {i % 28 + 1} April. {b} then "
                                        f"took train {i * 3 + 100} to {word().title()}."},
            {"role": "assistant", "content": f"Noted: {a} paid {i * 37 + 11} kroner and {b} "
                                             f"took train {i * 3 + 100}."},
        ]
    return messages


def user_message_of(counter, tokens: int) -> dict:
    """A pasted list that costs ``tokens`` tokens as a user message."""
    text = "Here is the whole inventory list to check: "
    while counter.count_message({"role": "user", "content": text + "lamp, "}) <= tokens:
        text += "lamp, "
    return {"role": "user", "content": text}


def thread_leaving_room(store: Store, counter, p: ContextParams, room: int,
                        turns: int = 40) -> int:
    """The first turn, ``turns`` later ones, and a newest turn so large that the budget
    leaves about ``room`` tokens for a summary beside it: the older turns must go, and
    the summary must be cut to what is left."""
    thread = store.create_thread("first facts")
    store.add_messages(thread, FIRST_TURN + later_turns(turns))
    frame = ContextEngine(store, counter, p).frame(thread)
    newest = frame.history_budget - room - 16  # the compactor keeps 16 tokens of slack
    store.add_messages(thread, [user_message_of(counter, newest)])
    return thread


def assert_first_facts(text: str) -> None:
    missing = [fact for fact in FIRST_FACTS if fact not in text]
    assert not missing, f"the first facts {missing} are not in the summary:\n{text}"


# -- the first facts go into the summary first --------------------------------------------


def test_a_summary_cut_to_the_room_a_large_turn_leaves_keeps_the_first_facts(fresh_store):
    """Before: a newest turn that leaves ~80 tokens for the summary made the extractive
    summary all narrative and fields ("In turns 1–41 the user wrote 41 messages…"): the
    name, the date and the budget of the first turn were gone."""
    counter = HeuristicCounter()
    p = params()
    thread = thread_leaving_room(fresh_store, counter, p, room=80)
    engine = ContextEngine(fresh_store, counter, p)
    assert engine.build(thread).dropped_turns > 0  # the older turns must go
    event = compactor_for(fresh_store, counter, p).compact(thread, "budget")
    assert event.outcome == "ok" and event.path == "extractive", event.describe()
    row = fresh_store.latest_summary(thread)
    summary = ConversationSummary.from_fields(row.fields)
    assert counter.count_text(row.text) <= 80
    assert_first_facts(row.text)
    assert summary.first_facts >= 2 and summary.facts[0].startswith("User: My name is Wiebke")
    request = engine.build(thread)
    assert request.dropped_turns == 0 and "Wiebke Okonkwo" in request.messages[0]["content"]


def test_the_models_summary_gets_the_first_facts_first_too(fresh_store):
    """The model writes the eight fields; the ledger still opens with the first facts
    (before: the model's narrative took the room and the ledger held later facts)."""
    counter = HeuristicCounter()
    p = params()
    thread = thread_leaving_room(fresh_store, counter, p, room=160)
    runtime = ScriptedRuntime([llm_json(words=90)] * 4)
    event = compactor_for(fresh_store, counter, p, runtime=runtime).compact(thread, "budget")
    assert event.outcome == "ok" and event.path == "llm", event.describe()
    row = fresh_store.latest_summary(thread)
    assert row.text.startswith("Summary: fact0")  # the model's narrative is kept
    assert_first_facts(row.text)
    assert ConversationSummary.from_fields(row.fields).first_facts >= 2


def test_the_first_facts_are_carried_along_the_chain_and_cut_last(fresh_store):
    """Five compactions, each folding the previous summary with forty new turns of denser
    facts, the last one into a small room: the first facts open every summary (before:
    the last summary, cut to ~90 tokens, kept none of them)."""
    counter = HeuristicCounter()
    p = params()
    thread = fresh_store.create_thread("chain")
    fresh_store.add_messages(thread, FIRST_TURN + later_turns(40, seed=1))
    compactor = compactor_for(fresh_store, counter, p)
    for seed in range(2, 6):
        assert compactor.compact(thread, "budget").outcome == "ok"
        assert_first_facts(fresh_store.latest_summary(thread).text)
        fresh_store.add_messages(thread, later_turns(40, seed=seed))
    # the newest turn leaves ~90 tokens for the summary that replaces the chain's last
    frame = ContextEngine(fresh_store, counter, p).frame(thread)
    room = frame.history_budget + frame.summary_tokens - 16 - 90
    fresh_store.add_messages(thread, [user_message_of(counter, room)])
    event = compactor.compact(thread, "budget")
    assert event.outcome == "ok" and event.summary_tokens < 120, event.describe()
    chain = fresh_store.summaries(thread)
    assert len(chain) == 5 and chain[-1].prev_id == chain[-2].id
    assert_first_facts(chain[-1].text)
    summary = ConversationSummary.from_fields(chain[-1].fields)
    assert summary.facts[0].startswith("User: My name is Wiebke Okonkwo")


def test_fit_removes_the_first_facts_last_and_the_very_first_one_last_of_all():
    counter = HeuristicCounter()
    summary = ConversationSummary(
        summary=" ".join(f"word{i}" for i in range(60)), key_decisions=["a decision"] * 1,
        evolving_themes=["one", "two", "three"],
        facts=["User: The first fact, 4471.", "User: The second fact, 2,300.",
               "Assistant: A later fact.", "Assistant: Another later fact."],
        first_facts=2)
    for cap in (120, 60, 45, 40):
        fitted = summary.fit(counter, cap)
        assert fitted.facts[:fitted.first_facts] == summary.facts[:fitted.first_facts]
        if len(fitted.facts) > fitted.first_facts:  # later facts only while the first stay
            assert fitted.first_facts == 2
    tight = summary.fit(counter, 45)
    assert tight.facts[:1] == ["User: The first fact, 4471."]
    assert "Assistant: A later fact." not in tight.facts


CHATS = {
    "ru": ([{"role": "user", "content": "Здравствуйте. Меня зовут Анна Петрова, номер моей "
                                        "квартиры 4471. Помогите перевезти пианино в Казань "
                                        "14 марта."},
            {"role": "assistant", "content": "Конечно, Анна. Я найду перевозчиков."}],
           ("Анна Петрова", "4471", "Казань 14 марта")),
    "ja": ([{"role": "user", "content": "こんにちは。私の名前は田中花子です。ピアノを3月14日に"
                                        "大阪へ運びたいです。予算は23000円です。"},
            {"role": "assistant", "content": "わかりました。業者を探します。"}],
           ("田中花子", "3月14日に大阪", "23000円")),
    "de": ([{"role": "user", "content": "Hallo. Ich heiße Jürgen Weiß und wohne in Köln, "
                                        "Wohnung 4471. Bitte hilf mir, mein Klavier am "
                                        "14. März nach Überlingen zu bringen."},
            {"role": "assistant", "content": "Gern, Jürgen. Ich suche eine Spedition."}],
           ("Jürgen Weiß", "Wohnung 4471", "Überlingen")),
}
CHATTER = {
    "ru": ("Сегодня была хорошая погода, и мы гуляли в парке долго.",
           "Да, погода была хорошая, это приятно слышать."),
    "ja": ("今日はいい天気で、公園を長く散歩しました。", "いい天気でよかったですね。"),
    "de": ("Heute war schönes Wetter und wir sind lange im Park spazieren gegangen.",
           "Ja, das Wetter war schön, das freut mich zu hören."),
}


@pytest.mark.parametrize("language", sorted(CHATS))
def test_the_first_facts_are_found_by_their_shape_in_any_script(fresh_store, language):
    """Digits, capitalized words inside a sentence, the user's own sentences: no word list,
    so a chat in Russian, Japanese or German keeps its first facts (before: the ledger read
    only unaccented Latin letters, and a Russian or Japanese chat's was empty)."""
    first, facts = CHATS[language]
    user, assistant = CHATTER[language]
    thread = fresh_store.create_thread(language)
    fresh_store.add_messages(thread, first + [{"role": "user", "content": user},
                                              {"role": "assistant", "content": assistant}] * 30)
    said = [said_from_row(r) for r in fresh_store.messages(thread)]
    summary = ExtractiveSummarizer(HeuristicCounter()).summarize(None, said, 256)
    text = summary.render()
    assert all(fact in text for fact in facts), text
    assert summary.first_facts >= 1 and HeuristicCounter().count_text(text) <= 256


def test_a_greeting_or_a_thanks_by_name_is_not_a_first_fact(fresh_store):
    """What the shape rule leaves out: a line too short to say anything, and a speaker's
    name used to address them (the names of the chat's speakers come from the records)."""
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, [
        {"role": "user", "name": "Caroline", "content": "Hey Mel! Good to see you!"},
        {"role": "assistant", "name": "Mel", "content": "Wow, that's cool, Caroline! "
                                                        "I took my 3 kids to Lake Tahoe."},
    ])
    said = [said_from_row(r) for r in fresh_store.messages(thread)]
    first = ExtractiveSummarizer(HeuristicCounter()).first_facts(said, 200)
    assert [f.text for f in first] == ["Mel: I took my 3 kids to Lake Tahoe."]


# -- the window says in full what was dropped and why --------------------------------------


def _complete(sentence: str) -> None:
    assert "…" not in sentence and "..." not in sentence
    assert sentence.endswith(".") and sentence[0].isupper()


def test_turns_that_must_still_be_dropped_are_said_in_full_everywhere(tmp_path, capsys, qtbot):
    """The real path where compaction cannot cover the older turns: the newest turn leaves
    no room for any summary, so they stay dropped. `context`, `context --json`, the
    inspector and the settings' breakdown say which turns, how much, and why — the
    compaction's own reason included — in whole sentences, never cut."""
    data = tmp_path / "home"
    window = ("--set", "context.window=4096")
    with Host(data, {"context.window": "4096"}) as host:
        counter, store = host.planner().counter, host.store
        thread = store.create_thread("dropped")
        store.add_messages(thread, FIRST_TURN + later_turns(8))
        budget = host.planner().engine(store).frame(thread).history_budget
        store.add_messages(thread, [user_message_of(counter, budget - 20)])
    code, out, err = run_cli(capsys, "--data-dir", data, *window, "compact", thread, "--json",
                             "--no-model")
    event = json.loads(out)
    assert event["outcome"] == "failed" and event["error"].startswith("no room for a summary")

    code, out, err = run_cli(capsys, "--data-dir", data, *window, "context", thread, "--json",
                             "--no-model")
    assert code == 0, err
    report = json.loads(out)
    dropped = report["dropped"]
    assert report["dropped_turns"] == 9 and dropped["turns"] == [1, 9]
    assert dropped["messages"] == 18 and dropped["tokens"] == sum(
        m["tokens"] for m in report["messages"] if m["state"] == "dropped")
    why = dropped["why"]
    assert why.startswith(f"Turns 1–9 (18 messages, {dropped['tokens']:,} tokens) are not sent "
                          "to the model: they do not fit the")
    assert "and no summary covers them yet." in why
    assert why.endswith(f"the last compaction (manual) failed, so no summary holds them: "
                        f"{event['error']}.")
    _complete(why)

    code, out, err = run_cli(capsys, "--data-dir", data, *window, "context", thread,
                             "--no-model")
    assert code == 0 and f"dropped     {why}\n" in out  # one whole line; the terminal wraps

    with Host(data, {"context.window": "4096"}) as host:
        planner, store = host.planner(), host.store
        report = inspector_report(store, planner, thread)
        assert report["dropped"]["why"] == why
        assert why in budget_preview(store, planner, thread).lines()
        from iris_desktop.ui.inspector import InspectorDock

        dock = InspectorDock()
        qtbot.addWidget(dock)
        dock.resize(320, 600)  # narrow: the label wraps, nothing is elided
        dock.show_report(report)
        assert why in dock.request_label.text()
        assert dock.events.item(0, 10).toolTip() == event["error"]
        # the status bar's sentence: short enough for the bar, whole, and it says where
        # the full why is
        status = dropped_status(planner.plan(store, thread), "failed")
        assert status == "Compaction failed: 9 older turns are not sent; the inspector (Ctrl+I) says why."
        assert len(status) <= 80


def test_a_turn_that_waits_for_compaction_says_so_in_full(fresh_store):
    counter = HeuristicCounter()
    p = params(window=2048)
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, FIRST_TURN + later_turns(30))
    engine = ContextEngine(fresh_store, counter, p)
    request = engine.build(thread)
    assert request.trigger == "budget" and request.dropped_turns
    report = dropped_report(request, engine.describe(request), fresh_store.compaction_events(thread))
    assert report["count"] == request.dropped_turns
    assert report["why"].endswith("They stay stored, and compaction folds them into the summary "
                                  "before the next request is sent.")
    _complete(report["why"])
    assert dropped_status(request) == (f"{request.dropped_turns} older turns are not sent; "
                                       "the inspector (Ctrl+I) says why.")
    events = list(compactor_for(fresh_store, counter, p).before_request(thread))
    assert events[-1].event.outcome == "ok"
    after = engine.build(thread)
    assert dropped_report(after, engine.describe(after), fresh_store.compaction_events(thread)) is None
    assert_first_facts(fresh_store.latest_summary(thread).text)
