"""What the window's controllers share, with a signal for each change: a controller
reads and sets the state here and listens for what the others change, so no controller
calls another (or reaches through the window).

State: a property, a setter and a signal; a setter emits only when the value changes.

* ``thread_id``: the open thread, None for a new chat (``threadChanged(object)``);
* ``model_state``: none | loading | ready | failed; ``loaded``: the
  :class:`~.model_thread.LoadedModel` in use, kept while another loads (it still
  answers), with ``model_info`` its facts; ``model_error``: why the last load failed
  (``modelStateChanged(str)``, emitted when any of the three changes);
* ``generating``: a turn or a compaction is under way (``generatingChanged(bool)``), in
  the chat ``answering`` (None: a new chat not made yet; set with it, no signal);
* ``planner``: the planner of the settings and the model (``plannerChanged(object)``);
* ``settings``: the settings in force, a model being tried included (the host's follow
  them); ``reload_settings()`` reads the config file again, ``follow_file()`` puts in force
  what changed in it since, ``rebase_settings()`` reads it again keeping what was chosen
  for this run only (``settingsChanged(object)``).

Events and requests, emitted on every call:

* ``threadOpened(object)``: a thread (None: a new chat) was opened, even the same again;
* ``threadCreated(int)``: the new chat became that thread (its first message, or its
  settings saved): what belonged to the new chat (its draft) goes with it;
* ``threadsChanged()``: the list of threads is stale (a title, a turn): refresh it;
* ``messagesSaved(int)``: new messages of that thread are in the store (a turn, an import);
* ``requestReported(object)``: a request the agent sent or will send next (None: plan one);
* ``statesChanged(dict)``: message id → state in the open thread's next request;
* ``statusText(str)``, ``busyChanged(object, object)``, ``statusMessage(str, int)``: the
  status bar's text, its bar (text and fraction done; None hides it) and a passing message;
  ``backgroundMessage(str, int)``: a background job's passing message, which waits while
  a turn runs; ``backgroundStarted(str)``: the first one of a job the user just started;
  ``backgroundWithdrawn(str)``: that message no longer holds (its job ended).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from iris_desktop.settings import Settings, SettingsError, read_config_file

if TYPE_CHECKING:
    from iris_desktop.core.planner import Planner
    from iris_desktop.ui.model_thread import LoadedModel


#: the status bar's word when no model could be loaded
NO_MODEL = "No model: browsing only"


def mixed(base: Settings, other: Settings, keys: Iterable[str],
          problems: list[str] | None = None) -> Settings:
    """``base`` with ``keys`` as ``other`` has them (value and source), and ``problems``
    (default: ``base``'s)."""
    keys = [k for k in keys if k in other.values]
    return Settings({**base.values, **{k: other.values[k] for k in keys}},
                    {**base.sources, **{k: other.sources[k] for k in keys}},
                    list(base.problems if problems is None else problems), base.config_path,
                    base.file_unreadable)


def kept(problem: str) -> str:
    """A problem of the settings file as a running window has it: a bad value keeps the
    value in force, not the default it falls back to at a start."""
    default = "; using the default"
    return (problem.removesuffix(default) + "; the value in force is kept"
            if problem.endswith(default) else problem)


def rolled_back(now: Settings, before: Settings, keys: Iterable[str]) -> Settings:
    """The settings in force ``now`` with the keys a model try set (``keys``) back as they
    were ``before`` it, where they are still the try's (source 'cli'; one the file changed
    since keeps the file's): every other setting changed meanwhile stays (before, a failed
    or cancelled try put back the whole snapshot, undoing a theme set in a terminal or
    Preferences saved during the load while the file kept them)."""
    return mixed(now, before, [k for k in keys if now.sources.get(k) == "cli"])


class AppState(QObject):
    """The state the window's controllers share; see the module's docstring."""

    threadChanged = Signal(object)
    modelStateChanged = Signal(str)
    generatingChanged = Signal(bool)
    plannerChanged = Signal(object)
    settingsChanged = Signal(object)
    threadOpened = Signal(object)
    threadCreated = Signal(int)
    threadsChanged = Signal()
    messagesSaved = Signal(int)
    requestReported = Signal(object)
    statesChanged = Signal(object)  # a dict with int keys, which a Qt map would refuse
    statusText = Signal(str)
    busyChanged = Signal(object, object)
    statusMessage = Signal(str, int)
    backgroundMessage = Signal(str, int)
    backgroundWithdrawn = Signal(str)
    backgroundStarted = Signal(str)
    #: said to a screen reader only (what the window shows elsewhere: a note in the chat)
    spoken = Signal(str)

    def __init__(self, settings: Settings, reload: Callable[[], Settings],
                 parent: QObject | None = None):
        super().__init__(parent)
        self._settings = settings
        self._reload = reload
        #: the settings as last read from the file (``follow_file`` puts in force what
        #: changed there since, not what was chosen for this run meanwhile)
        self._read = settings
        self._thread_id: int | None = None
        self._model_state = "none"
        self._loaded: LoadedModel | None = None
        self._model_error: str | None = None
        self._generating = False
        self.answering: int | None = None
        #: a model chosen in this run and loading: (its model.* values, the settings
        #: before); Preferences says its keys are being tried, not "set with --set"
        self.model_try: tuple[dict, Settings] | None = None
        self._planner: Planner | None = None

    # -- state --

    @property
    def thread_id(self) -> int | None:
        return self._thread_id

    def set_thread_id(self, thread_id: int | None) -> None:
        if thread_id != self._thread_id:
            self._thread_id = thread_id
            self.threadChanged.emit(thread_id)

    @property
    def model_state(self) -> str:
        return self._model_state

    @property
    def loaded(self) -> LoadedModel | None:
        return self._loaded

    @property
    def model_info(self) -> dict[str, Any] | None:
        return self._loaded.info if self._loaded is not None else None

    @property
    def model_error(self) -> str | None:
        return self._model_error

    def set_model(self, state: str, loaded: LoadedModel | None, error: str | None) -> None:
        if (state, error) != (self._model_state, self._model_error) or loaded is not self._loaded:
            self._model_state, self._loaded, self._model_error = state, loaded, error
            self.modelStateChanged.emit(state)

    @property
    def generating(self) -> bool:
        return self._generating

    def set_generating(self, generating: bool) -> None:
        if generating != self._generating:
            self._generating = generating
            self.generatingChanged.emit(generating)

    @property
    def planner(self) -> Planner | None:
        return self._planner

    def set_planner(self, planner: Planner) -> None:
        if planner is not self._planner:
            self._planner = planner
            self.plannerChanged.emit(planner)

    @property
    def settings(self) -> Settings:
        return self._settings

    def set_settings(self, settings: Settings) -> None:
        if settings != self._settings:
            self._settings = settings
            self.settingsChanged.emit(settings)

    def reload_settings(self) -> Settings:
        """Read the settings again (the config file; the command line's values still win)
        and put them in force. Raises what loading them raises, and SettingsError for a
        file that cannot be used at all (broken by hand since): the settings in force stay
        (before, every setting went back to its default without a word)."""
        fresh = self._fresh(self._settings.file_unreadable is None)
        self._read = fresh
        self.set_settings(fresh)
        return self._settings

    def _fresh(self, strict: bool = True) -> Settings:
        """The settings file read again; SettingsError when it cannot be read and
        ``strict`` (the settings in force are then kept)."""
        fresh = self._reload()
        if fresh.file_unreadable is not None and strict:
            raise SettingsError(f"{fresh.file_unreadable}; the settings in force are kept")
        return fresh

    def rebase_settings(self) -> Settings:
        """Read the settings file again as ``reload_settings`` does (Preferences opened or
        saved), but a key chosen for this run only that the file has not changed since it
        was read keeps the value in force: a model being tried, a choice a variable pins
        (before, opening Preferences during a try put the file's model.path in force, and
        the try was lost). Raises as ``reload_settings``."""
        before, now = self._read, self._settings
        fresh = self._fresh(now.file_unreadable is None)

        def of(settings: Settings, key: str) -> tuple[Any, Any]:
            return settings.values.get(key), settings.sources.get(key)

        ours = [k for k in now.values if of(now, k) != of(before, k) and of(fresh, k) == of(before, k)]
        self._read = fresh
        self.set_settings(mixed(fresh, now, ours))
        return self._settings

    @property
    def file_problems(self) -> list[str]:
        """The settings file's problems as it was last read."""
        return list(self._read.problems)

    def follow_file(self) -> tuple[list[str], list[str]]:
        """The settings file changed (:class:`~.config_watch.ConfigWatch`): the keys whose
        value there changed since it was last read go into force; the others keep the
        value in force (a model being tried keeps its own). A key the file now holds a bad
        value for keeps the value in force too (an editor saves as it is typed). Returns
        those keys and the problems not met before. Raises SettingsError for a file that
        cannot be used at all: every setting in force stays."""
        before, fresh = self._read, self._fresh()
        raw = read_config_file(fresh.config_path)[0] if fresh.config_path is not None else {}
        changed = [k for k, value in fresh.values.items()
                   if (value, fresh.sources[k]) != (before.values.get(k), before.sources.get(k))]
        bad = [k for k in changed if k in raw and fresh.sources[k] == "default"]  # kept
        keys = [k for k in changed if k not in bad]
        # a kept key is read as it was: once the line is fixed or removed, that is a change
        # (before, the default was taken as read and a removed line changed nothing)
        self._read = mixed(fresh, before, bad)
        if keys:
            self.set_settings(mixed(self._settings, fresh, keys, fresh.problems))
        return keys, [kept(p) for p in fresh.problems if p not in before.problems]

    # -- events and requests --

    def thread_opened(self, thread_id: int | None) -> None:
        self.threadOpened.emit(thread_id)

    def thread_created(self, thread_id: int) -> None:
        self.threadCreated.emit(thread_id)

    def threads_changed(self) -> None:
        self.threadsChanged.emit()

    def messages_saved(self, thread_id: int) -> None:
        self.messagesSaved.emit(thread_id)

    def report_request(self, request: Any) -> None:
        self.requestReported.emit(request)

    def show_states(self, states: dict[int, str]) -> None:
        self.statesChanged.emit(states)

    def show_status(self, text: str) -> None:
        self.statusText.emit(text)

    def busy(self, text: str | None, fraction: float | None = None) -> None:
        self.busyChanged.emit(text, fraction)

    def show_message(self, text: str, timeout_ms: int = 4000) -> None:
        self.statusMessage.emit(text, timeout_ms)

    def show_background(self, text: str, timeout_ms: int = 4000) -> None:
        self.backgroundMessage.emit(text, timeout_ms)

    def start_background(self, text: str) -> None:
        """The first words of a background job the user just started (an import): they
        replace a passing message shown before, not a turn's state (then they wait)."""
        self.backgroundStarted.emit(text)

    def withdraw_background(self, text: str) -> None:
        """A background message that no longer holds (its job ended): not shown later."""
        self.backgroundWithdrawn.emit(text)

    def speak(self, text: str) -> None:
        self.spoken.emit(text)
