"""Claude's data export as it ships since 2026: not one archive but a manifest
(``{"data_files": [{"category", "filename", "export_url", …}]}``, each link good for one
download) and one zip per category (``light_metadata-000.zip``, ``projects-000.zip``,
``memories-000.zip``, ``frames-000.zip``, ``conversations-000.zip``, more parts
``-001``… for a large account). The chats are in the ``conversations`` parts, each
holding a ``conversations.json``. Before, the manifest and the folder of the downloaded
parts were both refused ("not a conversation Iris knows", "is a folder; give a file").

:func:`folder_parts` reads a folder's ``conversations-NNN.zip`` archives (or the
``conversations-NNN/`` folders they unzip to; one of the two per part) and joins their
chats into one list; :func:`manifest_parts` does so for the folder a manifest is in, or
says which of its files to download. Only the conversations are read: Iris imports chats.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from iris_desktop.core.big_json import value_of
from iris_desktop.core.conversation import MAX_IMPORT_BYTES, ConversationFormatError
from iris_desktop.core.export_zip import EXPORT_NAME, joined, zipped_export

#: a conversations part: its archive, or the folder it unzips to
PART = re.compile(r"conversations-(\d+)(\.zip)?")


def folder_parts(folder: Path, read: Callable[[Path, int], str]) -> str | None:
    """The chats of the Claude export parts in ``folder`` as one JSON list (a part's
    unzipped folder read by ``read(file, limit)``, else its archive); None when it has
    none."""
    chosen: dict[int, Path] = {}
    try:
        for entry in sorted(folder.iterdir(), key=lambda p: p.name):
            match = PART.fullmatch(entry.name)
            if match is None:
                continue
            unzipped = match.group(2) is None and (entry / EXPORT_NAME).is_file()
            if unzipped or (match.group(2) and entry.is_file()
                            and int(match.group(1)) not in chosen):
                chosen[int(match.group(1))] = entry / EXPORT_NAME if unzipped else entry
    except OSError:
        return None
    texts: list[tuple[str, str]] = []
    total = 0
    for number in sorted(chosen):
        part = chosen[number]
        text = read(part, MAX_IMPORT_BYTES) if part.name == EXPORT_NAME else zipped_export(part)
        if text is None:  # named .zip, but no zip archive
            raise ConversationFormatError(f"{part}: not a zip archive, as a Claude export's "
                                          "parts are")
        total += len(text)
        if total > MAX_IMPORT_BYTES:
            raise ConversationFormatError(f"{folder}: its conversations parts are larger than "
                                          f"the limit of {MAX_IMPORT_BYTES:,} bytes together")
        texts.append((str(part.relative_to(folder)), text))
    return joined(folder, texts) if texts else None


def is_manifest(text: str) -> bool:
    head = text[:64 * 1024]
    return '"data_files"' in head and '"export_url"' in head


def manifest_parts(path: Path, text: str, read: Callable[[Path, int], str]) -> str | None:
    """The chats of the Claude export whose manifest is ``path`` (``text``): its
    conversations parts beside it, as one JSON list. None when ``text`` is no such
    manifest; ConversationFormatError naming the files to download when they are not
    there."""
    manifest = value_of(text) if is_manifest(text) else None
    files = manifest.get("data_files") if isinstance(manifest, dict) else None
    if not isinstance(files, list):
        return None
    names = [f["filename"] for f in files if isinstance(f, dict)
             and f.get("category") == "conversations" and isinstance(f.get("filename"), str)]
    if not names:
        return None
    here = {p.name for p in path.parent.iterdir()} if path.parent.is_dir() else set()
    missing = [n for n in names if n not in here and n.removesuffix(".zip") not in here]
    if missing:
        raise ConversationFormatError(
            f"{path}: the manifest of a Claude export, which holds only links to its files "
            f"(each downloads once); download {', '.join(missing)} (its conversations) into "
            "the same folder, then import this file again, or that zip")
    return folder_parts(path.parent, read)
