"""A chat made for a turn that stored nothing in it is not a chat (mixed into
:class:`~iris_desktop.ui.thread_control.ThreadControl`).

The host makes a new chat's thread when its first message is sent, before the message is
stored; a message refused then (too large for the model's window, or a failure before it
was stored) left that thread empty, listed as "New chat" for good. Now, while it holds
no message, the list does not show it: the window stays on it as on a chat not begun,
the notice saying why and the box holding what was typed (its draft), and a message
sent again goes there. Once the window leaves it still empty, it is deleted through the
model thread, as any delete (its KV state goes too), and what was typed for it becomes
the new chat's draft; so when the window closes on it (before, it was listed at the next
start)."""

from __future__ import annotations

from typing import Any

from iris_desktop.core.agent import DEFAULT_TITLE


def _unused(store: Any, thread_id: int) -> bool:
    """The thread is as the host made it: no message, no title or prompt given."""
    return (store.message_count(thread_id) == 0 and store.thread(thread_id)["title"] == DEFAULT_TITLE
            and store.system_prompt_of(thread_id) is None)


class UnmadeChat:
    """Needs ``app_state``, ``panel``, ``composer``, ``background``, ``model`` and
    ``refresh_threads`` of the class it is mixed into; call :meth:`_start_unmade` from its
    constructor, :meth:`_made_for_turn` when a turn made the open chat's thread, and list
    the threads through :meth:`_shown`."""

    def _start_unmade(self) -> None:
        #: the thread the running turn made for the new chat (None: none)
        self._made: int | None = None
        #: the thread made for a turn that stored nothing in it (None: none)
        self._unmade: int | None = None
        #: the thread :meth:`forget_at_close` found unused, deleted after the DB thread
        self._forgotten: list[int] = []
        self.app_state.generatingChanged.connect(self._turn_over)
        self.app_state.threadChanged.connect(self._left)

    def _made_for_turn(self, thread_id: int) -> None:
        self._made = thread_id

    def _shown(self, threads: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``threads`` without the one made for a turn that stored nothing in it."""
        return [t for t in threads if t["id"] != self._unmade or t.get("messages")]

    def _turn_over(self, generating: bool) -> None:
        made, self._made = self._made, None
        if generating or made is None:
            return

        def stored_nothing(empty: bool) -> None:
            if empty and self.app_state.thread_id == made:
                self._unmade = made
                self.refresh_threads()
            elif empty:  # left during the turn
                self._forget(made, "", [])

        self.background.run(lambda store: _unused(store, made), stored_nothing,
                            lambda _exc: None)

    def _left(self, thread_id: int | None) -> None:
        """The window left the chat made for nothing: deleted, what the box held for it
        the new chat's draft (this runs before the drafts take the box's text away)."""
        unmade = self._unmade
        if unmade is None or thread_id == unmade:
            return
        self._unmade = None
        self._forget(unmade, self.composer.text(),
                     [(a.name, a.text) for a in self.composer.attachments])

    def forget_at_close(self) -> None:
        """The window is closing on the chat made for nothing: what the box holds becomes
        the new chat's draft and the thread is deleted, as when the window leaves it. Call
        before the DB thread closes (it runs the queued jobs), then
        :meth:`delete_forgotten` after it, before the model thread closes."""
        if self._unmade is not None and self.app_state.thread_id == self._unmade:
            unmade, self._unmade = self._unmade, None
            self._forget(unmade, self.composer.text(),
                         [(a.name, a.text) for a in self.composer.attachments], closing=True)

    def delete_forgotten(self) -> None:
        """Queue the deletion of the thread :meth:`forget_at_close` found still unused."""
        for thread_id in self._forgotten:
            self.model.delete(thread_id)

    def _forget(self, thread_id: int, text: str, files: list[tuple[str, str]],
                closing: bool = False) -> None:
        """Delete the thread if it is still unused; its draft (``text`` and ``files``, or
        the one stored) goes to the new chat, unless that has one of its own: then the
        thread stays, with its draft. ``closing``: the DB thread's answer comes after the
        window's event loop, so the job itself notes the thread for
        :meth:`delete_forgotten`."""
        def job(store) -> bool:
            with store.transaction():
                if not _unused(store, thread_id):
                    return False
                carried = (text, files) if text.strip() or files else store.draft_with_files(thread_id)
                if carried[0].strip() or carried[1]:
                    kept = store.draft_with_files(None)
                    if kept[0].strip() or kept[1]:
                        return False
                    store.save_draft(None, *carried)
            if closing:
                self._forgotten.append(thread_id)
            return True

        self.background.run(job, lambda unused: unused and self.model.delete(thread_id),
                            lambda _exc: None)
