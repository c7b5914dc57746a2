"""The views of the next request: the budget meter, the message states in the transcript,
the context inspector and the settings dialog's live breakdown.

All of them draw one :class:`~iris_desktop.core.engine.ContextRequest` from the current
planner. The request the agent reported (``RequestSent``, ``TurnDone.next_request``) is
drawn as it is; only a change of draft, settings or model asks the planner for a new
one, on the DB thread, where the planner's cache answers repeated asks without a build.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QMessageBox

from iris_desktop.core.engine import ContextRequest, ConversationTooLargeException
from iris_desktop.core.planner import Planner, limit_problems, n_ctx_to_load
from iris_desktop.core.turn_delta import StatesBasis, states_since
from iris_desktop.core.views import budget_preview, inspector_report
from iris_desktop.host import model_problems
from iris_desktop.settings import Settings
from iris_desktop.ui.app_state import AppState
from iris_desktop.ui.background import Background
from iris_desktop.ui.boxes import plain_box
from iris_desktop.ui.composer import Composer
from iris_desktop.ui.inspector import InspectorDock
from iris_desktop.ui.meter import BudgetMeter
from iris_desktop.ui.model_thread import LoadedModel, ModelThread, PrefillJob
from iris_desktop.ui.window_words import PreferencesPreview, reload_problems, window_line
from iris_desktop.untrusted import show_untrusted

log = logging.getLogger("iris.ui.context")

#: the pause in typing after which the draft's request is prefilled
PREFILL_PAUSE_MS = 300
#: messages embedded per DB-thread job (a few tens of milliseconds)
INDEX_BATCH = 16
#: messages re-embedded per DB-thread job after a change of embedder (~0.3 s on one core)
REEMBED_BATCH = 32
#: what a view's DB-thread job gives when the planner's model was closed meanwhile
_CLOSED = object()


class ContextControl(QObject):
    """Owns the current planner (``app_state.planner``: remade when the settings or the
    model change) and keeps the meter, states and inspector in step."""

    def __init__(self, app_state: AppState, composer: Composer, meter: BudgetMeter,
                 inspector: InspectorDock, background: Background, model: ModelThread,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.app_state = app_state
        self.composer = composer
        self.meter = meter
        self.inspector = inspector
        self.background = background
        self.model = model
        self.parent_widget = parent  # a refused attachment's box opens over it
        self.attach_box: QMessageBox | None = None
        #: the host owns the runtime, the embedder and every planner; this holds facts only
        self.host = model.worker.host
        self._loaded: LoadedModel | None = None  # the model the planner was made for
        #: the planner a change of embedder re-embeds for, and how many it has re-embedded
        self._reembedding: tuple[Planner | None, int] = (None, 0)
        #: the states shown last, what they were computed from, for the planner used
        self._states_basis: tuple[Planner, StatesBasis | None] | None = None
        app_state.set_planner(self.host.planner(app_state.settings, fallback=True))
        # the draft's request is evaluated after a pause in typing, so a send starts at once
        self._prefill_timer = QTimer(self, singleShot=True, interval=PREFILL_PAUSE_MS)
        self._prefill_timer.timeout.connect(self._prefill_draft)
        app_state.settingsChanged.connect(lambda _settings: self.rebuild())
        app_state.modelStateChanged.connect(self._model_changed)
        app_state.threadOpened.connect(self._opened)
        app_state.requestReported.connect(self.show_request)
        app_state.messagesSaved.connect(lambda _thread_id: self.index_soon())
        composer.attachRequested.connect(self.attach)
        app_state.plannerChanged.connect(lambda _planner: self.count_attachments())

    @property
    def planner(self) -> Planner:
        return self.app_state.planner

    # -- the planner --------------------------------------------------------------------

    def _model_changed(self, _state: str) -> None:
        loaded = self.app_state.loaded
        if loaded is not self._loaded:  # (None: none is loaded, the last one may be closed)
            self._loaded = loaded
            self.rebuild()

    def rebuild(self) -> None:
        """The host's planner for the current settings and model; the views and the
        semantic index follow. A window the model cannot hold (set in the file or the
        environment) is said, and the model's own n_ctx used instead, rather than failing
        inside llama.cpp later."""
        planner = self.host.planner(self.app_state.settings, fallback=True)
        if planner.warning:
            self.app_state.show_message(planner.warning, 15000)
        self.app_state.set_planner(planner)
        self.refresh()
        self.index_soon()  # the indexing under way stops with the planner it was given
        self.reembed_soon()

    def _reloads(self, settings: Settings) -> tuple[bool, bool]:
        """(the model would be reloaded, with the same file)."""
        current = self.app_state.settings
        same_file = settings["model.path"] == current["model.path"]
        return not same_file or settings["model.n_ctx"] != current["model.n_ctx"], same_file

    def model_context(self, settings: Settings) -> tuple[int | None, str]:
        """(the tokens the model holds under candidate ``settings``, whence): the loaded
        model's n_ctx ("loaded", or "server"), or the n_ctx a candidate ``model.n_ctx``
        reloads it at, as the load computes it ("reload"; "load" with none loaded now);
        (None, "other") for another model file, (None, "") with no model loaded."""
        info = self.app_state.model_info or {}
        reload, same_file = self._reloads(settings)
        if not same_file:
            return None, "other"
        if reload:  # ("load": no model is loaded now)
            n_ctx = n_ctx_to_load(settings, info.get("context_length")) or None
            return n_ctx, "reload" if info.get("n_ctx") else "load"
        if not info.get("n_ctx"):
            return None, ""
        return info["n_ctx"], "server" if info.get("base_url") else "loaded"

    def limit_problems(self, settings: Settings) -> dict[str, str]:
        """Candidate settings the model cannot honour (the settings dialog marks them); a
        window above the n_ctx a candidate ``model.n_ctx`` reloads at is said as that."""
        info = self.app_state.model_info or {}
        n_ctx, source = self.model_context(settings)
        same_file = source != "other"
        problems = limit_problems(settings, n_ctx, info.get("context_length") if same_file else None)
        if source in ("reload", "load") and problems.pop("context.window", None):
            problems = {**reload_problems(settings, self.app_state.settings, n_ctx, source),
                        **problems}
        return {**problems, **model_problems(settings, self.app_state.settings)}

    def candidate(self, settings: Settings) -> Planner:
        """The planner candidate settings would make (the settings dialog's preview):
        with this model, unless they change what loading it would give."""
        return self.host.candidate_planner(settings, self.app_state.settings)

    # -- drawing ------------------------------------------------------------------------

    def refresh(self) -> None:
        """Plan the next request (with the draft) and draw every view from it."""
        self.refresh_meter()
        self.refresh_states()
        self.refresh_inspector()

    def show_request(self, request: ContextRequest | None) -> None:
        """Draw a request the agent reported; a draft being typed still gets its own."""
        if request is None or self.composer.model_draft():
            self.refresh()
            return
        self._show_breakdown(request)
        self.refresh_states(request)
        self.refresh_inspector(request)

    def _show_breakdown(self, result: ContextRequest | ConversationTooLargeException) -> None:
        meter, composer = self.meter, self.composer
        if isinstance(result, ConversationTooLargeException):  # said in the bar, not emptied
            meter.set_problem(f"Conversation too large: {result}")
            # Send waits only for a draft that is itself too large (the system prompt, tools
            # or summary filling the budget is no reason to shorten it: a send may refit them)
            composer.set_draft_tokens(None, (result.needed, result.allowed)
                                      if composer.model_draft() and result.about == "turn"
                                      else None)
            return
        meter.set_breakdown(result.breakdown, estimated=not (result.exact or self.planner.counter.exact),
                            dropped=result.dropped_turns, note=self.window_note())
        composer.set_draft_tokens(result.breakdown.draft)

    def window_note(self) -> str:
        """The model's n_ctx beside a smaller context.window, for the meter's tooltip (the
        status bar's "8,192-token window" stood beside a meter of 4,096); '' when equal."""
        n_ctx, source = self.model_context(self.app_state.settings)
        params = self.planner.params
        if not n_ctx or params.window >= n_ctx:
            return ""
        return window_line(params.window, self.app_state.settings["context.window"], n_ctx, source)

    def refresh_meter(self) -> None:
        tid, planner = self.app_state.thread_id, self.planner
        draft = self.composer.model_draft() or None
        self._run(planner, lambda store: planner.plan_or_error(store, -1 if tid is None else tid, draft),
                  self._show_breakdown, "meter")

    def refresh_states(self, request: ContextRequest | None = None) -> None:
        tid, planner = self.app_state.thread_id, self.planner
        if tid is None:
            return

        basis = self._states_basis if self._states_basis and self._states_basis[0] is planner else None

        def job(store):  # a turn's states read the turn's messages (and the request's)
            planned = request if request is not None else planner.plan_or_error(store, tid)
            if isinstance(planned, ConversationTooLargeException):
                return {}, None
            return states_since(planner.engine(store), planned, basis and basis[1])

        def show(result: tuple[dict[int, str], StatesBasis | None]) -> None:
            if tid == self.app_state.thread_id:
                self._states_basis = (planner, result[1])
                self.app_state.show_states(result[0])

        self._run(planner, job, show, "states")

    def refresh_inspector(self, request: ContextRequest | None = None) -> None:
        inspector = self.inspector
        if not inspector.isVisible():
            return
        tid, planner = self.app_state.thread_id, self.planner
        if tid is None:
            inspector.show_report(None)
            return
        if inspector.thread_id != tid:  # (the chat open before's report went on showing)
            inspector.show_counting()
        draft = self.composer.model_draft() or None  # the next request includes what is typed
        self._run(planner, lambda store: inspector_report(store, planner, tid, draft, request,
                                                          rerank_problem=self.host.reranker_problem,
                                                          embedder_problem=self.host.embedder_problem),
                  lambda r: tid == self.app_state.thread_id and inspector.show_report(r, tid), "inspector")

    def preview(self, candidate: Settings, callback) -> None:
        """For the settings dialog: the live breakdown of ``candidate`` (off the GUI thread)."""
        tid, planner = self.app_state.thread_id, self.candidate(candidate)
        draft = self.composer.model_draft() or None
        n_ctx, source = self.model_context(candidate)  # said beside the window it budgets
        self._run(planner, lambda store: PreferencesPreview.of(budget_preview(store, planner, tid, draft),
                                                               n_ctx, source), callback, "preview")

    # -- the semantic index --

    def _opened(self, _thread_id: int | None) -> None:
        """A chat opened: drawn, and its summarized messages embedded (only a turn or a
        new planner started that: a long chat imported and opened was searched by words
        only, and disagreed with ``context``, until a message was sent in it)."""
        self.refresh()
        self.index_soon()

    def index_soon(self, thread_id: int | None = None) -> None:
        """Embed the summarized messages of ``thread_id`` (default: the open thread) that
        have no vector yet, a batch at a time on the DB thread (``Host.index_for_recall``,
        the CLI's rule; a send never waits for it), until that thread is done; recall by
        meaning finds only embedded messages. Another chat opened meanwhile comes first
        (its batches replace the queued one)."""
        planner = self.planner
        thread_id = self.app_state.thread_id if thread_id is None else thread_id
        if planner.embedder is None or thread_id is None:
            return
        self.background.run(
            lambda store: self.host.index_for_recall(thread_id, planner, store=store,
                                                     limit=INDEX_BATCH),
            lambda done: (done >= INDEX_BATCH and planner is self.planner
                          and self.index_soon(thread_id)),
            self._counting_failed, key="index")

    def reembed_soon(self) -> None:
        """After a change of embedder (the history holds the previous model's vectors): give
        every chat's messages the new model's vectors, a batch at a time on the DB thread
        (``Host.reembed_for_recall``), the count in the status bar; recall searches the old
        vectors until a chat's new ones are complete, so nothing waits for this."""
        planner = self.planner
        if planner.embedder is None or planner.previous_embedder is None:
            return
        if self._reembedding[0] is not planner:  # a change begins: nothing re-embedded yet
            self._reembedding = (planner, 0)
        self.background.run(
            lambda store: self.host.reembed_for_recall(planner, store=store, limit=REEMBED_BATCH),
            lambda result: self._reembedded(planner, result),
            self._counting_failed, key="reembed")

    def _reembedded(self, planner: Planner, result: tuple[int, int, int]) -> None:
        done, current, waiting = result
        if self._reembedding[0] is planner:
            self._reembedding = (planner, self._reembedding[1] + done)
        total = self._reembedding[1] if self._reembedding[0] is planner else done
        name = planner.embedder.identity.split("@")[0] if planner.embedder else "the new model"
        if waiting:
            # the count first: a narrow status bar elides the end
            self.app_state.show_background(f"Re-embedding for recall: {current:,} of {current + waiting:,} "
                                           f"messages ({name})", 10000)
            if planner is self.planner:
                self.reembed_soon()
        elif current:  # a change back half-way re-embeds nothing: its vectors were all there
            self.app_state.show_background(
                f"Recall now uses {name}: {total:,} messages re-embedded" if total else
                f"Recall uses {name} again (its vectors were complete)", 10000)
            self.rebuild()  # the next planner searches the new vectors only

    # -- prefilling the draft --

    def draft_edited(self) -> None:
        """The draft changed: a prefill under way gives way now, a new one follows
        after a pause in typing."""
        self.model.worker.give_way.interrupt()
        self._prefill_timer.start()

    def _prefill_draft(self) -> None:
        state = self.app_state
        tid, planner, draft = state.thread_id, self.planner, self.composer.model_draft()
        if tid is None or not draft.strip() or state.generating or state.model_state != "ready":
            return

        def prefill(request) -> None:
            if (isinstance(request, ContextRequest) and tid == state.thread_id
                    and draft == self.composer.model_draft() and not state.generating):
                self.model.prefill(PrefillJob(tid, planner, request))

        self._run(planner, lambda store: planner.plan_or_error(store, tid, draft), prefill, "prefill")

    # -- attachments --

    def attach(self, paths: list[str]) -> None:
        """Read and check files to attach to the draft: text only, and not more than any
        budget of this window could hold (said as for a paste that large); each then shows
        as a chip with its tokens, counted by the planner's counter off the GUI thread."""
        from iris_desktop.core.attachments import AttachmentError, read_attachment
        from iris_desktop.core.engine import certainly_too_large

        composer, problems, read = self.composer, [], []
        for path in paths:
            try:
                read.append(read_attachment(path))
            except AttachmentError as exc:
                problems.append(str(exc))
        if read:
            from iris_desktop.core.attachments import model_text

            size = len(model_text(composer.text(), [*composer.attachments, *read]).encode("utf-8"))
            refusal = certainly_too_large(self.planner.params, size)
            if refusal:
                problems.append(f"{', '.join(a.name for a in read)}: {refusal}. Attach a shorter "
                                "file, or raise context.window and model.n_ctx")
                read = []
        composer.add_attachments(read)
        said = [f"{show_untrusted(a.name)} was {a.read_as}." for a in read if a.read_as]
        if said:  # (a Windows-1252 file: read as that, and said)
            self.app_state.show_message(" ".join(said), 10_000)
        if problems:
            box = plain_box(QMessageBox(QMessageBox.Icon.Warning, "Not attached",
                                        "\n\n".join(problems), parent=self.parent_widget))
            box.setObjectName("attach-refused")
            self.attach_box = box
            box.open()
        self.count_attachments()

    def count_attachments(self) -> None:
        """Each attached file's tokens as this planner counts it, for its chip."""
        planner, files = self.planner, list(self.composer.attachments)
        if not files:
            return
        self._run(planner, lambda _store: [planner.counter.count_text(a.block()) for a in files],
                  lambda counts: files == self.composer.attachments
                  and self.composer.set_attachment_tokens(counts), "attachments")

    def _run(self, planner: Planner, job: Callable[[Any], Any], show: Callable[[Any], Any], key: str) -> None:
        """``job`` on the DB thread, then ``show`` its result; nothing when ``planner``'s model
        was closed meanwhile (a load that needs its GPU memory closes it first: each view
        failed "the model is closed", with a traceback, for the whole load): the views keep
        their figures until the next model's planner draws them."""
        def quiet(store: Any) -> Any:
            try:
                return job(store)
            except RuntimeError:
                if getattr(planner.runtime, "closed", False):
                    return _CLOSED
                raise

        self.background.run(quiet, lambda result: result is _CLOSED or show(result), self._counting_failed,
                            key=key)

    @staticmethod
    def _counting_failed(exc: BaseException) -> None:
        # e.g. the model was closed by a reload while the DB thread counted with it: the
        # new planner's refresh follows
        log.info("a view could not be computed: %s", exc)
