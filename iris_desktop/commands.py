"""What each ``iris-desktop`` command does; ``cli`` parses the arguments and calls these.

Every command works through one :class:`~iris_desktop.host.Host`, as the desktop app
does: ``chat`` is a print loop over the events of ``Host.send``, ``compact`` over those
of ``Host.compact``. Every request shown or sent comes from the host's planner
(``core.planner``), so ``context --draft`` predicts what ``chat`` then sends.
Exit codes: 0 success; 1 a runtime failure (for example a model that will not load);
2 bad usage, invalid settings or a malformed file; 3 ConversationTooLargeException.
"""

from __future__ import annotations

import functools
import json
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iris_desktop.core.events import (
    CacheStatus,
    CompactionFinished,
    PromptProgress,
    ReplySaved,
    ReplyStarted,
    ReplyToken,
    ThreadCreated,
    ToolFinished,
    TurnDone,
    TurnFailed,
    TurnListener,
    dispatch,
)
from iris_desktop.core.turns import Turn, TurnOptions
from iris_desktop.stop import StopEvent
from iris_desktop.untrusted import json_escape_invisible, show_untrusted

if TYPE_CHECKING:
    from iris_desktop.runtime.protocol import Runtime

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_TOO_LARGE = 0, 1, 2, 3
#: text a ``threads`` listing counts at most; the rest shows as "not yet counted" until a
#: request (or a later listing) counts it, so a listing never waits for a huge import
LISTING_COUNT_CHARS = 200_000


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


# Stored text is shown, never obeyed: a control character would let a title or a reply
# move the cursor or retitle the terminal, a bidi control display one title as another:
# human-readable output shows them as escapes such as \x1b and \u202e (untrusted.py).
def say(text: str = "", file: Any = None) -> None:
    """Print human-readable text that may hold stored data."""
    print(show_untrusted(text, multiline=True), file=file or sys.stdout)


def stdout_gone() -> None:
    """The reader of stdout left (``| head``): what is still buffered, and whatever is
    printed later, goes to the null device, so no write (nor Python's flush at exit)
    raises BrokenPipeError again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test's capture)
        pass


def dump_json(value: Any, **options: Any) -> str:
    """JSON for the terminal: as json.dumps, with DEL, C1 and the other invisible or
    reordering characters (bidi controls, zero-width ones) escaped too, as JSON escapes."""
    return json_escape_invisible(json.dumps(value, ensure_ascii=False, **options))


@contextmanager
def open_host(args: Any, overrides: dict[str, str]) -> Iterator[Any]:
    """The Host, closed at the end; settings problems and a database recovery are told
    once, on stderr, and set-aside databases the user was not shown yet on every command
    until ``iris-desktop recover`` lists them. Messages found damaged on disk while the
    command read them are named at the end."""
    from iris_desktop.core.store import StoreError
    from iris_desktop.core.store.recovery import acknowledge, announce, unacknowledged
    from iris_desktop.host import Host

    try:
        host = Host(args.data_dir, overrides,
                    ask_passphrase=_terminal_passphrase if sys.stdin.isatty() else None)
    except StoreError as exc:
        raise CliError(str(exc), EXIT_FAIL) from None
    with host:
        for problem in host.settings.problems:
            say(f"iris-desktop: warning: {problem}", file=sys.stderr)
        db = host.paths.db_path
        if host.recovery is not None:
            say(f"iris-desktop: {host.recovery.describe()}", file=sys.stderr)
            acknowledge(db, [host.recovery.set_aside])
        pending = unacknowledged(db)
        if pending:
            say(f"iris-desktop: warning: {announce(db, pending)}", file=sys.stderr)
        yield host
        _say_damaged(host)


def _say_damaged(host) -> None:
    """Name the messages the command found damaged on disk (they were shown anyway)."""
    damaged = host.store.damaged
    for message_id, what in sorted(damaged.items())[:20]:
        say(f"iris-desktop: warning: message {message_id} is damaged on disk: {what}",
            file=sys.stderr)
    if len(damaged) > 20:
        say(f"iris-desktop: warning: {len(damaged) - 20:,} more messages are damaged on disk",
            file=sys.stderr)


def _terminal_passphrase(path: Path, new: bool, problem: str | None) -> str | None:
    """Ask for the history's passphrase on the terminal, unechoed (``new``: twice, to
    encrypt it with); None when the user gives none (Ctrl+D, an empty line)."""
    from getpass import getpass

    if problem:
        say(f"iris-desktop: {problem}", file=sys.stderr)
    try:
        if not new:
            return getpass(f"Passphrase of the encrypted history at {path}: ") or None
        for _ in range(3):
            text = getpass(f"storage.encrypt is on: choose a passphrase for {path}: ")
            if not text:
                return None
            if getpass("The same passphrase again: ") == text:
                return text
            say("iris-desktop: the two passphrases differ; try again", file=sys.stderr)
    except EOFError:
        return None
    return None


def text_argument(value: str, what: str) -> str:
    """A text argument that will be stored or tokenized: it must be valid Unicode (bytes
    that are not UTF-8 reach Python as lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise CliError(f"{what} is not valid UTF-8 text") from None
    return value


def _thread(host, thread_id: int) -> dict[str, Any]:
    try:
        return host.store.thread(thread_id)
    except KeyError:
        raise CliError(f"no thread {thread_id} (see 'iris-desktop threads')") from None


def _load(host) -> Runtime:
    from iris_desktop.host import LOAD_STAGES, ModelError

    def stage(what: str) -> None:  # the first load of a model writes its 8-bit copy: seconds
        if what == "copying":
            words = LOAD_STAGES[what]
            say(f"iris-desktop: {words[:1].lower()}{words[1:]}", file=sys.stderr)

    try:
        return host.load_model(stage=stage)
    except ModelError as exc:
        raise CliError(f"cannot load the model: {exc}", EXIT_FAIL) from None
    except RuntimeError as exc:
        # a server that is unreachable or refuses the key (imported here: httpx loads
        # only when a server is in use)
        from iris_desktop.runtime.remote import ServerError

        if not isinstance(exc, ServerError):
            raise
        raise CliError(f"cannot use the server: {exc}", EXIT_FAIL) from None


def _index_for_recall(host, thread_id: int) -> None:
    """Recall by meaning needs the summarized messages' vectors: embed what is missing
    (once; the GUI does it in the background)."""
    if host.load_embedder() is None:
        return
    done = host.index_for_recall(thread_id)
    if done:
        say(f"iris-desktop: embedded {done:,} summarized messages of thread {thread_id} for "
            "recall by meaning (once)", file=sys.stderr)


def _maybe_load_model(host, args) -> None:
    """Load the model when the settings want its window or tokenizer (unless --no-model)."""
    s = host.settings
    wanted = s["context.token_counter"] in ("auto", "model") or s["context.window"] == "auto"
    if args.no_model or not wanted:
        return
    if host.try_load_model() is None:
        say(f"iris-desktop: warning: no model ({host.model_error}); counting without it",
            file=sys.stderr)


# -- conversations -------------------------------------------------------------------------


def import_(args, overrides) -> int:
    """Every chat of the file (an OpenAI message list, an Iris export, a ChatGPT, Open WebUI
    or LM Studio export, a Jan thread or threads folder) as a thread, in one transaction:
    the new threads' ids on stdout, one a line; for another app's file, what was imported
    and what was left out on stderr."""
    from iris_desktop.core.conversation import ConversationFormatError
    from iris_desktop.core.foreign import import_conversations, load_conversations

    title = text_argument(args.title, "--title") if args.title else None
    try:
        loaded = load_conversations(args.file)
    except ConversationFormatError as exc:
        raise CliError(f"import refused, nothing was written: {exc}") from None
    with open_host(args, overrides) as host:
        thread_ids = import_conversations(host.store, loaded, title)
    for thread_id in thread_ids:
        print(thread_id)
    if loaded.foreign:
        for line in loaded.report():
            say(f"iris-desktop: {line}", file=sys.stderr)
    return EXIT_OK


def export(args, overrides) -> int:
    from iris_desktop.core.conversation import export_messages, to_markdown
    from iris_desktop.core.store import row_to_message

    with open_host(args, overrides) as host:
        thread = _thread(host, args.thread)
        if args.format == "json":  # every branch
            text = dump_json(export_messages(host.store, args.thread), indent=2) + "\n"
        else:  # the active branch, to read
            text = to_markdown(thread["title"],
                               [row_to_message(r) for r in host.store.messages(args.thread)])
    if args.output:
        _write_private(Path(args.output), text)
    else:  # Markdown is exact in a file or a pipe, and shown safely on a terminal
        sys.stdout.write(show_untrusted(text, multiline=True) if sys.stdout.isatty() else text)
    return EXIT_OK


def _write_private(path: Path, text: str) -> None:
    """Write an export (``write_private``), or say why not."""
    from iris_desktop.core.conversation import write_private

    try:
        write_private(path, text)
    except OSError as exc:
        raise CliError(f"cannot write {path} ({exc.strerror or exc}); choose another "
                       "file with -o", EXIT_FAIL) from None


def delete(args, overrides) -> int:
    """Delete a thread for good (``Host.delete_thread``): asks first on a terminal; without
    one, ``--yes`` is required."""
    with open_host(args, overrides) as host:
        thread = _thread(host, args.thread)
        count = len(host.store.messages(args.thread))
        what = f"thread {args.thread} “{show_untrusted(thread['title'])}” ({count:,} messages)"
        if not args.yes:
            if not sys.stdin.isatty():
                raise CliError(f"not deleting {what} without --yes (nobody to ask)")
            try:
                answer = input(f"Delete {what} and everything of it? This cannot be undone. [y/N] ")
            except EOFError:
                answer = ""
            if answer.strip().lower() not in ("y", "yes"):
                say("iris-desktop: nothing was deleted", file=sys.stderr)
                return EXIT_OK
        host.delete_thread(args.thread)
    say(f"deleted {what}")
    return EXIT_OK


def switch(args, overrides) -> int:
    """Make the next or previous alternative of a message active (``Host.switch_branch``)
    and print the active branch's messages, one line each."""
    with open_host(args, overrides) as host:
        _thread(host, args.thread)
        try:
            host.switch_branch(args.thread, args.message, 1 if args.direction == "next" else -1)
        except KeyError:
            raise CliError(f"no message {args.message} in thread {args.thread}") from None
        except ValueError as exc:
            raise CliError(str(exc)) from None
        points = host.store.branch_points(args.thread)
        for row in host.store.messages(args.thread):
            place = points.get(row["id"])
            mark = f" ‹ {place[0]}/{place[1]} ›" if place else ""
            text = " ".join((row["content"] or "").split())
            say(f"{row['id']:>6} {row['role']:<9}{mark} {show_untrusted(text[:90])}")
    return EXIT_OK


def threads(args, overrides) -> int:
    """Threads with cached token totals. A listing counts at most LISTING_COUNT_CHARS of
    text not counted yet (newest first) and says how many messages remain uncounted."""
    from iris_desktop.core.engine import ensure_counts

    with open_host(args, overrides) as host:
        _maybe_load_model(host, args)
        counter = host.planner().counter
        store = host.store
        ensure_counts(store, counter, store.uncounted(counter.name, LISTING_COUNT_CHARS))
        rows = []
        for thread in store.threads():
            tokens, uncounted = store.thread_token_total(thread["id"], counter.name)
            rows.append({**thread, "tokens": tokens, "uncounted_messages": uncounted,
                         "counter": counter.name})
    if args.json:
        print(dump_json(rows, indent=2))
        return EXIT_OK
    if not rows:
        print("no threads yet")
    for row in rows:
        tokens = f"{row['tokens']:,} tokens" + (
            f" (+{row['uncounted_messages']:,} not yet counted)"
            if row["uncounted_messages"] else "")
        print(f"{row['id']:>5}  {row['messages']:>6} messages  {tokens:<28} "
              f"{show_untrusted(row['title'])}")
    return EXIT_OK


# -- the context ---------------------------------------------------------------------------


def context_report(host, thread_id: int, draft: str | None = None,
                   show_request: bool = False) -> dict[str, Any]:
    """What ``context --json`` prints; raises ConversationTooLargeException."""
    planner = host.planner()
    runtime = host.runtime
    request = planner.plan(host.store, thread_id, draft)
    b = request.breakdown
    summary = request.summary
    report: dict[str, Any] = {
        "thread_id": thread_id,
        "window": b.window,
        "window_source": request.window_source,
        "token_budget_ratio": b.ratio,
        "compaction_threshold": planner.params.compaction_threshold,
        "counter": request.counter,
        "counter_exact": planner.counter.exact,
        "prompt_exact": request.exact or planner.counter.exact,
        "chat_format": runtime.chat_format.name if runtime is not None else None,
        "where": runtime.where if runtime is not None else None,
        "budget": b.budget,
        "system_tokens": b.system,
        "tool_tokens": b.tools,
        "summary_tokens": b.summary,
        "recall_tokens": b.recall,
        "history_tokens": b.history,
        "draft_tokens": b.draft,
        "template_framing_tokens": request.framing,
        "available": b.available,
        "free": b.free,
        "threshold_tokens": b.threshold,
        "predicted_prompt_tokens": request.predicted_prompt_tokens,
        "last_prompt_tokens": request.last_prompt_tokens,
        "protect_turns": request.protect_turns,
        "configured_protect_turns": request.configured_protect_turns,
        "fallback": request.fallback,
        "compaction_due": request.compaction_due,
        "trigger": request.trigger,
        "triggers": request.triggers,
        "unsummarized_turns": request.unsummarized_turns,
        "dropped_turns": request.dropped_turns,
        "tools": [d["function"]["name"] for d in planner.tool_prompt().definitions],
        "tools_native": planner.tool_prompt().native,
        "summary_id": summary.id if summary else None,
        "summary_fields": summary.fields if summary else None,
        "recall": {"ids": request.recall.ids, "text": request.recall.text, "terms": request.recall.terms,
                   "reason": request.recall.reason,
                   "semantic": request.recall.semantic,
                   "max_tokens": planner.params.recall_max_tokens},
        "compactions": host.store.compaction_events(thread_id),
        "messages": planner.engine(host.store).describe(request),
    }
    if host.model_error:
        report["model_error"] = host.model_error
    if show_request:
        report["request"] = request.messages
    return report


def context(args, overrides) -> int:
    from iris_desktop.core.engine import ConversationTooLargeException

    draft = text_argument(args.draft, "--draft") if args.draft is not None else None
    with open_host(args, overrides) as host:
        _thread(host, args.thread)
        _maybe_load_model(host, args)
        if host.runtime is not None:
            _index_for_recall(host, args.thread)
        try:  # a huge newest turn is refused from its size, before it is counted
            report = context_report(host, args.thread, draft, args.show_request)
        except ConversationTooLargeException as exc:
            say(f"iris-desktop: conversation too large: {exc}", file=sys.stderr)
            return EXIT_TOO_LARGE
    if args.json:
        print(dump_json(report, indent=2))
        return EXIT_OK
    _print_context(report)
    return EXIT_OK


def refuse_if_certainly_too_large(host, n_bytes: int, outcome: str) -> None:
    """Exit 3 before anything is tokenized when ``n_bytes`` of text in the newest turn
    are certainly more than any history budget of this window: they need at least
    store.min_tokens(n_bytes) tokens. Tokenizing 10 MiB takes tens of seconds and over
    a gigabyte, only to reach the same answer."""
    from iris_desktop.core.engine import certainly_too_large

    refusal = certainly_too_large(host.planner().params, n_bytes)
    if refusal:
        raise CliError(f"{refusal}; {outcome}. Shorten the message, or raise context.window and "
                       "model.n_ctx", EXIT_TOO_LARGE)


def _print_context(r: dict[str, Any]) -> None:
    states: dict[str, int] = {}
    for m in r["messages"]:
        states[m["state"]] = states.get(m["state"], 0) + 1
    print(f"window      {r['window']:>8,}  ({r['window_source']}; counter {r['counter']}"
          + (f"; format {show_untrusted(r['chat_format'])}" if r["chat_format"] else "") + ")")
    print(f"budget      {r['budget']:>8,}  (window × {r['token_budget_ratio']})")
    for label, key in (("system", "system_tokens"), ("tools", "tool_tokens"),
                       ("summary", "summary_tokens"), ("recall", "recall_tokens"),
                       ("history", "history_tokens"),
                       ("draft", "draft_tokens"), ("available", "available"), ("free", "free")):
        print(f"{label:<11} {r[key]:>8,}")
    exact = "exact" if r["prompt_exact"] else "estimated"
    print(f"prompt      {r['predicted_prompt_tokens']:>8,}  (predicted, {exact})")
    print(f"protect     {r['protect_turns']:>8}  turns" + ("  (fallback)" if r["fallback"] else ""))
    print("messages    " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())))
    recall = r.get("recall") or {}
    if recall.get("ids"):
        print(f"recall      {len(recall['ids'])} summarized messages shown with the newest message "
              f"(searched: {show_untrusted(' '.join(recall['terms'][:10]))})")
    elif recall.get("reason") and r["summary_id"] is not None:
        print(f"recall      none ({recall['reason']})")
    due = f"yes ({', '.join(r['triggers'])})" if r["compaction_due"] else "no"
    print(f"compaction  {due}")


# -- the model -----------------------------------------------------------------------------


class _ChatPrinter(TurnListener):
    """How ``chat`` shows a turn: tokens on stdout (unless --json), the rest on stderr."""

    def __init__(self, as_json: bool):
        self.as_json = as_json
        self.reply = ""
        self.stats: Any = None
        self.code = EXIT_OK
        self.thread_id: int | None = None
        self.restored = 0
        #: set when stdout's reader leaves: the reply stops as Stop stops it
        self.cancel: threading.Event | None = None
        self.stdout_closed = False

    def _out(self, text: str) -> None:
        """Reply text on stdout. A reader that left (``| head``) stops the reply as Stop
        does: it is saved as far as it was generated, and nothing more is printed."""
        if self.stdout_closed:
            return
        try:
            sys.stdout.write(show_untrusted(text, multiline=True))
            sys.stdout.flush()
        except BrokenPipeError:
            self.stdout_closed = True
            stdout_gone()
            if self.cancel is not None:
                self.cancel.set()

    def on_thread_created(self, event: ThreadCreated) -> None:
        self.thread_id = event.thread_id

    def on_cache(self, event: CacheStatus) -> None:
        if event.state == "restored":
            self.restored = event.done
        elif event.state == "warming":  # after a compaction, before the prompt returns
            self._progress_line(event.describe(), event.done >= event.total)

    def on_reply_started(self, event: ReplyStarted) -> None:
        self.reply = ""
        if event.text and not self.as_json:  # a continued reply: what it already said
            self._out(event.text)

    def on_progress(self, event: PromptProgress) -> None:
        """How far the model has read the prompt, on one line of a terminal's stderr."""
        self._progress_line(event.describe(), event.done >= event.total)

    @staticmethod
    def _progress_line(text: str, finished: bool) -> None:
        """One line on a terminal's stderr, rewritten in place until ``finished``."""
        if not sys.stderr.isatty():
            return
        end = "\n" if finished else ""
        sys.stderr.write(f"\r\x1b[K{show_untrusted(text)}{end}")
        sys.stderr.flush()

    def on_token(self, event: ReplyToken) -> None:
        if not self.as_json:
            self._out(event.text)

    def on_reply(self, event: ReplySaved) -> None:
        self.reply, self.stats = event.text, event.stats

    def on_tool(self, event: ToolFinished) -> None:
        say(f"\n[tool {show_untrusted(event.name)}: {'ok' if event.ok else 'error'}]",
            file=sys.stderr)

    def on_compaction_finished(self, event: CompactionFinished) -> None:
        say(f"\n[{event.text}]", file=sys.stderr)

    def on_failed(self, event: TurnFailed) -> None:
        say(f"\niris-desktop: {event.text}", file=sys.stderr)
        self.code = EXIT_TOO_LARGE if event.kind == "too_large" else EXIT_FAIL

    def on_done(self, event: TurnDone) -> None:
        if event.finish_reason == "cancelled" and not self.stdout_closed:
            print("\n[stopped]", file=sys.stderr)


@contextmanager
def _cancel_on_interrupt(cancel: threading.Event) -> Iterator[None]:
    """Ctrl+C stops the reply at the next token (cooperatively) instead of killing the
    turn half-way; a second Ctrl+C interrupts for real."""
    def handler(signum, frame) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()
        print("\n[stopping…]", file=sys.stderr)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _shell_confirmation(args):
    if args.yes_shell:
        return lambda command: True
    if not sys.stdin.isatty():
        return None  # nobody to ask: every shell call is refused


    def ask(command: str) -> bool:
        # every control, bidi and invisible character as an escape: what is shown is what runs
        say(f"\nThe model wants to run:\n  {show_untrusted(command)}", file=sys.stderr)
        try:
            answer = input("Run it? [y/N] ")
        except EOFError:
            return False
        return answer.strip().lower() in ("y", "yes")

    return ask


def chat_message(args) -> str:
    """The message to send: the argument, ``-`` for standard input, or ``--file PATH``."""
    from iris_desktop.core.conversation import (
        MAX_IMPORT_BYTES,
        ConversationFormatError,
        read_text_file,
    )

    if (args.message is None) == (args.file is None):
        raise CliError("give the message as an argument, as '-' to read standard input, "
                       "or with --file PATH (exactly one of them)")
    if args.file is not None:
        try:
            return read_text_file(Path(args.file), MAX_IMPORT_BYTES)
        except ConversationFormatError as exc:
            raise CliError(f"--file: {exc}") from None
    if args.message != "-":
        return text_argument(args.message, "the message")
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"standard input is not UTF-8 text (byte {exc.start})") from None


def _say_where(runtime) -> None:
    """A server on another machine gets the conversation: say so on every run (the GUI
    asks once per server instead), with the warning for plain http."""
    if runtime.is_loopback and not runtime.warning:
        return
    say(f"iris-desktop: this conversation is sent to {runtime.where}", file=sys.stderr)
    if runtime.warning:
        say(f"iris-desktop: warning: {runtime.warning}", file=sys.stderr)


def _attachments(args) -> list:
    """The files ``--attach`` names, read as text; a file that is not text is refused
    before anything is sent."""
    from iris_desktop.core.attachments import AttachmentError, read_attachment

    try:
        return [read_attachment(path) for path in args.attach]
    except AttachmentError as exc:
        raise CliError(f"--attach: {exc}; nothing was sent or stored") from None


def _turn_of(args, message: str | None, files) -> Turn:
    """The turn ``chat``'s flags ask for: send (the default), regenerate, edit (with the
    files ``--attach`` names, like a send) or continue."""
    if args.regenerate:
        return Turn.regenerate(args.thread)
    if args.continue_reply:
        return Turn.continue_reply(args.thread)
    if args.edit is not None:
        return Turn.edit(args.thread, args.edit, message or "", files)
    return Turn.send(args.thread, message or "", files)


def chat(args, overrides) -> int:
    from iris_desktop.core.store import utf8_length

    again = args.regenerate or args.continue_reply
    if again or args.edit is not None:
        if args.thread is None:
            raise CliError("--regenerate, --edit and --continue need --thread THREAD")
    message = None if again else chat_message(args)
    if again and (args.message is not None or args.file is not None or args.attach):
        raise CliError("--regenerate and --continue take no message")
    files = _attachments(args)
    if args.model:
        overrides = {**overrides, "model.path": args.model}
    with open_host(args, overrides) as host:
        runtime = _load(host)
        _say_where(runtime)
        if args.thread is not None:
            _thread(host, args.thread)
        if message is not None:
            from iris_desktop.core.attachments import model_text

            refuse_if_certainly_too_large(host, utf8_length(model_text(message, files).strip()),
                                          "nothing was sent or stored")
        if args.thread is not None:
            _index_for_recall(host, args.thread)
        printer = _ChatPrinter(args.json)
        printer.thread_id = args.thread
        cancel = printer.cancel = StopEvent()
        with _cancel_on_interrupt(cancel):
            # the thread's saved KV state is restored (only the new message is evaluated)
            # and saved again when the host closes, for the next process and the GUI
            options = TurnOptions(confirm_shell=_shell_confirmation(args),
                                  progress=functools.partial(dispatch, listener=printer))
            turn = host.run(_turn_of(args, message, files), cancel, options)
            try:
                for event in turn:
                    dispatch(event, printer)
            finally:  # whatever stopped the loop, the turn ends here, before the host closes
                turn.close()
        if printer.stdout_closed:  # the reader left (``| head``): the reply is saved, stop quietly
            return printer.code
        stats = printer.stats
        if args.json:
            print(dump_json({
                "thread_id": printer.thread_id,
                "reply": printer.reply,
                "model": runtime.model_name,
                "chat_format": runtime.chat_format.name,
                "where": runtime.where,
                "kv_restored_tokens": printer.restored,
                **{key: getattr(stats, key, None) for key in (
                    "prompt_tokens", "reused_tokens", "evaluated_tokens", "completion_tokens",
                    "time_to_first_token_s", "tokens_per_s", "finish_reason")},
            }, indent=2))
        else:
            print()
            print(f"[thread {printer.thread_id}]", file=sys.stderr)
        return printer.code


def models(args, overrides) -> int:
    """The model library: the bundled model, GGUFs other apps downloaded, files opened
    before; headers only, nothing is loaded or copied. ``search``, ``files`` and
    ``download`` ask the model hub (``models.hub_url``), and only they contact it."""
    if getattr(args, "action", None):
        return _hub_command(args, overrides)
    from iris_desktop.runtime.library import discover_models, read_recent
    from iris_desktop.settings import BUNDLED

    with open_host(args, overrides) as host:
        configured = host.settings["model.path"]
        recent = read_recent(host.paths.recent_models_path)
        extra = [] if configured == BUNDLED else [configured]
        entries = discover_models(models_dir=host.paths.models_dir, recent=recent,
                                  extra_paths=extra, n_ctx=host.settings["model.n_ctx"])
    selected = entries[0].path if configured == BUNDLED and entries else Path(configured)
    rows = [{**e.as_json(), "selected": e.path == selected} for e in entries]
    if args.json:
        print(dump_json(rows, indent=2))
        return EXIT_OK
    for row in rows:
        mark = "*" if row["selected"] else " "
        title = f"{mark} {row['name']} ({row['source']})"
        if row["error"]:
            say(f"{show_untrusted(title)}\n    unusable: {show_untrusted(row['error'])}\n"
                f"    {show_untrusted(row['path'])}")
            continue
        params = f"{row['parameters'] / 1e9:.2f}B params" if row["parameters"] else "? params"
        memory = (f"~{row['memory_estimate_bytes'] / 2**30:.1f} GiB at n_ctx {row['n_ctx']:,}"
                  if row["memory_estimate_bytes"] else "memory unknown")
        notes = [n for n, on in (("base model", row["base_model"]),
                                 ("verified", row["verified"])) if on]
        say(f"{show_untrusted(title)}{' — ' + ', '.join(notes) if notes else ''}\n"
            f"    {row['architecture']}, {params}, {row['quantization'] or '?'}, "
            f"{(row['size_bytes'] or 0) / 1e6:,.0f} MB, trained context "
            f"{row['context_length'] or '?'}, "
            f"{'chat template' if row['chat_template'] else 'no chat template'}, {memory}\n"
            f"    {show_untrusted(row['path'])}")
    return EXIT_OK


def _hub_command(args, overrides) -> int:
    """``models search TEXT``, ``models files REPO``, ``models download REPO FILE``."""
    from iris_desktop.paths import app_paths
    from iris_desktop.runtime.hub import (
        HubClient,
        HubError,
        discard_partial,
        download,
        download_record,
        verified_words,
    )
    from iris_desktop.runtime.library import describe_model
    from iris_desktop.settings import load_settings

    paths = app_paths(args.data_dir).ensure()
    settings = load_settings(paths.config_path, cli=overrides)
    for problem in settings.problems:
        say(f"iris-desktop: warning: {problem}", file=sys.stderr)
    as_json = getattr(args, "json", False)
    hub_url = settings["models.hub_url"]
    if args.action == "token":
        return _hub_token(hub_url, args.remove)
    try:
        if args.action == "download" and args.remove_partial:
            removed = discard_partial(paths.models_dir, args.repo, args.file)
            say(f"iris-desktop: {'removed the partial download' if removed else 'no partial download'} "
                f"of {args.file}", file=sys.stderr)
            return EXIT_OK
        with HubClient.for_settings(hub_url) as client:
            if args.action == "search":
                repos = client.search(" ".join(args.text))
                if as_json:
                    print(dump_json([r.as_json() for r in repos], indent=2))
                for r in [] if as_json else repos:
                    gated = ", gated: needs a token" if r.gated else ""
                    say(f"{show_untrusted(r.id)}  ({r.downloads or 0:,} downloads{gated})")
                if not repos and not as_json:
                    say(f"iris-desktop: no GGUF repository on {client.address} matches that", file=sys.stderr)
                return EXIT_OK
            if args.action == "files":
                files = [f for f in client.files(args.repo, args.revision) if f.is_gguf]
                if as_json:
                    print(dump_json([f.as_json() for f in files], indent=2))
                for f in [] if as_json else files:
                    say(f"{show_untrusted(f.path)}  {f.size / 1e9:.2f} GB  {f.quantization or '?'}"
                        f"{'' if f.sha256 else '  (no sha256 listed)'}")
                return EXIT_OK
            cancel = threading.Event()
            with _cancel_on_interrupt(cancel):
                path = download(client, args.repo, args.file, paths.models_dir, revision=args.revision,
                                cancel=cancel, restart=args.restart, progress=_download_progress)
    except HubError as exc:
        _download_line("", True)
        if exc.partial is not None and exc.partial.exists():
            say(f"iris-desktop: {exc}", file=sys.stderr)
            raise CliError(f"the partial file is kept at {exc.partial} (run the same command to "
                           f"{'resume' if exc.resumable else 'start over'}, or add --remove-partial "
                           "to remove it)", EXIT_FAIL) from None
        raise CliError(str(exc), EXIT_FAIL) from None
    _download_line("", True)
    entry = describe_model(path, source="download", repo=args.repo, n_ctx=settings["model.n_ctx"])
    if as_json:
        print(dump_json({"path": str(path), "repo": args.repo, "file": args.file,
                         "revision": args.revision, "model": entry.as_json()}, indent=2))
        return EXIT_OK
    say(str(path))
    checked = verified_words(download_record(paths.models_dir, args.repo, args.file))
    say(f"iris-desktop: downloaded and {checked}; use it with "
        f"'iris-desktop chat --model {path}' or 'iris-desktop config set model.path {path}'",
        file=sys.stderr)
    return EXIT_OK


def _hub_token(hub_url: str, remove: bool) -> int:
    """``models token``: the hub's token into the OS keyring (as a server's API key)."""
    from getpass import getpass

    from keyring.errors import KeyringError

    from iris_desktop.runtime.hub import set_hub_token

    token = ""
    if not remove:
        token = (getpass("Hub token (not shown): ") if sys.stdin.isatty() else sys.stdin.readline()).strip()
        if not token:
            raise CliError("no token given, so nothing was saved (--remove forgets a saved one)")
    try:
        set_hub_token(hub_url, token)
    except (KeyringError, ValueError) as exc:
        raise CliError(f"the keyring did not keep the token ({exc})", EXIT_FAIL) from None
    say(f"iris-desktop: {'forgot the token' if remove else 'saved the token in the keyring'} for "
        f"{hub_url}", file=sys.stderr)
    return EXIT_OK


def _download_progress(progress) -> None:
    _download_line(progress.describe(), False)


def _download_line(text: str, finished: bool) -> None:
    """One line on a terminal's stderr, rewritten in place; ``finished`` ends it."""
    if not sys.stderr.isatty():
        return
    sys.stderr.write(f"\r\x1b[K{show_untrusted(text)}" + ("\r\x1b[K" if finished else ""))
    sys.stderr.flush()


def compact(args, overrides) -> int:
    with open_host(args, overrides) as host:
        _thread(host, args.thread)
        # --no-model: the extractive summarizer, counting without the model's tokenizer
        if not args.no_model and host.try_load_model() is None:
            say(f"iris-desktop: warning: no model ({host.model_error}); "
                "using the extractive summarizer", file=sys.stderr)
        event = None
        for reported in host.compact(args.thread):
            if isinstance(reported, CompactionFinished):
                event = reported.event
            elif isinstance(reported, TurnFailed):
                raise CliError(reported.text, EXIT_FAIL)
    if event is None:
        raise CliError("compaction did not run", EXIT_FAIL)
    if args.json:
        print(dump_json(event.as_dict(), indent=2, default=str))
    else:
        say(event.describe())
    return EXIT_OK if event.outcome == "ok" else EXIT_FAIL


# -- settings ------------------------------------------------------------------------------


def config(args, overrides) -> int:
    from iris_desktop.paths import app_paths
    from iris_desktop.settings import (
        SETTINGS,
        load_settings,
        lookup,
        reset_config,
        write_config_value,
    )

    config_path = app_paths(args.data_dir).config_path
    if args.action == "path":
        print(config_path)
        return EXIT_OK
    if args.action == "set":
        value = write_config_value(config_path, args.key, args.value)
        print(f"{args.key} = {show_untrusted(lookup(args.key).to_text(value))}  ({config_path})")
        return EXIT_OK
    if args.action == "reset":
        if args.key:
            lookup(args.key)
        reset_config(config_path, args.key)
        return EXIT_OK
    settings = load_settings(config_path, cli=overrides)
    for problem in settings.problems:
        say(f"iris-desktop: warning: {problem}", file=sys.stderr)
    if args.action == "get":
        print(show_untrusted(lookup(args.key).to_text(settings[args.key])))
        return EXIT_OK
    rows = [
        {"key": key, "value": settings[key], "source": settings.source(key),
         "default": s.default, "allowed": s.describe_allowed(), "env": s.env_var, "help": s.help}
        for key, s in SETTINGS.items()
    ]
    if getattr(args, "json", False):
        print(dump_json(rows, indent=2))
        return EXIT_OK
    for row in rows:
        value = show_untrusted(lookup(row["key"]).to_text(row["value"]))
        print(f"{row['key']:<30} {value:<24} [{row['source']}]")
    return EXIT_OK


# -- devices --------------------------------------------------------------------------------


def devices(args, overrides) -> int:
    """What llama.cpp can run the model on (each device with its free and total memory and
    its first-use check), and the plan ``model.gpu`` makes for the configured model at
    ``model.n_ctx``: the GGUF header only, nothing is loaded."""
    from iris_desktop.host import GPU_CHECKS_FILE, ModelError, model_path_for
    from iris_desktop.paths import app_paths
    from iris_desktop.runtime.backends import BackendError
    from iris_desktop.runtime.devices import list_devices
    from iris_desktop.runtime.gguf import GGUFError, read_gguf_info
    from iris_desktop.runtime.gpu import GpuChecks, plan_gpu
    from iris_desktop.settings import load_settings

    paths = app_paths(args.data_dir).ensure()
    settings = load_settings(paths.config_path, cli=overrides)
    for problem in settings.problems:
        say(f"iris-desktop: warning: {problem}", file=sys.stderr)
    try:
        found = list_devices()
    except BackendError as exc:
        raise CliError(str(exc), EXIT_FAIL) from None
    checks = GpuChecks(paths.data_dir / GPU_CHECKS_FILE)
    plan, model, n_ctx, problem = None, None, settings["model.n_ctx"], None
    if settings["model.backend"] != "local":
        problem = "model.backend is openai: the server runs the model"
    else:
        try:
            model = model_path_for(settings, paths.models_dir)
            info = read_gguf_info(model)
            n_ctx = n_ctx or info.context_length or 4096
            plan = plan_gpu(info, n_ctx, found, settings["model.gpu"], disabled=checks.disabled(found),
                            flash_attn=settings["model.flash_attn"])
        except (GGUFError, ModelError) as exc:
            problem = f"no plan: {exc}"
    rows = [{**d.as_json(), "check": checks.result(d) if d.is_gpu else None} for d in found]
    if args.json:
        print(dump_json({"devices": rows, "model": str(model) if model else None, "n_ctx": n_ctx,
                         "model.gpu": settings["model.gpu"], "plan": plan.as_json() if plan else None,
                         "problem": problem}, indent=2))
        return EXIT_OK
    print("Devices llama.cpp can use:")
    for row in rows:
        memory = (f"{row['free_bytes'] / 2**30:.1f} GiB free of {row['total_bytes'] / 2**30:.1f} GiB"
                  if row["total_bytes"] else "memory not reported")
        driver = f", driver {row['driver']}" if row["driver"] else ""
        check = row["check"]
        if row["kind"] not in ("gpu", "igpu"):
            checked = ""
        elif check is None:
            checked = " — not checked against the CPU yet (the first load on it does)"
        else:
            checked = f" — first-use check: {check['detail']}" + (
                "" if check["agrees"] else " (off for Iris until its driver changes)")
        kind = row["kind"] if row["kind"] == "cpu" else f"{row['kind']}, {row['backend']}{driver}"
        say(f"  {row['name']:<8} {row['description']} ({kind}): {memory}{checked}")
    if plan is None:
        say(f"model.gpu {settings['model.gpu']}: {problem}")
        return EXIT_OK
    say(f"model.gpu {settings['model.gpu']}, {model.name} at n_ctx {n_ctx:,}:\n"
        f"  {plan.describe()}: {plan.reason}")
    if plan.all_bytes:
        say(f"  all {plan.total_layers} layers on a GPU would need about {plan.all_bytes / 2**30:.2f} GiB "
            "(weights, the context's KV cache, the compute buffer)")
    return EXIT_OK


# -- set-aside databases ------------------------------------------------------------------


def recover(args, overrides) -> int:
    """List the databases set aside beside the history (and mark them shown), put one
    back (``FILE``: the current database is set aside first, never deleted), or copy
    what can be read of the current one into a new database (``--salvage``). Works on
    the files directly: the current database is not opened (nor checked, nor salvaged)
    to list or restore."""
    from iris_desktop.core.store import StoreError
    from iris_desktop.core.store.recovery import acknowledge, remove_stale_work, set_aside_files
    from iris_desktop.paths import app_paths

    paths = app_paths(args.data_dir).ensure()
    db = paths.db_path
    key = _HistoryKey(paths)
    try:
        if args.salvage:
            return _salvage_now(db, args, key)
        removed = remove_stale_work(db)  # a killed recover's copies of the history
        for leftover in removed:
            say(f"removed {leftover.name}: a copy of the history left by a recovery that did "
                "not finish", file=sys.stderr)
        if args.file is None:
            files = set_aside_files(db)
            _list_set_aside(db, files, args.json, key)
            acknowledge(db, files)
            return EXIT_OK
        return _restore(db, args, key)
    except StoreError as exc:
        raise CliError(str(exc), EXIT_FAIL) from None


class _HistoryKey:
    """The key of an encrypted file of this history (the current database, or one set
    aside from it: the same key), found as the host finds it (IRIS_STORAGE_PASSPHRASE,
    the keyring, or asked on a terminal) the first time one is needed; None for a plain
    file."""

    def __init__(self, paths: Any):
        self.paths = paths
        self._key: Any = None

    def __call__(self, file: Path) -> Any:
        from iris_desktop.core.store.cipher import is_encrypted
        from iris_desktop.storage_key import prepare

        if is_encrypted(file) is not True:
            return None
        if self._key is None:
            # the current database's own state: prepare() then converts nothing
            ask = _terminal_passphrase if sys.stdin.isatty() else None
            self._key = prepare(self.paths, is_encrypted(self.paths.db_path) is True,
                                ask=ask).key
        return self._key


def _list_set_aside(db: Path, files: list[Path], as_json: bool, key: _HistoryKey) -> None:
    import time

    from iris_desktop.core.store.recovery import inspect_set_aside

    found = [inspect_set_aside(f, key(f)) for f in files]
    current = inspect_set_aside(db, key(db)) if db.exists() and db.stat().st_size else None
    if as_json:
        print(dump_json({
            "database": str(db),
            "current_rows": current.rows if current else None,
            "set_aside": [{"name": a.path.name, "path": str(a.path), "set_aside_at": a.when,
                           "bytes": a.size, "rows": a.rows, "error": a.error} for a in found],
        }, indent=2))
        return
    if not found:
        say(f"no set-aside databases beside {db}")
        return

    def rows(counts: dict[str, Any]) -> str:
        return ", ".join(f"{'?' if n is None else f'{n:,}'} {table.replace('_', ' ')}"
                         for table, n in counts.items())

    say(f"set-aside databases beside {db}, newest first:")
    for aside in found:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(aside.when))
        held = f"cannot be opened ({aside.error})" if aside.error else rows(aside.rows)
        say(f"  {aside.path.name}  {when}  {aside.size / 1e6:,.1f} MB  {held}")
    say(f"the current database: {rows(current.rows) if current else 'empty'}")
    say("put one back with 'iris-desktop recover NAME' (the current database is set aside "
        "first, never deleted)")


def _confirm(question: str, args) -> bool:
    """--yes, or the user's yes on a terminal; without a terminal nobody can say yes."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise CliError("nothing was changed: add --yes (nobody to ask)")
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() in ("y", "yes"):
        return True
    say("iris-desktop: nothing was changed", file=sys.stderr)
    return False


def _restore(db: Path, args, key: _HistoryKey) -> int:
    from iris_desktop.core.store.recovery import restore, set_aside_files

    named = [f for f in set_aside_files(db) if f.name == args.file]
    file = named[0] if named else Path(args.file)
    if not file.is_file():
        raise CliError(f"no set-aside database {args.file} (see 'iris-desktop recover')")
    if not _confirm(f"Put back {file.name} in place of {db.name}? The current one is set aside "
                    "first, not deleted. Close Iris Desktop first.", args):
        return EXIT_OK
    moved = restore(db, file, key(file))
    undo = (f"; the database it replaced is set aside as {moved[-1].name} ('iris-desktop "
            f"recover {moved[-1].name}' puts it back)" if moved else "")
    say(f"put back {file.name} as {db}{undo}")
    return EXIT_OK


def _salvage_now(db: Path, args, key: _HistoryKey) -> int:
    from iris_desktop.core.store.recovery import acknowledge, salvage

    if not db.exists() or not db.stat().st_size:
        raise CliError(f"there is no database at {db} to salvage", EXIT_FAIL)
    if not _confirm(f"Copy what can be read of {db.name} into a new database? The current one "
                    "is set aside, not deleted. Close Iris Desktop first.", args):
        return EXIT_OK
    recovery = salvage(db, ["salvage asked for with 'iris-desktop recover --salvage'"], key(db))
    acknowledge(db, [recovery.set_aside])
    say(recovery.describe())
    return EXIT_OK


def gui(args, overrides) -> int:
    from iris_desktop.ui.app import run_gui

    return run_gui(args.data_dir, overrides)


COMMANDS = {
    "import": import_,
    "export": export,
    "threads": threads,
    "delete": delete,
    "switch": switch,
    "context": context,
    "chat": chat,
    "models": models,
    "compact": compact,
    "config": config,
    "recover": recover,
    "devices": devices,
    "gui": gui,
}
