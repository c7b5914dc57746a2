"""The file name an export proposes: the chat's title, made safe for any system."""

from __future__ import annotations

import re
import unicodedata

#: what no file name may hold on Windows, macOS or Linux
_NOT_IN_NAMES = re.compile(r'[<>:"/\\|?*]')
#: names Windows reserves for devices, with or without an extension
_RESERVED = re.compile(r"^(con|prn|aux|nul|com[1-9]|lpt[1-9])(\..*)?$", re.IGNORECASE)


def file_name(title: str, limit: int = 80) -> str:
    """``title`` as a file name on any system: characters no file name may hold become
    spaces, control and invisible ones (bidi overrides, zero-width) go, no leading or
    trailing dots or spaces, at most ``limit`` characters; "chat" when nothing is left."""
    visible = "".join(" " if c in "\t\n\r" else c for c in title
                      if c in "\t\n\r" or not unicodedata.category(c).startswith("C"))
    name = " ".join(_NOT_IN_NAMES.sub(" ", visible).split()).strip(" .")
    name = name[:limit].strip(" .")
    if not name:
        return "chat"
    return f"{name}_" if _RESERVED.match(name) else name
