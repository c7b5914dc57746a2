"""The host runs a turn, a model and a thread in one place for the CLI and the GUI: its
operations are generators of typed events; it owns the runtime, the KV states and the
thread lifecycle. The real bundled model where a real cache matters; the scripted
runtime for a fixed reply."""

from __future__ import annotations

import json

import pytest

from iris_desktop.core.events import (
    CacheStatus,
    CompactionFinished,
    CompactionStarted,
    ReplySaved,
    ThreadCreated,
    TurnDone,
    TurnFailed,
    UserSaved,
)
from iris_desktop.core.turns import TurnOptions
from iris_desktop.host import Host, ModelError
from iris_desktop.settings import load_settings

from conftest import SYNTHETIC_CHAT
from support.fakes import ScriptedRuntime


def kinds(events) -> list[str]:
    return [type(e).__name__ for e in events]


def new_thread(host, text: str) -> int:
    """Run a whole turn in a new thread; its id."""
    events = list(host.send(None, text))
    assert isinstance(events[-1], TurnDone) and events[-1].finish_reason != "error", events[-2:]
    return next(e.thread_id for e in events if isinstance(e, ThreadCreated))


def test_send_makes_a_thread_and_reports_the_whole_turn(tmp_path):
    runtime = ScriptedRuntime(["Hello, Dana."])
    with Host(tmp_path, runtime=runtime, compact=False) as host:
        assert host.load_model() is runtime
        events = list(host.send(None, "Hi! My name is Dana."))
        created = events[0]
        assert isinstance(created, ThreadCreated)
        assert isinstance(events[1], UserSaved) and isinstance(events[-1], TurnDone)
        assert {e.thread_id for e in events} == {created.thread_id}
        saved = next(e for e in events if isinstance(e, ReplySaved))
        assert saved.text == "Hello, Dana." and saved.stats.finish_reason == "stop"
        rows = host.store.messages(created.thread_id)
        assert [r["role"] for r in rows] == ["user", "assistant"]
        assert host.store.thread(created.thread_id)["title"] != "New chat"  # titled by the agent
        # a second turn in the same thread makes no thread
        runtime.replies.append("Nice to meet you.")
        again = list(host.send(created.thread_id, "And you?"))
        assert not any(isinstance(e, ThreadCreated) for e in again)
    assert runtime.closed is False  # a ready runtime is the caller's to close


def test_without_a_model_a_turn_fails_in_words_and_nothing_is_stored(tmp_path):
    with Host(tmp_path) as host:
        events = list(host.send(None, "Hello"))
        assert kinds(events) == ["TurnFailed", "TurnDone"]
        assert "no model is loaded" in events[0].text and events[0].kind == "internal"
        assert host.store.threads() == []


def test_a_database_failure_mid_turn_is_one_sentence_not_a_traceback(tmp_path):
    with Host(tmp_path, runtime=ScriptedRuntime(["x"]), compact=False) as host:
        host.load_model()
        thread = host.create_thread("t")
        host.store.conn.close()  # the database goes away under the turn
        events = list(host.send(thread, "Hello"))
        failed = next(e for e in events if isinstance(e, TurnFailed))
        assert failed.kind == "internal" and "database" in failed.text
        assert "Traceback" not in failed.text and isinstance(events[-1], TurnDone)


def test_compact_reports_the_event_and_the_next_request(tmp_path):
    chat = json.loads(SYNTHETIC_CHAT.read_text())["messages"][:80]
    overrides = {"context.summarizer": "extractive", "context.window": "4096"}
    with Host(tmp_path, overrides, runtime=ScriptedRuntime([]), compact=False) as host:
        host.load_model()
        thread = host.create_thread("t")
        host.store.add_messages(thread, chat)
        events = list(host.compact(thread))
        assert kinds(events) == ["CompactionStarted", "CompactionFinished", "TurnDone"]
        assert isinstance(events[0], CompactionStarted) and events[0].trigger == "manual"
        assert isinstance(events[1], CompactionFinished) and events[1].event.outcome == "ok"
        request = events[-1].next_request
        assert request is not None and request.summary is not None
        assert request.summary.id == host.store.latest_summary(thread).id


def test_a_failed_load_keeps_the_model_in_use(tmp_path, model_path):
    settings = load_settings(None, env={}).with_overrides(
        {"model.path": str(model_path), "model.n_ctx": "2048"})
    with Host(tmp_path, settings=settings) as host:
        first = host.load_model()
        broken = tmp_path / "broken.gguf"
        broken.write_bytes(b"GGUF" + b"\0" * 64)
        with pytest.raises(ModelError):
            host.load_model(settings.with_overrides({"model.path": str(broken)}))
        assert host.runtime is first and not first.closed
        assert host.planner().runtime is first
    assert first.closed  # closing the host closed its model


@pytest.fixture
def real_host(tmp_path, model_path):
    overrides = {"model.path": str(model_path), "model.n_ctx": "2048", "model.max_tokens": "4",
                 "model.temperature": "0", "context.summarizer": "extractive"}
    host = Host(tmp_path / "data", overrides)
    host.load_model()
    yield host
    host.close()


def test_each_thread_keeps_its_kv_state_and_a_deleted_thread_takes_its_state_along(real_host):
    host = real_host
    kv = host.paths.kv_cache_dir
    first = new_thread(host, "Tell me about the ocean.")
    second = new_thread(host, "Tell me about the moon.")
    assert [p.name.split("-")[0] for p in kv.glob("*.kv")] == [str(first)]  # saved on leaving
    back = list(host.send(first, "And its depth?"))
    restored = [e for e in back if isinstance(e, CacheStatus) and e.state == "restored"]
    assert restored and restored[0].done > 20 and restored[0].describe() == "Restored from cache"
    stats = next(e for e in back if isinstance(e, ReplySaved)).stats
    assert stats.evaluated_tokens < 30 < stats.reused_tokens  # only the new message
    host.leave_thread()
    assert {p.name.split("-")[0] for p in kv.glob("*.kv")} == {str(first), str(second)}

    host.delete_thread(first)  # the conversation's tokens go with it
    assert {p.name.split("-")[0] for p in kv.glob("*.kv")} == {str(second)}
    assert [t["id"] for t in host.store.threads()] == [second]
    host.open_thread(second)
    host.delete_thread(second)  # the open thread is left without being saved again
    host.leave_thread()
    assert list(kv.glob("*.kv")) == [] and host.store.threads() == []


def test_a_prefilled_draft_is_sent_evaluating_only_what_is_new(real_host):
    host = real_host
    thread = new_thread(host, "Hello!")
    draft = "What is the capital of France? " * 20
    planner = host.planner()
    request = planner.plan(host.store, thread, draft)
    statuses = list(host.prefill(thread, request))
    assert statuses[-1].state == "prefilled" and statuses[-1].describe() == "Prefilled"
    progress = [s for s in statuses if s.state == "prefilling"]
    assert progress and progress[-1].done == progress[-1].total == request.predicted_prompt_tokens
    total = progress[-1].total
    assert progress[-1].describe() == f"Prefilling… {total:,} of {total:,} tokens (100%)"
    sent = list(host.send(thread, draft, options=TurnOptions(planner=planner)))
    stats = next(e for e in sent if isinstance(e, ReplySaved)).stats
    assert stats.prompt_tokens == request.predicted_prompt_tokens and stats.evaluated_tokens <= 1


def test_a_prefill_says_what_the_cache_held_as_the_runtime_counted_it(real_host):
    """Before (an audit, the bundled model): "Prefilled: 667 of 921 prompt tokens came from
    the cache, 254 were read now" where the runtime had reused 539 and read 382: the count
    was taken from the first batch's progress, past its first 128-token chunk. Now the
    last status carries the runtime's own count, and the sentence is worded from it."""
    from iris_desktop.ui.status_line import CacheWords

    host = real_host
    thread = new_thread(host, "Hello!")
    planner = host.planner()
    short = planner.plan(host.store, thread, "What is the capital of France?")
    list(host.prefill(thread, short))  # the cache holds the chat and a short draft
    draft = "What is the capital of France? And of Spain? " + "Tell me more. " * 60
    request = planner.plan(host.store, thread, draft)
    statuses = list(host.prefill(thread, request))
    final = statuses[-1]
    progress = [s for s in statuses if s.state == "prefilling"]
    assert final.state == "prefilled" and final.total == request.predicted_prompt_tokens
    read = final.total - final.done
    assert read > 128 and host.runtime.llm.iris_evaluated == read  # what was really read
    assert progress[0].start > final.done  # the first progress was past the first chunk
    words = CacheWords()
    said = [words.describe(s) for s in statuses][-1]
    assert said == (f"Prefilled: {final.done:,} of {final.total:,} prompt tokens came from "
                    f"the cache, {read:,} were read now")


def test_after_a_compaction_the_new_prefix_is_warmed_up_once_the_reply_is_saved(real_host):
    host = real_host
    thread = host.create_thread("long")
    host.store.add_messages(thread, json.loads(SYNTHETIC_CHAT.read_text())["messages"][:60])
    events = list(host.send(thread, "What did we talk about?"))
    done = next(i for i, e in enumerate(events) if isinstance(e, TurnDone))
    assert any(isinstance(e, CompactionFinished) and e.event.outcome == "ok" for e in events[:done])
    after = events[done + 1:]
    assert after and all(isinstance(e, CacheStatus) for e in after)
    assert after[-1].state == "warmed" and after[-1].describe() == "Ready (warmed up)"
    warming = [e for e in after if e.state == "warming"]
    assert warming and all(e.start == warming[0].done for e in warming)  # paced from batch 1
    assert all(f"{e.done:,} of {e.total:,} tokens" in e.describe() for e in warming)
    request = events[done].next_request
    assert host.runtime.kv_tokens() == host.runtime.prompt_tokens(request.messages)


def test_a_regenerated_reply_starts_from_the_cached_prompt(real_host):
    """Regenerate sends the request the old reply answered: llama.cpp keeps the whole
    prompt in its cache and evaluates the last token again (counted, not timed)."""
    host = real_host
    thread = new_thread(host, "Name a colour.")
    first = host.store.requests(thread)[-1]
    events = list(host.regenerate(thread))
    saved = next(e for e in events if isinstance(e, ReplySaved))
    again = host.store.requests(thread)[-1]
    assert again["prompt_tokens"] == first["prompt_tokens"] == again["predicted_prompt_tokens"]
    assert saved.stats.evaluated_tokens <= 1 and saved.stats.reused_tokens >= first["prompt_tokens"] - 1
    assert len(host.store.alternatives(saved.message_id)) == 2


def test_each_regenerated_reply_is_sampled_anew(tmp_path, model_path):
    """At a temperature above 0, answering again draws another sample (the n-th
    alternative gets seed n), so Regenerate does not repeat the reply word for word."""
    overrides = {"model.path": str(model_path), "model.n_ctx": "2048", "model.max_tokens": "24",
                 "model.temperature": "0.9", "context.summarizer": "extractive"}
    with Host(tmp_path / "data", overrides) as host:
        host.load_model()
        thread = new_thread(host, "Write one sentence about the sea.")
        replies = [host.store.messages(thread)[-1]["content"]]
        for _ in range(2):
            events = list(host.regenerate(thread))
            replies.append(next(e for e in events if isinstance(e, ReplySaved)).text)
        assert len(set(replies)) > 1, replies
        user = host.store.newest_user_message(thread)
        assert len(host.store.replies_to(user)) == 3


def test_a_stopped_reply_is_continued_with_an_exact_prompt(real_host, model_path):
    """Continue: the request ends inside the stopped reply (no closing tokens, no new
    assistant turn); the planner predicts it to the token."""
    host = real_host
    thread = host.create_thread("t")
    host.settings = host.settings.with_overrides({"model.max_tokens": "6"})
    first = list(host.send(thread, "Count from one to twenty, in words, separated by spaces."))
    cut = next(e for e in first if isinstance(e, ReplySaved))
    assert first[-1].finish_reason == "length" and cut.text
    host.settings = host.settings.with_overrides({"model.max_tokens": "8"})
    more = list(host.continue_reply(thread))
    done = next(e for e in more if isinstance(e, ReplySaved))
    assert done.text.startswith(cut.text) and len(done.text) > len(cut.text)
    row = host.store.requests(thread)[-1]
    assert row["prompt_tokens"] == row["predicted_prompt_tokens"]
    request = next(e for e in more if type(e).__name__ == "RequestSent").request
    prompt = host.runtime.prompt_tokens(request.messages)
    assert host.runtime.detokenize(prompt).endswith(cut.text)  # it ends inside the reply
    assert done.stats.evaluated_tokens <= 2  # the cached prompt and reply were reused


def test_prompt_progress_arrives_while_the_model_reads(tmp_path):
    """The scripted runtime reports its prompt as a real one does (before, then after):
    the host hands those on as PromptProgress with the time it took so far."""
    from iris_desktop.core.events import PromptProgress

    seen: list[PromptProgress] = []
    with Host(tmp_path, runtime=ScriptedRuntime(["Hi."]), compact=False) as host:
        host.load_model()
        list(host.send(None, "Hello", options=TurnOptions(progress=seen.append)))
    assert [e.what for e in seen] == ["reply", "reply"]
    assert seen[0].done == seen[0].start == 0 and seen[-1].done == seen[-1].total > 0
    assert seen[-1].describe().startswith(f"Reading the conversation… {seen[-1].total:,} of")


def test_progress_says_how_long_is_left_at_the_pace_so_far():
    from iris_desktop.core.events import PromptProgress

    event = PromptProgress(1, done=1536, total=4096, start=512, elapsed_s=8.0)
    assert event.seconds_left() == pytest.approx(20.0)  # 1,024 tokens in 8 s; 2,560 to go
    assert event.describe() == "Reading the conversation… 1,536 of 4,096 tokens (37%), about 20 s left"
    assert PromptProgress(1, 0, 100).seconds_left() is None
    assert "Summarizing earlier turns…" in PromptProgress(1, 50, 100, what="summary").describe()
    warming = CacheStatus(1, "warming", 1536, 4096, start=512, elapsed_s=8.0)
    assert warming.describe() == "Warming up… 1,536 of 4,096 tokens (37%), about 20 s left"


def test_the_local_model_reports_its_prompt_batch_by_batch(real_host):
    """A long first prompt (several 512-token batches): progress before it (nothing
    cached) and after each batch, up to the whole prompt."""
    from iris_desktop.core.events import PromptProgress

    host = real_host
    seen: list[PromptProgress] = []
    text = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(80))
    events = list(host.send(None, text, options=TurnOptions(progress=seen.append)))
    assert isinstance(events[-1], TurnDone) and events[-1].finish_reason != "error"
    total = seen[-1].total
    assert total > 1024 and seen[0].done == seen[0].start and seen[-1].done == total
    dones = [e.done for e in seen]
    assert dones == sorted(dones) and len(dones) >= 3  # before, then every batch
    assert all(b - a <= 512 for a, b in zip(dones[1:], dones[2:]))
    assert seen[-2].seconds_left() is not None


def test_a_chat_deleted_by_another_process_leaves_no_kv_state_and_its_id_restores_nothing(
        real_host):
    """Before: a delete while a ``chat`` on the same thread ran in another process left
    that chat's KV state on disk (its tokens decode back to the deleted text), and a new
    chat that got the same id restored it; a state was taken for any thread id."""
    host = real_host
    kv = host.paths.kv_cache_dir
    first = new_thread(host, "My locker code is 4471. Remember it.")
    assert host.cache.thread_id == first
    other = Host(host.paths.data_dir, {})  # another process's view: its own connection
    other.delete_thread(first)
    other.close()
    host.leave_thread()  # the chat ends: its state is not saved for a deleted chat
    assert list(kv.glob(f"{first}-*.kv")) == []

    again = new_thread(host, "Hello there.")  # may be given the deleted chat's id
    host.leave_thread()
    saved = list(kv.glob(f"{again}-*.kv"))
    assert len(saved) == 1
    # a state file of one chat put in place of another's is refused and deleted
    third = new_thread(host, "Tell me about the moon.")
    host.leave_thread()
    target = next(kv.glob(f"{third}-*.kv"))
    target.write_bytes(saved[0].read_bytes())
    back = list(host.send(third, "And its size?"))
    assert not [e for e in back if isinstance(e, CacheStatus) and e.state == "restored"]


def test_a_chat_deleted_during_its_compaction_is_said_so_not_a_folder_problem(tmp_path):
    """Before: "FOREIGN KEY constraint failed; check that its folder is writable and the
    disk is not full" — the wrong cause. The chat was deleted by another process while its
    summary was being written: said so, nothing else touched."""
    import sqlite3 as _sqlite3

    data = tmp_path / "data"
    with Host(data, {"context.recall_semantic": "false"}) as other:
        thread = other.store.create_thread("long")
        other.store.add_messages(thread, [m for n in range(12) for m in (
            {"role": "user", "content": f"question {n} " + "word " * 80},
            {"role": "assistant", "content": f"answer {n} " + "word " * 80})])
        keep = other.store.create_thread("kept")
        other.store.add_messages(keep, [{"role": "user", "content": "keep me"}])

    def delete_then_answer(messages):
        with _sqlite3.connect(data / "iris.db") as conn:  # another process's connection
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("UPDATE messages SET parent_id = NULL WHERE thread_id = ?", (thread,))
            conn.execute("DELETE FROM threads WHERE id = ?", (thread,))
        return "{}"

    runtime = ScriptedRuntime([delete_then_answer])
    with Host(data, {"context.recall_semantic": "false", "context.summarizer": "model"},
              runtime=runtime) as host:
        host.load_model()
        events = list(host.compact(thread))
        failed = [e for e in events if isinstance(e, TurnFailed)]
        assert failed and "deleted meanwhile" in failed[0].text, events
        assert "writable" not in failed[0].text
        assert [t["id"] for t in host.store.threads()] == [keep]


def test_the_preview_of_n_ctx_0_is_the_window_the_load_will_give(real_host):
    """Before (an audit): Preferences previewed model.n_ctx 0 as an 8,192-token window
    (0 read as "not given"); the reload then gave the trained 32,768, four times the KV
    memory, unannounced. The preview now plans with what the load will give."""
    host = real_host
    current = host.settings
    candidate = current.with_overrides({"model.n_ctx": "0"})
    assert host.runtime.n_ctx == 2048
    assert host.candidate_planner(candidate, current).params.window == 32768
    assert host.candidate_planner(current.with_overrides({"model.n_ctx": "4096"}),
                                  current).params.window == 4096


def test_a_full_disk_mid_reply_leaves_the_model_free_and_the_host_closes(tmp_path, model_path,
                                                                        monkeypatch):
    """Before (an audit): a disk that filled while a reply was written failed the reply's
    periodic save, then its error save, and the generation was never closed: it held the
    model's lock, so closing the host (the CLI's exit) waited forever, Ctrl+C or not."""
    import sqlite3
    import threading

    from iris_desktop.core.store import Store

    overrides = {"model.path": str(model_path), "model.n_ctx": "2048", "model.max_tokens": "300",
                 "model.temperature": "0", "context.summarizer": "extractive"}
    host = Host(tmp_path / "data", overrides)
    host.load_model()
    thread = new_thread(host, "Hello")

    def full(self, *args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(Store, "update_streaming", full)  # the save a second into the reply
    events = list(host.send(thread, "Write a long story about a lighthouse keeper."))
    monkeypatch.undo()
    failed = next(e for e in events if isinstance(e, TurnFailed))
    assert "is full" in failed.text  # the disk named, not "the model failed"
    free = host.runtime._lock.acquire(timeout=5)  # the generation let go of the model
    assert free
    host.runtime._lock.release()
    closed = threading.Thread(target=host.close, daemon=True)
    closed.start()
    closed.join(30)
    assert not closed.is_alive()
