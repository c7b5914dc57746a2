"""Google Takeout's Gemini activity (My Activity ▸ Gemini Apps, as JSON:
``Takeout/My Activity/Gemini Apps/MyActivity.json`` or ``My Activity.json``), read into
Iris's chats for :mod:`iris_desktop.core.foreign` (by way of
:func:`~iris_desktop.core.foreign_local.local_kind`; where the shape was learnt:
``tests/fixtures/gemini/SOURCES.md``).

The file is Google's activity log, not a list of chats: a JSON list of records, newest
first, ``{header: "Gemini Apps", title: "Prompted <what the user typed>", time:
"2026-07-26T06:07:57.773Z", products, activityControls, safeHtmlItem: [{html}], details,
subtitles, imageFile, attachedFiles}``. A record whose ``title`` starts "Prompted " (or
"Asked ", "Said ", "Branched ", "Answered ") is a question: the rest of the title is the
user's message, Gemini's reply the HTML of its ``safeHtmlItem`` (several items joined),
made plain Markdown-ish text here (:func:`html_text`: no fetch, no script). The other
records ("Created …": a Canvas document, "Used …", "Added …", "Gave feedback: …",
"Selected preferred draft", "Cleared …") are no messages: counted, and said. A record of
another language's verbs is a question where Gemini replied to it (its whole title kept);
one with no reply and no verb Iris knows is counted with the others.

Chats: newer exports name each question's conversation (``details[].url``, or
``titleUrl``: ``https://gemini.google.com/app/<id>``); the questions of one conversation
are one chat (a question naming several goes with the first of them that an earlier
question named, else its first). The questions that name none (older exports) are put
into chats by time: in time order, a new chat after more than :data:`GAP_S` without a
question; the import says so. Each message is dated by its record's ``time``, so the same
file imported again is known (:mod:`.import_twins`), and so is each chat a later Takeout
holds unchanged. The first question names the chat. Takeout's HTML variant
(``My Activity.html``) is not read: :func:`is_activity_html` knows it, to say how to
export JSON instead.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from html.parser import HTMLParser
from typing import Any

from iris_desktop.core.conversation import ConversationFormatError
from iris_desktop.core.foreign_formats import iso_seconds
from iris_desktop.core.foreign_parts import APPS, Chat, Tally, count, text_message

GEMINI = "Google Takeout Gemini activity file"
APPS[GEMINI] = "Gemini"  # (its replies: written in Gemini, :func:`~.foreign_parts.from_app`)
#: the longest pause between two questions of one chat, where the file names no
#: conversation: more, and the next question starts a new chat
GAP_S = 30 * 60
#: the verbs of a record that is a question (Takeout's English titles)
_ASKED = ("Prompted ", "Asked ", "Said ", "Branched ", "Answered ")
#: the verbs of the records that are no message
_NOT_SAID = ("Created ", "Used ", "Added ", "Gave ", "Selected ", "Cleared ")
_CONVERSATION = re.compile(r"https?://gemini\.google\.com/app/([A-Za-z0-9_-]{8,})(?:[?#/]|$)")
_IMAGE = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".heic", ".bmp")


def is_gemini(value: Any) -> bool:
    """Google Takeout's My Activity records for Gemini Apps (or Bard, before): a
    ``header`` and a ``title``, the header or ``products`` naming Gemini or Bard (in
    another language too: "Gemini アプリ")."""
    items = value if isinstance(value, list) else [value]
    for item in items[:50]:
        if not isinstance(item, dict) or "header" not in item or not isinstance(item.get("title"), str):
            continue
        products = item.get("products")
        named = f"{item.get('header')} {' '.join(map(str, products)) if isinstance(products, list) else ''}"
        if "Gemini" in named or "Bard" in named:
            return True
    return False


class GeminiChats(list):
    """The chats of a Gemini activity file (each ``{title, records}``, oldest first), and
    ``notes``: what reading the file left out, and how its chats were made."""

    notes: list[str]


def gemini_chats(data: list[Any]) -> GeminiChats:
    """The file's questions put into chats (the module's rule), as :func:`gemini_chat`
    reads them; never raises (the records are read again, one chat at a time, there)."""
    asked: list[tuple[bool, float, int, list[str], dict[str, Any]]] = []
    other = 0
    for index, record in enumerate(data):
        if not isinstance(record, dict) or _said(record) is None:
            other += 1
            continue
        when = iso_seconds(record.get("time"))
        asked.append((when is None, when or 0.0, -index, _conversations(record), record))
    asked.sort(key=lambda item: item[:3])  # (oldest first; the file's order where times tie)
    named: dict[str, dict[str, Any]] = {}
    chats = GeminiChats()
    unnamed, last = None, None
    by_time = 0
    for timeless, when, _, ids, record in asked:
        if ids:
            key = next((i for i in ids if i in named), ids[0])
            if key not in named:
                named[key] = {"title": _said(record), "records": []}
                chats.append(named[key])
            named[key]["records"].append(record)
            continue
        by_time += 1
        if unnamed is None or timeless or last is None or when - last > GAP_S:
            unnamed = {"title": _said(record), "records": []}
            chats.append(unnamed)
        unnamed["records"].append(record)
        last = None if timeless else when
    chats.notes = []
    if other:
        verb = "was" if other == 1 else "were"
        chats.notes.append(f"{count(other, 'Gemini activity record')} that "
                           f"{'is not a message' if other == 1 else 'are not messages'} {verb} "
                           "left out: Canvas documents created, feedback given, drafts chosen "
                           "and the like.")
    if by_time:
        chats.notes.append(f"{count(by_time, 'question')} of the Gemini activity file "
                           f"{'names' if by_time == 1 else 'name'} no conversation: put into chats "
                           f"by time, a new chat after more than {GAP_S // 60} minutes without "
                           "a question.")
    return chats


def gemini_chat(chat: Any, tally: Tally) -> Chat | None:
    """One chat of :func:`gemini_chats`: each question, then Gemini's reply to it."""
    records = chat.get("records") if isinstance(chat, dict) else None
    if not isinstance(records, list):
        raise ConversationFormatError("a chat of the Gemini activity file must list its records")
    messages = []
    for record in records:
        when = iso_seconds(record.get("time"))
        said = _said(record) or ""
        _count_files(record, tally)
        if said.strip():
            messages.append(text_message("user", said, when))
        reply, images = _reply(record.get("safeHtmlItem"))
        tally.images += images
        if reply.strip():
            messages.append(text_message("assistant", reply, when))
    return Chat(None, messages)


def _said(record: dict[str, Any]) -> str | None:
    """The user's words in a record's ``title`` (its verb cut off), or None where the
    record is not a question."""
    title = record.get("title")
    if not isinstance(title, str):
        return None
    for verb in _ASKED:
        if title.startswith(verb) or title == verb.rstrip():
            return title[len(verb):].strip()
    if title.startswith(_NOT_SAID) or not _replied(record.get("safeHtmlItem")):
        return None
    return title.strip()  # (another language's verb: Gemini replied, so it was asked)


def _replied(items: Any) -> bool:
    return isinstance(items, list) and any(
        isinstance(item, dict) and isinstance(item.get("html"), str) and item["html"].strip()
        for item in items)


def _reply(items: Any) -> tuple[str, int]:
    """The text of a record's ``safeHtmlItem`` (each item's, joined), and how many
    pictures it showed."""
    texts, images = [], 0
    for item in items if isinstance(items, list) else []:
        html = item.get("html") if isinstance(item, dict) else None
        if isinstance(html, str) and html.strip():
            text, shown = html_text(html)
            images += shown
            if text:
                texts.append(text)
    return "\n\n".join(texts), images


def _count_files(record: dict[str, Any], tally: Tally) -> None:
    """A question's attachments, left out: ``imageFile`` (a picture) and
    ``attachedFiles`` (the rest; a picture by its name)."""
    image = record.get("imageFile")
    tally.images += isinstance(image, str) and bool(image.strip())
    attached = record.get("attachedFiles")
    for name in attached if isinstance(attached, list) else []:
        if name == image:
            continue
        if isinstance(name, str) and name.lower().endswith(_IMAGE):
            tally.images += 1
        else:
            tally.files += 1


def _conversations(record: dict[str, Any]) -> list[str]:
    """The conversations a record names (``details[].url``, ``titleUrl``), in its order."""
    links = [record.get("titleUrl")]
    details = record.get("details")
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, dict):
            links += [detail.get("url"), detail.get("name")]
    ids: list[str] = []
    for link in links:
        found = _CONVERSATION.match(link) if isinstance(link, str) else None
        if found and found.group(1) not in ids:
            ids.append(found.group(1))
    return ids


# -- a reply's HTML as text ---------------------------------------------------------------------

#: elements whose content is never text (dropped whole)
_DROPPED = {"script", "style", "noscript", "template", "head", "title", "svg", "math", "iframe", "object"}
_BLOCKS = {"p", "div", "section", "article", "blockquote", "table", "tr", "ul", "ol", "dl", "dt",
           "dd", "figure", "figcaption", "header", "footer", "main", "aside", "nav", "details",
           "summary", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "pre", "address"}
_STRONG = {"b", "strong"}
_EMPHASIS = {"i", "em"}
#: the deepest list indented (a list nested deeper is indented as that one)
_INDENTS = 6


class _Text(HTMLParser):
    """A reply's HTML as Markdown-ish text: paragraphs and line breaks, lists (``- ``,
    ``1. ``), headings (``#``), bold, italics, inline code and code blocks, links as
    ``[text](url)``, table cells apart by ``|``; entities unescaped; scripts, styles and
    the like dropped with their content. One pass, no recursion: any nesting is a
    counter or a short stack (a list's indent stops at :data:`_INDENTS`)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.tail = "\n\n"  # the last two characters written (as if a block came before)
        self.dropped = 0
        self.pre = 0
        self.fence: str | None = None  # a code block's opening, written at its first text
        self.strong = self.emphasis = self.code = 0
        self.lists: list[list[Any]] = []  # [tag, items so far]
        self.link: tuple[int, str] | None = None  # where the outermost link's text starts
        self.cells = self.quotes = 0
        self.rows = 0  # a table's rows so far (its first: the header, a rule under it)
        self.images = 0

    def write(self, text: str) -> None:
        if text:
            self.out.append(text)
            self.tail = (self.tail + text)[-2:]

    def block(self) -> None:
        """End the line and leave a blank one (none at the start)."""
        if self.out and self.tail != "\n\n" and self.out[-1] != "> ":  # (a quote's first block)
            self.write("\n" if self.tail.endswith("\n") else "\n\n")

    def line(self) -> None:
        if self.out and not self.tail.endswith("\n") and self.out[-1] != "> ":
            self.write("\n")

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _DROPPED:
            self.dropped += 1
        if self.dropped:
            return
        if tag in _BLOCKS:
            self._open_block(tag, attrs)
        elif tag == "br":
            self.write("\n")
        elif tag == "li":
            self._item()
        elif tag in ("td", "th"):
            self.write(" | " if self.cells else "")
            self.cells += 1
        elif tag == "img":
            self.images += 1
        elif tag == "a" and self.link is None:
            href = dict(attrs).get("href") or ""
            self.link = (len(self.out), href if href.startswith(("https://", "http://")) else "")
        elif tag == "code" and self.pre:
            language = next((c[9:] for c in (dict(attrs).get("class") or "").split()
                             if c.startswith("language-")), "")
            if self.fence == "```":
                self.fence += language[:30]
        else:
            self._inline(tag, 1)

    def _open_block(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if (tag in ("ul", "ol") and self.lists) or tag == "tr":
            self.line()  # (a list in a list: its items under the item; a table's rows)
        else:
            self.block()
        if tag in ("ul", "ol"):
            self.lists.append([tag, 0])
        elif tag[0] == "h" and tag[1:].isdigit():
            self.write("#" * int(tag[1]) + " ")
        elif tag == "hr":
            self.write("---")
            self.block()
        elif tag == "table":
            self.rows = 0
        elif tag == "tr":
            self.cells = 0
            self.write("| ")
        elif tag == "pre":
            self.pre += 1
            if self.pre == 1:
                self.fence = "```"
        elif tag == "blockquote":
            self.quotes += 1
            if self.quotes == 1:  # (a quote in a quote: the same quote)
                self.write("> ")

    def _item(self) -> None:
        self.line()
        kind = self.lists[-1] if self.lists else ["ul", 0]
        kind[1] += 1
        indent = "  " * min(max(len(self.lists) - 1, 0), _INDENTS)
        self.write(f"{indent}{kind[1]}. " if kind[0] == "ol" else f"{indent}- ")

    def _inline(self, tag: str, step: int) -> None:
        """Bold, italics and inline code: a mark where the outermost opens or closes (none
        in a code block)."""
        if self.pre:
            return
        for names, attr, mark in ((_STRONG, "strong", "**"), (_EMPHASIS, "emphasis", "*"),
                                  ({"code"}, "code", "`")):
            if tag in names:
                depth = getattr(self, attr)
                if step < 0 and depth == 0:
                    return  # (a closing tag never opened)
                setattr(self, attr, depth + step)
                if (depth == 0 and step > 0) or (depth == 1 and step < 0):
                    self.write(mark)

    def handle_endtag(self, tag: str) -> None:
        if tag in _DROPPED:
            self.dropped = max(self.dropped - 1, 0)
            return
        if self.dropped:
            return
        if tag in ("ul", "ol") and self.lists:
            self.lists.pop()
            if self.lists:
                self.line()
            else:
                self.block()
        elif tag == "pre" and self.pre:
            self.pre -= 1
            if not self.pre:
                self._close_fence()
        elif tag in _BLOCKS:
            self.quotes -= tag == "blockquote" and self.quotes > 0
            if tag == "tr":  # a Markdown table's row, the rule under its first
                self.write(" |" + ("\n|" + "---|" * max(self.cells, 1) if not self.rows else ""))
                self.rows += 1
                self.line()
            else:
                self.block()
        elif tag == "a" and self.link is not None:
            start, href = self.link
            self.link = None
            text = "".join(self.out[start:])
            if href and text.strip() and text.strip() != href:
                del self.out[start:]
                self.write(f"[{text}]({href})")
        elif tag != "code" or not self.pre:
            self._inline(tag, -1)

    def _close_fence(self) -> None:
        if self.fence is None:  # (its text was written: the block closes)
            self.line()
            self.write("```")
        self.fence = None
        self.block()

    def handle_data(self, data: str) -> None:
        if self.dropped or not data:
            return
        if self.pre:
            if self.fence is not None:
                self.line()
                self.write(self.fence + "\n")
                self.fence = None
            self.write(data)
            return
        text = " ".join(data.split())
        if data[:1].isspace() and text and not self.tail.endswith((" ", "\n")):
            text = " " + text
        elif not text and data and not self.tail.endswith((" ", "\n")):
            text = " "
        if data[-1:].isspace() and text.strip():
            text += " "
        self.write(text)

    def text(self) -> str:
        self.close()
        if self.pre and self.fence is None:
            self.write("\n```")
        for depth, mark in ((self.code, "`"), (self.emphasis, "*"), (self.strong, "**")):
            if depth and not self.dropped:
                self.write(mark)
        lines = "".join(self.out).split("\n")
        text = "\n".join(line.rstrip() for line in lines)
        return re.sub(r"\n{3,}", "\n\n", text).strip()


def html_text(html: str) -> tuple[str, int]:
    """A reply's HTML (``safeHtmlItem``'s) as text (:class:`_Text`), and how many
    pictures it showed (left out)."""
    parser = _Text()
    parser.feed(_tamed(html))
    return parser.text(), parser.images


def _tamed(html: str) -> str:
    """``html`` without what Python's html.parser reads in time growing with the square
    of its length (an unclosed ``<!--``, or ``<a href='`` a hundred thousand times: 4 s
    for 400 KB, 87 s for 1.6 MB): comments, declarations and processing instructions
    dropped (an unclosed comment hides the rest, as in a browser); a ``<`` whose tag does
    not close before the next ``<`` is text. One pass: each search starts where the last
    ended."""
    out: list[str] = []
    i, close, end = 0, -1, len(html)
    while i < end:
        j = html.find("<", i)
        if j < 0:
            out.append(html[i:])
            break
        out.append(html[i:j])
        if html.startswith("<!--", j):
            k = html.find("-->", j + 4)
            if k < 0:
                break
            i = k + 3
            continue
        if close <= j:
            close = html.find(">", j + 1)
        if close < 0:
            out.append(html[j:].replace("<", "&lt;"))
            break
        after = html.find("<", j + 1, close)
        if after >= 0:  # (not a tag: another "<" comes first)
            out.append("&lt;")
            i = j + 1
        elif html.startswith(("<!", "<?"), j):  # (a declaration, CDATA, an instruction)
            i = close + 1
        else:
            out.append(html[j:close + 1])
            i = close + 1
    return "".join(out)


# -- Takeout's HTML variant ---------------------------------------------------------------------

_HTML_HEADER = re.compile(r'class="header-cell[^"]*"[^>]*>\s*<p class="mdl-typography--title">\s*'
                          r"(?:Gemini|Bard)")


def is_activity_html(text: str) -> bool:
    """Whether ``text`` is Takeout's My Activity page for Gemini Apps (its HTML variant,
    ``My Activity.html``): an activity card's header naming Gemini or Bard near the start."""
    head = text[:1_000_000]
    return head.lstrip()[:1] == "<" and _HTML_HEADER.search(head) is not None


def html_refusal(path: Hashable) -> str:
    return (f"{path}: this is Google Takeout's My Activity page for Gemini (HTML), which Iris "
            "does not read; export it again choosing JSON as My Activity's format in Takeout, "
            "and import its MyActivity.json")
