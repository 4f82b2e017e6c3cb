"""A rule's condition in CEL, with bounds we enforce: the expression is parsed here first and refused when it is too
long, too deep, nests comprehensions, builds a large list, names a field its entity lacks or calls a function not
allowed; only then is it compiled by the CEL library (the Rust bindings, ``common-expression-language``).

Neither CEL library has a cost limit, and the Rust one holds the GIL for a whole evaluation, so these static bounds
are what keep an evaluation's worst case small: with no comprehension inside another, at most ``max_nodes`` nodes and
every list an entity or a rule holds bounded (``MAX_LIST_ITEMS``), an evaluation visits at most about
``max_nodes * MAX_LIST_ITEMS`` nodes. The engine adds the bound at evaluation: a rule over its time budget is disabled
(storwatch.policy.engine). Nothing here evaluates Python: the only interpreter is CEL's.
"""

from __future__ import annotations

import difflib
import functools
import importlib.machinery
import importlib.util
import os
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from storwatch.actions.base import FieldValue

MAX_LIST_ITEMS = 64
"""The most items a list may hold: a list literal in a rule, and every list field of an entity (the schema cuts
longer ones and says so in a count field)."""

COMPREHENSIONS = frozenset({"all", "exists", "exists_one", "map", "filter"})
"""CEL's macros that loop over a list or map: each visits every item, so one inside another multiplies."""
MEMBER_FUNCTIONS = frozenset({"size", "contains", "startsWith", "endsWith", "matches"})
"""Functions called on a value (``path.startsWith('/home')``)."""
GLOBAL_FUNCTIONS = frozenset({"size", "int", "uint", "double", "string", "has"})
"""Functions called by name (``size(writers)``, ``has(labels.team)``, the conversions)."""
RESERVED = frozenset(
    {
        *("as", "break", "const", "continue", "else", "for", "function", "if", "import", "let", "loop", "package"),
        *("namespace", "return", "var", "void", "while"),
    }
)
"""Words CEL reserves: never an identifier."""


@dataclass(frozen=True)
class Bounds:
    """What an expression may be, checked before the CEL library sees it."""

    max_chars: int = 1024
    """Length of the expression, macros of the policy expanded."""
    max_depth: int = 32
    """Depth of its syntax tree: brackets, nested calls, and chains of operators (``a || b || c`` is three deep);
    the CEL library's own parser refuses somewhat deeper nesting, and a deeper tree only costs stack."""
    max_nodes: int = 256
    """Nodes of its syntax tree (each literal, name, operator and call)."""
    max_comprehension_nesting: int = 1
    """Comprehensions (all, exists, exists_one, map, filter) one inside another: one level, so an evaluation visits
    each list item once per node of its body, never a product of lists."""
    max_list_items: int = MAX_LIST_ITEMS
    """Items of a list literal, and entries of a map literal."""


DEFAULT_BOUNDS = Bounds()


class CelError(ValueError):
    """An expression refused at load: its message says what, ``column`` where (1-based; 0 when not one place)."""

    def __init__(self, message: str, column: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.column = column

    def __str__(self) -> str:
        return f"{self.message} (column {self.column})" if self.column else self.message


class EvalError(RuntimeError):
    """An evaluation that did not give a bool: a type mismatch, a null compared, a missing key, a division by zero."""


# -- tokens


@dataclass(frozen=True)
class Token:
    kind: str
    """``int``, ``uint``, ``double``, ``string``, ``bytes``, ``ident``, ``op`` or ``eof``."""
    text: str
    pos: int
    """Offset in the source (0-based)."""
    end: int


_OPS2 = ("||", "&&", "==", "!=", "<=", ">=")
_OPS1 = "<>+-*/%!?:.,()[]{}"
_IDENT_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_IDENT_CHARS = _IDENT_START | frozenset("0123456789")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")


def tokens(source: str) -> Iterator[Token]:
    """The tokens of ``source``, as CEL's lexer reads it (comments and whitespace dropped); a CelError at the first
    character that starts no token."""
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c in " \t\r\n\f":
            i += 1
            continue
        if source.startswith("//", i):
            nl = source.find("\n", i)
            i = n if nl < 0 else nl + 1
            continue
        start = i
        # string and bytes literals, with their prefixes (r, b, rb, br in either case)
        j = i
        while j < n and j - i < 2 and source[j] in "rRbB":
            j += 1
        if j < n and source[j] in "'\"" and (j == i or _valid_prefix(source[i:j])):
            prefix = source[i:j].lower()
            end = _string_end(source, j, raw="r" in prefix)
            yield Token("bytes" if "b" in prefix else "string", source[start:end], start, end)
            i = end
            continue
        if c in _IDENT_START:
            while i < n and source[i] in _IDENT_CHARS:
                i += 1
            yield Token("ident", source[start:i], start, i)
            continue
        if c in _DIGITS or (c == "." and i + 1 < n and source[i + 1] in _DIGITS):
            tok = _number(source, i)
            yield tok
            i = tok.end
            continue
        two = source[i : i + 2]
        if two in _OPS2:
            yield Token("op", two, i, i + 2)
            i += 2
            continue
        if c in _OPS1:
            yield Token("op", c, i, i + 1)
            i += 1
            continue
        raise CelError(f"unexpected character {c!r}", i + 1)
    yield Token("eof", "", n, n)


def _valid_prefix(prefix: str) -> bool:
    return prefix.lower() in ("r", "b", "rb", "br")


def _string_end(source: str, q: int, raw: bool) -> int:
    """The offset just past the string literal whose opening quote is at ``q``."""
    quote = source[q]
    triple = source[q : q + 3] == quote * 3
    i = q + (3 if triple else 1)
    n = len(source)
    while i < n:
        c = source[i]
        if c == "\\" and not raw:
            i += 2
            continue
        if triple:
            if source[i : i + 3] == quote * 3:
                return i + 3
        elif c == quote:
            return i + 1
        elif c in "\r\n":
            break
        i += 1
    raise CelError("a string literal is not closed", q + 1)


def _number(source: str, i: int) -> Token:
    n = len(source)
    start = i
    if source.startswith(("0x", "0X"), i):
        i += 2
        while i < n and source[i] in _HEX:
            i += 1
        if i < n and source[i] in "uU":
            return Token("uint", source[start : i + 1], start, i + 1)
        return Token("int", source[start:i], start, i)
    while i < n and source[i] in _DIGITS:
        i += 1
    kind = "int"
    if i + 1 < n and source[i] == "." and source[i + 1] in _DIGITS:
        kind = "double"
        i += 1
        while i < n and source[i] in _DIGITS:
            i += 1
    if i < n and source[i] in "eE":
        j = i + 1
        if j < n and source[j] in "+-":
            j += 1
        if j < n and source[j] in _DIGITS:
            kind = "double"
            i = j
            while i < n and source[i] in _DIGITS:
                i += 1
    if kind == "int" and i < n and source[i] in "uU":
        return Token("uint", source[start : i + 1], start, i + 1)
    return Token(kind, source[start:i], start, i)


# -- the syntax tree


@dataclass(frozen=True)
class Node:
    kind: str
    """``literal``, ``ident``, ``select`` (``x.name``), ``call`` (``f(args)``), ``method`` (``x.f(args)``),
    ``index``, ``list``, ``map``, ``unary``, ``binary``, ``ternary``."""
    pos: int
    name: str = ""
    """The identifier, field, function or operator; a literal's text."""
    children: tuple[Node, ...] = ()
    """Operands in order; for a method call the target first, then the arguments."""
    token: str = ""
    """A literal's token kind."""


class _Parser:
    """CEL's grammar (cel-spec, langdef.md), by recursive descent. Recursion is bounded before it starts: the
    brackets and conditionals of the source are counted first (:func:`_nesting`)."""

    def __init__(self, source: str) -> None:
        self.toks = list(tokens(source))
        self.i = 0

    def peek(self) -> Token:
        return self.toks[self.i]

    def take(self) -> Token:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def at(self, text: str) -> bool:
        tok = self.toks[self.i]
        return (tok.kind == "op" and tok.text == text) or (tok.kind == "ident" and text == "in" and tok.text == "in")

    def expect(self, text: str) -> Token:
        tok = self.take()
        if not (tok.text == text and tok.kind in ("op", "ident")):
            raise CelError(f"expected {text!r}, found {tok.text or 'the end'!r}", tok.pos + 1)
        return tok

    def parse(self) -> Node:
        node = self.expr()
        tok = self.peek()
        if tok.kind != "eof":
            raise CelError(f"unexpected {tok.text!r}", tok.pos + 1)
        return node

    def expr(self) -> Node:
        cond = self.binary(0)
        if self.at("?"):
            pos = self.take().pos
            then = self.binary(0)
            self.expect(":")
            other = self.expr()
            return Node("ternary", pos, "?:", (cond, then, other))
        return cond

    _LEVELS: tuple[tuple[str, ...], ...] = (
        ("||",),
        ("&&",),
        ("<", "<=", ">=", ">", "==", "!=", "in"),
        ("+", "-"),
        ("*", "/", "%"),
    )

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        ops = self._LEVELS[level]
        left = self.binary(level + 1)
        while any(self.at(op) for op in ops):
            tok = self.take()
            right = self.binary(level + 1)
            left = Node("binary", tok.pos, tok.text, (left, right))
        return left

    def unary(self) -> Node:
        # CEL repeats one unary operator ("!!x", "--x"), never mixes them ("!-x" is no CEL).
        prefix: list[Token] = []
        if self.at("!") or self.at("-"):
            op = self.peek().text
            while self.at(op):
                prefix.append(self.take())
        node = self.member()
        for tok in reversed(prefix):
            node = Node("unary", tok.pos, tok.text, (node,))
        return node

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.at("."):
                self.take()
                tok = self.take()
                if tok.kind != "ident":
                    raise CelError(f"expected a field name after '.', found {tok.text or 'the end'!r}", tok.pos + 1)
                if self.at("("):
                    args = self.arguments(")")
                    node = Node("method", tok.pos, tok.text, (node, *args))
                else:
                    node = Node("select", tok.pos, tok.text, (node,))
            elif self.at("["):
                pos = self.take().pos
                index = self.expr()
                self.expect("]")
                node = Node("index", pos, "[]", (node, index))
            elif self.at("{"):
                raise CelError("message construction (Name{...}) is not allowed here", self.peek().pos + 1)
            else:
                return node

    def arguments(self, close: str) -> list[Node]:
        self.take()  # the opening bracket
        args: list[Node] = []
        if not self.at(close):
            args.append(self.expr())
            while self.at(","):
                self.take()
                if self.at(close) and close == "]":
                    break  # a trailing comma in a list
                args.append(self.expr())
        self.expect(close)
        return args

    def primary(self) -> Node:
        tok = self.peek()
        if tok.kind in ("int", "uint", "double", "string", "bytes"):
            self.take()
            return Node("literal", tok.pos, tok.text, token=tok.kind)
        if tok.kind == "ident":
            self.take()
            if tok.text in ("true", "false", "null"):
                return Node("literal", tok.pos, tok.text, token=tok.text if tok.text == "null" else "bool")
            if tok.text in RESERVED or tok.text == "in":
                raise CelError(f"{tok.text!r} is a reserved word", tok.pos + 1)
            if self.at("("):
                args = self.arguments(")")
                return Node("call", tok.pos, tok.text, tuple(args))
            return Node("ident", tok.pos, tok.text)
        if self.at("("):
            self.take()
            node = self.expr()
            self.expect(")")
            return node
        if self.at("["):
            args = self.arguments("]")
            return Node("list", tok.pos, "[]", tuple(args))
        if self.at("{"):
            self.take()
            entries: list[Node] = []
            while not self.at("}"):
                key = self.expr()
                self.expect(":")
                entries += [key, self.expr()]
                if not self.at(","):
                    break
                self.take()
            self.expect("}")
            return Node("map", tok.pos, "{}", tuple(entries))
        if self.at("."):
            raise CelError("a leading '.' (a name from the root scope) is not allowed here", tok.pos + 1)
        raise CelError(f"unexpected {tok.text or 'end of the expression'!r}", tok.pos + 1)


def _nesting(source: str) -> tuple[int, int]:
    """(deepest bracket nesting, conditionals): counted over the tokens, before any recursion."""
    depth = deepest = conditionals = 0
    for tok in tokens(source):
        if tok.kind != "op":
            continue
        if tok.text in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif tok.text in ")]}":
            depth -= 1
        elif tok.text == "?":
            conditionals += 1
    return deepest, conditionals


def parse(source: str, bounds: Bounds = DEFAULT_BOUNDS) -> Node:
    """The syntax tree of ``source``; a CelError when it cannot be parsed or is past a bound of size."""
    if len(source) > bounds.max_chars:
        raise CelError(f"the expression is {len(source)} characters long, more than {bounds.max_chars}")
    if not source.strip():
        raise CelError("the expression is empty")
    deepest, conditionals = _nesting(source)
    if deepest + conditionals > bounds.max_depth:
        raise CelError(
            f"the expression nests {deepest} brackets and {conditionals} conditionals, deeper than {bounds.max_depth}"
        )
    return _Parser(source).parse()


@dataclass(frozen=True)
class Analysis:
    """What the bounds were checked against."""

    depth: int
    nodes: int
    comprehension_nesting: int
    names: frozenset[str]
    """The variables it reads (an entity's fields, a policy's lists)."""


def analyse(
    source: str, names: Collection[str] | None = None, bounds: Bounds = DEFAULT_BOUNDS, what: str = "a variable"
) -> Analysis:
    """Parse ``source`` and check it against ``bounds``: its depth, nodes, comprehension nesting, list literals, the
    functions it calls and, where ``names`` is given, that every variable it reads is one of them (``what`` says
    what they are, for the message). A CelError names the first problem."""
    tree = parse(source, bounds)
    read: set[str] = set()
    count = 0
    deepest = 0
    deepest_comprehension = 0

    def walk(node: Node, depth: int, scope: frozenset[str], comprehensions: int) -> None:
        nonlocal count, deepest, deepest_comprehension
        count += 1
        deepest = max(deepest, depth)
        deepest_comprehension = max(deepest_comprehension, comprehensions)
        if count > bounds.max_nodes:
            raise CelError(f"the expression has more than {bounds.max_nodes} nodes", node.pos + 1)
        if depth > bounds.max_depth:
            raise CelError(f"the expression is nested deeper than {bounds.max_depth} levels", node.pos + 1)
        if node.kind == "ident":
            if node.name not in scope:
                if names is not None and node.name not in names:
                    close = difflib.get_close_matches(node.name, list(names), n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise CelError(f"{node.name!r} is not {what}{hint}", node.pos + 1)
                read.add(node.name)
            return
        if node.kind in ("list", "map"):
            items = len(node.children) // (2 if node.kind == "map" else 1)
            if items > bounds.max_list_items:
                raise CelError(
                    f"a {node.kind} literal of {items} items, more than {bounds.max_list_items}", node.pos + 1
                )
        if node.kind == "binary" and node.name == "+" and comprehensions:
            # Concatenation copies its operands: once per item it grows with the list (strings of 4 KiB, built
            # longer on every step), the one cost the node and list bounds do not hold.
            raise CelError("'+' inside a comprehension (it would copy strings or lists once per item)", node.pos + 1)
        if node.kind == "call":
            if node.name not in GLOBAL_FUNCTIONS:
                raise CelError(f"function {node.name}() is not allowed here", node.pos + 1)
            if node.name == "has" and (len(node.children) != 1 or node.children[0].kind != "select"):
                raise CelError("has() takes one field selection, as in has(labels.team)", node.pos + 1)
        if node.kind == "method" and node.name in COMPREHENSIONS:
            target, *args = node.children
            ok = len(args) in (2, 3) if node.name == "map" else len(args) == 2
            if not ok or args[0].kind != "ident":
                raise CelError(f".{node.name}() takes a variable name and an expression", node.pos + 1)
            var = args[0].name
            if var in RESERVED or (names is not None and var in names):
                raise CelError(f"the loop variable {var!r} hides a name of the entity", args[0].pos + 1)
            if comprehensions + 1 > bounds.max_comprehension_nesting:
                raise CelError(
                    f".{node.name}() inside another comprehension: at most {bounds.max_comprehension_nesting} "
                    "level of all/exists/exists_one/map/filter",
                    node.pos + 1,
                )
            walk(target, depth + 1, scope, comprehensions)
            for body in args[1:]:
                walk(body, depth + 1, scope | {var}, comprehensions + 1)
            count += 1  # the loop variable
            return
        if node.kind == "method":
            if node.name not in MEMBER_FUNCTIONS:
                raise CelError(f"function .{node.name}() is not allowed here", node.pos + 1)
            if node.name == "matches" and (
                len(node.children) != 2 or node.children[1].kind != "literal" or node.children[1].token != "string"
            ):
                # A pattern from data would be a tenant's regular expression: only a rule's own literal is one.
                raise CelError(".matches() takes a string literal as its pattern", node.pos + 1)
        for child in node.children:
            walk(child, depth + 1, scope, comprehensions)

    walk(tree, 1, frozenset(), 0)
    return Analysis(deepest, count, deepest_comprehension, frozenset(read))


def expand(source: str, macros: Mapping[str, str]) -> str:
    """``source`` with every name of ``macros`` (an identifier not after a ``.`` and not called) replaced by that
    macro's expression in brackets, the macros' own names expanded in turn; a CelError for a macro that names itself,
    directly or through others."""

    def one(text: str, seen: tuple[str, ...]) -> str:
        out: list[str] = []
        last = 0
        toks = list(tokens(text))
        for k, tok in enumerate(toks):
            if tok.kind != "ident" or tok.text not in macros:
                continue
            after_dot = k > 0 and toks[k - 1].kind == "op" and toks[k - 1].text == "."
            called = toks[k + 1].kind == "op" and toks[k + 1].text == "("
            if after_dot or called:
                continue
            if tok.text in seen:
                raise CelError(f"macro {tok.text!r} refers to itself ({' -> '.join((*seen, tok.text))})")
            out += [text[last : tok.pos], "(", one(macros[tok.text], (*seen, tok.text)), ")"]
            last = tok.end
        out.append(text[last:])
        return "".join(out)

    return one(source, ())


# -- the CEL library


@functools.cache
def _library() -> ModuleType:
    """The Rust bindings' extension module, loaded by itself. The package's ``__init__`` also imports its command
    line (rich, typer, prompt_toolkit: several hundred milliseconds, and nothing the agent uses), so the extension is
    loaded from its file when it is where the package keeps it; the package is imported as usual otherwise."""
    spec = importlib.util.find_spec("cel")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the CEL library is not installed (pip install common-expression-language)")
    for folder in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "cel" + suffix)
            if os.path.isfile(path):
                ext_spec = importlib.util.spec_from_file_location("cel.cel", path)
                if ext_spec is not None and ext_spec.loader is not None:
                    module = importlib.util.module_from_spec(ext_spec)
                    ext_spec.loader.exec_module(module)
                    return module
    import cel

    return cel


@dataclass(frozen=True, eq=False)
class Expression:
    """A condition checked against the bounds and compiled: evaluate it with an entity's fields."""

    source: str
    """The expression as compiled (macros expanded)."""
    analysis: Analysis
    program: Any
    """The CEL library's compiled program."""

    def evaluate(self, variables: Mapping[str, FieldValue], more: Mapping[str, FieldValue] | None = None) -> bool:
        """The condition's value for these variables (and ``more``'s, where ``variables`` lacks the name: a policy's
        lists beside an entity's fields); an EvalError when it is not a bool (a null compared, a type that has no such
        operator, a missing key)."""
        # Only the variables it reads go to the library: each value given is converted to a CEL value on every call,
        # and a rule reads a few of an entity's thirty-odd fields (most of a View's policy time went to converting
        # the rest).
        given: dict[str, FieldValue] = {}
        for name in self.analysis.names:
            if name in variables:
                given[name] = variables[name]
            elif more is not None and name in more:
                given[name] = more[name]
        try:
            value = self.program.execute(given)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:
            # The library raises RuntimeError, ValueError, KeyError, ZeroDivisionError... for a condition that fails,
            # and a panic of its Rust code arrives as pyo3's PanicException, which is no Exception.
            raise EvalError(_first_line(err)) from None
        if not isinstance(value, bool):
            raise EvalError(f"the condition gave {type(value).__name__} {_short(value)}, not a bool")
        return value


def compile_expression(
    source: str, names: Collection[str] | None = None, bounds: Bounds = DEFAULT_BOUNDS, what: str = "a variable"
) -> Expression:
    """``source`` checked (:func:`analyse`) and compiled; a CelError says why not."""
    analysis = analyse(source, names, bounds, what)
    try:
        program = _library().compile(source)
    except Exception as err:
        raise CelError(f"CEL syntax error: {_first_line(err)}") from None
    return Expression(source, analysis, program)


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    line = text.splitlines()[0]
    return line if len(line) <= 200 else line[:197] + "..."


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = [
    "COMPREHENSIONS",
    "DEFAULT_BOUNDS",
    "MAX_LIST_ITEMS",
    "Analysis",
    "Bounds",
    "CelError",
    "EvalError",
    "Expression",
    "Node",
    "analyse",
    "compile_expression",
    "expand",
    "parse",
    "tokens",
]
