"""``models``: the model library, and the hub's search, files, download and token."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from iris_desktop.commands.chat import _cancel_on_interrupt
from iris_desktop.commands.common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    dump_json,
    open_host,
    say,
)
from iris_desktop.units import file_size, memory_size
from iris_desktop.untrusted import show_untrusted


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
                                  extra_paths=extra, n_ctx=host.settings["model.n_ctx"],
                                  q8_weights=host.settings["model.q8_weights"])
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
        memory = (f"~{memory_size(row['memory_estimate_bytes'])} at n_ctx {row['n_ctx']:,}"
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
        CHAT_PIPELINES,
        HubClient,
        HubError,
        discard_partial,
        download,
        download_record,
        not_for_chat,
        not_for_chat_words,
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
                    if r.pipeline_tag is not None and r.pipeline_tag not in CHAT_PIPELINES:
                        gated += f", not for chat: {r.pipeline_tag}"
                    say(f"{show_untrusted(r.id)}  ({r.downloads or 0:,} downloads{gated})")
                if not repos and not as_json:
                    say(f"iris-desktop: no GGUF repository on {client.address} matches that", file=sys.stderr)
                return EXIT_OK
            if args.action == "files":
                return _hub_files([f for f in client.files(args.repo, args.revision) if f.is_gguf], as_json)
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
        # a repository or file name, or an address, that cannot be one: the command's mistake
        raise CliError(str(exc), EXIT_USAGE if exc.kind == "address" else EXIT_FAIL) from None
    _download_line("", True)
    entry = describe_model(path, source="download", repo=args.repo, n_ctx=settings["model.n_ctx"],
                           q8_weights=settings["model.q8_weights"])
    if as_json:
        print(dump_json({"path": str(path), "repo": args.repo, "file": args.file,
                         "revision": args.revision, "model": entry.as_json()}, indent=2))
        return EXIT_OK
    say(str(path))
    not_chat = not_for_chat(path)
    if not_chat is not None:  # (an embedding model: the library leaves it out, chat refuses it)
        say(f"iris-desktop: downloaded, but {not_for_chat_words(not_chat)}", file=sys.stderr)
        return EXIT_OK
    checked = verified_words(download_record(paths.models_dir, args.repo, args.file))
    say(f"iris-desktop: downloaded and {checked}; use it with "
        f"'iris-desktop chat --model {path}' or 'iris-desktop config set model.path {path}'",
        file=sys.stderr)
    return EXIT_OK


def _hub_files(files: list, as_json: bool) -> int:
    """``models files REPO``: its GGUF files, each with its size; a name that cannot be
    kept as a file here (``../x.gguf``, a control character) is left out, as in the
    download dialog, and the end says how many and why (``download`` refuses them)."""
    from iris_desktop.runtime.hub import name_problem

    kept = [f for f in files if name_problem(f.path) is None]
    if as_json:
        print(dump_json([f.as_json() for f in kept], indent=2))
    for f in [] if as_json else kept:
        say(f"{show_untrusted(f.path)}  {file_size(f.size)}  {f.quantization or '?'}"
            f"{'' if f.sha256 else '  (no sha256 listed)'}")
    left_out = [problem for f in files if (problem := name_problem(f.path)) is not None]
    if left_out:
        say(f"iris-desktop: {len(left_out)} more GGUF file(s) not listed: their names cannot be kept "
            f"as files here ({show_untrusted(left_out[0].rstrip('.'))})", file=sys.stderr)
    return EXIT_OK


def _hub_token(hub_url: str, remove: bool) -> int:
    """``models token``: the hub's token into the OS keyring (as a server's API key); when
    HF_TOKEN (or HUGGING_FACE_HUB_TOKEN) would go to this hub too, which one is sent."""
    from getpass import getpass

    from keyring.errors import KeyringError

    from iris_desktop.runtime.hub import set_hub_token, token_variable

    token = ""
    if not remove:
        token = (getpass("Hub token (not shown): ") if sys.stdin.isatty() else sys.stdin.readline()).strip()
        if not token:
            raise CliError("no token given, so nothing was saved (--remove forgets a saved one)")
    try:
        set_hub_token(hub_url, token)
    except (KeyringError, ValueError) as exc:
        raise CliError(f"the keyring did not keep the token ({exc})", EXIT_FAIL) from None
    # (forgotten, or none was kept, or there is no keyring to keep one: either way, none now)
    variable = token_variable(hub_url)  # the environment's token, for huggingface.co only
    if remove:
        said = f"no token is kept for {hub_url} now" + (
            f"; the token in {variable} is sent to it instead" if variable else "")
    else:
        said = f"saved the token in the keyring for {hub_url}" + (
            f" (it is sent instead of the one in {variable})" if variable else "")
    say(f"iris-desktop: {said}", file=sys.stderr)
    return EXIT_OK


def _download_progress(progress) -> None:
    _download_line(progress.describe(), False)


def _download_line(text: str, finished: bool) -> None:
    """One line on a terminal's stderr, rewritten in place; ``finished`` ends it."""
    if not sys.stderr.isatty():
        return
    sys.stderr.write(f"\r\x1b[K{show_untrusted(text)}" + ("\r\x1b[K" if finished else ""))
    sys.stderr.flush()
