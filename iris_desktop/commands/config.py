"""``config``: the settings, as the typed settings model defines them."""

from __future__ import annotations

import os
import sys

from iris_desktop.commands.common import (
    EXIT_OK,
    dump_json,
    say,
)
from iris_desktop.untrusted import show_untrusted

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
    from iris_desktop.storage_key import follow_history

    config_path = app_paths(args.data_dir).config_path
    if args.action == "path":
        print(config_path)
        return EXIT_OK
    if args.action == "set":
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
