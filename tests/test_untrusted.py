"""Untrusted text shown in the terminal: one rule (iris_desktop.untrusted) everywhere.

Before: the CLI escaped control characters only, so a stored title with a right-to-left
override printed raw in ``threads`` and the delete confirmation and could display as
another title.
"""

from __future__ import annotations

import json

from iris_desktop.untrusted import json_escape_invisible, show_untrusted

from support.helpers import run_cli as run

#: "evil" shown as "live" by a bidi-aware terminal: an override, then the reversed text
SPOOF = "Budget \u202elive\u202c notes\u2066x\u2069 \u200b"



def test_every_listing_shows_bidi_and_invisible_characters_as_escapes(capsys, tmp_path):
    source = tmp_path / "chat.json"
    source.write_text(json.dumps({"title": SPOOF, "messages": [
        {"role": "user", "content": "a \u202eplan\u202c"}, {"role": "assistant", "content": "ok"}]}))
    data = tmp_path / "home"
    assert run(capsys, "--data-dir", data, "import", source)[0] == 0
    outputs = [run(capsys, "--data-dir", data, "threads", "--no-model")[1],
               run(capsys, "--data-dir", data, "threads", "--json", "--no-model")[1],
               run(capsys, "--data-dir", data, "switch", "1", "2", "next")[2]]
    code, out, err = run(capsys, "--data-dir", data, "delete", "1")  # no terminal: says what
    outputs.append(err)
    for shown in outputs:
        assert not any(c in shown for c in "\u202e\u202c\u2066\u2069\u200b"), shown
    assert "\\u202e" in outputs[0] and "\\u202e" in outputs[3]
    assert json.loads(outputs[1])[0]["title"] == SPOOF  # JSON escapes: the same value


def test_the_rule_keeps_visible_text_and_layout():
    assert show_untrusted("naïve café 日本 שלום 👍") == "naïve café 日本 שלום 👍"
    assert show_untrusted("a\nb\tc\x1b[2J", multiline=True) == "a\nb\tc\\x1b[2J"
    assert show_untrusted("a\nb") == "a\\x0ab"
    assert show_untrusted("\U000e0041") == "\\U000e0041"  # a tag character
    text = json.dumps({"t": "x\u202ey\x85\U000e0041"}, ensure_ascii=False, indent=1)
    escaped = json_escape_invisible(text)
    assert json.loads(escaped) == json.loads(text) and "\n" in escaped
    assert not any(c in escaped for c in "\u202e\x85\U000e0041")
