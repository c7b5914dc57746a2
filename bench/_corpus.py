"""Helpers shared by the benchmarks: the corpus, and long threads built from it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "corpus"

sys.path.insert(0, str(REPO / "tests"))  # the helpers the tests use, shared, not copied
from support.helpers import compact_while_due, complete  # noqa: E402

__all__ = ["REPO", "CORPUS", "compact_while_due", "complete", "corpus_messages",
           "locomo_messages", "synthetic_thread"]


def corpus_messages(kind: str) -> list[list[dict]]:
    """Each conversation's messages; kind is 'agent-transcripts' or 'long-chats'."""
    return [
        json.loads(p.read_text())["messages"] for p in sorted((CORPUS / kind).glob("*.json"))
    ]


def synthetic_thread(n_messages: int) -> list[dict]:
    """n messages made by replaying the corpus (chats and agent turns interleaved).

    Tool-call ids are renamed per replay so that every call/result pair stays unique.
    """
    sources = corpus_messages("long-chats") + corpus_messages("agent-transcripts")
    if not any(m["role"] != "system" for conv in sources for m in conv):
        sys.exit(f"no conversation to replay in {CORPUS} (../shared/corpus beside the checkout)")
    out: list[dict] = []
    replay = 0
    while len(out) < n_messages:
        for conv in sources:
            replay += 1
            for m in conv:
                if m["role"] == "system":
                    continue
                m = dict(m)
                if m.get("tool_calls"):
                    m["tool_calls"] = [
                        {**c, "id": f"r{replay}_{c['id']}"} for c in m["tool_calls"]
                    ]
                if m["role"] == "tool":
                    m["tool_call_id"] = f"r{replay}_{m['tool_call_id']}"
                out.append(m)
            if len(out) >= n_messages:
                break
    out = out[:n_messages]
    # never end on an assistant call whose result was cut off
    while out and out[-1].get("tool_calls"):
        out.pop()
    return out


# -- LoCoMo as a user would have it ---------------------------------------------------------

import datetime as _dt  # noqa: E402
import re as _re  # noqa: E402

_SESSION_LINE = _re.compile(
    r"(?:^|\n)\[(?:(?P<hour>\d{1,2}):(?P<minute>\d{2})\s*(?P<ampm>[ap]m)\s+on\s+)?"
    r"(?P<day>\d{1,2})\s+(?P<month>[A-Za-z]+),?\s+(?P<year>\d{4})\]\s*")
_MONTHS = {m: i for i, m in enumerate(
    ["january", "february", "march", "april", "may", "june", "july", "august", "september",
     "october", "november", "december"], start=1)}


def locomo_messages(data: dict) -> list[dict]:
    """A LoCoMo chat converted the way an exporter would write it: each message named by
    its speaker (``name``) and timestamped (``created_at``) from its session's date line,
    which leaves the text. Indices are unchanged, so ``dia_index`` still applies.

    Where one speaker ended a session and opened the next, the corpus joined the two
    turns into one message with the new session's date line inside it; that message takes
    the new session's date (its second part is the new session's opening, usually the
    news), and the line leaves the text too.

    This is the only place that knows LoCoMo's layout; Iris itself reads records."""
    speakers = data.get("speakers") or {}
    when: _dt.datetime | None = None
    since = 0  # messages since the session's date line (seconds apart, same day)
    out = []
    for message in data["messages"]:
        message = dict(message)
        content = message.get("content") or ""
        match = _SESSION_LINE.search(content)
        if match:
            hour = int(match["hour"] or 12) % 12 + (12 if (match["ampm"] or "pm") == "pm" else 0)
            when = _dt.datetime(int(match["year"]), _MONTHS[match["month"].lower()],
                                int(match["day"]), hour, int(match["minute"] or 0),
                                tzinfo=_dt.UTC)
            message["content"] = (content[:match.start()] + ("\n" if match.start() else "")
                                  + content[match.end():])
            since = 0
        if when is not None:
            message["created_at"] = (when + _dt.timedelta(seconds=since)).isoformat()
            since += 1
        if message.get("role") in speakers:
            message["name"] = speakers[message["role"]]
        out.append(message)
    return out
