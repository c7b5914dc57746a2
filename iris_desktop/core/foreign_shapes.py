"""Other apps' chat files Iris does not import, known by their shape, so that a refusal
names the app and says what Iris does read (before: "unknown role None", the words of
the OpenAI-list reader the file fell through to). :func:`named_refusal` is asked only
once a file has been refused (:mod:`iris_desktop.core.foreign`): it reads it again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from iris_desktop.core.big_json import value_of
from iris_desktop.core.conversation import MAX_IMPORT_BYTES, ConversationFormatError
from iris_desktop.core.foreign_text import read_text

#: what Iris imports, truthfully (:mod:`iris_desktop.core.foreign` and conversation.py)
READS = ("OpenAI message lists (JSON or JSONL), its own exports, ChatGPT's and Claude's "
         "exports (conversations.json, its folder or the .zip), Open WebUI's chat export, "
         "LM Studio's .conversation.json files, Jan's threads, llama.cpp's web UI exports, "
         "ShareGPT files, SillyTavern chats, LibreChat's conversation exports, "
         "text-generation-webui's chat histories and BetterChatGPT's exports")


def _dicts(value: Any) -> list[dict[str, Any]]:
    items = value if isinstance(value, list) else [value]
    return [x for x in items[:50] if isinstance(x, dict)]


def _gemini(value: Any) -> bool:
    """Google Takeout's My Activity for Gemini Apps (or Bard): ``header``, ``products``."""
    for item in _dicts(value):
        products = item.get("products")
        named = " ".join(map(str, products)) if isinstance(products, list) else ""
        if "header" in item and ("Gemini" in f"{item.get('header')} {named}"
                                 or "Bard" in f"{item.get('header')} {named}"):
            return True
    return False


#: each app's name (as the sentence says it) and how its file is known
#: (LibreChat's, text-generation-webui's and BetterChatGPT's files were refused here too;
#: :mod:`iris_desktop.core.foreign_local` imports them now)
SHAPES = (("Google Takeout's My Activity file for Gemini", _gemini),)


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
    app = other_app(value_of(text))
    if app is None:
        return None
    return (f"{path}: this looks like {app}, which Iris cannot import yet; it imports "
            f"{READS}")
