"""Showing untrusted text: one rule for the terminal, the shell confirmation and the UI.

Stored titles, replies, imported chats and a model's commands are untrusted: a control
character can move a terminal's cursor, and a bidi override or isolate can make a
bidi-aware terminal or dialog show other text than the one stored (a title displayed as
another, a command approved that is not the one that runs). :func:`show_untrusted` shows
every character that draws nothing itself but changes what is drawn as an escape such
as ``\\u202e``: controls (Cc), format characters such as the bidi controls and zero-width
characters (Cf), line and paragraph separators (Zl, Zp) and lone surrogates (Cs).

The window shows replies, tool output and titles as text people read, where joiners
(emoji, Indic and Persian script) and the implicit marks (LRM, RLM) are part of the
writing: :func:`show_directional` escapes only the explicit embeddings, overrides and
isolates (U+202A–U+202E, U+2066–U+2069), the characters that draw a run of text in
another order than it is stored ("Trojan Source": a file name or a line of code shown
as other text).
"""

from __future__ import annotations

import regex

#: what is shown as an escape (``multiline`` keeps newline and tab)
_INVISIBLE = regex.compile(r"[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}]")
_INVISIBLE_KEEP_LINES = regex.compile(r"[^\n\t\P{Cc}]|[\p{Cf}\p{Zl}\p{Zp}\p{Cs}]")
#: the explicit directional formatting characters: they reorder whole runs of text
_DIRECTIONAL = regex.compile("[\u202a-\u202e\u2066-\u2069]")
#: what JSON text leaves raw (json.dumps escapes C0 itself; C0 outside strings is layout)
_JSON_RAW = regex.compile(r"[\x7f-\x9f\p{Cf}\p{Zl}\p{Zp}\p{Cs}]")


def escape_char(char: str) -> str:
    """``\\x1b``, ``\\u202e`` or ``\\U000e0041``: the character's code, readable."""
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def show_untrusted(text: str, multiline: bool = False) -> str:
    """``text`` with every invisible or reordering character shown as an escape, so what
    is shown is what is stored; ``multiline`` keeps newlines and tabs as they are."""
    pattern = _INVISIBLE_KEEP_LINES if multiline else _INVISIBLE
    return pattern.sub(lambda m: escape_char(m.group()), text)


def show_directional(text: str) -> str:
    """``text`` with the characters that draw it in another order than stored (the
    bidi embeddings, overrides and isolates) shown as escapes such as ``\\u202e``."""
    return _DIRECTIONAL.sub(lambda m: escape_char(m.group()), text)


def copied_note(text: str) -> str:
    """What the status bar says of ``text`` put on the clipboard: "Copied", and that it
    holds direction characters where it does (the window shows them as escapes; the
    clipboard gets the characters as stored, which another app may draw reordered)."""
    found = len(_DIRECTIONAL.findall(text))
    if not found:
        return "Copied"
    return (f"Copied; it holds {found:,} character{'s' if found != 1 else ''} that change the "
            "direction of the text (shown here as escapes such as \\u202e)")


def _json_escape(char: str) -> str:
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON writes characters above the BMP
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_escape_invisible(json_text: str) -> str:
    """JSON text (from ``json.dumps(…, ensure_ascii=False)``) with the invisible or
    reordering characters that it leaves raw written as JSON escapes: the same value,
    shown safely. Outside strings JSON holds only visible ASCII, so nothing else changes."""
    return _JSON_RAW.sub(lambda m: _json_escape(m.group()), json_text)
