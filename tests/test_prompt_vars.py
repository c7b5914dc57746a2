"""A system prompt's date and time placeholders ({{CURRENT_DATE}} as Open WebUI writes
them, {{current_date}} as Jan's default assistant does) are filled when a request is built;
before, an imported prompt reached the model with its braces. The stored prompt keeps them."""

from __future__ import annotations

import datetime as dt

from iris_desktop.core.config import ContextParams
from iris_desktop.core.engine import ContextEngine
from iris_desktop.core.prompt_vars import filled
from iris_desktop.tokens import HeuristicCounter

MOMENT = dt.datetime(2026, 12, 7, 14, 5, 9).astimezone()


def test_placeholders_are_filled_in_any_case_and_others_stay():
    prompt = ("Today is {{CURRENT_WEEKDAY}}, {{ current_date }} at {{CURRENT_TIME}} "
              "({{CURRENT_DATETIME}}, {{current_timezone}}); {{user}} and {{CURRENT_MOOD}} stay")
    assert filled(prompt, MOMENT) == (
        f"Today is Monday, 2026-12-07 at 14:05:09 (2026-12-07 14:05:09, {MOMENT.tzname()}); "
        "{{user}} and {{CURRENT_MOOD}} stay")
    assert filled("no braces", MOMENT) == "no braces"


def test_a_chats_imported_instructions_are_sent_with_todays_date(fresh_store):
    thread = fresh_store.create_thread("from Jan")
    fresh_store.add_messages(thread, [
        {"role": "system", "content": "You are Jan.\nCurrent date: {{current_date}}"},
        {"role": "user", "content": "What day is it?"}])
    engine = ContextEngine(fresh_store, HeuristicCounter(), ContextParams(window=4096, system_prompt="sys"))
    request = engine.build(thread)
    system = request.messages[0]
    assert system["role"] == "system"
    assert f"Current date: {dt.date.today().isoformat()}" in system["content"]
    assert "{{" not in system["content"]
    assert fresh_store.messages(thread)[0]["content"].endswith("{{current_date}}")  # kept as written


def test_the_settings_prompt_is_filled_and_counted_as_sent(fresh_store):
    thread = fresh_store.create_thread("t")
    fresh_store.add_messages(thread, [{"role": "user", "content": "hi"}])
    counter = HeuristicCounter()
    prompt = "Today is {{CURRENT_WEEKDAY}} {{CURRENT_DATE}}." + " padding" * 40
    engine = ContextEngine(fresh_store, counter, ContextParams(window=4096, system_prompt=prompt))
    request = engine.build(thread)
    assert request.messages[0]["content"].startswith(f"Today is {dt.date.today():%A} {dt.date.today().isoformat()}.")
    sent = request.messages[0]["content"]
    as_written = ContextEngine(fresh_store, counter, ContextParams(window=4096, system_prompt=sent))
    assert request.breakdown.system == as_written.build(thread).breakdown.system  # what is sent is counted
