"""Sandboxed tools: path confinement, file tools, shell gating, argument checking."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iris_desktop.core.tools import TOOL_NAMES, Sandbox, ToolError, ToolResult, limits

from support.helpers import tool_ok, tool_refused

SECRET = "TOPSECRET-do-not-leak"


def _symlink(link: Path, target: Path) -> None:
    try:
        link.symlink_to(target, target_is_directory=target.is_dir())
    except (OSError, NotImplementedError):
        pytest.skip(reason="symlinks are not available here")


def _build_tree(base: Path) -> tuple[Path, Path]:
    root = base / "root"
    outside = base / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text(f"{SECRET}\n", encoding="utf-8")
    (root / "notes.txt").write_text("hello\nworld\nneedle here\n", encoding="utf-8")
    (root / "sub" / "deep.txt").write_text("nothing\nanother needle\n", encoding="utf-8")
    (root / "ten.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)), encoding="utf-8")
    return root, outside


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    return _build_tree(tmp_path)


@pytest.fixture
def root(tree: tuple[Path, Path]) -> Path:
    return tree[0]


@pytest.fixture
def outside(tree: tuple[Path, Path]) -> Path:
    return tree[1]


@pytest.fixture
def box(root: Path) -> Sandbox:
    return Sandbox([root])


# --- read_file -------------------------------------------------------------------------


def test_read_file_relative_numbers_lines_and_counts_them(box: Sandbox) -> None:
    content = tool_ok(box.run("read_file", {"path": "notes.txt"}))
    assert "lines 1-3 of 3" in content
    assert "     1\thello" in content
    assert "     3\tneedle here" in content


def test_read_file_absolute_path_inside_root(box: Sandbox, root: Path) -> None:
    content = tool_ok(box.run("read_file", {"path": str(root / "sub" / "deep.txt")}))
    assert "another needle" in content
    assert "sub/deep.txt" in content


def test_read_file_offset_and_limit(box: Sandbox) -> None:
    content = tool_ok(box.run("read_file", {"path": "ten.txt", "offset": 2, "limit": 3}))
    assert "lines 3-5 of 10" in content
    assert "offset=5" in content  # tells the model how to continue
    shown = [line for line in content.splitlines() if "\t" in line]
    assert shown == ["     3\tline 3", "     4\tline 4", "     5\tline 5"]


def test_read_file_offset_past_end(box: Sandbox) -> None:
    content = tool_ok(box.run("read_file", {"path": "ten.txt", "offset": 50}))
    assert "10 lines" in content
    assert "past the end" in content


def test_read_file_empty_file_and_crlf(box: Sandbox, root: Path) -> None:
    (root / "empty.txt").write_bytes(b"")
    assert "0 lines" in tool_ok(box.run("read_file", {"path": "empty.txt"}))
    (root / "dos.txt").write_bytes(b"\xef\xbb\xbfone\r\ntwo\r\n")
    content = tool_ok(box.run("read_file", {"path": "dos.txt"}))
    assert "     1\tone\n     2\ttwo" in content
    assert "\r" not in content and "\ufeff" not in content


def test_read_file_binary_is_reported_not_decoded(box: Sandbox, root: Path) -> None:
    data = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))
    (root / "image.png").write_bytes(data)
    content = tool_ok(box.run("read_file", {"path": "image.png"}))
    assert content == f"image.png is a binary file ({len(data)} bytes); not shown"


def test_read_file_latin1_is_reported_not_decoded(box: Sandbox, root: Path) -> None:
    data = "café au lait\nnaïve\n".encode("latin-1")
    (root / "latin.txt").write_bytes(data)
    content = tool_ok(box.run("read_file", {"path": "latin.txt"}))
    assert content.startswith(f"latin.txt is a binary file ({len(data)} bytes")
    assert "not valid UTF-8" in content
    assert "caf" not in content and "\ufffd" not in content


def test_read_file_missing_and_folder(box: Sandbox) -> None:
    assert "does not exist" in tool_refused(box.run("read_file", {"path": "nope.txt"}))
    assert "list_directory" in tool_refused(box.run("read_file", {"path": "sub"}))


# --- confinement -----------------------------------------------------------------------


def test_dotdot_traversal_is_refused(box: Sandbox, root: Path) -> None:
    content = tool_refused(box.run("read_file", {"path": "../outside/secret.txt"}))
    assert "../outside/secret.txt" in content
    assert str(root) in content
    assert "outside the allowed folders" in content
    assert SECRET not in content


def test_dotdot_that_comes_back_inside_is_fine(box: Sandbox) -> None:
    assert "hello" in tool_ok(box.run("read_file", {"path": "sub/../notes.txt"}))
    assert "hello" in tool_ok(box.run("read_file", {"path": "../root/notes.txt"}))


def test_absolute_path_outside_is_refused(box: Sandbox, outside: Path) -> None:
    for path in ("/etc/passwd", str(outside / "secret.txt"), str(outside)):
        for name in ("read_file", "list_directory", "search_files"):
            args = {"path": path} if name != "search_files" else {"pattern": ".", "path": path}
            content = tool_refused(box.run(name, args))
            assert "outside the allowed folders" in content
            assert SECRET not in content and "root:" not in content


def test_symlinked_file_pointing_out_is_refused(box: Sandbox, root: Path, outside: Path) -> None:
    _symlink(root / "innocent.txt", outside / "secret.txt")
    content = tool_refused(box.run("read_file", {"path": "innocent.txt"}))
    assert "outside the allowed folders" in content
    assert SECRET not in content


def test_symlinked_folder_pointing_out(box: Sandbox, root: Path, outside: Path) -> None:
    _symlink(root / "linkdir", outside)
    _symlink(root / "sub" / "leak.txt", outside / "secret.txt")
    assert SECRET not in tool_refused(box.run("read_file", {"path": "linkdir/secret.txt"}))
    tool_refused(box.run("list_directory", {"path": "linkdir"}))
    tool_refused(box.run("search_files", {"pattern": "TOP", "path": "linkdir"}))

    # Recursion from inside the root must not wander through either link.
    content = tool_ok(box.run("search_files", {"pattern": "TOPSECRET"}))
    assert content.startswith("0 matches")
    assert SECRET not in content

    listing = tool_ok(box.run("list_directory", {"path": "."}))
    assert "linkdir -> (link outside the allowed folders)" in listing
    assert "secret" not in listing


def test_symlink_inside_root_is_allowed(box: Sandbox, root: Path) -> None:
    _symlink(root / "alias.txt", root / "notes.txt")
    assert "hello" in tool_ok(box.run("read_file", {"path": "alias.txt"}))
    content = tool_ok(box.run("search_files", {"pattern": "needle here"}))
    assert "alias.txt:3: needle here" in content
    assert "notes.txt:3: needle here" in content


def test_second_root_is_reachable_by_absolute_path(root: Path, outside: Path) -> None:
    box = Sandbox([root, outside])
    content = tool_ok(box.run("read_file", {"path": str(outside / "secret.txt")}))
    assert SECRET in content
    assert str(outside / "secret.txt") in content  # shown absolute: not under the first root


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.sampled_from(["..", ".", "sub", "root", "outside", "secret.txt", "notes.txt", ""]),
        min_size=1,
        max_size=6,
    ),
    st.booleans(),
)
def test_no_path_reaches_outside(
    tmp_path_factory: pytest.TempPathFactory, parts: list[str], absolute: bool
) -> None:
    base = tmp_path_factory.getbasetemp() / "prop"
    if not base.exists():
        _build_tree(base)
    box = Sandbox([base / "root"])
    path = "/".join(parts)
    if absolute:
        path = str(base / "root") + "/" + path
    for name, args in (
        ("read_file", {"path": path}),
        ("list_directory", {"path": path}),
        ("search_files", {"pattern": "TOP", "path": path}),
    ):
        result = box.run(name, args)
        assert SECRET not in result.content
        assert "secret.txt" not in result.content or not result.ok


# --- list_directory --------------------------------------------------------------------


def test_list_directory_sorted_with_sizes(box: Sandbox, root: Path) -> None:
    (root / "B.txt").write_text("12345", encoding="utf-8")
    (root / "a_dir").mkdir()
    content = tool_ok(box.run("list_directory", {"path": "."}))
    assert content.splitlines() == [
        f"{root}: 5 entries",
        "a_dir/",
        "B.txt (5 bytes)",
        "notes.txt (24 bytes)",
        "sub/",
        "ten.txt (71 bytes)",
    ]


def test_list_directory_defaults_to_first_root_and_subfolders(box: Sandbox) -> None:
    assert "notes.txt" in tool_ok(box.run("list_directory", {}))
    content = tool_ok(box.run("list_directory", {"path": "sub"}))
    assert content.splitlines() == ["sub: 1 entry", "deep.txt (23 bytes)"]


def test_list_directory_errors(box: Sandbox, root: Path) -> None:
    assert "does not exist" in tool_refused(box.run("list_directory", {"path": "missing"}))
    assert "read_file" in tool_refused(box.run("list_directory", {"path": "notes.txt"}))
    (root / "void").mkdir()
    assert tool_ok(box.run("list_directory", {"path": "void"})) == "void: empty folder"


# --- search_files ----------------------------------------------------------------------


def test_search_files_regex_relpaths_and_line_numbers(box: Sandbox) -> None:
    content = tool_ok(box.run("search_files", {"pattern": r"need\w+", "path": "."}))
    lines = content.splitlines()
    assert lines[0].startswith("2 matches")
    assert "notes.txt:3: needle here" in lines
    assert "sub/deep.txt:2: another needle" in lines


def test_search_files_in_subfolder_and_single_file(box: Sandbox) -> None:
    assert "sub/deep.txt:2:" in tool_ok(box.run("search_files", {"pattern": "needle", "path": "sub"}))
    content = tool_ok(box.run("search_files", {"pattern": "world", "path": "notes.txt"}))
    assert "notes.txt:2: world" in content


def test_search_files_invalid_regex_falls_back_to_literal(box: Sandbox, root: Path) -> None:
    (root / "code.py").write_text("x = call(\n", encoding="utf-8")
    content = tool_ok(box.run("search_files", {"pattern": "call("}))
    assert "literal" in content
    assert "code.py:1: x = call(" in content


def test_search_files_skips_binary_and_non_utf8(box: Sandbox, root: Path) -> None:
    (root / "blob.bin").write_bytes(b"needle\x00\x01\x02")
    (root / "latin.txt").write_bytes("needle café\n".encode("latin-1"))
    content = tool_ok(box.run("search_files", {"pattern": "needle"}))
    assert "blob.bin" not in content and "latin.txt" not in content
    assert "[skipped 2 binary or non-UTF-8 files]" in content


def test_search_files_caps_matches(box: Sandbox, root: Path) -> None:
    (root / "many.txt").write_text("hit\n" * 300, encoding="utf-8")
    content = tool_ok(box.run("search_files", {"pattern": "hit", "path": "many.txt"}))
    assert content.count("many.txt:") == limits.MAX_SEARCH_MATCHES
    assert f"stopped after {limits.MAX_SEARCH_MATCHES} matches" in content


def test_search_files_skips_vcs_folders(box: Sandbox, root: Path) -> None:
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("needle\n", encoding="utf-8")
    assert ".git" not in tool_ok(box.run("search_files", {"pattern": "needle"}))


# --- output cap ------------------------------------------------------------------------


def test_output_is_capped_with_marker(
    box: Sandbox, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "MAX_OUTPUT_BYTES", 100)
    (root / "wide.txt").write_text("é" * 500 + "\n", encoding="utf-8")
    content = tool_ok(box.run("read_file", {"path": "wide.txt"}))
    body, marker = content.rsplit("\n", 1)
    assert marker.startswith("[output truncated at 100 bytes of ")
    assert len(body.split("\n", 1)[1].encode()) <= 100


# --- run_shell -------------------------------------------------------------------------


def _shell_box(root: Path, **kwargs: object) -> Sandbox:
    return Sandbox([root], enabled=TOOL_NAMES, **kwargs)  # type: ignore[arg-type]


def test_shell_disabled_by_default(root: Path) -> None:
    for box in (Sandbox([root]), _shell_box(root)):
        content = tool_refused(box.run("run_shell", {"command": "echo hi > marker.txt"}))
        assert content == "error: run_shell is disabled (tools.shell = false)"
    assert not (root / "marker.txt").exists()


def test_shell_enabled_but_not_in_enabled_tools(root: Path) -> None:
    box = Sandbox([root], shell=True, confirm_shell=lambda _: True)
    assert "not enabled" in tool_refused(box.run("run_shell", {"command": "echo hi"}))


def test_shell_without_confirmation_callback_refuses(root: Path) -> None:
    box = _shell_box(root, shell=True, confirm_shell=None)
    content = tool_refused(box.run("run_shell", {"command": "echo hi > marker.txt"}))
    # nobody was asked: said as that, not as the user's refusal (an audit)
    assert content == ("error: nobody could be asked to approve it, so it did not run: "
                       "echo hi > marker.txt")
    assert not (root / "marker.txt").exists()


def test_shell_whose_question_could_not_be_answered_says_why(root: Path) -> None:
    from iris_desktop.core.tools import ToolError

    def closed(_command: str) -> bool:
        raise ToolError("Iris was closed before the question was answered, so it did not run: x")

    box = _shell_box(root, shell=True, confirm_shell=closed)
    content = tool_refused(box.run("run_shell", {"command": "touch RAN"}))
    assert "Iris was closed before the question was answered" in content
    assert "refused" not in content and not (root / "RAN").exists()


def test_a_command_never_sees_the_hubs_token(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    box = _shell_box(root, shell=True, confirm_shell=lambda _: True)
    assert "hf_secret_value" not in tool_ok(box.run("run_shell", {"command": "env"}))


def test_shell_refused_by_user(root: Path) -> None:
    asked: list[str] = []

    def confirm(command: str) -> bool:
        asked.append(command)
        return False

    box = _shell_box(root, shell=True, confirm_shell=confirm)
    content = tool_refused(box.run("run_shell", {"command": "echo hi > marker.txt"}))
    assert "the user refused to run: echo hi > marker.txt" in content
    assert asked == ["echo hi > marker.txt"]
    assert not (root / "marker.txt").exists()


def test_shell_confirmed_runs_in_first_root(root: Path) -> None:
    asked: list[str] = []
    box = _shell_box(root, shell=True, confirm_shell=lambda c: asked.append(c) or True)
    content = tool_ok(box.run("run_shell", {"command": "echo hi > marker.txt && echo done"}))
    assert asked == ["echo hi > marker.txt && echo done"]
    assert (root / "marker.txt").exists()  # cwd was the first root
    assert content.splitlines()[:3] == ["exit code: 0", "stdout:", "done"]


def test_a_command_never_sees_the_history_passphrase(root: Path, monkeypatch) -> None:
    """Before, an approved ``env`` put IRIS_STORAGE_PASSPHRASE into its result: sent to
    the model (a server, with model.backend openai), stored in the history and exported
    as plain text. The command gets the rest of the environment."""
    monkeypatch.setenv("IRIS_STORAGE_PASSPHRASE", "my-secret-passphrase-QQ17")
    monkeypatch.setenv("IRIS_SOMETHING_ELSE", "kept")
    box = _shell_box(root, shell=True, confirm_shell=lambda _: True)
    command = f'"{sys.executable}" -c "import os; print(sorted(os.environ))"'
    content = tool_ok(box.run("run_shell", {"command": command}))
    assert "IRIS_SOMETHING_ELSE" in content and "PATH" in content
    assert "IRIS_STORAGE_PASSPHRASE" not in content and "QQ17" not in content
    assert os.environ["IRIS_STORAGE_PASSPHRASE"] == "my-secret-passphrase-QQ17"  # Iris keeps it


def test_shell_reports_exit_code_and_stderr(root: Path) -> None:
    box = _shell_box(root, shell=True, confirm_shell=lambda _: True)
    command = f'"{sys.executable}" -c "import sys; print(1); sys.exit(3)" 1>&2'
    content = tool_ok(box.run("run_shell", {"command": command}))
    assert content.splitlines() == ["exit code: 3", "stderr:", "1"]


@pytest.mark.skipif(os.name != "posix", reason="uses sleep and process groups")
def test_shell_timeout_kills_the_whole_command(root: Path) -> None:
    box = _shell_box(root, shell=True, confirm_shell=lambda _: True, shell_timeout_s=0.5)
    started = time.monotonic()
    # The shell forks sleep; killing only the shell would leave the pipe open for 30 s.
    content = tool_refused(box.run("run_shell", {"command": "echo early; sleep 30; echo late"}))
    assert time.monotonic() - started < 10
    assert "timed out after 0.5 s" in content
    assert content.split("\n", 1)[1] == "stdout:\nearly"  # partial output kept


@pytest.mark.skipif(os.name != "posix", reason="uses sleep and process groups")
def test_stop_ends_a_running_command_and_everything_it_started(root: Path) -> None:
    """Before (an audit): Stop waited for ``sleep 20; touch M`` to finish (the marker was
    made, the result "ok"), and a second Ctrl+C left it running as an orphan."""
    box = _shell_box(root, shell=True, confirm_shell=lambda _: True)
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    started = time.monotonic()
    content = tool_refused(box.run("run_shell", {"command": "echo early; sleep 20; touch M"},
                                   cancel=cancel))
    assert time.monotonic() - started < 5
    assert content.startswith("error: stopped by the user before it finished")
    assert "stdout:\nearly" in content
    time.sleep(0.3)
    assert not (root / "M").exists()
    # Stop pressed while the question was open: the command does not start
    cancel = threading.Event()
    asked = _shell_box(root, shell=True, confirm_shell=lambda _: cancel.set() or True)
    assert "stopped by the user" in tool_refused(asked.run("run_shell", {"command": "touch N"},
                                                           cancel=cancel))
    assert not (root / "N").exists()


@pytest.mark.skipif(os.name != "posix", reason="uses sleep and process groups")
def test_an_interrupt_never_leaves_a_command_running(root: Path, monkeypatch) -> None:
    from iris_desktop.core.tools import shell

    def interrupted(self, timeout=None):  # Ctrl+C while the command runs
        raise KeyboardInterrupt

    monkeypatch.setattr(shell._Drain, "join", interrupted)
    with pytest.raises(KeyboardInterrupt):
        shell.run_shell("sleep 1; touch M", root, 30)
    monkeypatch.undo()
    time.sleep(1.5)
    assert not (root / "M").exists()


def test_a_flood_of_output_is_read_in_bounded_memory_and_keeps_the_error(root: Path) -> None:
    """Before (an audit): all of a command's output was held and then capped: 1.5 GB of
    output took 7.5 GB of memory; once stdout filled the cap, stderr was dropped."""
    import tracemalloc

    box = _shell_box(root, shell=True, confirm_shell=lambda _: True)
    command = (f'"{sys.executable}" -c "import sys; sys.stdout.write(\'x\' * (64 << 20)); '
               'sys.stdout.flush(); sys.stderr.write(\'the real error\')"')
    tracemalloc.start()
    try:
        content = tool_ok(box.run("run_shell", {"command": command}))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # 64 MiB written; the cap is 1 MiB
    assert f"bytes of {64 << 20}]" in content
    assert content.endswith("stderr:\nthe real error")
    assert len(content.encode()) <= limits.MAX_OUTPUT_BYTES


# --- dispatch and arguments ------------------------------------------------------------


def test_unknown_tool_lists_known_tools(box: Sandbox) -> None:
    content = tool_refused(box.run("delete_everything", {}))
    assert "delete_everything" in content
    for name in TOOL_NAMES:
        assert name in content


def test_disabled_tool_is_refused(root: Path) -> None:
    box = Sandbox([root], enabled=("read_file",))
    content = tool_refused(box.run("search_files", {"pattern": "x"}))
    assert content == "error: tool search_files is not enabled"


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({}, "missing required argument 'path'"),
        ({"path": 3}, "'path' must be a string, got number"),
        ({"path": "notes.txt", "offset": "2"}, "'offset' must be an integer, got string"),
        ({"path": "notes.txt", "offset": True}, "'offset' must be an integer, got boolean"),
        ({"path": "notes.txt", "offset": -1}, "'offset' must be >= 0"),
        ({"path": "notes.txt", "limit": 0}, "'limit' must be >= 1"),
        ({"path": "notes.txt", "lines": 5}, "unknown argument 'lines'"),
        ('{"path": "notes.txt"', "arguments are not valid JSON"),
        ("[1, 2]", "arguments must be a JSON object, got array"),
        (42, "arguments must be a JSON object, got number"),
    ],
)
def test_bad_arguments_explain_the_parameters(
    box: Sandbox, arguments: object, problem: str
) -> None:
    content = tool_refused(box.run("read_file", arguments))  # type: ignore[arg-type]
    assert problem in content
    assert "expected read_file(path (string, required), offset (integer, >= 0" in content


def test_arguments_as_json_text_and_nulls(box: Sandbox) -> None:
    assert "hello" in tool_ok(box.run("read_file", json.dumps({"path": "notes.txt"})))
    assert "hello" in tool_ok(box.run("read_file", {"path": "notes.txt", "offset": None}))
    assert "notes.txt" in tool_ok(box.run("list_directory", ""))


def test_run_never_raises(box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not box.run(None, {}).ok  # type: ignore[arg-type]

    def explode(*_: object, **__: object) -> str:
        raise RuntimeError("boom")

    monkeypatch.setattr(Sandbox, "_tool_read_file", explode)
    result = box.run("read_file", {"path": "notes.txt"})
    assert result == ToolResult(False, "error: read_file failed: RuntimeError: boom")
    assert issubclass(ToolError, Exception)


# --- roots and definitions ---------------------------------------------------------------


def test_no_allowed_roots(tmp_path: Path) -> None:
    for box in (Sandbox([]), Sandbox([tmp_path / "missing"])):
        assert box.roots == []
        assert box.definitions() == []
        for name, args in (
            ("read_file", {"path": "x"}),
            ("list_directory", {"path": "."}),
            ("search_files", {"pattern": "x"}),
        ):
            content = tool_refused(box.run(name, args))
            assert content == "error: no folders are allowed yet; add one in tools.allowed_paths"


def test_roots_are_resolved_deduplicated_and_live(tmp_path: Path, root: Path) -> None:
    later = tmp_path / "later"
    box = Sandbox([root, str(root / "sub" / ".."), later, root / "notes.txt"])
    assert box.roots == [root.resolve()]
    later.mkdir()
    assert box.roots == [root.resolve(), later.resolve()]


def _names(box: Sandbox) -> list[str]:
    return [d["function"]["name"] for d in box.definitions()]


def test_definitions_depend_on_settings(root: Path) -> None:
    assert _names(Sandbox([root])) == ["read_file", "list_directory", "search_files"]
    assert _names(Sandbox([root], enabled=("search_files",))) == ["search_files"]
    assert _names(Sandbox([root], enabled=TOOL_NAMES)) == [
        "read_file",
        "list_directory",
        "search_files",
    ]
    assert _names(Sandbox([root], shell=True)) == ["read_file", "list_directory", "search_files"]
    assert _names(Sandbox([root], enabled=TOOL_NAMES, shell=True)) == list(TOOL_NAMES)
    assert _names(Sandbox([], enabled=TOOL_NAMES, shell=True)) == ["run_shell"]
    assert _names(Sandbox([root], enabled=("nonsense",))) == []


def test_definition_shape(root: Path) -> None:
    definitions = Sandbox([root], enabled=TOOL_NAMES, shell=True).definitions()
    json.dumps(definitions)  # serializable as-is
    read = definitions[0]
    assert read["type"] == "function"
    function = read["function"]
    assert str(root.resolve()) in function["description"]
    params = function["parameters"]
    assert params["type"] == "object"
    assert params["required"] == ["path"]
    assert params["properties"]["offset"]["type"] == "integer"
    assert params["properties"]["limit"]["default"] == 200
    shell = definitions[-1]["function"]
    assert shell["parameters"]["required"] == ["command"]


# --- offline ---------------------------------------------------------------------------


def test_file_tools_work_with_network_blocked(
    box: Sandbox, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_network(*_: object, **__: object) -> None:
        raise AssertionError("a tool tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    assert "hello" in tool_ok(box.run("read_file", {"path": "notes.txt"}))
    assert "sub/" in tool_ok(box.run("list_directory", {"path": "."}))
    assert "needle" in tool_ok(box.run("search_files", {"pattern": "needle"}))
    assert len(box.definitions()) == 3


def test_absurdly_nested_arguments_are_refused(box: Sandbox) -> None:
    content = tool_refused(box.run("read_file", "[" * 100_000))
    assert "bad arguments for read_file" in content


def test_a_read_stopped_by_the_output_cap_says_where_to_go_on(
    box: Sandbox, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before (an audit): a 40,000-line file read at once was cut by the 1 MiB cap at line
    18,591 under a header saying "lines 1-40000 of 40000", with no offset to go on from.
    The read ends at the last whole line that fits, and the header gives the offset."""
    monkeypatch.setattr(limits, "MAX_OUTPUT_BYTES", 1000)
    (root / "long.txt").write_text("".join(f"line number {i}\n" for i in range(1, 401)),
                                   encoding="utf-8")
    content = tool_ok(box.run("read_file", {"path": "long.txt", "limit": 400}))
    header, body = content.split("\n", 1)
    last = int(body.rstrip("\n").rsplit("\n", 1)[1].split("\t")[0])
    assert 30 < last < 400 and "[output truncated" not in body
    assert header.startswith(f"long.txt: lines 1-{last} ") and f"continue with offset={last}" in header
    again = tool_ok(box.run("read_file", {"path": "long.txt", "offset": last, "limit": 400}))
    assert again.split("\n", 2)[1].split("\t") == [f"{last + 1:>6}", f"line number {last + 1}"]
