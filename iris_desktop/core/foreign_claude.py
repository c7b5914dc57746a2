"""claude.ai's data export (``conversations.json``, alone or in the zip archive it comes
in): one object per conversation, ``name`` and ``chat_messages``, read into Iris's format
with the parts :mod:`iris_desktop.core.foreign` shares by every format.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from iris_desktop.core.attachments import Attachment, with_attachments
from iris_desktop.core.conversation import ConversationFormatError
from iris_desktop.core.foreign_parts import Chat, Tally, hashable, tree_messages, usable_title
from iris_desktop.core.foreign_tree import Node
from iris_desktop.core.store import iso_timestamp
from iris_desktop.core.store.rows import not_in_future
from iris_desktop.tokens import Message


def claude_chat(conversation: Any, tally: Tally) -> Chat | None:
    """A claude.ai data export's conversation: ``chat_messages`` with ``sender`` human or
    assistant, each a tree node by ``parent_message_uuid`` (edits and retries are
    branches; the first message's parent is a sentinel, no message), the branch of
    ``current_leaf_message_uuid`` (else the last message) active."""
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
        nodes[key] = Node(parent, _message(item, tally), [])
    for child, node in nodes.items():
        if node.parent in nodes:
            nodes[node.parent].children.append(child)
    leaf = conversation.get("current_leaf_message_uuid")
    messages = tree_messages(nodes, hashable(leaf) if leaf is not None else key, tally=tally)
    return Chat(usable_title(conversation.get("name")), messages)


def _message(item: dict[str, Any], tally: Tally) -> Message | None:
    """Its text blocks (or ``text``), the text of what was attached or pasted as a file
    (``extracted_content``) as Iris's own attachments; tool steps counted, thinking left
    out, files without text (images, PDFs) counted."""
    role = {"human": "user", "user": "user", "assistant": "assistant"}.get(item.get("sender"))
    if role is None:
        return None
    blocks = item.get("content")
    if isinstance(blocks, list) and blocks:
        texts = [b["text"] for b in blocks if isinstance(b, dict) and b.get("type") == "text"
                 and isinstance(b.get("text"), str) and b["text"].strip()]
        tally.tools += sum(isinstance(b, dict) and b.get("type") == "tool_use" for b in blocks)
        text = "\n\n".join(texts)
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
