"""The ``iris-desktop`` command line.

Exit codes: 0 success; 1 a runtime failure (for example a model that will not load);
2 bad usage, invalid settings or a malformed file; 3 ConversationTooLargeException.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from iris_desktop import __version__
from iris_desktop.settings import (
    SETTINGS,
    SettingsError,
    load_settings,
    lookup,
    parse_assignments,
    reset_config,
    write_config_value,
)

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_TOO_LARGE = 0, 1, 2, 3


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="iris-desktop",
        description="Iris Desktop: offline, private chat with a local LLM and an honest "
        "context engine. Without a command, the desktop app starts.",
    )
    parser.add_argument("--version", action="version", version=f"iris-desktop {__version__}")
    parser.add_argument("--data-dir", metavar="DIR", help="use DIR for the database, settings, "
                        "models and logs (overrides IRIS_HOME)")
    parser.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append",
                        default=[], help="override a setting for this run (repeatable)")
    parser.add_argument("--self-test", action="store_true",
                        help="load the bundled model, answer one prompt, build one context, exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    sub = parser.add_subparsers(dest="command", metavar="<command>")

    p = sub.add_parser("import", help="import a conversation (OpenAI chat format, JSON or JSONL)")
    p.add_argument("file")
    p.add_argument("--title")

    p = sub.add_parser("export", help="the full stored history of a thread, never pruned")
    p.add_argument("thread", type=int)
    p.add_argument("--format", choices=("json", "md"), default="json")
    p.add_argument("-o", "--output", help="write to a file instead of stdout")

    p = sub.add_parser("threads", help="list threads with message and token counts")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-model", action="store_true",
                   help="count without loading the model (approximate counter)")

    p = sub.add_parser("context", help="the request that would be sent next, without sending it")
    p.add_argument("thread", type=int)
    p.add_argument("--json", action="store_true")
    p.add_argument("--draft", help="include this new user message as the newest turn")
    p.add_argument("--no-model", action="store_true",
                   help="do not load the model (headless: config window, non-model counter)")
    p.add_argument("--show-request", action="store_true",
                   help="include the exact messages of the request in the output")

    p = sub.add_parser("config", help="show or change settings")
    csub = p.add_subparsers(dest="action", metavar="<action>", required=True)
    c = csub.add_parser("list", help="every key with its value and where it comes from")
    c.add_argument("--json", action="store_true")
    c = csub.add_parser("get", help="one key's value")
    c.add_argument("key")
    c = csub.add_parser("set", help="validate and save a value in the settings file")
    c.add_argument("key")
    c.add_argument("value")
    c = csub.add_parser("reset", help="remove one key (or all) from the settings file")
    c.add_argument("key", nargs="?")
    csub.add_parser("path", help="the settings file's path")

    _add_runtime_commands(sub)
    return parser


def _add_runtime_commands(sub: Any) -> None:
    p = sub.add_parser("chat", help="send a message and stream the reply")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--thread", type=int, help="continue this thread")
    group.add_argument("--new", action="store_true", help="start a new thread (the default)")
    p.add_argument("--model", help="GGUF file to use (same as --set model.path=PATH)")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.add_argument("--yes-shell", action="store_true",
                   help="approve every run_shell call without asking (tools.shell must be on)")
    p.add_argument("message")

    sub.add_parser("models", help="list known models")

    p = sub.add_parser("compact", help="compact a thread now and print the event")
    p.add_argument("thread", type=int)
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-model", action="store_true",
                   help="do not load the model: the extractive summarizer, heuristic counts")

    sub.add_parser("gui", help="start the desktop app (the default)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        overrides = parse_assignments(args.overrides)
        if args.self_test:
            from iris_desktop.selftest import run_self_test

            return run_self_test(args.data_dir, overrides)
        if args.command is None or args.command == "gui":
            return _gui(args, overrides)
        if args.command == "config":
            return _config(args, overrides)
        handler = COMMANDS[args.command]
        return handler(args, overrides)
    except SettingsError as exc:
        print(f"iris-desktop: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CliError as exc:
        print(f"iris-desktop: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


def _session(args: argparse.Namespace, overrides: dict[str, str]):
    from iris_desktop.core.session import Session
    from iris_desktop.core.store import StoreError

    try:
        session = Session(args.data_dir, overrides)
    except StoreError as exc:
        raise CliError(str(exc), EXIT_FAIL) from None
    for problem in session.settings.problems:
        print(f"iris-desktop: warning: {problem}", file=sys.stderr)
    return session


def _thread(session, thread_id: int) -> dict[str, Any]:
    try:
        return session.store.thread(thread_id)
    except KeyError:
        raise CliError(f"no thread {thread_id} (see 'iris-desktop threads')") from None


# -- commands -------------------------------------------------------------------------------


def _import(args, overrides) -> int:
    from iris_desktop.core.conversation import (
        ConversationFormatError,
        load_conversation,
        title_from,
    )

    try:
        messages, file_title = load_conversation(args.file)
    except ConversationFormatError as exc:
        raise CliError(f"import refused, nothing was written: {exc}") from None
    with _session(args, overrides) as session:
        store = session.store
        with store.transaction():
            thread_id = store.create_thread(args.title or file_title or title_from(messages))
            store.add_messages(thread_id, messages)
    print(thread_id)
    return EXIT_OK


def _export(args, overrides) -> int:
    from iris_desktop.core.conversation import to_markdown
    from iris_desktop.core.store import row_to_message

    with _session(args, overrides) as session:
        thread = _thread(session, args.thread)
        messages = [row_to_message(r) for r in session.store.messages(args.thread)]
    if args.format == "json":
        text = json.dumps(messages, ensure_ascii=False, indent=2) + "\n"
    else:
        text = to_markdown(thread["title"], messages)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _threads(args, overrides) -> int:
    from iris_desktop.core.engine import ensure_counts

    with _session(args, overrides) as session:
        _maybe_load_model(session, args)
        counter = session.counter()
        store = session.store
        rows = []
        for thread in store.threads():
            # count what is not cached yet (once), so the totals are complete
            ensure_counts(store, counter, store.meta_range(thread["id"], counter.name, None))
            tokens, uncounted = store.thread_token_total(thread["id"], counter.name)
            rows.append({**thread, "tokens": tokens, "uncounted_messages": uncounted,
                         "counter": counter.name})
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        print("no threads yet")
    for row in rows:
        tokens = f"{row['tokens']:,} tokens" + (
            f" (+{row['uncounted_messages']} not yet counted)" if row["uncounted_messages"] else ""
        )
        print(f"{row['id']:>5}  {row['messages']:>6} messages  {tokens:<28} {row['title']}")
    return EXIT_OK


def context_report(session, thread_id: int, draft: str | None = None,
                   show_request: bool = False) -> dict[str, Any]:
    """What ``context --json`` prints; raises ConversationTooLargeException."""
    engine = session.engine()
    request = engine.build(thread_id, tools_text=session.tools_text(), draft=draft)
    b = request.breakdown
    summary = request.summary
    report: dict[str, Any] = {
        "thread_id": thread_id,
        "window": b.window,
        "window_source": request.window_source,
        "token_budget_ratio": b.ratio,
        "compaction_threshold": session.settings["context.compaction_threshold"],
        "counter": request.counter,
        "counter_exact": engine.counter.exact,
        "chat_format": session.chat_format,
        "budget": b.budget,
        "system_tokens": b.system,
        "tool_tokens": b.tools,
        "summary_tokens": b.summary,
        "recall_tokens": b.recall,
        "history_tokens": b.history,
        "draft_tokens": b.draft,
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
        "summary_id": summary.id if summary else None,
        "summary_fields": summary.fields if summary else None,
        "recall": {"ids": request.recall.ids, "terms": request.recall.terms,
                   "reason": request.recall.reason,
                   "max_tokens": session.settings["context.recall_max_tokens"]},
        "compactions": session.store.compaction_events(thread_id),
        "messages": engine.describe(request),
    }
    if session.model_error:
        report["model_error"] = session.model_error
    if show_request:
        report["request"] = request.messages
    return report


def _context(args, overrides) -> int:
    from iris_desktop.core.engine import ConversationTooLargeException

    with _session(args, overrides) as session:
        _thread(session, args.thread)
        _maybe_load_model(session, args)
        try:
            report = context_report(session, args.thread, args.draft, args.show_request)
        except ConversationTooLargeException as exc:
            print(f"iris-desktop: conversation too large: {exc}", file=sys.stderr)
            return EXIT_TOO_LARGE
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return EXIT_OK
    _print_context(report)
    return EXIT_OK


def _maybe_load_model(session, args) -> None:
    """Load the model when the settings want its window or tokenizer (unless --no-model)."""
    s = session.settings
    wanted = s["context.token_counter"] in ("auto", "model") or s["context.window"] == "auto"
    if args.no_model or not wanted:
        return
    if session.try_load_model() is None:
        print(f"iris-desktop: warning: no model ({session.model_error}); counting without it",
              file=sys.stderr)


def _print_context(r: dict[str, Any]) -> None:
    states: dict[str, int] = {}
    for m in r["messages"]:
        states[m["state"]] = states.get(m["state"], 0) + 1
    print(f"window      {r['window']:>8,}  ({r['window_source']}; counter {r['counter']}"
          + (f"; format {r['chat_format']}" if r["chat_format"] else "") + ")")
    print(f"budget      {r['budget']:>8,}  (window × {r['token_budget_ratio']})")
    for label, key in (("system", "system_tokens"), ("tools", "tool_tokens"),
                       ("summary", "summary_tokens"), ("recall", "recall_tokens"),
                       ("history", "history_tokens"),
                       ("draft", "draft_tokens"), ("available", "available"), ("free", "free")):
        print(f"{label:<11} {r[key]:>8,}")
    print(f"prompt      {r['predicted_prompt_tokens']:>8,}  (predicted)")
    print(f"protect     {r['protect_turns']:>8}  turns" + ("  (fallback)" if r["fallback"] else ""))
    print("messages    " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())))
    recall = r.get("recall") or {}
    if recall.get("ids"):
        print(f"recall      {len(recall['ids'])} summarized messages shown with the newest message "
              f"(searched: {' '.join(recall['terms'][:10])})")
    elif recall.get("reason") and r["summary_id"] is not None:
        print(f"recall      none ({recall['reason']})")
    due = f"yes ({', '.join(r['triggers'])})" if r["compaction_due"] else "no"
    print(f"compaction  {due}")


def _config(args, overrides) -> int:
    from iris_desktop.paths import app_paths

    paths = app_paths(args.data_dir)
    config_path = paths.config_path
    if args.action == "path":
        print(config_path)
        return EXIT_OK
    if args.action == "set":
        value = write_config_value(config_path, args.key, args.value)
        print(f"{args.key} = {lookup(args.key).to_text(value)}  ({config_path})")
        return EXIT_OK
    if args.action == "reset":
        if args.key:
            lookup(args.key)
        reset_config(config_path, args.key)
        return EXIT_OK
    settings = load_settings(config_path, cli=overrides)
    for problem in settings.problems:
        print(f"iris-desktop: warning: {problem}", file=sys.stderr)
    if args.action == "get":
        setting = lookup(args.key)
        print(setting.to_text(settings[args.key]))
        return EXIT_OK
    rows = [
        {
            "key": key,
            "value": settings[key],
            "source": settings.source(key),
            "default": s.default,
            "allowed": s.describe_allowed(),
            "env": s.env_var,
            "help": s.help,
        }
        for key, s in SETTINGS.items()
    ]
    if getattr(args, "json", False):
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    for row in rows:
        value = lookup(row["key"]).to_text(row["value"])
        print(f"{row['key']:<30} {value:<24} [{row['source']}]")
    return EXIT_OK


def _gui(args, overrides) -> int:
    try:
        from iris_desktop.ui.app import run_gui
    except ImportError as exc:  # the GUI does not exist yet, or Qt cannot load
        print(f"iris-desktop: the desktop app is not available ({exc}); "
              "the command line works:\n", file=sys.stderr)
        build_parser().print_help()
        return EXIT_OK
    return run_gui(args.data_dir, overrides)


def _runtime_command(name: str):
    def handler(args, overrides) -> int:
        from iris_desktop import commands

        return getattr(commands, name)(args, overrides)

    return handler


COMMANDS = {
    "import": _import,
    "export": _export,
    "threads": _threads,
    "context": _context,
    "chat": _runtime_command("chat"),
    "models": _runtime_command("models"),
    "compact": _runtime_command("compact"),
}


if __name__ == "__main__":
    sys.exit(main())
