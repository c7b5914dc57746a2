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
        if lookup(args.key).env_var in os.environ:  # saved, but not what is in force here
            say(f"iris-desktop: warning: {lookup(args.key).env_var} is set in this environment "
                "and wins over the settings file; unset it for this value to apply", file=sys.stderr)
        return EXIT_OK
    if args.action == "reset":
        if args.key:
            lookup(args.key)
        reset_config(config_path, args.key)
        if args.key:
            setting = lookup(args.key)
            print(f"{setting.key} = {show_untrusted(setting.to_text(setting.default))}  "
                  f"(the default; removed from {config_path})")
        else:
            print(f"every setting is at its default  (removed from {config_path})")
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
