"""A long chat's transcript read a page at a time: opening a 50,000-message chat read its
whole branch (every row made an Entry, ~1.4 s on the DB thread, and the window took in
all of them: GUI stalls of 350-450 ms). Now the window reads

* :func:`newest_page`: the branch's newest ``PAGE_MESSAGES`` messages (back to its newest
  user message at least: a turn's reload reads again from there), with the dividers,
  alternatives, Regenerate and Continue a whole read gives them;
* :func:`older_page`: the page just before a message it shows, when the user scrolls up
  to it (or a search hit, a branch switch, Home needs an older message).

Every page's entries are exactly those a whole read (``views.load_transcript``) gives the
same messages: the context engine never reads the window (it counts from the store), so
the meter, the states and the inspector are what they were.

:func:`transcript_page` is a turn's tail (``turn_delta.tail_since``) where the
transcript still holds, else the newest page. All of it runs on the DB thread, takes a
Store and returns plain data; no Qt here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iris_desktop.core import big_json
from iris_desktop.core.turn_delta import Loaded, anchor_of, tail_holds, tail_since
from iris_desktop.core.views import Entry, mark_entries, transcript_entries

#: messages a page holds (a chat opens on its newest page; scrolling up reads the next)
PAGE_MESSAGES = 500


@dataclass(frozen=True)
class Page:
    """A page's entries (oldest first) and how many of the branch's messages are older
    than it (not read)."""

    entries: list[Entry]
    older: int


def _page(store: Any, thread_id: int, below: int | None, size: int, newest: bool) -> Page:
    """The page of messages before message ``below`` (None: the newest) as entries."""
    page = store.branch_page(thread_id, below, size, store.newest_user_message(thread_id) if newest else None)
    rows = page.rows
    last = rows[-1]["id"] if rows else 0
    summaries = [s for s in store.summaries(thread_id)  # the dividers a whole read puts here
                 if s.covers_through_id >= page.previous and (newest or s.covers_through_id < last)]
    events = store.compaction_events(thread_id, branch=True) if summaries else ()
    entries = transcript_entries(rows, summaries, events)
    points = store.page_branch_points(thread_id, rows[0]["id"] - 1, last) if rows else {}
    mark_entries(store, thread_id, entries, points, newest)
    return Page(entries, page.older)


def newest_page(store: Any, thread_id: int, size: int = PAGE_MESSAGES) -> Page:
    """The branch's newest ``size`` messages, back to its newest user message at least."""
    return _page(store, thread_id, None, size, True)


def older_page(store: Any, thread_id: int, below: int, size: int = PAGE_MESSAGES) -> Page:
    """The ``size`` messages of the branch before message ``below`` (its ancestors)."""
    return _page(store, thread_id, below, size, False)


def pages_back_to(store: Any, thread_id: int, below: int, target: int | None,
                  size: int = PAGE_MESSAGES) -> Page:
    """The pages before message ``below`` back to the one that holds message ``target``
    (None: back to the branch's first), read in one job and given as one page: a search
    hit far back or Home in a 50,000-message chat read 99 pages one job at a time, each
    handed to the window (1.2-1.6 s, 3-4 stalls of 100-170 ms from the collector running
    while their entries were made). The collector is paused while they are made."""
    parts: list[list[Entry]] = []
    with big_json.paused():
        while True:
            page = older_page(store, thread_id, below, size)
            parts.append(page.entries)
            first = next((e.message_id for e in page.entries if e.message_id is not None), None)
            if (page.older <= 0 or first is None
                    or target is not None and any(e.message_id == target for e in page.entries)):
                break
            below = first
    return Page([entry for part in reversed(parts) for entry in part], page.older)


def transcript_page(store: Any, thread_id: int, loaded: Loaded | None,
                    size: int = PAGE_MESSAGES) -> tuple[list[Entry], Loaded, bool, int]:
    """(entries, what they show, whole, older): a turn's tail (``tail_since``) when
    ``loaded`` still holds (``whole`` False; ``older`` -1: as before), else
    the newest page (``whole``) and how many of the branch's messages are older than it."""
    summaries = store.summaries(thread_id)
    ids = tuple(s.id for s in summaries)
    if tail_holds(store, thread_id, loaded, summaries):
        entries = tail_since(store, thread_id, loaded)
        return entries, Loaded(thread_id, anchor_of(entries) or loaded.anchor, ids), False, -1
    page = newest_page(store, thread_id, size)
    return page.entries, Loaded(thread_id, anchor_of(page.entries), ids), True, page.older
