"""Dates that SillyTavern ("June 19, 2023 2:20pm", its older ``send_date``) and
text-generation-webui ("Jan 05, 2025 14:30", its ``timestamp``) write in English whatever
the computer's language are read on a desktop of any language. Before, they were read by
``strptime``, which reads the month names (and "am"/"pm") of the C library's ``LC_TIME``;
the window's QApplication sets it from the environment, so on a German or French desktop
every such date was silently dropped ("May", "Oct", "Dec", "pm" are no German words).

The locale's own test sets ``LC_TIME`` to a German or French locale around a real import
(the CLI in-process, a real SQLite store); where the system has none, it compiles one with
``localedef`` into the test's folder (``LOCPATH``), and is skipped where neither works. The
other tests need no locale: ``strptime`` is made to fail (and counted), and every form read
before is compared with what ``strptime`` read in the C locale."""

from __future__ import annotations

import _strptime
import json
import locale
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from test_foreign_import import exported, imported
from test_import_local_apps import local

#: the German and French locales tried first (as systems name them)
LOCALES = ["de_DE.UTF-8", "de_DE.utf8", "de_DE", "fr_FR.UTF-8", "fr_FR.utf8", "fr_FR"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]


def _set(name: str) -> str | None:
    try:
        return locale.setlocale(locale.LC_TIME, name)
    except locale.Error:
        return None


@pytest.fixture
def foreign_time(tmp_path, monkeypatch):
    """``LC_TIME`` set to a German (or French) locale for the test, as the window sets it on
    such a desktop; the locale it had before is set back after."""
    before = locale.setlocale(locale.LC_TIME)
    chosen = next((name for name in LOCALES if _set(name)), None)
    if chosen is None and shutil.which("localedef"):  # (none installed: compile German)
        folder = tmp_path / "locales"
        folder.mkdir()
        done = subprocess.run(["localedef", "-i", "de_DE", "-f", "UTF-8",
                               str(folder / "de_DE.UTF-8")], capture_output=True, check=False)
        if done.returncode in (0, 1) and (folder / "de_DE.UTF-8").is_dir():  # (1: warnings)
            monkeypatch.setenv("LOCPATH", str(folder))
            chosen = _set("de_DE.UTF-8")
    if chosen is None:
        pytest.skip("no German or French locale can be set here (none installed, and "
                    "localedef could not compile one)")
    try:
        may = datetime(2025, 5, 5).strftime("%b")
        assert may.lower() != "may", f"{chosen} names May {may!r}: not a foreign locale"
        yield chosen
    finally:
        locale.setlocale(locale.LC_TIME, before)


@pytest.fixture
def no_strptime(monkeypatch):
    """``strptime`` (``datetime``'s and ``time``'s) fails as it does for an English month on
    a German desktop; the calls are counted."""
    calls: list[tuple] = []

    def refuse(*args):  # ((cls,) data_string, format)
        calls.append(args)
        raise ValueError(f"time data {args[-2]!r} does not match format {args[-1]!r}")

    for name in ("_strptime", "_strptime_time", "_strptime_datetime"):
        monkeypatch.setattr(_strptime, name, refuse)
    return calls


def textgen_history(tmp_path: Path) -> Path:
    """A text-generation-webui history written in May and October (English month names,
    as its ``get_current_timestamp`` writes them)."""
    rows = [["<|BEGIN-VISIBLE-CHAT|>", "Hello."], ["Colour?", "Blue."]]
    source = tmp_path / "20251031-23-05-00.json"
    source.write_text(json.dumps({"internal": rows, "visible": rows, "metadata": {
        "assistant_0": {"timestamp": "May 05, 2025 14:30"},
        "user_1": {"timestamp": "Oct 31, 2025 23:05"},
        "assistant_1": {"timestamp": "Oct 31, 2025 23:06", "versions": [
            {"content": "Red.", "visible_content": "Red.", "timestamp": "Oct 31, 2025 23:06"},
            {"content": "Blue.", "visible_content": "Blue.", "timestamp": "Oct 31, 2025 23:06"}],
            "current_version_index": 1}}}, indent=4))
    return source


def sillytavern_chat(tmp_path: Path) -> Path:
    """A SillyTavern chat of 2023 (``send_date`` as its ``getMessageTimeStamp`` wrote it:
    full English month names, a 12-hour clock): at noon, past midnight, in the evening."""
    lines = [{"user_name": "You", "character_name": "Aria", "create_date": "2023-5-1 @12h 00m 00s",
              "chat_metadata": {}},
             {"name": "Aria", "is_user": False, "is_system": False, "mes": "Hello!",
              "send_date": "May 1, 2023 12:00pm"},
             {"name": "You", "is_user": True, "is_system": False, "mes": "Still up?",
              "send_date": "December 24, 2023 12:05am"},
             {"name": "Aria", "is_user": False, "is_system": False, "mes": "Always.",
              "send_date": "October 3, 2023 9:41PM", "swipes": ["Always."], "swipe_id": 0}]
    source = tmp_path / "Aria - 2023-5-1@12h00m00s.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return source


TEXTGEN_DATES = [local(2025, 5, 5, 14, 30), local(2025, 10, 31, 23, 5),
                 local(2025, 10, 31, 23, 6), local(2025, 10, 31, 23, 6)]
SILLYTAVERN_DATES = [local(2023, 5, 1, 12, 0), local(2023, 12, 24, 0, 5),
                     local(2023, 10, 3, 21, 41)]


def dates(capsys, source: Path) -> list[str | None]:
    ids, _ = imported(capsys, source)
    return [m.get("created_at") for m in exported(capsys, ids[0])]


def test_dates_survive_a_german_or_french_desktop(capsys, tmp_path, foreign_time):
    assert dates(capsys, textgen_history(tmp_path)) == TEXTGEN_DATES
    assert dates(capsys, sillytavern_chat(tmp_path)) == SILLYTAVERN_DATES


def test_dates_are_read_without_strptime(capsys, tmp_path, no_strptime):
    assert dates(capsys, textgen_history(tmp_path)) == TEXTGEN_DATES
    assert dates(capsys, sillytavern_chat(tmp_path)) == SILLYTAVERN_DATES
    assert no_strptime == []


@pytest.mark.parametrize("month", range(1, 13))
def test_every_form_strptime_read_is_read_the_same(month):
    """Each form read before (in the C locale, where ``strptime`` knew the English names):
    text-generation-webui's "%b %d, %Y %H:%M" and "%B %d, %Y %H:%M", SillyTavern's
    "%B %d, %Y %I:%M%p", in any case, days and hours with and without their zero."""
    from iris_desktop.core.foreign_formats import _sent, english_time

    before = locale.setlocale(locale.LC_TIME)
    locale.setlocale(locale.LC_TIME, "C")
    try:
        for day, hour, minute in ((1, 0, 0), (5, 9, 7), (28, 12, 30), (9, 23, 59)):
            when = datetime(2024, month, day, hour, minute)
            twelve = f"{hour % 12 or 12}:{minute:02d}{'pm' if hour >= 12 else 'am'}"
            forms = [(when.strftime("%b %d, %Y %H:%M"), "%b %d, %Y %H:%M"),
                     (when.strftime("%B %d, %Y %H:%M"), "%B %d, %Y %H:%M"),
                     (when.strftime(f"%B {day}, %Y {hour}:%M"), "%B %d, %Y %H:%M"),
                     (when.strftime(f"%B {day}, %Y ") + twelve, "%B %d, %Y %I:%M%p"),
                     (when.strftime(f"%B {day}, %Y ") + twelve.upper(), "%B %d, %Y %I:%M%p"),
                     (when.strftime("%B %d, %Y %I:%M%p").lower(), "%B %d, %Y %I:%M%p"),
                     (when.strftime("%b %d, %Y %H:%M").upper(), "%b %d, %Y %H:%M")]
            for text, form in forms:
                read = datetime.strptime(text, form).timestamp()
                assert read == when.timestamp(), text
                assert english_time(text) == read, text
                assert english_time(f"  {text}\n") == read, text
                if form.endswith("%p"):
                    assert _sent(text) == read, text
    finally:
        locale.setlocale(locale.LC_TIME, before)


@pytest.mark.parametrize("text", [
    "Jun 31, 2024 10:00", "Febr 01, 2024 10:00", "Mai 05, 2025 14:30", "May 05, 2025 24:00",
    "May 05, 2025 13:00pm", "May 05, 2025 0:30am", "May 05, 2025 14:60", "May 05 2025",
    "May 05, 25 14:30", "05 May 2025 14:30", "", "pm"])
def test_what_is_no_such_date_is_none(text):
    from iris_desktop.core.foreign_formats import english_time

    assert english_time(text) is None
