"""Check bench/paraphrases.json: LoCoMo questions reworded to share no content word
with their evidence, so that lexical recall (FTS5/bm25 over the question's words) alone
cannot find the evidence and only semantic recall can.

Selection rule (deterministic, reproduced by ``select()`` below): for each of the ten
chats in ``shared/corpus/long-chats`` (sorted by file name), the *eligible* probes are
those of ``qa`` whose category is 1 (multi-hop), 2 (temporal) or 4 (single-hop) and
whose evidence is non-empty with every id present in ``dia_index`` (a handful of LoCoMo
probes carry malformed ids such as ``'D8:6; D9:17'``; they are skipped). Of the ``n``
eligible probes, in ``qa`` order, the ones at positions ``(i * n) // 20`` for
``i = 0..19`` are taken: 20 evenly spaced probes per chat, 200 in all.

For every entry the checker verifies:
- ``index`` points at a ``qa`` probe of that chat whose question is ``question``, whose
  category is ``category``, and which the selection rule picks (and every picked probe
  has exactly one entry);
- no shared content word: the words of the paraphrase and of each evidence message
  (``[A-Za-z0-9]+``, lowercased, three characters or more, not in
  ``extractive.STOPWORDS``, ``recall.QUESTION_WORDS`` or the chat's speaker names),
  crudely stemmed with ``recall._stem`` on both sides, must not intersect;
- no lexical reach: none of ``recall.query_terms(paraphrase, speakers)`` matches a word of
  an evidence message the way the FTS5 query does (``recall.fts_query``: a term of four
  letters or more matches as a prefix, a shorter one exactly; ``unicode61`` tokens);
- the paraphrase is not the question, still names a speaker the question names, and does
  not contain the answer's text.

It prints the count per chat and category and every violation, and exits 1 if there is
any.

    .venv/bin/python bench/make_paraphrases_check.py [--dump]

``--dump`` prints the selected probes with their evidence (to write paraphrases from).
``--neighbours`` also lists (without failing) paraphrases whose FTS terms match one of the
two messages before an evidence message: recall shows ``recall.FOLLOWING`` (2) messages
after each hit, so such a hit can bring the evidence into view lexically after all.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from iris_desktop.core.extractive import STOPWORDS  # noqa: E402
from iris_desktop.core.recall import FOLLOWING, QUESTION_WORDS, _stem, query_terms  # noqa: E402

CORPUS = REPO.parent / "shared" / "corpus" / "long-chats"
PARAPHRASES = Path(__file__).resolve().parent / "paraphrases.json"
CATEGORIES = (1, 2, 4)
PER_CHAT = 20
TOKEN_RE = re.compile(r"[A-Za-z0-9]+")


def load_chats() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(CORPUS.glob("locomo-*.json"))}


def speaker_names(chat: dict) -> list[str]:
    return list(chat["speakers"].values())


def eligible(chat: dict) -> list[int]:
    return [i for i, q in enumerate(chat["qa"])
            if q["category"] in CATEGORIES and q.get("evidence")
            and all(e in chat["dia_index"] for e in q["evidence"])]


def select(chat: dict) -> list[int]:
    pool = eligible(chat)
    n = len(pool)
    return [pool[(i * n) // PER_CHAT] for i in range(min(PER_CHAT, n))]


def evidence_texts(chat: dict, probe: dict) -> list[str]:
    return [chat["messages"][chat["dia_index"][e]]["content"] for e in probe["evidence"]]


def content_words(text: str, names: list[str]) -> set[str]:
    """Lowercased words of 3+ characters, minus stopwords, question words and speaker
    names, crudely stemmed."""
    skip = STOPWORDS | QUESTION_WORDS | {n.lower() for name in names for n in name.split()}
    return {_stem(w) for w in (t.lower() for t in TOKEN_RE.findall(text or ""))
            if len(w) >= 3 and w not in skip}


def fts_hits(paraphrase: str, evidence: str, names: list[str]) -> set[str]:
    """The paraphrase's query terms that FTS5 would match in the evidence."""
    tokens = {t.lower() for t in TOKEN_RE.findall(evidence or "")}
    hits = set()
    for term in query_terms(paraphrase, names):
        if (len(term) >= 4 and any(t.startswith(term) for t in tokens)) or term in tokens:
            hits.add(term)
    return hits


def norm(text) -> str:
    return " ".join(re.sub(r"[^a-z0-9 ]", " ", str(text).lower()).split())


def check(entries: list[dict], chats: dict[str, dict]) -> list[str]:
    problems: list[str] = []
    seen: Counter = Counter()
    for k, e in enumerate(entries):
        where = f"#{k} {e.get('chat')}[{e.get('index')}]"
        chat = chats.get(e.get("chat"))
        if chat is None or not isinstance(e.get("index"), int) or not (
                0 <= e["index"] < len(chat["qa"])):
            problems.append(f"{where}: no such chat or index")
            continue
        probe = chat["qa"][e["index"]]
        names = speaker_names(chat)
        seen[(e["chat"], e["index"])] += 1
        if probe["question"] != e.get("question"):
            problems.append(f"{where}: question differs from the corpus: {probe['question']!r}")
        if probe["category"] != e.get("category"):
            problems.append(f"{where}: category {e.get('category')} != {probe['category']}")
        if e["index"] not in select(chat):
            problems.append(f"{where}: not picked by the selection rule")
        para = (e.get("paraphrase") or "").strip()
        if not para or norm(para) == norm(probe["question"]):
            problems.append(f"{where}: empty or unchanged paraphrase")
            continue
        asked = [n for n in names if re.search(rf"\b{n}\b", probe["question"])]
        if asked and not any(re.search(rf"\b{n}\b", para) for n in asked):
            problems.append(f"{where}: paraphrase drops the speaker name(s) {asked}")
        answer = norm(probe.get("answer", ""))
        if len(answer) >= 4 and answer in norm(para):
            problems.append(f"{where}: paraphrase contains the answer {probe['answer']!r}")
        words = content_words(para, names)
        for ev_id, text in zip(probe["evidence"], evidence_texts(chat, probe)):
            shared = words & content_words(text, names)
            if shared:
                problems.append(f"{where}: shares {sorted(shared)} with {ev_id}")
            reach = fts_hits(para, text, names) - shared
            if reach:
                problems.append(f"{where}: FTS terms {sorted(reach)} match {ev_id}")
    for name, chat in chats.items():
        for i in select(chat):
            if seen[(name, i)] != 1:
                problems.append(f"{name}[{i}]: picked probe has {seen[(name, i)]} entries")
    return problems


def neighbour_hits(entries: list[dict], chats: dict[str, dict]) -> list[str]:
    """Entries whose FTS terms match a message up to FOLLOWING before an evidence message."""
    notes = []
    for e in entries:
        chat = chats[e["chat"]]
        probe, names = chat["qa"][e["index"]], speaker_names(chat)
        found = []
        for ev_id in probe["evidence"]:
            at = chat["dia_index"][ev_id]
            for back in range(1, FOLLOWING + 1):
                if at - back >= 0:
                    hits = fts_hits(e["paraphrase"], chat["messages"][at - back]["content"], names)
                    if hits:
                        found.append(f"{ev_id}-{back}:{','.join(sorted(hits))}")
        if found:
            notes.append(f"{e['chat']}[{e['index']}] {e['paraphrase']!r}: {' '.join(found)}")
    return notes


def dump(chats: dict[str, dict]) -> None:
    for name, chat in chats.items():
        print(f"=== {name} speakers={speaker_names(chat)}")
        for i in select(chat):
            q = chat["qa"][i]
            print(f"\n[{name} {i}] cat={q['category']} Q: {q['question']}  A: {q['answer']}")
            for ev_id, text in zip(q["evidence"], evidence_texts(chat, q)):
                print(f"   {ev_id}: {text}")
            avoid = set().union(*(content_words(t, speaker_names(chat))
                                  for t in evidence_texts(chat, q)))
            print(f"   avoid: {sorted(avoid)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dump", action="store_true", help="print the selected probes")
    parser.add_argument("--neighbours", action="store_true",
                        help="also list FTS hits on the messages just before the evidence")
    args = parser.parse_args()
    chats = load_chats()
    if args.dump:
        dump(chats)
        return 0
    entries = json.loads(PARAPHRASES.read_text())
    problems = check(entries, chats)
    per_chat = Counter(e.get("chat") for e in entries)
    per_cat = Counter(e.get("category") for e in entries)
    print(f"{len(entries)} paraphrases")
    for name in chats:
        cats = Counter(e.get("category") for e in entries if e.get("chat") == name)
        print(f"  {name}: {per_chat[name]:3d}  " +
              "  ".join(f"cat{c}={cats[c]}" for c in CATEGORIES))
    print("  all:       " + "  ".join(f"cat{c}={per_cat[c]}" for c in CATEGORIES))
    if args.neighbours:
        notes = neighbour_hits(entries, chats)
        print(f"\n{len(notes)} paraphrase(s) with FTS hits up to {FOLLOWING} messages before "
              "their evidence (not violations):")
        for n in notes:
            print("  " + n)
    if problems:
        print(f"\n{len(problems)} violation(s):")
        for p in problems:
            print("  " + p)
        return 1
    print("\nno violations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
