"""Parsing tool calls out of raw model text, and the tools system prompt."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from iris_desktop.core.toolcalls import ParsedReply, ToolCall, parse_tool_calls, tools_system_prompt
from iris_desktop.core.tools import TOOL_NAMES, Sandbox

KNOWN = ("read_file", "list_directory", "search_files")


def _call(reply: ParsedReply, index: int = 0) -> tuple[str, dict | None]:
    call = reply.calls[index]
    return call.name, call.arguments


# --- Hermes / Qwen ---------------------------------------------------------------------


def test_hermes_single_call() -> None:
    reply = parse_tool_calls(
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>'
    )
    assert reply.content == ""
    assert reply.calls == [ToolCall("call_1", "read_file", {"path": "a.txt"})]


def test_hermes_multiple_calls_and_surrounding_text() -> None:
    text = (
        "Let me look at both files.\n"
        '<tool_call>{"name": "read_file", "arguments": {"path": "a.txt"}}</tool_call>\n'
        '<tool_call>{"name": "read_file", "arguments": {"path": "b.txt", "limit": 5}}</tool_call>\n'
        "Back soon."
    )
    reply = parse_tool_calls(text)
    assert reply.content == "Let me look at both files.\nBack soon."
    assert [c.id for c in reply.calls] == ["call_1", "call_2"]
    assert _call(reply, 1) == ("read_file", {"path": "b.txt", "limit": 5})
    assert all(c.error is None for c in reply.calls)


def test_hermes_missing_closing_tag_parameters_and_string_arguments() -> None:
    reply = parse_tool_calls(
        '<tool_call>{"name": "list_directory", "parameters": {"path": "."}}\n'
        '<tool_call>{"name": "read_file", "arguments": "{\\"path\\": \\"x\\"}"}'
    )
    assert _call(reply, 0) == ("list_directory", {"path": "."})
    assert _call(reply, 1) == ("read_file", {"path": "x"})
    assert reply.content == ""


def test_hermes_tolerates_fences_openai_shape_and_stray_brace() -> None:
    reply = parse_tool_calls(
        '<tool_call>```json\n{"name": "search_files", "arguments": {"pattern": "x"}}\n```'
        "</tool_call>"
        '<tool_call>{"type": "function", "function": {"name": "list_directory", '
        '"arguments": "{}"}}</tool_call>'
        '<tool_call>{"name": "read_file", "arguments": {"path": "y"}}}</tool_call>'
    )
    assert [(c.name, c.arguments, c.error) for c in reply.calls] == [
        ("search_files", {"pattern": "x"}, None),
        ("list_directory", {}, None),
        ("read_file", {"path": "y"}, None),
    ]


def test_hermes_malformed_calls_become_errors() -> None:
    reply = parse_tool_calls(
        "Trying.\n"
        '<tool_call>{"name": "read_file", "arguments": {"path": "a.txt"</tool_call>\n'
        '<tool_call>{"arguments": {"path": "a.txt"}}</tool_call>\n'
        '<tool_call>{"name": "read_file", "arguments": ["a.txt"]}</tool_call>\n'
        '<tool_call>{"name": "read_file", "arguments": "not json"}</tool_call>\n'
        "<tool_call></tool_call>\n"
        "<tool_call>[1]</tool_call>"
    )
    assert reply.content == "Trying."
    assert len(reply.calls) == 6
    assert all(c.arguments is None and c.error for c in reply.calls)
    bad_json, no_name, not_object, bad_string, empty, not_dict = reply.calls
    assert bad_json.name == "read_file"  # salvaged so the error is about that tool
    assert "invalid JSON" in bad_json.error
    assert "name" in no_name.error
    assert "must be a JSON object" in not_object.error
    assert "not valid JSON" in bad_string.error
    assert "empty" in empty.error
    assert "JSON object" in not_dict.error
    assert len({c.id for c in reply.calls}) == 6


def test_hermes_unknown_tool_is_still_a_call() -> None:
    reply = parse_tool_calls(
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', known_tools=KNOWN
    )
    assert _call(reply) == ("rm_rf", {})  # the sandbox answers with the known tools


# --- Llama 3 bare JSON -----------------------------------------------------------------


def test_llama_bare_json_call() -> None:
    reply = parse_tool_calls(
        '  {"name": "read_file", "parameters": {"path": "notes.txt"}}\n', known_tools=KNOWN
    )
    assert reply.content == ""
    assert reply.calls == [ToolCall("call_1", "read_file", {"path": "notes.txt"})]


def test_llama_variants_fence_list_type_and_python_tag() -> None:
    fenced = parse_tool_calls('```json\n{"name": "list_directory", "parameters": {}}\n```')
    assert _call(fenced) == ("list_directory", {})

    listed = parse_tool_calls(
        '[{"name": "read_file", "arguments": {"path": "a"}},'
        ' {"type": "function", "name": "read_file", "parameters": {"path": "b"}}]'
    )
    assert [c.arguments for c in listed.calls] == [{"path": "a"}, {"path": "b"}]

    tagged = parse_tool_calls(
        '<|python_tag|>{"name": "search_files", "parameters": {"pattern": "x"}}; '
        '{"name": "list_directory", "parameters": {}}'
    )
    assert [c.name for c in tagged.calls] == ["search_files", "list_directory"]


def test_plain_json_answers_are_not_calls() -> None:
    for text in (
        '{"name": "Alice", "age": 30}',
        '{"answer": 42}',
        "[1, 2, 3]",
        "[]",
        '{"name": "Alice"}',  # no arguments key and no known tools to check against
        '{"type": "person", "name": "Bob", "arguments": {}}',
        '[{"name": "read_file", "arguments": {}}, {"title": "x"}]',
        '{"name": "read_file", "arguments": {}} and some prose',
    ):
        reply = parse_tool_calls(text)
        assert reply.calls == [], text
        assert reply.content == text.strip()


def test_known_tools_decides_bare_json() -> None:
    text = '{"name": "weather", "parameters": {"city": "Oslo"}}'
    assert parse_tool_calls(text, known_tools=KNOWN).calls == []
    assert parse_tool_calls(text, known_tools=KNOWN).content == text
    assert _call(parse_tool_calls(text)) == ("weather", {"city": "Oslo"})
    # With known tools, a bare name is enough.
    assert _call(parse_tool_calls('{"name": "list_directory"}', known_tools=KNOWN)) == (
        "list_directory",
        {},
    )


def test_bare_json_with_bad_arguments_is_a_malformed_call() -> None:
    reply = parse_tool_calls('{"name": "read_file", "arguments": 7}', known_tools=KNOWN)
    assert reply.calls[0].arguments is None
    assert "JSON object" in reply.calls[0].error


# --- Mistral ---------------------------------------------------------------------------


def test_mistral_array() -> None:
    reply = parse_tool_calls(
        'Sure.[TOOL_CALLS] [{"name": "read_file", "arguments": {"path": "a"}}, '
        '{"name": "list_directory", "arguments": {"path": "."}, "id": "abc123xyz"}]'
    )
    assert reply.content == "Sure."
    assert [(c.id, c.name, c.arguments) for c in reply.calls] == [
        ("call_1", "read_file", {"path": "a"}),
        ("call_2", "list_directory", {"path": "."}),
    ]


def test_mistral_named_args_format() -> None:
    reply = parse_tool_calls(
        '[TOOL_CALLS]read_file[ARGS]{"path": "a", "offset": 3}'
        "[TOOL_CALLS]list_directory[CALL_ID]a1b2c3d4e[ARGS]{}"
    )
    assert [(c.name, c.arguments) for c in reply.calls] == [
        ("read_file", {"path": "a", "offset": 3}),
        ("list_directory", {}),
    ]
    assert reply.content == ""


def test_mistral_malformed() -> None:
    reply = parse_tool_calls('[TOOL_CALLS] [{"name": "read_file", "arguments": {')
    assert reply.calls[0].arguments is None and "invalid JSON" in reply.calls[0].error
    reply = parse_tool_calls("[TOOL_CALLS]read_file[ARGS]{oops}")
    assert reply.calls[0].name == "read_file" and reply.calls[0].arguments is None
    reply = parse_tool_calls("[TOOL_CALLS] what")
    assert reply.calls[0].error and reply.calls[0].arguments is None


# --- general ---------------------------------------------------------------------------


def test_plain_text_untouched() -> None:
    assert parse_tool_calls("  Just an answer.\n") == ParsedReply("Just an answer.", [])
    assert parse_tool_calls("") == ParsedReply("", [])


def test_to_openai() -> None:
    call = parse_tool_calls('<tool_call>{"name": "read_file", "arguments": {"path": "é"}}')
    entry = call.calls[0].to_openai()
    assert entry == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"path": "é"}'},
    }
    broken = ToolCall("call_9", "read_file", None, "bad JSON")
    assert json.loads(broken.to_openai()["function"]["arguments"]) == {}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(
                [
                    "<tool_call>",
                    "</tool_call>",
                    "[TOOL_CALLS]",
                    "[ARGS]",
                    "[CALL_ID]",
                    "<|python_tag|>",
                    "```json\n",
                    "```",
                    '{"name": ',
                    '"read_file"',
                    '"arguments": ',
                    '"parameters": ',
                    "{",
                    "}",
                    "[",
                    "]",
                    ",",
                    ";",
                    '"',
                    "\n",
                ]
            ),
            st.text(max_size=8),
        ),
        max_size=25,
    ).map("".join),
    st.one_of(st.none(), st.just(KNOWN)),
)
def test_parse_never_raises(text: str, known: tuple[str, ...] | None) -> None:
    reply = parse_tool_calls(text, known_tools=known)
    assert isinstance(reply.content, str)
    assert len({c.id for c in reply.calls}) == len(reply.calls)
    for call in reply.calls:
        assert (call.arguments is None) == (call.error is not None)
        json.dumps(call.to_openai())


# --- system prompt ---------------------------------------------------------------------


def test_tools_system_prompt(tmp_path: Path) -> None:
    definitions = Sandbox([tmp_path], enabled=TOOL_NAMES, shell=True).definitions()
    prompt = tools_system_prompt(definitions)
    for name in TOOL_NAMES:
        assert f"- {name}: " in prompt
    assert '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>' in prompt
    assert "tool message" in prompt
    assert '"required":["path"]' in prompt  # parameters included, compactly
    assert len(prompt) < 3000
    assert tools_system_prompt([]) == ""
    bare = tools_system_prompt([{"name": "ping", "description": "Ping."}])
    assert "- ping: Ping." in bare


def test_round_trip_prompt_parse_run(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello\n", encoding="utf-8")
    box = Sandbox([tmp_path])
    reply = parse_tool_calls(
        'Checking.\n<tool_call>{"name": "read_file", "arguments": {"path": "notes.txt"}}'
        "</tool_call>",
        known_tools=[d["function"]["name"] for d in box.definitions()],
    )
    call = reply.calls[0]
    result = box.run(call.name, call.to_openai()["function"]["arguments"])
    assert result.ok and "     1\thello" in result.content


def test_absurd_nesting_is_malformed_not_a_crash() -> None:
    deep = "[" * 100_000
    for text in (
        f"<tool_call>{deep}",
        deep,
        '[TOOL_CALLS]read_file[ARGS]{"a":' * 2 + deep,
        '<tool_call>{"name": "read_file", "arguments": "' + deep + '"}</tool_call>',
    ):
        reply = parse_tool_calls(text)
        assert all(call.arguments is None and call.error for call in reply.calls)
