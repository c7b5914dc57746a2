"""Review of session 65: 'the day before yesterday' is two days back and 'the day after
tomorrow' two days ahead; the other way round ('the day after yesterday', 'the day
before tomorrow') is today, not two days off (it was anchored four days from the truth)."""

from __future__ import annotations

import datetime as dt

import pytest

from iris_desktop.core.records import resolve_relative

WRITTEN = dt.date(2023, 9, 13)


@pytest.mark.parametrize("sentence, anchored", [
    ("We met the day before yesterday.", "the day before yesterday (11 September 2023)"),
    ("It opens the day after tomorrow.", "the day after tomorrow (15 September 2023)"),
    ("We met yesterday.", "yesterday (12 September 2023)"),
    ("It opens tomorrow.", "tomorrow (14 September 2023)"),
])
def test_two_days_off_where_the_phrase_says_so(sentence, anchored):
    assert anchored in resolve_relative(sentence, WRITTEN)


@pytest.mark.parametrize("sentence", ["We met the day after yesterday.",
                                      "It opens the day before tomorrow."])
def test_the_other_way_round_is_never_two_days_off(sentence):
    said = resolve_relative(sentence, WRITTEN)
    assert "11 September 2023" not in said and "15 September 2023" not in said, said
