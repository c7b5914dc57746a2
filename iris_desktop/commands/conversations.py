"""Conversations: import, export, delete, switch a branch, list threads."""

from __future__ import annotations

import datetime as dt
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

from iris_desktop.commands.common import (
    EXIT_FAIL,
    EXIT_OK,
    LISTING_COUNT_CHARS,
    CliError,
    TerminalLine,
    _maybe_load_model,
    _thread,
    dump_json,
    open_host,
    say,
    text_argument,
)
from iris_desktop.core.store import ThreadBusy, ThreadGone
from iris_desktop.core.store.errors import room_of
from iris_desktop.core.store.messages import held_back
from iris_desktop.untrusted import show_untrusted

#: the most messages ``switch`` prints (the branch from the alternative switched to on)
SWITCH_LINES = 40

# -- conversations -------------------------------------------------------------------------


def import_(args, overrides) -> int:
    """Every chat of the file (an OpenAI message list, an Iris export, a ChatGPT, Open WebUI
    or LM Studio export, a Jan thread or threads folder) as a thread, a few chats per short
    transaction (others write between them; a killed import is finished by running it
    again): the new threads' ids on stdout, one a line; for another app's file, what was imported
    and what was left out on stderr. An import that fails midway prints the ids of the
    chats it stored, and says how many (importing the file again adds only the rest)."""
    from iris_desktop.core.conversation import ConversationFormatError
    from iris_desktop.core.foreign import PartlyImported, import_conversations, load_conversations
    from iris_desktop.core.foreign_parts import count

    title = text_argument(args.title, "--title") if args.title else None
    line = _ProgressLine()
    try:
        loaded = load_conversations(args.file, progress=line.saying("reading"))
    except ConversationFormatError as exc:
        raise CliError(f"import refused, nothing was written: {exc}") from None
    finally:
        line.clear()  # before open_host: its passphrase prompt, warnings and errors
    with open_host(args, overrides) as host:
        try:
            imported = import_conversations(host.store, loaded, title, again=args.again,
                                            progress=line.saying("storing"))
        except PartlyImported as exc:  # the chats stored before it failed: their ids too
            line.clear()
            for thread_id in exc.imported.ids:
                print(thread_id)
            raise CliError(str(exc), EXIT_FAIL) from None
        finally:
            line.clear()
    for thread_id in imported.ids:
        print(thread_id)
    said = imported.report(loaded, "; --again imports them anyway")
    if not loaded.foreign and imported.ids and line.tty:  # (a bare "5" told a newcomer nothing)
        chats, ids = len(imported.ids), ", ".join(map(str, imported.ids))
        messages = sum(len(chat.messages) for chat in loaded.chats)
        said.insert(0, f"imported {count(chats, 'chat')} ({count(messages, 'message')}) as "
                       f"{'chat' if chats == 1 else 'chats'} {ids}")
    for words in said:
        say(f"iris-desktop: {words}", file=sys.stderr)
    return EXIT_OK


class _ProgressLine(TerminalLine):
    """How far a long import is, on a terminal's one line ("reading, 12,000 of 133,082
    chats…"; nothing in a pipe or a log), erased when it ends."""

    def saying(self, doing: str) -> Callable[[int, int], None]:
        def told(done: int, total: int) -> None:
            if self.tty:
                self.show(f"iris-desktop: {doing}, {done:,} of {total:,} chats…")
        return told


def export(args, overrides) -> int:
    from iris_desktop.core.conversation import export_messages, markdown_export

    with open_host(args, overrides) as host:
        _thread(host, args.thread)
        if args.format == "json":  # every branch
            text = dump_json(export_messages(host.store, args.thread), indent=2) + "\n"
        else:  # the active branch, to read
            text = markdown_export(host.store, args.thread)
    if args.output:
        _write_private(Path(args.output), text)
        what = "JSON, every branch" if args.format == "json" else "Markdown, the branch shown"
        say(f"iris-desktop: exported thread {args.thread} to {args.output} ({what})",
            file=sys.stderr)  # (it said nothing: the window says where it wrote)
    else:  # Markdown is exact in a file or a pipe, and shown safely on a terminal
        sys.stdout.write(show_untrusted(text, multiline=True) if sys.stdout.isatty() else text)
    return EXIT_OK


def _write_private(path: Path, text: str) -> None:
    """Write an export (``write_private``: what killed exports left beside it goes first),
    or say why not."""
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
        count = host.store.message_count(args.thread)  # every branch, as `threads` counts
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
        room = room_of(host.store.path)  # what a delete may need free (before it writes)
        try:
            wiped = host.delete_thread(args.thread)
        except sqlite3.Error as exc:
            late = _delete_failed(host, args.thread, exc, room)  # raises unless the chat is gone
        else:  # another program reading kept its old pages in the file (said, not hidden)
            late = None if wiped else f"the chat is deleted, but {held_back(host.store.path)}"
    say(f"deleted {what}")
    if late:
        say(f"iris-desktop: warning: {late}", file=sys.stderr)
    return EXIT_OK


def _delete_failed(host, thread_id: int, exc: sqlite3.Error, room: str) -> str:
    """A delete the full disk stopped, in one sentence with the room it needs. The delete
    is one transaction (the chat's rows go, their pages overwritten with zeros, and the
    full-text index of every chat rewritten without its words: ``Store.delete_thread``),
    all written to the -wal first, then copied into the file by a checkpoint, which may
    grow it: about the history's size (``room``, measured before) in free space, more
    where the full-text index is most of it. A refused transaction deleted nothing
    (CliError); a checkpoint refused after the commit leaves the chat deleted but its old
    pages readable in the file until a later checkpoint: returned, to warn. Any other
    error is raised as it was (the CLI explains it)."""
    from iris_desktop.core.store.errors import full_disk_error

    db = host.store.path
    if not full_disk_error(exc, db):
        raise exc
    why = f"the disk holding {db} is full"
    try:
        host.store.thread(thread_id)
    except KeyError:  # committed
        return (f"{why}: the deleted chat's old pages stay in {db.name} until they are "
                f"overwritten from the -wal beside it, which needs more free space; free some "
                f"(about {room}): the next command or start of Iris overwrites them")
    raise CliError(f"{why}: deleting a chat needs free space of about the history's size "
                   f"({room}) or more (its pages are overwritten and the full-text index of "
                   "every chat is rewritten without its words, in the -wal first); nothing "
                   f"was deleted; free some space, then run 'iris-desktop delete {thread_id}' again",
                   EXIT_FAIL) from None


def switch(args, overrides) -> int:
    """Make the next or previous alternative of a message active (``Host.switch_branch``)
    and print the active branch from that alternative on, one line a message, at most
    SWITCH_LINES (a long chat's whole branch flooded the terminal)."""
    with open_host(args, overrides) as host:
        _thread(host, args.thread)
        try:
            shown = host.switch_branch(args.thread, args.message,
                                       1 if args.direction == "next" else -1)
        except ThreadGone:  # deleted since it was read above: said as every command says it
            raise
        except KeyError:
            raise CliError(f"no message {args.message} in thread {args.thread}") from None
        except ValueError as exc:
            raise CliError(str(exc)) from None
        except ThreadBusy as exc:  # another window or command is answering there
            say(f"iris-desktop: {exc}", file=sys.stderr)
            return EXIT_FAIL
        points = host.store.branch_points(args.thread)
        rows = host.store.messages(args.thread)
        # from the alternative on (another process may have switched again meanwhile)
        rows = rows[next((i for i, row in enumerate(rows) if row["id"] == shown), 0):]
        for row in rows[:SWITCH_LINES]:
            place = points.get(row["id"])
            mark = f" ‹ {place[0]}/{place[1]} ›" if place else ""
            text = " ".join((row["content"] or "").split())
            say(f"{row['id']:>6} {row['role']:<9}{mark} {show_untrusted(text[:90])}")
        if len(rows) > SWITCH_LINES:
            say(f"… {len(rows) - SWITCH_LINES:,} more messages on this branch "
                f"('iris-desktop export {args.thread}' shows them all)")
    return EXIT_OK


def _listed_day(stamp: float) -> str:
    """When a chat was last written to, the time the list is ordered by (an imported
    chat's: its newest message's, as the app it came from dated it), as local
    'YYYY-MM-DD HH:MM'; "" for one that cannot be shown (year 0)."""
    try:
        return dt.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M")
    except (TypeError, ValueError, OverflowError, OSError):
        return ""


def threads(args, overrides) -> int:
    """Threads with cached token totals (every branch's messages; a chat with branches
    says how many are on the one shown). A listing counts at most LISTING_COUNT_CHARS of
    text not counted yet (newest first) and says how many messages remain uncounted.
    Totals are marked "≈" exactly when the window marks its numbers so
    (``Planner.counts_exactly``, the meter's rule: before, a chat was marked "≈" under the
    bundled model, whose Jinja template makes ``counter.exact`` False, while the meter
    called the same counts exact)."""
    from iris_desktop.core.engine import ensure_counts
    from iris_desktop.core.store.errors import unsaved_note

    with open_host(args, overrides) as host:
        host.hold_remote = True  # a listing sends no chat to another machine: estimated
        _maybe_load_model(host, args)
        planner = host.planner()
        counter, exact = planner.counter, planner.counts_exactly
        store = host.store
        ensure_counts(store, counter, store.uncounted(counter.name, LISTING_COUNT_CHARS))
        unsaved = unsaved_note(store)  # a full disk: the counts serve this listing only
        if unsaved is not None:
            say(f"iris-desktop: {unsaved}", file=sys.stderr)
        rows = []
        for thread in store.threads():
            tokens, uncounted = store.thread_token_total(thread["id"], counter.name)
            rows.append({**thread, "tokens": tokens, "uncounted_messages": uncounted,
                         "counter": counter.name, "exact": exact})
    if args.json:
        print(dump_json(rows, indent=2))
        return EXIT_OK
    if not rows:
        print("no threads yet")
    about = "" if exact else "≈"
    for row in rows:
        tokens = f"{about}{row['tokens']:,} tokens" + (
            f" (+{row['uncounted_messages']:,} messages not counted yet)"
            if row["uncounted_messages"] else "")
        branches = (f"  (branches: {row['branch_messages']:,} of them on the one shown)"
                    if row["branch_messages"] != row["messages"] else "")
        count = f"{row['messages']:>6} message{'' if row['messages'] == 1 else 's'}"
        print(f"{row['id']:>5}  {_listed_day(row['updated_at']):<16}  {count:<15}  {tokens:<46} "
              f"{show_untrusted(row['title'])}{branches}")
    return EXIT_OK
