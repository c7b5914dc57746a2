"""A bounded sandbox for a model's own chat template (``tokenizer.chat_template``).

A GGUF's template is untrusted input run at every load and every turn. jinja2's
``ImmutableSandboxedEnvironment`` keeps it from reaching Python; this module bounds the
*work* it may do, so that a template that loops for ever, or makes gigabytes, is refused
(:class:`TemplateTooCostly`) instead of holding the app:

* **steps**: one rendering may take :data:`TEMPLATE_STEPS`. A loop step, a call, a filter,
  a test, an operator is one step, plus one for every :data:`TEXT_PER_STEP` characters and
  every :data:`ITEMS_PER_STEP` list items it is given or makes; a comparison's operands and
  a slice are charged by size too, and a list walked to be measured one step an item
  (300,000 ``upper()`` of an 8 MB text are 300,000 steps by count, 19 billion by size);
* **sizes, before they are made**: what ``str.replace``, ``join``, ``expandtabs``,
  ``format``, ``*``, ``+``, ``%``, ``split`` and the filters (``indent``, ``format``,
  ``join``, ``tojson``, ``escape``, ...) would make is predicted from their arguments and
  refused past :data:`TEMPLATE_TEXT` (or, for lists, :data:`TEMPLATE_REPEAT` items) before
  the text exists; widths (``center``, ``ljust``, ``zfill``) are capped at
  :data:`TEMPLATE_ARGUMENT`; a list or dict is measured (with an early exit) before it is
  written out as text;
* **time**: a rendering that has worked :data:`TEMPLATE_SECONDS` of CPU is refused within
  1,024 steps, whatever it counted (a backstop for work no count or size sees; the counts
  above come first);
* **memory**: a ``MemoryError`` inside a rendering is the template's refusal too.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from typing import Any

#: the work one rendering of a model's template may do, in steps (see the module's
#: docstring; a long conversation with tools takes a few thousand)
TEMPLATE_STEPS = 1_000_000
#: characters of text one step pays for
TEXT_PER_STEP = 256
#: list items one step pays for
ITEMS_PER_STEP = 16
#: the longest text (or list) a template may make, its whole output included
TEMPLATE_TEXT = 64 << 20
#: the most a template may repeat a text or a list (``'x' * n``) to, and the most items
#: a list it makes may hold
TEMPLATE_REPEAT = 1 << 20
#: the largest whole number a template may pass to a call or a filter (a width, an indent)
TEMPLATE_ARGUMENT = 100_000
#: the most CPU time one rendering may take (its thread's: a busy or suspended machine
#: does not count), whatever its steps (a backstop)
TEMPLATE_SECONDS = 10.0
#: a width or precision of 7 digits or more in a format string
_WIDE_FORMAT = re.compile(r"\d{7,}")
_DIGITS = re.compile(r"\d+")
_WHITESPACE = "".join(c for c in map(chr, range(0x3001)) if c.isspace())
_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
_CONTAINERS = (list, tuple, dict, set, frozenset)
#: filters that do not turn their value into text (the others are measured first)
_STRUCTURAL = frozenset({
    "abs", "attr", "batch", "bool", "count", "d", "default", "dictsort", "first", "float",
    "groupby", "int", "items", "last", "length", "list", "map", "max", "min", "random",
    "reject", "rejectattr", "reverse", "round", "select", "selectattr", "slice", "sort",
    "sum", "unique"})


class TemplateError(ValueError):
    """The model's chat template refused a conversation (its ``raise_exception``, an
    error of its own, or it did not finish)."""


class TemplateTooCostly(TemplateError):
    """The template's rendering ran past its budget (:data:`TEMPLATE_STEPS`, a text
    larger than :data:`TEMPLATE_TEXT`, :data:`TEMPLATE_SECONDS`, or memory)."""


def _too_large() -> TemplateTooCostly:
    return TemplateTooCostly(f"it made a text of more than {TEMPLATE_TEXT >> 20} MiB")


def _measure(value: Any) -> int:
    """The length of a text; of a list or tuple, its items' lengths (one level deep)."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return len(value) + sum(len(v) for v in value if isinstance(v, str))
    if isinstance(value, _CONTAINERS):
        return len(value)
    return 0


def _work(*values: Any) -> int:
    """The steps beyond the first that handling ``values`` costs, by their size."""
    chars = items = 0
    for value in values:
        if isinstance(value, (str, bytes)):
            chars += len(value)
        elif isinstance(value, _CONTAINERS):
            items += len(value)
            if isinstance(value, (list, tuple)):
                chars += sum(len(v) for v in value if isinstance(v, str))
    return chars // TEXT_PER_STEP + items // ITEMS_PER_STEP


def _check_arguments(args: Any) -> None:
    for arg in args:
        if type(arg) is int and abs(arg) > TEMPLATE_ARGUMENT:
            raise TemplateTooCostly(f"it asked for a size of {arg:,}")
    if sum(_measure(arg) for arg in args) > TEMPLATE_TEXT:
        raise _too_large()


def _checked_result(value: Any) -> Any:
    if _measure(value) > TEMPLATE_TEXT:
        raise _too_large()
    return value


def _refuse_over(size: int, items: bool = False) -> None:
    if items and size > TEMPLATE_REPEAT:
        raise TemplateTooCostly(f"it made a list of more than {TEMPLATE_REPEAT:,} items")
    if size > TEMPLATE_TEXT:
        raise _too_large()


class _Over(Exception):
    pass


def text_size(value: Any, indent: int = 0, charge: Any = None) -> int:
    """At least how long ``value`` is written out as text (``str``, ``tojson`` with
    ``indent``), counted with an early exit: refused past :data:`TEMPLATE_TEXT`. A list
    met twice (``[l] * n``) is measured once; the items looked at are ``charge``d (one
    step each, and one for the writing out that follows)."""
    if isinstance(value, str):
        return len(value)
    known: dict[int, int] = {}
    seen = [0]

    def size(v: Any, depth: int) -> int:
        if isinstance(v, str):  # quoted; control characters are escaped (``\\u0000``)
            return (len(v) if v.isprintable() else 6 * len(v)) + 2
        if isinstance(v, (bytes, bytearray)):
            return 4 * len(v) + 3
        if not isinstance(v, _CONTAINERS):
            return v.bit_length() // 3 + 2 if type(v) is int else 8
        if id(v) in known:
            return known[id(v)]
        total = 2
        seen[0] += len(v)
        for item in (v.items() if isinstance(v, dict) else v):
            total += size(item, depth + 1) + 2 + indent * (depth + 1)
            if total > TEMPLATE_TEXT:
                raise _Over
        known[id(v)] = total
        return total

    try:
        return size(value, 0)
    except _Over:
        raise _too_large() from None
    finally:
        if charge is not None:
            charge(2 * seen[0])  # a step a item for this walk, one for writing it out


def _format_size(fmt: str, values: Any, opener: str, charge: Any) -> int:
    """The most ``fmt % values`` or ``fmt.format(*values)`` can make."""
    values = list(values)
    widths = [int(d) for d in _DIGITS.findall(fmt)] + [v for v in values if type(v) is int]
    longest = max((text_size(v, charge=charge) for v in values), default=0)
    return len(fmt) + fmt.count(opener) * (max(widths, default=0) + longest)


def _count_any(text: str, chars: str) -> int:
    return sum(text.count(c) for c in chars)


def _predict_method(name: str, s: str, args: tuple, kwargs: dict, charge: Any) -> None:
    """Refuse a ``str`` method call whose result would be too large, before it runs."""
    arg = args[0] if args else None
    if name == "replace" and len(args) >= 2 and isinstance(arg, str) and isinstance(args[1], str):
        n = len(s) + 1 if arg == "" else s.count(arg)
        count = args[2] if len(args) > 2 else kwargs.get("count", -1)
        if type(count) is int and count >= 0:
            n = min(n, count)
        _refuse_over(len(s) + n * (len(args[1]) - len(arg)))
    elif name == "join" and isinstance(arg, (str, list, tuple)):
        texts = len(arg) if isinstance(arg, str) else sum(_measure(v) for v in arg)
        _refuse_over(texts + max(len(arg) - 1, 0) * len(s))
    elif name == "expandtabs":
        tab = arg if arg is not None else kwargs.get("tabsize", 8)
        _refuse_over(len(s) + s.count("\t") * max(tab if type(tab) is int else 8, 0))
    elif name in ("upper", "lower", "title", "capitalize", "swapcase", "casefold"):
        _refuse_over(len(s) if s.isascii() else 3 * len(s))
    elif name in ("split", "rsplit"):
        sep = arg if arg is not None else kwargs.get("sep")
        pieces = s.count(sep) if isinstance(sep, str) and sep else _count_any(s, _WHITESPACE)
        _refuse_over(pieces + 1, items=True)
    elif name == "splitlines":
        _refuse_over(_count_any(s, _LINE_BREAKS) + 1, items=True)
    elif name in ("format", "format_map"):
        _refuse_over(_format_size(s, (*args, *kwargs.values()), "{", charge))


def _predict_filter(name: str, values: list, charge: Any) -> None:
    """Refuse a filter whose result would be too large, before it runs."""
    if not values:
        return
    value, rest = values[0], values[1:]
    if name not in _STRUCTURAL and not isinstance(value, str) and name != "tojson":
        text_size(value, charge=charge)  # the filter writes it out as text first
    if name == "tojson":
        indent = rest[0] if rest and type(rest[0]) is int else 0
        text_size(value, indent, charge)
    elif name == "join" and isinstance(value, (list, tuple)):
        glue = len(str(rest[0])) if rest else 0
        _refuse_over(sum(text_size(v, charge=charge) for v in value) + len(value) * glue)
    elif name == "list" and isinstance(value, str):
        _refuse_over(len(value), items=True)
    elif not isinstance(value, str):
        return
    elif name == "replace" and len(rest) >= 2:
        old, new = str(rest[0]), str(rest[1])
        n = len(value) + 1 if old == "" else value.count(old)
        _refuse_over(len(value) + n * max(len(new) - len(old), 0))
    elif name == "indent":
        width = rest[0] if rest else 4
        width = len(width) if isinstance(width, str) else width if type(width) is int else 4
        _refuse_over(len(value) + (value.count("\n") + 1) * width)
    elif name == "wordwrap":
        wrap = rest[2] if len(rest) > 2 and isinstance(rest[2], str) else "\n"
        _refuse_over(len(value) + (len(value) + 1) * len(wrap))
    elif name in ("e", "escape", "forceescape"):
        _refuse_over(len(value) + 4 * _count_any(value, "&<>\"'"))
    elif name == "format":
        _refuse_over(_format_size(value, rest, "%", charge))
    elif name in ("upper", "lower", "title", "capitalize"):
        _refuse_over(len(value) if value.isascii() else 3 * len(value))


class BoundedMixin:
    """What the sandbox adds to jinja2's ``ImmutableSandboxedEnvironment``: a step budget
    per rendering charged by size (ranges, loop steps, calls, filters, tests, operators,
    joins, output), sizes predicted before they are made, a bounded output, a clock."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._budget = threading.local()
        plain_range = self.globals["range"]
        del self.globals["lipsum"]  # seconds of work a call; no chat template needs it

        def bounded_range(*args: Any) -> range:
            numbers = plain_range(*args)
            self.charge(len(numbers))
            return numbers

        self.globals["range"] = bounded_range
        self.concat = self.bounded_join
        self.finalize = self.bounded_finalize
        for name, fn in list(self.filters.items()):
            self.filters[name] = self.bounded_filter(fn, name)
        for name, fn in list(self.tests.items()):
            self.tests[name] = self.charged(fn)

    def charge(self, steps: int) -> None:
        left = getattr(self._budget, "left", None)
        if left is None:
            return
        self._budget.left = left - steps
        if left - steps < 0:
            raise TemplateTooCostly(f"it took more than {TEMPLATE_STEPS:,} steps")
        until = getattr(self._budget, "until", None)  # the clock, every 1,024 steps
        if until is not None and (left ^ (left - steps)) >> 10 and time.thread_time() > until:
            raise TemplateTooCostly(f"it took more than {TEMPLATE_SECONDS:g} seconds of CPU")

    def steps(self, iterable: Any) -> Any:
        """A loop's iterable, each step charged."""
        for item in iterable:
            self.charge(1)
            yield item

    def bounded_join(self, parts: Any) -> str:
        parts = list(parts)
        _check_arguments(parts)
        self.charge(1 + 2 * _work(parts))
        return "".join(parts)

    def str_join(self, parts: Any) -> str:
        return self.bounded_join([p if isinstance(p, str) else self.bounded_str(p)
                                  for p in parts])

    def bounded_str(self, value: Any) -> str:
        text_size(value, charge=self.charge)
        return str(value)

    def sized(self, value: Any) -> Any:
        """An operand of a comparison, or a slice, charged by its size (comparing two 8 MB
        texts, looking for one in the other, or copying one is work)."""
        self.charge(_work(value))
        return value

    def bounded_finalize(self, value: Any) -> Any:
        """What ``{{ value }}`` writes, measured before it is made text."""
        if isinstance(value, _CONTAINERS):
            text_size(value, charge=self.charge)
        return value

    def call_binop(self, context: Any, operator_: str, left: Any, right: Any) -> Any:
        self.charge(1 + _work(left, right))
        sizes = [len(v) for v in (left, right) if isinstance(v, (str, list, tuple))]
        counts = [v for v in (left, right) if type(v) is int]
        if operator_ == "*" and sizes and counts and sizes[0] * counts[0] > TEMPLATE_REPEAT:
            raise TemplateTooCostly(f"it repeated a text {counts[0]:,} times")
        if operator_ in ("*", "**") and len(counts) == 2:
            bits = left.bit_length() * (right if operator_ == "**" else 1) + right.bit_length()
            if bits > 4096:
                raise TemplateTooCostly("it made a number too large")
        if operator_ == "+" and len(sizes) == 2:
            _refuse_over(sum(sizes))
        if operator_ == "%" and isinstance(left, str):
            if _WIDE_FORMAT.search(left):
                raise TemplateTooCostly("it formatted a text too wide")
            right_values = right if isinstance(right, tuple) else (right,)
            _check_arguments(right_values)
            _refuse_over(_format_size(left, right_values, "%", self.charge))
        result = _checked_result(self.binop_table[operator_](left, right))
        self.charge(_work(result))
        return result

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        receiver = getattr(__obj, "__self__", None)
        values = (*args, *kwargs.values())
        __self.charge(1 + _work(receiver, *values))
        _check_arguments(values)
        if isinstance(receiver, str):
            name = getattr(__obj, "__name__", "")
            if name == "join" and len(args) == 1 and not isinstance(args[0], (str, list, tuple)):
                args = (list(args[0]),)  # sized before it is joined
                __self.charge(_work(args[0]))
            _predict_method(name, receiver, args, kwargs, __self.charge)
        result = _checked_result(super().call(__context, __obj, *args, **kwargs))
        __self.charge(_work(result))
        return result

    def wrap_str_format(self, value: Any) -> Any:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt, name = value.__self__, value.__name__
        if _WIDE_FORMAT.search(fmt):
            raise TemplateTooCostly("it formatted a text too wide")

        @functools.wraps(wrapped)
        def predicted(*args: Any, **kwargs: Any) -> Any:
            _predict_method(name, fmt, args, kwargs, self.charge)
            return wrapped(*args, **kwargs)

        return predicted

    def bounded_filter(self, fn: Any, name: str) -> Any:
        @functools.wraps(fn)
        def bounded(*args: Any, **kwargs: Any) -> Any:
            values = [a for a in (*args, *kwargs.values()) if not hasattr(a, "environment")]
            self.charge(1 + _work(*values))
            _check_arguments(values)
            if name == "format" and values and isinstance(values[0], str) \
                    and _WIDE_FORMAT.search(values[0]):
                raise TemplateTooCostly("it formatted a text too wide")
            _predict_filter(name, values, self.charge)
            result = _checked_result(fn(*args, **kwargs))
            self.charge(_work(result))
            return result

        return bounded

    def charged(self, fn: Any) -> Any:
        @functools.wraps(fn)
        def test(*args: Any, **kwargs: Any) -> Any:
            self.charge(1 + _work(*args, *kwargs.values()))
            return fn(*args, **kwargs)

        return test

    def _parse(self, source: str, name: Any, filename: Any) -> Any:
        from jinja2 import nodes

        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Call(nodes.EnvironmentAttribute("steps"), [loop.iter], [],
                                   None, None, lineno=loop.lineno)
        return tree

    def render_bounded(self, template: Any, **context: Any) -> str:
        """``template`` rendered within :data:`TEMPLATE_STEPS`, :data:`TEMPLATE_TEXT`
        and :data:`TEMPLATE_SECONDS`; running out of memory is refusal too."""
        self._budget.until = time.thread_time() + TEMPLATE_SECONDS
        self._budget.left = TEMPLATE_STEPS
        parts: list[str] = []
        size = 0
        try:
            for part in template.generate(**context):
                size += len(part)
                if size > TEMPLATE_TEXT:
                    raise TemplateTooCostly(f"it wrote more than {TEMPLATE_TEXT >> 20} MiB")
                self.charge(_work(part))
                parts.append(part)
            return "".join(parts)
        except MemoryError:
            parts.clear()
            raise TemplateTooCostly("it ran out of memory") from None
        finally:
            self._budget.left = self._budget.until = None


@functools.lru_cache(maxsize=1)
def environment_class() -> type:
    from jinja2.compiler import CodeGenerator, operators
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generator(CodeGenerator):
        def visit_Concat(self, node: Any, frame: Any) -> None:  # ``a ~ b``: a checked join
            self.write("environment.str_join((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

        def visit_Compare(self, node: Any, frame: Any) -> None:  # ``a == b``, ``a in b``: sized
            self.write("(environment.sized(")
            self.visit(node.expr, frame)
            self.write(")")
            for op in node.ops:
                self.visit(op, frame)
            self.write(")")

        def visit_Getitem(self, node: Any, frame: Any) -> None:  # ``b[::-1]``: sized
            if type(node.arg).__name__ != "Slice":
                return super().visit_Getitem(node, frame)
            self.write("environment.sized(")
            super().visit_Getitem(node, frame)
            self.write(")")

        def visit_Operand(self, node: Any, frame: Any) -> None:
            self.write(f" {operators[node.op]} environment.sized(")
            self.visit(node.expr, frame)
            self.write(")")

    class Bounded(BoundedMixin, ImmutableSandboxedEnvironment):
        code_generator_class = Generator

    return Bounded


class BoundedTemplate:
    """A chat template compiled as llama-cpp-python's ``Jinja2ChatFormatter`` compiles it
    (its options, extensions and ``tojson``; the same names when rendering), in the bounded
    sandbox."""

    def __init__(self, template: str, bos_token: str, eos_token: str) -> None:
        import jinja2
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self._env = environment_class()(
            loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
            extensions=[Jinja2ChatFormatter.IgnoreGenerationTags, jinja2.ext.loopcontrols])
        self._env.filters["tojson"] = self._env.bounded_filter(Jinja2ChatFormatter.tojson,
                                                               "tojson")
        self._template = self._env.from_string(template)
        self._names = dict(eos_token=eos_token, bos_token=bos_token,
                           raise_exception=_raise_exception, functions=None,
                           function_call=None, tool_choice=None,
                           strftime_now=Jinja2ChatFormatter.strftime_now)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
               tools: list[dict] | None) -> str:
        return self._env.render_bounded(self._template, messages=messages, tools=tools,
                                        add_generation_prompt=add_generation_prompt,
                                        **self._names)


def _raise_exception(message: str) -> None:
    raise ValueError(message)
