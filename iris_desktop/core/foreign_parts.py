"""What every reader of another app's chats shares (:mod:`iris_desktop.core.foreign` and
the readers beside it): a chat, the tally of what was left out, a usable title, a tree's
messages, the documents a chat's replies wrote (Claude's artifacts, ChatGPT's canvas)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from iris_desktop.core.conversation import IMPORTED_FROM, ConversationFormatError
from iris_desktop.core.foreign_text import mended
from iris_desktop.core.foreign_tree import MERGED_CHARS, Node, tree
from iris_desktop.core.store import iso_timestamp
from iris_desktop.core.store.rows import not_in_future
from iris_desktop.tokens import Message


class Chat(NamedTuple):
    title: str | None
    messages: list[Message]
    #: the chat's own system prompt (an Iris export's; other apps' are not read)
    system_prompt: str | None = None
    #: what was left out of this chat (None: nothing is counted for its format)
    tally: Tally | None = None
    #: the messages as an earlier Iris read them, where they differ (:func:`read_before`):
    #: a chat it imported is known by them (None: the same, or not read by that Iris)
    before: list[Message] | None = None


class SkippedChat(Exception):
    """A chat that cannot be read as it is (two messages with one id): the file's other
    chats are imported, and this one is said in a note."""


@dataclass
class Tally:
    """What was left out of a chat, or of the whole file (:meth:`add`)."""
    images: int = 0
    files: int = 0
    tools: int = 0
    empty: int = 0
    #: files beside the one imported that could not be read (a Jan thread.json), and why
    unread: list[str] = field(default_factory=list)
    #: messages on branches Iris cannot show beside the active one (``_untangle``)
    unshown: int = 0
    #: the chats skipped whole (:class:`SkippedChat`, or unreadable: :mod:`.foreign_chats`),
    #: each said in the import's sentence: "“Trip plans”: why", "chat 3: why"
    skipped: list[str] = field(default_factory=list)
    #: halves of UTF-16 surrogate pairs replaced by U+FFFD (:mod:`.foreign_text`)
    mended: int = 0
    #: loops of parents cut where the shown branch closes them (:func:`.foreign_tree.unloop`),
    #: and the messages only a loop reached, left out
    loops: int = 0
    looped: int = 0
    #: messages the app showed but hid from the model's prompt (SillyTavern's ``is_system``),
    #: left out: Iris would send them
    hidden: int = 0
    #: the characters whose replies were marked with their names ("**Alice:** …"): a
    #: SillyTavern group chat's, where several answer and Iris has one assistant
    speakers: int = 0

    def add(self, other: Tally | None) -> Tally:
        """Count ``other``'s too; returns self."""
        if other is not None:
            self.images += other.images
            self.files += other.files
            self.tools += other.tools
            self.empty += other.empty
            self.unshown += other.unshown
            self.unread += other.unread
            self.skipped += other.skipped
            self.mended += other.mended
            self.loops += other.loops
            self.looped += other.looped
            self.hidden += other.hidden
            self.speakers += other.speakers
        return self

    def notes(self) -> list[str]:
        notes = [f"{problem}: the thread's title and instructions were left out."
                 for problem in self.unread]
        media = [count(self.images, "image"), count(self.files, "other file")]
        media = [m for m, n in zip(media, (self.images, self.files)) if n]
        if media:
            verb = "was" if self.images + self.files == 1 else "were"
            notes.append(f"{' and '.join(media)} {verb} left out: Iris imports text only.")
        if self.tools:
            verb = "was" if self.tools == 1 else "were"
            notes.append(f"{count(self.tools, 'tool step')} (web searches, code runs, image "
                         f"generation) {verb} left out; the replies that used them are kept.")
        if self.unshown:
            verb = "was" if self.unshown == 1 else "were"
            notes.append(f"{count(self.unshown, 'message')} on branches that start with a "
                         f"different role than the active one {verb} left out: Iris shows "
                         "alternatives of one role side by side.")
        if self.hidden:
            verb, them = ("was", "it") if self.hidden == 1 else ("were", "them")
            notes.append(f"{count(self.hidden, 'message')} SillyTavern hid from the prompt {verb} "
                         f"left out: Iris would send {them} to the model.")
        if self.speakers:
            notes.append(f"{count(self.speakers, 'character')}' replies start with their names "
                         "(“**Name:**”): Iris has one assistant.")
        if self.empty:
            verb = "was" if self.empty == 1 else "were"
            notes.append(f"{count(self.empty, 'chat')} with no text message {verb} skipped.")
        if self.mended:
            verb = "was" if self.mended == 1 else "were"
            notes.append(f"{count(self.mended, 'broken character')} (half of an emoji's or "
                         f"other character's UTF-16 pair) {verb} replaced with \ufffd.")
        if self.loops or self.looped:
            cut = (f"{count(self.loops, 'loop')} of messages that are each other's parents "
                   f"{'was' if self.loops == 1 else 'were'} cut where the shown branch closes "
                   "it") if self.loops else ""
            gone = (f"{count(self.looped, 'message')} only a loop of parents reached "
                    f"{'was' if self.looped == 1 else 'were'} left out") if self.looped else ""
            said = "; ".join(part for part in (cut, gone) if part)
            notes.append(f"{said[:1].upper()}{said[1:]}.")
        return notes  # (the chats skipped whole: in the import's sentence, skipped_said)


#: the app each other app's format was written in (:mod:`iris_desktop.core.foreign`'s
#: format names), which its replies name (:func:`from_app`)
APPS = {"ChatGPT export": "ChatGPT", "Claude export": "Claude", "Open WebUI export": "Open WebUI",
        "LM Studio conversation": "LM Studio", "Jan thread": "Jan", "Jan threads folder": "Jan",
        "llama.cpp web UI export": "llama.cpp", "ShareGPT file": "ShareGPT",
        "SillyTavern chat": "SillyTavern"}


def from_app(chat: Chat, fmt: str) -> Chat:
    """``chat`` with each of its replies (every branch's) marked as written in the app of
    ``fmt`` (:data:`~iris_desktop.core.conversation.IMPORTED_FROM`): the window and the
    Markdown export name the app, not Iris, over them; a format of Iris's own marks none."""
    app = APPS.get(fmt)
    for message in chat.messages if app else []:
        if message.get("role") == "assistant":
            message[IMPORTED_FROM] = app
    return chat


def count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def usable_title(value: Any) -> str | None:
    """A usable title: text that can be stored (else the first user message names it); a
    lone half of a UTF-16 surrogate pair in it is U+FFFD (:func:`.foreign_text.mended`)."""
    if not isinstance(value, str) or not value.strip():
        return None
    return mended(value)[0].strip()


def tree_messages(nodes: dict[Hashable, Node], active: Hashable | None, system: str | None = None,
          tally: Tally | None = None) -> list[Message]:
    """:func:`~iris_desktop.core.foreign_tree.tree`, what it left out counted in ``tally``."""
    made = tree(nodes, active, system)
    if tally is not None:
        tally.unshown += made.left_out
        tally.loops += made.loops
        tally.looped += made.looped
    return made.messages


def hashable(value: Any) -> Hashable:
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else repr(value)


# -- a message's text and time ----------------------------------------------------------


def text_message(role: str, text: str, when: Any = None, stopped: bool = False,
                 cut: bool = False) -> Message:
    """A message of ``text``, dated by ``when`` (seconds or milliseconds since 1970, a
    time in the future left out); ``stopped``: a reply cut off in the app (the user
    stopped it, or it failed), marked as Iris marks its own: Continue, "(stopped)";
    ``cut``: one that reached the app's length limit, marked as Iris marks one cut off at
    model.max_tokens: Continue, "(cut off)"."""
    message: Message = {"role": role, "content": text}
    if stopped:
        message["status"] = "interrupted"
    elif cut:
        message["finish_reason"] = "length"
    if isinstance(when, (int, float)) and not isinstance(when, bool) and when > 0:
        try:
            message["created_at"] = not_in_future(iso_timestamp(when))
        except (ValueError, OverflowError, OSError):
            pass
    return message


def strip_reasoning(text: str) -> str:
    """``text`` without its ``<think>…</think>`` blocks."""
    return cut_blocks(text, "<think>", "</think>")[0].strip()


def cut_blocks(text: str, opening: str, closing: str,
                kind: Callable[[str], str | None] = lambda tag: "") -> tuple[str, list[str]]:
    """``text`` without its blocks from a tag starting ``opening`` (through its ``>``) to
    the first ``closing`` after it, and the whitespace after each, with each cut block's
    ``kind(tag)``; a tag whose ``kind`` is None is kept, as is an unclosed block and all
    after it. One pass over the text: an export of thousands of unclosed tags must not
    take minutes, as a backtracking regex did (``<think>`` × 40,000: 48 s)."""
    out: list[str] = []
    kinds: list[str] = []
    pos = scan = 0
    while True:
        start = text.find(opening, scan)
        if start < 0:
            break
        end = text.find(">", start + len(opening) - 1)
        if end < 0:
            break  # no tag closes after here: none of the later ones can either
        after = text[start + len(opening):start + len(opening) + 1]
        whole_name = opening.endswith(">") or not (after.isalnum() or after == "_")  # not <detailsx
        what = kind(text[start:end + 1]) if whole_name else None
        if what is None:
            scan = end + 1
            continue
        close = text.find(closing, end + 1)
        if close < 0:
            break  # unclosed: kept, and so is every later block (none has a closing tag)
        out.append(text[pos:start])
        kinds.append(what)
        pos = close + len(closing)
        while pos < len(text) and text[pos].isspace():
            pos += 1
        scan = pos
    out.append(text[pos:])
    return "".join(out), kinds


# -- documents a reply wrote ----------------------------------------------------------------

#: a canvas update's pattern that stands for the whole document
_WHOLE = {".*", "(?s).*", "^.*$", "(?s)^.*$", "[\\s\\S]*", "^[\\s\\S]*$"}


class Documents:
    """The documents one chat's replies wrote, each by its id at its latest version: a
    document is kept in the reply that wrote it as a titled fenced block
    (:func:`document_block`), an update as the whole new version where it applies to the
    latest one, else as the changed part alone (so too past :data:`MERGED_CHARS` of text
    that updates added in one chat: a hostile chain of small updates to a large document
    would copy it into every reply). Also a reply's text without ChatGPT's markers
    (:meth:`cited`). ``before``: read as the Iris before it did either (every document
    "", a canvas call's message dropped, markers kept: :func:`read_before`); ``touched``:
    whether a document or a marker was met."""

    def __init__(self, before: bool = False) -> None:
        self.latest: dict[str, tuple[str, str, str]] = {}  # id: (title, language, text)
        self.last: str | None = None  # the id written last (ChatGPT's canvas names none)
        self.room = MERGED_CHARS
        self.before, self.touched = before, False

    def cited(self, text: str, references: Any, citations: Any = None) -> str:
        """A ChatGPT reply's ``text`` without its markers (:func:`without_markers`, and
        the older ones: :func:`without_old_citations`)."""
        if self.before:
            return text
        plain = without_markers(without_old_citations(text, citations), references)
        self.touched = self.touched or plain != text
        return plain

    def write(self, key: str, title: str, language: str, text: str) -> str:
        """A new document, or a new version of one, written whole."""
        self.touched = True
        if self.before:
            return ""
        old = self.latest.get(key)
        title = title or (old[0] if old else "")
        language = language or (old[1] if old else "")
        self.latest[key], self.last = (title, language, text), key
        return document_block(title, language, text)

    def change(self, key: str | None, old: str, new: str, every: bool = False,
               title: str = "") -> str:
        """``old`` replaced by ``new`` in the latest version of ``key`` (None: the one
        written last); where that version is not known or lacks ``old``, the changed part."""
        self.touched = True
        if self.before:
            return ""
        key = self.last if key is None else key
        known = self.latest.get(key) if key is not None else None
        if known is None or not old or old not in known[2]:
            name = title or (known[0] if known else "")
            return document_block(f"{name}, changed part" if name else "Changed part",
                                  known[1] if known else "", new) if new.strip() else ""
        text = known[2].replace(old, new) if every else known[2].replace(old, new, 1)
        whole = self.write(key, title, "", text)
        if len(text) > self.room:
            return document_block(f"{self.latest[key][0] or 'Document'}, changed part",
                                  known[1], new) if new.strip() else ""
        self.room -= len(text)
        return whole

    def canvas(self, recipient: str, payload: str) -> str | None:
        """ChatGPT's ``canmore.create_textdoc`` or ``canmore.update_textdoc`` call (its
        JSON ``payload``) as the document; None for another call (a tool step)."""
        if self.before:  # every canvas call was a tool step, its message dropped
            return ""
        try:
            given = json.loads(payload)
        except (ValueError, RecursionError):
            return None
        if not isinstance(given, dict):
            return None
        if recipient == "canmore.create_textdoc" and isinstance(given.get("content"), str):
            kind = given.get("type") if isinstance(given.get("type"), str) else ""
            return self.write(f"canvas {len(self.latest)}", text_of(given.get("name")),
                              kind.partition("code/")[2], given["content"])
        updates = given.get("updates")
        if recipient != "canmore.update_textdoc" or not isinstance(updates, list):
            return None
        shown = ""
        for update in updates:
            if not isinstance(update, dict) or not isinstance(update.get("replacement"), str):
                continue
            pattern = text_of(update.get("pattern"))
            if pattern.strip() in _WHOLE and self.last is not None:
                shown = self.write(self.last, "", "", update["replacement"])
            else:
                literal = _literal(pattern)
                shown = self.change(None, literal or "", update["replacement"],
                                    bool(update.get("multiple")))
        return shown


def read_before(read: Callable[[Any, Tally, Documents], Chat | None]
                ) -> Callable[[Any, Tally], Chat | None]:
    """A reader of one chat (``read(conversation, tally, documents)``) that also gives
    the chat's messages as the Iris before :class:`Documents` read them (``before``),
    where they differ: that Iris dropped the documents replies wrote (and a reply that
    only wrote one) and kept ChatGPT's markers, and the chats it imported would be
    imported again as new ones. Only a chat where documents or markers were met is read
    twice."""
    def chat(conversation: Any, tally: Tally) -> Chat | None:
        documents = Documents()
        now = read(conversation, tally, documents)
        if now is None or not documents.touched:
            return now
        try:
            then = read(conversation, Tally(), Documents(before=True))
        except (ConversationFormatError, SkippedChat):
            return now  # (that Iris refused it, or this one would have: never stored)
        before = then.messages if then is not None else []
        kept = any(m.get("role") != "system" for m in before) and before != now.messages
        return now._replace(before=before if kept else None)

    return chat


def document_block(title: str, language: str, text: str) -> str:
    """``text`` in a fence longer than any run of backticks in it, ``title`` above it."""
    fence = "`" * max(3, max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    language = "".join(c for c in language if c.isalnum() or c in "+#.-_")[:30]
    head = f"**{' '.join(title.split())}**\n\n" if title.strip() else ""
    return f"{head}{fence}{language}\n{text.rstrip()}\n{fence}"


def text_of(value: Any) -> str:
    return value if isinstance(value, str) else ""


_ESCAPES = {"n": "\n", "t": "\t"}


def _literal(pattern: str) -> str | None:
    """The text a regular expression matches when it is plain text (escaped punctuation
    allowed), else None: a canvas update's pattern is applied only so, never run (a
    hostile one could take hours)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            following = pattern[i + 1:i + 2]
            if following in _ESCAPES:
                out.append(_ESCAPES[following])
            elif not following or following.isalnum():
                return None  # \d, \b, \1: no plain text
            else:
                out.append(following)
            i += 2
            continue
        if char in ".^$*+?{}[]|()":
            return None
        out.append(char)
        i += 1
    return "".join(out)


#: an older ChatGPT citation (2023 to 2024): 【7†source】, 【3:0†source】, 【12†L3-L9】
_OLD_CITATION = re.compile(r"【\d+(?::\d+)*†[^】\n]{0,80}】")


def without_old_citations(text: str, citations: Any) -> str:
    """ChatGPT's older citation markers (``【7†source】``) as the cited page's link, where
    ``metadata.citations`` gives the page for the marker's place (``start_ix``,
    ``end_ix``), else gone."""
    if "†" not in text:
        return text
    links: dict[tuple[int, int], str] = {}
    for cited in citations if isinstance(citations, list) else []:
        page = cited.get("metadata") if isinstance(cited, dict) else None
        url = page.get("url") if isinstance(page, dict) else None
        place = (cited.get("start_ix"), cited.get("end_ix")) if page else None
        if isinstance(url, str) and url.startswith(("http://", "https://")) \
                and all(isinstance(ix, int) for ix in place):
            name = text_of(page.get("title")).strip() or url.split("/")[2]
            name = " ".join(name.replace("[", "(").replace("]", ")").split())
            links[place] = f" ([{name}]({url}))"
    return _OLD_CITATION.sub(lambda match: links.get(match.span(), ""), text)


#: a ChatGPT marker: \ue200kind\ue202what\ue201 (a citation, an entity, a file's citation)
_MARKER = re.compile("[ ]?\ue200([^\ue200\ue201\ue202]*)\ue202([^\ue200\ue201]*)\ue201")


def without_markers(text: str, references: Any) -> str:
    """ChatGPT's reply text without its private markers: a citation becomes its
    reference's link text (``metadata.content_references``' ``alt``, else its first
    URL) or nothing, an entity its name; the highlight marks around cited text go."""
    if "\ue200" not in text and "\ue203" not in text:
        return text
    cited: dict[str, str] = {}
    for ref in references if isinstance(references, list) else []:
        if isinstance(ref, dict) and isinstance(ref.get("matched_text"), str):
            items = ref.get("items") if isinstance(ref.get("items"), list) else []
            urls = [i["url"] for i in items if isinstance(i, dict) and isinstance(i.get("url"), str)]
            alt = ref.get("alt")
            cited[ref["matched_text"]] = alt.strip() if isinstance(alt, str) and alt.strip() \
                else (f"({urls[0]})" if urls else "")

    def said(match: re.Match[str]) -> str:
        space = " " if match.group(0).startswith(" ") else ""
        marker = match.group(0)[len(space):]
        if cited.get(marker):
            return f" {cited[marker]}"
        if match.group(1) == "entity":
            try:
                parts = json.loads(match.group(2))
                return space + parts[1] if isinstance(parts, list) and isinstance(parts[1], str) \
                    else ""
            except (ValueError, RecursionError, IndexError):
                return ""
        return ""

    return re.sub("[\ue200-\ue206]", "", _MARKER.sub(said, text))
