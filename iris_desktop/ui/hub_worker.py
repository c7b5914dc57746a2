"""The download dialog's worker: hub calls (``runtime.hub``) on a thread of their own,
one at a time, with their results and a download's progress back on the GUI thread as
queued signals; how sizes and memory read in the dialog; the question about a failed
download's partial file; the hub token's dialog; and the table's rows (a repository's
files turned into rows on the worker thread, names that cannot be paths left out)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QInputDialog, QLineEdit, QMessageBox, QWidget

from iris_desktop.core.views import tokens
from iris_desktop.runtime.hub import (
    CHAT_PIPELINES,
    RECOMMENDED,
    DownloadProgress,
    HubClient,
    HubError,
    HubFile,
    HubRepo,
    discard_partial,
    download,
    fits_in_memory,
    name_problem,
    not_for_chat,
    not_for_chat_words,
    set_hub_token,
    token_variable,
    variable_problem,
    verified_words,
)
from iris_desktop.runtime.remote import server_address
from iris_desktop.ui.boxes import plain_box
from iris_desktop.units import file_size, memory_size


def gb(n: int | None, about: bool = False) -> str:
    if not n:
        return "–"
    text = file_size(n)
    return f"about {text}" if about else text


def fits_text(estimate: int | None, total: int | None) -> str:
    fits = fits_in_memory(estimate, total)
    if fits is None:
        return "–"
    return f"fits ({memory_size(total, 0)})" if fits else f"too big for {memory_size(total, 0)}"


class HubCalls(QObject):
    """Runs one hub call at a time on a worker thread; ``on_done(result, error)`` is
    called back on the GUI thread (a queued signal), and so are ``progressed`` emits."""

    finished = Signal(object, object, object)  # on_done, result, error
    progressed = Signal(object)

    def __init__(self, parent: QObject) -> None:
        super().__init__(parent)
        self.thread: threading.Thread | None = None
        #: a call runs, or its answer has not been handled yet
        self.busy = False
        self.finished.connect(self._finished)

    def run(self, fn: Callable[[], Any], on_done: Callable[[Any, BaseException | None], None]) -> None:
        def work() -> None:
            result, error = None, None
            try:
                result = fn()
            except Exception as exc:  # HubError, or anything else: said in one sentence
                error = exc
            try:
                self.finished.emit(on_done, result, error)
            except RuntimeError:  # the dialog is gone
                pass

        self.busy = True
        self.thread = threading.Thread(target=work, name="iris-hub", daemon=True)
        self.thread.start()

    @Slot(object, object, object)
    def _finished(self, on_done: Callable, result: Any, error: BaseException | None) -> None:
        self.busy = False
        on_done(result, error)


def sentence(error: BaseException | None) -> str:
    if isinstance(error, HubError):
        return str(error)
    return f"The hub request failed: {error}." if error is not None else ""


def token_dialog(parent: QWidget, hub_url: str, said: Callable[[str], Any]) -> QInputDialog:
    """Token…: a token for gated or private models, saved in the OS keyring for this hub
    (as a server's API key; empty forgets it); ``said`` gets the one-sentence outcome."""
    dialog = QInputDialog(parent)
    dialog.setObjectName("hub-token")
    dialog.setWindowTitle("Hub token")
    try:
        where = server_address(hub_url)
    except ValueError:
        where = hub_url
    variable = token_variable(hub_url)  # (the window could not tell it was set: an audit)
    problem = variable_problem(variable) if variable else None
    told = (f"\n\n{problem[0].upper()}{problem[1:]}." if problem else
            f"\n\n{variable} is set in Iris's environment: its token is sent to {where} while none "
            "is saved here; one saved here is sent instead." if variable else "")
    dialog.setLabelText(f"A token for {where}, for gated or private models. It is kept in this "
                        "computer's keyring and sent to the hub only; leave it empty to forget it." + told)
    dialog.setTextEchoMode(QLineEdit.EchoMode.Password)

    def save(text: str) -> None:
        try:
            set_hub_token(hub_url, text.strip())
        except Exception as exc:  # no keyring, or it refused: say so, keep nothing
            said(f"The keyring did not keep the token ({exc}).")
            return
        said(f"Token saved in the keyring for {where}." if text.strip() else f"Token for {where} forgotten.")

    dialog.textValueSelected.connect(save)
    dialog.open()
    return dialog


def partial_question(parent: QWidget, error: HubError, remove_it: Callable[[], Any]) -> QMessageBox | None:
    """After a failed download: keep the partial file (to resume, or to look at) or remove
    it (``remove_it``, bound to the failed download's file); the user says. None (nothing
    asked) when no partial file stayed."""
    if error.partial is None or not error.partial.exists():
        return None
    size = error.partial.stat().st_size
    box = plain_box(QMessageBox(QMessageBox.Icon.Warning, "The download did not finish", str(error),
                                parent=parent))
    box.setObjectName("partial-question")
    box.setInformativeText(f"The partial file ({gb(size)}) is {error.partial}."
                           + (" Keep it to resume later?" if error.resumable else " It is not used; keep it anyway?"))
    keep = box.addButton("Keep it", QMessageBox.ButtonRole.AcceptRole)
    remove = box.addButton("Remove it", QMessageBox.ButtonRole.DestructiveRole)
    box.setDefaultButton(keep if error.resumable else remove)
    box.finished.connect(lambda _result: box.clickedButton() is remove and remove_it())
    box.open()
    return box


def remove_partial(models_dir: Path, repo: str, file: str) -> str:
    """Remove the partial file of ``file`` of ``repo``; the sentence that says so, or why
    not (its download runs in another window or command)."""
    try:
        discard_partial(models_dir, repo, file)
    except HubError as exc:
        return str(exc)
    return f"Removed the partial file of {file}."


# ---------------------------------------------------------------------------
# the dialog's rows, built off the GUI thread where they come from the hub

#: a repository's GGUF files shown at most (a hostile list may name 50,000)
MAX_ROWS = 2_000
#: after this long with no progress, the progress line says nothing is arriving
STALE_S = 3.0


def recommended_rows(sizes: dict, n_ctx: int, memory: int | None,
                     recommended: tuple[str, str] | None) -> list[dict[str, Any]]:
    """The table's rows for :data:`RECOMMENDED` (local data; ``sizes``: what the hub said)."""
    rows = []
    for rec in RECOMMENDED:
        size = sizes.get((rec.repo, rec.file))
        estimate = rec.memory_estimate_bytes(n_ctx, size)
        mark = " · Recommended for this computer" if (rec.repo, rec.file) == recommended else ""
        rows.append({"repo": rec.repo, "file": rec.file, "size": size or rec.size_bytes,
                     "cells": [rec.title, rec.file, rec.quantization or "–",
                               gb(size or rec.size_bytes, about=size is None),
                               tokens(rec.context_length), memory_size(estimate),
                               fits_text(estimate, memory) + mark, rec.license],
                     "tip": f"{rec.repo} · {rec.parameters} parameters",
                     "about": f"{rec.title} ({rec.parameters} parameters, {rec.repo}): {rec.note}."})
    return rows


def recommended_sizes(client: HubClient) -> dict[tuple[str, str], int]:
    """The hub's exact sizes of the recommended files (on the worker thread)."""
    found = {}
    for rec in RECOMMENDED:
        try:
            files = client.files(rec.repo)
        except HubError as exc:  # one repository gone or gated: the others still count
            if exc.kind not in ("not_found", "auth"):
                raise
            continue
        found.update({(rec.repo, f.path): f.size for f in files if f.path == rec.file})
    return found


def file_rows(repo: str, files: list[HubFile], memory: int | None,
              models_dir: Path) -> tuple[list[dict[str, Any]], str]:
    """The table's rows for ``repo``'s GGUF files (on the worker thread: a list may be
    long), and the sentence for the status line. A file whose name cannot be a path in
    the models folder (``../x.gguf``, an invisible character) is not listed: the
    sentence says how many were left out, and why."""
    rows, left_out, why = [], 0, ""
    for f in files:
        if not f.is_gguf:
            continue
        problem = name_problem(f.path)
        if problem is not None:
            left_out, why = left_out + 1, why or problem
            continue
        if len(rows) < MAX_ROWS:
            rows.append({"repo": repo, "file": f.path, "size": f.size,
                         "cells": [repo.split("/", 1)[1], f.path, f.quantization or "–", gb(f.size), "–",
                                   f"at least {memory_size(f.size)}", fits_text(f.size, memory),
                                   "see the repository"],
                         "tip": repo,
                         "about": f"{f.path} of {repo}" + ("" if f.sha256 else " (no sha256 listed: "
                                                           "checked by its size and GGUF header only)")})
    shown = len(rows)
    total = sum(1 for f in files if f.is_gguf) - left_out
    said = (f"{total} GGUF file(s) in {repo}. The KV cache comes on top of the weights; the library "
            "shows the full estimate once it is downloaded." if rows else f"{repo} holds no GGUF file.")
    if total > shown:
        said += f" The first {shown:,} are shown."
    if left_out and not rows:  # ("holds no GGUF file. 2 more are not listed" contradicted itself)
        said = (f"None of the {left_out} GGUF file(s) in {repo} can be listed: their names cannot "
                f"be kept as files here ({why.rstrip('.')}).")
    elif left_out:
        said += (f" {left_out} more {'is' if left_out == 1 else 'are'} not listed: their names cannot be "
                 f"kept as files here ({why.rstrip('.')}).")
    if getattr(files, "cut", None):
        said += " " + files.cut
    return rows, said


def repo_label(repo: HubRepo) -> str:
    """A repository in the search's list: its name, and whether it is gated or, by the
    hub's pipeline tag, not a model to chat with (an embedding model)."""
    not_chat = repo.pipeline_tag is not None and repo.pipeline_tag not in CHAT_PIPELINES
    return (repo.id + ("  (gated)" if repo.gated else "")
            + (f"  (not for chat: {repo.pipeline_tag})" if not_chat else ""))


def fetch(client: HubClient, repo: str, file: str, models_dir: Path, cancel: threading.Event,
          progress: Callable[[DownloadProgress], Any]) -> tuple[Path, str | None]:
    """Download ``file`` (on the worker thread), and why it is no model to chat with
    (None: it is one; its header is read here, off the GUI thread)."""
    path = download(client, repo, file, models_dir, cancel=cancel, progress=progress)
    return path, not_for_chat(path)


def downloaded_words(path: Path, record: dict[str, Any] | None, not_chat: str | None,
                     before: bool = False) -> str:
    """The status line for a downloaded file: how it was checked, or that Iris cannot chat
    with it (an embedding model: no "Use this model")."""
    done = "Already downloaded" if before else "Downloaded"
    if not_chat is not None:
        return f"{done}, but {not_for_chat_words(not_chat)}: {path}"
    return f"{done} and {verified_words(record)}: {path}"


def stale_words(since: float, p: DownloadProgress) -> str | None:
    """The progress line when nothing arrived for :data:`STALE_S` (None: it is fresh)."""
    idle = time.monotonic() - since
    if p.phase != "downloading" or idle < STALE_S:
        return None
    return f"{replace(p, speed=0.0, eta_s=None).describe()} · nothing received for {idle:.0f} s"
