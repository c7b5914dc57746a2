"""A slow reply says why (a newcomer's hour: "Generating… 0.3 tok/s" said nothing of the
busy computer behind it). The words come from ``runtime.speed.slow_words``; the window adds
them to its live rate and to "Ready · last reply …"."""

from __future__ import annotations

from iris_desktop.runtime.speed import SLOW_RATE, per_second, slow_words

from support.fakes import ScriptedRuntime
from support.helpers import on_a_terminal, run_cli
from support.network import ScriptedSocketServer, event_stream, openai_answers

SMALL = {"where": "local", "device": "CPU", "size_bytes": 491_000_000}


def test_a_rate_people_can_read_along_with_says_nothing_more():
    assert slow_words(SLOW_RATE, SMALL, load=9.0, processors=2, cores=2) == ""
    assert slow_words(25.0, SMALL, load=0.1, processors=2, cores=2) == ""
    assert slow_words(0.0, SMALL, load=9.0, processors=2, cores=2) == ""  # no rate yet
    assert slow_words(None, SMALL, load=9.0, processors=2, cores=2) == ""


def test_a_busy_processor_is_named_with_its_load():
    words = slow_words(0.3, SMALL, load=4.2, processors=2, cores=2)
    assert words == "slow: other programs are using the processor (load 4.2 on 2)"
    # the reply's own threads load the processors up to their number: not "other programs"
    assert "other programs" not in slow_words(0.3, SMALL, load=2.5, processors=2, cores=2)


def test_a_model_large_for_the_computer_is_named_and_a_smaller_one_offered():
    big = {**SMALL, "size_bytes": 8_000_000_000}
    assert slow_words(1.0, big, load=1.0, processors=4, cores=2) == (
        "slow: this model is large for 2 processor cores; a smaller one writes faster")
    # the same file held whole by a GPU is not blamed; nor is the bundled model's size
    assert "large" not in slow_words(1.0, {**big, "device": "GPU: Radeon · 33/33 layers"},
                                     load=1.0, processors=4, cores=2)
    assert slow_words(1.0, SMALL, load=1.0, processors=4, cores=2) == "slow on this computer now"
    # a GPU that holds some of its layers leaves the rest to the cores (session 66's review)
    assert "large" in slow_words(1.0, {**big, "device": "GPU: GeForce RTX 3050 · 3/81 layers"},
                                 load=1.0, processors=4, cores=2)


def test_a_server_is_not_blamed_on_this_computer():
    served = {"where": "server: 127.0.0.1:8080", "size_bytes": 0}
    assert slow_words(0.5, served, load=9.0, processors=2, cores=2) == \
        "slow: the server writes at this pace"


def test_the_window_says_a_slow_reply_is_slow(make_window, qtbot):
    """A real window, a reply streamed at about one token a second (a slower machine only
    makes it slower): its live rate is followed by why it is slow."""
    w = make_window(ScriptedRuntime(["one two three four five"], delay_s=0.8))
    shown: list[str] = []
    w.app_state.statusText.connect(shown.append)
    w.send("Count to five")
    qtbot.waitUntil(lambda: not w.generating and any("tok/s" in t for t in shown), timeout=30_000)
    live = [t for t in shown if t.startswith("Generating…") and "tok/s" in t]
    assert live and all(" · slow" in t for t in live), live


def test_the_cli_on_a_terminal_says_a_slow_reply_is_slow_and_a_pipe_hears_nothing(tmp_path, capsys):
    """A real loopback server that reports writing 0.5 tokens a second (llama.cpp's
    ``timings``), the real CLI on a real terminal (a pty): the reply is followed by its
    rate and why; a pipe's stderr stays as it was."""
    words = "one two three four five six seven eight nine ten eleven twelve".split()
    stream = event_stream(*[{"choices": [{"index": 0, "delta": {"content": w + " "}}]} for w in words],
                          {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 20, "completion_tokens": 12},
                           "timings": {"predicted_per_second": 0.5, "predicted_n": 12}})
    with ScriptedSocketServer(openai_answers(stream)) as server:
        where = ["--data-dir", tmp_path / "data", "--set", "model.backend=openai",
                 "--set", f"model.base_url={server.base_url}"]
        code, seen = on_a_terminal([*where, "chat", "Count to twelve."], {})
        text = seen.decode("utf-8", "replace")
        assert code == 0, text
        assert ("iris-desktop: this reply came at 0.5 tokens a second (slow: the server writes "
                "at this pace)") in text, text
        code, _, err = run_cli(capsys, *where, "chat", "--thread", "1", "Again.")
    assert code == 0, err
    assert "tokens a second" not in err


def test_a_rate_under_a_tenth_is_not_said_as_nothing():
    """A newcomer saw "Generating… 0.0 tok/s" on a starved processor, as if nothing came."""
    assert per_second(0.04) == "< 0.1 tok/s" and per_second(0.05) == "0.1 tok/s"
    assert per_second(6.24) == "6.2 tok/s"
