"""The language of a code block whose fence names none, from its syntax.

The bundled model writes most of its code in bare ```` ``` ```` fences, and Pygments'
``analyse_text`` scores plain Python or JavaScript 0 without a shebang. Here each language
has scored signals (a ``def x(...):`` line, ``const x =``, ``=>``, ``#include <…>``,
``public class``, ``SELECT … FROM``, ``key: value`` lines, keywords like ``None`` or
``nullptr``), each counted up to a cap so that one repeated construct cannot outweigh the
rest. The best language wins only with at least ``MIN_SCORE`` points and ``MARGIN`` ahead
of the next one, else the block stays plain ``"text"`` (prose, one ambiguous line).
TypeScript is JavaScript with types and C++ is C with more: each pair is scored as one
family, then told apart by the signals only the first has. JSON is what ``json.loads``
reads as an object or array (or, cut off while streaming, a block that starts like one).
The names returned are Pygments lexer names.

Fast enough to run per streamed token: only the first ``HEAD_LINES`` lines are read, each
line signal is a pattern anchored on a newline (a literal prefix the regex engine scans for),
each other one starts with a literal, keywords are counted once over the split words, and
guesses are cached.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from functools import lru_cache

TEXT = "text"
MIN_SCORE = 2.5
MARGIN = 2.0  # points ahead of the second language, and at least a quarter of the winner's
HEAD_LINES = 100
HEAD_CHARS = 8000
#: the family a language is scored in
FAMILY = {"typescript": "javascript", "cpp": "c"}

Weights = dict[str, float]
_PATTERNS: list[tuple[tuple[re.Pattern[str], ...], Weights, int]] = []
_WORDS: list[tuple[tuple[str, ...], Weights, int]] = []
_START: list[tuple[re.Pattern[str], Weights]] = []


def _line(pattern: str, weights: Weights, cap: int = 4, indent: bool = True, flags: int = 0) -> None:
    """``pattern`` at the start of a line (after its indentation, for ``indent``); ``$`` ends a line."""
    prefix = r"\n[ \t]*+" if indent else r"\n"
    _PATTERNS.append(((re.compile(f"{prefix}(?:{pattern})", re.MULTILINE | flags),), weights, cap))


def _text(patterns: str | tuple[str, ...], weights: Weights, cap: int = 4, flags: int = 0) -> None:
    """``patterns`` anywhere, counted together; each should start with a literal, which the
    engine scans for fast (an alternation of different ones is scanned for char by char)."""
    if isinstance(patterns, str):
        patterns = (patterns,)
    _PATTERNS.append((tuple(re.compile(p, re.MULTILINE | flags) for p in patterns), weights, cap))


def _words(words: str, weights: Weights, cap: int = 4) -> None:
    """Whole words, counted together."""
    _WORDS.append((tuple(words.split()), weights, cap))


def _start(pattern: str, weights: Weights) -> None:
    """``pattern`` at the very start of the block."""
    _START.append((re.compile(pattern, re.IGNORECASE), weights))


# -- what settles it ----------------------------------------------------------------------------
_start(r"#!.*\bpython", {"python": 8})
_start(r"#!.*\b(?:ba|z|k|da)?sh\b", {"bash": 8})
_start(r"#!.*\bnode\b", {"javascript": 8})
_start(r"<\?xml\s", {"xml": 8})
_text(r"<(?:!DOCTYPE\s+html|html[\s>])", {"html": 6}, 1, re.IGNORECASE)
_text(r"<\?php\b", {"php": 8}, 1)

# -- Python ---------------------------------------------------------------------------------------
_line(r"(?:async[ \t]+)?def[ \t]+\w+[ \t]*\(.*[:,(][ \t]*(?:#.*)?$", {"python": 3}, 5)
_line(r"class[ \t]+\w+(?:\(.*\))?[ \t]*:[ \t]*(?:#.*)?$", {"python": 3}, 3)
_line(r"from[ \t]+\.*[\w.]*[ \t]+import[ \t]+\S", {"python": 3}, 3)
_line(r"import[ \t]+[\w.]+(?:[ \t]+as[ \t]+\w+)?(?:[ \t]*,[ \t]*[\w.]+(?:[ \t]+as[ \t]+\w+)?)*[ \t]*(?:#.*)?$",
      {"python": 3}, 3)
_line(r"(?:if|elif|while|for|with|try|except|else|finally)\b[^{};\n]*:[ \t]*(?:#.*)?$", {"python": 1.5}, 6)
_line(r"for[ \t]+[\w, ()]+[ \t]+in[ \t]+.+:[ \t]*(?:#.*)?$", {"python": 1}, 3)
_PY_TYPE = r"(?:int|str|float|bool|bytes|list|dict|tuple|set|frozenset|object|Any|None|[\w.]+\[[^\]\n]*\])"
_line(rf"\w+:[ \t]*{_PY_TYPE}(?:[ \t]*\|[ \t]*[\w.\[\], ]+)*(?:[ \t]*=[ \t]*\S.*)?[ \t]*(?:#.*)?$", {"python": 1.5}, 6)
_line(r"elif\b|except\b|raise[ \t]|yield\b(?![^\n]*;[ \t]*$)|pass[ \t]*$|nonlocal[ \t]|global[ \t]|del[ \t]",
      {"python": 1.5}, 4)
_text(r"\[[^\[\]\n]+[ \t]for[ \t][^\[\]\n]+[ \t]in[ \t]", {"python": 1}, 2)
_text(r"self\.\w", {"python": 0.5}, 6)
_text((r"not (?<=\Wnot )in\b", r"is (?<=\Wis )(?:not|None)\b"), {"python": 1}, 3)
_text((r'"""', r"'''"), {"python": 1}, 2)
_text(r"f[\"'][^\"'\n]*\{", {"python": 1}, 2)
_words("None True False", {"python": 0.5}, 4)
_words("lambda", {"python": 1}, 2)
_words("print range enumerate isinstance len", {"python": 0.5}, 4)

# -- JavaScript and TypeScript ------------------------------------------------------------------
_line(r"(?:export[ \t]+)?(?:const|let|var)[ \t]+(?:[A-Za-z_$][\w$]*|\{[^}\n]*\}|\[[^\]\n]*\])[ \t]*=",
      {"javascript": 2.5}, 6)
_line(r"import[ \t]+(?:.*\bfrom[ \t]+)?['\"]", {"javascript": 3}, 3)
_line(r"export[ \t]+(?:default|const|let|function|class|async|type|interface|enum|\{|\*)", {"javascript": 3}, 3)
_line(r"(?!(?:if|for|while|switch|catch|return|function)\b)[\w$]+[ \t]*\([ \t]*[\w$][^()\n]*\)[ \t]*\{[ \t]*$",
      {"javascript": 1}, 4)
_text(r"=>", {"javascript": 1.5}, 6)
_text(r"function\b[ \t]*\*?[ \t]*[\w$]*[ \t]*\(", {"javascript": 2}, 4)
_text(r"console\.(?:log|error|warn|info|debug)\(", {"javascript": 3}, 3)
_text((r"require\([ \t]*['\"]", r"module\.exports\b"), {"javascript": 3}, 3)
_text((r"document\.\w", r"window\.\w", r"exports\.\w", r"JSON\.(?:parse|stringify)\(", r"process\.(?:env|argv)\b",
       r"\.(?:addEventListener|then)\("), {"javascript": 2}, 4)
_text(("===(?<!====)(?!=)", "!==(?!=)"), {"javascript": 1.5}, 4)
_text(r"`[^`\n]*\$\{", {"javascript": 1}, 3)
_text((r"async[ \t]+(?:function\b|\(|[\w$]+[ \t]*=>)", r"await[ \t]"), {"javascript": 1}, 3)
_text(r"this\.\w", {"javascript": 0.5, "java": 0.5}, 4)
_words("undefined typeof Promise", {"javascript": 1}, 3)
_words("instanceof", {"javascript": 0.5, "java": 0.5}, 2)
_line(r"(?:export[ \t]+)?(?:declare[ \t]+)?(?:interface|type)[ \t]+[A-Z]\w*(?:<[^>\n]*>)?[ \t]*(?:=|\{|extends\b)",
      {"typescript": 3}, 5)
_line(r"(?:export[ \t]+)?declare[ \t]+(?:class|function|const|let|var|module|namespace|global|enum)\b"
      r"|import[ \t]+type\b", {"typescript": 3}, 3)
_line(r"(?:export[ \t]+)?(?:const|let|var)[ \t]+[\w$]+[ \t]*:[ \t]*[^=\n]+=", {"typescript": 2}, 4)
_TS_TYPE = (r"(?:string|number|boolean|any|unknown|void|never|undefined|object|bigint|symbol"
            r"|Promise<|Record<|Array<|[A-Za-z_]\w*\[\])")
_line(rf"(?:readonly[ \t]+)?[\w$]+\??[ \t]*:[ \t]*(?:{_TS_TYPE}|[A-Z][\w.]*)[^;\n]*;[ \t]*$", {"typescript": 1}, 6)
_line(r"(?:public|private|protected|readonly)[ \t]+(?:readonly[ \t]+)?[\w$]+\??[ \t]*[:;=(]", {"typescript": 1}, 4)
_text(rf"[(,][ \t]*[\w$]+\??[ \t]*:[ \t]*{_TS_TYPE}", {"typescript": 1.5}, 5)
_text(rf"\)[ \t]*:[ \t]*{_TS_TYPE}", {"typescript": 2}, 4)
_text(r"as (?<=\Was )(?:const|any|unknown|string|number)\b", {"typescript": 2}, 3)
_words("keyof", {"typescript": 2}, 2)

# -- C and C++ --------------------------------------------------------------------------------------
_line(r"#[ \t]*(?:include[ \t]*[<\"]|define[ \t]+[A-Z_][A-Z0-9_]*\b|undef[ \t]+\w|ifn?def[ \t]+\w+[ \t]*$|endif\b"
      r"|pragma[ \t]|(?:el)?if[ \t]+(?:!?[ \t]*defined\b|\d|[A-Z_]{2,}))|#define[ \t]", {"c": 3}, 6)
_line(r"(?:(?:static|extern|const|unsigned|signed|inline|volatile|register|struct|enum|union)[ \t]+)*"
      r"(?:void|int|char|long|short|float|double|size_t|ssize_t|bool|FILE|\w+_t)(?:[ \t]+\**|[ \t]*\*+)[ \t]*\w+[ \t]*"
      r"(?:\(|\[|=[^=]|;|,)", {"c": 1.5, "java": 0.5}, 6)
_line(r"typedef[ \t]", {"c": 3}, 4)
_line(r"(?:struct|union|enum)[ \t]+\w+[ \t]*\{", {"c": 1.5}, 3)
_line(r"\{[ \t]*$", {"c": 0.5, "java": 0.5}, 2, indent=False)

_text(r"->\w", {"c": 1}, 4)
_text(r"\(\*\w+\)[ \t]*\(", {"c": 2}, 3)
_text(r"int[ \t]+main[ \t]*\(", {"c": 3}, 1)
_text(r"static[ \t]+(?:int|void|char|const|inline|struct|long|bool|double|float|unsigned)\b", {"c": 1, "java": 0.3}, 3)
_words("printf fprintf sprintf snprintf malloc calloc realloc memcpy memset strlen strcmp strcpy sizeof fopen"
       " fclose", {"c": 1.5}, 5)
_text(r"NULL\b(?<!\wNULL)(?<!NOT NULL)", {"c": 1}, 3)
_words("unsigned extern", {"c": 1}, 3)
_line(r"#[ \t]*include[ \t]*<[\w/]+>", {"cpp": 3}, 3)
_line(r"template[ \t]*<|using[ \t]+namespace\b|namespace[ \t]+\w+[ \t]*\{?[ \t]*$", {"cpp": 3}, 3)
_line(r"(?:public|private|protected)[ \t]*:[ \t]*$", {"cpp": 3}, 2)
_line(r"class[ \t]+\w+[ \t]*(?::[ \t]*(?:public|private|protected)[ \t]+\w+)?[ \t]*\{?[ \t]*$",
      {"cpp": 1, "java": 1, "javascript": 1}, 2)
_text(r"std::\w", {"cpp": 3}, 4)
_text((r"operator[ \t]*[^\s\w]{1,3}[ \t]*\(", r"this->", r"~\w+[ \t]*\([ \t]*\)"), {"cpp": 2}, 4)
_text(r"auto[ \t]*&?[ \t]+\w+[ \t]*[=:(]", {"cpp": 2}, 3)
_text(r"::\w(?<=\w::\w)", {"cpp": 1, "rust": 1}, 3)
_words("cout cin cerr endl", {"cpp": 2}, 2)
_words("nullptr constexpr noexcept decltype static_cast dynamic_cast reinterpret_cast const_cast", {"cpp": 2}, 4)
_text(r"virtual[ \t]+(?:void|bool|int|~|[A-Z]\w*[ \t*&]|std::)", {"cpp": 2}, 3)

# -- Java ---------------------------------------------------------------------------------------------
_line(r"(?:public|private|protected)[ \t]+(?:(?:static|final|abstract|sealed)[ \t]+)*"
      r"(?:class|interface|enum|record)[ \t]+\w+", {"java": 4}, 2)
_line(r"import[ \t]+(?:static[ \t]+)?[\w.]+(?:\.\*)?[ \t]*;[ \t]*$", {"java": 3}, 3)
_line(r"package[ \t]+[\w.]+[ \t]*;[ \t]*$", {"java": 3}, 1)
_line(r"@(?:Override|Deprecated|SuppressWarnings|FunctionalInterface|Test|Autowired|Bean|Component|Service|Entity"
      r"|Nullable|NonNull)\b", {"java": 2}, 3)
_line(r"(?:public|private|protected)[ \t]+(?:(?:static|final|abstract|synchronized|native|default)[ \t]+)*"
      r"[\w<>\[\], .?]+[ \t]+\w+[ \t]*\(", {"java": 2.5}, 5)
_line(r"(?:public|private|protected)[ \t]+(?:(?:static|final)[ \t]+)*[\w<>\[\], .?]+[ \t]+\w+[ \t]*[=;]",
      {"java": 1.5}, 3)
_text(r"System\.(?:(?:out|err|in)\b|\w+\()", {"java": 3}, 2)
_text(r"(?:String|Integer|Boolean|Long|Object)(?:\[\])?[ \t]+\w+[ \t]*[=;,)]", {"java": 1}, 3)
_text(r"new[ \t]+[A-Z]\w*(?:<[^>\n]*>)?[ \t]*[(\[]", {"java": 0.7, "javascript": 0.3}, 4)
_text((r"final[ \t]+(?:[A-Z]\w*|int|long|boolean|double|float|char|byte|short|var)\b", r"\)[ \t]*throws[ \t]+[A-Z]"),
      {"java": 1}, 3)
_words("ArrayList HashMap Arrays Collections Objects Optional", {"java": 1}, 3)
_line(r"(?:final[ \t]+)?(?:boolean|byte|String)(?:\[\])*[ \t]+\w+[ \t]*[=;]", {"java": 1}, 4)
_text(r"catch[ \t]*\([ \t]*[A-Z]\w*(?:[ \t]*\|[ \t]*[A-Z]\w*)*[ \t]+\w+[ \t]*\)", {"java": 2}, 2)
_text(r"new[ \t]+(?:byte|int|long|char|boolean|double|float|short)\[", {"java": 1.5, "cpp": 0.5}, 2)
_text((r"\.(?:equals|hashCode|getClass|isEmpty)\(", r"\{@code\b", r"Exception\b(?<=\w\wException)"), {"java": 1}, 4)

# -- shell ------------------------------------------------------------------------------------------
_line(r"(?:if|elif|while|until)[ \t].*;[ \t]*then\b|(?:then|fi|done|esac|do)[ \t]*(?:;.*|#.*)?$", {"bash": 2}, 6)
_line(r"case[ \t].*[ \t]in[ \t]*$", {"bash": 3}, 2)
_line(r"(?:sudo[ \t]+)?(?:apt|apt-get|pip3?|npm|npx|yarn|pnpm|git|docker|brew|cargo|conda|systemctl|kubectl|go"
      r"|python3?[ \t]+-m[ \t]+pip)[ \t]+(?:-{1,2}\w|install|uninstall|update|upgrade|clone|commit|push|pull"
      r"|checkout|run|build|add|init|status|remove|start|stop|restart|enable|exec|test|log|diff|create|activate"
      r"|config|get|apply|ps|compose|switch|branch|merge|rebase|fetch|list|show|search)\b", {"bash": 3}, 6)
_line(r"sudo[ \t]+\w|(?:curl|wget)[ \t]+\S*(?:https?://|-)", {"bash": 2}, 4)
_line(r"(?:echo|printf|cd|ls|mkdir|rm|cp|mv|cat|grep|sed|awk|tar|source|set|unset|local|readonly|exit|shift"
      r"|trap|exec|eval|read|install|ln|touch|find|xargs|chmod|chown)[ \t]+[-\w\"'$./~*]", {"bash": 1.5}, 6)
_line(r"export[ \t]+[A-Za-z_]\w*=", {"bash": 2}, 3)
_line(r"\.[ \t]+/?[\w/.${}-]+[ \t]*$", {"bash": 1}, 2)
_line(r"[A-Za-z_]\w*=(?:\S|$)", {"bash": 1}, 4)
_line(r"[\w-]+[ \t]*\(\)[ \t]*\{?[ \t]*$", {"bash": 1}, 3)
_line(r"\$[ \t]+\w", {"bash": 2}, 4)
_text(r";[ \t]*do[ \t]*$", {"bash": 2}, 3)
_text(r";;[ \t]*$", {"bash": 1.5}, 3)
_text((r"\$(?:\(|[1-9@#?*]|\{\w+[:#%/\^,-])", r'"\$\w+"'), {"bash": 1.5}, 4)
_text(r"\$(?:\{\w+\}|[A-Za-z_]\w*)", {"bash": 0.5}, 4)
_text((r"\[\[?[ \t]+!?[ \t]*(?:-[a-zA-Z][ \t]|\"?\$)", r"\]\](?<=[ \t]\]\])",
       r"-(?:eq|ne|lt|gt|le|ge)[ \t](?<=[ \t]-\w\w.)"), {"bash": 2}, 4)
_text((r"2>&1", r">[ \t]*/dev/null", r"\|[ \t]*(?:grep|sed|awk|xargs|sort|uniq|head|tail|wc|cut|tr|tee)\b"),
      {"bash": 2}, 4)

# -- JSON (scored only for a block that starts with { or [) -----------------------------------
_line(r"\"[^\"\n]*\"[ \t]*:[ \t]*(?:[\"{\[\d-]|true\b|false\b|null\b)", {"json": 1}, 8)

# -- YAML -----------------------------------------------------------------------------------------
_line(r"---[ \t]*$", {"yaml": 1.5}, 2, indent=False)
_line(r"(?!(?:else|try|finally|except|default|public|private|protected)\b)[\w.-]+:[ \t]*(?:#.*)?$", {"yaml": 1}, 8)
_line(r"[\w.-]+:[ \t]+(?![ \t]*[{(=])(?!.*[;,{(\[][ \t]*$)(?!" + _PY_TYPE + r"[ \t]*(?:[=|#]|$))[^\s`]", {"yaml": 1}, 8)
_line(r"-[ \t]+[\w.-]+:(?:[ \t]+[^\s`]|[ \t]*$)", {"yaml": 2}, 4)  # a backquote starts no YAML value
_line(r"-[ \t]+\S", {"yaml": 0.5}, 6)
_text(r":[ \t]+[|>][-+]?[ \t]*$", {"yaml": 2}, 2)

# -- HTML -----------------------------------------------------------------------------------------
_TAG = (r"</?(?:html|head|body|div|span|p|a|ul|ol|li|table|thead|tbody|tr|td|th|h[1-6]|form|input|button|script"
        r"|style|meta|link|title|img|br|hr|nav|header|footer|section|article|main|label|select|option|textarea"
        r"|iframe|canvas|svg|strong|em|pre|code)\b[^>\n]*>")
_line(_TAG, {"html": 1.5}, 6, flags=re.IGNORECASE)
_text(_TAG, {"html": 0.3}, 8, re.IGNORECASE)
_text(r"</[\w:-]+>", {"html": 0.5, "xml": 0.5}, 4)
_text(r"<!--", {"html": 1, "xml": 1}, 1)

# -- SQL -------------------------------------------------------------------------------------------
_line(r"SELECT[ \t]+\S|INSERT[ \t]+INTO|UPDATE[ \t]+\w+[ \t]+SET|DELETE[ \t]+FROM"
      r"|CREATE[ \t]+(?:OR[ \t]+REPLACE[ \t]+)?(?:TEMP(?:ORARY)?[ \t]+)?(?:UNIQUE[ \t]+)?(?:TABLE|VIEW|INDEX"
      r"|TRIGGER|FUNCTION|PROCEDURE|DATABASE|SCHEMA|EXTENSION|SEQUENCE|TYPE)\b|DROP[ \t]+(?:TABLE|VIEW|INDEX"
      r"|TRIGGER|FUNCTION|DATABASE|SCHEMA|EXTENSION)\b|ALTER[ \t]+TABLE|GRANT[ \t]+\w+"
      r"|WITH[ \t]+(?:RECURSIVE[ \t]+)?\w+[ \t]+AS[ \t]*\(", {"sql": 3}, 4)
_line(r"select[ \t].*\bfrom\b|insert[ \t]+into[ \t]+\w|update[ \t]+\w+[ \t]+set\b|delete[ \t]+from[ \t]+\w"
      r"|create[ \t]+(?:table|view|index)[ \t]+\w|drop[ \t]+table[ \t]+\w", {"sql": 2}, 4)
_line(r"(?:FROM|WHERE|UNION|(?:(?:LEFT|RIGHT|INNER|OUTER|CROSS)[ \t]+)?JOIN|GROUP[ \t]+BY|ORDER[ \t]+BY|HAVING|LIMIT"
      r"|VALUES|SELECT)\b", {"sql": 1.5}, 4)
_line(r"--[ \t]", {"sql": 0.5}, 2)
_SQL_PAIRS = ("group by", "order by", "primary key", "not null", "left join", "inner join")
_text(tuple(rf"{a}[ \t]+{b}\b" for pair in _SQL_PAIRS for a, b in (pair.split(), pair.upper().split())), {"sql": 1}, 3)
_words("FROM WHERE JOIN BY VALUES KEY REFERENCES LIMIT INTEGER VARCHAR TEXT RETURNS LANGUAGE BEGIN END AS ON AND"
       " OR SET INTO DEFAULT CASE WHEN THEN ELSE", {"sql": 0.3}, 6)

# -- a few more of the languages a reply is often in ------------------------------------------
_line(r"(?:pub(?:\(crate\))?[ \t]+)?(?:async[ \t]+)?fn[ \t]+\w+", {"rust": 3}, 4)
_line(r"use[ \t]+\w+(?:::[\w{}*, ]+)+;", {"rust": 3}, 3)
_line(r"impl\b|#\[\w", {"rust": 2}, 3)
_text((r"let[ \t]+mut\b", r"&(?:mut[ \t]|self\b)"), {"rust": 2}, 4)
_text(r"!\((?<=\w!\()", {"rust": 1}, 3)
_words("Self", {"rust": 2}, 2)
_line(r"package[ \t]+\w+[ \t]*$", {"go": 3}, 1)
_line(r"func[ \t]+(?:\([^)\n]*\)[ \t]*)?\w+[ \t]*\(", {"go": 3}, 4)
_line(r"import[ \t]*\([ \t]*$|import[ \t]+\"|type[ \t]+\w+[ \t]+(?:struct|interface)[ \t]*\{", {"go": 2.5}, 3)
_text((r"fmt\.\w+\(", r"err[ \t]*!=[ \t]*nil\b"), {"go": 2.5}, 3)
_text(r":=", {"go": 1}, 4)
_line(r"(?:[.#][\w-]+|@media|@import|@font-face|:root|body|html|\*(?=[ \t]*\{))[^{;\n]*\{[ \t]*$", {"css": 2}, 4)
_line(r"(?:color|background(?:-\w+)?|margin(?:-\w+)?|padding(?:-\w+)?|border(?:-\w+)*|font(?:-\w+)?|display"
      r"|position|width|height|flex(?:-\w+)?|justify-content|align-items|text-align|z-index|overflow|opacity"
      r"|cursor|transition|transform|box-shadow|line-height|gap|grid(?:-\w+)*|max-width|min-width|max-height"
      r"|min-height)[ \t]*:[ \t]*[^;{}\n]+;", {"css": 1}, 8)
_line(r"diff[ \t]--git|index[ \t][0-9a-f]+\.\.[0-9a-f]+|---[ \t]\S|\+\+\+[ \t]\S"
      r"|@@[ \t]-\d+(?:,\d+)?[ \t]\+\d+(?:,\d+)?[ \t]@@", {"diff": 3}, 4, indent=False)
_line(r"\[{1,2}[\w.\"-]+\]{1,2}[ \t]*$", {"toml": 2}, 3)
_line(r"[\w.\"-]+[ \t]*=[ \t]*(?:\"|'|\d|true\b|false\b|\[|\{)", {"toml": 1}, 6)

#: a line of prose: five words in a row (but in a comment, which says the block is code)
_PROSE = re.compile(r"\n[ \t]*+(?!#|//|--)[^\n]*?(?<![\w.$-])[A-Za-z][a-z'’]+,?(?: [A-Za-z][a-z'’]+,?){4}(?![\w(.$])")
_NOT_WORD = str.maketrans({c: " " for c in "!\"#$%&'()*+,-./:;<=>?@[\\]^`{|}~"})


def _head(code: str) -> str:
    """The lines read, each after a newline and before one."""
    return "\n" + "\n".join(code[:HEAD_CHARS].split("\n", HEAD_LINES)[:HEAD_LINES]) + "\n"


def scores(code: str) -> dict[str, float]:
    """Each language's points (TypeScript's and C++'s own apart from their family's)."""
    head = _head(code)
    out: dict[str, float] = {}

    def add(weights: Weights, n: int) -> None:
        for lang, weight in weights.items():
            out[lang] = out.get(lang, 0.0) + weight * n

    body = head.lstrip()
    for pattern, weights in _START:
        if pattern.match(body):
            add(weights, 1)
    for patterns, weights, cap in _PATTERNS:
        n = sum(len(pattern.findall(head)) for pattern in patterns)
        if n:
            add(weights, min(n, cap))
    words = Counter(head.translate(_NOT_WORD).split())
    for group, weights, cap in _WORDS:
        n = sum(words[w] for w in group if w in words)
        if n:
            add(weights, min(n, cap))
    if body[:1] in ("{", "["):  # JSON cut off while streaming
        out["json"] = out.get("json", 0.0) + 2
    else:
        out.pop("json", None)
    if "toml" in out and "\n[" not in head.replace(" ", ""):  # key = value lines, but no [table]
        out.pop("toml")
    return out


@lru_cache(maxsize=256)
def guess(code: str) -> str:
    """The Pygments name of the language ``code`` is in, or ``"text"`` when unsure."""
    stripped = code.replace("\r\n", "\n").strip()
    if not stripped:
        return TEXT
    if stripped[0] in "{[" and stripped[-1] in "}]":
        try:
            if isinstance(json.loads(stripped), dict | list):
                return "json"
        except ValueError:
            pass
    raw = scores(stripped)
    prose = len(_PROSE.findall(_head(stripped)))
    family: dict[str, float] = {}
    for lang, score in raw.items():
        key = FAMILY.get(lang, lang)
        family[key] = family.get(key, 0.0) + score
    ranked = sorted(family.items(), key=lambda kv: kv[1], reverse=True) or [(TEXT, 0.0)]
    best, top = ranked[0]
    second = ranked[1][1] if len(ranked) > 1 else 0.0
    if top < max(MIN_SCORE, 1.5 * prose) or top - second < max(MARGIN, 0.25 * top):
        return TEXT
    if best == "javascript" and raw.get("typescript", 0.0) >= 2:
        return "typescript"
    if best == "c" and raw.get("cpp", 0.0) >= 2:
        return "cpp"
    return best
