"""A small, safe expression language for ``transform``, ``assert`` and conditions.

Never ``eval``: a tokenizer and a recursive-descent parser build a tree of tuples that an
interpreter walks over plain JSON values. There are no attributes, no imports, no
user-defined functions; names are either one of the roots of the scope (``data``,
``config``, ``runtime``, ``outputs``) or one of the pure functions listed in
``FUNCTIONS``. Grammar (docs/HANDLERS.md has the full description)::

    expr       := or
    or         := and (("or" | "||") and)*
    and        := not (("and" | "&&") not)*
    not        := ("not" | "!") not | comparison
    comparison := additive [("==" | "!=" | "<" | "<=" | ">" | ">=" | "in" | "not in") additive]
    additive   := term (("+" | "-") term)*
    term       := unary (("*" | "/" | "%") unary)*
    unary      := "-" unary | primary
    primary    := NUMBER | STRING | "true" | "false" | "null"
                | "(" expr ")" | "[" [expr ("," expr)*] "]"
                | "{" [KEY ":" expr ("," KEY ":" expr)*] "}"
                | FUNCTION "(" [expr ("," expr)*] ")"
                | ROOT ("." NAME | "[" expr "]")*

Every error is an ``ExpressionError`` (a non-retryable ``StepError``) whose message names
the expression and the 0-based position of the offending token.
"""

from __future__ import annotations

import decimal
import functools
import json
import math
import re
from collections.abc import Callable
from typing import Any, NoReturn, TypeGuard, TypeVar

from .steps import StepError

MAX_LENGTH = 2000  # characters of expression text
MAX_DEPTH = 50  # nesting of parentheses, lists, calls, indexes and unary operators
MAX_INT_BITS = 1024  # integers beyond this are refused (no giant-number DoS)
MAX_STRING = 1 << 20  # characters of a string built by + (1 MiB)
MAX_LIST = 100_000  # items of a list built by +

ROOTS = ("data", "config", "runtime", "outputs")  # a step's transform, assert, conditions


class ExpressionError(StepError):
    """A syntax or evaluation error. Never retryable: the same input fails the same way."""

    def __init__(self, message: str, expression: str, position: int | None):
        where = f" at position {position}" if position is not None else ""
        shown = expression if len(expression) <= 200 else expression[:200] + "..."
        super().__init__(
            f"expression {shown!r}: {message}{where}", code="expression_error", retryable=False
        )
        self.expression = expression
        self.position = position
        self.reason = message


class _Missing(Exception):
    """A path that does not exist (coalesce() turns it into null; elsewhere an error)."""

    def __init__(self, message: str, position: int):
        super().__init__(message)
        self.position = position


class _Fail(Exception):
    """An evaluation error before the expression text is attached."""

    def __init__(self, message: str, position: int):
        super().__init__(message)
        self.position = position


# --- tokens -----------------------------------------------------------------------------

_NUMBER = re.compile(r"\d+(\.\d+)?([eE][+-]?\d+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = ("==", "!=", "<=", ">=", "&&", "||", "<", ">", "+", "-", "*", "/", "%", "!")
_PUNCT = "()[],.{}:"
_KEYWORDS = {"true", "false", "null", "and", "or", "not", "in"}
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r", "/": "/"}

# token: (kind, value, position); kinds: num, str, name, kw, op, punct, end
Token = tuple[str, Any, int]

# parse-tree node: a tuple whose first item is its kind and second its position (see below)
Node = tuple[Any, ...]

# a built-in function: (evaluated arguments, position) -> JSON value
Function = Callable[[list[Any], int], Any]


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if c.isdigit():
            m = _NUMBER.match(text, i)
            assert m is not None
            raw = m.group(0)
            if m.group(1) or m.group(2):
                value: Any = float(raw)
                if not math.isfinite(value):
                    raise ExpressionError(f"number {raw} is out of range", text, i)
            else:
                value = int(raw)
            tokens.append(("num", value, i))
            i = m.end()
            if i < n and (text[i].isalpha() or text[i] == "_"):
                raise ExpressionError(f"unexpected character {text[i]!r}", text, i)
            continue
        if c in "'\"":
            value, end = _read_string(text, i)
            tokens.append(("str", value, i))
            i = end
            continue
        if c.isalpha() or c == "_":
            m = _NAME.match(text, i)
            assert m is not None
            word = m.group(0)
            if word.startswith("__"):
                raise ExpressionError(f"names starting with '__' are not allowed ({word})", text, i)
            tokens.append(("kw" if word in _KEYWORDS else "name", word, i))
            i = m.end()
            continue
        for op in _OPERATORS:
            if text.startswith(op, i):
                tokens.append(("op", op, i))
                i += len(op)
                break
        else:
            if c in _PUNCT:
                tokens.append(("punct", c, i))
                i += 1
            elif c == "=":
                raise ExpressionError("unexpected '=' (compare with '==')", text, i)
            else:
                raise ExpressionError(f"unexpected character {c!r}", text, i)
    tokens.append(("end", None, n))
    return tokens


def _read_string(text: str, start: int) -> tuple[str, int]:
    quote = text[start]
    out: list[str] = []
    i = start + 1
    while i < len(text):
        c = text[i]
        if c == quote:
            return "".join(out), i + 1
        if c == "\\":
            if i + 1 >= len(text):
                break
            e = text[i + 1]
            if e in _ESCAPES:
                out.append(_ESCAPES[e])
                i += 2
                continue
            if e == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2 : i + 6]):
                out.append(chr(int(text[i + 2 : i + 6], 16)))
                i += 6
                continue
            raise ExpressionError(f"unknown escape \\{e}", text, i)
        out.append(c)
        i += 1
    raise ExpressionError("unterminated string", text, start)


# --- parser -----------------------------------------------------------------------------
# Nodes are tuples: ("lit", pos, value), ("list", pos, [nodes]),
# ("object", pos, [(key, node)]), ("path", pos, root, [steps])
# with steps ("key", pos, name) | ("index", pos, node), ("call", pos, name, [nodes]),
# ("not", pos, node), ("neg", pos, node), ("cmp", pos, op, left, right),
# ("chain", pos, first, [(op, pos, node)]) for + - * / %, ("and"|"or", pos, [nodes]).


class _Parser:
    def __init__(self, text: str, tokens: list[Token], roots: tuple[str, ...]):
        self.text = text
        self.tokens = tokens
        self.roots = roots
        self.i = 0
        self.depth = 0

    # helpers
    def peek(self) -> Token:
        return self.tokens[self.i]

    def next(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def at(self, kind: str, *values: Any) -> bool:
        k, v, _ = self.tokens[self.i]
        return k == kind and (not values or v in values)

    def expect(self, kind: str, value: Any, what: str) -> Token:
        if not self.at(kind, value):
            self.fail(f"expected {what}, found {self.describe(self.peek())}")
        return self.next()

    def fail(self, message: str, pos: int | None = None) -> NoReturn:
        raise ExpressionError(message, self.text, self.peek()[2] if pos is None else pos)

    @staticmethod
    def describe(tok: Token) -> str:
        kind, value, _ = tok
        if kind == "end":
            return "end of expression"
        if kind == "str":
            return f"string {value!r}"
        return repr(str(value))

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.fail(f"nesting deeper than {MAX_DEPTH}")

    def leave(self) -> None:
        self.depth -= 1

    # grammar
    def parse(self) -> Node:
        node = self.expr()
        if not self.at("end"):
            self.fail(f"unexpected {self.describe(self.peek())}")
        return node

    def expr(self) -> Node:
        return self.or_()

    def or_(self) -> Node:
        pos = self.peek()[2]
        items: list[Node] = [self.and_()]
        while self.at("kw", "or") or self.at("op", "||"):
            self.next()
            items.append(self.and_())
        return items[0] if len(items) == 1 else ("or", pos, items)

    def and_(self) -> Node:
        pos = self.peek()[2]
        items: list[Node] = [self.not_()]
        while self.at("kw", "and") or self.at("op", "&&"):
            self.next()
            items.append(self.not_())
        return items[0] if len(items) == 1 else ("and", pos, items)

    def not_(self) -> Node:
        if self.at("kw", "not") or self.at("op", "!"):
            pos = self.next()[2]
            self.enter()
            node = ("not", pos, self.not_())
            self.leave()
            return node
        return self.comparison()

    def comparison(self) -> Node:
        left = self.additive()
        tok = self.peek()
        op = None
        if tok[0] == "op" and tok[1] in ("==", "!=", "<", "<=", ">", ">="):
            op = self.next()[1]
        elif self.at("kw", "in"):
            self.next()
            op = "in"
        elif self.at("kw", "not") and self.tokens[self.i + 1][:2] == ("kw", "in"):
            self.i += 2
            op = "not in"
        if op is None:
            return left
        right = self.additive()
        nxt = self.peek()
        if (nxt[0] == "op" and nxt[1] in ("==", "!=", "<", "<=", ">", ">=")) or (
            nxt[0] == "kw" and nxt[1] == "in"
        ):
            self.fail("comparisons cannot be chained; use 'and'")
        return ("cmp", tok[2], op, left, right)

    def additive(self) -> Node:
        return self._chain(self.term, ("+", "-"))

    def term(self) -> Node:
        return self._chain(self.unary, ("*", "/", "%"))

    def _chain(self, operand: Callable[[], Node], ops: tuple[str, ...]) -> Node:
        pos = self.peek()[2]
        first = operand()
        rest: list[tuple[str, int, Node]] = []
        while self.peek()[0] == "op" and self.peek()[1] in ops:
            _, op, opos = self.next()
            rest.append((op, opos, operand()))
        return first if not rest else ("chain", pos, first, rest)

    def unary(self) -> Node:
        if self.at("op", "-"):
            pos = self.next()[2]
            self.enter()
            node = self.unary()
            self.leave()
            if node[0] == "lit" and _is_number(node[2]):
                return ("lit", pos, -node[2])
            return ("neg", pos, node)
        if self.at("op", "+"):
            self.fail("unary '+' is not supported")
        return self.primary()

    def primary(self) -> Node:
        kind, value, pos = self.peek()
        node: Node
        if kind in ("num", "str"):
            self.next()
            node = ("lit", pos, value)
        elif kind == "kw" and value in ("true", "false", "null"):
            self.next()
            node = ("lit", pos, {"true": True, "false": False, "null": None}[value])
        elif kind == "punct" and value == "(":
            self.next()
            self.enter()
            node = self.expr()
            self.leave()
            self.expect("punct", ")", "')'")
        elif kind == "punct" and value == "[":
            self.next()
            self.enter()
            items = self._items("]")
            self.leave()
            node = ("list", pos, items)
        elif kind == "punct" and value == "{":
            self.next()
            self.enter()
            node = ("object", pos, self._entries())
            self.leave()
        elif kind == "name":
            self.next()
            if self.at("punct", "("):
                if value not in FUNCTIONS:
                    self.fail(f"unknown function {value!r}", pos)
                self.next()
                self.enter()
                args = self._items(")")
                self.leave()
                node = ("call", pos, value, args)
            else:
                if value not in self.roots:
                    self.fail(
                        f"unknown name {value!r} (paths start with one of:"
                        f" {', '.join(self.roots)};"
                        " strings need quotes)",
                        pos,
                    )
                return self._path(value, pos)
        else:
            self.fail(f"unexpected {self.describe(self.peek())}")
        if self.at("punct", ".") or self.at("punct", "["):
            self.fail("only paths (data..., outputs...) can be indexed or dotted")
        return node

    def _items(self, close: str) -> list[Node]:
        items: list[Node] = []
        if self.at("punct", close):
            self.next()
            return items
        while True:
            items.append(self.expr())
            if self.at("punct", ","):
                self.next()
                continue
            self.expect("punct", close, f"',' or '{close}'")
            return items

    def _entries(self) -> list[tuple[str, Node]]:
        entries: list[tuple[str, Node]] = []
        seen: set[str] = set()
        if self.at("punct", "}"):
            self.next()
            return entries
        while True:
            kind, key, _ = self.peek()
            if kind not in ("str", "name", "kw"):
                self.fail(f"expected an object key, found {self.describe(self.peek())}")
            if key in seen:
                self.fail(f"duplicate key {key!r}")
            seen.add(key)
            self.next()
            self.expect("punct", ":", "':'")
            entries.append((key, self.expr()))
            if self.at("punct", ","):
                self.next()
                continue
            self.expect("punct", "}", "',' or '}'")
            return entries

    def _path(self, root: str, pos: int) -> Node:
        steps: list[Node] = []
        while True:
            if self.at("punct", "."):
                self.next()
                kind, value, npos = self.peek()
                if kind not in ("name", "kw"):
                    self.fail(f"expected a name after '.', found {self.describe(self.peek())}")
                self.next()
                steps.append(("key", npos, value))
            elif self.at("punct", "["):
                ipos = self.next()[2]
                self.enter()
                index = self.expr()
                self.leave()
                self.expect("punct", "]", "']'")
                steps.append(("index", ipos, index))
            else:
                return ("path", pos, root, steps)


# --- values -----------------------------------------------------------------------------


def _is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if _is_number(v):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list | tuple):
        return "list"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def truthy(v: Any) -> bool:
    """null, false, 0, "", [] and {} are false; everything else is true."""
    if v is None or v is False:
        return False
    if _is_number(v):
        return v != 0
    if isinstance(v, str | list | tuple | dict):
        return len(v) > 0
    return True


def equal(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1, 1 equals 1.0, lists and objects compare deeply."""
    if _is_number(a) and _is_number(b):
        return a == b
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if _type(a) != _type(b):
        return False
    return bool(a == b)


def _number(v: Any, pos: int) -> int | float:
    if isinstance(v, int) and not isinstance(v, bool):
        if v.bit_length() > MAX_INT_BITS:
            raise _Fail("number too large", pos)
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise _Fail("number out of range", pos)
        return v
    raise _Fail(f"expected a number, got {_type(v)}", pos)


_Orderable = TypeVar("_Orderable", int, float, str)


def _ordered(a: Any, b: Any, pos: int, op: str) -> bool:
    if _is_number(a) and _is_number(b):
        return _order(a, b, op)
    if isinstance(a, str) and isinstance(b, str):
        return _order(a, b, op)
    raise _Fail(f"cannot compare {_type(a)} {op} {_type(b)}", pos)


def _order(a: _Orderable, b: _Orderable, op: str) -> bool:
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def _contains(haystack: Any, needle: Any, pos: int) -> bool:
    if isinstance(haystack, str):
        if not isinstance(needle, str):
            raise _Fail(f"cannot look for a {_type(needle)} in a string", pos)
        return needle in haystack
    if isinstance(haystack, list | tuple):
        return any(equal(x, needle) for x in haystack)
    if isinstance(haystack, dict):
        return isinstance(needle, str) and needle in haystack
    raise _Fail(f"cannot look inside a {_type(haystack)}", pos)


# --- functions --------------------------------------------------------------------------


def _arity(name: str, args: list[Any], lo: int, hi: int | None, pos: int) -> None:
    if len(args) < lo or (hi is not None and len(args) > hi):
        want = str(lo) if hi == lo else f"{lo}+" if hi is None else f"{lo} to {hi}"
        raise _Fail(f"{name}() takes {want} argument(s), got {len(args)}", pos)


def _fn_len(args: list[Any], pos: int) -> int:
    _arity("len", args, 1, 1, pos)
    v = args[0]
    if isinstance(v, str | list | tuple | dict):
        return len(v)
    raise _Fail(f"len() of a {_type(v)}", pos)


def _fn_case(name: str) -> Function:
    def fn(args: list[Any], pos: int) -> str:
        _arity(name, args, 1, 1, pos)
        if not isinstance(args[0], str):
            raise _Fail(f"{name}() of a {_type(args[0])}", pos)
        return args[0].lower() if name == "lower" else args[0].upper()

    return fn


def _fn_str(args: list[Any], pos: int) -> str:
    _arity("str", args, 1, 1, pos)
    v = args[0]
    if isinstance(v, str):
        return v
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    if _is_number(v):
        _number(v, pos)
        return str(v)
    return json.dumps(v, separators=(",", ":"), sort_keys=True)


def _fn_int(args: list[Any], pos: int) -> int:
    _arity("int", args, 1, 1, pos)
    v = args[0]
    if isinstance(v, bool):
        return int(v)
    if _is_number(v):
        return int(_number(v, pos))
    if isinstance(v, str):
        s = v.strip()
        if re.fullmatch(r"[+-]?\d{1,300}", s):
            return int(s)
        try:
            f = float(s)
        except ValueError:
            raise _Fail(f"int() of {v[:50]!r}: not a number", pos) from None
        return int(_number(f, pos))
    raise _Fail(f"int() of a {_type(v)}", pos)


def _fn_float(args: list[Any], pos: int) -> int | float:
    _arity("float", args, 1, 1, pos)
    v = args[0]
    if isinstance(v, bool):
        return float(v)
    if _is_number(v):
        return float(_number(v, pos))
    if isinstance(v, str):
        try:
            f = float(v.strip()[:400])
        except ValueError:
            raise _Fail(f"float() of {v[:50]!r}: not a number", pos) from None
        return _number(f, pos)
    raise _Fail(f"float() of a {_type(v)}", pos)


def _fn_round(args: list[Any], pos: int) -> int | float:
    _arity("round", args, 1, 2, pos)
    x = _number(args[0], pos)
    digits = 0
    if len(args) == 2:
        d = args[1]
        if not (isinstance(d, int) and not isinstance(d, bool)) or not -20 <= d <= 20:
            raise _Fail("round() digits must be an integer between -20 and 20", pos)
        digits = d
    # half away from zero, as people expect from round(2.5) == 3
    with decimal.localcontext() as dctx:
        dctx.prec = 400  # enough for any finite float or bounded integer
        q = decimal.Decimal(repr(x)).quantize(
            decimal.Decimal(1).scaleb(-digits), rounding=decimal.ROUND_HALF_UP
        )
    return int(q) if digits <= 0 else float(q)


def _many(name: str, args: list[Any], pos: int) -> list[Any]:
    if len(args) == 1 and isinstance(args[0], list | tuple):
        items = list(args[0])
    else:
        _arity(name, args, 2, None, pos)
        items = args
    if not items:
        raise _Fail(f"{name}() of an empty list", pos)
    return items


def _fn_minmax(name: str) -> Function:
    def fn(args: list[Any], pos: int) -> Any:
        items = _many(name, args, pos)
        if all(_is_number(x) for x in items) or all(isinstance(x, str) for x in items):
            return min(items) if name == "min" else max(items)
        raise _Fail(f"{name}() needs numbers or strings, not a mix", pos)

    return fn


def _fn_sum(args: list[Any], pos: int) -> int | float:
    _arity("sum", args, 1, 1, pos)
    items = args[0]
    if not isinstance(items, list | tuple):
        raise _Fail(f"sum() of a {_type(items)}; give a list", pos)
    total: int | float = 0
    for x in items:
        total = _number(total + _number(x, pos), pos)
    return total


def _fn_contains(args: list[Any], pos: int) -> bool:
    _arity("contains", args, 2, 2, pos)
    return _contains(args[0], args[1], pos)


def _fn_coalesce(args: list[Any], pos: int) -> NoReturn:
    # never called: _eval evaluates coalesce() lazily
    raise AssertionError("coalesce is evaluated lazily")


FUNCTIONS: dict[str, Function] = {
    "len": _fn_len,
    "lower": _fn_case("lower"),
    "upper": _fn_case("upper"),
    "str": _fn_str,
    "int": _fn_int,
    "float": _fn_float,
    "round": _fn_round,
    "min": _fn_minmax("min"),
    "max": _fn_minmax("max"),
    "sum": _fn_sum,
    "contains": _fn_contains,
    "coalesce": _fn_coalesce,
}


# --- interpreter ------------------------------------------------------------------------


def _eval(node: Node, scope: dict[str, Any]) -> Any:
    kind = node[0]
    pos = node[1]
    if kind == "lit":
        return node[2]
    if kind == "path":
        return _resolve(node, scope)
    if kind == "list":
        return [_eval(n, scope) for n in node[2]]
    if kind == "object":
        return {k: _eval(n, scope) for k, n in node[2]}
    if kind == "call":
        name, args = node[2], node[3]
        if name == "coalesce":
            if not args:
                raise _Fail("coalesce() takes 1+ argument(s), got 0", pos)
            for arg in args:
                try:
                    v = _eval(arg, scope)
                except _Missing:
                    continue
                if v is not None:
                    return v
            return None
        return FUNCTIONS[name]([_eval(a, scope) for a in args], pos)
    if kind == "not":
        return not truthy(_eval(node[2], scope))
    if kind == "neg":
        v = _eval(node[2], scope)
        return -_number(v, pos)
    if kind == "and":
        return all(truthy(_eval(n, scope)) for n in node[2])
    if kind == "or":
        return any(truthy(_eval(n, scope)) for n in node[2])
    if kind == "cmp":
        op, a, b = node[2], _eval(node[3], scope), _eval(node[4], scope)
        if op == "==":
            return equal(a, b)
        if op == "!=":
            return not equal(a, b)
        if op == "in":
            return _contains(b, a, pos)
        if op == "not in":
            return not _contains(b, a, pos)
        return _ordered(a, b, pos, op)
    if kind == "chain":
        acc = _eval(node[2], scope)
        for op, opos, operand in node[3]:
            acc = _arith(op, acc, _eval(operand, scope), opos)
        return acc
    raise AssertionError(f"unknown node {kind}")


def _arith(op: str, a: Any, b: Any, pos: int) -> Any:
    if op == "+":
        if isinstance(a, str) and isinstance(b, str):
            if len(a) + len(b) > MAX_STRING:
                raise _Fail(f"string longer than {MAX_STRING} characters", pos)
            return a + b
        if isinstance(a, list) and isinstance(b, list):
            if len(a) + len(b) > MAX_LIST:
                raise _Fail(f"list longer than {MAX_LIST} items", pos)
            return a + b
        if not (_is_number(a) and _is_number(b)):
            raise _Fail(f"cannot add {_type(a)} and {_type(b)}", pos)
    elif not (_is_number(a) and _is_number(b)):
        raise _Fail(f"cannot apply {op!r} to {_type(a)} and {_type(b)}", pos)
    x, y = _number(a, pos), _number(b, pos)
    if op in ("/", "%") and y == 0:
        raise _Fail("division by zero", pos)
    if op == "+":
        r = x + y
    elif op == "-":
        r = x - y
    elif op == "*":
        if (
            isinstance(x, int)
            and isinstance(y, int)
            and x.bit_length() + y.bit_length() > (MAX_INT_BITS + 1)
        ):
            raise _Fail("number too large", pos)
        r = x * y
    elif op == "/":
        r = x / y
    else:
        r = x % y
    return _number(r, pos)


def _resolve(node: Node, scope: dict[str, Any]) -> Any:
    _, pos, root, steps = node
    if root not in scope:
        raise _Fail(f"unknown root {root!r}", pos)
    value = scope[root]
    shown = root
    for step in steps:
        skind, spos, arg = step
        if skind == "key":
            key: Any = arg
        else:
            key = _eval(arg, scope)
        if skind == "key" and not isinstance(value, dict):
            raise _Missing(f"{shown} is a {_type(value)}, it has no key {key!r}", spos)
        if isinstance(value, dict):
            if not isinstance(key, str):
                raise _Fail(f"{shown}: object keys are strings, not {_type(key)}", spos)
            if key not in value:
                raise _Missing(f"{shown} has no key {key!r}", spos)
            value = value[key]
            shown = f"{shown}.{key}" if re.fullmatch(r"[A-Za-z_]\w*", key) else f"{shown}[{key!r}]"
        elif isinstance(value, list | tuple | str):
            if not (isinstance(key, int) and not isinstance(key, bool)):
                raise _Fail(f"{shown} is a {_type(value)}: index it with an integer", spos)
            if not -len(value) <= key < len(value):
                raise _Missing(f"{shown} has no index {key} (length {len(value)})", spos)
            value = value[key]
            shown = f"{shown}[{key}]"
        else:
            what = repr(key) if isinstance(key, str) else key
            raise _Missing(f"{shown} is {_type(value)}, it has no [{what}]", spos)
    return value


# --- public API -------------------------------------------------------------------------


class Expression:
    """A parsed expression; ``evaluate(scope)`` may be called many times."""

    __slots__ = ("_tree", "text")

    def __init__(self, text: str, tree: Node):
        self.text = text
        self._tree = tree

    def evaluate(self, scope: dict[str, Any]) -> Any:
        try:
            return _eval(self._tree, scope)
        except (_Missing, _Fail) as exc:
            raise ExpressionError(str(exc), self.text, exc.position) from None
        except RecursionError:  # deep data in equal(); the parse itself is bounded
            raise ExpressionError("value nested too deeply", self.text, None) from None

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"


def _unwrap(text: str) -> str:
    stripped = text.strip()
    if stripped.startswith("{{") and stripped.endswith("}}"):
        return stripped[2:-2]
    return text


@functools.lru_cache(maxsize=1024)
def _compile(text: str, roots: tuple[str, ...]) -> Expression:
    body = _unwrap(text)
    if not body.strip():
        raise ExpressionError("empty expression", text, 0)
    tokens = tokenize(body)
    return Expression(body, _Parser(body, tokens, roots).parse())


def compile(text: str, roots: tuple[str, ...] = ROOTS) -> Expression:
    """Parse ``text`` (a surrounding ``{{ }}`` is tolerated) with the names ``roots``
    (a verifier's expressions have their own, rules.VERIFY_EXPRESSION_ROOTS). Raises
    ExpressionError."""
    if not isinstance(text, str):
        raise ExpressionError(f"an expression is a string, not {_type(text)}", str(text), None)
    if len(text) > MAX_LENGTH:
        raise ExpressionError(
            f"expression is {len(text)} characters, over the limit of {MAX_LENGTH}",
            text,
            None,
        )
    return _compile(text, roots)


def evaluate(text: str, scope: dict[str, Any], roots: tuple[str, ...] = ROOTS) -> Any:
    """Parse and evaluate ``text`` over ``scope`` (root name -> JSON value)."""
    return compile(text, roots).evaluate(scope)
