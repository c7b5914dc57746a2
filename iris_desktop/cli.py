"""The ``iris-desktop`` command line: the parser, and dispatch to ``commands``.

Exit codes: 0 success; 1 a runtime failure (for example a model that will not load, or
a folder or database Iris cannot write); 2 bad usage, invalid settings or a malformed
file; 3 ConversationTooLargeException. Every failure is one sentence on stderr that says
what to do, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import re
import sqlite3
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from iris_desktop import __version__
from iris_desktop.commands import COMMANDS, EXIT_FAIL, EXIT_OK, EXIT_USAGE, CliError, gone_sentence, say, stdout_gone
from iris_desktop.logfile import PrivateLogFile
from iris_desktop.paths import DataDirError, app_paths
from iris_desktop.runtime.errors import ServerError
from iris_desktop.settings import SettingsError, parse_assignments

#: SQLite's largest integer: a thread or message id above it cannot exist
MAX_ID = 2**63 - 1

#: the help of ``--json`` where a sub-command repeats its parent's flag
_JSON_HELP = "print JSON instead of text"


def record_id(text: str) -> int:
    """A thread or message id: a whole number from 1 to SQLite's largest integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
    if not 1 <= value <= MAX_ID:
        raise argparse.ArgumentTypeError(f"{text[:40]} is not an id (ids are 1 to {MAX_ID:,})")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as the CLI's one sentence (exit 2), not a usage block."""

    #: the arguments being parsed (for a hint at what went wrong)
    argv: Sequence[str] = ()

    def _print_message(self, message: str, file: Any = None) -> None:
        """argparse's, which drops a write error without a word (``--help > /dev/full``
        said nothing and exited 0): here a full disk is said, exit 1."""
        stream = file or sys.stderr
        try:
            stream.write(message)
            stream.flush()
        except BrokenPipeError:
            pass  # a reader that left (``--help | head``): nothing to say
        except OSError as exc:
            where = "standard output" if stream is sys.stdout else "standard error"
            print(f"iris-desktop: could not write to {where} ({exc.strerror or exc})",
                  file=sys.stderr)
            raise SystemExit(1) from None

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("iris-desktop").strip()
        where = f"{command}: " if command else ""
        self.exit(EXIT_USAGE, f"iris-desktop: {where}{message}{_hint(message, _Parser.argv)} "
                              f"(see '{self.prog} --help')\n")


#: commands people try for a check of the installation (it is --self-test)
_CHECK_WORDS = ("doctor", "check", "selftest", "self-test", "test")


def _hint(message: str, argv: Sequence[str]) -> str:
    """What an argparse error most likely means, for the mistakes people make: a
    ``--set KEY VALUE`` (its value read as the command), ``--set a=1 b=2`` (one --set for
    two), a global option after the command."""
    if "invalid choice" in message:
        for i, arg in enumerate(argv[:-1]):
            if arg == "--set" and "=" not in argv[i + 1]:
                value = argv[i + 2] if i + 2 < len(argv) else "VALUE"
                return f"; --set takes KEY=VALUE as one argument (--set {argv[i + 1]}={value})"
            if arg == "--set" and i + 2 < len(argv) and "=" in argv[i + 2]:  # --set a=1 b=2
                return f"; repeat --set for each setting (--set {argv[i + 1]} --set {argv[i + 2]})"
        # the word refused as the command, not any argument ("chta test" is no check)
        refused = re.match(r"argument <command>: invalid choice: '([^']*)'", message)
        if refused and refused.group(1).lower() in _CHECK_WORDS:
            return "; to check the installation: iris-desktop --self-test"
    if "unrecognized arguments" in message:
        late = [a for a in message.split(":", 1)[-1].split()
                if a in ("-v", "--verbose", "--set", "--data-dir") or a.startswith(("--set=", "--data-dir="))]
        if late:
            return f"; {late[0].split('=')[0]} goes before the command (iris-desktop {late[0]} … COMMAND)"
    return ""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="iris-desktop",
        description="Iris Desktop: offline, private chat with a local LLM and an honest "
        "context engine. Without a command, the desktop app starts.",
        epilog="Environment: IRIS_HOME is the data folder (database, settings, models, logs; "
        "--data-dir overrides it); IRIS_WEIGHTS_DIR is where the models' 8-bit weight copies "
        "go; every setting has a variable IRIS_<SECTION>_<KEY> (context.window: "
        "IRIS_CONTEXT_WINDOW), which wins over the settings file and loses to --set; "
        "'iris-desktop config list' shows every setting and where its value comes from.",
    )
    parser.add_argument("--version", action="version", version=f"iris-desktop {__version__}")
    parser.add_argument("--data-dir", metavar="DIR", help="use DIR for the database, settings, "
                        "models and logs (overrides IRIS_HOME)")
    parser.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append",
                        default=[], help="override a setting for this run (repeatable)")
    parser.add_argument("--self-test", action="store_true",
                        help="check the installation: load the bundled model, answer one "
                        "prompt, embed once with each embedder, rerank with recall's "
                        "cross-encoder, build one context, exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    _add_first_commands(sub)  # (listed in the order a newcomer meets them: chat first)

    p = sub.add_parser("context", help="the request that would be sent next, without sending it")
    p.add_argument("thread", type=record_id, nargs="?",
                   help="the thread's id (see 'iris-desktop threads'; default: the chat "
                   "written to last, named on stderr)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--draft", help="include this new user message as the newest turn")
    p.add_argument("--no-model", action="store_true",
                   help="do not load the model (headless: config window, non-model counter)")
    p.add_argument("--show-request", action="store_true",
                   help="include the exact messages of the request in the output")

    p = sub.add_parser("import", help="import conversations: OpenAI chat format (JSON or JSONL), an Iris "
                       "export, ChatGPT's or Claude's export (the .zip, its folder or conversations.json), an "
                       "Open WebUI export, an LM Studio .conversation.json, a Jan thread (or threads) folder, "
                       "a llama.cpp web UI export, a ShareGPT file, a SillyTavern chat, a LibreChat conversation "
                       "export, a text-generation-webui chat history, a BetterChatGPT export, Google Takeout's "
                       "Gemini activity (MyActivity.json); one thread per chat, their ids printed")
    p.add_argument("file", help="the file, a ChatGPT or Claude export's .zip or folder, or a Jan "
                   "thread folder")
    p.add_argument("--title", help="the new thread's title (with several chats: a prefix)")
    p.add_argument("--again", action="store_true",
                   help="import chats this history already holds (the same messages) again")

    p = sub.add_parser("export", help="the full stored history of a thread, never pruned (JSON: "
                       "every branch; Markdown: the active one)")
    p.add_argument("thread", type=record_id, help="the thread's id (see 'iris-desktop threads')")
    p.add_argument("--format", choices=("json", "md"), default="json",
                   help="json (every branch, importable again) or md (the active branch, to read)")
    p.add_argument("-o", "--output", help="write to a file instead of stdout")

    p = sub.add_parser("delete", help="delete a thread for good: its messages, summaries and "
                       "saved KV state, with no readable trace left in the database files")
    p.add_argument("thread", type=record_id, help="the thread's id (see 'iris-desktop threads')")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    p = sub.add_parser("switch", help="show another alternative of a message (a regenerated "
                       "reply, an edited message): its newest branch becomes the active one")
    p.add_argument("thread", type=record_id, help="the thread's id (see 'iris-desktop threads')")
    p.add_argument("message", type=record_id, metavar="MESSAGE_ID",
                   help="a message with alternatives (its id: 'iris-desktop export THREAD')")
    p.add_argument("direction", choices=("next", "previous"), help="which alternative to show")

    p = sub.add_parser("config", help="show or change settings")
    csub = p.add_subparsers(dest="action", metavar="<action>", required=True)
    c = csub.add_parser("list", help="every key with its value and where it comes from")
    c.add_argument("--json", action="store_true", help="print JSON instead of text")
    c = csub.add_parser("get", help="one key's value")
    c.add_argument("key", help="a setting, such as context.window ('config list' shows them all)")
    c = csub.add_parser("set", help="validate and save a value in the settings file")
    c.add_argument("key", help="a setting, such as context.window ('config list' shows them all)")
    c.add_argument("value", help="its new value, as the README's Settings table allows")
    c = csub.add_parser("reset", help="remove one key (or all) from the settings file")
    c.add_argument("key", nargs="?", help="the setting to reset (none: every one)")
    csub.add_parser("path", help="the settings file's path")

    _add_runtime_commands(sub)  # (models, compact, devices)

    p = sub.add_parser("recover", help="list the databases Iris set aside (damaged, or replaced "
                       "by a restore), put one back, or salvage the current one")
    p.add_argument("file", nargs="?", metavar="NAME",
                   help="a set-aside database to put back (its name, as listed); the current "
                   "one is set aside first, never deleted")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true", help="list as JSON")
    p.add_argument("--salvage", action="store_true",
                   help="copy every row that can be read of the current database into a new one "
                   "(for damage the start-up check does not see); the old one is set aside")

    p = sub.add_parser("rekey", help="encrypt the encrypted history again with a new key: a "
                       "passphrase (to open it on another computer) or a new key in the keyring")
    p.add_argument("--to", choices=("passphrase", "keyring"), default="passphrase",
                   help="the new key: a passphrase (IRIS_NEW_STORAGE_PASSPHRASE, else asked "
                   "twice; the default) or a new random key kept in this computer's keyring")

    sub.add_parser("gui", help="start the desktop app (the default)")
    return parser


def _add_first_commands(sub: Any) -> None:
    """``chat`` and ``threads``."""
    p = sub.add_parser("chat", help="send a message and stream the reply")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--thread", type=record_id, help="continue this thread")
    group.add_argument("--new", action="store_true", help="start a new thread (the default)")
    p.add_argument("--model", help="GGUF file to use (same as --set model.path=PATH)")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.add_argument("--yes-shell", action="store_true",
                   help="approve every run_shell call without asking (tools.shell must be on and "
                        "run_shell in tools.enabled)")
    p.add_argument("--file", metavar="PATH", help="read the message from a UTF-8 text file")
    p.add_argument("--attach", metavar="PATH", action="append", default=[],
                   help="attach a text file to the message (repeatable): the model reads it "
                   "after the message, and it is stored with it")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--regenerate", action="store_true",
                       help="answer the thread's last message again (a new alternative reply; "
                       "needs --thread)")
    again.add_argument("--edit", type=record_id, metavar="MESSAGE_ID",
                       help="send the message in place of this earlier message of yours: a new "
                       "branch from there, the old one kept (needs --thread)")
    again.add_argument("--continue", dest="continue_reply", action="store_true",
                       help="go on with the thread's stopped, failed or cut-off last reply (needs --thread)")
    p.add_argument("message", nargs="?", help="the message; '-' reads it from standard input")

    p = sub.add_parser("threads", help="list threads with message and token counts")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--no-model", action="store_true",
                   help="count without loading the model (approximate counter)")


def _add_runtime_commands(sub: Any) -> None:
    p = sub.add_parser("models", help="the model library: the bundled model, downloaded models, "
                       "other apps' GGUFs (LM Studio, Ollama, Hugging Face, GPT4All, Jan) and files "
                       "opened before; search and download contact the model hub (models.hub_url)")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    msub = p.add_subparsers(dest="action", metavar="[<action>]")
    m = msub.add_parser("search", help="search the model hub for repositories with GGUF files",
                        description="Search the model hub (models.hub_url) for repositories with "
                        "GGUF files whose name matches the words, most downloaded first. Then "
                        "'models files REPO' lists a repository's files and 'models download "
                        "REPO FILE' fetches one. Only the words are sent.")
    m.add_argument("text", nargs="+", metavar="WORDS",
                   help="words of the repository's name, such as: qwen2.5 coder instruct")
    m.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=_JSON_HELP)
    m = msub.add_parser("files", help="a repository's GGUF files with their sizes")
    m.add_argument("repo", help="owner/name, such as Qwen/Qwen2.5-3B-Instruct-GGUF")
    m.add_argument("--revision", default="main", help="branch, tag or commit (default main)")
    m.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=_JSON_HELP)
    m = msub.add_parser("download", help="download a GGUF into the models folder, resumable, "
                        "checked by sha256 and GGUF header before use")
    m.add_argument("repo", help="owner/name, such as Qwen/Qwen2.5-3B-Instruct-GGUF")
    m.add_argument("file", help="the file in the repository, such as qwen2.5-3b-instruct-q4_k_m.gguf")
    m.add_argument("--revision", default="main", help="branch, tag or commit (default main)")
    m.add_argument("--restart", action="store_true", help="remove a partial download and start over")
    m.add_argument("--remove-partial", action="store_true",
                   help="remove the partial download of FILE and exit (contacts nothing)")
    m.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=_JSON_HELP)
    m = msub.add_parser("token", help="save a hub token (for gated or private models) in the OS "
                        "keyring, read without echo or from standard input; contacts nothing (sent instead "
                        "of HF_TOKEN, which huggingface.co gets otherwise)")
    m.add_argument("--remove", action="store_true", help="forget the saved token")

    p = sub.add_parser("compact", help="compact a thread now and print the event")
    p.add_argument("thread", type=record_id, help="the thread's id (see 'iris-desktop threads')")
    p.add_argument("--json", action="store_true", help="print the event as JSON")
    p.add_argument("--no-model", action="store_true",
                   help="do not load the model: the extractive summarizer, heuristic counts")

    p = sub.add_parser("devices", help="the devices llama.cpp can run the model on (CPU, GPUs) "
                       "with their free memory, and where model.gpu puts the model at model.n_ctx "
                       "(loads nothing)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--check-again", nargs="?", const=True, metavar="DEVICE",
                   help="forget what Iris's first-use check recorded of DEVICE (its name or description, "
                   "as listed), or of every GPU, so the next load checks it against the CPU again")



log = logging.getLogger("iris.cli")


@contextmanager
def _logging(data_dir: str | None, verbose: bool) -> Iterator[None]:
    """For one run of ``main``: log records (and warnings, and a thread's uncaught
    exception) go to the log file, so Python never prints a traceback on stderr behind
    the one-sentence message; ``-v`` logs to stderr as well."""
    root = logging.getLogger()
    try:
        handler: logging.Handler = PrivateLogFile(app_paths(data_dir).log_path)
    except Exception:  # no log file: records are dropped, still never printed
        handler = logging.NullHandler()
    handlers: list[logging.Handler] = [handler]
    level = root.level
    if verbose:
        shown = logging.StreamHandler(sys.stderr)
        shown.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handlers.append(shown)
        root.setLevel(logging.INFO)
    for each in handlers:
        root.addHandler(each)
    previous_hook = threading.excepthook

    def thread_failed(hook: threading.ExceptHookArgs) -> None:
        if hook.exc_type is SystemExit:
            return
        log.error("thread %s failed", getattr(hook.thread, "name", "?"),
                  exc_info=(hook.exc_type, hook.exc_value, hook.exc_traceback))  # type: ignore[arg-type]

    threading.excepthook = thread_failed
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        threading.excepthook = previous_hook
        root.setLevel(level)
        for each in handlers:
            root.removeHandler(each)
            each.close()


class StdoutFailed(OSError):
    """Standard output could not be written (a full disk, a quota, an I/O error)."""


class _GuardedStdout:
    """sys.stdout, whose write errors (but a reader that left: BrokenPipeError) are
    :class:`StdoutFailed`: said as stdout's, not as a bug in Iris."""

    def __init__(self, stream: Any):
        self.stream = stream

    def _guard(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutFailed(exc.errno, exc.strerror or str(exc)) from exc

    def write(self, text: str) -> int:
        return self._guard(self.stream.write, text)

    def writelines(self, lines: Any) -> None:
        self._guard(self.stream.writelines, lines)

    def flush(self) -> None:
        self._guard(self.stream.flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextmanager
def _guarded_stdout() -> Iterator[None]:
    real = sys.stdout
    if real is not None:
        sys.stdout = _GuardedStdout(real)
    try:
        yield
    finally:
        if isinstance(sys.stdout, _GuardedStdout):
            sys.stdout = sys.stdout.stream


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    _Parser.argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    with _logging(args.data_dir, args.verbose), _guarded_stdout():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        overrides = parse_assignments(args.overrides)
        if args.self_test:
            from iris_desktop.selftest import run_self_test

            code = run_self_test(args.data_dir, overrides)
        else:
            code = COMMANDS[args.command or "gui"](args, overrides)
        sys.stdout.flush()  # a reader that left is met here, not in Python's flush at exit
        return code
    except SettingsError as exc:
        say(f"iris-desktop: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CliError as exc:
        say(f"iris-desktop: {exc}", file=sys.stderr)
        return exc.code
    except DataDirError as exc:
        say(f"iris-desktop: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except sqlite3.Error as exc:  # met after the database opened: locked, read-only, damaged
        from iris_desktop.core.store import explain

        say(f"iris-desktop: {explain(exc, app_paths(args.data_dir).db_path)}", file=sys.stderr)
        return EXIT_FAIL
    except KeyError as exc:  # ThreadGone: the chat was there when the command began
        from iris_desktop.core.store import ThreadGone

        if not isinstance(exc, ThreadGone):
            return _bug(args, exc)
        say(f"iris-desktop: {gone_sentence(exc.thread_id)}", file=sys.stderr)
        return EXIT_FAIL
    except ServerError as exc:  # a server the command reached failed it (its counts)
        say(f"iris-desktop: the server could not be used: {exc}", file=sys.stderr)
        log.warning("the server failed the command: %s", exc)
        return EXIT_FAIL
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader left (``| head``): nothing more to say to it
        stdout_gone()
        return EXIT_OK
    except StdoutFailed as exc:  # a full disk under ``> file``: what is buffered is dropped
        stdout_gone()  # (Python's flush at exit would fail again)
        say(f"iris-desktop: could not write to standard output ({exc.strerror})",
            file=sys.stderr)
        return EXIT_FAIL
    except Exception as exc:  # a bug: one sentence here, the traceback in the log
        return _bug(args, exc)


def _bug(args: argparse.Namespace, exc: BaseException) -> int:
    """A bug: one sentence on stderr, the traceback in the log."""
    log.error("unexpected error", exc_info=exc)
    try:  # (it must not raise: a data folder that cannot be resolved was a second traceback)
        where: object = app_paths(args.data_dir).log_path
    except Exception:  # noqa: BLE001
        where = "the log file"
    what = " ".join(str(exc).split())[:200]
    say(f"iris-desktop: unexpected error ({type(exc).__name__}: {what}); this is a bug in "
        f"Iris: the details are in {where} (run again with -v to see them here)",
        file=sys.stderr)
    return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
