"""The language of a code fence that names none (issue #47, item 2): the bundled model writes
its code in bare ``` fences, and Pygments' own guess called plain Python and JavaScript
"text", so they were never coloured. ``core.codeguess`` reads the syntax instead: real
snippets of each language (tests/fixtures/code_snippets/, SOURCES.md says where each comes
from) are recognised, from their first lines on while they stream; prose and short
ambiguous lines stay plain text; the guess is fast enough to run per streamed token; and an
untagged Python fence in a reply ends up coloured in the transcript."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
from pygments.lexers import get_lexer_by_name

from iris_desktop.core import codeguess
from iris_desktop.core.codeguess import guess

SNIPPETS = Path(__file__).parent / "fixtures" / "code_snippets"
REAL = sorted(SNIPPETS.glob("*.snippet"))
#: a language a snippet's first lines may rightly be taken for: a C++ file can start with C,
#: a TypeScript one with a plain JavaScript import
PARTNER = {"cpp": "c", "typescript": "javascript"}


def expected(path: Path) -> str:
    return path.name.split("-", 1)[0]


def test_there_is_real_code_of_every_language_and_its_source_is_noted():
    assert {expected(p) for p in REAL} == {"python", "javascript", "typescript", "bash", "c", "cpp",
                                             "java", "json", "html", "sql", "yaml"}
    sources = (SNIPPETS / "SOURCES.md").read_text(encoding="utf-8")
    assert all(f"`{p.name}`" in sources for p in REAL)


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.stem)
def test_a_real_snippet_is_recognised(path):
    assert guess(path.read_text(encoding="utf-8")) == expected(path)


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.stem)
def test_a_snippet_still_streaming_is_never_taken_for_another_language(path):
    """Each first 1, 2, … lines: its language, its partner, or text while unsure; the language
    is known within the first lines and kept from then on."""
    language = expected(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    guesses = [guess("\n".join(lines[:n])) for n in range(1, len(lines) + 1)]
    assert set(guesses) <= {language, PARTNER.get(language), "text"}
    first = guesses.index(language)
    assert first < 16 and set(guesses[first:]) == {language}


#: short code as the model writes it (hand-written, typical of its replies)
TYPICAL = {
    "python": "def fibonacci(n):\n    if n <= 1:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
              "\nprint(fibonacci(10))",
    "python-loop": "numbers = [1, 2, 3, 4]\nsquares = [n * n for n in numbers]\nfor n in squares:\n    print(n)",
    "python-import": "import numpy as np",
    "javascript": "function add(a, b) {\n  return a + b;\n}\n\nconsole.log(add(2, 3));",
    "javascript-arrow": "const double = (x) => x * 2;\nconst items = [1, 2, 3].map(double);",
    "typescript": "interface User {\n  id: number;\n  name: string;\n}\n\n"
                  "export function find(users: User[], id: number): User | undefined {\n"
                  "  return users.find(u => u.id === id);\n}",
    "bash": "for f in *.txt; do\n  echo \"$f\"\ndone",
    "bash-install": "pip install requests",
    "c": "#include <stdio.h>\n\nint main(void) {\n    printf(\"Hello, world!\\n\");\n    return 0;\n}",
    "cpp": "#include <iostream>\n\nint main() {\n    std::cout << \"Hello\" << std::endl;\n    return 0;\n}",
    "java": "public class Main {\n    public static void main(String[] args) {\n"
            "        System.out.println(\"Hello, World!\");\n    }\n}",
    "json": "{\"name\": \"iris\", \"version\": 1, \"tags\": [\"chat\", \"offline\"]}",
    "html": "<div class=\"card\">\n  <h1>Title</h1>\n  <p>Body</p>\n</div>",
    "sql": "SELECT name, COUNT(*) FROM users GROUP BY name;",
    "sql-lower": "select id, name from users where age > 30 order by name;",
    "yaml": "version: '3'\nservices:\n  web:\n    image: nginx\n    ports:\n      - \"80:80\"",
    "rust": "fn main() {\n    let mut v = Vec::new();\n    v.push(1);\n    println!(\"{:?}\", v);\n}",
    "go": "package main\n\nimport \"fmt\"\n\nfunc main() {\n    fmt.Println(\"hi\")\n}",
}


@pytest.mark.parametrize("name", TYPICAL)
def test_short_code_as_the_model_writes_it_is_recognised(name):
    assert guess(TYPICAL[name]) == name.split("-", 1)[0]


PLAIN = {
    "a greeting": "hello there",
    "a sentence": "Hello, World!",
    "prose": "This is a plain sentence that explains what the function does.\n"
             "It has two lines of prose, and nothing else.",
    "prose with a colon": "Note: the installer needs about 2 GB of free space.\n"
                          "Then restart the app and select the model from the list.",
    "prose that says select … from": "Select the file from the list, then press Open to load it.",
    "fields": "Name: Ann\nAge: 30",
    "an assignment": "x = 1",
    "a call": "foo(bar)",
    "a return": "return x",
    "a number": "42",
    "program output": "[1, 4, 9, 16]\nDone in 0.2 s",
    "a tree": "src/\n  main.py\n  utils.py\ntests/\n  test_main.py",
    "a traceback": "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                   "ZeroDivisionError: division by zero",
    "a changelog": "0.4.7 / 2014-06-24\n==================\n\n  * Handle invalid provided languages\n"
                   "  * Handle invalid provided media types",
    "a license": "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR\n"
                 "IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,\n"
                 "FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT.",
    "a markdown list": "- Counting: `counter()`, `count_prompt(messages, tools)`, safe from\n"
                       "  any thread; `render_prompt(messages)` for display.\n"
                       "- KV state: `kv_state()` and `restore_kv_state(state)`.",
    "empty": "  \n",
}


@pytest.mark.parametrize("name", PLAIN)
def test_prose_and_short_ambiguous_lines_stay_plain_text(name):
    assert guess(PLAIN[name]) == "text"


def test_every_answer_is_a_pygments_lexer_name():
    languages = {lang for _, weights, _ in codeguess._PATTERNS for lang in weights}
    languages |= {lang for _, weights, _ in codeguess._WORDS for lang in weights}
    assert {"python", "javascript", "typescript", "bash", "c", "cpp", "java", "json", "html", "sql",
            "yaml"} <= languages
    for language in languages:
        get_lexer_by_name(language)


def test_windows_line_ends_read_the_same():
    for path in REAL:
        text = path.read_text(encoding="utf-8")
        assert guess(text.replace("\n", "\r\n")) == guess(text)


def test_a_200_line_block_is_guessed_in_well_under_a_few_milliseconds():
    """It may run on every streamed refresh: measured uncached (the best of a few runs, on a
    busy machine about 1 ms), then cached."""
    lines = [line for p in REAL for line in p.read_text(encoding="utf-8").split("\n")
             if expected(p) == "python"]
    block = "\n".join((lines * 10)[:200])
    assert guess(block) == "python"
    best = min(_timed(codeguess.guess.__wrapped__, block) for _ in range(5))
    assert best < 0.005, f"{best * 1000:.2f} ms"
    hits = guess.cache_info().hits
    assert min(_timed(guess, block) for _ in range(3)) < 0.0005
    assert guess.cache_info().hits == hits + 3
    longest = max((p.read_text(encoding="utf-8") for p in REAL), key=len)
    assert min(_timed(codeguess.guess.__wrapped__, longest * 20) for _ in range(3)) < 0.005  # only a head is read


def _timed(function, argument) -> float:
    started = time.perf_counter()
    function(argument)
    return time.perf_counter() - started


# -- through the transcript's real rendering -----------------------------------------------------

needs_qt = pytest.mark.skipif(importlib.util.find_spec("pytestqt") is None, reason="needs pytest-qt")
FIB = TYPICAL["python"]
REPLY = f"Here is a function that computes Fibonacci numbers:\n\n```\n{FIB}\n```\n\nIt uses recursion."


@pytest.fixture
def view(transcript_view):
    return transcript_view


def blocks(view, row: int) -> list[tuple[str, set[str]]]:
    """Each code block of the row's document as the transcript lays it out: (label, the
    colours of its non-blank text)."""
    from iris_desktop.ui.highlight import code_boxes

    from support.windows import code_block_colours

    doc = view.delegate._doc(view.transcript.entry(row), view.delegate.body_width())
    return [(block.label, code_block_colours(doc, block)) for block, _, _ in code_boxes(doc)]


def show(view, qtbot, *texts: tuple[str, str, str]) -> None:
    from iris_desktop.core.views import Entry

    view.transcript.set_entries([Entry("message", f"m:{i}", i, role, i, text, status=status)
                                 for i, (role, text, status) in enumerate(texts, 1)])
    view.doItemsLayout()
    qtbot.wait(10)


@needs_qt
def test_an_untagged_python_fence_in_a_reply_is_coloured(view, qtbot):
    show(view, qtbot, ("user", "Write fibonacci in Python", "complete"),
         ("assistant", REPLY, "complete"))
    (label, colours), = blocks(view, 1)
    assert label == "python"
    assert len(colours) > 2  # keywords, names, numbers, builtins: not one plain colour


@needs_qt
def test_untagged_code_of_other_languages_is_coloured_and_prose_in_a_fence_is_not(view, qtbot):
    reply = (f"In JavaScript:\n\n```\n{TYPICAL['javascript']}\n```\n\nand the query:\n\n"
             f"```\n{TYPICAL['sql']}\n```\n\nwhich prints:\n\n```\nHello, World!\n```")
    show(view, qtbot, ("assistant", reply, "complete"))
    (js, js_colours), (sql, sql_colours), (out, out_colours) = blocks(view, 0)
    assert (js, sql, out) == ("javascript", "sql", "text")
    assert len(js_colours) > 1 and len(sql_colours) > 1 and len(out_colours) == 1


@needs_qt
def test_an_untagged_fence_streaming_is_labelled_then_coloured_once_it_closes(view, qtbot):
    so_far = f"Here is a function that computes Fibonacci numbers:\n\n```\n{FIB}\n"
    show(view, qtbot, ("assistant", so_far, "streaming"))
    (label, colours), = blocks(view, 0)
    assert label == "python" and len(colours) == 1  # not highlighted per token
    view.transcript.update(0, text=so_far + "```\n", status="complete")
    (label, colours), = blocks(view, 0)
    assert label == "python" and len(colours) > 2
