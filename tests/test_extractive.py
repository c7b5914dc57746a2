"""The extractive summarizer's parts: anchored dates, speaker names, the dated ledger."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from iris_desktop.core.extractive import (
    ExtractiveSummarizer,
    aliases_from,
    resolve_relative,
    speaker_aliases,
)
from iris_desktop.core.summary import ConversationSummary
from iris_desktop.core.tokens import HeuristicCounter

from conftest import CORPUS

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
    ("a few weeks ago", "a few weeks ago (before 12 July 2023)"),
    ("last summer we camped", "last summer (the summer of 2022)"),
    ("last month", "last month (June 2023)"),
])
def test_relative_dates_are_anchored_to_the_session(text, expected):
    assert expected in resolve_relative(text, SESSION)


def test_no_session_date_leaves_text_alone():
    assert resolve_relative("I went yesterday", None) == "I went yesterday"


def test_speakers_are_named_from_how_they_greet_each_other():
    data = json.loads((CORPUS / "long-chats" / "locomo-26.json").read_text())
    aliases = speaker_aliases(data["messages"])
    assert aliases["user"][0] == "Caroline"
    assert aliases["assistant"][:2] == ["Mel", "Melanie"]
    assert speaker_aliases([{"role": "user", "content": "hi"}]) == {}


def test_ledger_is_dated_named_and_within_the_cap():
    data = json.loads((CORPUS / "long-chats" / "locomo-26.json").read_text())
    counter = HeuristicCounter()
    summary = ExtractiveSummarizer(counter).summarize(None, data["messages"][:200], 768)
    text = summary.render()
    assert counter.count_text(text) <= 768
    assert summary.facts and all(f.split(" ", 3)[2].isdigit() for f in summary.facts)  # dated
    # grouped under session dates, each line named by its speaker
    assert re.search(r"Facts \(dated\):\n\d{1,2} [A-Z][a-z]+ 2023:\n- (Caroline|Mel|Melanie): ", text)
    assert not any(f.endswith("?") for f in summary.facts)  # questions hold no facts
    names = aliases_from(summary.relationship_dynamics)
    assert names["user"] == ["Caroline"] and set(names["assistant"]) == {"Mel", "Melanie"}
    # chained: the next summary keeps the names and stays within the cap
    chained = ExtractiveSummarizer(counter).summarize(
        ConversationSummary.from_fields(summary.as_fields()), data["messages"][200:300], 768)
    assert counter.count_text(chained.render()) <= 768
    assert "Caroline" in chained.relationship_dynamics
