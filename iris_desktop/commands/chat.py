"""``chat``: a print loop over the events of ``Host.run``; and ``compact``."""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from iris_desktop.commands.common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_TOO_LARGE,
    CliError,
    _index_for_recall,
    _load,
    _thread,
    dump_json,
    open_host,
    say,
    say_where,
    stdout_gone,
    text_argument,
    try_load,
)
from iris_desktop.commands.context import refuse_if_certainly_too_large
from iris_desktop.core.events import (
    CacheStatus,
    CompactionFinished,
    CompactionStarted,
    PromptProgress,
    RecallSearch,
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
from iris_desktop.core.tools import ToolError
from iris_desktop.core.turns import Turn, TurnOptions
from iris_desktop.core.views import CONTENT_FILTERED, cut_off, only_thought, wrote_nothing
from iris_desktop.stop import StopEvent
from iris_desktop.untrusted import show_untrusted

log = logging.getLogger("iris.cli")

# -- the model -----------------------------------------------------------------------------

#: tool-call markup a model writes inline, anywhere in a reply (``core.toolcalls``' formats)
_CALL_MARKERS = ("<tool_call>", "[TOOL_CALLS]")
#: how a reply begins that may be a call as a whole: bare JSON, after <|python_tag|>, fenced
_CALL_START = re.compile(r"[{\[]|<\|python_tag\|>|```[A-Za-z]*[ \t]*\n?[ \t]*[{\[]")
_FENCE_START = re.compile(r"`{1,3}|```[A-Za-z]*[ \t]*\n?[ \t]*")


_SPACE = re.compile(r"\s*")
#: the longest marker: a marker that starts before what was printed is searched again
_LONGEST_MARKER = max(map(len, _CALL_MARKERS))


def printable(reply: str, shown: int = 0) -> int:
    """How much of a reply being written may go to a file or a pipe before it is saved:
    nothing while it may be a tool call as a whole (it begins as a call's JSON does), else
    the text before its first call markup (or before the start of one a token cut off)
    and before its trailing spaces (the saved text of a reply that calls a tool ends
    where its words end). ``shown``: how much of it is out already (those characters are
    not read again: a review measured 1.7 s for a 32,000-token reply read whole a token)."""
    if not shown:
        start = _SPACE.match(reply).end()
        if (start == len(reply) or _CALL_START.match(reply, start)
                or (len(reply) - start < len("<|python_tag|>")
                    and "<|python_tag|>".startswith(reply[start:]))
                or _FENCE_START.fullmatch(reply, start)):
            return 0
    since = max(0, shown - _LONGEST_MARKER)
    end = min((at for marker in _CALL_MARKERS if (at := reply.find(marker, since)) != -1),
              default=len(reply))
    for marker in _CALL_MARKERS:  # "…<tool_" at the end: the rest may follow
        cut = next((k for k in range(len(marker) - 1, 0, -1) if reply.endswith(marker[:k])), 0)
        end = min(end, len(reply) - cut)
    while end > shown and reply[end - 1].isspace():
        end -= 1
    return end


class _ChatPrinter(TurnListener):
    """How ``chat`` shows a turn: the replies on stdout (unless --json), the rest on stderr.

    On a terminal each reply streams as it comes; a reply that turns out to call a tool
    ends its line there, and the ``[tool …]`` line on stderr says what ran. Elsewhere (a
    file, a pipe) a reply streams up to where it may be a tool call (:func:`printable`),
    and the rest follows as saved: without the markup (before, the call's JSON went into
    the file glued onto the answer)."""

    def __init__(self, as_json: bool, max_tokens: int = 0):
        self.as_json = as_json
        self.max_tokens = max_tokens
        self.reply = ""
        self.stats: Any = None
        #: the model's window, for telling a full window from a server's own length limit
        self.n_ctx: int | None = None
        self.code = EXIT_OK
        self.gone = False  # the chat was deleted elsewhere
        self.thread_id: int | None = None
        self.restored = 0
        #: a progress line is on stderr without its newline (rewritten in place)
        self.line_open = False
        #: set when stdout's reader leaves: the reply stops as Stop stops it
        self.cancel: threading.Event | None = None
        self.stdout_closed = False
        #: why stdout refused the reply (a full disk, a quota, an I/O error); None: it did not
        self.stdout_error: str | None = None
        #: reply text was printed on stdout (a line to end before an error, and at the end)
        self.written = False
        #: the reply's last line has no line break yet (a progress line must not clear it)
        self.reply_open = False
        #: stdout is no terminal: what may be a tool call waits until the reply is saved
        self.hold = not as_json and not _is_terminal(sys.stdout)
        #: of the reply being written, what stdout has (held: the rest, as saved, follows)
        self.shown = ""
        #: a reply started and not saved yet (held: printed as it stands if the turn fails)
        self.unsaved = False
        #: the last saved reply's text (None: none was saved), for a turn that said nothing
        self.answer: str | None = None

    def _out(self, text: str) -> None:
        """Reply text on stdout. A reader that left (``| head``) stops the reply as Stop
        does: it is saved as far as it was generated, and nothing more is printed. A stdout
        that cannot be written (a full disk, a quota, an I/O error) stops the printing
        only: the reply goes on and is saved whole, and the command says so at its end
        (before, the OSError broke the turn off: the reply was lost, said as a bug)."""
        if self.stdout_closed:
            return
        try:
            shown = show_untrusted(text, multiline=True)
            sys.stdout.write(shown)
            sys.stdout.flush()
            self.written = self.written or bool(text)
            if shown:
                self.reply_open = not shown.endswith("\n")
        except BrokenPipeError:
            self.stdout_closed = True
            stdout_gone()
            if self.cancel is not None:
                self.cancel.set()
        except OSError as exc:  # what is buffered goes to the null device, not to exit's flush
            self.stdout_closed = True
            self.stdout_error = exc.strerror or type(exc).__name__
            stdout_gone()

    def unwritten(self) -> int:
        """Stdout refused the reply (:attr:`stdout_error`): said in one sentence, with the
        thread that keeps it; the exit code."""
        where = (f"; it is saved in thread {self.thread_id}"
                 if self.thread_id not in (None, -1) and not self.gone else "")
        say(f"iris-desktop: could not write the reply to standard output "
            f"({self.stdout_error}){where}", file=sys.stderr)
        return EXIT_FAIL

    def on_thread_created(self, event: ThreadCreated) -> None:
        self.thread_id = event.thread_id

    def on_cache(self, event: CacheStatus) -> None:
        if event.state == "restored":
            self.restored = event.done
        elif event.state == "warming":  # after a compaction, before the prompt returns
            self._progress_line(event.describe(), event.done >= event.total)

    def on_recall_search(self, event: RecallSearch) -> None:
        """The send waits for recall's search: said until the model reads the prompt."""
        self._progress_line(event.describe(), False)

    def on_reply_started(self, event: ReplyStarted) -> None:
        self.reply = event.text  # grows with the tokens: a reply that fails keeps what came
        self.unsaved, self.shown = True, ""
        self._end_line()
        if event.text and not self.as_json:  # a continued reply: what it already said
            self._show(printable(event.text) if self.hold else len(event.text))

    def on_progress(self, event: PromptProgress) -> None:
        """How far the model has read the prompt, on one line of a terminal's stderr."""
        self._progress_line(event.describe(), event.done >= event.total)

    def _progress_line(self, text: str, finished: bool) -> None:
        """One line on a terminal's stderr, rewritten in place until ``finished``."""
        if not sys.stderr.isatty():
            return
        # "\r\x1b[K" would clear the reply's last line on the same terminal (warming up
        # after a reply); a reply written to a file is left as it is
        if self.reply_open and not self.stdout_closed and sys.stdout.isatty():
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.reply_open = False
        width = shutil.get_terminal_size().columns - 1  # a longer line wraps and is not rewritten
        text = show_untrusted(text)
        text = text if len(text) <= width else text[:max(width - 1, 1)] + "…"
        end = "\n" if finished else ""
        sys.stderr.write(f"\r\x1b[K{text}{end}")
        sys.stderr.flush()
        self.line_open = not finished

    def _end_line(self) -> None:
        """A progress line no finished one followed (a server reports no prompt progress)
        is cleared before the reply is printed where it stood."""
        if self.line_open:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.line_open = False

    def on_token(self, event: ReplyToken) -> None:
        self.reply += event.text
        if not self.as_json:
            self._show(printable(self.reply, len(self.shown)) if self.hold else len(self.reply))

    def _show(self, end: int) -> None:
        """The reply's text up to ``end`` on stdout (what of it is not there yet); an
        earlier reply's line (a tool call's, with words before the call) ends first."""
        if end > len(self.shown):
            if not self.shown and self.reply_open:
                self._out("\n")
            self._out(self.reply[len(self.shown):end])
            self.shown = self.reply[:end]

    def on_reply(self, event: ReplySaved) -> None:
        self.reply, self.stats = event.text, event.stats
        self.answer, self.unsaved = event.text, False
        if self.as_json:
            return
        if self.hold:  # the rest as saved: a tool call's markup is no part of it
            shown = self.shown if event.text.startswith(self.shown) else self.shown.strip()
            if event.text.startswith(shown):
                self.shown = shown
                self._show(len(event.text))
        if event.tool_calls and self.reply_open:  # (a terminal shows the call's markup) the
            self._out("\n")  # line ends, and the [tool …] line below says what ran

    def release_unsaved(self) -> None:
        """A reply the turn never saved (it failed, or a second Ctrl+C broke the turn off)
        is printed as far as it came, as it was generated, markup and all."""
        if self.hold and self.unsaved:
            self.unsaved = False
            self._show(len(self.reply))

    def on_tool(self, event: ToolFinished) -> None:
        # an error says why (the reason was only in the history, for the model)
        reason = " ".join(event.text.removeprefix("error:").split())[:200]
        why = f": {show_untrusted(reason)}" if not event.ok and reason else ""
        self._end_line()  # (the reply's line ended when it was saved: no blank line first)
        say(f"[tool {show_untrusted(event.name)}: {'ok' if event.ok else 'error'}{why}]",
            file=sys.stderr)

    def on_compaction_started(self, event: CompactionStarted) -> None:
        """A log or a pipe gets one line when a compaction starts: on a long chat it takes
        minutes, and the progress line that says so is a terminal's only (before, a piped
        run was silent for minutes between loading the model and the compaction's line)."""
        if not _is_terminal(sys.stderr):
            say("iris-desktop: summarizing the earlier turns so that the chat fits the "
                "model's window (on a long chat this takes minutes)…", file=sys.stderr)

    def on_compaction_finished(self, event: CompactionFinished) -> None:
        self._end_line()  # a summary's progress line that did not reach 100% (it timed out)
        say(f"\n[{event.text}]", file=sys.stderr)

    def on_failed(self, event: TurnFailed) -> None:
        self.release_unsaved()  # what was generated before it failed
        say(f"{chr(10) if self.written else ''}iris-desktop: {event.text}", file=sys.stderr)
        self.code = EXIT_TOO_LARGE if event.kind == "too_large" else EXIT_FAIL
        self.gone = event.kind == "gone"  # no thread left to name

    def on_done(self, event: TurnDone) -> None:
        cut = cut_off(event.stats, self.max_tokens, self.n_ctx)
        thought = only_thought(event.stats)
        if thought and not cut:
            say(f"iris-desktop: {thought}", file=sys.stderr)
        elif empty := wrote_nothing(self.answer, event.finish_reason):
            say(f"iris-desktop: {empty}; 'iris-desktop chat --thread {event.thread_id} "
                "--regenerate' asks for another reply, or ask again in other words",
                file=sys.stderr)
        filtered = event.finish_reason == "content_filter"  # (a server's: said, not finished)
        if self.stdout_closed or (event.finish_reason != "cancelled" and not cut and not filtered):
            return
        if self.reply_open:  # the reply's line ends on stdout, where it is
            self._out("\n")
        print("[stopped]" if event.finish_reason == "cancelled" else
              f"[cut off: {CONTENT_FILTERED}]" if filtered else
              f"[cut off: {cut}; 'iris-desktop chat --thread {event.thread_id} --continue' "
              "goes on with it]", file=sys.stderr)


def _say_if_slow(stats: Any, facts: Any) -> None:
    """On a terminal, a reply of a few words or more that came under 2 tokens a second is
    followed by its rate and the likely cause, as the window's status bar says it."""
    from dataclasses import asdict

    from iris_desktop.runtime.speed import slow_words

    rate = getattr(stats, "tokens_per_s", None)
    if (getattr(stats, "completion_tokens", 0) or 0) >= 8 and (words := slow_words(rate, asdict(facts))):
        say(f"iris-desktop: this reply came at {rate:.1f} tokens a second ({words})", file=sys.stderr)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no stream, or a closed one
        return False


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
        def nobody(_command: str) -> bool:  # said as what it is, not as the user's refusal
            raise ToolError("nobody could be asked to approve it (standard input is not a "
                            "terminal), so it did not run; 'chat --yes-shell' runs commands "
                            "without asking")

        return nobody


    def ask(command: str) -> bool:
        # every control, bidi and invisible character as an escape: what is shown is what runs
        say(f"\nThe model wants to run:\n  {show_untrusted(command)}", file=sys.stderr)
        # the question on stderr too: with stdout sent to a file it went into the reply
        print("Run it? [y/N] ", end="", file=sys.stderr, flush=True)
        try:
            answer = input()
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
        said: list[str] = []  # (a Windows-1252 file: read as that, and said)
        try:
            text = read_text_file(Path(args.file), MAX_IMPORT_BYTES, message=True, said=said)
        except ConversationFormatError as exc:
            raise CliError(f"--file: {exc}") from None
        for clause in said:
            say(f"iris-desktop: --file: {show_untrusted(args.file)} was {clause}", file=sys.stderr)
        return text.rstrip("\n")
    if args.message != "-":
        if args.attach and " " not in args.message and Path(args.message).is_file():
            # `--attach a.md b.md`: the second file was read as the message
            raise CliError(f"the message {args.message!r} is a file: to attach several files, "
                           f"repeat --attach (--attach {args.attach[-1]} --attach "
                           f"{args.message} MESSAGE); nothing was sent or stored")
        return text_argument(args.message, "the message")
    data = sys.stdin.buffer.read()
    try:  # (the newline that ends the last line is no part of the message)
        return data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise CliError(f"standard input is not UTF-8 text (byte {exc.start})") from None


def _attachments(args) -> list:
    """The files ``--attach`` names, read as text; a file that is not text is refused
    before anything is sent."""
    from iris_desktop.core.attachments import AttachmentError, read_attachment

    try:
        files = [read_attachment(path) for path in args.attach]
    except AttachmentError as exc:
        raise CliError(f"--attach: {exc}; nothing was sent or stored") from None
    for file in files:  # (a Windows-1252 file: read as that, and said)
        if file.read_as:
            say(f"iris-desktop: --attach: {show_untrusted(file.name)} was {file.read_as}",
                file=sys.stderr)
    return files


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


def _nothing_to_continue(store, thread: int) -> str:
    """Why ``--continue`` has nothing to go on with on ``thread``, as its last message is."""
    rows = store.messages(thread)  # (the active branch: its last is the head)
    row = rows[-1] if rows else None
    again = f"'iris-desktop chat --thread {thread} --regenerate' writes it again"
    if row is None:
        return f"thread {thread} has no messages yet; there is nothing to continue"
    if row["role"] != "assistant":
        return (f"thread {thread} ends with a message, not a reply; there is nothing to continue "
                f"(send a message with 'iris-desktop chat --thread {thread} …')")
    if row.get("tool_calls"):
        return (f"thread {thread}'s last reply asked for tools, which a reply cannot go on from; "
                f"there is nothing to continue: {again}")
    if not row.get("content"):
        return f"thread {thread}'s last reply is empty; there is nothing to continue: {again}"
    return (f"thread {thread}'s last reply is complete (not stopped, failed or cut off); there is "
            "nothing to continue")


def _drop_empty(host, thread_id: int) -> bool:
    """Delete the chat ``thread_id`` made for this command's message when it holds no
    message (the message was refused, or the disk could not store it); True when it went.
    Never raises: on a disk that refuses even that, the empty chat stays."""
    try:
        return host.drop_empty_thread(thread_id)
    except Exception as exc:  # noqa: BLE001 - the turn's own failure was said
        log.warning("the empty chat %s made for the message stays: %s", thread_id, exc)
        return False


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
    if message is not None and not message.strip() and not files:
        raise CliError("the message is empty; nothing was sent or stored")
    if args.model:  # a file named on the command line is where the user stands
        path = args.model if args.model == "bundled" else os.path.abspath(os.path.expanduser(args.model))
        overrides = {**overrides, "model.path": path}
    with open_host(args, overrides) as host:
        if args.thread is not None:  # (before the model loads: a mistake is said at once)
            _thread(host, args.thread)
            holder = host.store.turn_holder(args.thread)
            if holder is not None:  # another window or command is answering there
                from iris_desktop.core.store.errors import busy_sentence

                say(f"iris-desktop: {busy_sentence(holder)}", file=sys.stderr)
                return EXIT_FAIL
            if args.edit is not None and not host.store.editable(args.thread, args.edit):
                raise CliError(f"message {args.edit} is not a message of yours on thread "
                               f"{args.thread}'s active branch; nothing was sent or stored")
            if args.continue_reply and host.store.stopped_reply(args.thread) is None:
                raise CliError(_nothing_to_continue(host.store, args.thread))
        runtime = _load(host)
        say_where(runtime)
        facts = runtime.describe()
        if facts.device_notice:  # a GPU found or asked for is not used (fully): the status bar's words
            say(f"iris-desktop: {facts.device}: {facts.device_notice}", file=sys.stderr)
        if message is not None:
            from iris_desktop.core.attachments import model_text

            refuse_if_certainly_too_large(host, utf8_length(model_text(message, files).strip()),
                                          "nothing was sent or stored", args.thread)
        if args.thread is not None:
            _index_for_recall(host, args.thread)
        printer = _ChatPrinter(args.json, host.settings["model.max_tokens"])
        printer.n_ctx = runtime.n_ctx
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
                printer.release_unsaved()
            made = printer.thread_id if args.thread is None else None
            if printer.code != EXIT_OK and made not in (None, -1) and _drop_empty(host, made):
                printer.thread_id = None  # refused or failed (a full disk) before it was
                # stored: no empty "New chat" is left behind for each try
        failed = getattr(runtime, "gpu_failed", None)
        if failed:  # off for this run (the next one checks the GPU again), or for good
            from iris_desktop.runtime.errors import AGAIN_NEXT_RUN

            tid = printer.thread_id
            again = f"'iris-desktop chat --thread {tid} --regenerate' asks for the reply again" \
                if tid not in (None, -1) else ""
            first = "the next run checks the GPU again first" if AGAIN_NEXT_RUN in failed else ""
            said = "; ".join(part for part in (first, again) if part)
            if said:
                say(f"iris-desktop: {said}", file=sys.stderr)
        if printer.stdout_closed:  # the reader left (``| head``): the reply is saved, stop quietly
            return printer.unwritten() if printer.stdout_error else printer.code  # (or: said)
        stats = printer.stats
        if not args.json and _is_terminal(sys.stderr):
            _say_if_slow(stats, facts)
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
            if printer.reply_open:
                print()
            if not printer.gone and printer.thread_id not in (None, -1):  # (none was made)
                print(f"[thread {printer.thread_id}]", file=sys.stderr)
                if args.thread is None and sys.stderr.isatty():  # a newcomer's next question
                    say(f"iris-desktop: a new chat; to go on in it: iris-desktop chat --thread "
                        f"{printer.thread_id} \"…\"", file=sys.stderr)
        return printer.code


def compact(args, overrides) -> int:
    with open_host(args, overrides) as host:
        _thread(host, args.thread)
        # --no-model: the extractive summarizer, counting without the model's tokenizer
        if not args.no_model and try_load(host) is None:
            say(f"iris-desktop: warning: no model ({host.model_error}); "
                "using the extractive summarizer", file=sys.stderr)
        elif not args.no_model:
            say_where(host.runtime)  # the server writes the summary: it reads the chat
        event = None
        # Ctrl+C stops the model's summary, as Stop does: the extractive one is used (it
        # went on for minutes, a traceback from llama.cpp's callback printed meanwhile)
        cancel = threading.Event()
        shown = _ChatPrinter(args.json)  # the summary's progress on a terminal, as chat shows it
        if not args.no_model:  # (a log or a pipe gets the line too: minutes pass silently)
            say("Summarizing the earlier turns"
                + (" (Ctrl+C: use the quick extractive summary now)…" if sys.stderr.isatty() else "…"),
                file=sys.stderr)
        with _cancel_on_interrupt(cancel):
            for reported in host.compact(args.thread, cancel, progress=shown.on_progress):
                if isinstance(reported, CompactionFinished):
                    event = reported.event
                elif isinstance(reported, TurnFailed):
                    shown._end_line()
                    raise CliError(reported.text, EXIT_FAIL)
        shown._end_line()
    if event is None:
        raise CliError("compaction did not run", EXIT_FAIL)
    if args.json:
        print(dump_json(event.as_dict(), indent=2, default=str))
    else:
        say(event.describe())
    return EXIT_OK if event.outcome in ("ok", "skipped") else EXIT_FAIL  # nothing to do: no failure
