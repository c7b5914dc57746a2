"""Two simple, common chat files of other apps, read into Iris's format with the parts
:mod:`iris_desktop.core.foreign` shares by every format:

- ShareGPT (the ShareGPT site's conversations, and the many chat data sets written in its
  shape): a list of ``{"id", "conversations": [{"from": "human"|"gpt"|"system"|…,
  "value": text}]}``, one JSON value or one per line (JSONL). ``human`` and ``user`` ask,
  ``gpt``, ``assistant``, ``chatgpt``, ``bard``, ``bing``, ``model`` answer, a leading
  ``system`` (or the conversation's own ``system``, as FastChat writes it) is the chat's
  system prompt, a later one a system message where it was said; a tool's call or result
  (``function_call``,
  ``observation``, ``tool``) is a tool step, counted. A turn of any other speaker (``bot``)
  skips its chat, named in the import's sentence (its replies were dropped without a word,
  the chat stored as the questions alone). ShareGPT dates nothing.
- SillyTavern's chat file (``<character> - <date>.jsonl``): a header line
  (``user_name``, ``character_name``, ``create_date``, ``chat_metadata``; its newer
  versions write ``chat_metadata`` first, the names "unused" and no date), then a line per
  message (``name``, ``is_user``, ``is_system``, ``send_date``, ``mes``, and a reply's
  ``swipes`` with ``swipe_id`` the one shown). The swipes of a reply are its
  alternatives, the shown one active, the rest of the chat under it; a message hidden
  from the prompt (``is_system``) is left out and counted (SillyTavern shows it but never
  sends it; Iris has no message it keeps but does not send). The chat is titled by the
  character and the date it began (the first reply's ``name`` and the first
  ``send_date`` where the header does not say). A group chat (its replies under two or
  more ``name``s; SillyTavern writes it with no header, or one that names no character)
  marks each reply with its character, ``**Alice:** `` before its text (Iris has one
  assistant; the Iris before this lost who said what), says so in the import's sentence
  (:attr:`~iris_desktop.core.foreign_parts.Tally.speakers`), and is titled by its
  characters; a chat that Iris imported unmarked is known by its messages as they were.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from datetime import datetime
from typing import Any

from iris_desktop.core.conversation import ConversationFormatError
from iris_desktop.core.foreign_parts import (
    Chat,
    Tally,
    strip_reasoning,
    text_message,
    tree_messages,
    usable_title,
)
from iris_desktop.core.foreign_tree import Node
from iris_desktop.tokens import Message

SHAREGPT = "ShareGPT file"
SILLYTAVERN = "SillyTavern chat"

_ASKS = {"human", "user"}
_ANSWERS = {"gpt", "assistant", "chatgpt", "bard", "bing", "model", "claude", "llm"}
_HUMANIZED = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2}) ?@(\d{1,2})h ?(\d{1,2})m ?(\d{1,2})s"
                        r"(?: ?(\d{1,3})ms)?")
_TOOLS = {"function_call", "function_response", "observation", "tool", "tool_call",
          "tool_response", "ipython"}
#: the English months (full, and their three letters), as SillyTavern and
#: text-generation-webui write them whatever the computer's language: ``strptime`` reads
#: the names of the language the desktop sets (on a German one, "May" was no month)
_MONTHS = {name: number for number, month in enumerate((
    "january", "february", "march", "april", "may", "june", "july", "august", "september",
    "october", "november", "december"), start=1) for name in (month, month[:3])}
_ENGLISH_TIME = re.compile(r"([a-z]+)\s+(\d{1,2})\s*,\s*(\d{4})\s+(\d{1,2}):(\d{1,2})"
                           r"(?::(\d{1,2})(?:\.(\d{1,3}))?)?\s*([ap]m)?", re.IGNORECASE)


def _turns(item: Any) -> list[Any] | None:
    if not isinstance(item, dict):
        return None
    turns = item.get("conversations", item.get("items"))
    return turns if isinstance(turns, list) else None


def is_sharegpt(value: Any) -> bool:
    """Whether ``value`` (a parsed JSON value, or a list of JSONL lines) is ShareGPT's."""
    items = value if isinstance(value, list) else [value]
    return any(any(isinstance(t, dict) and "from" in t and "value" in t for t in turns[:20])
               for turns in map(_turns, items[:50]) if turns)


def sharegpt_items(value: Any) -> list[Any]:
    """The conversations of a ShareGPT file (a list of them, or one)."""
    return value if isinstance(value, list) else [value]


def sharegpt_chat(item: Any, tally: Tally) -> Chat | None:
    turns = _turns(item)
    if turns is None:
        raise ConversationFormatError("a conversation must be an object with 'conversations'")
    messages: list[Message] = []
    for number, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict):
            raise ConversationFormatError(f"turn {number} is not an object")
        speaker = str(turn.get("from", "")).lower()
        text = turn.get("value")
        if speaker in _TOOLS:
            tally.tools += 1
            continue
        role = "user" if speaker in _ASKS else "assistant" if speaker in _ANSWERS else \
            "system" if speaker == "system" else None
        if not isinstance(text, str) or not text.strip():
            continue
        if role is None:  # (its text was dropped without a word)
            raise ConversationFormatError(
                f"turn {number}'s speaker {turn.get('from')!r} is not one Iris knows (human or "
                f"user asks; {', '.join(sorted(_ANSWERS))} answer)")
        messages.append(text_message(role, strip_reasoning(text) if role == "assistant" else text))
    system = item.get("system")  # (FastChat's own files: the system prompt beside the turns)
    if isinstance(system, str) and system.strip() and not (
            messages and messages[0]["role"] == "system"):
        messages.insert(0, text_message("system", system))
    # a system turn after the first message is kept where it was said (a chat template such
    # as Qwen2.5's shows it there); the Iris before this dropped it: its imports are known
    before = [m for i, m in enumerate(messages) if i == 0 or m["role"] != "system"]
    return Chat(usable_title(item.get("title")), messages,
                before=before if len(before) < len(messages) else None)


def is_sillytavern(lines: list[Any]) -> bool:
    """Whether JSONL ``lines`` are a SillyTavern chat: its header (its newer versions write
    ``chat_metadata`` first, or alone), or its messages."""
    dicts = [x for x in lines[:50] if isinstance(x, dict)]
    return bool(dicts) and (("character_name" in dicts[0] and "user_name" in dicts[0])
                            or isinstance(dicts[0].get("chat_metadata"), dict)
                            or all("mes" in x and "is_user" in x for x in dicts))


def sillytavern_chat(lines: list[Any], tally: Tally) -> Chat | None:
    header = lines[0] if lines and isinstance(lines[0], dict) and "mes" not in lines[0] else {}
    speakers = _speakers(lines, header)
    group = len(speakers) > 1  # (its replies marked with their names; unmarked: before)
    nodes: dict[Hashable, Node] = {}
    unmarked: dict[Hashable, Node] = {}
    parent: Hashable | None = None
    for number, line in enumerate(lines, start=1):
        if line is header:
            continue
        if not isinstance(line, dict):
            raise ConversationFormatError(f"line {number} is not an object")
        if not isinstance(line.get("mes"), str):
            continue  # (no message)
        if line.get("is_system"):  # hidden from the prompt: shown, never sent; Iris would
            # send it, so it is left out, counted (SillyTavern's own notice that opens a group
            # chat, "Group chat created…", is no message: not counted)
            extra = line.get("extra")
            notice = isinstance(extra, dict) and extra.get("type") == "group"
            tally.hidden += bool(line["mes"].strip()) and not notice
            continue
        role = "user" if line.get("is_user") else "assistant"
        swipes = line.get("swipes")
        texts = [s for s in swipes if isinstance(s, str)] \
            if role == "assistant" and isinstance(swipes, list) and swipes else [line["mes"]]
        shown = line.get("swipe_id", 0)
        if not isinstance(shown, int) or isinstance(shown, bool) or not 0 <= shown < len(texts):
            shown = 0
        if len(texts) > 1 and texts[shown] != line["mes"]:  # "mes" is the one shown
            texts[shown] = line["mes"]
        when = _sent(line.get("send_date"))
        name = _speaker(line.get("name")) if group and role == "assistant" else None
        for j, text in enumerate(texts):
            text = strip_reasoning(text) if role == "assistant" else text
            made = text_message(role, text, when) if text.strip() else None
            nodes[(number, j)] = Node(parent, made, [])
            if group:
                unmarked[(number, j)] = Node(parent, made and dict(made), [])
                if made is not None and name:
                    made["content"] = f"**{name}:** {text}"
        parent = (number, shown)
    messages = tree_messages(nodes, parent, tally=tally)
    tally.speakers += len(speakers) if group else 0
    title = _sillytavern_title(header, lines, speakers if group else None)
    return Chat(title, messages, before=tree_messages(unmarked, parent) if group else None)


def _speaker(value: Any) -> str | None:
    """A reply's ``name`` as it marks the reply: one line, at most 100 characters."""
    name = " ".join(value.split())[:100] if isinstance(value, str) else ""
    return name or None


def _speakers(lines: list[Any], header: Any) -> list[str]:
    """The characters who said something in the chat (``name`` of the messages neither
    the user's nor hidden that hold text), in the order they first spoke; the narrator
    (SillyTavern's ``/sys``: ``extra.type`` "narrator") is none of them."""
    names: dict[str, None] = {}
    for line in lines:
        if (line is header or not isinstance(line, dict) or line.get("is_user")
                or line.get("is_system") or not isinstance(line.get("mes"), str)
                or not line["mes"].strip()):
            continue
        extra = line.get("extra")
        if isinstance(extra, dict) and extra.get("type") == "narrator":
            continue
        name = _speaker(line.get("name"))
        if name:
            names[name] = None
    return list(names)


#: the names SillyTavern's newer versions write in a header in place of the real ones
_UNNAMED = {"unused", ""}


def _sillytavern_title(header: Any, lines: list[Any], group: list[str] | None = None
                       ) -> str | None:
    """The character and the date the chat began: the header's, or (where its names are
    "unused" and it gives no ``create_date``, as SillyTavern writes it since 2025) the
    first reply's ``name`` and the first message's ``send_date``; a ``group`` chat's
    characters ("Alice, Bob and Carol", the first three, "and 2 more")."""
    header = header if isinstance(header, dict) else {}
    said = [x for x in lines if isinstance(x, dict) and x is not header and "mes" in x]
    character = header.get("character_name")
    if group and (not isinstance(character, str) or character.strip() in _UNNAMED):
        more = f"{len(group) - 3:,} more" if len(group) > 3 else group[-1]
        character = f"{', '.join(group[:min(3, len(group) - 1)])} and {more}"
    if not isinstance(character, str) or character.strip() in _UNNAMED:
        character = next((x.get("name") for x in said
                          if not x.get("is_user") and not x.get("is_system")), None)
    began = header.get("create_date")
    if began is None or began == "":
        sent = next((_sent(x.get("send_date")) for x in said if x.get("send_date")), None)
        began = sent if sent is None or sent > 1e11 else sent * 1000  # (ms, as below)
    if isinstance(began, (int, float)) and not isinstance(began, bool) and began > 0:
        try:  # (ms, as its versions of 2023 wrote it; shown as it names a chat's file)
            began = datetime.fromtimestamp(began / 1000).strftime("%Y-%m-%d@%Hh%Mm%Ss")
        except (ValueError, OverflowError, OSError):
            began = None
    title = usable_title(character)
    if title and isinstance(began, str) and began.strip():
        title = f"{title} ({usable_title(began.strip())})"  # (its halves of pairs mended too)
    return title


def _sent(value: Any) -> float | None:
    """A SillyTavern ``send_date`` as seconds since 1970: ms, ISO 8601, its older
    "May 1, 2024 12:00pm", or "2023-4-21 @20h 02m 47s 124ms" (the last two the local time
    of the machine it was written on)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        return None
    humanized = _HUMANIZED.fullmatch(value.strip())
    if humanized:  # "2023-4-21 @20h 02m 47s 124ms", as its server and older versions write
        year, month, day, hour, minute, second, ms = (int(x or 0) for x in humanized.groups())
        try:
            return datetime(year, month, day, hour, minute, second, ms * 1000).timestamp()
        except (ValueError, OverflowError, OSError):
            return None
    try:
        return datetime.fromisoformat(value.strip()).timestamp()
    except (ValueError, OverflowError, OSError):
        return english_time(value)  # "June 19, 2023 2:20pm", as its getMessageTimeStamp wrote


def iso_seconds(value: Any) -> float | None:
    """An ISO 8601 time ("2024-05-01T16:35:11.530Z": LibreChat's ``createdAt``, Google
    Takeout's ``time``) as seconds since 1970; None for anything else."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return datetime.fromisoformat(value.strip()).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def english_time(value: Any) -> float | None:
    """A date written in English whatever the computer's language, as seconds since 1970:
    SillyTavern's older ``send_date`` ("June 19, 2023 2:20pm") and text-generation-webui's
    ``timestamp`` ("Jan 05, 2025 14:30"), both the local time of the machine they were
    written on (read as this computer's). A month's full name or its three letters, any
    case; a 12-hour clock with "am"/"pm" (12am is midnight, 12pm noon) or a 24-hour one.
    Not ``strptime``: it reads the month names (and "am"/"pm") of the language the
    desktop sets for the window, so on a German desktop every such date was lost."""
    match = _ENGLISH_TIME.fullmatch(value.strip()) if isinstance(value, str) else None
    month = _MONTHS.get(match.group(1).lower()) if match else None
    if match is None or month is None:
        return None
    day, year, hour, minute, second = (int(x or 0) for x in match.groups()[1:6])
    fraction, meridiem = match.group(7) or "", (match.group(8) or "").lower()
    if meridiem:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if meridiem == "pm" else 0)
    try:
        return datetime(year, month, day, hour, minute, second,
                        int(fraction.ljust(3, "0")) * 1000).timestamp()
    except (ValueError, OverflowError, OSError):
        return None
