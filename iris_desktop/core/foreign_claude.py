"""claude.ai's data export (``conversations.json``, alone or in the zip archive it comes
in): one object per conversation, ``name`` and ``chat_messages``, read into Iris's format
with the parts :mod:`iris_desktop.core.foreign` shares by every format. An artifact (the
code or document a reply wrote with the ``artifacts`` tool) stays in its reply, as a
titled fenced block where it was written; an update applies to its latest version.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from iris_desktop.core.attachments import Attachment, with_attachments
from iris_desktop.core.conversation import ConversationFormatError
from iris_desktop.core.foreign_parts import (
    Chat,
    Documents,
    SkippedChat,
    Tally,
    hashable,
    read_before,
    text_of,
    tree_messages,
    usable_title,
)
from iris_desktop.core.foreign_tree import Node
from iris_desktop.core.store import iso_timestamp
from iris_desktop.core.store.rows import not_in_future
from iris_desktop.tokens import Message


@read_before
def claude_chat(conversation: Any, tally: Tally, documents: Documents) -> Chat | None:
    """A claude.ai data export's conversation: ``chat_messages`` with ``sender`` human or
    assistant, each a tree node by ``parent_message_uuid`` (edits and retries are
    branches; the first message's parent is a sentinel, no message), the branch of
    ``current_leaf_message_uuid`` (else the last message) active; with the messages as
    an earlier Iris read them (:func:`~iris_desktop.core.foreign_parts.read_before`)."""
    if not isinstance(conversation, dict):
        raise ConversationFormatError("a conversation must be a JSON object")
    source = conversation.get("chat_messages")
    if not isinstance(source, list):
        return None
    linked = any(isinstance(m, dict) and "parent_message_uuid" in m for m in source)
    nodes: dict[Hashable, Node] = {}
    key: Hashable | None = None
    for number, item in enumerate(source, start=1):
        if not isinstance(item, dict):
            raise ConversationFormatError(f"message {number} is not an object")
        parent = item.get("parent_message_uuid") if linked else key  # unlinked: in order
        parent = hashable(parent) if parent is not None else None
        key = hashable(item.get("uuid", number))
        if key in nodes:  # which one a reply answers cannot be told
            raise SkippedChat(f"two of its messages have the same id ({key!r})")
        nodes[key] = Node(parent, _message(item, tally, documents), [])
    for child, node in nodes.items():
        if node.parent in nodes:
            nodes[node.parent].children.append(child)
    leaf = conversation.get("current_leaf_message_uuid")
    messages = tree_messages(nodes, hashable(leaf) if leaf is not None else key, tally=tally)
    return Chat(usable_title(conversation.get("name")), messages)


def _message(item: dict[str, Any], tally: Tally, documents: Documents) -> Message | None:
    """Its text blocks (or ``text``) and artifacts, in order, the text of what was attached
    or pasted as a file (``extracted_content``) as Iris's own attachments; other tools'
    steps counted (each call once: its result is the same step), thinking left out, files
    without text (images, PDFs) counted."""
    role = {"human": "user", "user": "user", "assistant": "assistant"}.get(item.get("sender"))
    if role is None:
        return None
    blocks = item.get("content")
    if isinstance(blocks, list) and blocks:
        texts = []
        for block in blocks:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and text_of(block.get("text")).strip():
                texts.append(block["text"])
            elif block.get("type") == "tool_use" and block.get("name") == "artifacts":
                texts.append(_artifact(block.get("input"), documents))
            elif block.get("type") == "tool_use":
                tally.tools += 1
        text = "\n\n".join(t for t in texts if t)
    else:
        text = item["text"] if isinstance(item.get("text"), str) else ""
    files = [Attachment(str(a.get("file_name") or "pasted.txt"), a["extracted_content"])
             for a in item.get("attachments") or [] if isinstance(a, dict)
             and isinstance(a.get("extracted_content"), str)] if role == "user" else []
    tally.files += sum(1 for a in item.get("attachments") or []
                       if not (isinstance(a, dict) and isinstance(a.get("extracted_content"), str)))
    attached = {a.name for a in files}
    for file in item.get("files") if isinstance(item.get("files"), list) else []:
        if isinstance(file, dict) and file.get("file_name") not in attached:  # no text of it
            if file.get("file_kind", "image") == "image":
                tally.images += 1
            else:
                tally.files += 1
    if not text.strip() and not files:
        return None
    message = with_attachments(text, files) if files else {"role": role, "content": text}
    try:
        message["created_at"] = not_in_future(iso_timestamp(item["created_at"]))
    except (KeyError, ValueError, TypeError, OverflowError, OSError):
        pass
    return message


#: the fence's language of an artifact's type, where the artifact names none
_LANGUAGES = {"text/markdown": "markdown", "text/html": "html", "image/svg+xml": "svg",
              "application/vnd.ant.react": "jsx", "application/vnd.ant.mermaid": "mermaid"}


def _artifact(given: Any, documents: Documents) -> str:
    """An ``artifacts`` call as its document: ``create`` and ``rewrite`` whole, ``update``
    (``old_str`` to ``new_str``) applied to the latest version ("" when nothing is said)."""
    if not isinstance(given, dict):
        return ""
    key = str(hashable(given.get("id", "")))
    title = " ".join(text_of(given.get("title")).split())
    language = text_of(given.get("language")) or _LANGUAGES.get(text_of(given.get("type")), "")
    command = given.get("command")
    if command in ("create", "rewrite") and isinstance(given.get("content"), str):
        return documents.write(key, title, language, given["content"])
    if command == "update" and isinstance(given.get("new_str"), str):
        return documents.change(key, text_of(given.get("old_str")), given["new_str"], title=title)
    return ""
