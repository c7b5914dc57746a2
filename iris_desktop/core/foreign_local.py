"""Three more local apps' chat files, read into Iris's format with the parts
:mod:`iris_desktop.core.foreign` shares by every format (:func:`local_kind` tells them
apart; each converter makes one :class:`~.foreign_parts.Chat`):

- LibreChat's conversation export (Export ▸ JSON: ``{conversationId, endpoint, title,
  exportAt, branches, recursive, options, messages | messagesTree}``). Its messages are a
  tree: with ``recursive`` each holds its replies under ``children`` (under
  ``messagesTree`` since 2025, under ``messages`` before), else they are one list, each
  naming its ``parentMessageId`` (``00000000-0000-0000-0000-000000000000`` or null at a
  root). Every branch is kept; the one LibreChat shows is active: at each step the last of
  the siblings (its ``MultiMessage`` opens on the newest). ``isCreatedByUser`` asks, the
  rest answer; a message's text is ``text``, or (its agents) the ``text`` parts of
  ``content``, whose ``think`` parts are dropped, ``tool_call`` parts counted as tool
  steps and ``image_file`` / ``image_url`` parts counted as images; the reasoning
  LibreChat writes in front of a reply (``:::thinking … :::``, ``<think>``) is dropped; a
  message's ``files`` are counted (images, other files). A reply the user stopped
  (``finish_reason`` "incomplete", LibreChat's abort) or one an error cut short
  (``unfinished``) is a stopped reply; one that failed (``error``: its text is the
  error LibreChat showed) a failed one; ``finish_reason`` "length" a reply cut off.
  ``createdAt`` dates a message; ``options.promptPrefix`` is the chat's system prompt.
  A bare list of its messages (``messageId``, ``parentMessageId``, as its API gives
  them) is one chat.
- text-generation-webui's (oobabooga's) chat history (``logs/chat/<character>/<id>.json``,
  ``{internal, visible, metadata}``; early 2023: ``{data, data_visible}``): a list of
  ``[asked, replied]`` rows (a third cell: a tool's result, counted, as are the tool
  results of ``metadata``'s ``tool_sequence``; a fourth, ``{"role": "system"}``, makes the
  first a system message, as its API writes it). ``internal`` is the
  text as the model read it (``visible`` is HTML-escaped and extensions' markup: not
  read); a row asked by ``<|BEGIN-VISIBLE-CHAT|>`` (or by nothing) is the character's
  opening message alone. ``metadata`` gives ``user_<row>`` and ``assistant_<row>``: a
  ``timestamp`` ("Jan 05, 2025 14:30", this computer's time, English month names in
  any language; a reply's is rewritten as each generation of it starts: the newest
  version's), ``versions`` of an edited or regenerated message (alternatives, each with
  its own ``timestamp``; ``current_version_index`` the one shown, the rest of the chat
  under it) and ``attachments`` (a text file's ``content`` attached as Iris attaches
  a file; pictures and other files counted). A reply's ``<think>`` and
  ``<seed:think>`` blocks, and gpt-oss's analysis channel, are dropped. No title: the
  first question names the chat.
- BetterChatGPT's export (``{chats, folders, version}``; its exports of March and April
  2023: the chats alone): each chat ``{id, title, folder, messages: [{role, content}],
  config, titleSet}``, one branch, no dates; ``content`` is text, or (its newer versions)
  ``text`` and ``image_url`` parts (images counted). Folders are not kept. Its newest
  chat is its first (its ``useAddChat`` puts a new chat in front): the chats are
  imported from the last, so Iris's list shows them as BetterChatGPT did.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from iris_desktop.core.attachments import (
    MAX_ATTACHMENT_BYTES,
    MAX_FILES,
    MAX_NAME_CHARS,
    Attachment,
    model_text,
    with_attachments,
)
from iris_desktop.core.conversation import ConversationFormatError
from iris_desktop.core.foreign_formats import english_time, iso_seconds
from iris_desktop.core.foreign_gemini import GEMINI, gemini_chat, gemini_chats, is_gemini
from iris_desktop.core.foreign_parts import (
    APPS,
    Chat,
    SkippedChat,
    Tally,
    cut_blocks,
    strip_reasoning,
    text_message,
    tree_messages,
    usable_title,
)
from iris_desktop.core.foreign_text import mended
from iris_desktop.core.foreign_tree import Node
from iris_desktop.tokens import Message

LIBRECHAT = "LibreChat export"
TEXTGEN = "text-generation-webui chat history"
BETTERCHATGPT = "BetterChatGPT export"
#: the formats that list their chats newest first, with no dates (BetterChatGPT adds a new
#: chat at the front): stored oldest first (:mod:`.foreign`), as Iris lists the chat
#: stored last on top; read in the file's order, so a refusal's "chat N" counts as it does
NEWEST_FIRST = frozenset({BETTERCHATGPT})
# the app each format's replies were written in (:func:`~.foreign_parts.from_app`)
APPS.update({LIBRECHAT: "LibreChat", TEXTGEN: "text-generation-webui",
             BETTERCHATGPT: "BetterChatGPT"})

#: LibreChat's ``Constants.NO_PARENT``: the parent of a conversation's first messages
_NO_PARENT = "00000000-0000-0000-0000-000000000000"
#: text-generation-webui's asker of the character's opening message (its first row)
_OPENING = "<|BEGIN-VISIBLE-CHAT|>"
#: the two ``[asked, replied]`` lists of a text-generation-webui history: now, early 2023
_TEXTGEN_KEYS = (("internal", "visible"), ("data", "data_visible"))


def local_kind(data: Any) -> tuple[str | None, list[Any]]:
    """(format, the chats' raw objects) where ``data`` (a parsed JSON value) is one of
    these apps' files; (None, []) where it is none of them."""
    if isinstance(data, dict):
        if _librechat(data):
            return LIBRECHAT, [data]
        if any(kept in data and shown in data for kept, shown in _TEXTGEN_KEYS):
            return TEXTGEN, [data]
        if "chats" in data and "folders" in data:
            chats = data["chats"]
            return BETTERCHATGPT, chats if isinstance(chats, list) else [chats]
        return None, []
    if not isinstance(data, list) or not data:
        return None, []
    dicts = [x for x in data[:50] if isinstance(x, dict)]
    if dicts and all(map(_librechat, dicts)):
        return LIBRECHAT, data
    if any("messageId" in x and "parentMessageId" in x for x in dicts):
        return LIBRECHAT, [{"messages": data}]  # its messages alone: one chat
    if dicts and len(dicts) == len(data[:50]) and all(
            "title" in x and isinstance(x.get("messages"), list)
            and ("config" in x or "titleSet" in x) for x in dicts):
        return BETTERCHATGPT, data  # (its exports of 2023: the chats alone)
    if is_gemini(dicts):  # (Google Takeout's activity: its questions put into chats)
        return GEMINI, gemini_chats(data)
    return None, []


def _librechat(item: dict[str, Any]) -> bool:
    """A LibreChat conversation: ``conversationId`` and its messages, which are not
    OpenAI's (``role``: such a file is another tool's message list, read as one)."""
    listed = item.get("messagesTree", item.get("messages"))
    return "conversationId" in item and ("messages" in item or "messagesTree" in item) and not (
        isinstance(listed, list) and any(isinstance(m, dict) and "role" in m for m in listed[:50]))


# -- LibreChat ----------------------------------------------------------------------------------


def librechat_chat(item: Any, tally: Tally) -> Chat | None:
    if not isinstance(item, dict):
        raise ConversationFormatError("a conversation must be a JSON object")
    key = "messagesTree" if "messagesTree" in item else "messages"
    listed = item.get(key)
    if not isinstance(listed, list):
        raise ConversationFormatError(f"its {key!r} is not a list")
    nodes = _librechat_nodes(listed, tally)
    options = item.get("options") if isinstance(item.get("options"), dict) else {}
    system = options.get("promptPrefix")
    system = system.strip() if isinstance(system, str) and system.strip() else None
    return Chat(usable_title(item.get("title")),
                tree_messages(nodes, _shown(nodes), system, tally))


def _librechat_nodes(listed: list[Any], tally: Tally) -> dict[Hashable, Node]:
    """Each message of LibreChat's list or tree as a node, in its order (a parent before
    its replies): a nested message's parent is the one it is nested in (as LibreChat's
    import reads it), a listed one's its ``parentMessageId``. One pass, no recursion (a
    chain of 10,000 replies nests 10,000 deep)."""
    nodes: dict[Hashable, Node] = {}
    stack: list[tuple[Any, Hashable | None, bool]] = [(m, None, False) for m in reversed(listed)]
    while stack:
        message, parent, nested = stack.pop()
        if not isinstance(message, dict):
            raise ConversationFormatError(f"message {len(nodes) + 1} is not an object")
        key = message.get("messageId")
        key = key if isinstance(key, str) and key else ("message", len(nodes))
        if key in nodes:
            raise SkippedChat(f"two of its messages have the same id ({key!r})")
        if not nested:
            named = message.get("parentMessageId")
            parent = named if isinstance(named, str) and named and named != _NO_PARENT else None
        nodes[key] = Node(parent, _librechat_message(message, tally), [])
        children = message.get("children")
        if isinstance(children, list):
            stack.extend((child, key, True) for child in reversed(children))
    for key, node in nodes.items():  # (the source's order of each message's replies)
        if node.parent in nodes:
            nodes[node.parent].children.append(key)
    return nodes


def _shown(nodes: dict[Hashable, Node]) -> Hashable | None:
    """The message LibreChat shows last: from the last root, the last reply each step."""
    roots = [key for key, node in nodes.items() if node.parent not in nodes]
    key = roots[-1] if roots else None
    seen: set[Hashable] = set()
    while key is not None and nodes[key].children and key not in seen:
        seen.add(key)
        key = nodes[key].children[-1]
    return key


def _librechat_message(message: dict[str, Any], tally: Tally) -> Message | None:
    """A message as text (None: it has none); its files counted."""
    role = "user" if message.get("isCreatedByUser") is True else "assistant"
    content = message.get("content")
    if isinstance(content, list) and content:
        text = _librechat_parts(content, tally)
    else:
        text = message.get("text") if isinstance(message.get("text"), str) else ""
    files = message.get("files")
    for file in files if isinstance(files, list) else []:
        kind = file.get("type") if isinstance(file, dict) else None
        image = isinstance(kind, str) and kind.startswith("image/")
        tally.images += image
        tally.files += not image
    if role == "assistant":
        text = strip_reasoning(_without_thinking(text))
    if not text.strip():
        return None
    finish = message.get("finish_reason")
    stopped = role == "assistant" and (message.get("unfinished") is True or finish == "incomplete")
    made = text_message(role, text, iso_seconds(message.get("createdAt")), stopped=stopped,
                        cut=role == "assistant" and finish == "length")
    if role == "assistant" and message.get("error") is True and not stopped:
        made["status"] = "error"  # (its text: the error LibreChat showed in its place)
    return made


def _librechat_parts(parts: list[Any], tally: Tally) -> str:
    """The text of a message's ``content`` parts (LibreChat's agents); tool calls and
    images counted, reasoning (``think``) dropped."""
    texts: list[str] = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":  # (its text, or ``{value, annotations}``)
            value = part.get("text")
            value = value.get("value") if isinstance(value, dict) else value
            if isinstance(value, str) and value.strip():
                texts.append(value)
        elif kind == "tool_call":
            tally.tools += 1
        elif kind in ("image_file", "image_url"):
            tally.images += 1
    return "\n\n".join(texts)


def _without_thinking(text: str) -> str:
    """``text`` without the ``:::thinking … :::`` block LibreChat writes in front of a
    reply's text (its OpenAI, Anthropic and Google clients). A plain search: no regex
    over the whole text."""
    start = len(text) - len(text.lstrip())
    if not text.startswith(":::thinking", start):
        return text
    end = text.find("\n:::", start + len(":::thinking"))
    return text if end < 0 else text[end + len("\n:::"):].lstrip()


# -- text-generation-webui ----------------------------------------------------------------------


def textgen_chat(item: Any, tally: Tally) -> Chat | None:
    if not isinstance(item, dict):
        raise ConversationFormatError("a chat history must be a JSON object")
    key = next((kept for kept, shown in _TEXTGEN_KEYS if kept in item), "internal")
    rows = item.get(key)
    if not isinstance(rows, list):
        raise ConversationFormatError(f"its {key!r} is not a list of [question, reply] rows")
    metadata = item.get("metadata") if isinstance(item.get("metadata"), dict) else {}
    nodes: dict[Hashable, Node] = {}
    parent: Hashable | None = None
    for number, row in enumerate(rows):
        if not isinstance(row, list) or len(row) < 2 or not all(
                isinstance(cell, str) for cell in row[:2]):
            raise ConversationFormatError(f"row {number + 1} of {key!r} is not a [question, "
                                          "reply] pair of texts")
        own = row[3] if len(row) > 3 and isinstance(row[3], dict) else {}  # (its API's rows)
        asker = "system" if own.get("role") == "system" else "user"
        for role, said in ((asker, row[0]), ("assistant", row[1])):
            if role != "assistant" and said.strip() in ("", _OPENING):
                continue  # (the opening message's row: no question)
            parent = _textgen_message(nodes, parent, (number, role), said,
                                      metadata.get(f"{role}_{number}"), tally)
        replied = metadata.get(f"assistant_{number}")
        steps = replied.get("tool_sequence") if isinstance(replied, dict) else None
        tally.tools += sum(isinstance(step, dict) and step.get("role") == "tool"
                           for step in (steps if isinstance(steps, list) else []))
        tally.tools += len(row) > 2 and isinstance(row[2], str) and bool(row[2].strip())
    return Chat(None, tree_messages(nodes, parent, tally=tally))


def _textgen_message(nodes: dict[Hashable, Node], parent: Hashable | None, key: tuple[int, str],
                     said: str, meta: Any, tally: Tally) -> Hashable:
    """Add one message (and its other versions, alternatives beside it) under ``parent``;
    returns the key of the one shown, which the chat goes on under."""
    role = key[1]
    meta = meta if isinstance(meta, dict) else {}
    versions = [v for v in meta.get("versions", []) if isinstance(v, dict)] \
        if isinstance(meta.get("versions"), list) else []
    shown = meta.get("current_version_index")
    if not (isinstance(shown, int) and not isinstance(shown, bool) and 0 <= shown < len(versions)):
        shown = len(versions) - 1 if versions else 0
    texts = [v.get("content") if isinstance(v.get("content"), str) else "" for v in versions]
    # each version is dated by its own timestamp; the message's is rewritten as each
    # generation starts (a regenerated reply's: its newest version's), so it dates only a
    # message with no versions. (The first version of a regenerated reply is dated when the
    # second was asked for: the app keeps no earlier time for it.)
    times = [v.get("timestamp") for v in versions] or [meta.get("timestamp")]
    texts = texts or [said]
    texts[shown] = said  # (``internal`` holds the version shown)
    files, kept = _textgen_files(meta.get("attachments"), tally) if role == "user" else ([], [])
    for j, (text, when) in enumerate(zip(texts, times)):
        text = _textgen_reply(text) if role == "assistant" else text
        made = text_message(role, text, english_time(when)) \
            if text.strip() or files or kept else None
        text = model_text(text, kept) if kept else text  # (files Iris cannot record: in its text)
        if made is not None and (files or kept):  # (its text files as Iris attaches them: shown, sent)
            made = {**made, **with_attachments(text, files)}
        nodes[(*key, j)] = Node(parent, made, [])
    return (*key, shown)


def _textgen_files(attachments: Any, tally: Tally) -> tuple[list[Attachment], list[Attachment]]:
    """A question's attached text files (their ``content``), as Iris's attachments, and
    those Iris cannot record as attached (over :data:`~.attachments.MAX_ATTACHMENT_BYTES`,
    past the :data:`~.attachments.MAX_FILES` th), whose text the message keeps as the model
    read it, shown as its text; its pictures and other files counted (the import said "1
    other file was left out: Iris imports text only" of a text file whose text the export
    holds). A name is the file's own (a path's last part, no NUL, at most
    :data:`~.attachments.MAX_NAME_CHARS` characters: a file's name as Iris records it);
    halves of UTF-16 pairs in a name or a text are mended and counted (before, one
    refused the history, as did a file or a name Iris could not record, with advice to
    fix the record)."""
    files: list[Attachment] = []
    kept: list[Attachment] = []
    for attachment in attachments if isinstance(attachments, list) else []:
        item = attachment if isinstance(attachment, dict) else {}
        kind, content = item.get("type"), item.get("content")
        if isinstance(content, str) and content.strip() and not str(kind).startswith("image"):
            (name, halves), (content, more) = mended(str(item.get("name") or "")), mended(content)
            tally.mended += halves + more
            made = Attachment(_file_name(name), content)
            fits = made.size <= MAX_ATTACHMENT_BYTES and len(files) < MAX_FILES
            (files if fits else kept).append(made)
            continue
        image = isinstance(kind, str) and (kind == "image" or kind.startswith("image/"))
        tally.images += image
        tally.files += not image
    return files, kept


def _file_name(name: str) -> str:
    """An attached file's name as Iris records it: the last part of a path, without NUL
    characters, cut to :data:`~.attachments.MAX_NAME_CHARS` (its extension kept)."""
    name = name.replace("\0", "").rsplit("/", 1)[-1].strip() or "attached.txt"
    if len(name) <= MAX_NAME_CHARS:
        return name
    stem, dot, extension = name.rpartition(".")
    extension = f".{extension}" if dot and stem and len(extension) < 16 else ""
    return name[:MAX_NAME_CHARS - len(extension)] + extension


def _textgen_reply(text: str) -> str:
    """A reply without its reasoning: ``<think>`` and Seed-OSS's ``<seed:think>`` blocks,
    and gpt-oss's analysis channel (its final channel's text is the reply)."""
    final = "<|channel|>final<|message|>"
    if final in text:
        text = text.split(final, 1)[1].split("<|end|>", 1)[0]
    elif "<|channel|>analysis<|message|>" in text:
        return ""  # (its reasoning alone: no reply was written)
    return strip_reasoning(cut_blocks(text, "<seed:think>", "</seed:think>")[0])


# -- BetterChatGPT ------------------------------------------------------------------------------

_ROLES = {"system", "user", "assistant"}


def betterchatgpt_chat(chat: Any, tally: Tally) -> Chat | None:
    if not isinstance(chat, dict) or not isinstance(chat.get("messages"), list):
        raise ConversationFormatError("a chat must be an object with a 'messages' list")
    messages: list[Message] = []
    for number, message in enumerate(chat["messages"], start=1):
        if not isinstance(message, dict):
            raise ConversationFormatError(f"message {number} is not an object")
        role, content = message.get("role"), message.get("content")
        if role == "Image":  # (a picture it showed, as a message of its own)
            tally.images += 1
            continue
        if role not in _ROLES:
            raise ConversationFormatError(f"message {number}'s role {role!r} is not one Iris "
                                          "knows (system, user, assistant)")
        text = content if isinstance(content, str) else _betterchatgpt_parts(content, tally)
        text = strip_reasoning(text) if role == "assistant" else text
        if text.strip():
            messages.append(text_message(role, text))
    return Chat(usable_title(chat.get("title")), messages)


def _betterchatgpt_parts(parts: Any, tally: Tally) -> str:
    if not isinstance(parts, list):
        raise ConversationFormatError("a message's 'content' is neither text nor a list of parts")
    texts: list[str] = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            tally.images += 1
    return "\n\n".join(texts)


#: each format's converter of one chat, as :mod:`iris_desktop.core.foreign` looks them up
READERS: dict[str, Callable[[Any, Tally], Chat | None]] = {
    LIBRECHAT: librechat_chat, TEXTGEN: textgen_chat, BETTERCHATGPT: betterchatgpt_chat,
    GEMINI: gemini_chat}
