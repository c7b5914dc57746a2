"""What every command shares: exit codes, the one-sentence error, printing stored text safely, opening the host."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iris_desktop.untrusted import json_escape_invisible, show_untrusted

if TYPE_CHECKING:
    from iris_desktop.runtime.protocol import Runtime

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_TOO_LARGE = 0, 1, 2, 3

#: text a ``threads`` listing counts at most; the rest shows as "messages not counted yet" until a
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
    from iris_desktop.core.store.recovery import announce, unacknowledged
    from iris_desktop.host import Host

    try:
        host = Host(args.data_dir, overrides,
                    ask_passphrase=_terminal_passphrase if sys.stdin.isatty() else None)
    except StoreError as exc:
        raise CliError(str(exc), EXIT_FAIL) from None
    with host:
        for problem in host.settings.problems:
            say(f"iris-desktop: warning: {problem}", file=sys.stderr)
        if host.storage_note:
            say(f"iris-desktop: {host.storage_note}", file=sys.stderr)
        if host.crash_note:  # once: this start marked the reply (or could not: a full disk)
            say(f"iris-desktop: {host.crash_message('cli')}", file=sys.stderr)
        db = host.paths.db_path
        if host.recovery is not None:  # named again by the next commands, until recover lists it
            say(f"iris-desktop: {host.recovery.describe()}", file=sys.stderr)
        told = {host.recovery.set_aside} if host.recovery is not None else set()
        pending = [p for p in unacknowledged(db) if p not in told]
        if pending:
            say(f"iris-desktop: warning: {announce(db, pending)}", file=sys.stderr)
        yield host
        _say_damaged(host)
        from iris_desktop.core.store.errors import unsaved_note

        unsaved = unsaved_note(host.store)  # (said once: a command that said it says nothing)
        if unsaved is not None:
            say(f"iris-desktop: {unsaved}", file=sys.stderr)


def _say_damaged(host) -> None:
    """Name the messages the command found damaged on disk (they were shown anyway)."""
    damaged = host.store.damaged
    for message_id, what in sorted(damaged.items())[:20]:
        say(f"iris-desktop: warning: message {message_id} is damaged on disk: {what}",
            file=sys.stderr)
    if len(damaged) > 20:
        say(f"iris-desktop: warning: {len(damaged) - 20:,} more messages are damaged on disk",
            file=sys.stderr)


def _terminal_passphrase(path: Path, new: bool, problem: str | None,
                         words: tuple[str, str] = ("Passphrase of the encrypted history at",
                                                   "storage.encrypt is on: choose a passphrase for")
                         ) -> str | None:
    """Ask for the history's passphrase on the terminal, unechoed (``new``: twice, to
    encrypt it with); None when the user gives none (Ctrl+D, an empty line). ``words``:
    the two questions' words before the path (the one it has, a new one)."""
    from getpass import getpass

    if problem:
        say(f"iris-desktop: {problem}", file=sys.stderr)
    try:
        if not new:
            return getpass(f"{words[0]} {path}: ") or None
        for _ in range(3):
            text = getpass(f"{words[1]} {path}: ")
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


def gone_sentence(thread_id: int) -> str:
    """Why a command stopped: its chat, there when it began, was deleted while it ran."""
    return (f"no thread {thread_id}: it was deleted by another Iris window or command "
            "meanwhile")


def _thread(host, thread_id: int) -> dict[str, Any]:
    try:
        return host.store.thread(thread_id)
    except KeyError:
        raise CliError(f"no thread {thread_id} (see 'iris-desktop threads')") from None


def say_where(runtime, purpose: str = "") -> None:
    """A server on another machine gets the conversation: say so on every run (the GUI
    asks once per server instead), with the warning for plain http. ``purpose``: why it
    goes there, when not for a reply ("to be counted")."""
    if runtime is None or getattr(runtime, "is_loopback", True) and not runtime.warning:
        return
    say(f"iris-desktop: this conversation is sent to {runtime.where}"
        + (f" {purpose}" if purpose else ""), file=sys.stderr)
    if runtime.warning:
        say(f"iris-desktop: warning: {runtime.warning}", file=sys.stderr)


class TerminalLine:
    """One line of stderr rewritten in place on a terminal (clipped to its width, shown
    safely), then ended (:meth:`end`) or erased (:meth:`clear`); nothing is written
    through it off a terminal (``tty``: callers say their lines there instead)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.line_open = False
        self.shown = ""  # the line on the terminal now

    def show(self, text: str) -> None:
        """``text`` on the line, rewritten in place."""
        import shutil

        width = shutil.get_terminal_size().columns - 1  # a longer line wraps: not rewritten
        text = show_untrusted(text)
        text = text if len(text) <= width else text[:max(width - 1, 1)] + "…"
        if self.line_open and text == self.shown:  # (a fraction a block: a percent is many)
            return
        sys.stderr.write("\r\x1b[K" + text)
        sys.stderr.flush()
        self.line_open, self.shown = True, text

    def end(self) -> None:
        """The line kept, the next output below it."""
        self._close("\n")

    def clear(self) -> None:
        """The line erased, the next output in its place."""
        self._close("\r\x1b[K")

    def _close(self, how: str) -> None:
        if self.line_open:
            sys.stderr.write(how)
            sys.stderr.flush()
            self.line_open = False


class LoadWords(TerminalLine):
    """What a model load is doing, on stderr, in the window's words (``host.LOAD_STAGES``):
    the bundled model's first set-up and the first 8-bit copy are said as they start (the
    set-up's percentage rewritten in place on a terminal); a connect that waits on a slow
    answer says which and for how long (in place on a terminal, once a request elsewhere:
    a log gets no line a second); and after the load, how long a set-up took beside the
    load. Pass :meth:`stage` and :meth:`progress` to the load, then call :meth:`done`."""

    #: the stages said (the others take a second or two)
    SAID = ("assembling", "copying")
    #: ... and those said with their percentage (the copy's ends at 80%: the load is the rest)
    COUNTED = ("assembling",)

    def __init__(self) -> None:
        super().__init__()
        self.words: str | None = None  # the stage whose percentage is said
        self.topic: str | None = None  # the request a connect's wait was said for

    @staticmethod
    def _cli(words: str) -> str:
        return f"iris-desktop: {words[:1].lower()}{words[1:]}"

    def stage(self, what: str) -> None:
        from iris_desktop.host import LOAD_STAGES, StageWords

        if isinstance(what, StageWords):  # a connect: said once it waits on an answer
            if what.topic and self.tty:
                self.show(self._cli(what))
            elif what.topic and what.topic != self.topic:
                say(self._cli(what), file=sys.stderr)
            self.topic = what.topic or self.topic
            return
        self.end()
        words = self._cli(LOAD_STAGES[what]) if what in self.SAID else None
        self.words = words if what in self.COUNTED else None
        if words is not None:
            if self.tty:
                self.show(words)
            else:
                say(words, file=sys.stderr)

    def progress(self, fraction: float) -> None:
        if self.tty and self.words is not None:
            self.show(f"{self.words} {int(fraction * 100)}%")

    def done(self, runtime: Runtime | None = None) -> None:
        """The load ended (``runtime``: what it loaded): an open line ends, and a set-up
        is said with its time and the load's."""
        from iris_desktop.host import load_time_words

        self.end()
        self.words = None
        setup = getattr(runtime, "setup_time_s", 0.0) if runtime is not None else 0.0
        if setup:  # the window's "Ready (…)" words
            say(f"iris-desktop: {load_time_words(runtime.load_time_s, setup)}", file=sys.stderr)


def _load(host) -> Runtime:
    from iris_desktop.host import ModelError

    words = LoadWords()
    runtime = None
    try:
        runtime = host.load_model(stage=words.stage, progress=words.progress)
    except ModelError as exc:
        raise CliError(f"cannot load the model: {exc}", EXIT_FAIL) from None
    except RuntimeError as exc:
        # a server that is unreachable or refuses the key (imported here: httpx loads
        # only when a server is in use)
        from iris_desktop.runtime.remote import ServerError

        if not isinstance(exc, ServerError):
            raise
        raise CliError(f"cannot use the server: {exc}", EXIT_FAIL) from None
    finally:
        words.done(runtime)
    return runtime


def try_load(host, **options: Any) -> Runtime | None:
    """``host.try_load_model`` with what it is doing said on stderr (:class:`LoadWords`)."""
    words = LoadWords()
    runtime = None
    try:
        runtime = host.try_load_model(stage=words.stage, progress=words.progress, **options)
    finally:
        words.done(runtime)
    return runtime


#: the longest a command embeds a chat's summarized messages before it goes on (a chat of
#: 20,000 took six minutes, 100,000 half an hour, before `chat` or `context` said a word):
#: the rest waits for the next command or the window, and recall finds them by their words
CLI_EMBED_S = 20.0


def _index_for_recall(host, thread_id: int) -> None:
    """Recall by meaning needs the summarized messages' vectors: embed what is missing,
    for :data:`CLI_EMBED_S` at most (the GUI does it in the background), said first
    whether or not stderr is a terminal, and what is left after (or that a full disk
    kept the vectors from being saved: recall goes on without them)."""
    from iris_desktop.core.store.errors import unsaved_note

    if host.load_embedder() is None:
        return
    pending = host.pending_for_recall(thread_id)
    if not pending:
        return
    tty = sys.stderr.isatty()
    say(f"iris-desktop: embedding thread {thread_id}'s {pending:,} summarized messages for "
        f"recall by meaning (once; at most {CLI_EMBED_S:.0f} s now, the rest later)…",
        file=sys.stderr)

    def progress(done: int) -> None:  # said as it goes, on a terminal
        if tty:
            sys.stderr.write(f"\r\x1b[Kiris-desktop: {done:,} of {pending:,} embedded…")
            sys.stderr.flush()

    done = host.index_for_recall(thread_id, progress=progress,
                                 until=time.monotonic() + CLI_EMBED_S)
    if tty and done:
        sys.stderr.write("\r\x1b[K")
    left = max(pending - done, 0)
    unsaved = unsaved_note(host.store)  # a full disk: recall goes on without new vectors
    if unsaved is not None:
        say(f"iris-desktop: {unsaved}; recall finds the {left:,} summarized messages without "
            "a vector by their words", file=sys.stderr)
        return
    say(f"iris-desktop: embedded {done:,} summarized messages of thread {thread_id} for recall "
        "by meaning" + (f"; {left:,} wait for the next command or the window (until then "
                        "recall finds them by their words)" if left else ""), file=sys.stderr)


def _maybe_load_model(host, args) -> None:
    """Load the model when the settings want its window or tokenizer (unless --no-model)."""
    s = host.settings
    wanted = s["context.token_counter"] in ("auto", "model") or s["context.window"] == "auto"
    if args.no_model or not wanted:
        return
    # settings the model refuses are the command's mistake (exit 2), as chat says them
    if try_load(host, settings_errors=True) is None:
        say(f"iris-desktop: warning: no model ({host.model_error}); counting without it",
            file=sys.stderr)
