"""A rule's condition in CEL, with bounds we enforce: the expression is parsed here first and refused when it is too
long, too deep, nests comprehensions, builds a large list, names a field its entity lacks or calls a function not
allowed; only then is it compiled by the CEL library (the Rust bindings, ``common-expression-language``).

Neither CEL library has a cost limit, and the Rust one holds the GIL for a whole evaluation, so these static bounds
are what keep an evaluation's worst case small. As Kubernetes estimates a CEL rule's cost (cel-go's checker/cost.go),
every value gets an upper bound on what it holds before the rule is accepted (:func:`estimate`): a variable's from the
schema (every list and map an entity or a rule holds has at most ``MAX_LIST_ITEMS`` items, every string at most
``MAX_STRING_CHARS`` characters), a literal's from its items, ``a + b`` the sum of its operands', a ``map`` or
``filter`` as many items as the list it runs over, each as large as its body gives; so a chain of macros carries its
bounds from one link to the next, and a list that doubles at every link is seen to. A rule is refused when what an
evaluation can hold at once, or its estimated cost, passes a bound (``Bounds``). The engine adds the bound at
evaluation: a rule over its time budget is disabled (storwatch.policy.engine). Nothing here evaluates Python: the only
interpreter is CEL's.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from storwatch.actions.base import FieldValue

MAX_LIST_ITEMS = 64
"""The most items a list may hold: a list literal in a rule, and every list field of an entity (the schema cuts
longer ones and says so in a count field)."""
MAX_STRING_CHARS = 4096
"""The most characters a string field holds (PATH_MAX): the schema cuts longer ones (storwatch.policy.schema)."""
CHARS_PER_UNIT = 64
"""Characters scanned or copied for one unit of estimated cost (a unit is about one node's evaluation)."""

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
    max_held_elements: int = MAX_LIST_ITEMS * MAX_LIST_ITEMS
    """Elements of the lists and maps an evaluation can hold at once, beyond its variables (every item of a nested
    list counts, a map entry counts its key and its value), as :func:`estimate` bounds them before it runs: a list of
    64 lists of 64 items."""
    max_held_chars: int = 4 * MAX_LIST_ITEMS * MAX_STRING_CHARS
    """Characters of the strings an evaluation can hold at once, beyond its variables: four copies of the longest
    list field (a ``filter`` of one holds its result and, while it grows, a copy)."""
    max_cost: int = 1_000_000
    """Estimated cost of one evaluation (:func:`estimate`): a unit per node evaluated and per element built, copied or
    compared, one per ``CHARS_PER_UNIT`` characters scanned or copied, a comprehension's body once per item. The
    figure is Kubernetes' per-call limit for CEL; what it costs here is in BENCHMARKS.md."""


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
    estimate: Estimate | None = None
    """What one evaluation can hold and cost (:func:`estimate`); None for a macro checked alone."""


def analyse(
    source: str,
    names: Collection[str] | None = None,
    bounds: Bounds = DEFAULT_BOUNDS,
    what: str = "a variable",
    sizes: Mapping[str, Size] | None = None,
    *,
    estimated: bool = True,
) -> Analysis:
    """Parse ``source`` and check it against ``bounds``: its depth, nodes, comprehension nesting, list literals, the
    functions it calls, where ``names`` is given that every variable it reads is one of them (``what`` says what they
    are, for the message), and unless ``estimated`` is false what an evaluation can hold and cost, each variable as
    large as ``sizes`` says (:func:`estimate`). A CelError names the first problem."""
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
    found = estimate(tree, sizes or {}, bounds) if estimated else None
    return Analysis(deepest, count, deepest_comprehension, frozenset(read), found)


# -- what an evaluation can hold and cost, before it runs


@dataclass(frozen=True)
class Size:
    """An upper bound on a value an evaluation can give, known before it runs: cel-go's SizeEstimate, with a bound on
    the items too, so that a chain of macros carries its bounds from one link to the next."""

    kind: str
    """``scalar`` (a number, bool or null), ``string`` (or bytes), ``list``, ``map``, or ``any`` (one of those)."""
    items: int = 0
    """A list's items or a map's entries: how many times a comprehension over it runs its body."""
    elements: int = 0
    """Values inside it at every depth: a list's items and theirs, a map's keys and values and theirs."""
    chars: int = 0
    """Characters of every string inside it (its own, for a string)."""
    item: Size | None = None
    """A bound on each item of a list, each key and value of a map; None where only the totals above are known."""

    def inner(self) -> Size:
        """A bound on any one item, key or value of it."""
        if self.item is not None:
            return self.item
        rest = max(self.elements - 1, 0)
        return Size("any", rest, rest, self.chars)

    @property
    def units(self) -> int:
        """What building, copying or comparing all of it costs (:func:`estimate`)."""
        return self.elements + _per_unit(self.chars)


SCALAR = Size("scalar")
STRING_FIELD = Size("string", chars=MAX_STRING_CHARS)
"""A string field of an entity at its longest."""


def list_of(items: int, item: Size) -> Size:
    """A list of ``items`` items, each at most ``item``."""
    return Size("list", items, items * (1 + item.elements), items * item.chars, item)


def map_of(entries: int, key: Size, value: Size) -> Size:
    """A map of ``entries`` entries, each key at most ``key`` and each value at most ``value``."""
    return Size(
        "map",
        entries,
        entries * (2 + key.elements + value.elements),
        entries * (key.chars + value.chars),
        _join(key, value),
    )


ANY_VARIABLE = Size("any", MAX_LIST_ITEMS, 2 * MAX_LIST_ITEMS, 2 * MAX_LIST_ITEMS * MAX_STRING_CHARS, STRING_FIELD)
"""A variable whose size is not given: as large as any field of an entity may be (a map of ``MAX_LIST_ITEMS`` entries
of strings of ``MAX_STRING_CHARS``, or one such string)."""


def size_of(value: object) -> Size:
    """The size of a value given in full (a policy's list)."""
    if isinstance(value, (str, bytes)):
        return Size("string", chars=len(value))
    if isinstance(value, Mapping):
        parts = [(size_of(k), size_of(v)) for k, v in value.items()]
        item = _join_all([s for pair in parts for s in pair])
        return Size(
            "map",
            len(parts),
            sum(2 + k.elements + v.elements for k, v in parts),
            sum(k.chars + v.chars for k, v in parts),
            item,
        )
    if isinstance(value, (list, tuple)):
        sizes = [size_of(v) for v in value]
        item = _join_all(sizes)
        return Size("list", len(sizes), sum(1 + s.elements for s in sizes), sum(s.chars for s in sizes), item)
    return SCALAR


def _join(a: Size, b: Size) -> Size:
    """A bound on a value that is either ``a`` or ``b``."""
    item = _join(a.item, b.item) if a.item is not None and b.item is not None else None
    return Size(
        a.kind if a.kind == b.kind else "any",
        max(a.items, b.items),
        max(a.elements, b.elements),
        max(a.chars, b.chars),
        item,
    )


def _join_all(sizes: list[Size]) -> Size:
    """A bound on each of ``sizes`` (the items of a literal); a scalar for none."""
    return functools.reduce(_join, sizes) if sizes else SCALAR


def _concat(a: Size, b: Size) -> Size:
    """A bound on ``a + b``: a sum of numbers, or two strings or lists joined."""
    item = _join(a.item, b.item) if a.item is not None and b.item is not None else None
    return Size(
        a.kind if a.kind == b.kind else "any",
        a.items + b.items,
        a.elements + b.elements,
        a.chars + b.chars,
        item,
    )


REGEX_CALL_UNITS = 256
"""Units a ``matches`` call costs before its pattern's own weight (:func:`regex_weight`)."""
REGEX_ATOM_UNITS = 128
"""Units per unit of a pattern's weight: the library compiles the pattern at every call."""
_REGEX_ESCAPES = {"w": 64, "W": 64, "p": 64, "P": 64, "b": 64, "B": 64, "d": 4, "D": 2, "S": 2}
"""Weights of the escapes that stand for Unicode classes (compiled to many states; ``\\w`` most); others weigh 1."""


def regex_weight(literal: str) -> int:
    """How much compiling the pattern of a CEL string literal costs, in atoms: each literal character or ASCII class
    one, a Unicode class more (``_REGEX_ESCAPES``; ``.`` and a negated class two), an atom or group repeated ``{n}``
    or ``{n,m}`` times counted that many times, everything sixteen times over when case is ignored (``(?i)``).
    Heuristic (the pattern is never compiled here), measured against the library's own compile times (BENCHMARKS.md),
    and meant to err high."""
    pattern = _literal_text(literal)
    groups: list[list[int]] = [[0, 0]]  # per open group: its weight so far, and its last atom's
    folded = False
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        atom = 1
        if c == "\\" and i + 1 < n:
            escape = pattern[i + 1]
            atom = _REGEX_ESCAPES.get(escape, 1)
            i += 2
            if escape in "pP" and i < n:
                close = pattern.find("}", i) if pattern[i] == "{" else i
                i = n if close < 0 else close + 1
        elif c == "[":
            j = i + 1
            atom = 2 if pattern.startswith("^", j) else 1
            j += 1 if atom == 2 else 0
            j += 1 if pattern.startswith("]", j) else 0  # a ']' first is a character of the class
            depth = 1
            while j < n and depth:
                if pattern[j] == "\\" and j + 1 < n:
                    atom = max(atom, _REGEX_ESCAPES.get(pattern[j + 1], 1))
                    j += 2
                    continue
                depth += {"[": 1, "]": -1}.get(pattern[j], 0)
                j += 1
            i = j
        elif c == "(":
            i += 1
            if pattern.startswith(("?P<", "?<"), i):  # a named group
                close = pattern.find(">", i)
                i = n if close < 0 else close + 1
            elif pattern.startswith("?", i):  # flags: (?i) for what follows, (?i:...) a group
                end = i + 1
                while end < n and (pattern[end].isalpha() or pattern[end] == "-"):
                    end += 1
                folded = folded or "i" in pattern[i + 1 : end].split("-", 1)[0]
                if pattern.startswith(")", end):
                    i = end + 1
                    continue
                i = end + 1 if pattern.startswith(":", end) else end
            groups.append([0, 0])
            continue
        elif c == ")":
            i += 1
            if len(groups) == 1:
                continue
            atom = groups.pop()[0]
        elif c == "{":
            close = pattern.find("}", i)
            low, comma, high = pattern[i + 1 : close].partition(",") if close > 0 else ("", "", "")
            if low.isdigit() and (high.isdigit() or not high):
                # {n}: n times; {n,m}: m at most; {n,}: n, and more at no further cost to compile
                times = max(int(low), int(high) if high else int(low) + (1 if comma else 0), 1)
                group = groups[-1]
                group[0] += group[1] * (times - 1)
                group[1] *= times
                i = close + 1
                continue
            i += 1
        elif c == "|":
            groups[-1][1] = 0
            i += 1
            continue
        elif c in "*+?^$":
            i += 1
            continue
        else:
            atom = 2 if c == "." else 1
            i += 1
        groups[-1][0] += atom
        groups[-1][1] = atom
    weight = sum(group[0] for group in groups)
    return weight * 16 if folded else weight


def _literal_text(literal: str) -> str:
    """The text of a CEL string literal, near enough for :func:`regex_weight`: a doubled backslash is one; any other
    escape stands as one plain character."""
    j = 0
    while j < len(literal) and literal[j] in "rRbB":
        j += 1
    raw = "r" in literal[:j].lower()
    quote = literal[j : j + 3] if literal[j : j + 3] in ("'''", '"""') else literal[j : j + 1]
    body = literal[j + len(quote) : len(literal) - len(quote)]
    if raw:
        return body
    out: list[str] = []
    k = 0
    while k < len(body):
        if body[k] == "\\" and k + 1 < len(body):
            out.append("\\" if body[k + 1] == "\\" else "a")
            k += 2
        else:
            out.append(body[k])
            k += 1
    return "".join(out)


def _text(size: Size) -> int:
    """The characters of ``size`` if it may be a string."""
    return size.chars if size.kind in ("string", "any") else 0


def _per_unit(chars: int) -> int:
    return -(-chars // CHARS_PER_UNIT)


@dataclass(frozen=True)
class Estimate:
    """Bounds on one evaluation, worked out before it runs (:func:`estimate`)."""

    elements: int
    """The most elements of lists and maps it can hold at once, beyond its variables."""
    chars: int
    """The most characters of strings it can hold at once, beyond its variables."""
    cost: int
    """Its estimated cost, in units (``Bounds.max_cost``)."""


@dataclass(frozen=True)
class _Visit:
    """One node estimated: its value, what that value holds, the most held while it was worked out (its value
    included), and its cost."""

    value: Size
    held_elements: int
    held_chars: int
    peak_elements: int
    peak_chars: int
    cost: int


class _Estimator:
    def __init__(self, sizes: Mapping[str, Size], bounds: Bounds) -> None:
        self.sizes = sizes
        self.bounds = bounds
        self.first_over: dict[str, Node] = {}
        """For each bound passed, the innermost node where it was passed (the message's column)."""

    def visit(self, node: Node, loops: Mapping[str, Size]) -> _Visit:
        found = self._visit(node, loops)
        for bound, over in (
            ("elements", found.peak_elements > self.bounds.max_held_elements),
            ("chars", found.peak_chars > self.bounds.max_held_chars),
            ("cost", found.cost > self.bounds.max_cost),
        ):
            if over:
                self.first_over.setdefault(bound, node)
        return found

    def _visit(self, node: Node, loops: Mapping[str, Size]) -> _Visit:
        k = node.kind
        if k == "literal":
            value = Size("string", chars=len(node.name)) if node.token in ("string", "bytes") else SCALAR
            return self._then(node, [], value, built=True, work=_per_unit(value.chars))
        if k == "ident":
            if node.name in loops:
                return self._read(node, [], loops[node.name], variable=False)
            return self._read(node, [], self.sizes.get(node.name, ANY_VARIABLE), variable=True)
        if k in ("select", "index"):
            parts = [self.visit(c, loops) for c in node.children]
            return self._read(node, parts, parts[0].value.inner(), variable=False)
        if k == "method" and node.name in COMPREHENSIONS:
            return self._comprehension(node, loops)
        parts = [self.visit(c, loops) for c in node.children]
        sizes = [p.value for p in parts]
        if k == "list":
            item = _join_all(sizes)
            value = Size("list", len(sizes), sum(1 + s.elements for s in sizes), sum(s.chars for s in sizes), item)
            return self._then(node, parts, value, built=True, work=value.units)
        if k == "map":
            item = _join_all(sizes)
            value = Size("map", len(sizes) // 2, sum(1 + s.elements for s in sizes), sum(s.chars for s in sizes), item)
            return self._then(node, parts, value, built=True, work=value.units)
        if k == "binary" and node.name == "+":
            value = _concat(sizes[0], sizes[1])
            return self._then(node, parts, value, built=True, work=value.units)
        if k == "binary" and node.name in ("==", "!=", "<", "<=", ">", ">="):
            return self._then(node, parts, SCALAR, work=min(sizes[0].units, sizes[1].units))
        if k == "binary" and node.name == "in":
            return self._then(node, parts, SCALAR, work=sizes[1].items + sizes[1].units)
        if k == "ternary":
            return self._then(node, parts, _join(sizes[1], sizes[2]), built=True)
        if k == "call" and node.name == "string":
            value = Size("string", chars=max(sizes[0].chars, 32))  # a number's digits, or the string or bytes
            return self._then(node, parts, value, built=True, work=_per_unit(value.chars))
        if k == "method" and node.name == "matches":
            # The library compiles the pattern again at every call: that, more than the match, is its cost.
            compiled = REGEX_CALL_UNITS + REGEX_ATOM_UNITS * regex_weight(node.children[1].name)
            return self._then(node, parts, SCALAR, work=_per_unit(sizes[0].chars) + compiled)
        if k in ("call", "method") and node.name == "size":
            # a list's or map's size is known; a string's characters are counted
            return self._then(node, parts, SCALAR, work=_per_unit(sum(_text(s) for s in sizes)))
        if k in ("call", "method"):
            # has, the conversions to numbers, contains, startsWith, endsWith: one pass over their strings
            return self._then(node, parts, SCALAR, work=_per_unit(sum(s.chars for s in sizes)))
        return self._then(node, parts, SCALAR)  # unary operators, arithmetic, && and ||

    def _read(self, node: Node, parts: list[_Visit], value: Size, variable: bool) -> _Visit:
        """A variable, a field of a map, an item of a list: lists and maps are shared, a string is copied."""
        chars = 0
        if value.kind == "string":
            chars = value.chars
        elif value.kind == "any":
            # A variable given to the library is a string of a field at most, or a list or map (shared).
            chars = min(value.chars, MAX_STRING_CHARS) if variable else value.chars
        elements = value.elements if value.kind == "any" and not variable else 0
        return self._then(node, parts, value, held=(elements, chars), work=_per_unit(chars))

    def _then(
        self,
        node: Node,
        parts: list[_Visit],
        value: Size,
        *,
        built: bool = False,
        held: tuple[int, int] = (0, 0),
        work: int = 0,
    ) -> _Visit:
        """A node whose operands are worked out in order, each held until the node is, then the node's value."""
        before_e = before_c = peak_e = peak_c = 0
        cost = 1 + work
        for part in parts:
            peak_e = max(peak_e, before_e + part.peak_elements)
            peak_c = max(peak_c, before_c + part.peak_chars)
            before_e += part.held_elements
            before_c += part.held_chars
            cost += part.cost
        held_e, held_c = (value.elements, value.chars) if built else held
        return _Visit(value, held_e, held_c, max(peak_e, before_e + held_e), max(peak_c, before_c + held_c), cost)

    def _comprehension(self, node: Node, loops: Mapping[str, Size]) -> _Visit:
        target_node, var, *body_nodes = node.children
        target = self.visit(target_node, loops)
        item = target.value.inner()
        inner = {**loops, var.name: item}
        bodies = [self.visit(b, inner) for b in body_nodes]
        runs = target.value.items
        if node.name == "map":
            out = bodies[-1].value
            value = list_of(runs, out)
        elif node.name == "filter":
            value = list_of(runs, item)
        else:
            value = SCALAR
        body_e = body_c = before_e = before_c = 0
        body_cost = 0
        for b in bodies:
            body_e = max(body_e, before_e + b.peak_elements)
            body_c = max(body_c, before_c + b.peak_chars)
            before_e += b.held_elements
            before_c += b.held_chars
            body_cost += b.cost
        # The library copies a map's or filter's result at every item it adds: the result so far, and its copy.
        acc_e, acc_c = value.elements, value.chars
        step = body_cost + (value.units if node.name in ("map", "filter") else 0)
        return _Visit(
            value,
            acc_e,
            acc_c,
            max(target.peak_elements, target.held_elements + 2 * acc_e + body_e),
            max(target.peak_chars, target.held_chars + 2 * acc_c + body_c),
            1 + target.cost + runs * step,
        )


def estimate(tree: Node, sizes: Mapping[str, Size], bounds: Bounds = DEFAULT_BOUNDS) -> Estimate:
    """Upper bounds on one evaluation of ``tree``, as Kubernetes estimates a CEL rule's cost, each variable as large as
    ``sizes`` says (``ANY_VARIABLE`` where it says nothing); a CelError when one passes ``bounds``.

    Every value gets a bound (:class:`Size`): a list literal from its items, ``a + b`` the sum of both, a ``map`` as
    many items as the list it runs over, each as large as its body gives, a ``filter`` as many as that list; so a
    chain of macros carries its bounds along. What an evaluation holds at once: each operand until its node is worked
    out, and a ``map``'s or ``filter``'s result twice (the library copies it at every item). Its cost: a unit per node
    evaluated and per element built, copied or compared, one per ``CHARS_PER_UNIT`` characters scanned or copied, and
    a comprehension's body once per item of its list."""
    estimator = _Estimator(sizes, bounds)
    found = estimator.visit(tree, {})
    where = estimator.first_over
    if "elements" in where:
        raise CelError(
            f"the condition can build lists and maps holding up to {found.peak_elements} elements at once, more than "
            f"the bound of {bounds.max_held_elements} (every item of a nested list counts)",
            where["elements"].pos + 1,
        )
    if "chars" in where:
        raise CelError(
            f"the condition can build strings and lists holding up to {found.peak_chars} characters at once, more "
            f"than the bound of {bounds.max_held_chars}",
            where["chars"].pos + 1,
        )
    if "cost" in where:
        raise CelError(
            f"the condition's estimated cost is {found.cost}, more than the bound of {bounds.max_cost} (a unit per "
            f"node evaluated and per element built or compared, one per {CHARS_PER_UNIT} characters scanned or "
            "copied, a comprehension's body once per item)",
            where["cost"].pos + 1,
        )
    return Estimate(found.peak_elements, found.peak_chars, found.cost)


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
    """The CEL library, through its public interface (``cel.compile``), imported at the first condition compiled.
    Its package also imports its command line (rich, typer: about 170 ms here, once per process); the agent compiles
    its policy once per load, so that is paid at start, never per evaluation."""
    try:
        import cel
    except ImportError as err:
        raise ImportError(f"the CEL library is not installed (pip install common-expression-language): {err}") from None
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
    source: str,
    names: Collection[str] | None = None,
    bounds: Bounds = DEFAULT_BOUNDS,
    what: str = "a variable",
    sizes: Mapping[str, Size] | None = None,
) -> Expression:
    """``source`` checked (:func:`analyse`, each variable as large as ``sizes`` says) and compiled; a CelError says
    why not."""
    analysis = analyse(source, names, bounds, what, sizes)
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
    "ANY_VARIABLE",
    "CHARS_PER_UNIT",
    "COMPREHENSIONS",
    "DEFAULT_BOUNDS",
    "MAX_LIST_ITEMS",
    "MAX_STRING_CHARS",
    "SCALAR",
    "STRING_FIELD",
    "Analysis",
    "Bounds",
    "CelError",
    "Estimate",
    "EvalError",
    "Expression",
    "Node",
    "Size",
    "analyse",
    "compile_expression",
    "estimate",
    "expand",
    "list_of",
    "map_of",
    "parse",
    "regex_weight",
    "size_of",
    "tokens",
]
