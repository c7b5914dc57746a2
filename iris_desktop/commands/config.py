"""``config``: the settings, as the typed settings model defines them."""

from __future__ import annotations

import os
import sys

from iris_desktop.commands.common import (
    EXIT_OK,
    dump_json,
    say,
)
from iris_desktop.settings import SettingsError
from iris_desktop.untrusted import show_untrusted

# -- settings ------------------------------------------------------------------------------

#: the keys of a model's limits (``core.planner.limit_problems``): Preferences refuses a value
#: the model cannot hold at once, the load at the next start; 'config set' as Preferences does
LIMIT_KEYS = frozenset({"context.window", "model.n_ctx", "model.path"})


def config(args, overrides) -> int:
    from iris_desktop.paths import app_paths
    from iris_desktop.settings import (
        SETTINGS,
        data_dir_guesses,
        load_settings,
        lookup,
        reset_config,
        write_config_value,
    )
    from iris_desktop.storage_key import follow_history

    paths = app_paths(args.data_dir)
    config_path = paths.config_path
    if args.action in ("path", "set", "reset"):  # (list and get say every settings problem)
        for problem in data_dir_guesses(os.environ):  # which folder this is: said, not guessed
            say(f"iris-desktop: warning: {problem}", file=sys.stderr)
    if args.action == "path":
        print(config_path)
        return EXIT_OK
    if args.action == "set":
        if args.key == "model.path":
            _check_model_file(args.value)
        if args.key in LIMIT_KEYS:
            _check_limits(paths, args.key, args.value)
        value = write_config_value(config_path, args.key, args.value)
        print(f"{args.key} = {show_untrusted(lookup(args.key).to_text(value))}  ({config_path})")
        _warn_env([lookup(args.key).env_var], "this value")  # saved, but not what is in force here
        return EXIT_OK
    if args.action == "reset":
        if args.key:
            lookup(args.key)
        had_file = os.path.lexists(config_path)
        reset_config(config_path, args.key)
        # where it was removed from; no file was there to remove it from (it said "removed")
        where = f"removed from {config_path}" if had_file else f"there is no settings file; {config_path}"
        if args.key:
            setting = lookup(args.key)
            print(f"{setting.key} = {show_untrusted(setting.to_text(setting.default))}  "
                  f"(the default; {where})")
        else:
            print(f"every setting is at its default  ({where})")
        # the file holds the default now; a variable still wins over it (it was not said)
        _warn_env([lookup(args.key).env_var] if args.key else [s.env_var for s in SETTINGS.values()],
                  "the default")
        return EXIT_OK
    settings = load_settings(config_path, cli=overrides)
    for problem in settings.problems:
        say(f"iris-desktop: warning: {problem}", file=sys.stderr)
    follow_history(settings, app_paths(args.data_dir).db_path)  # unset, it follows the history
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


def _warn_env(names: list[str], what: str) -> None:
    """A warning for each of the variables ``names`` that is set here: it wins over the
    settings file, so ``what`` was written there but is not in force."""
    set_here = [name for name in names if name in os.environ]
    if set_here:
        verb = "is" if len(set_here) == 1 else "are"
        say(f"iris-desktop: warning: {', '.join(set_here)} {verb} set in this environment "
            f"and {'wins' if len(set_here) == 1 else 'win'} over the settings file; unset "
            f"{'it' if len(set_here) == 1 else 'them'} for {what} to apply", file=sys.stderr)


def _check_model_file(raw: str) -> None:
    """Raise SettingsError (nothing is saved) unless ``model.path = raw`` names the bundled
    model or a GGUF model file that is there: saved, a missing file (or a folder, a text
    file) failed the next start. Reads the file's header only, and opens nothing that is
    not a regular file (a named pipe would never answer)."""
    from pathlib import Path

    from iris_desktop.files import file_kind
    from iris_desktop.runtime.gguf import GGUFError, read_gguf_info
    from iris_desktop.settings import BUNDLED, lookup

    value = lookup("model.path").parse(raw)  # a relative path is refused first, in its words
    if value == BUNDLED:
        return
    path = Path(value).expanduser()
    fix = f"give a GGUF model file's full path, or '{BUNDLED}' for the model that came with Iris"
    try:
        kind = file_kind(os.stat(path).st_mode)
    except FileNotFoundError:
        raise SettingsError(f"model.path: there is no file {path}; {fix}") from None
    except OSError as exc:
        raise SettingsError(f"model.path: {path} cannot be read ({exc.strerror or exc}); {fix}") from None
    if kind:
        raise SettingsError(f"model.path: {path} is {kind}, not a GGUF model file; {fix}")
    try:
        read_gguf_info(path)
    except GGUFError as exc:
        raise SettingsError(f"model.path: {path}: {exc.reason}; {fix}") from None


def _check_limits(paths, key: str, raw: str) -> None:
    """Raise SettingsError (nothing is saved) when ``key = raw`` gives settings the model
    cannot hold, as the next load will see them (the environment's variables too), in the
    load's and Preferences' sentence (it was saved, and the next chat refused). A problem
    the settings had before is left to its own key. Reads the model's GGUF header only;
    where there is none to read (no file, a server), one line says it was not checked."""
    from iris_desktop.settings import load_settings, lookup

    before = load_settings(paths.config_path)
    if before.file_unreadable is not None:  # writing it says what is wrong with the file
        return
    after = before.with_overrides({key: raw})
    problems = _limit_problems(after, paths.models_dir)
    if isinstance(problems, str):
        say(f"iris-desktop: warning: {key} was not checked against the model's context: "
            f"{problems}; the model's load checks it", file=sys.stderr)
        return
    known = _limit_problems(before, paths.models_dir)
    new = [(other, text) for other, text in sorted(problems.items(), key=lambda i: i[0] != key)
           if isinstance(known, str) or text not in known.values()]
    if not new:
        return
    other, text = new[0]
    if other == key:
        raise SettingsError(text)
    # another key's value would be refused: name it, and the order that works (the load's
    # sentence advised raising the n_ctx being lowered, and named no variable)
    where = f" (set by {lookup(other).env_var})" if after.source(other) == "env" else ""
    fix = ("lower context.window first" if other == "context.window"
           else "lower model.n_ctx first (0: what the model was trained for)")
    raise SettingsError(f"{key} = {raw} was not saved: with it, {text.split(';')[0]}{where}; "
                        f"{fix}")


def _limit_problems(settings, models_dir) -> dict[str, str] | str:
    """``limit_problems`` of ``settings`` as loading their model would meet them (its
    trained context from the GGUF header, the n_ctx it would be loaded at), or why the
    model cannot be read. Never loads the model, nor assembles the bundled one: its header's
    values are recorded (``BUNDLED_MODEL``, checked against the file by the tests)."""
    from iris_desktop.core.planner import limit_problems, n_ctx_to_load
    from iris_desktop.host import model_path_for
    from iris_desktop.runtime.bundled import BUNDLED_MODEL
    from iris_desktop.runtime.gguf import GGUFError, read_gguf_info
    from iris_desktop.settings import BUNDLED

    if settings["model.backend"] != "local":
        return "model.backend is openai (the server's context is checked when Iris reaches it)"
    if settings["model.path"] == BUNDLED:
        trained = BUNDLED_MODEL.context_length
    else:
        try:
            trained = read_gguf_info(model_path_for(settings, models_dir)).context_length
        except GGUFError as exc:
            return str(exc)
    return limit_problems(settings, n_ctx_to_load(settings, trained) or None, trained)
