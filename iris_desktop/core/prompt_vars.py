"""The date and time placeholders a system prompt may hold, filled when a request is
built: ``{{CURRENT_DATE}}`` as Open WebUI writes them, ``{{current_date}}`` as Jan's
default assistant ends its instructions ("Current date: {{current_date}}"). An imported
prompt sent them to the model as written, braces and all; a prompt written here may use
them too. Any other ``{{…}}`` stays as written."""

from __future__ import annotations

import datetime as dt
import re

#: a placeholder's name (any case, spaces inside the braces allowed) → its value's format
FORMATS = {
    "current_date": "%Y-%m-%d",
    "current_time": "%H:%M:%S",
    "current_datetime": "%Y-%m-%d %H:%M:%S",
    "current_weekday": "%A",
}
_PLACEHOLDER = re.compile(r"\{\{\s*(current_(?:date(?:time)?|time|weekday|timezone))\s*\}\}", re.IGNORECASE)


def filled(prompt: str, now: dt.datetime | None = None) -> str:
    """``prompt`` with each date or time placeholder replaced by this computer's local
    date or time (``now``: that moment, for tests), in Open WebUI's formats
    (``2026-12-07``, ``14:05:09``, ``Monday``; ``{{CURRENT_TIMEZONE}}`` the zone's name)."""
    if "{{" not in prompt:
        return prompt
    moment = (now or dt.datetime.now()).astimezone()

    def value(match: re.Match[str]) -> str:
        name = match.group(1).lower()
        return moment.tzname() or "" if name == "current_timezone" else moment.strftime(FORMATS[name])

    return _PLACEHOLDER.sub(value, prompt)
