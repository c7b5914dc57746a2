"""What the summarizer and recall read of a stored message: who said it, when, and what.

Everything here comes from the message's record, never from the layout of its text:
the speaker is the message's ``name`` (OpenAI's field) or, without one, its role; the
date is ``sent_at``, the time the message was written (an imported chat keeps its
source's timestamps). Relative dates in the text ("yesterday", "last Saturday") are
anchored to that date, so a fact keeps its "when" after the message is gone.
"""

from __future__ import annotations

import calendar
import datetime as dt
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MONTH_NAMES = ["January", "February", "March", "April", "May", "June", "July", "August",
               "September", "October", "November", "December"]
WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
WEEKDAY_ABBREVIATIONS = {"mon": "monday", "tue": "tuesday", "tues": "tuesday", "wed": "wednesday",
                         "thu": "thursday", "thur": "thursday", "thurs": "thursday", "fri": "friday",
                         "sat": "saturday", "sun": "sunday"}
WEEKDAY_WORDS = WEEKDAYS + sorted(WEEKDAY_ABBREVIATIONS, key=len, reverse=True)
SEASONS = ("spring", "summer", "fall", "autumn", "winter")
NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
                "seven": 7, "eight": 8, "nine": 9, "ten": 10, "a couple of": 2}
#: how a role is named when its messages carry no ``name``
ROLE_SPEAKERS = {"user": "User", "assistant": "Assistant", "system": "System"}


@dataclass(frozen=True)
class Said:
    """One stored message as read for memory: who, when, what."""

    id: int
    role: str
    speaker: str
    text: str
    date: dt.date | None
    #: the speaker was named by the message itself (its ``name``), not guessed from its role
    named: bool = False
    #: an assistant message's tool calls, as "name(arguments)"
    calls: tuple[str, ...] = ()


def day_of(sent_at: str | None) -> dt.date | None:
    """The writer's local day of an ISO-8601 ``sent_at`` (None when unknown or unreadable)."""
    if not sent_at:
        return None
    try:
        return dt.datetime.fromisoformat(sent_at).date()
    except ValueError:
        return None


def said_from_row(row: Mapping[str, Any]) -> Said:
    """A ``messages`` row (with ``sent_at`` and ``name``) as a Said."""
    role = row["role"]
    text = row.get("content") or ""
    if row.get("content_is_json"):
        try:
            parts = json.loads(text)
            text = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in parts)
        except (ValueError, TypeError, AttributeError):
            pass
    name = row.get("name")
    if role == "tool":
        speaker = f"Tool {name}" if name else "Tool"
    else:
        speaker = name or ROLE_SPEAKERS.get(role, role)
    return Said(int(row["id"]), role, speaker, text, day_of(row.get("sent_at")),
                named=bool(name) and role != "tool", calls=_calls(row.get("tool_calls")))


def _calls(raw: str | None) -> tuple[str, ...]:
    try:
        calls = json.loads(raw) if raw else []
    except ValueError:
        return ()
    out = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        out.append(f"{function.get('name')}({function.get('arguments')})")
    return tuple(out)


def fmt_date(date: dt.date) -> str:
    return f"{date.day} {MONTH_NAMES[date.month - 1]} {date.year}"


_MONTH = r"(?P<month>" + "|".join(m[:3] + r"(?:" + m[3:] + r")?" for m in MONTH_NAMES) + r")\.?"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
DATE_FORMS = [re.compile(p, re.IGNORECASE) for p in (
    rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s*{_YEAR}\b",  # 9 April 2023, 9th of April, 2023
    rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b",  # April 9, 2023
    rf"\b{_MONTH},?\s+{_YEAR}\b",  # April 2023
    rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}\b",  # 9 April
    rf"\b{_MONTH}\s+{_DAY}\b(?!\d)",  # April 9
    rf"\b(?:in|during|since|by|until|of|last|this|early|late|mid-?)\s+{_MONTH}\b",  # in May
    rf"\b(?:in|during|since|by|until|of)\s+{_YEAR}\b",  # in 2022
)]
#: how long after a named day a message may still tell of it ("last Friday" a week on)
TELLING_DAYS = 8


@dataclass(frozen=True)
class Period:
    """Days a text names: ``start``–``end`` (inclusive), or a month of any year."""

    start: dt.date | None = None
    end: dt.date | None = None
    month: int | None = None  # a month named without a year

    def holds(self, day: dt.date | None) -> bool:
        """Was a message written on ``day`` within this period, or soon enough after it
        to tell of it?"""
        if day is None:
            return False
        if self.start is None or self.end is None:
            return day.month == self.month or (day - dt.timedelta(days=TELLING_DAYS)).month == self.month
        return self.start <= day <= self.end + dt.timedelta(days=TELLING_DAYS)

    def days(self, first_year: int, last_year: int) -> list[tuple[dt.date, dt.date]]:
        """The days (first, last, inclusive) that :meth:`holds`: a month without a year
        in each year from ``first_year`` to ``last_year``."""
        telling = dt.timedelta(days=TELLING_DAYS)
        if self.start is not None and self.end is not None:
            return [(self.start, self.end + telling)]
        if self.month is None:
            return []
        return [(dt.date(year, self.month, 1),
                 dt.date(year, self.month, calendar.monthrange(year, self.month)[1]) + telling)
                for year in range(first_year, last_year + 1)]


def periods_in(text: str, today: dt.date | None = None) -> list[Period]:
    """The dates a text names, most precise first ("on 9 April, 2023", "in June 2023",
    "in May", "during 2022"), each span read once; with ``today`` (the day the text was
    written), the periods it names relative to that day too ("yesterday", "last week",
    "three weeks ago", "in the past 3 months", see :func:`relative_periods`). English
    only."""
    found: list[Period] = []
    taken: list[tuple[int, int]] = []
    if today is not None:
        for span, period in relative_periods(text, today):
            taken.append(span)
            found.append(period)
    for form in DATE_FORMS:
        for match in form.finditer(text or ""):
            if any(a < match.end() and match.start() < b for a, b in taken):
                continue
            parts = match.groupdict()
            month = month_number(parts.get("month"))
            year = int(parts["year"]) if parts.get("year") else None
            try:
                if parts.get("day") and month and year:
                    day = dt.date(year, month, int(parts["day"]))
                    period = Period(day, day)
                elif month and year:
                    period = Period(dt.date(year, month, 1),
                                    dt.date(year, month, calendar.monthrange(year, month)[1]))
                elif month:
                    period = Period(month=month)
                elif year:
                    period = Period(dt.date(year, 1, 1), dt.date(year, 12, 31))
                else:
                    continue
            except ValueError:  # 31 February
                continue
            taken.append(match.span())
            found.append(period)
    return found


_COUNT = r"(?P<count>\d{1,3}|a couple of|a few|an?|one|two|three|four|five|six|seven|eight|nine|ten)"
_UNIT = r"(?P<unit>day|week|month|year)s?"
RELATIVE_FORMS = [(re.compile(p, re.IGNORECASE), kind) for p, kind in (
    (r"\bthe day before yesterday\b", "day-2"),
    (r"\b(?:yesterday|last night)\b", "day-1"),
    (r"\b(?:today|tonight|this (?:morning|afternoon|evening))\b", "day-0"),
    # "the last week of October" names a week of a month, not the week before today
    (r"\b(?:in|over|during|within|for) the (?:last|past) " + _COUNT.replace("a few|", "a few|few|")
     + r"? ?" + _UNIT + r"\b(?! of\b)", "within"),
    (r"\b(?:last|this past) (?P<unit>week(?:end)?|month|year)\b(?! of\b)", "last"),
    (r"\bthis (?P<unit>week|month|year)\b", "this"),
    (r"\b(?:last|this past) (?P<weekday>" + "|".join(WEEKDAY_WORDS) + r")\b", "weekday"),
    (_COUNT + r" " + _UNIT + r" ago\b", "ago"),
)]


def names_relative_date(text: str) -> bool:
    """Does ``text`` name a date relative to the day it was written (:func:`relative_periods`)?
    Only then does that day change what it means."""
    return any(pattern.search(text or "") for pattern, _ in RELATIVE_FORMS)


def relative_periods(text: str, today: dt.date) -> list[tuple[tuple[int, int], Period]]:
    """The periods ``text`` names relative to ``today`` (the day it was written), each
    with its span: "yesterday", "last week" (Monday to Sunday before this week), "last
    weekend", "last month" / "this year", "last Friday", "three weeks ago" (that week, a
    few days either side), "two months ago" (that month), "in the past 3 months" (from
    then to today). What is only vaguely a time ("recently", "lately", "a while ago") is
    none: it would rank up days the question never meant."""
    found: list[tuple[tuple[int, int], Period]] = []
    for pattern, kind in RELATIVE_FORMS:
        for match in pattern.finditer(text or ""):
            if any(a < match.end() and match.start() < b for (a, b), _ in found):
                continue
            period = _relative_period(kind, match.groupdict(), today)
            if period is not None:
                found.append((match.span(), period))
    return found


def _relative_period(kind: str, parts: dict[str, str | None], today: dt.date) -> Period | None:
    day = dt.timedelta(days=1)
    unit = (parts.get("unit") or "").lower()
    if kind.startswith("day-"):
        when = today - int(kind[4:]) * day
        return Period(when, when)
    if kind == "weekday":
        name = WEEKDAY_ABBREVIATIONS.get(parts["weekday"].lower(), parts["weekday"].lower())
        back = (today.weekday() - WEEKDAYS.index(name) - 1) % 7 + 1  # strictly before today
        when = today - back * day
        return Period(when, when)
    monday = today - today.weekday() * day
    first = today.replace(day=1)
    if kind == "this":
        start = {"week": monday, "month": first, "year": today.replace(month=1, day=1)}[unit]
        return Period(start, today)
    if kind == "last":
        if unit == "weekend":
            return Period(monday - 2 * day, monday - day)
        if unit == "week":
            return Period(monday - 7 * day, monday - day)
        if unit == "month":
            end = first - day
            return Period(end.replace(day=1), end)
        return Period(dt.date(today.year - 1, 1, 1), dt.date(today.year - 1, 12, 31))
    raw = (parts.get("count") or "").lower()
    count = int(raw) if raw.isdigit() else {"a few": 3, "few": 3}.get(raw, NUMBER_WORDS.get(raw))
    if kind == "within":  # "in the past 3 months", "over the last week"
        count = count or 1
        start = _months_back(today, count) if unit == "month" else (
            dt.date(today.year - count, today.month, min(today.day, 28)) if unit == "year"
            else today - count * (7 if unit == "week" else 1) * day)
        return Period(start, today)
    if count is None or count > 400:
        return None
    if unit == "day":
        when = today - count * day
        return Period(when, when) if raw not in ("a few", "a couple of") else Period(when - day, when + day)
    if unit == "week":  # that week, give or take half of one
        when = today - 7 * count * day
        return Period(when - 3 * day, when + 3 * day)
    if unit == "month":
        back = _months_back(today, count)
        return Period(back.replace(day=1), back.replace(day=calendar.monthrange(back.year, back.month)[1]))
    return Period(dt.date(today.year - count, 1, 1), dt.date(today.year - count, 12, 31))


def _months_back(today: dt.date, count: int) -> dt.date:
    """The same day ``count`` calendar months before ``today`` (or that month's last)."""
    year, month = divmod(today.year * 12 + today.month - 1 - count, 12)
    month += 1
    return dt.date(year, month, min(today.day, calendar.monthrange(year, month)[1]))


def month_number(word: str | None) -> int | None:
    """'Aug', 'august.' → 8; None for anything else."""
    if not word:
        return None
    prefix = word.rstrip(".")[:3].lower()
    return next((i for i, m in enumerate(MONTH_NAMES, start=1) if m[:3].lower() == prefix), None)


def _weekday(word: str) -> str:
    """'fri' → 'Friday'; 'week' and 'weekend' stay as they are."""
    word = WEEKDAY_ABBREVIATIONS.get(word, word)
    return word.capitalize() if word in WEEKDAYS else word


def resolve_relative(sentence: str, today: dt.date | None) -> str:
    """Anchor relative dates to the day the sentence was written, so they keep their
    meaning once the message is gone: 'yesterday (7 May 2023)', 'last week (the week
    before 9 June 2023)', 'last Friday (the Friday before 27 July 2023)', 'a few weeks ago
    (a few weeks before 9 June 2023)', 'next summer (summer 2024)'. An anchored
    phrase is never wrong, where a computed day would be a guess for 'last week' or 'a
    few days ago'. Long because each English form gets one readable line."""
    if today is None:
        return sentence
    anchor = fmt_date(today)

    def sub(pattern: str, value) -> None:
        nonlocal sentence
        sentence = re.sub(pattern, lambda m: f"{m.group(0)} ({value})", sentence, count=1,
                          flags=re.IGNORECASE)

    lowered = sentence.lower()
    for word, step, further in (("yesterday", -1, "before"), ("tomorrow", 1, "after")):
        if word in lowered:  # "the day before yesterday" is two days back, not yesterday
            two = re.search(rf"\bthe day {further} {word}\b", lowered)
            if two:
                sub(re.escape(two.group(0)), fmt_date(today + dt.timedelta(days=2 * step)))
            if not two or re.search(rf"(?<!the day {further} )\b{word}\b", lowered):
                sub(rf"(?<!the day {further} )\b{word}\b", fmt_date(today + dt.timedelta(days=step)))
    night = "last night" in lowered and re.search(r"(\w+)?\W*\blast night\b", lowered)
    if night and night.group(1) not in _NOT_YESTERDAY_NIGHT:  # "our last night in Lisbon"
        sub(r"\blast night\b", fmt_date(today - dt.timedelta(days=1)))
    # each pattern is tried only when a word it needs is there: a recall block anchors
    # hundreds of candidate lines per question, and most have no relative date
    if ("today" in lowered or "tonight" in lowered or "this morning" in lowered
            or "this afternoon" in lowered):
        sub(r"\b(?:today|tonight|this morning|this afternoon)\b", anchor)
    day = r"(week(?:end)?|" + "|".join(WEEKDAY_WORDS) + r")"
    match = ("last " in lowered or "this past " in lowered) and re.search(
        r"\b(?:last|this past) " + day + r"\b", lowered)
    if match:
        sub(re.escape(match.group(0)), f"the {_weekday(match.group(1))} before {anchor}")
    match = "next " in lowered and re.search(r"\bnext " + day + r"\b", lowered)
    if match:
        sub(re.escape(match.group(0)), f"the {_weekday(match.group(1))} after {anchor}")
    match = "this week" in lowered and re.search(r"\bthis (week(?:end)?)\b", lowered)
    if match:
        sub(re.escape(match.group(0)), f"the {match.group(1)} of {anchor}")
    match = "day" in lowered and re.search(r"\bon (" + "|".join(WEEKDAYS) + r")\b", lowered)
    if match and not re.search(r"\b(?:next|last|this past) " + match.group(1), lowered):
        sub(re.escape(match.group(0)), f"the {_weekday(match.group(1))} before or on {anchor}")
    if "last month" in lowered:
        prev = today.replace(day=1) - dt.timedelta(days=1)
        sub(r"\blast month\b", f"{MONTH_NAMES[prev.month - 1]} {prev.year}")
    if "next month" in lowered:
        nxt = (today.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
        sub(r"\bnext month\b", f"{MONTH_NAMES[nxt.month - 1]} {nxt.year}")
    match = any(season in lowered for season in SEASONS) and re.search(
        r"\b(last|this|next) (" + "|".join(SEASONS) + r")\b", lowered)
    if match:
        year = today.year + {"last": -1, "this": 0, "next": 1}[match.group(1)]
        sub(re.escape(match.group(0)), f"{match.group(2)} {year}")
    if "last year" in lowered:
        sub(r"\blast year\b", str(today.year - 1))
    if "this year" in lowered:
        sub(r"\bthis year\b", str(today.year))
    if "next year" in lowered:
        sub(r"\bnext year\b", str(today.year + 1))
    match = " ago" in lowered and re.search(
        r"\b(a few|a couple of|\w+) (days?|weeks?|months?|years?) ago\b", lowered)
    if match:
        count = NUMBER_WORDS.get(match.group(1), int(match.group(1)) if match.group(1).isdigit() else None)
        unit = match.group(2).rstrip("s")
        if unit == "day" and count is not None:  # an exact day
            sub(re.escape(match.group(0)), fmt_date(today - dt.timedelta(days=count)))
        elif unit == "year" and count is not None:
            years = "1 year" if count == 1 else f"{count} years"
            sub(re.escape(match.group(0)), f"{years} ago from {anchor}, about {today.year - count}")
        else:  # "a few weeks before 12 July 2023": the amount stays, the day is anchored
            sub(re.escape(match.group(0)), f"{match.group(1)} {match.group(2)} before {anchor}")
    return _day_of_this_month(sentence, today)


#: "on the 11th" with no month beside it: not "the 11th of May", "on the 4th floor"
#: (what follows is an end, a mark or a word that is not a noun)
_ORDINAL_DAY = re.compile(
    r"\bon the ([1-9]|[12]\d|3[01])(?:st|nd|rd|th)\b(?=\s*(?:[.,;:!?)]|$|(?:and|but|or|at|when|so|"
    r"i|we|it|my|our|to|with|in|for|because|after|before|which|too|as|was|is|were|will|the|"
    r"this|that|he|she|they|you)\b))", re.IGNORECASE)


#: the word before "last night" that makes it a night of something else: "our last night
#: in Lisbon", "at last night fell" (not the night before the message)
_NOT_YESTERDAY_NIGHT = {"the", "our", "my", "your", "his", "her", "their", "its", "that", "one",
                        "every", "a", "at", "this", "whose"}
#: a sentence that names a month or a year (or was anchored to one: "last month (November
#: 2023)") says which month its "on the 3rd" is in, maybe not this one
_NAMED_MONTH = re.compile(r"\b(?:" + "|".join(MONTH_NAMES) + r"|(?:19|20)\d\d)\b", re.IGNORECASE)
#: words before "on the 5th" in its clause that make it a day to come or one that recurs
#: ("I'll call on the 5th", "rent is due on the 1st", "I may arrive on the 3rd")
_NOT_PAST = re.compile(r"\b(?:will|shall|'ll|going to|gonna|due|every|each|is|are|am|'re|'m|"
                       r"until|till|may|might|can|could|would|should|must|plan(?:ning)?|hope|"
                       r"want|need|next)\b", re.IGNORECASE)


def _day_of_this_month(sentence: str, today: dt.date) -> str:
    """'dropped on the 11th' written on 13 September: 'on the 11th (11 September 2023)'.
    Only a day of the month already reached, where "this month" is the one reading: on
    the 13th, "on the 20th" could be next week or last month's, and stays as written; so
    does one in a sentence that names a month or a year, or one its clause says is to come
    or recurs (:data:`_NOT_PAST`)."""
    if "on the " not in sentence.lower() or _NAMED_MONTH.search(sentence):
        return sentence
    for match in _ORDINAL_DAY.finditer(sentence):
        day = int(match.group(1))
        clause = re.split(r"[.;!?]", sentence[:match.start()])[-1]
        if day <= today.day and not _NOT_PAST.search(clause.replace("\u2019", "'")):
            end = match.end()
            return f"{sentence[:end]} ({fmt_date(today.replace(day=day))}){sentence[end:]}"
    return sentence
