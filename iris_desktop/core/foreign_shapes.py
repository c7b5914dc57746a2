"""Other apps' chat files Iris does not import, known by their shape, so that a refusal
names the app and says what Iris does read (before: "unknown role None", the words of
the OpenAI-list reader the file fell through to); and Google Takeout's HTML page of Gemini
activity, refused with how to export the JSON Iris reads (:mod:`.foreign_gemini`).
:func:`named_refusal` is asked only once a file has been refused
(:mod:`iris_desktop.core.foreign`): it reads it again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from iris_desktop.core.big_json import value_of
from iris_desktop.core.conversation import MAX_IMPORT_BYTES, ConversationFormatError
from iris_desktop.core.foreign_gemini import html_refusal, is_activity_html
from iris_desktop.core.foreign_text import read_text

#: what Iris imports, truthfully (:mod:`iris_desktop.core.foreign` and conversation.py)
READS = ("OpenAI message lists (JSON or JSONL), its own exports, ChatGPT's and Claude's "
         "exports (conversations.json, its folder or the .zip), Open WebUI's chat export, "
         "LM Studio's .conversation.json files, Jan's threads, llama.cpp's web UI exports, "
         "ShareGPT files, SillyTavern chats, LibreChat's conversation exports, "
         "text-generation-webui's chat histories, BetterChatGPT's exports and Google Takeout's "
         "Gemini activity (My Activity as JSON)")


#: each app's name (as the sentence says it) and how its file is known: none now
#: (LibreChat's, text-generation-webui's, BetterChatGPT's files and Google Takeout's Gemini
#: activity were refused here; :mod:`iris_desktop.core.foreign_local` and
#: :mod:`iris_desktop.core.foreign_gemini` import them now)
SHAPES: tuple[tuple[str, Callable[[Any], bool]], ...] = ()


def other_app(value: Any) -> str | None:
    """The app a parsed file is from, as a sentence names it; None when it is none of
    them."""
    for name, looks in SHAPES:
        if looks(value):
            return name
    return None


def named_refusal(path: Path) -> str | None:
    """The sentence refusing ``path`` as another app's file Iris cannot import yet, or
    None when it looks like none (the refusal already said stands)."""
    try:
        text = read_text(path, MAX_IMPORT_BYTES)
    except ConversationFormatError:
        return None
    if is_activity_html(text):  # (Takeout's HTML variant: how to export the JSON instead)
        return html_refusal(path)
    app = other_app(value_of(text))
    if app is None:
        return None
    return (f"{path}: this looks like {app}, which Iris cannot import yet; it imports "
            f"{READS}")
