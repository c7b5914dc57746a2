"""Claude's data export as it ships since 2026 (an audit's F7, reproduced first): a
manifest of one-time download links and one zip per category (``conversations-000.zip``
holding ``conversations.json``, beside ``projects-000.zip``, ``memories-000.zip``…).
Before, the manifest was refused as "not a conversation Iris knows" and the folder of
the downloaded parts as "is a folder; give a file". Now the manifest, or the folder, is
read through its conversations parts (zipped or unzipped, one of each part); a manifest
whose parts are not beside it says which file to download. The export is the Claude
fixture (``tests/fixtures/foreign/claude``), laid out as the real one is; the real CLI
in-process and the real SQLite store.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from test_foreign_import import CLAUDE, imported, threads

from support.helpers import one_sentence
from support.helpers import run_cli as run

CATEGORIES = ["light_metadata", "projects", "memories", "frames", "conversations"]


def manifest(folder: Path, parts: int = 1) -> Path:
    files = [{"batch_index": i, "export_url": f"https://claude.ai/api/export/download/{i}",
              "category": category, "part": part, "filename": f"{category}-{part:03}.zip"}
             for i, (category, part) in enumerate(
                 [(c, 0) for c in CATEGORIES[:-1]] + [("conversations", p) for p in range(parts)])]
    path = folder / "export_manifest.json"
    path.write_text(json.dumps({
        "instructions": "Download each file using the export_url. Note: Each export URL can "
                        "only be used once.", "created_at": "2026-09-20T20:17:00.878412+00:00",
        "total_files": len(files), "version": "1.0", "data_files": files}, indent=2))
    return path


def part(folder: Path, name: str, chats: list[dict]) -> None:
    with zipfile.ZipFile(folder / name, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("conversations.json", json.dumps(chats))


def chats() -> list[dict]:
    return json.loads(CLAUDE.read_text())


def test_the_manifest_imports_the_conversations_parts_beside_it(capsys, tmp_path):
    export = tmp_path / "claude-export"
    export.mkdir()
    source = manifest(export, parts=2)
    everything = chats()
    part(export, "conversations-000.zip", everything[:1])
    part(export, "conversations-001.zip", everything[1:])
    part(export, "projects-000.zip", [{"uuid": "p", "name": "A project", "docs": []}])
    expected = len(imported(capsys, CLAUDE)[0])  # the same chats from the one-file export
    ids, err = imported(capsys, source, "--again")
    assert len(ids) == expected > 1
    assert err.startswith(f"iris-desktop: imported {expected} chats from a Claude export\n")


def test_the_folder_of_the_parts_zipped_or_unzipped_is_imported_once(capsys, tmp_path):
    export = tmp_path / "Downloads"
    (export / "conversations-000").mkdir(parents=True)
    (export / "conversations-000" / "conversations.json").write_text(json.dumps(chats()))
    part(export, "conversations-000.zip", chats())  # the same part, also still zipped
    part(export, "memories-000.zip", [])
    ids, err = imported(capsys, export)
    assert len(ids) == len(threads(capsys)) > 1
    assert err.startswith(f"iris-desktop: imported {len(ids)} chats from a Claude export")


def test_a_manifest_alone_says_which_file_to_download(capsys, tmp_path):
    source = manifest(tmp_path)
    code, out, err = run(capsys, "import", source)
    assert code == 2 and out == "" and one_sentence(err)
    assert err == (f"iris-desktop: import refused, nothing was written: {source}: the manifest "
                   "of a Claude export, which holds only links to its files (each downloads "
                   "once); download conversations-000.zip (its conversations) into the same "
                   "folder, then import this file again, or that zip\n")
    assert threads(capsys) == []
