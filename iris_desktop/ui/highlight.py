"""A message's text as a ``QTextDocument``: markdown for the assistant, fenced code blocks
highlighted with Pygments in a light or dark style that follows the palette.

The delegate paints these documents and the selectable editor shows the very same ones,
so both agree; ``paint_code`` draws each block's background, language label and Copy
button under the text, in document coordinates, for either of them.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, replace
from functools import lru_cache

from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.styles import get_style_by_name
from pygments.token import Token
from pygments.util import ClassNotFound
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontMetrics,
    QPainter,
    QPalette,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextDocumentFragment,
    QTextFormat,
    QTextOption,
)

from iris_desktop.core import codeguess

#: text that markdown would render differently from plain text
MARKDOWN = re.compile(r"[*_`#\[\]|>~<&\\]|^\s*(?:[-+]|\d+[.)])\s|^\s{4}|^\s*[=-]{3,}\s*$",
                      re.MULTILINE)
#: GitHub's markdown, with raw HTML shown as the text it is: a reply about "the <span>
#: element" lost every word after the tag, and a message's tags or images were drawn
MARKDOWN_FEATURES = QTextDocument.MarkdownFeature(
    QTextDocument.MarkdownFeature.MarkdownDialectGitHub.value
    | QTextDocument.MarkdownFeature.MarkdownNoHTML.value)
_OPEN = re.compile(r"^( {0,3})(`{3,}|~{3,})[ \t]*([^\s`]*)[^`]*$")
LIGHT_STYLE, DARK_STYLE = "default", "monokai"
COPY = "Copy"


def blend(a: QColor, b: QColor, t: float) -> QColor:
    return QColor(
        round(a.red() + (b.red() - a.red()) * t),
        round(a.green() + (b.green() - a.green()) * t),
        round(a.blue() + (b.blue() - a.blue()) * t),
    )


def code_background(palette: QPalette) -> QColor:
    base, text = palette.color(QPalette.ColorRole.Base), palette.color(QPalette.ColorRole.Text)
    return blend(base, text, 0.07)


# -- finding the blocks ----------------------------------------------------------------------


def split_fences(text: str) -> list[tuple[str, str | None]]:
    """``(prose, None)`` and ``(code, language)`` parts in order: code without its fences
    ('' when the fence names no language). An unclosed fence (a reply still streaming)
    runs to the end."""
    return _split(text)[0]


def _split(text: str) -> tuple[list[tuple[str, str | None]], bool]:
    """``split_fences`` and whether the last fence is still open."""
    parts: list[tuple[str, str | None]] = []
    unclosed = False
    prose: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        opened = _OPEN.match(lines[i])
        if opened is None:
            prose.append(lines[i])
            i += 1
            continue
        indent, fence, language = len(opened[1]), opened[2], opened[3]
        close = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if close.match(lines[j])), len(lines))
        if prose:
            parts.append(("\n".join(prose), None))
            prose = []
        code = [line[min(indent, len(line) - len(line.lstrip(" "))):] for line in lines[i + 1:end]]
        unclosed = end == len(lines)
        if unclosed and code and not code[-1]:
            code.pop()  # streaming: the newline after the last line so far
        parts.append(("\n".join(code), language))
        i = end + 1
    if prose:
        parts.append(("\n".join(prose), None))
        unclosed = False
    return [(p, lang) for p, lang in parts if lang is not None or p.strip()], unclosed


# -- Pygments ----------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def lexer_for(language: str) -> Lexer | None:
    try:
        return get_lexer_by_name(language, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


def guess_language(code: str) -> str:
    """The language of a fence that names none, from its syntax (``core.codeguess``: Pygments'
    own ``analyse_text`` scores plain Python 0), or "text"."""
    return codeguess.guess(code)


@lru_cache(maxsize=64)
def tokens(code: str, language: str) -> tuple[tuple[str, object], ...]:
    """(text, token type) pieces that add up to ``code`` exactly."""
    lexer = lexer_for(language) if language != "text" else None
    if lexer is None:
        return ((code, Token.Text),)
    return tuple((value, ttype) for ttype, value in lexer.get_tokens(code))


def _luminance(c: QColor) -> float:
    def channel(v: float) -> float:
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
    return 0.2126 * channel(c.redF()) + 0.7152 * channel(c.greenF()) + 0.0722 * channel(c.blueF())


def contrast(a: QColor, b: QColor) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


class CodeTheme:
    """Token formats for one palette: Pygments' light or dark style by the lightness of the
    window colour, each colour moved toward the text colour until it reads on the block."""

    def __init__(self, palette: QPalette, mono: QFont):
        self.dark = palette.color(QPalette.ColorRole.Window).lightnessF() < 0.5
        self.style = get_style_by_name(DARK_STYLE if self.dark else LIGHT_STYLE)
        self.background = code_background(palette)
        self.text = palette.color(QPalette.ColorRole.Text)
        self.base = QTextCharFormat()
        self.base.setFont(mono)
        self._formats: dict[object, QTextCharFormat] = {}
        self._fragments: OrderedDict[tuple, QTextDocumentFragment] = OrderedDict()

    def readable(self, color: QColor) -> QColor:
        for step in range(7):
            candidate = blend(color, self.text, step / 6)
            if contrast(candidate, self.background) >= 4.5:
                return candidate
        return self.text

    def format(self, ttype) -> QTextCharFormat:
        fmt = self._formats.get(ttype)
        if fmt is None:
            style = self.style.style_for_token(ttype)
            fmt = self._formats[ttype] = QTextCharFormat(self.base)
            if style["color"]:
                fmt.setForeground(self.readable(QColor("#" + style["color"])))
            if style["bold"]:
                fmt.setFontWeight(QFont.Weight.Bold)
            if style["italic"]:
                fmt.setFontItalic(True)
        return fmt

    def fragment(self, code: str, language: str, line: QTextBlockFormat, streaming: bool = False
                 ) -> QTextDocumentFragment:
        """``code`` highlighted, one ``line``-formatted block per line, and kept: a reply laid
        out again per streamed token copies its finished blocks in. A block still
        ``streaming`` is neither highlighted (per token, that costs more than the whole
        layout) nor kept."""
        key = (code, language, line.leftMargin())
        fragment = self._fragments.get(key)
        if fragment is not None:
            self._fragments.move_to_end(key)
            return fragment
        scratch = QTextDocument()
        scratch.setUndoRedoEnabled(False)
        cursor = QTextCursor(scratch)
        cursor.beginEditBlock()
        cursor.setBlockFormat(line)
        pieces = ((code, Token.Text),) if streaming else tokens(code, language)
        for value, ttype in pieces:
            for j, piece in enumerate(value.split("\n")):
                if j:
                    cursor.insertBlock(line, self.base)
                if piece:
                    cursor.insertText(piece, self.format(ttype))
        cursor.endEditBlock()
        fragment = QTextDocumentFragment(scratch)
        if not streaming:
            self._fragments[key] = fragment
            if len(self._fragments) > 200:
                self._fragments.popitem(last=False)
        return fragment


# -- the document ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodeBlock:
    first: int  # number of its first and last QTextBlock
    last: int
    code: str  # exactly what Copy copies
    label: str


class MessageDocument(QTextDocument):
    """A message's text; ``code_blocks`` says where its fenced code blocks are."""

    def __init__(self, font: QFont):
        super().__init__()
        self.code_blocks: list[CodeBlock] = []
        self.chrome_font: QFont | None = None  # the label's and Copy's, when there is code
        self.gap = self.strip = 0
        self.setUndoRedoEnabled(False)
        self.setDocumentMargin(0)
        self.setDefaultFont(font)
        option = QTextOption()
        option.setWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.setDefaultTextOption(option)

    def height(self) -> int:
        """The laid-out height, a last code block's bottom padding included."""
        height = self.size().height()
        if self.code_blocks and self.code_blocks[-1].last == self.blockCount() - 1:
            height += 2 * self.gap
        return int(height) + 1


def message_document(text: str, font: QFont, theme: CodeTheme, *, markdown: bool,
                     width: int, streaming: bool = False,
                     stored: str | None = None) -> MessageDocument:
    """``text`` laid out at ``width``: prose as markdown (or plain, for ``markdown`` False, or
    text with no markdown syntax: it lays out the same, twice as fast), fenced code
    highlighted — but for a last block still ``streaming``: highlighting it again per token
    would cost more than the whole layout. ``stored``: the text as stored, when ``text``
    shows some of its characters as escapes (the same fences, character for character
    elsewhere): each code block's Copy gives its code as stored, not as shown."""
    doc = MessageDocument(font)
    parts, unclosed = _split(text) if "```" in text or "~~~" in text else ([(text, None)], False)
    if all(lang is None for _, lang in parts):
        if markdown and MARKDOWN.search(text):
            doc.setMarkdown(text, MARKDOWN_FEATURES)
            _shade_code_blocks(doc)
        else:
            doc.setPlainText(text)
    else:
        _fill(doc, parts, theme, markdown, streaming and unclosed)
        if stored is not None and stored != text:
            # (stored may hold more: a message shown in part; its blocks come first, and
            # the one the cut fell in copies whole)
            codes = [part for part, language in _split(stored)[0] if language is not None]
            if len(codes) >= len(doc.code_blocks):
                doc.code_blocks = [replace(block, code=code)
                                   for block, code in zip(doc.code_blocks, codes)]
    doc.setTextWidth(width)
    return doc


def _fill(doc: MessageDocument, parts: list[tuple[str, str | None]], theme: CodeTheme,
          markdown: bool, streaming: bool) -> None:
    """``streaming``: the last part is a code block still being written."""
    font = doc.defaultFont()
    doc.chrome_font = QFont(font)
    doc.chrome_font.setPointSizeF(max(6.0, font.pointSizeF() * 0.85))
    doc.gap = gap = max(2, QFontMetrics(font).height() // 3)
    doc.strip = QFontMetrics(doc.chrome_font).height() + gap
    if parts[0][1] is not None:  # a first block's top margin is ignored: the frame's is not
        frame = doc.rootFrame().frameFormat()
        frame.setTopMargin(doc.strip)
        doc.rootFrame().setFrameFormat(frame)
    line = QTextBlockFormat()
    line.setLeftMargin(2 * gap)
    line.setRightMargin(2 * gap)
    cursor = QTextCursor(doc)
    cursor.beginEditBlock()
    for i, (part, language) in enumerate(parts):
        if i:
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        if language is None:
            prose = part.strip("\n")
            if markdown and MARKDOWN.search(prose):
                cursor.insertMarkdown(prose, MARKDOWN_FEATURES)
            else:
                cursor.insertText(prose)
            continue
        first = cursor.blockNumber()
        label = language or guess_language(part)
        open_ = streaming and i == len(parts) - 1
        cursor.insertFragment(theme.fragment(part, label.lower(), line, streaming=open_))
        last = cursor.blockNumber()
        # a fragment's first block takes the format of the block it goes into
        for number in {first, last}:
            fmt = QTextBlockFormat(line)
            if number == first:
                fmt.setTopMargin(gap + doc.strip)
            if number == last:
                fmt.setBottomMargin(2 * gap)
            QTextCursor(doc.findBlockByNumber(number)).setBlockFormat(fmt)
        doc.code_blocks.append(CodeBlock(first, last, part, label))
    cursor.endEditBlock()
    _shade_code_blocks(doc)


def _shade_code_blocks(doc: QTextDocument) -> None:
    """Give markdown's own code blocks (indented ones) a faint background."""
    block = doc.begin()
    shade = QColor(128, 128, 128, 38)
    while block.isValid():
        fmt = block.blockFormat()
        if fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or fmt.nonBreakableLines():
            fmt.setBackground(shade)
            QTextCursor(block).setBlockFormat(fmt)
        block = block.next()


# -- the chrome: background, label, Copy ------------------------------------------------------


def code_boxes(doc: QTextDocument) -> list[tuple[CodeBlock, QRectF, QRectF]]:
    """(block, its box, its Copy button) in document coordinates."""
    if not isinstance(doc, MessageDocument) or not doc.code_blocks:
        return []
    layout = doc.documentLayout()
    fm = QFontMetrics(doc.chrome_font)
    copy_w = fm.horizontalAdvance(COPY) + 2 * doc.gap
    width = doc.textWidth()
    out = []
    for block in doc.code_blocks:
        top = layout.blockBoundingRect(doc.findBlockByNumber(block.first)).top() - doc.strip
        bottom = layout.blockBoundingRect(doc.findBlockByNumber(block.last)).bottom() + doc.gap
        box = QRectF(0, top, width, bottom - top)
        out.append((block, box, QRectF(box.right() - copy_w, top, copy_w, doc.strip)))
    return out


def code_block_at(doc: QTextDocument, x: float, y: float) -> CodeBlock | None:
    """The block whose Copy button is at (x, y), document coordinates."""
    return next((block for block, _, copy in code_boxes(doc) if copy.contains(x, y)), None)


def paint_code(painter: QPainter, doc: QTextDocument, palette: QPalette) -> None:
    """Each code block's background, language label and Copy button (under the text)."""
    boxes = code_boxes(doc)
    if not boxes:
        return
    painter.save()
    background = code_background(palette)
    text = palette.color(QPalette.ColorRole.Text)
    painter.setFont(doc.chrome_font)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    radius = doc.gap
    left = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
    for block, box, copy in boxes:
        painter.setPen(blend(background, text, 0.12))
        painter.setBrush(background)
        painter.drawRoundedRect(box.adjusted(0.5, 0.5, -0.5, -0.5), radius, radius)
        strip = QRectF(box.left() + 2 * doc.gap, box.top(), box.width() - 4 * doc.gap, doc.strip)
        painter.setPen(palette.color(QPalette.ColorRole.PlaceholderText))
        painter.drawText(strip, left, block.label)
        painter.setPen(palette.color(QPalette.ColorRole.Link))
        painter.drawText(copy, Qt.AlignmentFlag.AlignCenter, COPY)
    painter.restore()
