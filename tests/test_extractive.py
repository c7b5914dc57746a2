"""The extractive summarizer's parts: dates and names from the records, anchored relative
dates, the dated ledger, chaining without duplicates."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from iris_desktop.core.extractive import ExtractiveSummarizer, paths_in
from iris_desktop.core.records import Said, resolve_relative, said_from_row
from iris_desktop.core.summary import ConversationSummary
from iris_desktop.tokens import HeuristicCounter

from conftest import ASSISTANT_CHAT, SYNTHETIC_CHAT

SESSION = dt.date(2023, 7, 12)  # a Wednesday


@pytest.mark.parametrize("text,expected", [
    ("I went yesterday", "yesterday (11 July 2023)"),
    ("Last Fri I took my kids", "Last Fri (the Friday before 12 July 2023)"),
    ("last week was fun", "last week (the week before 12 July 2023)"),
    ("last weekend we hiked", "last weekend (the weekend before 12 July 2023)"),
    ("this weekend I hike", "this weekend (the weekend of 12 July 2023)"),
    ("next Tues is the show", "next Tues (the Tuesday after 12 July 2023)"),
    ("I went two days ago", "two days ago (10 July 2023)"),
    ("made it ten years ago", "ten years ago (10 years ago from 12 July 2023, about 2013)"),
    ("a few weeks ago", "a few weeks ago (a few weeks before 12 July 2023)"),
    ("three months ago", "three months ago (three months before 12 July 2023)"),
    ("last summer we camped", "last summer (summer 2022)"),
    ("we plan a reunion next summer", "next summer (summer 2024)"),
    ("This winter was cold", "This winter (winter 2023)"),
    ("last month", "last month (June 2023)"),
    ("I bought it the day before yesterday", "the day before yesterday (10 July 2023)"),
    ("we fly the day after tomorrow", "the day after tomorrow (14 July 2023)"),
    ("We jammed last night!", "last night (11 July 2023)!"),
    ("I got her a year ago", "a year ago (1 year ago from 12 July 2023, about 2022)"),
    ("the album dropped on the 11th and it was wild", "on the 11th (11 July 2023) and"),
])
def test_relative_dates_are_anchored_to_the_day_it_was_written(text, expected):
    assert expected in resolve_relative(text, SESSION)


def test_no_date_leaves_text_alone():
    assert resolve_relative("I went yesterday", None) == "I went yesterday"


@pytest.mark.parametrize("text", [
    "It was the last night of the trip",  # not a day
    "we live on the 4th floor",  # not a day of the month
    "on the 3rd of May we met",  # its month is said
    "in May on the 3rd, we met",
    "the show is on the 20th",  # this month's or last month's: not guessed
])
def test_days_that_are_not_relative_or_not_sure_stay_as_written(text):
    assert resolve_relative(text, SESSION) == text


def stored(store, path, count=None) -> list[Said]:
    """The chat imported as a user would import it, read back as records."""
    messages = json.loads(path.read_text())["messages"][:count]
    thread = store.create_thread("t")
    store.add_messages(thread, messages)
    return [said_from_row(r) for r in store.messages(thread)]


def test_who_and_when_come_from_the_records(fresh_store):
    said = stored(fresh_store, SYNTHETIC_CHAT, 40)
    assert said[0].speaker == "Rosa" and said[0].named and said[0].date == dt.date(2024, 3, 4)
    assert said[1].speaker == "Tomas"
    # without a name, the role; without a timestamp, no date (never the import time)
    thread = fresh_store.create_thread("plain")
    fresh_store.add_messages(thread, [{"role": "user", "content": "I moved to Ghent yesterday."}])
    plain = said_from_row(fresh_store.messages(thread)[0])
    assert (plain.speaker, plain.named, plain.date) == ("User", False, None)


def test_ledger_is_dated_named_and_within_the_cap(fresh_store):
    said = stored(fresh_store, SYNTHETIC_CHAT)
    counter = HeuristicCounter()
    summary = ExtractiveSummarizer(counter).summarize(None, said[:200], 768)
    text = summary.render()
    assert counter.count_text(text) <= 768
    assert summary.facts and all(re.match(r"\d{1,2} [A-Z][a-z]+ 2024 (Rosa|Tomas): ", f)
                                 for f in summary.facts)
    # grouped under dates; a relative date anchored to the day it was said
    assert re.search(r"Facts \(dated\):\n\d{1,2} [A-Z][a-z]+ 2024:\n- (Rosa|Tomas): ", text)
    assert "moved to Tallinn last week (the week before 4 March 2024)" in text
    assert not any(f.endswith("?") for f in summary.facts)  # questions hold no facts
    assert "Rosa (user)" in summary.relationship_dynamics
    # chained: the next summary keeps what it kept, once, and stays within the cap
    chained = ExtractiveSummarizer(counter).summarize(
        ConversationSummary.from_fields(summary.as_fields()), said[200:], 768)
    assert counter.count_text(chained.render()) <= 768
    assert len(chained.facts) == len(set(chained.facts))


def test_an_assistant_chat_without_names_is_summarized_by_role(fresh_store):
    said = stored(fresh_store, ASSISTANT_CHAT)
    summary = ExtractiveSummarizer(HeuristicCounter()).summarize(None, said, 512)
    assert any(f.split(" ", 3)[3].startswith("Dana: ") for f in summary.facts)
    assert "the assistant" in summary.summary or "Assistant" in summary.render()


def test_paths_the_agent_called_come_first_and_markup_tags_are_not_paths():
    page = "<html><body><form>" + "</form></body></html> see /usr/share/doc/x.txt " * 30
    said = [
        Said(1, "assistant", "Assistant", "", None, calls=('bash({"cmd": "cat /etc/hosts"})',)),
        Said(2, "tool", "Tool", page, None),
        Said(3, "assistant", "Assistant", "", None, calls=('view({"path": "src/app.py"})',)),
    ]
    found = paths_in(said)
    assert found[:2] == ["/etc/hosts", "src/app.py"]  # acted on, before 30 mentions
    assert "/usr/share/doc/x.txt" in found
    assert not {"/form", "/body", "/html"} & set(found)


def test_a_ledger_line_keeps_its_first_word_unless_punctuation_says_it_is_an_interjection():
    """Before (an audit): a leading "No", "Great", "Well", "Nice" or "So" was dropped as
    filler whatever followed: "No pets are allowed…" became "Pets are allowed…" (a fact
    turned round), "Great Wall of China…" "Wall of China…", "Nice is where…" "Is
    where…". An interjection is still left out where its punctuation says it is one."""
    kept = ["No pets are allowed in Valentina's building since March 2021.",
            "Great Wall of China trip got cancelled in 2024.",
            "Well water in Tromsø tested at 7 ppm.",
            "Nice is where Amélie moved in 2019.",
            "So many people came to Lisbon in 2023."]
    said = [Said(i, "user", "Rosa", text, dt.date(2024, 5, 1), True) for i, text in enumerate(
        [*kept, "No, I never told Marco my PIN 4412.", "Wow! Lena moved to Porto in 2022.",
         "Well, the launch moved to 12 June."])]
    lines = [f.text.split("Rosa: ", 1)[1] for f in ExtractiveSummarizer(HeuristicCounter()).facts(said)]
    assert lines == [*kept, "I never told Marco my PIN 4412.", "Lena moved to Porto in 2022.",
                     "The launch moved to 12 June."]


def test_a_title_s_full_stop_ends_no_sentence():
    """Before (an audit): "Well, my doctor Dr. Smith said so." became the ledger line
    "Well, my doctor Dr." and a second one "Smith said so."."""
    said = [Said(1, "user", "Rosa", "No, Dr. Hale did not approve the 2025 trip yet. Well, my "
                 "doctor Dr. Smith said the MRI on 4 May was fine.", dt.date(2024, 5, 1), True)]
    lines = [f.text.split("Rosa: ", 1)[1] for f in ExtractiveSummarizer(HeuristicCounter()).facts(said)]
    assert lines == ["Dr. Hale did not approve the 2025 trip yet.",
                     "My doctor Dr. Smith said the MRI on 4 May was fine."]
