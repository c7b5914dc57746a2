"""Conversations from other apps: ChatGPT's and Claude's data exports (``conversations.json``,
the folder it is in, or the zip archive they are downloaded as: :mod:`.export_zip`; Claude's
read by :mod:`.foreign_claude`), Open WebUI's export, LM Studio's conversation files and
Jan's threads, besides Iris's own exports and OpenAI message lists
(:mod:`iris_desktop.core.conversation`, which reads those two).

:func:`load_conversations` tells the format from the content (never from the file name),
converts every chat the file holds into Iris's message format and validates each one with
:func:`~iris_desktop.core.conversation.validate_messages` before anything is written; a
chat that cannot be read is skipped and named in the import's sentence, the others
imported (:mod:`.foreign_chats`; halves of UTF-16 pairs and CESU-8 mended:
:mod:`.foreign_text`; a loop of parents cut: :func:`.foreign_tree.unloop`). A source's message tree
(ChatGPT's ``mapping``, Open WebUI's ``history``, LM Studio's versions) becomes Iris
branches (``"iris": {"id", "parent_id", "active"}``), the branch the app showed last
active; a chat of one branch stays a plain list. Iris's alternatives are of one role, so a
second message of the asker's side after the same message as a reply becomes an
alternative of that message holding both texts; first messages of different roles keep
the active branch's, the rest counted in a note. :func:`import_conversations` stores them,
one thread per chat, a few chats per short transaction; a chat whose messages a thread
already holds (the same export imported again) is said and not stored twice, unless asked.

Iris keeps the conversation as text. What it leaves out is counted and said in one
sentence each (``Loaded.notes``): images and other attached files; the steps of tools
(web searches, code runs, image generation: the replies that used them are kept; a call
and its result are one step); the
model's hidden reasoning (ChatGPT's thoughts, ``<details type="reasoning">``, LM Studio's
thinking blocks, ``<think>``) is dropped without a note, as the apps themselves do not send
it back to the model. Hidden and empty messages (ChatGPT's system and context nodes) are
skipped, and a chat left with no text message is skipped with a note. A chat's own system
prompt (Open WebUI's, LM Studio's, a Jan assistant's instructions) becomes its leading
system message, which Iris sends as the chat's system prompt. A document a reply wrote
(Claude's artifacts, ChatGPT's canvas) is no tool step: it stays in the reply, as a titled
fenced block (:class:`~iris_desktop.core.foreign_parts.Documents`). ChatGPT's citation
markers become the cited link, or go. A reply cut off in the app (ChatGPT's stopped or
unfinished one, LM Studio's stopped or failed one) is a stopped reply, as Iris's own are,
and one that reached the app's length limit (ChatGPT's ``finish_details`` "max_tokens",
LM Studio's ``maxPredictedTokensReached`` or ``contextLengthReached``) a cut-off one;
an LM Studio chat, which dates no message, is dated by the conversation's times.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from iris_desktop.core import big_json
from iris_desktop.core.big_json import read_json as _read_json
from iris_desktop.core.big_json import read_jsonl as _read_jsonl
from iris_desktop.core.big_json import value_of as _json
from iris_desktop.core.big_json import values_of_lines as _jsonl
from iris_desktop.core.conversation import (
    MAX_IMPORT_BYTES,
    TREE_KEY,
    ConversationFormatError,
    import_messages,
    load_conversation,
    title_from,
)
from iris_desktop.core.export_zip import EXPORT_NAME, bad_shard, folder_shards, zipped_export
from iris_desktop.core.foreign_chats import SURPRISES as _SURPRISES
from iris_desktop.core.foreign_chats import Converting, raw_title, skipped_said
from iris_desktop.core.foreign_chats import a as _a
from iris_desktop.core.foreign_chats import clipped as _clipped
from iris_desktop.core.foreign_chats import unexpected as _unexpected
from iris_desktop.core.foreign_claude import claude_chat
from iris_desktop.core.foreign_claude_parts import folder_parts, is_manifest, manifest_parts
from iris_desktop.core.foreign_formats import (
    SHAREGPT,
    SILLYTAVERN,
    is_sharegpt,
    is_sillytavern,
    sharegpt_chat,
    sillytavern_chat,
)
from iris_desktop.core.foreign_llamacpp import (
    LLAMA_CPP,
    is_llamacpp,
    llamacpp_chat,
    llamacpp_sessions,
)
from iris_desktop.core.foreign_local import NEWEST_FIRST, READERS, local_kind
from iris_desktop.core.foreign_parts import Chat, Documents, read_before
from iris_desktop.core.foreign_parts import Tally as _Tally
from iris_desktop.core.foreign_parts import count as _count
from iris_desktop.core.foreign_parts import cut_blocks as _cut_blocks
from iris_desktop.core.foreign_parts import hashable as _hashable
from iris_desktop.core.foreign_parts import strip_reasoning as _strip_reasoning
from iris_desktop.core.foreign_parts import text_message as _message
from iris_desktop.core.foreign_parts import tree_messages as _tree
from iris_desktop.core.foreign_parts import usable_title as _title
from iris_desktop.core.foreign_shapes import READS, named_refusal
from iris_desktop.core.foreign_text import mend_value, read_text
from iris_desktop.core.foreign_tree import Node
from iris_desktop.core.import_twins import StoredThreads
from iris_desktop.core.store import Store, explain
from iris_desktop.tokens import Message

CHATGPT = "ChatGPT export"
OPEN_WEBUI = "Open WebUI export"
LM_STUDIO = "LM Studio conversation"
CLAUDE = "Claude export"
JAN = "Jan thread"
JAN_FOLDER = "Jan threads folder"
IRIS = "Iris export"
OPENAI = "OpenAI message list"
#: the formats conversation.py reads (no summary is printed for them: nothing is new)
NATIVE = (IRIS, OPENAI)

UNKNOWN_SHAPE = f"not a conversation Iris knows: it reads {READS}"

#: keys only the foreign formats have; a file that holds none is left to conversation.py
_SIGNATURE = re.compile(r'"(mapping|current_node|currentId|childrenIds|history|chat|chat_messages|conv|titleSet|'
                        r'currentlySelected|versions|thread_id|object|conversations|items|parentMessageId|config|'
                        r'safeHtmlItem|header)"\s*:')
#: the kinds of Open WebUI's ``<details type="…">`` blocks that hold no reply text
_DETAILS_TYPE = re.compile(r'\btype="(reasoning|tool_calls|code_interpreter)"')
_ROLES = ("system", "user", "assistant")


class Loaded(tuple):
    """``(format, chats)``: the format's name and each chat's (title or None, messages in
    Iris's format, with the tree key when branched). ``notes``: what was left out, one
    sentence each; ``read``: the notes on reading the files (not on a chat), ``skipped``:
    the chats skipped, counted (each chat's own tally is its ``tally``)."""

    def __new__(cls, fmt: str, chats: list[Chat], notes: Iterable[str] = (),
                read: Iterable[str] = (), skipped: _Tally | None = None):
        self = super().__new__(cls, (fmt, chats))
        self.notes = list(notes)
        self.read = list(read)
        self.skipped = skipped or _Tally()
        return self

    def left_out(self, stored: Iterable[Chat]) -> list[str]:
        """The notes on what was left out of the ``stored`` chats, and on the file."""
        tally = _Tally().add(self.skipped)
        for chat in stored:
            tally.add(chat.tally)
        return [*self.read, *tally.notes()]

    @property
    def format(self) -> str:
        return self[0]

    @property
    def chats(self) -> list[Chat]:
        return self[1]

    @property
    def foreign(self) -> bool:
        return self.format not in NATIVE

    def summary(self, stored: int | None = None) -> str:
        """'imported 3 chats from a ChatGPT export', and the chats skipped whole: '…; skipped
        1 (“Trip plans”: why)' (``stored``: how many were, if not all)."""
        said = skipped_said(self.skipped.skipped)
        return (f"imported {_count(len(self.chats) if stored is None else stored, 'chat')} "
                f"from {_a(self.format)}{f'; {said}' if said else ''}")

    def report(self) -> list[str]:
        """The summary, then the notes: what a user is told after an import."""
        return [self.summary(), *self.notes]


#: told how far an import is: (chats done, chats in all), now and then
Progress = Callable[[int, int], None]
#: seconds between two words of how far the chats of an export are converted
PROGRESS_S = 0.25


def load_conversations(path: str | Path, progress: Progress | None = None) -> Loaded:
    """Read ``path`` (a file, or a Jan thread folder or threads folder) and return its
    chats (``progress``: told as an export's chats are converted). Raises
    ConversationFormatError, and nothing else, for anything it cannot import; the
    message is one sentence."""
    with big_json.kept_apart():  # its parsed values: gone when this returns
        return _load(Path(path), progress)


def _load(path: Path, progress: Progress | None = None) -> Loaded:
    """:func:`load_conversations`."""
    try:
        folder = path.is_dir()
    except OSError:
        folder = False
    if folder and _is_file(path / EXPORT_NAME):  # ChatGPT's or Claude's export, unzipped
        path, folder = path / EXPORT_NAME, False
    # a newer ChatGPT export, unzipped: its chats in conversations-000.json, -001.json…
    zipped = folder_shards(path, read_text) if folder else None
    if folder and zipped is None:  # Claude's since 2026: conversations-000.zip (or unzipped)…
        zipped = folder_parts(path, read_text)
    if folder and zipped is None:
        return _guard(path, JAN, lambda: _jan_folder(path))
    zipped = zipped_export(path) if zipped is None else zipped
    text = read_text(path, MAX_IMPORT_BYTES) if zipped is None else zipped
    if zipped is None and is_manifest(text):  # its manifest: the parts beside it
        text = zipped = manifest_parts(path, text, read_text) or text
    stripped = text.lstrip()
    if not stripped.startswith("{") and not _SIGNATURE.search(stripped):
        del stripped
        return _native(path, zipped is not None, text=text)  # (read once, not again there)
    data = _json(text)
    if data is None:
        lines = _jsonl(text)
        if lines is not None and _jan_messages(lines):
            thread, problem = _read_json(path.parent / "thread.json", soft=True)
            return _guard(path, JAN, lambda: _finish(path, JAN, [
                lambda tally: _jan_chat(thread, lines, tally, problem)]))
        if lines is not None and is_sillytavern(lines):
            return _guard(path, SILLYTAVERN, lambda: _finish(path, SILLYTAVERN, [
                lambda tally: sillytavern_chat(lines, tally)]))
        if (sessions := llamacpp_sessions(lines)) is None and not (lines and is_sharegpt(lines)):
            del stripped
            return _native(path, zipped is not None, zipped and bad_shard(zipped), text)
        data = lines if sessions is None else sessions  # (ShareGPT's, or llama.cpp's JSONL)
    del text, stripped
    if isinstance(data, dict) and _jan_messages([data]):  # a Jan messages.jsonl of one line
        thread, problem = _read_json(path.parent / "thread.json", soft=True)
        return _guard(path, JAN, lambda: _finish(path, JAN, [
            lambda tally: _jan_chat(thread, [data], tally, problem)]))
    kind, items = _kind(data)
    if kind is None:
        if isinstance(data, dict) and not isinstance(data.get("messages"), list) \
                and "role" not in data:
            raise ConversationFormatError(named_refusal(path) or f"{path}: {UNKNOWN_SHAPE}")
        del data
        return _native(path, zipped is not None)
    if kind == JAN:
        lines = _read_jsonl(path.parent / "messages.jsonl")
        return _guard(path, JAN, lambda: _finish(path, JAN, [
            lambda tally: _jan_chat(data, lines, tally)]))
    convert = {CHATGPT: _chatgpt_chat, OPEN_WEBUI: _openwebui_chat, LM_STUDIO: _lmstudio_chat,
               CLAUDE: claude_chat, LLAMA_CPP: llamacpp_chat, SHAREGPT: sharegpt_chat, **READERS}[kind]
    converters = [(lambda tally, item=item: convert(item, tally)) for item in items]
    names = [raw_title(item) for item in items]  # (a chat that cannot be read: named)
    items.clear()  # each chat's parsed values freed once it is converted (_finish), not
    # all at once at the end (a pause of the window's thread: 0.75 s for 150 MB)
    return _guard(path, kind, lambda: _finish(path, kind, converters, progress=progress,
                                              names=names, notes=getattr(items, "notes", ())))


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a folder one may not look into: the Jan reader names it
        return False


class Imported(NamedTuple):
    """What an import stored: the new threads' ids, and for each chat that was already
    there (the same messages, in the same order), the thread that holds it."""

    ids: list[int]
    known: list[int]
    #: the known threads' titles, in the same order
    titles: list[str]
    #: what was left out of the chats stored (None: ``loaded.notes``, all of them stored)
    notes: list[str] | None = None
    #: the chats not stored because a known thread holds them, in the same order (what
    #: the window imports again when asked)
    known_chats: tuple[Chat, ...] = ()

    def report(self, loaded: Loaded, hint: str = "", by_title: bool = False) -> list[str]:
        """What a user is told: ``loaded.report()`` for another app's file, with the chats
        that were there already said, by thread id or (``by_title``: the app, which shows
        no ids) by title, and ``hint``: how to import them anyway."""
        # (a native file has no summary line: only its notes, its characters mended)
        lines = loaded.report() if loaded.foreign else loaded.left_out(loaded.chats)
        if not self.known:
            return lines
        skipped = skipped_said(loaded.skipped.skipped) if loaded.foreign else ""
        head = [loaded.summary(len(self.ids))] if self.ids and loaded.foreign else \
            [skipped] if skipped else []
        names = [f"“{_clipped(t)}”" for t in self.titles] if by_title else [str(t) for t in self.known]
        which = ", ".join(names[:10]) + (", …" if len(names) > 10 else "")
        verb = "was" if len(self.known) == 1 else "were"
        notes = (lines[1:] if loaded.foreign else lines) if self.notes is None else self.notes
        return [*head, f"{_count(len(self.known), 'chat')} {verb} imported before "
                       f"({'' if by_title else 'thread '}{which}) and {verb} not imported "
                       f"again{hint}", *(notes if self.ids else [])]  # (left-out notes: of chats stored now)


#: the longest an import holds the database's write lock at once, in seconds: it commits
#: and lets others write between chunks of chats (one transaction for a whole 279 MB
#: export held it for 25 s, and a reply the window was writing meanwhile failed)
CHUNK_S = 0.25
#: the least time the lock is left free after each chunk: a waiting writer's busy handler
#: looks again every few ms to 100 ms (one that followed the commit at once never got in)
YIELD_S = 0.02


def import_conversations(store: Store, loaded: Loaded, title: str | None = None,
                         again: bool = False, progress: Progress | None = None) -> Imported:
    """Store each chat of ``loaded`` as a new thread, a few chats per transaction (at most
    about :data:`CHUNK_S` each: a killed import keeps the chats stored so far, and running
    it again adds the rest); returns the new threads' ids, and the threads that already
    hold a chat (the same messages in the same order, at the same times where both say:
    the same export imported twice), which is not stored again unless ``again``. Whether
    a chat is there already is decided in the transaction that would store it, so two
    imports at once store it once. ``title`` names a single chat, or prefixes the titles
    of several. An import that fails after it stored chats raises :class:`PartlyImported`,
    which says so (nothing stored: the error itself). ``progress`` is told after each
    transaction (chats stored or found there already, of all)."""
    with big_json.kept_apart():  # the chats read: out of the collector's walks meanwhile
        return _store_chats(store, loaded, title, again, progress)


def _store_chats(store: Store, loaded: Loaded, title: str | None, again: bool,
                 progress: Progress | None) -> Imported:
    """:func:`import_conversations`."""
    ids: list[int] = []
    known: list[int] = []
    stored: list[Chat] = []
    known_chats: list[Chat] = []
    several = len(loaded.chats) > 1
    threads = StoredThreads(store, again)
    pending = list(reversed(loaded.chats))
    sizes = _sizes(pending)
    try:
        while pending:
            threads.prepare(sizes, ids)  # (reads: no lock held)
            with store.transaction():
                started, chunk = time.monotonic(), []
                threads.catch_up(ids)  # (only what was written since: counted in the chunk)
                while pending and time.monotonic() - started < CHUNK_S:
                    chat = pending.pop()
                    twin = threads.holding(chat.messages, chat.before)
                    if twin is not None:
                        known.append(twin)
                        known_chats.append(chat)
                        continue
                    own = chat.title or title_from(chat.messages)
                    name = (f"{title}: {own}" if several else title) if title else own
                    chunk.append((import_messages(store, chat.messages, name, chat.system_prompt),
                                  chat))
                threads.seen_own()
            ids += [thread for thread, _ in chunk]  # committed
            stored += [chat for _, chat in chunk]
            if progress is not None and pending:
                progress(len(loaded.chats) - len(pending), len(loaded.chats))
            if pending:  # the lock free a while: another process's waiting write gets in
                time.sleep(max(YIELD_S, (time.monotonic() - started) / 10))
    except Exception as exc:
        if not ids:
            raise
        reason = explain(exc, store.path) if isinstance(exc, sqlite3.Error) else str(exc)
        raise PartlyImported(Imported(ids, [], []), reason) from exc
    notes = loaded.left_out(stored) if known else None
    return Imported(ids, known, [threads.titles[t] for t in known], notes, tuple(known_chats))


def _sizes(chats: Iterable[Chat]) -> set[int]:
    """The message counts a stored twin of ``chats`` may have."""
    return {len(form) for chat in chats for form in (chat.messages, chat.before) if form}


class PartlyImported(Exception):
    """An import that failed after it had stored some chats (each chunk is committed):
    ``imported`` holds their threads; the message says how many, why it stopped
    (``reason``), and that importing the same file again adds only the rest."""

    def __init__(self, imported: Imported, reason: str):
        stored = len(imported.ids)
        super().__init__(f"{_count(stored, 'chat')} {'was' if stored == 1 else 'were'} stored "
                         f"before the import failed: {reason.rstrip('.')} (importing the same "
                         "file again adds only the rest)")
        self.imported = imported
        self.reason = reason


# -- reading --------------------------------------------------------------------------------


def _native(path: Path, zipped: bool = False, bad: str | None = None,
            text: str | None = None) -> Loaded:
    """``bad``: why a part of a newer export's chats is not JSON (it is named); ``text``:
    the file's, where it was read already (else it is read here)."""
    if zipped:
        raise ConversationFormatError(f"{path}: {bad}" if bad else f"{path}: its {EXPORT_NAME} "
                                      "is not a ChatGPT or Claude export")
    try:  # (read as other apps' files are: CESU-8, halves of UTF-16 pairs mended)
        text = read_text(path, MAX_IMPORT_BYTES) if text is None else text
        messages, title, system_prompt = load_conversation(path, text, mend_value)
    except ConversationFormatError as exc:  # another app's file: said by its name
        raise ConversationFormatError(named_refusal(path) or str(exc)) from None
    fmt = IRIS if any(TREE_KEY in m for m in messages) else OPENAI
    mended = _Tally(mended=messages.mended) if messages.mended else None
    return Loaded(fmt, [Chat(title, messages, system_prompt, mended)])


def _kind(data: Any) -> tuple[str | None, list[Any]]:
    """(format, the chats' raw objects) for a parsed JSON value; (None, []) for one
    conversation.py reads, or an unknown shape."""
    if isinstance(data, list) and data:
        # a stray null or number among the chats is that chat's error, not another format's
        objects = [x for x in data if isinstance(x, dict)]
        if any("role" in x for x in objects):
            return None, []
        if any("mapping" in x or "current_node" in x for x in objects):
            return CHATGPT, data
        if any(isinstance(x.get("chat"), dict) for x in objects):
            return OPEN_WEBUI, data
        if any(isinstance(x.get("chat_messages"), list) for x in objects):
            return CLAUDE, data
        if any(is_llamacpp(x) for x in objects):
            return LLAMA_CPP, data
        return (SHAREGPT, data) if is_sharegpt(objects) else local_kind(data)
    if not isinstance(data, dict) or "role" in data:
        return None, []
    if is_llamacpp(data) or is_sharegpt(data):
        return LLAMA_CPP if is_llamacpp(data) else SHAREGPT, [data]
    if "mapping" in data and ("current_node" in data or "title" in data):
        return CHATGPT, [data]
    if isinstance(data.get("chat"), dict):
        return OPEN_WEBUI, [data]
    history = data.get("history")
    if isinstance(history, dict) and isinstance(history.get("messages"), dict):
        return OPEN_WEBUI, [data]
    messages = data.get("messages")
    if isinstance(messages, list) and any(isinstance(m, dict) and "versions" in m
                                          for m in messages):
        return LM_STUDIO, [data]
    if data.get("object") == "thread":
        return JAN, [data]
    if isinstance(data.get("chat_messages"), list):
        return CLAUDE, [data]
    return local_kind(data)  # LibreChat, text-generation-webui, BetterChatGPT


def _jan_messages(lines: list[Any]) -> bool:
    return bool(lines) and all(isinstance(x, dict) for x in lines) and all(
        x.get("object") == "thread.message" or "thread_id" in x for x in lines)


# -- what every format shares -------------------------------------------------------------------


def _guard(path: Path, fmt: str, build: Callable[[], Loaded]) -> Loaded:
    """Any surprise in a file that looked like ``fmt`` becomes one sentence."""
    try:
        return build()
    except ConversationFormatError:
        raise
    except RecursionError:
        raise ConversationFormatError(f"{path}: nested too deeply to be {_a(fmt)}") from None
    except _SURPRISES as exc:
        raise ConversationFormatError(f"{path}: {_unexpected(fmt, exc)}") from None


def _finish(path: Path, fmt: str, converters: list[Callable[[_Tally], Chat | None]],
            notes: Sequence[str] = (), progress: Progress | None = None,
            names: Sequence[str | None] = ()) -> Loaded:
    """Convert, mend and validate every chat (:class:`~.foreign_chats.Converting`); skip
    (and count) the ones with no text, and name the ones that cannot be read as they are
    (``names``: their titles as the app wrote them). ``notes``: what reading the files
    left out already. Each chat's tally is its own (a chat imported before is not stored
    again, nor counted). Each converter (and so its parsed values) is let go of in
    ``converters`` once it ran."""
    chats = Converting(path, fmt, len(converters), names)
    with big_json.paused():  # the chats made: kept out of the collector's walks
        told = time.monotonic()
        for number, convert in enumerate(converters, start=1):
            try:
                chats.add(number, convert)
            finally:
                converters[number - 1] = None
            if progress is not None and time.monotonic() - told >= PROGRESS_S:
                progress(number, len(converters))
                told = time.monotonic()
    refusal = chats.refusal()
    if refusal is not None:
        raise ConversationFormatError(refusal)
    tally, skipped = chats.tally, chats.skipped
    if not chats.chats:
        said = [*notes, *skipped.skipped]
        raise ConversationFormatError(f"{path}: the {fmt} holds no chat with a text message"
                                      + "".join(f" ({note.rstrip('.')})" for note in said))
    if fmt == JAN and len(chats.chats) > 1:
        fmt = JAN_FOLDER
    made = chats.chats[::-1] if fmt in NEWEST_FIRST else chats.chats
    return Loaded(fmt, made, [*notes, *tally.add(skipped).notes()], notes, skipped)


# -- ChatGPT ------------------------------------------------------------------------------------

_HIDDEN_TYPES = {"thoughts", "reasoning_recap", "user_editable_context",
                 "model_editable_context", "system_error"}
_IMAGE_PARTS = {"image_asset_pointer"}
_TEXT_PARTS = {"audio_transcription"}


@read_before  # (and as an earlier Iris read it: its imports are known)
def _chatgpt_chat(conversation: Any, tally: _Tally, documents: Documents) -> Chat | None:
    if not isinstance(conversation, dict):
        raise ConversationFormatError("a conversation must be a JSON object")
    mapping = conversation.get("mapping")
    if mapping is None and isinstance(conversation.get("chat"), dict):
        raise ConversationFormatError("it is an Open WebUI chat, not a ChatGPT conversation "
                                      "(export each app's chats to a file of its own)")
    if mapping is None:
        return None
    if not isinstance(mapping, dict):
        raise ConversationFormatError("its 'mapping' must be an object of message nodes")
    nodes: dict[Hashable, Node] = {}
    steps = {key for key, node in mapping.items() if isinstance(node, dict) and _step(node)}
    for key, node in mapping.items():
        if not isinstance(node, dict):
            raise ConversationFormatError(f"node {key!r} of its 'mapping' is not an object")
        parent = node.get("parent")
        kids = node.get("children")
        nodes[key] = Node(parent if isinstance(parent, str) else None,
                           _chatgpt_message(node.get("message"), tally, documents,
                                            parent in steps if isinstance(parent, str) else False),
                           [k for k in kids if isinstance(k, str)] if isinstance(kids, list) else [])
    active = conversation.get("current_node")
    messages = _tree(nodes, active if isinstance(active, str) else None, tally=tally)
    return Chat(_title(conversation.get("title")), messages)


def _step(node: dict[str, Any]) -> bool:
    """Whether a node is a tool's call (the assistant's message to a recipient) or result."""
    message = node.get("message")
    author = message.get("author") if isinstance(message, dict) else None
    role = author.get("role") if isinstance(author, dict) else None
    return role == "tool" or (role == "assistant" and message.get("recipient") not in (None, "all"))


def _chatgpt_message(message: Any, tally: _Tally, documents: Documents,
                     after_step: bool = False) -> Message | None:
    """A visible user or assistant message as text; None for the rest (system and hidden
    nodes, tool calls and results, reasoning), counting what a user would miss: a tool's
    step once (a result ``after_step``, a call's or another result's, is the same step).
    A canvas document (``canmore``) is the reply's text."""
    if not isinstance(message, dict):
        return None
    author = message.get("author") if isinstance(message.get("author"), dict) else {}
    role = author.get("role")
    meta = message.get("metadata") if isinstance(message.get("metadata"), dict) else {}
    content = message.get("content") if isinstance(message.get("content"), dict) else {}
    kind = content.get("content_type")
    if meta.get("is_visually_hidden_from_conversation") or meta.get("is_user_system_message") \
            or kind in _HIDDEN_TYPES:
        return None
    recipient = message.get("recipient")
    if role == "assistant" and isinstance(recipient, str) and recipient.startswith("canmore.") \
            and isinstance(content.get("text"), str):
        document = documents.canvas(recipient, content["text"])
        if document is not None:
            return _message(role, document, message.get("create_time")) if document else None
    if role == "tool" or (role == "assistant" and recipient not in (None, "all")):
        tally.tools += not (role == "tool" and after_step)  # what it made: a tool's output
        return None
    if role not in ("user", "assistant"):
        return None
    attachments = meta.get("attachments")
    if isinstance(attachments, list):  # (a picture's is counted as its image part)
        tally.files += sum(not _picture(a, content) for a in attachments)
    text = _chatgpt_text(content, kind, tally)
    if role == "assistant":
        text = documents.cited(text, meta.get("content_references"), meta.get("citations"))
    if not text.strip():
        return None
    finish = meta.get("finish_details") if isinstance(meta.get("finish_details"), dict) else {}
    # cut off: stopped by the user, or still being written when exported (a reply that
    # says it ended on its own, "stop", is finished whatever its status says)
    stopped = role == "assistant" and finish.get("type") != "stop" and (
        message.get("status") == "in_progress" or finish.get("type") == "interrupted")
    cut = role == "assistant" and finish.get("type") == "max_tokens"  # its length limit
    return _message(role, text, message.get("create_time"), stopped, cut)


def _picture(attachment: Any, content: dict[str, Any]) -> bool:
    """Whether an attachment is a picture the message shows (an image part): an
    ``image/`` type or, where none is given (a real export of June 2025), the id of an
    image part's pointer (``file-service://…``, ``sediment://…``) or a width and height."""
    if not isinstance(attachment, dict):
        return False
    parts = content.get("parts") if isinstance(content.get("parts"), list) else []
    pointers = {str(p.get("asset_pointer", "")).rpartition("/")[2] for p in parts
                if isinstance(p, dict) and p.get("content_type") in _IMAGE_PARTS}
    return str(attachment.get("mime_type", "")).startswith("image/") \
        or str(attachment.get("id")) in pointers or {"width", "height"} <= attachment.keys()


def _chatgpt_text(content: dict[str, Any], kind: Any, tally: _Tally) -> str:
    if kind == "code" and isinstance(content.get("text"), str):
        language = content.get("language")
        fence = language if isinstance(language, str) and language != "unknown" else ""
        return f"```{fence}\n{content['text']}\n```"
    parts = content.get("parts")
    if isinstance(parts, list):
        texts = []
        for part in parts:
            if isinstance(part, str):
                if part.strip():
                    texts.append(part)
            elif isinstance(part, dict):
                part_type = part.get("content_type")
                if part_type in _TEXT_PARTS and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif part_type in _IMAGE_PARTS:
                    tally.images += 1
                else:
                    tally.files += 1
        return "\n\n".join(texts)
    text = content.get("text")
    return text if isinstance(text, str) else ""


# -- Open WebUI ---------------------------------------------------------------------------------


def _openwebui_chat(item: Any, tally: _Tally) -> Chat | None:
    if not isinstance(item, dict):
        raise ConversationFormatError("a chat must be a JSON object")
    chat = item.get("chat") if isinstance(item.get("chat"), dict) else item
    if "chat" in item and not isinstance(item["chat"], dict):
        raise ConversationFormatError("its 'chat' must be an object")
    title = _title(chat.get("title")) or _title(item.get("title"))
    params = chat.get("params") if isinstance(chat.get("params"), dict) else {}
    system = params.get("system") if isinstance(params.get("system"), str) else None
    history = chat.get("history")
    nodes: dict[Hashable, Node] = {}
    if isinstance(history, dict) and isinstance(history.get("messages"), dict):
        source = list(history["messages"].items())
        active = history.get("currentId")
    elif isinstance(chat.get("messages"), list):  # an older export: the shown branch only
        source = [(m.get("id", i) if isinstance(m, dict) else i, m)
                  for i, m in enumerate(chat["messages"])]
        if len({_hashable(k) for k, _ in source}) < len(source):
            # ids that repeat name no message for sure: the list's order is the branch
            source = [(i, {k: v for k, v in m.items() if k != "parentId"} if isinstance(m, dict) else m)
                      for i, (_, m) in enumerate(source)]
        active = source[-1][0] if source else None
    else:
        return None
    previous = None
    for key, message in source:
        if not isinstance(message, dict):
            raise ConversationFormatError(f"message {key!r} is not an object")
        parent = message.get("parentId", previous) if "history" not in chat else message.get("parentId")
        kids = message.get("childrenIds")
        nodes[_hashable(key)] = Node(_hashable(parent) if parent is not None else None,
                                      _openwebui_message(message, tally),
                                      [_hashable(k) for k in kids] if isinstance(kids, list) else [])
        previous = key
    messages = _tree(nodes, _hashable(active) if active is not None else None,
                     system.strip() if system and system.strip() else None, tally)
    return Chat(title, messages)


def _openwebui_message(message: dict[str, Any], tally: _Tally) -> Message | None:
    role = message.get("role")
    if role not in _ROLES:
        return None
    files = message.get("files")
    for file in files if isinstance(files, list) else []:  # attachments' metadata only
        if isinstance(file, dict):
            if file.get("type") == "image":
                tally.images += 1
            else:
                tally.files += 1
    content = message.get("content")
    if isinstance(content, list):  # OpenAI-style parts
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" \
                    and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, dict) and part.get("type") == "image_url":
                tally.images += 1
        content = "\n\n".join(texts)
    if not isinstance(content, str):
        return None
    if role == "assistant":
        content, kinds = _cut_blocks(content, "<details", "</details>", _details_kind)
        tally.tools += sum(k != "reasoning" for k in kinds)
        content = _strip_reasoning(content)
    if not content.strip():
        return None
    return _message(role, content, message.get("timestamp"))


def _details_kind(tag: str) -> str | None:
    """The kind of an Open WebUI ``<details …>`` tag that holds no reply text (reasoning,
    a tool's call, a code run), or None for any other ``<details>``."""
    match = _DETAILS_TYPE.search(tag)
    return match.group(1) if match else None


# -- LM Studio ----------------------------------------------------------------------------------


def _lmstudio_chat(data: dict[str, Any], tally: _Tally) -> Chat | None:
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise ConversationFormatError("its 'messages' must be a list")
    system = data.get("systemPrompt") if isinstance(data.get("systemPrompt"), str) else None
    config = data.get("perChatPredictionConfig")
    if not (system and system.strip()) and isinstance(config, dict):
        fields = config.get("fields")
        for field in fields if isinstance(fields, list) else []:
            if isinstance(field, dict) and field.get("key") == "llm.prediction.systemPrompt" \
                    and isinstance(field.get("value"), str):
                system = field["value"]
    nodes: dict[Hashable, Node] = {}
    parent: Hashable | None = None
    for i, entry in enumerate(messages):
        versions = entry.get("versions") if isinstance(entry, dict) else None
        if not isinstance(versions, list) or not versions:
            raise ConversationFormatError(f"message {i + 1} has no versions")
        chosen = entry.get("currentlySelected", 0)
        if not isinstance(chosen, int) or isinstance(chosen, bool) or not 0 <= chosen < len(versions):
            chosen = len(versions) - 1
        for j, version in enumerate(versions):
            nodes[(i, j)] = Node(parent, _lmstudio_version(version, tally), [])
        parent = (i, chosen)
    messages_out = _tree(nodes, parent, system.strip() if system and system.strip() else None, tally)
    _lmstudio_dated(messages_out, data)
    return Chat(_title(data.get("name")), messages_out)


#: the conversation's times, ms since 1970 (LM Studio keeps none per message): for the
#: shown branch's first message, its last question and its last reply
_LMSTUDIO_TIMES = ((None, "createdAt"), ("user", "userLastMessagedAt"),
                   ("assistant", "assistantLastMessagedAt"))
#: the stop reasons of a reply cut off (the LM Studio SDK's ``LLMPredictionStopReason``)
_LMSTUDIO_CUT = {"userStopped", "failed", "modelUnloaded"}
#: and of one that reached its length limit (its ``maxTokens``, or the context's end)
_LMSTUDIO_LENGTH = {"maxPredictedTokensReached", "contextLengthReached"}


def _lmstudio_dated(messages: list[Message], data: dict[str, Any]) -> None:
    """Date the shown branch by the conversation's times (before, a chat of any age was
    undated, listed as the newest at its import)."""
    shown = [m for m in messages if m["role"] != "system"
             and m.get(TREE_KEY, {}).get("active", True)]
    for role, key in _LMSTUDIO_TIMES:
        which = shown[:1] if role is None else [m for m in shown if m["role"] == role][-1:]
        when = _message(role or "user", "", data.get(key)).get("created_at")
        for message in which if when else []:
            message["created_at"] = when


def _lmstudio_version(version: Any, tally: _Tally) -> Message | None:
    if not isinstance(version, dict) or version.get("role") not in _ROLES:
        return None
    role = version["role"]
    blocks: list[Any] = []
    stop = None  # why the reply's last generated block ended
    if isinstance(version.get("steps"), list):
        for step in version["steps"]:
            if not isinstance(step, dict) or step.get("type") != "contentBlock":
                continue
            info = step.get("genInfo") if isinstance(step.get("genInfo"), dict) else {}
            stats = info.get("stats") if isinstance(info.get("stats"), dict) else {}
            stop = stats.get("stopReason", stop)
            style = step.get("style") if isinstance(step.get("style"), dict) else {}
            if style.get("type") == "thinking":
                continue
            blocks.append(step.get("content"))
    else:
        blocks.append(version.get("content"))
    texts = []
    for block in blocks:
        text = "".join(_lmstudio_parts(block, tally))
        if text.strip():
            texts.append(text)
    text = "\n\n".join(texts)
    if role == "assistant":
        text = _strip_reasoning(text)
    stopped = role == "assistant" and isinstance(stop, str) and stop in _LMSTUDIO_CUT
    cut = role == "assistant" and isinstance(stop, str) and stop in _LMSTUDIO_LENGTH
    return _message(role, text, stopped=stopped, cut=cut) if text.strip() else None


def _lmstudio_parts(parts: Any, tally: _Tally) -> Iterable[str]:
    for part in parts if isinstance(parts, list) else []:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            yield part["text"]
        elif kind == "file":
            if part.get("fileType") == "image":
                tally.images += 1
            else:
                tally.files += 1
        elif kind == "toolCallRequest":
            tally.tools += 1


# -- Jan ----------------------------------------------------------------------------------------


def _jan_folder(path: Path) -> Loaded:
    """A thread folder (thread.json, messages.jsonl) or Jan's threads folder of them."""
    def is_thread(folder: Path) -> bool:
        try:
            return (folder / "thread.json").is_file() or (folder / "messages.jsonl").is_file()
        except OSError as exc:  # a folder one may not look into (is_file raises for that)
            raise ConversationFormatError(f"{folder}: cannot read it ({exc.strerror or exc})") from None

    root = path.resolve()
    outside: list[str] = []  # links that lead out of the folder given: not followed

    def inside(item: Path) -> bool:
        if item.is_symlink() and not item.resolve().is_relative_to(root):
            outside.append(str(item.relative_to(path)))
            return False
        return True

    if is_thread(path):
        folders = [path]
    else:
        try:
            entries = sorted(p for p in path.iterdir() if p.is_dir() and inside(p))
        except OSError as exc:
            raise ConversationFormatError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        folders = [p for p in entries if is_thread(p)]
        if not folders:
            raise ConversationFormatError(f"{path} is a folder; give a file (or a ChatGPT or "
                                          "Claude export's folder, with conversations.json, or a "
                                          "Jan thread folder, with thread.json and messages.jsonl)")
    threads = []
    budget = MAX_IMPORT_BYTES
    for folder in folders:
        for name in ("thread.json", "messages.jsonl"):
            try:
                budget -= (folder / name).stat().st_size if (folder / name).is_file() else 0
            except OSError:
                pass
        if budget < 0:
            raise ConversationFormatError(
                f"{path}: its threads are larger than the limit of {MAX_IMPORT_BYTES:,} bytes")
        thread, problem = (_read_json(folder / "thread.json", soft=True)
                           if inside(folder / "thread.json") else (None, None))
        lines = _read_jsonl(folder / "messages.jsonl") if inside(folder / "messages.jsonl") else []
        threads.append((thread, lines, problem))
    threads.sort(key=lambda t: _created(t[0]))
    notes = [f"{_count(len(outside), 'link')} to places outside {path.name} "
             f"{'was' if len(outside) == 1 else 'were'} not followed: {', '.join(outside[:3])}"
             f"{', …' if len(outside) > 3 else ''}."] if outside else []
    return _finish(path, JAN, [(lambda tally, t=t: _jan_chat(*t[:2], tally, t[2])) for t in threads],
                   notes)


def _created(thread: dict[str, Any] | None) -> float:
    value = (thread or {}).get("created")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _jan_chat(thread: Any, lines: list[Any], tally: _Tally, problem: str | None = None) -> Chat | None:
    """A Jan thread's chat; ``problem``: why its thread.json (title, instructions) could
    not be read, said in a note if the thread is imported without it."""
    thread = thread if isinstance(thread, dict) else {}
    system = None
    assistants = thread.get("assistants")
    if isinstance(assistants, list) and assistants and isinstance(assistants[0], dict):
        instructions = assistants[0].get("instructions")
        system = instructions.strip() if isinstance(instructions, str) else None
    messages: list[Message] = [_message("system", system)] if system else []
    for line in lines:
        if not isinstance(line, dict) or line.get("role") not in _ROLES:
            continue
        texts = []
        content = line.get("content")
        for part in content if isinstance(content, list) else [content]:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text":
                text = part.get("text")
                text = text.get("value") if isinstance(text, dict) else text
                if isinstance(text, str):
                    texts.append(text)
            elif isinstance(part, dict) and part.get("type") in ("image_url", "image_file"):
                tally.images += 1
        text = "\n\n".join(t for t in texts if t.strip())
        if line["role"] == "assistant":
            text = _strip_reasoning(text)
        if text.strip():
            when = line.get("created_at", line.get("created"))
            messages.append(_message(line["role"], text, when))
    if not any(m["role"] != "system" for m in messages):
        return None
    if problem:
        tally.unread.append(problem)
    return Chat(_title(thread.get("title")), messages)
