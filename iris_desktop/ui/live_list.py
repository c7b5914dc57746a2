"""The list of chats stays live, and so does the chat on screen (mixed into
:class:`~iris_desktop.ui.thread_control.ThreadControl`).

Every :data:`POLL_MS` the DB thread reads SQLite's data version, which changes when
another connection commits (the CLI, another window, this app's model thread); only then
are the threads read again, and the open chat reloaded, or given up when it was deleted,
when its row changed (a summary added counts).

Only the chat this window is answering in waits: its reply is being drawn. Before, any
turn held every change back, and for good: a chat deleted by a command while the window
answered in another stayed on screen, its draft silently never saved. A change held back
is looked at again once the turn ends."""

from __future__ import annotations

from typing import Any

#: how often the list asks whether another connection changed the database
POLL_MS = 2000


class LiveList:
    """Needs ``app_state``, ``panel``, ``composer``, ``background``, ``new_chat``,
    ``reload_transcript``, ``search`` and ``_shown`` (:mod:`.unmade_chat`) of the class it
    is mixed into; call :meth:`_start_live_list` from its constructor."""

    def _start_live_list(self) -> None:
        #: the data version last seen, and each thread's row as last listed
        self._version: int | None = None
        self._rows: dict[int, tuple] = {}
        #: threads whose new messages this window saved (and showed) itself
        self._saved_here: set[int] = set()
        self._held_back = False  # a change to the open chat waits for the turn's end
        self.app_state.generatingChanged.connect(self._turn_ended)

    def poll(self) -> None:
        """Ask the DB thread whether another connection committed since the last look;
        only then read the threads."""
        seen = self._version
        # a reply listed as being written: its writer may have died (a command killed),
        # which changes nothing another connection sees; it is marked cut off here, as
        # at a start (before, the window showed it "being written" for good)
        streaming = any(row[4] for row in self._rows.values())

        def job(store):
            marked = store.mark_interrupted_streams(running=True) if streaming else []
            version = store.data_version()
            return version, (store.threads() if version != seen or marked else None)

        self.background.run(job, self._polled, lambda _exc: None, key="data-version")

    def _polled(self, answer: tuple[int, list[dict[str, Any]] | None]) -> None:
        version, threads = answer
        self._version = version
        if threads is not None and list(_rows(threads).items()) != list(self._rows.items()):
            self._listed(threads)  # else a reply being streamed: the list is the same

    def _listed(self, threads: list[dict[str, Any]]) -> None:
        """Show ``threads``; reload the open chat when another process changed it."""
        before, self._rows = self._rows, _rows(threads)
        saved_here, self._saved_here = self._saved_here, set()
        self.panel.show_threads(self._shown(threads))  # (not a chat made for nothing)
        if self.panel.query() and before != self._rows:  # results of a list that changed
            self.search(self.panel.query())  # (a deleted chat's hits stayed, and opened blank)
        tid = self.app_state.thread_id
        # gone: not listed, or another chat under its id (made at another time: an id
        # an older Iris gave again); its draft must not go into that chat
        gone = tid is not None and tid in before and (
            tid not in self._rows or before[tid][-1] != self._rows[tid][-1])
        changed = (tid is not None and tid in self._rows  # (a chat opened before it was
                   and (tid not in before or before[tid][1:] != self._rows[tid][1:])  # listed)
                   and tid not in saved_here)
        if (gone or changed) and self._answering(tid):
            self._held_back = True  # seen again when the turn ends: as if not listed yet
            if tid in before:
                self._rows[tid] = before[tid]
            else:
                self._rows.pop(tid, None)
        elif gone:
            self._gone(tid, before[tid][0])
        elif changed:
            self.reload_transcript()
            # the meter, states, inspector: planned anew (and the status bar's sentence
            # about the request planned before goes: "165 older turns are not sent")
            self.app_state.report_request(None)
            if _summarized(before.get(tid), self._rows[tid]):  # it was not said anywhere
                self.app_state.show_background(
                    f"Another Iris process summarized the earlier turns of “{self._rows[tid][0] or 'Untitled'}”; "
                    "its summary is used from now on", 12_000)

    def _answering(self, thread_id: int) -> bool:
        """This window is answering (or compacting) in ``thread_id``, or in a chat it has
        not made yet (which may become that one)."""
        state = self.app_state
        return state.generating and state.answering in (thread_id, None)

    def _turn_ended(self, generating: bool) -> None:
        if not generating and self._held_back:
            self._held_back = False
            self.refresh_threads()

    def _gone(self, thread_id: int, title: str | None) -> None:
        """The open chat was deleted by another window or a command: a new chat takes its
        place, with whatever was typed for it, and the status bar says what happened."""
        typed, files = self.composer.text(), list(self.composer.attachments)
        self.new_chat()  # its own draft is read after this: the drafts keep it and these
        if typed.strip():  # (before, read too early, it was taken for empty and lost)
            self.composer.set_text(typed)
        self.composer.add_attachments(files)
        self.app_state.show_message(f"“{title or 'Untitled'}” was deleted in another Iris window "
                                    "or by a command; what you typed for it is kept here", 12_000)


def _summarized(before: tuple | None, now: tuple) -> bool:
    """A new summary in the chat (its newest summary's id grew): another process compacted
    it (what this window saved itself is not taken for a change)."""
    return before is not None and now[5] is not None and (before[5] is None or now[5] > before[5])


def _rows(threads: list[dict[str, Any]]) -> dict[int, tuple]:
    """What the list shows of each thread, and what its transcript shows besides (the head,
    replies being written): a change (by another process too) means show it again. Last,
    when it was made: which chat holds the id."""
    return {t["id"]: (t.get("title"), t.get("updated_at"), t.get("messages"), t.get("head_id"),
                      t.get("streaming"), t.get("summary_id"), t.get("created_at")) for t in threads}
