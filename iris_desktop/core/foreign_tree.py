"""Other apps' message trees as Iris branches (:mod:`iris_desktop.core.foreign` builds the
nodes from each format): the kept messages in order, parents first, with ``TREE_KEY``
where there is more than one branch; hidden nodes skipped, their children hung from the
nearest kept ancestor; loops of parents cut (:func:`unloop`); messages Iris cannot show as
alternatives merged or counted (:func:`untangle`)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple

from iris_desktop.core.conversation import TREE_KEY, ConversationFormatError
from iris_desktop.tokens import Message

SYSTEM = ("system",)  # the key of a chat's system prompt in a tree
#: text that merging messages may add in one chat (:func:`untangle`); past it, left out
MERGED_CHARS = 16 * 1024 * 1024


class Node(NamedTuple):
    """One message of a source's tree: its parent's key, the message (None: skipped), its
    children's keys in the source's order."""

    parent: Hashable | None
    message: Message | None  # None: skipped, its children hang from its nearest kept ancestor
    children: list[Hashable]  # the source's order of its children (may be empty)


class Tree(NamedTuple):
    """:func:`tree`'s messages, and what it left out or cut."""

    messages: list[Message]
    #: messages left out where Iris cannot show them (:func:`untangle`)
    left_out: int = 0
    #: loops of parents cut, and the messages only a loop reached (:func:`unloop`)
    loops: int = 0
    looped: int = 0


def tree(nodes: dict[Hashable, Node], active: Hashable | None,
         system: str | None = None) -> Tree:
    """The kept messages of a source tree in Iris's format: a plain list when they are one
    branch shown to its end, else every message with ``TREE_KEY`` (parents first,
    siblings in the source's order, ``active`` on the branch ending at ``active``'s
    nearest kept ancestor-or-self). ``system`` becomes a root above all. Also how many
    messages were left out where Iris cannot show them (:func:`untangle`), and the loops
    of parents cut (:func:`unloop`)."""
    nodes, loops, looped = unloop(nodes, active)
    if system:
        nodes = {SYSTEM: Node(None, {"role": "system", "content": system}, []), **{
            key: node._replace(parent=SYSTEM) if node.parent is None or node.parent not in nodes
            else node for key, node in nodes.items()}}
    rank = preorder(nodes)
    anchor = anchors(nodes)
    kept = sorted((k for k, n in nodes.items() if n.message is not None and k in rank),
                  key=rank.__getitem__)
    if len(kept) < sum(n.message is not None for n in nodes.values()):
        raise ConversationFormatError("its messages' parents form a loop")
    if not kept:
        return Tree([], 0, loops, looped)
    parent_of = {k: anchor.get(nodes[k].parent) for k in kept}
    own = next((k for k in kept if parent_of[k] == k), None)
    if own is not None:
        raise ConversationFormatError(f"its messages' parents form a loop (message {own!r} is its "
                                      "own parent)")
    head = anchor.get(active) if active in nodes else None
    if head is None:
        head = largest_end(kept, parent_of)
    message = {k: nodes[k].message for k in kept}
    kept, head, left_out = untangle(kept, parent_of, message, head)
    on_path: set[Hashable] = set()
    while head is not None and head not in on_path:
        on_path.add(head)
        head = parent_of.get(head)
    children: dict[Hashable, int] = {}
    for k in kept:
        children[parent_of[k]] = children.get(parent_of[k], 0) + 1
    if len(on_path) == len(kept) and all(count == 1 for count in children.values()):
        return Tree([dict(message[k]) for k in kept], left_out, loops, looped)
    number = {k: i for i, k in enumerate(kept, start=1)}
    return Tree([{**message[k], TREE_KEY: {
        "id": number[k], "parent_id": number.get(parent_of[k]), "active": k in on_path}}
        for k in kept], left_out, loops, looped)


def largest_end(kept: list[Hashable], parent_of: dict[Hashable, Hashable | None]) -> Hashable:
    """Where the source names no shown message, or one it does not hold: the last message
    (in the source's order) of its largest tree, the last such tree where several are as
    large. Before, the last message of all was taken, and a stray message whose parent is
    gone (Open WebUI's broken exports, whose ``currentId`` names a deleted message) became
    the chat shown, its conversation a hidden branch. (The chat's system prompt, a root
    above all, is no tree of its own: its children are.)"""
    root_of: dict[Hashable, Hashable] = {}
    size: dict[Hashable, int] = {}
    for key in kept:  # (parents first)
        parent = parent_of[key]
        root_of[key] = root_of.get(parent, key) if parent not in (None, SYSTEM) else key
        size[root_of[key]] = size.get(root_of[key], 0) + (key != SYSTEM)
    largest = max(reversed(list(size)), key=size.__getitem__)
    return next(key for key in reversed(kept) if root_of[key] == largest)


def unloop(nodes: dict[Hashable, Node], active: Hashable | None
           ) -> tuple[dict[Hashable, Node], int, int]:
    """``nodes`` with no loop of parents: a message that is its own parent becomes a root;
    the loop the shown branch (up from ``active``) runs into is cut where it closes (the
    last message up the branch before it repeats becomes a root, so the whole branch is
    kept, in order); where no message can be reached from a root at all, the last one of
    the source's loops is cut so. Nodes only a loop still reaches are left out. Also how
    many loops were cut and how many messages were left out. Before, any loop refused
    the chat, and with it the whole export."""
    fixed = {key: node._replace(parent=None) if node.parent == key else node
             for key, node in nodes.items()}
    loops = sum(node.parent == key for key, node in nodes.items())
    rank = preorder(fixed)
    if len(rank) == len(fixed):
        return fixed, loops, 0

    def cut(start: Hashable) -> None:  # the loop up from start, where it closes
        nonlocal rank, loops
        chain: list[Hashable] = []
        seen: set[Hashable] = set()
        key: Hashable | None = start
        while key in fixed and key not in seen:
            seen.add(key)
            chain.append(key)
            key = fixed[key].parent
        if key in seen:
            fixed[chain[-1]] = fixed[chain[-1]]._replace(parent=None)
            loops += 1
            rank = preorder(fixed)

    if active in fixed and active not in rank:
        cut(active)
    if not any(k in rank for k, node in fixed.items() if node.message is not None):
        last = next((k for k in reversed(fixed) if fixed[k].message is not None), None)
        if last is not None:
            cut(last)
    looped = sum(k not in rank and node.message is not None for k, node in fixed.items())
    return {k: node for k, node in fixed.items() if k in rank}, loops, looped


def untangle(kept: list[Hashable], parent_of: dict[Hashable, Hashable | None],
             message: dict[Hashable, Message], head: Hashable
             ) -> tuple[list[Hashable], Hashable, int]:
    """The tree with every message where Iris can show it. Iris's alternatives are
    messages of one role after the same message; a source may put a reply and a new
    message of the asker's after the same one (two branches: "P, reply" and "P, P's side
    again"). The second becomes an alternative of P holding both texts (P's side said
    them in a row: the model reads the same), with the rest of its branch under it.
    Where no such merge exists (first messages of different roles), the role group the
    active branch goes through is kept and the others are left out, counted (the third
    value), as are merges past :data:`MERGED_CHARS` more text (a hostile chain of them
    would copy each text into every one below it). One pass, parents first: a merged
    message joins its grandparent's children, all of its own role there. ``kept``
    (parents first), ``parent_of`` and ``message`` are updated; the new head is returned
    (the same, or its merged stand-in)."""
    kids_of: dict[Hashable | None, list[Hashable]] = {}
    for k in kept:
        kids_of.setdefault(parent_of[k], []).append(k)
    index = {k: i for i, k in enumerate(kept)}
    gone: set[Hashable] = set()
    room = MERGED_CHARS
    for i in range(-1, len(kept)):  # the roots' group first
        parent = None if i < 0 else kept[i]
        kids = [k for k in kids_of.get(parent, []) if k not in gone]
        if parent in gone or len({message[k]["role"] for k in kids}) < 2:
            continue
        role = message[parent]["role"] if parent is not None else None
        drop = []
        for child in (k for k in kids if message[k]["role"] == role):
            text = f"{message[parent]['content']}\n\n{message[child]['content']}"
            if len(text) > room:
                drop.append(child)
                continue
            room -= len(text)
            merged = ("merged", parent, child)
            message[merged] = {**message[parent], "content": text}
            parent_of[merged] = parent_of[parent]
            kept[index[child]] = merged  # after its parent's parent: parents stay first
            index[merged] = index.pop(child)
            kids_of[merged] = kids_of.pop(child, [])
            for k in kids_of[merged]:
                parent_of[k] = merged
            kids_of.setdefault(parent_of[parent], []).append(merged)
            head = merged if head == child else head
        rest = [k for k in kids if message[k]["role"] != role]
        if len({message[k]["role"] for k in rest}) > 1:  # no message to merge them into
            path, k = set(), head
            while k is not None:
                path.add(k)
                k = parent_of.get(k)
            keep = next((message[k]["role"] for k in rest if k in path), message[rest[0]]["role"])
            drop += [k for k in rest if message[k]["role"] != keep]
        while drop:  # a left-out message takes its branch with it
            k = drop.pop()
            if k not in gone:
                gone.add(k)
                drop.extend(kids_of.get(k, []))
    kept[:] = [k for k in kept if k not in gone]
    return kept, head if head not in gone else kept[-1], len(gone)


def preorder(nodes: dict[Hashable, Node]) -> dict[Hashable, int]:
    """Each node's place in a walk of the source tree, parents before children, siblings
    in the source's order; nodes on a loop are not reached."""
    listed: dict[Hashable, list[Hashable]] = {}
    roots: list[Hashable] = []
    for key, node in nodes.items():
        if node.parent is None or node.parent not in nodes or node.parent == key:
            roots.append(key)
        else:
            listed.setdefault(node.parent, []).append(key)
    for key, kids in listed.items():
        order = {child: i for i, child in enumerate(nodes[key].children)}
        kids.sort(key=lambda child: order.get(child, len(order)))
    rank: dict[Hashable, int] = {}
    stack = list(reversed(roots))
    while stack:
        key = stack.pop()
        if key in rank:
            continue
        rank[key] = len(rank)
        stack.extend(reversed(listed.get(key, [])))
    return rank


def anchors(nodes: dict[Hashable, Node]) -> dict[Hashable, Hashable | None]:
    """Each node's nearest kept ancestor-or-self (None: none above it)."""
    found: dict[Hashable, Hashable | None] = {}
    for start in nodes:
        chain: list[Hashable] = []
        seen: set[Hashable] = set()
        key: Hashable | None = start
        while True:
            if key is None or key not in nodes or key in seen:
                result = None
                break
            if key in found:
                result = found[key]
                break
            if nodes[key].message is not None:
                result = key
                break
            seen.add(key)
            chain.append(key)
            key = nodes[key].parent
        for key in chain:
            found[key] = result
        if start not in found:
            found[start] = result
    return found
