"""The runtime against real models: the chat formats' properties on gemma-3-270m (a base
model with Gemma's hand-written turns and sliding-window attention), and the default
Qwen2.5-Coder-0.5B-Instruct with its own Jinja template.

Each model is assembled once per machine and loaded once per module; each generation is
a few dozen tokens at most.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from pathlib import Path

import pytest

from iris_desktop.generation import GenerationRequest
from iris_desktop.runtime import chat_format as cf
from iris_desktop.runtime import gguf
from iris_desktop.runtime.chat_format import (
    ChatMLFormat,
    GemmaFormat,
    JinjaFormat,
    select_chat_format,
)
from iris_desktop.runtime.gguf import GGUFError, GGUFInfo, read_gguf_info
from iris_desktop.runtime.model import LocalModel, ModelError, PromptTooLongError
from iris_desktop.tokens import TokenCounter

from conftest import SYNTHETIC_CHAT
from support.helpers import complete

LLAMA2_MARKERS = ("<</SYS>>", "[INST]", "<<SYS>>", "[/INST]")

SYSTEM = {"role": "system", "content": "You are Melanie. Reply to your friend Caroline."}


def locomo(n: int) -> list[dict]:
    """The first ``n`` messages of a long two-person chat (a bundled fixture)."""
    from iris_desktop.core.engine import wire_message

    return [wire_message(m) for m in json.loads(SYNTHETIC_CHAT.read_text())["messages"][:n]]


# ---------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="session")
def bundled_model(base_model_path) -> Path:
    """gemma-3-270m: the format-level properties (additive counts, SWA) are checked on it;
    the default model's exact counts go through the planner (test_planner.py)."""
    return base_model_path


@pytest.fixture(scope="module")
def model(bundled_model):
    m = LocalModel.load(bundled_model, n_ctx=4096, seed=1)
    yield m
    m.close()


# ---------------------------------------------------------------------------
# GGUF header


def test_gguf_info_of_the_gemma_model(bundled_model):
    info = read_gguf_info(bundled_model)
    assert info.architecture.startswith("gemma")
    assert info.context_length == 32768
    assert info.file_type == "Q4_K_M"
    assert info.chat_template is None
    assert info.sliding_window == 512
    assert info.size_bytes == bundled_model.stat().st_size == info.expected_size
    assert info.special_tokens["bos"] == "<bos>"
    assert info.metadata["general.architecture"] == info.architecture
    # the huge tokenizer arrays are skipped
    assert not any(k.startswith("tokenizer.ggml.tokens") for k in info.metadata)
    assert all(len(repr(v)) < 2000 for v in info.metadata.values())


def test_gguf_errors_name_the_path(tmp_path, bundled_model):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(GGUFError, match="file not found") as err:
        read_gguf_info(missing)
    assert str(missing) in str(err.value)

    with pytest.raises(GGUFError, match="is a directory"):
        read_gguf_info(tmp_path)

    text = tmp_path / "notes.gguf"
    text.write_text("hello, this is not a model at all\n" * 10)
    with pytest.raises(GGUFError,
                       match=r"not a GGUF file \(a model file starts with 'GGUF'; this one with 'hell'\)") as err:
        read_gguf_info(text)
    assert str(text) in str(err.value)

    # the first MB: the header (6.5 MB of tokenizer) is cut
    head = tmp_path / "head.gguf"
    with open(bundled_model, "rb") as src:
        head.write_bytes(src.read(1_000_000))
    with pytest.raises(GGUFError, match="truncated") as err:
        read_gguf_info(head)
    assert str(head) in str(err.value)

    # a complete header but most tensor data missing (an interrupted download)
    part = tmp_path / "part.gguf"
    with open(bundled_model, "rb") as src:
        part.write_bytes(src.read(20_000_000))
    with pytest.raises(GGUFError, match=r"truncated: header says 236 tensors .* ends at byte 20000000"):
        read_gguf_info(part)


def _tiny_gguf(path: Path, version: int = 3, kv: list[tuple[str, int, bytes]] | None = None,
               tensors: int = 0) -> Path:
    def s(text: str) -> bytes:
        b = text.encode()
        return struct.pack("<Q", len(b)) + b

    kv = kv if kv is not None else [
        ("general.architecture", 8, s("qwen2")),
        ("qwen2.context_length", 4, struct.pack("<I", 2048)),
        ("general.file_type", 4, struct.pack("<I", 7)),
        ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 3) + s("<s>") + s("a") + s("b")),
        ("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 0)),
        ("tokenizer.chat_template", 8, s("{% for m in messages %}{{ m.content }}{% endfor %}")),
        ("some.small.array", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, 2, 3)),
    ]
    body = b"GGUF" + struct.pack("<IQQ", version, tensors, len(kv))
    for key, vtype, payload in kv:
        body += s(key) + struct.pack("<I", vtype) + payload
    path.write_bytes(body)
    return path


def test_gguf_synthetic_header(tmp_path):
    info = read_gguf_info(_tiny_gguf(tmp_path / "tiny.gguf"))
    assert info.architecture == "qwen2"
    assert info.context_length == 2048
    assert info.file_type == "Q8_0"
    assert info.chat_template.startswith("{% for m")
    assert info.metadata["some.small.array"] == [1, 2, 3]
    assert info.special_tokens == {"bos": "<s>"}
    with pytest.raises(GGUFError, match="version 1"):
        read_gguf_info(_tiny_gguf(tmp_path / "v1.gguf", version=1))
    with pytest.raises(GGUFError, match="general.architecture is missing"):
        read_gguf_info(_tiny_gguf(tmp_path / "noarch.gguf", kv=[]))
    with pytest.raises(GGUFError, match="truncated"):
        read_gguf_info(_tiny_gguf(tmp_path / "t.gguf", tensors=1))
    # a context no model has (2^32 - 1 failed inside llama-cpp-python as "a bug in Iris",
    # 2^31 - 1 took 9 GB to say hi): the file is named as damaged before it is loaded
    from support.gguf_fixtures import tiny_metadata, write_gguf
    for claimed in (0, 0xFFFFFFFF, (1 << 24) + 1):
        path = write_gguf(tmp_path / f"ctx{claimed}.gguf",
                          {**tiny_metadata(), "llama.context_length": claimed})
        with pytest.raises(GGUFError, match=f"claims a context of {claimed:,} tokens"):
            read_gguf_info(path)
    assert read_gguf_info(write_gguf(tmp_path / "16m.gguf", {
        **tiny_metadata(), "llama.context_length": 1 << 24})).context_length == 1 << 24


def test_load_errors_are_model_errors(tmp_path, bundled_model):
    for bad, reason in [
        (tmp_path / "missing.gguf", "file not found"),
        (tmp_path / "text.gguf", "not a GGUF file"),
        (tmp_path / "cut.gguf", "truncated"),
    ]:
        if bad.name == "text.gguf":
            bad.write_text("just some text, long enough to have a header" * 3)
        if bad.name == "cut.gguf":
            with open(bundled_model, "rb") as src:
                bad.write_bytes(src.read(1 << 20))
        with pytest.raises(ModelError, match=reason) as err:
            LocalModel.load(bad)
        assert str(bad) in str(err.value)


# ---------------------------------------------------------------------------
# chat formats


def test_a_gemma_model_gets_gemma_format_not_llama2(bundled_model, caplog):
    caplog.set_level("INFO", logger="iris.runtime")
    fmt = select_chat_format(read_gguf_info(bundled_model))
    assert isinstance(fmt, GemmaFormat) and fmt.name == "gemma"
    assert "chat format 'gemma'" in caplog.text and "no embedded chat template" in caplog.text
    prompt = fmt.render_prompt([SYSTEM, {"role": "user", "content": "hi"}])
    assert not any(marker in prompt for marker in LLAMA2_MARKERS)
    assert prompt == (
        "<bos><start_of_turn>user\nYou are Melanie. Reply to your friend Caroline.<end_of_turn>\n"
        "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    )


def test_gemma_renders_tools_and_is_additive():
    fmt = GemmaFormat()
    call = {"id": "c1", "type": "function",
            "function": {"name": "search", "arguments": '{"q": "café"}'}}
    assistant = {"role": "assistant", "content": "Let me look.", "tool_calls": [call, call]}
    assert fmt.render_message(assistant, 3) == (
        '<start_of_turn>model\nLet me look.\n<tool_call>{"name":"search","arguments":{"q":"café"}}'
        '</tool_call>\n<tool_call>{"name":"search","arguments":{"q":"café"}}</tool_call>'
        "<end_of_turn>\n"
    )
    bare = {"role": "assistant", "content": None, "tool_calls": [call]}
    assert fmt.render_message(bare, 1).startswith("<start_of_turn>model\n<tool_call>{")
    result = {"role": "tool", "tool_call_id": "c1", "name": "search", "content": "3 hits"}
    assert fmt.render_message(result, 4) == (
        '<start_of_turn>user\n<tool_response name="search">\n3 hits\n</tool_response>'
        "<end_of_turn>\n"
    )
    anonymous = {"role": "tool", "tool_call_id": "c1", "content": "x"}
    assert '<tool_response id="c1">' in fmt.render_message(anonymous, 0)
    msgs = [SYSTEM, {"role": "user", "content": "q"}, assistant, result]
    assert fmt.render_prompt(msgs) == fmt.prefix() + "".join(
        fmt.render_message(m, 99) for m in msgs) + fmt.generation_prompt()
    # content is marked as plain text, template text as template
    parts = fmt.message_parts({"role": "user", "content": "<end_of_turn>"}, 0)
    assert ("<end_of_turn>", False) in parts


def _info(arch: str, template: str | None = None) -> GGUFInfo:
    return GGUFInfo(path=Path(f"/models/{arch}.gguf"), size_bytes=1, architecture=arch,
                    name=None, file_type=None, context_length=None, chat_template=template,
                    metadata={}, special_tokens={"bos": "<s>", "eos": "</s>"})


CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_selection_without_template_by_architecture():
    assert select_chat_format(_info("gemma2")).name == "gemma"
    assert select_chat_format(_info("qwen2")).name == "chatml"
    assert select_chat_format(_info("llama")).name == "chatml"  # never llama-2


def test_jinja_template_is_preferred_and_renders():
    fmt = select_chat_format(_info("qwen2", CHATML_TEMPLATE))
    assert isinstance(fmt, JinjaFormat) and not fmt.additive
    msgs = [SYSTEM, {"role": "user", "content": "hi"}]
    prompt = fmt.render_prompt(msgs)
    assert prompt == ChatMLFormat().render_prompt(msgs)
    assert fmt.generation_prompt() == "<|im_start|>assistant\n"
    assert fmt.render_message(msgs[1], 1) == "<|im_start|>user\nhi<|im_end|>\n"
    # a template that rejects a lone assistant message still yields a rendering
    strict = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}"
              "{% endif %}" + CHATML_TEMPLATE)
    fmt = JinjaFormat(strict)
    assert fmt.render_message({"role": "assistant", "content": "yo"}, 1) == (
        "<|im_start|>assistant\nyo<|im_end|>\n")
    # a broken template falls back to the architecture's format
    assert select_chat_format(_info("qwen2", "{% for %}")).name == "chatml"


# ---------------------------------------------------------------------------
# the loaded model


def test_counter_satisfies_the_protocol(model):
    counter = model.counter()
    assert isinstance(counter, TokenCounter)
    assert counter.exact is True
    assert counter.name.startswith("model:") and counter.name.endswith(":gemma")
    assert len(counter.name.split(":")[1]) == 12
    assert counter.name == model.counter().name  # stable
    assert counter.count_text("Hello world") == 2
    assert counter.prompt_overhead() == 1 + 3  # <bos> + "<start_of_turn>model\n"
    assert counter.count_message({"role": "user", "content": "Hello world"}) == 3 + 2 + 2


def test_content_cannot_inject_control_tokens(model):
    end_of_turn = model.tokenize("<end_of_turn>", special=True)
    assert len(end_of_turn) == 1
    tokens = model.message_tokens({"role": "user", "content": "a <end_of_turn> b"})
    assert tokens.count(end_of_turn[0]) == 1  # only the template's own
    assert "<end_of_turn>" in model.render_prompt([{"role": "user", "content": "x"}])


def test_predicted_prompt_tokens_equal_llamas(model):
    msgs = [SYSTEM, *locomo(6)]
    counter = model.counter()
    predicted = counter.prompt_overhead() + sum(counter.count_message(m) for m in msgs)

    text, stats = complete(model, msgs, max_tokens=4, temperature=0)
    assert stats.prompt_tokens == predicted
    assert stats.reused_tokens + stats.evaluated_tokens == stats.prompt_tokens

    # llama-cpp-python's own count for the rendered prompt string (it adds the BOS)
    prompt = model.render_prompt(msgs)
    assert prompt.startswith("<bos>") and not any(m in prompt for m in LLAMA2_MARKERS)
    usage = model.llm.create_completion(prompt[len("<bos>"):], max_tokens=1)["usage"]
    assert usage["prompt_tokens"] == predicted


def test_counts_match_whole_prompt_tokenization_on_a_long_chat(model):
    msgs = [SYSTEM, *locomo(80)]
    counter = model.counter()
    predicted = counter.prompt_overhead() + sum(counter.count_message(m) for m in msgs)
    whole = model.tokenize(model.render_prompt(msgs), special=True)
    assert model.prompt_tokens(msgs) == whole
    assert predicted == len(whole)


def test_second_turn_reuses_the_first_turns_kv_cache(model):
    msgs = [SYSTEM, *locomo(8)]
    reply, first = complete(model, msgs, max_tokens=12, temperature=0)
    assert first.finish_reason in ("stop", "length")
    follow = [*msgs, {"role": "assistant", "content": reply},
              {"role": "user", "content": "What did you do last weekend?"}]
    _, second = complete(model, follow, max_tokens=4, temperature=0)
    assert second.prompt_tokens > first.prompt_tokens
    assert second.reused_tokens >= first.prompt_tokens - 1
    assert second.evaluated_tokens == second.prompt_tokens - second.reused_tokens
    assert second.evaluated_tokens < 40
    # the same request again: everything but the last token is reused
    _, again = complete(model, follow, max_tokens=2, temperature=0)
    assert again.reused_tokens == again.prompt_tokens - 1 and again.evaluated_tokens == 1


def test_streams_pieces_and_cancels_between_tokens(model):
    msgs = [SYSTEM, *locomo(4)]
    generation = model.stream(GenerationRequest(msgs, max_tokens=12, temperature=0))
    assert generation.stats is None  # nothing runs before the first next()
    pieces = list(generation)
    stats = generation.stats
    assert len(pieces) > 1 and "".join(pieces).strip()
    assert stats.completion_tokens >= len(pieces) - 1
    assert stats.time_to_first_token_s > 0 and stats.duration_s >= stats.time_to_first_token_s
    assert stats.finish_reason in ("stop", "length")

    cancel = threading.Event()
    got = []
    generation = model.stream(GenerationRequest(msgs, max_tokens=50, temperature=0, cancel=cancel))
    for piece in generation:
        got.append(piece)
        cancel.set()
    assert len(got) == 1
    assert generation.stats.finish_reason == "cancelled"
    assert generation.stats.completion_tokens == 1

    # already cancelled: nothing is evaluated
    generation = model.stream(GenerationRequest(msgs, max_tokens=5, cancel=cancel))
    assert list(generation) == []
    assert generation.stats.finish_reason == "cancelled"
    assert generation.stats.evaluated_tokens == 0

    # closing the generation early counts as a cancel and frees the model
    it = model.stream(GenerationRequest(msgs, max_tokens=50, temperature=0))
    next(it)
    it.close()
    assert it.stats.finish_reason == "cancelled"
    assert complete(model, msgs, max_tokens=1)[1].completion_tokens <= 1


def test_max_tokens_gives_length(model):
    _, stats = complete(model, [SYSTEM, *locomo(2)], max_tokens=3, temperature=0)
    assert stats.completion_tokens <= 3
    if stats.completion_tokens == 3:
        assert stats.finish_reason == "length"


def test_json_schema_output_parses(model):
    schema = {
        "type": "object",
        "properties": {"mood": {"type": "string", "maxLength": 12},
                       "happy": {"type": "boolean"}},
        "required": ["mood", "happy"],
    }
    msgs = [*locomo(3), {"role": "user", "content": "Describe Caroline's mood as JSON."}]
    text, stats = complete(model, msgs, max_tokens=60, temperature=0, json_schema=schema)
    data = json.loads(text)
    assert set(data) == {"mood", "happy"} and isinstance(data["happy"], bool)
    assert stats.finish_reason == "stop"


def test_prompt_too_long(model):
    huge = {"role": "user", "content": "word " * 5000}
    with pytest.raises(PromptTooLongError) as err:
        list(model.stream(GenerationRequest([huge], max_tokens=4)))
    assert err.value.n_ctx == model.n_ctx == 4096


def test_close_is_idempotent(bundled_model):
    m = LocalModel.load(bundled_model, n_ctx=512)
    assert complete(m, [{"role": "user", "content": "Hi"}], max_tokens=2)[1].prompt_tokens > 0
    m.close()
    m.close()
    assert m.closed
    with pytest.raises(RuntimeError, match="closed"):
        m.tokenize("x")
    with LocalModel.load(bundled_model, n_ctx=512) as m2:
        assert m2.n_ctx == 512
    assert m2.closed


def test_n_ctx_zero_means_trained_context(bundled_model):
    m = LocalModel.load(bundled_model, n_ctx=0)
    try:
        assert m.n_ctx == 32768
    finally:
        m.close()


def test_format_helpers_are_exported():
    assert cf.tool_call_json({"function": {"name": "f", "arguments": "{}"}}) == (
        '{"name":"f","arguments":{}}')
    assert gguf.FILE_TYPES[15] == "Q4_K_M"


def test_swa_cache_without_full_size_falls_back_to_full_reevaluation(bundled_model, caplog):
    """With swa_full=False llama.cpp keeps only the last n_swa + n_ubatch positions of
    the sliding-window layers; reusing a prefix that ends before that window would give
    wrong logits, so the runtime re-evaluates (llama-server's rule). A prefix inside the
    window is still reused."""
    caplog.set_level("INFO", logger="iris.runtime")
    msgs = [SYSTEM, *locomo(70)]  # ~1000 tokens > 512 + 64 -> the window has moved
    m = LocalModel.load(bundled_model, n_ctx=2048, n_batch=64, swa_full=False)
    try:
        _, first = complete(m, msgs, max_tokens=1, temperature=0)
        assert first.prompt_tokens > 900
        _, near = complete(m, [*msgs, {"role": "user", "content": "ok"}], max_tokens=1)
        # all but "model\n" of the generation prompt (the window covers the end)
        assert near.reused_tokens == first.prompt_tokens - 2
        edited = [SYSTEM, {"role": "user", "content": "Something else."}, *msgs[2:]]
        _, far = complete(m, edited, max_tokens=1, temperature=0)
        assert far.reused_tokens == 0 and far.evaluated_tokens == far.prompt_tokens
        assert "not reusable" in caplog.text
    finally:
        m.close()


def test_stop_acts_during_a_long_prompt_evaluation(model_path):
    """A cancel during a 4,000-token prompt stops llama.cpp between two graph nodes (its
    abort callback): nothing more is evaluated after it (counted, not timed; the latency
    is measured in bench/stop_latency.py), and the part done stays cached, so the next
    request reuses it."""
    model = LocalModel.load(model_path, n_ctx=8192)
    try:
        text = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(300))
        messages = [{"role": "user", "content": text}]
        assert model.count_prompt(messages) > 4000
        llm = model.llm
        cancel = threading.Event()
        at_cancel: list[int] = []

        def stop_part_way() -> None:
            while llm.iris_evaluated < llm.n_batch:  # the first batch is in
                time.sleep(0.01)
            at_cancel.append(llm.iris_evaluated)
            cancel.set()

        threading.Thread(target=stop_part_way, daemon=True).start()
        generation = model.stream(GenerationRequest(messages, max_tokens=4, cancel=cancel))
        pieces = list(generation)
        stats = generation.stats
        assert pieces == [] and stats.finish_reason == "cancelled"
        assert at_cancel and stats.evaluated_tokens < stats.prompt_tokens  # stopped part-way
        assert stats.evaluated_tokens - at_cancel[0] <= llm.n_batch  # the batch under way at most
        evaluated = stats.evaluated_tokens
        assert complete(model, messages, max_tokens=1)[1].reused_tokens >= evaluated - 1  # kept
        # a deadline stops it the same way
        llm.reset()
        _, stats = complete(model, messages, max_tokens=4, deadline=time.monotonic() + 0.2)
        assert stats.finish_reason == "cancelled"
        assert stats.evaluated_tokens < stats.prompt_tokens
    finally:
        model.close()


def test_a_model_file_changed_on_disk_since_the_load_is_named_not_read(bundled_model, tmp_path):
    """Before (an audit): a model file truncated in place while loaded (a download or a
    sync tool writing the same name) killed the process at its next reply (SIGBUS: a
    mapped page past the end), with no word said. Now a request first checks the file
    is as it was loaded, and says to load it again. Here the copy grows by a byte (safe
    to read on); a truncation is told the same way."""
    import shutil

    copy = tmp_path / "model.gguf"
    shutil.copyfile(bundled_model, copy)
    m = LocalModel.load(copy, n_ctx=512, seed=1)
    try:
        text, _ = complete(m, [{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0)
        with open(copy, "ab") as f:
            f.write(b"\0")
        with pytest.raises(ModelError, match="changed on disk since it was loaded; load it "
                                             r"again \(Model ▸ Reload\)"):
            list(m.stream(GenerationRequest([{"role": "user", "content": "Hi"}], max_tokens=2)))
        with pytest.raises(ModelError, match="changed on disk"):
            m.prefill([{"role": "user", "content": "Hi"}])
    finally:
        m.close()
