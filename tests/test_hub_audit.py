"""An audit of model downloads against a fake hub (``tests/support/hub_server.py``): the
partial file a failed download's question removes, removing a partial file while its
download runs elsewhere, a model Iris cannot chat with, the hub's user:password address,
and ``models files``' sizes and unsafe names. Real files, real Qt widgets offscreen.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from iris_desktop.cli import main  # noqa: E402
from iris_desktop.runtime.hub import (  # noqa: E402
    HubClient,
    HubError,
    discard_partial,
    download,
    download_target,
    downloading,
)
from iris_desktop.runtime.hub.client import HubRepo  # noqa: E402
from iris_desktop.runtime.hub.records import _write_record  # noqa: E402
from iris_desktop.settings import SettingsError, load_settings  # noqa: E402
from iris_desktop.ui import hub_worker  # noqa: E402
from iris_desktop.ui.download_dialog import DownloadDialog  # noqa: E402

from support.gguf_fixtures import tiny_metadata, write_gguf  # noqa: E402
from support.hub_server import HubServer, gguf_bytes  # noqa: E402

TWO = "t/two"
EMBED = "t/embed"

pytestmark = pytest.mark.usefixtures("no_proxy_no_keyring")


def embedding_bytes(folder: Path) -> bytes:
    """A valid GGUF of an embedding model (a pooling type), as nomic-embed's."""
    meta = {**tiny_metadata("Nomic Embed", arch="nomic-bert", template=None), "nomic-bert.pooling_type": 1}
    path = write_gguf(folder / "embed.gguf", meta)
    data = path.read_bytes()
    path.unlink()
    return data


@pytest.fixture
def server(tmp_path):
    repos = {TWO: {"a.gguf": gguf_bytes(tmp_path, "A", 64 * 1024), "b.gguf": gguf_bytes(tmp_path, "B", 64 * 1024)},
             EMBED: {"model.gguf": embedding_bytes(tmp_path)},
             "t/big": {"model.gguf": gguf_bytes(tmp_path, "Big", 512 * 1024)}}
    with HubServer(repos) as s:
        yield s


@pytest.fixture(autouse=True)
def quick_resume(monkeypatch):
    monkeypatch.setattr(downloading, "RESUME_PAUSE_S", 0.0)


def partial_of(models: Path, repo: str, file: str) -> Path:
    target = download_target(models, repo, file)
    return target.with_name(target.name + ".partial")


def open_repo(qtbot, dialog, repo):
    dialog.search_edit.setText(repo.split("/")[1])
    qtbot.mouseClick(dialog.search_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.repos.count() == 2, timeout=10_000)
    dialog.repos.setCurrentRow(1)
    qtbot.waitUntil(lambda: not dialog.calls.busy and dialog.table.rowCount() > 0, timeout=10_000)


def pick(dialog, file):
    dialog.table.clearSelection()
    dialog.table.selectRow(next(r for r, row in enumerate(dialog.rows) if row["file"] == file))


# -- 1. "Remove it" after a failed download ----------------------------------------------------


def test_remove_it_after_a_failed_download_removes_that_downloads_partial_not_the_chosen_rows(
        qtbot, tmp_path, server):
    """Before: "Remove it" in the question about a.gguf's partial file removed the partial
    file of the row chosen NOW (b.gguf, a resumable 100 kB), kept a.gguf's and said "Removed
    the partial file of b.gguf". Now: it removes a.gguf's, b.gguf's stays, and the list and
    table cannot be changed while the download runs."""
    models = tmp_path / "models"
    b_target = download_target(models, TWO, "b.gguf")
    b_target.parent.mkdir(parents=True)
    b_bytes = server.repos[TWO]["b.gguf"]
    partial_of(models, TWO, "b.gguf").write_bytes(b_bytes[:100_000])
    _write_record(b_target, {"repo": TWO, "file": "b.gguf", "revision": "main", "size": len(b_bytes),
                             "sha256": server.sha256(TWO, "b.gguf")})
    server.listed = {"a.gguf": {"sha256": "0" * 64}}  # a.gguf fails its checksum
    dialog = DownloadDialog(server.url, models, 4096)
    qtbot.addWidget(dialog)
    dialog.show()
    open_repo(qtbot, dialog, TWO)
    pick(dialog, "a.gguf")
    server.delay_s = 0.05
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    locked = not dialog.table.isEnabled() and not dialog.repos.isEnabled()
    pick(dialog, "b.gguf")  # (the user looks at the other row meanwhile)
    qtbot.waitUntil(lambda: dialog.box is not None and dialog.box.isVisible(), timeout=20_000)
    assert dialog.table.isEnabled() and dialog.repos.isEnabled()
    assert "a.gguf.partial" in dialog.box.informativeText()
    remove = next(b for b in dialog.box.buttons() if b.text() == "Remove it")
    qtbot.mouseClick(remove, Qt.MouseButton.LeftButton)
    assert not partial_of(models, TWO, "a.gguf").exists()
    assert partial_of(models, TWO, "b.gguf").stat().st_size == 100_000
    assert dialog.status.text() == "Removed the partial file of a.gguf."
    assert locked, "the table and the list could be changed while the download ran"


# -- 2. removing a partial file while its download runs elsewhere -------------------------------


def test_removing_a_partial_file_while_its_download_runs_elsewhere_is_refused(tmp_path, server):
    """Before: ``models download … --remove-partial`` (or Remove partial in another window)
    removed the partial file a running download was writing, and that download then failed
    as "Cannot write the download in …; check that the models folder is writable", losing
    everything. Now: the removal is refused in a sentence, the download goes on, and once
    it ended the partial file can be removed."""
    models = tmp_path / "models"
    size = len(server.repos["t/big"]["model.gguf"])
    server.stall_at = [300_000]
    cancel, failed = threading.Event(), []

    def run():
        with HubClient(server.url) as client:
            try:
                download(client, "t/big", "model.gguf", models, cancel=cancel)
            except HubError as exc:
                failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert server.stalled.wait(20)
        partial = partial_of(models, "t/big", "model.gguf")
        deadline = time.monotonic() + 10
        while (not partial.exists() or partial.stat().st_size < 300_000) and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(HubError) as refused:
            discard_partial(models, "t/big", "model.gguf")
        assert refused.value.kind == "busy"
        assert str(refused.value).startswith("A download of model.gguf is running in another window or command")
        assert partial.stat().st_size == 300_000
    finally:
        cancel.set()
        thread.join(20)
    assert failed and failed[0].kind == "stopped" and size > 300_000
    assert discard_partial(models, "t/big", "model.gguf") and not partial.exists()


def test_a_partial_file_removed_mid_download_is_said_as_removed_not_as_an_unwritable_folder(tmp_path, server):
    """Before: a partial file removed while its download ran (by hand, or by an older Iris)
    ended the download with "Cannot write the download in …; check that the models folder
    is writable". Now: it says the partial file was removed while it was downloading."""
    models = tmp_path / "models"
    server.delay_s = 0.03
    failed = []

    def run():
        with HubClient(server.url) as client:
            try:
                download(client, "t/big", "model.gguf", models)
            except HubError as exc:
                failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    partial = partial_of(models, "t/big", "model.gguf")
    deadline = time.monotonic() + 10
    while not (partial.exists() and partial.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.01)
    partial.unlink()
    thread.join(30)
    assert failed, "the download went on as if nothing happened"
    assert "was removed while it was downloading" in str(failed[0])
    assert "writable" not in str(failed[0])


# -- 3. a model Iris cannot chat with ------------------------------------------------------------


def test_an_embedding_model_is_said_downloaded_but_not_for_chat_in_the_dialog(qtbot, tmp_path, server):
    """Before: an embedding GGUF was "Downloaded and verified" with "Use this model", while
    the library left it out silently. Now: "Downloaded, but it is not a chat model (an
    embedding model)", and no Use button (neither when it is chosen again)."""
    dialog = DownloadDialog(server.url, tmp_path / "models", 4096)
    qtbot.addWidget(dialog)
    dialog.show()
    open_repo(qtbot, dialog, EMBED)
    pick(dialog, "model.gguf")
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.cancel is None, timeout=20_000)
    assert dialog.status.text().startswith(
        "Downloaded, but it is not a chat model (an embedding model): Iris cannot chat with it")
    assert not dialog.use_button.isVisible() and dialog.path is None
    pick(dialog, "model.gguf")
    dialog._row_chosen()
    assert dialog.status.text().startswith("Already downloaded, but it is not a chat model")
    assert not dialog.use_button.isVisible()


def test_an_embedding_model_is_said_downloaded_but_not_for_chat_by_the_cli(tmp_path, server, capsys, monkeypatch):
    """Before: ``models download`` said "downloaded and verified …; use it with
    'iris-desktop chat --model …'" for an embedding model. Now: it says Iris cannot chat
    with it, and gives no chat hint."""
    monkeypatch.setenv("IRIS_MODELS_HUB_URL", server.url)
    code = main(["--data-dir", str(tmp_path / "data"), "models", "download", EMBED, "model.gguf"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip().endswith("model.gguf")
    assert "downloaded, but it is not a chat model (an embedding model): Iris cannot chat with it" in err
    assert "chat --model" not in err and "verified" not in err


def test_search_results_mark_repositories_that_are_not_for_chat(qtbot, tmp_path, monkeypatch):
    """Before: an embedding repository looked like any other in the search. Now: the hub's
    pipeline tag, when it is not a chat one, is said beside the name."""
    listing = [{"id": "t/embed", "downloads": 3, "pipeline_tag": "feature-extraction"},
               {"id": "t/chat", "downloads": 2, "pipeline_tag": "text-generation"},
               {"id": "t/odd", "pipeline_tag": "\x1b[31mred"}]
    monkeypatch.setattr(HubClient, "_get_json", lambda self, *a, **k: (listing, None))
    with HubClient("http://127.0.0.1:9") as client:
        repos = client.search("x")
    assert [r.pipeline_tag for r in repos] == ["feature-extraction", "text-generation", None]
    dialog = DownloadDialog("http://127.0.0.1:9", tmp_path / "models", 4096)
    qtbot.addWidget(dialog)
    dialog._found(repos, None)
    assert [dialog.repos.item(i).text() for i in range(1, 4)] == [
        "t/embed  (not for chat: feature-extraction)", "t/chat", "t/odd"]
    assert hub_worker.repo_label(HubRepo("t/g", gated="manual")) == "t/g  (gated)"


# -- 4. a user name and password in the hub's address -------------------------------------------


def test_a_password_in_the_hub_address_is_answered_with_the_hubs_token():
    """Before: models.hub_url with user:password@ was refused with advice for a model
    server ("give the server's API key in Model ▸ Server…"). Now: the hub's token."""
    with pytest.raises(SettingsError) as refused:
        load_settings(None, env={}, cli={"models.hub_url": "https://me:secret@hub.example"})
    said = str(refused.value)
    assert "Model ▸ Download… ▸ Token…" in said and "iris-desktop models token" in said
    assert "Server…" not in said and "secret" not in said
    with pytest.raises(SettingsError) as server_key:
        load_settings(None, env={}, cli={"model.base_url": "https://me:secret@llm.example"})
    assert "give the server's API key in Model ▸ Server…" in str(server_key.value)


# -- 5. models files ------------------------------------------------------------------------------


def test_models_files_shows_small_sizes_and_leaves_out_unsafe_names(tmp_path, server, capsys, monkeypatch):
    """Before: ``models files`` said "0.00 GB" for every file under 5 MB and listed names
    that ``download`` then refused (``../escape.gguf``, a control character). Now: sizes
    read in kB, and unsafe names are left out, with one line saying how many and why
    (the rule of the download dialog's table)."""
    monkeypatch.setenv("IRIS_MODELS_HUB_URL", server.url)
    sha = server.sha256(TWO, "a.gguf")
    server.extra_entries = [{"type": "file", "path": name, "size": 1000, "lfs": {"oid": sha, "size": 1000}}
                            for name in ("../escape.gguf", "ctl\x1b[31mred.gguf", "bidi\u202egnp.gguf")]
    code = main(["--data-dir", str(tmp_path / "data"), "models", "files", TWO])
    out, err = capsys.readouterr()
    assert code == 0
    lines = out.splitlines()
    assert [line.split("  ")[0] for line in lines] == ["a.gguf", "b.gguf"]
    size = len(server.repos[TWO]["a.gguf"])
    assert f"  {size / 1000:,.0f} kB  " in lines[0] and "GB" not in out
    assert "3 more GGUF file(s) not listed: their names cannot be kept as files here" in err
    assert "\x1b" not in err and "\u202e" not in err
