"""llama.cpp's own web UI (``llama-server``'s chat page): a conversation downloaded from it
(``{"conv": {...}, "messages": [...]}``), its "export all" file (a list of those) and its
JSONL export (:func:`llamacpp_sessions`), read
into Iris's format with the parts :mod:`iris_desktop.core.foreign` shares by every format.

The web UI keeps each conversation's messages as a tree in the browser (IndexedDB):
``conv`` is ``{id, name, lastModified, currNode}`` (``currNode``: the message the branch
shown ends at) and each message ``{id, convId, type, timestamp, role, content, parent,
children, thinking, toolCalls, extra, timings, model}`` (``timestamp`` in ms). The tree's
root is an empty message of type ``root`` (not shown, skipped here; before, it became
an empty system prompt, and every branch was read one after another as one chat); a
system prompt is a message of type ``system``, which becomes the chat's system prompt;
edits and regenerations are branches, ``currNode``'s the active one (without it, the
newest message's, as the web UI shows). ``thinking`` (the model's reasoning) is dropped,
as for every app; attachments (``extra``: images, audio, PDFs, text files) are counted,
not kept; a tool's result (role ``tool``) is a tool step, counted. A conversation the web
UI downloaded while it was open holds only the branch it showed, with no root. The web UI
of early 2025 numbered its messages (``Date.now()``; ``currNode`` a number, the root's
``parent`` -1); its first version kept a conversation as one flat list (:func:`_flat`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from iris_desktop.core.conversation import ConversationFormatError
from iris_desktop.core.foreign_parts import (
    Chat,
    SkippedChat,
    Tally,
    hashable,
    strip_reasoning,
    text_message,
    tree_messages,
    usable_title,
)
from iris_desktop.core.foreign_tree import Node
from iris_desktop.tokens import Message

LLAMA_CPP = "llama.cpp web UI export"


def is_llamacpp(value: Any) -> bool:
    """Whether ``value`` is one conversation of llama.cpp's web UI export (or of its first
    version, below)."""
    return isinstance(value, dict) and isinstance(value.get("messages"), list) and (
        isinstance(value.get("conv"), dict) or _flat(value))


def _flat(value: dict[str, Any]) -> bool:
    """The web UI's first version kept a conversation as one object, ``{id: "conv-<ms>",
    lastModified, messages}``, its messages one list in order, without ``parent`` (as its
    public/demo-conversation.json still is): read as one branch."""
    return isinstance(value.get("id"), str) and value["id"].startswith("conv-") \
        and "lastModified" in value and "conv" not in value


def llamacpp_sessions(lines: list[Any] | None) -> list[Any] | None:
    """The conversations of the web UI's JSONL export, as its JSON export gives them
    (``{"conv", "messages"}`` each); None for other lines. The export writes a line
    ``{"type": "session", "harness": "llama.app", ...conv}`` for each conversation, then one
    ``{"type": "message", "message": {...}}`` for each of its messages (``toolCalls``
    parsed)."""
    if not lines or not isinstance(lines[0], dict) or lines[0].get("type") != "session" \
            or "harness" not in lines[0] and "currNode" not in lines[0]:
        return None
    chats: list[Any] = []
    for line in lines:
        if isinstance(line, dict) and line.get("type") == "session":
            conv = {k: v for k, v in line.items() if k not in ("type", "harness")}
            chats.append({"conv": conv, "messages": []})
        else:  # (a line that is not a message is that chat's error, named by llamacpp_chat)
            message = line.get("message", line) if isinstance(line, dict) else line
            chats[-1]["messages"].append(message)
    return chats


def llamacpp_chat(item: Any, tally: Tally) -> Chat | None:
    """One ``{"conv", "messages"}`` of the web UI's export as a chat (its tree's
    branches kept, ``currNode``'s active; the root skipped)."""
    if not is_llamacpp(item):
        raise ConversationFormatError("a conversation must be an object with 'conv' and "
                                      "'messages'")
    flat = _flat(item)
    conv = item if flat else item["conv"]
    nodes: dict[Hashable, Node] = {}
    previous: Hashable | None = None
    system: str | None = None
    newest: tuple[float, Hashable] | None = None
    for number, message in enumerate(item["messages"], start=1):
        if not isinstance(message, dict):
            raise ConversationFormatError(f"message {number} is not an object")
        key = hashable(message.get("id", ("message", number)))
        if key in nodes:  # which one a reply answers cannot be told
            raise SkippedChat(f"two of its messages have the same id ({key!r})")
        parent = previous if flat else message.get("parent")
        kids = [] if flat else message.get("children")
        made = _message(message, tally)
        if message.get("type") == "system" or (made is None and message.get("role") == "system"
                                              and message.get("type") != "root"):
            content = message.get("content")
            if system is None and isinstance(content, str) and content.strip():
                system = content.strip()
            made = None  # (the chat's system prompt, above all)
        nodes[key] = Node(hashable(parent) if parent is not None else None, made,
                          [hashable(k) for k in kids] if isinstance(kids, list) else [])
        previous = key
        when = message.get("timestamp")
        if made is not None and isinstance(when, (int, float)) and not isinstance(when, bool) \
                and (newest is None or when >= newest[0]):
            newest = (when, key)
    current = conv.get("currNode")
    # (a number in the web UI of early 2025, whose ids were Date.now() values)
    numbered = isinstance(current, int) and not isinstance(current, bool)
    active = hashable(current) if (isinstance(current, str) and current) or numbered else None
    if active not in nodes:
        active = previous if flat else newest[1] if newest is not None else None
    messages = tree_messages(nodes, active, system, tally)
    return Chat(usable_title(conv.get("name")), messages)


def _message(message: dict[str, Any], tally: Tally) -> Message | None:
    """A user message or reply as text; None for the root, a system prompt, a tool's
    result (counted) and an empty message."""
    role = message.get("role")
    extra = message.get("extra")
    for attached in extra if isinstance(extra, list) else []:
        if isinstance(attached, dict) and "image" in str(attached.get("type", "")).lower():
            tally.images += 1
        elif isinstance(attached, dict):
            tally.files += 1
    if role == "tool":
        tally.tools += 1
        return None
    if message.get("type") == "root" or role not in ("user", "assistant"):
        return None
    content = message.get("content")
    if not isinstance(content, str):
        return None
    if role == "assistant":
        content = strip_reasoning(content)
    if not content.strip():
        return None
    return text_message(role, content, message.get("timestamp"))
