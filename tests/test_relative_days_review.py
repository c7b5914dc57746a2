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


# -- review of session 65's diff, in session 66: anchors that were wrong -------------------


@pytest.mark.parametrize("sentence", [
    "Rent is due on the 1st.",                          # a day that recurs
    "I'll call the bank on the 5th and sort it out.",   # a day to come
    "I may arrive on the 3rd.",
    "Last month I moved, on the 3rd.",                  # another month named or anchored
    "In November we moved house on the 3rd.",
    "Last year I got married on the 5th.",
    "My birthday is on the 10th.",
    "In 2019 we met on the 2nd.",
])
def test_a_day_of_the_month_is_not_taken_for_this_months_where_the_sentence_says_otherwise(sentence):
    """Before: each of these got "(N September 2023)", this month's day, stored so in the
    chat's summary and shown so in recall ("Last month (August 2023) I moved, on the 3rd
    (3 September 2023)")."""
    assert "September 2023)" not in resolve_relative(sentence, WRITTEN)


@pytest.mark.parametrize("sentence", ["It was our last night in Lisbon.",
                                      "At last night fell and we slept.",
                                      "My last night there was quiet."])
def test_a_last_night_of_something_is_not_the_night_before(sentence):
    assert "12 September 2023" not in resolve_relative(sentence, WRITTEN)


@pytest.mark.parametrize("sentence, anchored", [
    ("I dropped it on the 11th, and it broke.", "on the 11th (11 September 2023)"),
    ("The package arrived on the 2nd.", "on the 2nd (2 September 2023)"),
    ("Last night was fun.", "Last night (12 September 2023)"),
    ("We went out last night.", "last night (12 September 2023)"),
])
def test_the_days_that_were_anchored_still_are(sentence, anchored):
    assert anchored in resolve_relative(sentence, WRITTEN)


def test_yesterday_beside_the_day_before_yesterday_keeps_its_own_date():
    """Before: only the two-day phrase was anchored, and "yesterday" lost its date."""
    said = resolve_relative("I called yesterday, and the day before yesterday I emailed her.", WRITTEN)
    assert said == ("I called yesterday (12 September 2023), and the day before yesterday "
                    "(11 September 2023) I emailed her.")
    said = resolve_relative("See you tomorrow, or the day after tomorrow.", WRITTEN)
    assert said == "See you tomorrow (14 September 2023), or the day after tomorrow (15 September 2023)."
