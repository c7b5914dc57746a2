"""Helpers shared by the benchmarks: the corpus, and long threads built from it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "corpus"

sys.path.insert(0, str(REPO / "tests"))  # the helpers the tests use, shared, not copied
from helpers import compact_while_due, complete  # noqa: E402

__all__ = ["REPO", "CORPUS", "compact_while_due", "complete", "corpus_messages",
           "synthetic_thread"]


def corpus_messages(kind: str) -> list[list[dict]]:
    """Each conversation's messages; kind is 'agent-transcripts' or 'long-chats'."""
    return [
        json.loads(p.read_text())["messages"] for p in sorted((CORPUS / kind).glob("*.json"))
    ]


def synthetic_thread(n_messages: int) -> list[dict]:
    """n messages made by replaying the corpus (chats and agent turns interleaved).

    Tool-call ids are renamed per replay so that every call/result pair stays unique.
    """
    sources = corpus_messages("long-chats") + corpus_messages("agent-transcripts")
    out: list[dict] = []
    replay = 0
    while len(out) < n_messages:
        for conv in sources:
            replay += 1
            for m in conv:
                if m["role"] == "system":
                    continue
                m = dict(m)
                if m.get("tool_calls"):
                    m["tool_calls"] = [
                        {**c, "id": f"r{replay}_{c['id']}"} for c in m["tool_calls"]
                    ]
                if m["role"] == "tool":
                    m["tool_call_id"] = f"r{replay}_{m['tool_call_id']}"
                out.append(m)
            if len(out) >= n_messages:
                break
    out = out[:n_messages]
    # never end on an assistant call whose result was cut off
    while out and out[-1].get("tool_calls"):
        out.pop()
    return out
