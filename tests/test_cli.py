"""The CLI contract, run in-process through main() and once as a real subprocess."""

from __future__ import annotations

import ctypes.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from iris_desktop.cli import main
from iris_desktop.core.recall import RECALL_FOOTER, RECALL_HEADER
from iris_desktop.settings import lookup

from conftest import AGENT_FILES, CHAT_FILES, SYNTHETIC_CHAT, load_corpus


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_import_export_round_trip_every_corpus_file(capsys, tmp_path):
    data = str(tmp_path / "home")
    for path in AGENT_FILES + CHAT_FILES:
        code, out, err = run(capsys, "--data-dir", data, "import", str(path))
        assert code == 0, err
        thread = out.strip()
        code, out, _ = run(capsys, "--data-dir", data, "export", thread)
        assert json.loads(out)["messages"] == load_corpus(path), path.name


def test_an_export_keeps_the_chats_title_and_its_own_system_prompt(capsys, tmp_path):
    """Before, a chat of one branch exported as a plain message list: imported again it was
    titled by its first words and answered under the global system prompt."""
    from iris_desktop.core.store import Store

    first, second = tmp_path / "first", tmp_path / "second"
    run(capsys, "--data-dir", str(first), "threads")  # makes the database
    with Store(first / "iris.db") as store:
        thread = store.create_thread("Trip to Lisbon")
        store.set_system_prompt(thread, "Answer as a travel agent.")
        store.add_message(thread, {"role": "user", "content": "Plan the trip"})
    code, out, err = run(capsys, "--data-dir", str(first), "export", str(thread))
    assert code == 0, err
    exported = json.loads(out)
    assert exported["title"] == "Trip to Lisbon"
    assert exported["system_prompt"] == "Answer as a travel agent."
    path = tmp_path / "export.json"
    path.write_text(out)
    code, out, err = run(capsys, "--data-dir", str(second), "import", str(path))
    assert code == 0, err
    with Store(second / "iris.db") as store:
        assert store.thread(int(out))["title"] == "Trip to Lisbon"
        assert store.system_prompt_of(int(out)) == "Answer as a travel agent."
    # a chat under the global prompt says none, and another app's "system_prompt" key
    # in a plain messages object is read the same way (it is only text for the thread)
    with Store(first / "iris.db") as store:
        plain = store.create_thread("plain")
        store.add_message(plain, {"role": "user", "content": "hi"})
    assert "system_prompt" not in json.loads(run(capsys, "--data-dir", str(first), "export",
                                                 str(plain))[1])


def test_a_chat_written_in_iris_keeps_its_dates_and_its_stopped_reply_through_export_and_import(
        capsys, tmp_path):
    """Before, an export imported again lost the date of every message Iris itself wrote
    (compaction's dated facts and date-aware recall had nothing left) and the mark of a
    stopped reply (Continue was no longer offered)."""
    from iris_desktop.core.store import Store

    first, second = tmp_path / "first", tmp_path / "second"
    code, _, err = run(capsys, "--data-dir", str(first), "threads")  # makes the database
    with Store(first / "iris.db") as store:
        thread = store.create_thread("written here")
        store.add_message(thread, {"role": "user", "content": "Plan the trip"})
        store.add_message(thread, {"role": "assistant", "content": "Day one: Lisb"},
                          status="interrupted")
        written = [(m["role"], m["sent_at"], m["status"]) for m in store.messages(thread)]
    assert all(when for _, when, _ in written)
    code, out, err = run(capsys, "--data-dir", str(first), "export", str(thread))
    assert code == 0, err
    exported = json.loads(out)["messages"]
    assert [m.get("created_at") for m in exported] == [when for _, when, _ in written]
    assert exported[1]["status"] == "interrupted" and "status" not in exported[0]
    path = tmp_path / "export.json"
    path.write_text(out)
    code, out, err = run(capsys, "--data-dir", str(second), "import", str(path))
    assert code == 0, err
    with Store(second / "iris.db") as store:
        again = [(m["role"], m["sent_at"], m["status"]) for m in store.messages(int(out))]
    assert again == written
    again = json.loads(run(capsys, "--data-dir", str(second), "export", out.strip())[1])
    assert again["messages"] == exported and again["title"] == "written here"


def test_import_jsonl_and_title(capsys, tmp_path):
    f = tmp_path / "chat.jsonl"
    f.write_text('{"role": "user", "content": "What is a walrus?"}\n\n'
                 '{"role": "assistant", "content": "A large marine mammal."}\n')
    code, out, _ = run(capsys, "import", str(f), "--title", "Walrus")
    assert code == 0
    code, out, _ = run(capsys, "threads", "--json", "--no-model")
    rows = json.loads(out)
    assert rows[0]["title"] == "Walrus" and rows[0]["messages"] == 2 and rows[0]["tokens"] > 0


@pytest.mark.parametrize(
    "content,fragment",
    [
        ('[{"role": "user", "content": "hi"},', "the file ends early (line 1)"),
        ("Hello, this is my shopping list\n- milk\n", "not a conversation file: it is not JSON"),
        ('[{"role": "user", "content": "hi"}, {"role": "wizard", "content": "x"}]',
         "message index 1: unknown role 'wizard'"),
        ('{"messages": [{"role": "user", "content": "hi"}, '
         '{"role": "tool", "tool_call_id": "c9", "content": "out"}]}',
         "messages[1]: tool result 'c9' has no matching tool call"),
        ('{"role": "user", "content": "a"}\n{"role": "user", "content": 5}\n',
         "line 2: content must be"),
        ('{"role": "user", "content": "a"}\n{"role": \n', "line 2: invalid JSON"),
    ],
)
def test_malformed_import_is_refused_and_nothing_written(capsys, tmp_path, content, fragment):
    f = tmp_path / "bad.json"
    f.write_text(content)
    code, out, err = run(capsys, "import", str(f))
    assert code == 2 and fragment in err and "nothing was written" in err
    code, out, _ = run(capsys, "threads", "--json", "--no-model")
    assert json.loads(out) == []


def test_context_json_fields(capsys):
    code, out, _ = run(capsys, "import", str(AGENT_FILES[3]))
    thread = out.strip()
    code, out, err = run(capsys, "--set", "context.window=16384", "context", thread, "--json",
                         "--no-model")
    assert code == 0, err
    r = json.loads(out)
    for key in ("window", "window_source", "token_budget_ratio", "counter", "system_tokens",
                "tool_tokens", "summary_tokens", "history_tokens", "available", "protect_turns",
                "compaction_due", "trigger", "messages"):
        assert key in r
    assert r["window"] == 16384 and r["window_source"] == "config"
    assert r["counter"] == "heuristic"
    assert r["available"] == int(16384 * 0.7) - r["system_tokens"] - r["tool_tokens"]
    assert len(r["messages"]) == len(load_corpus(AGENT_FILES[3]))
    assert {m["state"] for m in r["messages"]} <= {"verbatim", "pruned", "summarized", "dropped"}
    assert all({"id", "role", "turn", "tokens", "state"} <= set(m) for m in r["messages"])


def test_context_too_large_exits_3(capsys, tmp_path):
    f = tmp_path / "big.json"
    f.write_text(json.dumps([{"role": "user", "content": "word " * 20000}]))
    _, out, _ = run(capsys, "import", str(f))
    code, out, err = run(capsys, "--set", "context.window=2048", "context", out.strip(),
                         "--no-model")
    assert code == 3
    assert "the newest turn alone is 25,004 tokens" in err and "the history budget allows" in err


def test_unknown_thread_and_bad_set_are_usage_errors(capsys):
    assert run(capsys, "context", "99", "--no-model")[0] == 2
    code, _, err = run(capsys, "--set", "context.token_budget_ratio=3", "threads")
    assert code == 2 and "context.token_budget_ratio" in err and "0.1 to 0.95" in err


def test_an_empty_message_and_a_continue_with_nothing_stopped_are_refused_before_the_model(
        capsys, tmp_path, monkeypatch):
    """``chat ""`` or ``chat -`` on empty input sent an empty message and made a chat of it;
    ``--continue`` on a reply that ended on its own made a duplicate alternative. Both are
    refused in one sentence, exit 2, nothing stored, no model loaded."""
    import io

    data = ["--data-dir", str(tmp_path / "home")]
    for argv, stdin in ((("chat", ""), ""), (("chat", "-"), "\n\n"), (("chat", " \n "), "")):
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
        code, out, err = run(capsys, *data, *argv)
        assert code == 2 and err == "iris-desktop: the message is empty; nothing was sent or stored\n"
    source = tmp_path / "chat.json"
    source.write_text(json.dumps([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]))
    assert run(capsys, *data, "import", str(source))[0] == 0
    code, out, err = run(capsys, *data, "--set", "model.path=/nonexistent.gguf", "chat", "--thread", "1",
                         "--continue")
    assert code == 2 and "thread 1's last reply is complete (not stopped, failed or cut off); there is " \
        "nothing to continue" in err
    code, out, err = run(capsys, *data, "--set", "model.path=/nonexistent.gguf", "chat", "--thread", "1",
                         "--edit", "999", "Hello")
    assert code == 2 and out == "" and "message 999 is not a message of yours on thread 1's active" in err
    assert [t["messages"] for t in json.loads(run(capsys, *data, "threads", "--json", "--no-model")[1])] == [2]
    # nothing to compact yet is a skip, not a failure (exit 0)
    code, out, err = run(capsys, *data, "compact", "1", "--no-model")
    assert code == 0 and "nothing to compact yet" in out + err


@pytest.mark.parametrize("argv,hint", [
    (["--set", "context.window", "4096", "config", "get", "context.window"],
     "; --set takes KEY=VALUE as one argument (--set context.window=4096)"),
    (["threads", "-v"], "; -v goes before the command (iris-desktop -v … COMMAND)"),
    (["threads", "--set", "context.window=4096"], "; --set goes before the command"),
    (["--set", "context.window=4096", "model.temperature=0.2", "threads"],
     "; repeat --set for each setting (--set context.window=4096 --set model.temperature=0.2)"),
])
def test_the_two_usual_argument_mistakes_get_a_hint(capsys, argv, hint):
    with pytest.raises(SystemExit) as caught:
        main(argv)
    err = capsys.readouterr().err
    assert caught.value.code == 2 and err.count("\n") == 1 and hint in err and "--help" in err


def test_the_window_without_a_display_or_its_libraries_is_one_sentence(capsys, monkeypatch,
                                                                      tmp_path):
    """Qt aborts (exit 134, a core dump, several lines) where the window cannot open; the
    app says why first: no display, or the xcb libraries it lacks, by package name."""
    from iris_desktop.commands import display_problem

    found = {"xcb-cursor": None}
    lookup_lib = lambda name: found.get(name, f"lib{name}.so")  # noqa: E731
    fails = lambda: "libxcb-cursor.so.0: cannot open shared object file: No such file"  # noqa: E731
    assert "no display" in display_problem({}, "linux", lookup_lib, fails)
    assert display_problem({"DISPLAY": ":0"}, "linux", lookup_lib, fails) == (
        "the window needs libraries your system lacks: libxcb-cursor0 (on Debian or Ubuntu: "
        "sudo apt-get install libxcb-cursor0)")
    # only a real failure to load counts: a library the search does not see but the loader
    # finds (bundled beside Qt in an installer) refuses nothing
    assert display_problem({"DISPLAY": ":0"}, "linux", lookup_lib, lambda: None,
                           lambda display: True) is None
    # a DISPLAY no X server answers at (left from another session): one sentence, where
    # Qt aborted advising libraries that were there (an audit)
    assert display_problem({"DISPLAY": ":99"}, "linux", lookup_lib, lambda: None,
                           lambda display: False) == (
        "there is no display to open the window on: DISPLAY is ':99', but no X server answers "
        "there (a variable left from another session, or a server that refuses this user): "
        "start Iris Desktop in a desktop session, or use the command line "
        "('iris-desktop --help')")
    # whether the server answers cannot be told (no libxcb, no answer in time): Qt tries
    assert display_problem({"DISPLAY": ":0"}, "linux", lookup_lib, lambda: None,
                           lambda display: None) is None
    assert display_problem({"DISPLAY": ":0"}, "linux", lambda name: "x", fails) == (
        "the window needs libraries your system lacks: libxcb-cursor.so.0")
    assert "WAYLAND_DISPLAY names 'wayland-0', which is not there" in display_problem(
        {"WAYLAND_DISPLAY": "wayland-0"}, "linux", lookup_lib, fails)  # before: Qt aborted
    runtime = tmp_path / "run"
    runtime.mkdir()
    (runtime / "wayland-0").touch()  # the compositor's socket
    wayland = {"WAYLAND_DISPLAY": "wayland-0", "XDG_RUNTIME_DIR": str(runtime)}
    assert display_problem(wayland, "linux", lookup_lib, fails) is None
    stale = {"WAYLAND_DISPLAY": "wayland-9", "XDG_RUNTIME_DIR": str(runtime), "DISPLAY": ":0"}
    assert "libxcb-cursor0" in display_problem(stale, "linux", lookup_lib, fails)  # Qt's xcb then
    assert display_problem({"QT_QPA_PLATFORM": "offscreen"}, "linux", lookup_lib, fails) is None
    assert display_problem({}, "win32") is None and display_problem({}, "darwin") is None
    if sys.platform.startswith("linux"):
        for name in ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY"):
            monkeypatch.delenv(name, raising=False)
        code, out, err = run(capsys)
        assert code == 1 and out == "" and err.count("\n") == 1 and "no display to open the window" in err


@pytest.mark.skipif(ctypes.util.find_library("xcb") is None,
                    reason="no libxcb here: the check cannot tell, and leaves it to Qt")
def test_a_display_no_x_server_answers_at_is_told_by_libxcb():
    """The real check: libxcb's connect to a display number no server listens on."""
    from iris_desktop.commands import _x_answers

    assert _x_answers(":4711") is False


def test_config_set_get_list_reset(capsys, tmp_path):
    code, _, _ = run(capsys, "config", "set", "context.token_budget_ratio", "0.8")
    assert code == 0
    assert run(capsys, "config", "get", "context.token_budget_ratio")[1].strip() == "0.8"
    _, path, _ = run(capsys, "config", "path")
    from pathlib import Path
    before = Path(path.strip()).read_bytes()
    code, _, err = run(capsys, "config", "set", "context.token_budget_ratio", "1.2")
    assert code == 2 and "expected a number from 0.1 to 0.95" in err
    code, _, err = run(capsys, "config", "set", "context.nope", "1")
    assert code == 2 and "unknown setting" in err
    assert Path(path.strip()).read_bytes() == before
    _, out, _ = run(capsys, "config", "list", "--json")
    rows = {r["key"]: r for r in json.loads(out)}
    assert rows["context.token_budget_ratio"]["source"] == "file"
    assert rows["context.token_budget_ratio"]["env"] == "IRIS_CONTEXT_TOKEN_BUDGET_RATIO"
    code, out, _ = run(capsys, "config", "reset", "context.token_budget_ratio")
    assert code == 0 and out.startswith("context.token_budget_ratio = 0.7  (the default; removed from ")
    assert run(capsys, "config", "get", "context.token_budget_ratio")[1].strip() == "0.7"
    code, out, _ = run(capsys, "config", "reset")
    assert code == 0 and out.startswith("every setting is at its default")


def test_env_override_and_bad_env_warns(capsys, monkeypatch):
    monkeypatch.setenv("IRIS_CONTEXT_PRUNE_PROTECT_TURNS", "5")
    monkeypatch.setenv("IRIS_CONTEXT_COMPACTION_THRESHOLD", "lots")
    code, out, err = run(capsys, "config", "list", "--json")
    rows = {r["key"]: r for r in json.loads(out)}
    assert rows["context.prune_protect_turns"]["value"] == 5
    assert rows["context.prune_protect_turns"]["source"] == "env"
    assert rows["context.compaction_threshold"]["value"] == 0.75
    assert "IRIS_CONTEXT_COMPACTION_THRESHOLD" in err
    # a name that looks like a setting's and is none is said, not silently ignored
    monkeypatch.setenv("IRIS_CONTEXT_WINDOWW", "4096")
    monkeypatch.setenv("IRIS_context_window", "4096")
    monkeypatch.setenv("IRIS_TEST_SOMETHING", "1")  # not a settings section: build/test scripts' own
    err = run(capsys, "config", "get", "context.window")[2]
    assert "environment IRIS_CONTEXT_WINDOWW is not a setting Iris knows; ignored (did you mean " \
        "IRIS_CONTEXT_WINDOW?)" in err
    assert "environment IRIS_context_window is not read: its name is IRIS_CONTEXT_WINDOW" in err
    assert "IRIS_TEST_SOMETHING" not in err


def test_config_set_says_when_the_environment_wins(capsys, monkeypatch, tmp_path):
    """Before, `config set model.top_k 15` with IRIS_MODEL_TOP_K=20 set said only that it
    was saved; `config get` then printed 20."""
    monkeypatch.setenv("IRIS_MODEL_TOP_K", "20")
    code, out, err = run(capsys, "--data-dir", str(tmp_path), "config", "set", "model.top_k", "15")
    assert code == 0 and out.startswith("model.top_k = 15")
    assert "IRIS_MODEL_TOP_K is set in this environment and wins over the settings file" in err
    monkeypatch.delenv("IRIS_MODEL_TOP_K")
    assert run(capsys, "--data-dir", str(tmp_path), "config", "get", "model.top_k")[1].strip() == "15"


def test_the_window_says_settings_it_could_not_use(monkeypatch, tmp_path, qapp):
    """Before, the app started on a config.toml that is not TOML, or holds theme =
    "purple", with every setting silently at its default; the reason was only in the log."""
    from support.windows import run_gui_recording

    data = tmp_path / "data"
    data.mkdir()
    (data / "config.toml").write_text('[ui]\ntheme = "purple"\n')
    shown = run_gui_recording(monkeypatch, data)
    assert shown[0][0] == "warning" and "ui.theme" in shown[0][1] and "purple" in shown[0][1]
    assert "Iris uses the defaults for these" in shown[0][1] and shown[1:] == [("window", "")]


def test_a_second_file_after_one_attach_is_not_sent_as_the_message(capsys, tmp_path):
    """`chat --attach a.md b.md` read b.md as the message: the text "b.md" would have gone
    to the model with only a.md attached."""
    for name in ("a.md", "b.md"):
        (tmp_path / name).write_text(f"# {name}\n")
    code, out, err = run(capsys, "--data-dir", str(tmp_path / "d"), "chat", "--attach",
                         str(tmp_path / "a.md"), str(tmp_path / "b.md"))
    assert code == 2 and "is a file: to attach several files, repeat --attach" in err
    assert "nothing was sent or stored" in err and out == ""


def test_console_script_runs_as_a_subprocess(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "iris_desktop", "--data-dir", str(tmp_path), "threads", "--no-model"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0 and "no threads yet" in result.stdout


def test_context_shows_recall_for_a_draft_after_compaction(capsys):
    _, out, _ = run(capsys, "import", str(SYNTHETIC_CHAT))
    thread = out.strip()
    small = ("--set", "context.window=2048")
    code, out, err = run(capsys, *small, "compact", thread, "--json", "--no-model")
    assert code == 0 and json.loads(out)["outcome"] == "ok", err
    question = "Which city did Rosa move to?"
    code, out, err = run(capsys, *small, "context", thread, "--json", "--no-model",
                         "--draft", question)
    assert code == 0, err
    r = json.loads(out)
    limit = lookup("context.recall_max_tokens").default
    assert r["recall"]["max_tokens"] == limit and r["recall"]["terms"]
    assert 0 < r["recall_tokens"] <= limit and r["recall"]["ids"] and r["recall"]["reason"] == ""
    recalled = [m for m in r["messages"] if m["recalled"]]
    assert [m["id"] for m in recalled] == r["recall"]["ids"]
    block = r["recall"]["text"]  # the block itself, as the model reads it before the draft
    assert block.startswith(RECALL_HEADER) and block.endswith(RECALL_FOOTER) and "Rosa" in block
    assert {m["state"] for m in recalled} == {"summarized"}
    assert r["predicted_prompt_tokens"] == (r["system_tokens"] + r["tool_tokens"] + r["summary_tokens"]
                                            + r["recall_tokens"] + r["history_tokens"] + r["draft_tokens"])
    code, out, _ = run(capsys, *small, "context", thread, "--no-model", "--draft", question)
    assert code == 0 and f"recall      {len(r['recall']['ids'])} summarized messages" in out
    code, out, _ = run(capsys, *small, "context", thread, "--no-model", "--draft", "I love pottery.")
    assert code == 0 and "recall      none (the message asks nothing)" in out
    # off is off
    code, out, _ = run(capsys, *small, "--set", "context.recall_max_tokens=0", "context", thread,
                       "--json", "--no-model", "--draft", question)
    assert json.loads(out)["recall_tokens"] == 0 and json.loads(out)["recall"]["ids"] == []
    assert json.loads(out)["recall"]["text"] == ""


# -- the default model and the model library -------------------------------------------------


def test_models_json_lists_other_apps_models_and_the_verified_bundled_one(capsys, tmp_path,
                                                                          monkeypatch, model_path):
    from support.gguf_fixtures import hf_model, ollama_model, tiny_metadata, tiny_model

    home = tmp_path / "home"
    tiny_model(home / ".lmstudio" / "models" / "lmstudio-community" / "Tiny-GGUF" / "tiny.gguf")
    ollama_model(home / ".ollama" / "models",
                 ("registry.ollama.ai", "library", "tiny", "1b"), tiny_metadata("Ollama Tiny"))
    hf_model(home / ".cache" / "huggingface" / "hub", "org/Tiny-GGUF", "tiny-q8_0.gguf")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("USERPROFILE", str(home))
    for var in ("OLLAMA_MODELS", "HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(var, raising=False)
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    for name in (model_path.name, model_path.name + ".verified"):  # assembled before: reuse
        (data / "models" / name).symlink_to(model_path.parent / name)
    text = tmp_path / "notes.gguf"
    text.write_text("this is a text file renamed .gguf\n" * 20)

    code, out, err = run(capsys, "--data-dir", str(data), "--set", f"model.path={text}",
                         "models", "--json")
    assert code == 0, err
    rows = json.loads(out)
    by_source = {r["source"]: r for r in rows}
    assert {"bundled", "lmstudio", "ollama", "huggingface", "file"} <= set(by_source)
    bundled = by_source["bundled"]
    assert bundled["verified"] and bundled["chat_template"] and not bundled["base_model"]
    assert bundled["architecture"] == "qwen2" and bundled["quantization"] == "Q4_K_M"
    assert by_source["ollama"]["ollama_name"] == "tiny:1b"
    for row in rows:
        assert {"path", "name", "source", "architecture", "parameters", "quantization",
                "size_bytes", "context_length", "chat_template", "memory_estimate_bytes"} <= set(row)
    assert by_source["file"]["error"] and by_source["file"]["path"] == str(text)

    # the same broken file as the model: a clear error and exit 1, nothing else lost
    code, out, err = run(capsys, "--data-dir", str(data), "--set", f"model.path={text}",
                         "chat", "--new", "hello")
    assert code == 1 and "cannot load the model" in err and "not a GGUF file" in err


def test_the_default_model_answers_offline(capsys, tmp_path, model_path):
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    for name in (model_path.name, model_path.name + ".verified"):
        (data / "models" / name).symlink_to(model_path.parent / name)
    code, out, err = run(capsys, "--data-dir", str(data), "--set", "model.temperature=0",
                         "--set", "model.max_tokens=8", "chat", "--new", "--json",
                         "What is the capital of France? Answer in one word.")
    assert code == 0, err
    reply = json.loads(out)
    assert "paris" in reply["reply"].lower()
    code, out, err = run(capsys, "--data-dir", str(data), "context", str(reply["thread_id"]),
                         "--json")
    context = json.loads(out)
    assert context["chat_format"] == "jinja" and context["counter"].startswith("model:")


def test_a_new_chat_whose_message_is_refused_is_not_left_behind(capsys, tmp_path, model_path):
    """Before (an audit, the bundled model, window 512): a ~346-token message passed the
    first check (window × ratio, 358), was stored in a new chat, then refused with another
    limit (333); and each refused `chat --new` left an empty "New chat" behind. Now the
    message is refused before it is stored, with the limit `context` gives, and the chat
    made for it goes too."""
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    for name in (model_path.name, model_path.name + ".verified"):
        (data / "models" / name).symlink_to(model_path.parent / name)
    base = ("--data-dir", str(data), "--set", "context.window=512", "--set", "model.max_tokens=4")
    code, out, err = run(capsys, *base, "chat", "--new", "word " * 340)
    assert code == 3 and "Not sent: the newest turn alone is " in err, err
    assert "the history budget allows 333 (window 512 × ratio 0.7 − system " in err
    assert "[thread" not in err
    code, out, err = run(capsys, *base, "threads", "--json")
    assert code == 0 and json.loads(out) == []
    code, out, err = run(capsys, *base, "chat", "--new", "--json", "Hi")
    assert code == 0, err
    code, out, err = run(capsys, *base, "threads", "--json")
    assert [t["messages"] for t in json.loads(out)] == [2]


def test_a_window_or_n_ctx_the_model_cannot_hold_is_refused_with_both_numbers(capsys, tmp_path,
                                                                              model_path):
    data = str(tmp_path / "data")
    code, out, _ = run(capsys, "--data-dir", data, "import", str(AGENT_FILES[0]))
    thread = out.strip()
    model = ["--set", f"model.path={model_path}", "--set", "model.n_ctx=4096"]
    code, out, err = run(capsys, "--data-dir", data, *model, "--set", "context.window=16384",
                         "context", thread)
    assert code == 2 and "16,384" in err and "n_ctx of 4,096" in err
    code, out, err = run(capsys, "--data-dir", data, "--set", f"model.path={model_path}",
                         "--set", "model.n_ctx=65536", "chat", "--new", "hi")
    assert code == 2 and "65,536" in err and "(32,768)" in err
    code, out, err = run(capsys, "--data-dir", data, "--set", f"model.path={model_path}",  # not planned
                         "--set", "model.n_ctx=65536", "context", thread)
    assert code == 2 and out == "" and "65,536" in err and "(32,768)" in err


def test_a_plain_openai_chat_keeps_its_dates_and_names_in_summary_and_recall(capsys):
    """Plain OpenAI format: name fields and created_at timestamps, no date lines or markers
    in the text. Who and when reach the summary and recall from the records."""
    _, out, _ = run(capsys, "import", str(SYNTHETIC_CHAT))
    thread = out.strip()
    small = ("--set", "context.window=2048")
    code, out, err = run(capsys, *small, "compact", thread, "--json", "--no-model")
    assert code == 0, err
    code, out, err = run(capsys, *small, "context", thread, "--json", "--no-model",
                         "--show-request", "--draft", "Which city did Rosa move to?")
    r = json.loads(out)
    facts = r["summary_fields"]["facts"]
    assert any(re.match(r"\d{1,2} (March|April|May) 2024 (Rosa|Tomas): ", f) for f in facts)
    block = r["request"][-1]["content"]
    assert "4 March 2024:\n- Rosa: We finally moved to Tallinn" in block


def test_core_holds_no_rule_shaped_to_one_corpus():
    """Dates and speakers come from records; nothing in core parses a dataset's layout."""
    core = Path(__file__).resolve().parent.parent / "iris_desktop" / "core"
    text = "\n".join(p.read_text() for p in core.glob("*.py")).lower()
    for shape in ("shares a photo", "session_date", "bracketed", "greet", "locomo", "caroline"):
        assert shape not in text, shape


def test_a_second_chat_process_resumes_from_the_saved_kv_state(tmp_path, model_path):
    """`chat --thread T` saves the thread's KV state when it ends; the next process
    restores it and evaluates only the new message and the template tokens around it."""
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    for name in (model_path.name, model_path.name + ".verified"):
        (data / "models" / name).symlink_to(model_path.parent / name)
    history = tmp_path / "history.json"
    history.write_text(json.dumps([
        {"role": "user" if i % 2 == 0 else "assistant",
         "content": f"Note {i}: the shed by the orchard holds {i} crates of apples and pears."}
        for i in range(40)]))
    base = [sys.executable, "-m", "iris_desktop", "--data-dir", str(data),
            "--set", "model.temperature=0", "--set", "model.max_tokens=4"]
    done = subprocess.run([*base, "import", str(history)], capture_output=True, text=True,
                          timeout=300)
    thread = done.stdout.strip()

    def chat(message: str) -> dict:
        done = subprocess.run([*base, "chat", "--thread", thread, "--json", message],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    first = chat("How many crates are in the shed?")
    assert first["kv_restored_tokens"] == 0 and first["evaluated_tokens"] > 800  # cold
    kv = list((data / "kv-cache").glob(f"{thread}-*.kv"))
    assert len(kv) == 1 and kv[0].stat().st_mode & 0o777 == 0o600
    second = chat("Thanks!")
    # 40 short messages are 20 turns: the first chat also compacted (the count floor)
    # and warmed the new prefix up before it saved the state
    assert second["kv_restored_tokens"] > 300
    assert second["reused_tokens"] >= second["prompt_tokens"] - 40
    # the new message, the previous reply and the template tokens around them
    assert second["evaluated_tokens"] < 40, second


def test_context_recalls_by_meaning_with_the_model_loaded(capsys, tmp_path, model_path):
    """With a model, the CLI embeds the summarized messages once (as the GUI does in the
    background) and recall fuses bm25 with the semantic ranking."""
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    for name in (model_path.name, model_path.name + ".verified"):
        (data / "models" / name).symlink_to(model_path.parent / name)
    home = ("--data-dir", str(data), "--set", "context.window=2048")
    _, out, _ = run(capsys, *home, "import", str(SYNTHETIC_CHAT))
    thread = out.strip()
    code, out, err = run(capsys, *home, "compact", thread, "--json", "--no-model")
    assert code == 0 and json.loads(out)["outcome"] == "ok", err
    question = "Which animal joined the family?"
    code, out, err = run(capsys, *home, "context", thread, "--json", "--draft", question)
    assert code == 0, err
    assert "summarized messages of thread" in err and "for recall by meaning" in err
    first = json.loads(out)
    assert first["recall"]["semantic"] and first["recall"]["ids"]
    code, out, err = run(capsys, *home, "context", thread, "--json", "--draft", question)
    assert "for recall by meaning" not in err  # embedded once
    assert json.loads(out)["recall"]["ids"] == first["recall"]["ids"]
    code, out, err = run(capsys, *home, "--set", "context.recall_semantic=false", "context",
                         thread, "--json", "--draft", question)
    assert not json.loads(out)["recall"]["semantic"]


#: made-up words: no vocabulary of a shipped model holds them
PLANTED = "zyxoplanq wuvretheb quorvashtibble"


def test_delete_leaves_no_trace_of_the_chat_under_the_data_folder(capsys, tmp_path, model_path):
    """A chat with a planted phrase, answered by the real model (so it has requests, a
    saved KV state and a streamed reply), compacted, then deleted: no file under the data
    folder holds the phrase or a word of it any more; the other chat is untouched."""
    data = tmp_path / "home"
    base = ["--data-dir", str(data), "--set", f"model.path={model_path}", "--set", "model.n_ctx=2048",
            "--set", "model.max_tokens=8", "--set", "model.temperature=0"]
    code, _, err = run(capsys, *base, "chat", "--json", "Remember this: the password is " + PLANTED)
    assert code == 0, err
    code, out, _ = run(capsys, *base, "chat", "--new", "--json", "What is two plus two?")
    kept = json.loads(out)["thread_id"]
    code, _, _ = run(capsys, *base, "chat", "--thread", "1", "--json", f"Say {PLANTED} back to me.")
    assert code == 0
    assert run(capsys, *base, "compact", "1", "--no-model")[0] in (0, 1)
    assert list((data / "kv-cache").glob("1-*.kv"))

    words = [w.encode() for w in PLANTED.split()]

    def holders() -> list[str]:
        return sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.is_file()
                      and any(w in p.read_bytes() for w in words))

    assert "iris.db" in " ".join(holders())  # it was there to be found
    assert run(capsys, *base, "delete", "1")[0] == 2  # no terminal to ask: --yes is needed
    code, out, err = run(capsys, *base, "delete", "1", "--yes")
    assert code == 0 and "deleted thread 1" in out, err
    assert holders() == []
    assert not list((data / "kv-cache").glob("1-*.kv")) and list((data / "kv-cache").glob(f"{kept}-*.kv"))
    code, out, _ = run(capsys, *base, "threads", "--json", "--no-model")
    assert [t["id"] for t in json.loads(out)] == [kept]
    code, _, err = run(capsys, *base, "delete", "1", "--yes")
    assert code == 2 and "no thread 1" in err


def test_regenerate_edit_continue_and_a_branched_export_round_trip(capsys, tmp_path, model_path):
    """The CLI's branch operations on the real model: --regenerate evaluates at most the
    template tokens before the reply (counted), --continue goes on from a cut-off reply,
    --edit starts a branch; export writes every branch and import rebuilds the same tree."""
    data = tmp_path / "home"
    base = ["--data-dir", str(data), "--set", f"model.path={model_path}", "--set", "model.n_ctx=2048",
            "--set", "model.temperature=0"]
    code, out, err = run(capsys, *base, "--set", "model.max_tokens=5", "chat", "--json",
                         "Count from one to ten in words.")
    assert code == 0, err
    first = json.loads(out)
    assert first["finish_reason"] == "length"
    code, out, err = run(capsys, *base, "--set", "model.max_tokens=5", "chat", "--thread", "1",
                         "--continue", "--json")
    continued = json.loads(out)
    assert code == 0 and continued["reply"].startswith(first["reply"]), err
    assert len(continued["reply"]) > len(first["reply"])
    code, out, err = run(capsys, *base, "--set", "model.max_tokens=5", "chat", "--thread", "1",
                         "--regenerate", "--json")
    again = json.loads(out)
    assert code == 0, err
    assert again["prompt_tokens"] == first["prompt_tokens"] and again["evaluated_tokens"] <= 1
    code, out, err = run(capsys, *base, "--set", "model.max_tokens=5", "chat", "--thread", "1",
                         "--edit", "1", "--json", "Count from one to five in words.")
    assert code == 0, err
    code, exported, _ = run(capsys, *base, "export", "1")
    tree = json.loads(exported)
    assert tree["format"] == "iris-branches"
    nodes = [m["iris"] for m in tree["messages"]]
    # the question and its three replies (cut, continued, regenerated), the edit and its reply
    assert len(nodes) == 6 and sum(n["active"] for n in nodes) == 2
    assert [m["content"] for m in tree["messages"] if m["iris"]["active"]][0].startswith("Count from one to five")
    (tmp_path / "tree.json").write_text(exported)
    code, out, err = run(capsys, *base, "import", str(tmp_path / "tree.json"))
    assert code == 0 and out == "" and "1 chat was imported before (thread 1)" in err, err
    code, out, err = run(capsys, *base, "import", "--again", str(tmp_path / "tree.json"))
    assert code == 0, err
    copy = out.strip()
    code, again_exported, _ = run(capsys, *base, "export", copy)
    strip = lambda doc: [{k: v for k, v in m.items() if k != "iris"} | {
        "parent": None if m["iris"]["parent_id"] is None else
        [n["iris"]["id"] for n in doc["messages"]].index(m["iris"]["parent_id"]),
        "active": m["iris"]["active"]} for m in doc["messages"]]
    assert strip(json.loads(again_exported)) == strip(tree)
    code, out, _ = run(capsys, *base, "context", copy, "--json", "--no-model")
    states = json.loads(out)["messages"]
    assert len(states) == 2  # the active branch only
    code, _, err = run(capsys, *base, "chat", "--regenerate")
    assert code == 2 and "need --thread" in err
    # back to the first question's branch: its newest reply (the regenerated one) shows
    edited = next(m["iris"]["id"] for m in tree["messages"]
                  if m["iris"]["active"] and m["role"] == "user")
    code, out, err = run(capsys, *base, "switch", "1", str(edited), "previous")
    assert code == 0 and "‹ 1/2 ›" in out and "‹ 3/3 ›" in out, err
    first_question = tree["messages"][0]["iris"]["id"]
    assert run(capsys, *base, "switch", "1", str(first_question), "next")[0] == 0  # the edit again
    code, _, err = run(capsys, *base, "switch", "1", str(edited), "next")
    assert code == 2 and "is the last of its 2 alternatives" in err


def test_chat_shows_the_prompt_progress_on_a_terminals_stderr(tmp_path, model_path):
    """With stderr a terminal, ``chat`` rewrites one line as the model reads a long prompt
    (tokens read of the total, the percentage, then the time left); stdout stays the reply."""
    import os
    import pty

    note = " ".join(f"Line {i}: the figures for region {i % 7} were reviewed." for i in range(120))
    command = [sys.executable, "-m", "iris_desktop", "--data-dir", str(tmp_path / "home"),
               "--set", f"model.path={model_path}", "--set", "model.max_tokens=4",
               "--set", "model.temperature=0", "chat", note + " Say OK."]
    master, slave = pty.openpty()
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=slave, text=True,
                              timeout=600)
        os.close(slave)
        slave = -1
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    assert done.returncode == 0, seen.decode(errors="replace")
    lines = [part for part in seen.decode().replace("\x1b[K", "").split("\r") if part.strip()]
    reading = [line for line in lines if line.startswith("Reading the conversation… ")]
    assert len(reading) >= 2, lines  # more than one batch of 512 tokens, each reported
    assert re.search(r"of [\d,]+ tokens \(\d+%\), about [\d,]+ s left", "".join(reading))
    assert "Reading" not in done.stdout  # the progress never mixes with the reply


def test_self_test_asks_the_bundled_model_and_checks_the_code_highlighting(capsys, tmp_path,
                                                                         model_path, monkeypatch):
    """What the installers run after a build: the bundled model answers, the prediction is
    exact, and the Pygments lexers a frozen app loads by name are there."""
    from iris_desktop import selftest

    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    for name in (model_path.name, model_path.name + ".verified"):  # assembled before: reuse
        (data / "models" / name).symlink_to(model_path.parent / name)
    code, out, err = run(capsys, "--data-dir", str(data), "--self-test")
    assert code == 0, out + err
    assert "self-test ok" in out and "Paris" in out
    assert selftest.missing_lexers() == []
    monkeypatch.setattr(selftest, "LEXERS", ("python", "no-such-language"))
    assert selftest.missing_lexers() == ["no-such-language"]
    code, out, err = run(capsys, "--data-dir", str(data), "--self-test")
    assert code == 1 and "code highlighting lacks no-such-language" in out


def test_each_message_says_what_it_costs_in_the_request(capsys, tmp_path):
    """Before (an audit): `context --json` gave a pruned tool output its stored count
    (149 tokens) while the request held the 18-token placeholder, so the messages did not
    add up to `history_tokens` and disagreed with the inspector's rows."""
    data = str(tmp_path / "home")
    tools = next(p for p in AGENT_FILES if p.name.startswith("swe-i_got_id_demo"))
    code, out, err = run(capsys, "--data-dir", data, "import", str(tools))
    assert code == 0, err
    code, out, err = run(capsys, "--data-dir", data, "context", out.strip(), "--json", "--no-model")
    assert code == 0, err
    report = json.loads(out)
    rows = report["messages"]
    pruned = [m for m in rows if m["state"] == "pruned"]
    assert pruned and all(m["sent_tokens"] < m["tokens"] for m in pruned)
    assert all(m["sent_tokens"] == m["tokens"] for m in rows if m["state"] == "verbatim")
    assert all(m["sent_tokens"] == 0 for m in rows if m["state"] in ("summarized", "dropped"))
    # (a stored system message is sent as part of the system prompt, counted there)
    assert sum(m["sent_tokens"] for m in rows if m["role"] != "system") == report["history_tokens"]


def test_context_shows_the_request_as_text_and_a_refusal_as_json(capsys, tmp_path):
    """Before (an audit): `context --show-request` without --json printed no message of
    the request (its help promises them), and `context --json` on a chat too large gave
    scripts nothing on stdout (exit 3, stderr only)."""
    data = ["--data-dir", str(tmp_path / "home")]
    code, out, err = run(capsys, *data, "import", str(SYNTHETIC_CHAT))
    thread = out.strip()
    code, out, err = run(capsys, *data, "context", thread, "--no-model", "--show-request")
    assert code == 0, err
    request = out.split("\nrequest\n", 1)[1]
    newest = [m for m in load_corpus(SYNTHETIC_CHAT) if m["role"] == "user"][-1]
    assert "--- system" in request and "--- user" in request
    assert newest["content"].splitlines()[0] in request  # always sent
    code, out, err = run(capsys, *data, "--set", "context.window=512", "--set",
                         "chat.system_prompt=" + "word " * 1000, "context", thread, "--no-model",
                         "--json")
    assert code == 3 and "system prompt" in err
    refusal = json.loads(out)
    assert refusal["error"] == "too_large" and refusal["needed"] > refusal["allowed"] == 358


def test_a_reply_cut_off_at_max_tokens_is_said_with_how_to_go_on(capsys, tmp_path, monkeypatch):
    """Before: a reply that stopped at model.max_tokens or at the window's end was printed
    as if it were whole (an audit saw one end mid-sentence with nothing said)."""
    from support.fakes import ScriptedRuntime

    runtime = ScriptedRuntime(["one two three four five six", "seven eight"], cut_at_cap=True)
    monkeypatch.setattr("iris_desktop.host.load_runtime", lambda *a, **k: runtime)
    data = tmp_path / "data"
    code = main(["--data-dir", str(data), "--set", "model.max_tokens=3", "chat", "Count"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip() == "one two three"
    assert ("[cut off: the reply reached model.max_tokens (3 tokens); 'iris-desktop chat "
            "--thread 1 --continue' goes on with it]") in err
    code = main(["--data-dir", str(data), "chat", "--thread", "1", "--continue"])
    out, err = capsys.readouterr()
    assert code == 0 and "cut off" not in err  # finished this time


def test_cut_off_names_the_window_when_max_tokens_was_not_reached():
    from iris_desktop.core.views import cut_off
    from iris_desktop.generation import GenerationStats

    def stats(reason: str, completion: int) -> GenerationStats:
        return GenerationStats(1_000, 0, 1_000, completion, 0.1, 10.0, 1.0, reason)

    assert cut_off(stats("stop", 5), 1024) is None and cut_off(None, 1024) is None
    assert cut_off(stats("length", 1024), 1024) == "the reply reached model.max_tokens (1,024 tokens)"
    assert cut_off(stats("length", 684), 1024) == (
        "the reply filled the model's window (1,000 tokens of prompt and 684 of reply)")


def test_a_progress_line_after_the_reply_never_clears_its_last_line(monkeypatch):
    """Before (an audit): on a terminal, the cache warming up after a reply that compacted
    the chat wrote "\\r\\x1b[K…" over the reply's unfinished last line (a one-line reply
    vanished); and a progress line wider than the terminal left a stale row per update."""
    import io
    import os

    from iris_desktop.commands.chat import _ChatPrinter

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out, err = Tty(), Tty()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr("shutil.get_terminal_size", lambda *a: os.terminal_size((40, 24)))
    printer = _ChatPrinter(False)
    printer._out("Hello!")
    printer._progress_line("Warming up… 881 of 881 tokens (100%)", True)
    assert out.getvalue() == "Hello!\n"  # the line ended before the progress
    printer._progress_line("Summarizing earlier turns, part 1 of 2… 4% of all, about 109 s left", False)
    last = err.getvalue().rsplit("\r\x1b[K", 1)[1]
    assert len(last) <= 39 and last.endswith("…")
    to_file = io.StringIO()  # `chat … > reply.txt` on a terminal: the file gets the reply as is
    monkeypatch.setattr(sys, "stdout", to_file)
    printer = _ChatPrinter(False)
    printer._out("Hello!")
    printer._progress_line("Warming up…", True)
    assert to_file.getvalue() == "Hello!"


def test_threads_without_the_model_marks_its_counts_as_estimates(capsys, tmp_path):
    """An audit: `threads --no-model` printed 18,566 tokens where the model counts 17,674,
    unmarked; the window marks such numbers with ≈."""
    data = tmp_path / "data"
    assert main(["--data-dir", str(data), "import", str(SYNTHETIC_CHAT)]) == 0
    capsys.readouterr()
    assert main(["--data-dir", str(data), "threads", "--no-model"]) == 0
    out = capsys.readouterr().out
    assert " messages  ≈" in out and " tokens" in out


def test_the_markdown_export_keeps_its_structure_whatever_the_messages_hold(capsys, tmp_path):
    """An audit: a reply's "## User" line looked like a message boundary; a tool output
    or arguments holding ``` closed their fence early and what followed became headings;
    an attached file's unclosed fence swallowed the next message; the chat's own system
    prompt, a stopped reply and the existence of other branches were not said."""
    from iris_desktop.core.conversation import markdown_export
    from iris_desktop.core.store import Store

    data = tmp_path / "data"
    with Store(data / "iris.db") as store:
        thread = store.create_thread("Fences")
        store.set_system_prompt(thread, "Be terse.")
        store.add_messages(thread, [
            {"role": "user", "content": "Show me\n```python\nprint(1)\n"},  # left open
            {"role": "assistant", "content": "Sure.\n## User\n# not a heading", "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "bash", "arguments": '{"cmd": "echo ```"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "name": "bash",
             "content": "```\n# after fence\n````"},
            {"role": "assistant", "content": "Stopped here", "status": "interrupted"},
        ])
        text = markdown_export(store, thread)
    headings, fence = [], None  # as a CommonMark reader sees them: outside code blocks
    for line in text.splitlines():
        run = re.match(r"`{3,}", line)
        if fence is None and run:
            fence = run.group(0)
        elif fence is not None and line.strip() == "`" * len(line.strip()) and len(line.strip()) >= len(fence):
            fence = None
        elif fence is None and line.startswith("#"):
            headings.append(line)
    assert headings == ["# Fences", "## System prompt (this chat's own)", "## User", "## Assistant",
                        "## Tool (bash)", "## Assistant (stopped)"], headings
    assert "\\## User" in text and "\\# not a heading" in text and "Be terse." in text
    assert "`````\n```\n# after fence\n````\n`````" in text  # a fence longer than any run inside


def test_a_reply_being_written_is_exported_as_stopped(capsys, tmp_path):
    """An audit: an export while a reply was being written saved it unmarked, and an
    import of that file stored it complete (no Continue)."""
    from iris_desktop.core.conversation import export_messages, markdown_export
    from iris_desktop.core.store import Store

    with Store(tmp_path / "iris.db") as store:
        thread = store.create_thread("Writing")
        store.add_messages(thread, [{"role": "user", "content": "Tell me a story."}])
        store.add_message(thread, {"role": "assistant", "content": "Once upon"}, status="streaming")
        assert export_messages(store, thread)["messages"][-1]["status"] == "interrupted"
        assert "## Assistant (stopped)" in markdown_export(store, thread)


def test_threads_says_a_branched_chats_shown_branch_and_switch_prints_from_the_switch_on(
        capsys, tmp_path):
    """Before (an audit): `threads` gave "3902 messages" for a chat whose branch on screen
    held 2,500, and `switch` printed the whole new branch, 1,500 lines for a long chat.
    Now the listing says how many are on the branch shown, and `switch` prints from the
    alternative switched to on, at most 40 lines, and says what is left out."""
    from iris_desktop.core.store import Store

    data = tmp_path / "data"
    base = ("--data-dir", str(data))
    assert run(capsys, *base, "threads", "--no-model")[0] == 0  # makes the history
    with Store(data / "iris.db") as store:
        thread = store.create_thread("long")
        ids = store.add_messages(thread, [m for i in range(100) for m in (
            {"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"})])
        again = store.add_message(thread, {"role": "assistant", "content": "a9 again"},
                                  parent_id=ids[18])
        store.add_messages(thread, [{"role": "user", "content": "more"},
                                    {"role": "assistant", "content": "ok"}])
    code, out, err = run(capsys, *base, "threads", "--no-model")
    assert code == 0 and "203 messages" in out and "(branches: 22 of them on the one shown)" in out, err
    code, out, _ = run(capsys, *base, "threads", "--no-model", "--json")
    assert json.loads(out)[0]["branch_messages"] == 22 and json.loads(out)[0]["messages"] == 203
    code, out, err = run(capsys, *base, "switch", str(thread), str(ids[19]), "next")
    lines = out.splitlines()
    assert code == 0 and "a9 again" in lines[0] and "‹ 2/2 ›" in lines[0], out
    assert len(lines) == 3 and "ok" in lines[-1]
    code, out, err = run(capsys, *base, "switch", str(thread), str(again), "previous")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[0] == str(ids[19]) and "‹ 1/2 ›" in lines[0], out
    assert len(lines) == 41 and "141 more messages on this branch" in lines[-1]
    assert f"iris-desktop export {thread}" in lines[-1]


def test_chat_without_a_terminal_says_nobody_could_approve_a_command(capsys):
    """Before (an audit): with standard input not a terminal, every command was refused
    without asking and stored as "the user refused to run", and stderr said only
    "[tool run_shell: error]". Now the result says nobody could be asked and how to
    allow it, and the CLI prints a failed tool's reason."""
    from argparse import Namespace

    from iris_desktop.commands.chat import _ChatPrinter, _shell_confirmation
    from iris_desktop.core.events import ToolFinished
    from iris_desktop.core.tools import ToolError

    confirm = _shell_confirmation(Namespace(yes_shell=False))  # pytest's stdin: no terminal
    with pytest.raises(ToolError, match="nobody could be asked .* 'chat --yes-shell'"):
        confirm("env")
    printer = _ChatPrinter(False, 100)
    printer.on_tool(ToolFinished(1, 2, "run_shell", "{}", False, "error: nobody could be asked "
                                 "to approve it", "call_1"))
    assert "[tool run_shell: error: nobody could be asked to approve it]" in capsys.readouterr().err


def test_a_killed_whole_file_write_in_the_data_folder_is_cleaned_at_the_next_start(capsys,
                                                                                   tmp_path):
    """An audit: `config set` killed before its rename left `.config.toml.<pid>-<hex>
    .iris-tmp` in the data folder for good (a copy of the settings; an export's, a copy of
    a chat). The next start removes what no live writer holds."""
    data = tmp_path / "data"
    assert run(capsys, "--data-dir", str(data), "config", "set", "ui.theme", "dark")[0] == 0
    left = data / ".config.toml.4242-0badc0de.iris-tmp"
    left.write_text('[ui]\ntheme = "light"\n')
    code, _, err = run(capsys, "--data-dir", str(data), "threads", "--no-model")
    assert code == 0, err
    assert not left.exists()
