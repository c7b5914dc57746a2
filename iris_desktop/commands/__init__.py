"""What each ``iris-desktop`` command does; ``cli`` parses the arguments and calls these.

Every command works through one :class:`~iris_desktop.host.Host`, as the desktop app
does: ``chat`` is a print loop over the events of ``Host.send``, ``compact`` over those
of ``Host.compact``. Every request shown or sent comes from the host's planner
(``core.planner``), so ``context --draft`` predicts what ``chat`` then sends.
Exit codes: 0 success; 1 a runtime failure (for example a model that will not load);
2 bad usage, invalid settings or a malformed file; 3 ConversationTooLargeException.
"""

from __future__ import annotations

from iris_desktop.commands.chat import chat, compact
from iris_desktop.commands.common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_TOO_LARGE,
    EXIT_USAGE,
    CliError,
    say,
    stdout_gone,
)
from iris_desktop.commands.config import config
from iris_desktop.commands.context import context
from iris_desktop.commands.conversations import delete, export, import_, switch, threads
from iris_desktop.commands.devices import devices
from iris_desktop.commands.models import models
from iris_desktop.commands.recover import recover

__all__ = ["COMMANDS", "EXIT_FAIL", "EXIT_OK", "EXIT_TOO_LARGE", "EXIT_USAGE", "CliError", "say",
           "stdout_gone"]


def gui(args, overrides) -> int:
    from iris_desktop.ui.app import run_gui

    return run_gui(args.data_dir, overrides)


COMMANDS = {
    "import": import_,
    "export": export,
    "threads": threads,
    "delete": delete,
    "switch": switch,
    "context": context,
    "chat": chat,
    "models": models,
    "compact": compact,
    "config": config,
    "recover": recover,
    "devices": devices,
    "gui": gui,
}
