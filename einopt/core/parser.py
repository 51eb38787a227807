"""Parsing the text syntax (grammar in ``einopt.core.syntax``) into interned IR nodes.

A hand-written tokenizer and recursive-descent parser. The trailing ``where``
clause is parsed first, since the body reads the tensors it declares. Every
malformed input raises ``ParseError`` with a line and column, including the
``IRError`` a node constructor raises (reported at the offending token).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from typing import Any

from einopt.core.ir import (
    DTYPES,
    REDUCTIONS,
    RESERVED_NAMES,
    UNARY_FUNCS,
    Access,
    Binary,
    Const,
    IAdd,
    IConst,
    IFloorDiv,
    IMod,
    IMul,
    IndexExpr,
    IRError,
    ISub,
    Iter,
    Program,
    Scope,
    Tensor,
    Unary,
    ValueExpr,
    tensors_in,
)
from einopt.core.ops import BINARY

__all__ = ["parse", "ParseError", "RESERVED"]

RESERVED = RESERVED_NAMES


class ParseError(IRError):
    """Malformed text, with its 1-based ``line`` and ``col``.

    ``text`` is the whole source and ``msg`` the bare message; ``str()`` shows
    the position, the message, the source line and a caret under the column.
    """

    def __init__(self, msg: str, text: str, pos: int) -> None:
        pos = max(0, min(pos, len(text)))
        start = text.rfind("\n", 0, pos) + 1
        end = text.find("\n", pos)
        source_line = text[start : end if end >= 0 else len(text)].rstrip("\r")
        self.msg = msg
        self.text = text
        self.pos = pos
        self.line = text.count("\n", 0, pos) + 1
        self.col = pos - start + 1
        # Keep tabs in the caret's indentation so that it lines up.
        lead = "".join(c if c == "\t" else " " for c in source_line[: pos - start])
        super().__init__(f"line {self.line}, col {self.col}: {msg}\n  {source_line}\n  {lead}^")

    def __reduce__(self) -> tuple:
        return (type(self), (self.msg, self.text, self.pos))


_TOKEN = re.compile(
    r"""
    (?P<skip>[ \t\r\n\f\v]+|\#[^\n]*)
  | (?P<num>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
  | (?P<name>[^\W\d]\w*)
  | (?P<op>//|[\[\]{}(),:;=+\-*/%|])
  | (?P<bad>.)
    """,
    re.VERBOSE,
)

# A token is (kind, text, offset); kind is "num", "name", "op" or "eof".
_Token = tuple[str, str, int]

# Deepest nesting of parentheses, braces and unary minus accepted.
_MAX_DEPTH = 150


def _tokenize(text: str) -> list[_Token]:
    toks: list[_Token] = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind == "skip":
            continue
        if kind == "bad":
            raise ParseError(f"unexpected character {m.group()!r}", text, m.start())
        toks.append((kind, m.group(), m.start()))
    # Point end-of-input errors just after the last token, not at trailing blank lines.
    end = toks[-1][2] + len(toks[-1][1]) if toks else 0
    toks.append(("eof", "", end))
    return toks


def _describe(tok: _Token) -> str:
    return "end of input" if tok[0] == "eof" and not tok[1] else repr(tok[1])


def _is_int(tok: _Token) -> bool:
    return tok[0] == "num" and tok[1].isdigit()


ShapeSpec = Sequence[int] | tuple[Sequence[int], str]


def parse(text: str, shapes: Mapping[str, ShapeSpec] | None = None) -> Scope | Program:
    """Parse an expression (``L[...] ...``) or a program (``X = L[...] ...; return X``).

    Parameters
    ----------
    text : str
        The source; input tensors are declared in a trailing ``where`` clause
        (``where A: [56, 56, 64], B: float16[3, 4]``) and/or through ``shapes``.
    shapes : mapping of str to shape or (shape, dtype), optional
        Extra input tensor declarations (dtype float32 unless given). A name
        declared in both places must be declared identically.

    Returns
    -------
    Scope or Program
        The interned node, so ``parse(format_node(e)) is e``. A program's
        inputs are the ``where`` tensors in order, then the used tensors
        from ``shapes`` in first-use order.

    Raises
    ------
    ParseError
        On malformed text, with the line and column of the problem.
    """
    return _Parser(text, shapes).parse()


def _tensor_from_spec(name: str, spec: Any) -> Tensor:
    if (
        isinstance(spec, tuple)
        and len(spec) == 2
        and isinstance(spec[1], str)
        and not isinstance(spec[0], int)
    ):
        shape, dtype = spec
    else:
        shape, dtype = spec, "float32"
    try:
        return Tensor(name, tuple(operator.index(n) for n in shape), dtype)
    except (TypeError, IRError) as err:
        raise IRError(f"shapes[{name!r}]: {err}") from None


class _Parser:
    """Recursive descent over a token list; every error is a ``ParseError``."""

    def __init__(self, text: str, shapes: Mapping[str, ShapeSpec] | None) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0
        self.depth = 0
        self.shapes = {name: _tensor_from_spec(name, spec) for name, spec in (shapes or {}).items()}
        self.declared: dict[str, Tensor] = {}
        self.bindings: dict[str, Scope] = {}
        # Iterators of the scopes being parsed, innermost last.
        self.env: list[dict[str, Iter]] = []

    # -- token helpers ---------------------------------------------------

    def error(self, msg: str, tok: _Token | None = None) -> ParseError:
        return ParseError(msg, self.text, (tok or self.toks[self.i])[2])

    def peek(self, k: int = 0) -> _Token:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def next(self) -> _Token:
        tok = self.toks[self.i]
        if tok[0] != "eof":
            self.i += 1
        return tok

    def at(self, s: str) -> bool:
        tok = self.toks[self.i]
        return tok[1] == s and tok[0] in ("op", "name")

    def accept(self, s: str) -> bool:
        if self.at(s):
            self.i += 1
            return True
        return False

    def expect(self, s: str, what: str) -> _Token:
        if not self.at(s):
            raise self.error(f"expected '{s}' {what}, got {_describe(self.peek())}")
        return self.next()

    def name(self, what: str) -> _Token:
        tok = self.peek()
        if tok[0] != "name":
            raise self.error(f"expected {what}, got {_describe(tok)}")
        if tok[1] in RESERVED:
            raise self.error(f"'{tok[1]}' is a reserved word and cannot be used as {what}")
        return self.next()

    def int(self, what: str, signed: bool = False) -> int:
        tok = self.peek()
        sign = 1
        if signed and self.at("-"):
            self.next()
            sign, tok = -1, self.peek()
        if not _is_int(tok):
            raise self.error(f"expected {what} (an integer), got {_describe(tok)}", tok)
        self.next()
        return sign * int(tok[1])

    def build(self, tok: _Token, cls: type, *args: Any) -> Any:
        """Construct a node, reporting the constructor's IRError at ``tok``."""
        try:
            return cls(*args)
        except IRError as err:
            raise self.error(str(err), tok) from None

    def deeper(self) -> None:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise self.error(f"expression nested more than {_MAX_DEPTH} levels deep")

    # -- top level -------------------------------------------------------

    def parse(self) -> Scope | Program:
        end = self.parse_where()
        first = self.peek()
        if first[0] == "name" and (self.peek(1)[1] == "=" or first[1] == "return"):
            node: Scope | Program = self.program()
        elif self.at("L"):
            node = self.scope()
        else:
            raise self.error(
                "expected a scope 'L[...] ...' or a program 'NAME = L[...] ... return NAME', "
                f"got {_describe(first)}"
            )
        if self.i != end:
            tok = self.peek()
            hint = " (is an operator missing?)" if tok[0] != "eof" else ""
            raise self.error(f"unexpected {_describe(tok)} after the expression{hint}")
        return node

    def parse_where(self) -> int:
        """Parse the trailing ``where`` clause first (the body reads it); return its index."""
        w = next((w for w, t in enumerate(self.toks) if t[0] == "name" and t[1] == "where"), None)
        if w is None:
            return len(self.toks) - 1
        if w == 0:
            raise self.error("'where' is a reserved word: the where clause follows an expression")
        self.i = w + 1
        while True:
            self.decl()
            if self.peek()[0] == "eof":
                break
            if not self.accept(","):
                raise self.error(
                    f"expected ',' or the end after a declaration, got {_describe(self.peek())} "
                    "(the where clause comes last)"
                )
        # The body ends where the where clause starts.
        self.toks[w] = ("eof", "where", self.toks[w][2])
        self.i = 0
        return w

    def decl(self) -> None:
        tok = self.name("a tensor name")
        name = tok[1]
        if name in self.declared:
            raise self.error(f"tensor {name} is declared twice", tok)
        self.expect(":", f"after tensor name {name}")
        dtype = "float32"
        if self.peek()[0] == "name":
            dt = self.next()
            if dt[1] not in DTYPES:
                raise self.error(f"unknown dtype '{dt[1]}' (expected one of {', '.join(DTYPES)})", dt)
            dtype = dt[1]
        self.expect("[", f"to start the shape of {name}")
        shape = []
        if not self.at("]"):
            shape.append(self.int("a dimension"))
            while self.accept(","):
                shape.append(self.int("a dimension"))
        self.expect("]", f"to end the shape of {name}")
        t = self.build(tok, Tensor, name, tuple(shape), dtype)
        other = self.shapes.get(name)
        if other is not None and other is not t:
            raise self.error(
                f"tensor {name} is declared as {t} here but as {other} in shapes=",
                tok,
            )
        self.declared[name] = t

    def program(self) -> Program:
        start = self.peek()
        bindings: list[tuple[str, Scope]] = []
        while not self.at("return"):
            tok = self.name("a binding name (or 'return')")
            name = tok[1]
            if name in self.bindings:
                raise self.error(f"{name} is bound twice", tok)
            if name in self.declared or name in self.shapes:
                raise self.error(f"{name} is an input tensor and cannot be bound", tok)
            self.expect("=", f"after binding name {name}")
            s = self.scope()
            self.accept(";")
            self.bindings[name] = s
            bindings.append((name, s))
        self.next()
        outputs = [self.output()]
        while self.accept(","):
            outputs.append(self.output())
        inputs = dict.fromkeys(self.declared.values())
        for _, s in bindings:
            inputs.update(dict.fromkeys(tensors_in(s)))
        return self.build(start, Program, tuple(inputs), tuple(bindings), tuple(outputs))

    def output(self) -> str:
        tok = self.peek()
        if tok[0] != "name" or tok[1] not in self.bindings:
            what = f"'{tok[1]}' is not bound" if tok[0] == "name" else f"got {_describe(tok)}"
            raise self.error(f"expected the name of a binding to return: {what}")
        return self.next()[1]

    # -- scopes ----------------------------------------------------------

    def scope(self) -> Scope:
        start = self.peek()
        if not self.at("L"):
            raise self.error(f"expected 'L[' to start a scope, got {_describe(start)}")
        self.next()
        self.deeper()
        self.expect("[", "after 'L'")
        bound: dict[str, Iter] = {}
        traversal = [self.iterdecl(bound)]
        while self.accept(","):
            traversal.append(self.iterdecl(bound))
        pad: tuple[tuple[int, int], ...] = ()
        if self.accept("|"):
            pad = self.pad(len(traversal))
        self.expect("]", "to close 'L[' (or ',' before another iterator)")
        summation = []
        reduce = "sum"
        for kind, keyword in REDUCTIONS.items():
            if self.accept(keyword):
                reduce = kind
                self.expect("[", f"after '{keyword}'")
                summation.append(self.iterdecl(bound))
                while self.accept(","):
                    summation.append(self.iterdecl(bound))
                self.expect("]", f"to close '{keyword}[' (or ',' before another iterator)")
                break
        self.env.append(bound)
        body = self.value()
        self.env.pop()
        self.depth -= 1
        return self.build(start, Scope, tuple(traversal), tuple(summation), body, pad, reduce)

    def iterdecl(self, bound: dict[str, Iter]) -> Iter:
        tok = self.name("an iterator name")
        name = tok[1]
        if name in bound:
            raise self.error(f"iterator {name} is bound twice in this scope", tok)
        lo = 0
        if self.accept("="):
            lo = self.int(f"the start of {name}'s range", signed=True)
            self.expect(":", f"between the bounds of {name}")
        elif not self.accept(":"):
            raise self.error(
                f"expected ':' or '=' after iterator {name} (write {name}:HI or {name}=LO:HI), "
                f"got {_describe(self.peek())}"
            )
        hi = self.int(f"the end of {name}'s range", signed=True)
        it = bound[name] = self.build(tok, Iter, name, lo, hi)
        return it

    def pad(self, rank: int) -> tuple[tuple[int, int], ...]:
        tok = self.peek()
        if not self.accept("pad"):
            raise self.error(f"expected 'pad' after '|', got {_describe(tok)}")
        pads = []
        while True:
            before = self.int("padding before")
            self.expect(":", "between padding before and after")
            pads.append((before, self.int("padding after")))
            if not self.accept(","):
                break
        if len(pads) != rank:
            raise self.error(
                f"pad gives {len(pads)} (before:after) pairs for {rank} traversal iterators", tok
            )
        if all(p == (0, 0) for p in pads):
            raise self.error("pad of all zeros: leave the pad out instead", tok)
        return tuple(pads)

    # -- values ----------------------------------------------------------

    def value(self) -> ValueExpr:
        e = self.term()
        while True:
            tok = self.peek()
            if tok[1] not in ("+", "-") or tok[0] != "op":
                return e
            self.next()
            e = Binary(tok[1], e, self.term())

    def term(self) -> ValueExpr:
        e = self.factor()
        while True:
            tok = self.peek()
            if tok[1] not in ("*", "/") or tok[0] != "op":
                return e
            self.next()
            e = Binary(tok[1], e, self.factor())

    def number(self) -> float | None:
        """A NUMBER (``2``, ``1e-05``, ``inf``, ``nan``) if one comes next."""
        tok = self.peek()
        if tok[0] == "num" or (tok[0] == "name" and tok[1] in ("inf", "nan")):
            self.next()
            return float(tok[1])
        return None

    def factor(self) -> ValueExpr:
        self.deeper()
        e = self._factor()
        self.depth -= 1
        return e

    def _factor(self) -> ValueExpr:
        tok = self.peek()
        kind, s = tok[0], tok[1]
        if kind == "op":
            if s == "-":
                self.next()
                v = self.number()
                if v is not None:
                    return Const(-v)
                return Unary("neg", self.factor())
            if s == "(":
                self.next()
                e = self.value()
                self.expect(")", "to close '('")
                return e
            if s == "{":
                self.next()
                sub = self.scope()
                self.expect("}", "to close the nested scope '{'")
                return self.access(tok, sub)
        elif kind == "num" or s in ("inf", "nan"):
            return Const(self.number())
        elif kind == "name":
            return self.named_factor(tok)
        raise self.error(
            f"expected a value (a number, an access, a function call or '('), got {_describe(tok)}"
        )

    def named_factor(self, tok: _Token) -> ValueExpr:
        s = tok[1]
        self.next()
        if s in UNARY_FUNCS:
            self.expect("(", f"after {s}")
            x = self.value()
            param = None
            if UNARY_FUNCS[s]:
                self.expect(",", f"and a constant parameter after the argument of {s}")
                param = self.param(s)
            self.expect(")", f"to close {s}(")
            return self.build(tok, Unary, s, x, param)
        if s in BINARY and not BINARY[s].infix:
            self.expect("(", f"after {s}")
            a = self.value()
            self.expect(",", f"between the two arguments of {s}")
            b = self.value()
            self.expect(")", f"to close {s}(")
            return Binary(s, a, b)
        if s == "L":
            raise self.error("a nested scope is written in braces and indexed: {L[...] ...}[indices]", tok)
        if s in RESERVED:
            raise self.error(f"expected a value, got '{s}'", tok)
        source: Tensor | Scope | None = self.bindings.get(s) or self.declared.get(s) or self.shapes.get(s)
        if source is None:
            if self.env and s in self.env[-1]:
                raise self.error(f"iterator {s} can only be used inside indices, e.g. A[{s}]", tok)
            if s in self.statement_names():
                raise self.error(f"{s} is bound later: a binding can only read earlier bindings", tok)
            raise self.error(
                f"unknown tensor {s}: declare it in a where clause (... where {s}: [4, 4]) or pass shapes=",
                tok,
            )
        return self.access(tok, source)

    def statement_names(self) -> set[str]:
        """Names bound by ``NAME =`` statements anywhere in the text (for error hints)."""
        toks = self.toks
        return {
            a[1]
            for n, (a, b) in enumerate(zip(toks, toks[1:], strict=False))
            if a[0] == "name" and b[1] == "=" and (n == 0 or toks[n - 1][1] not in ("[", ","))
        }

    def param(self, fn: str) -> float:
        sign = -1.0 if self.accept("-") else 1.0
        v = self.number()
        if v is None:
            raise self.error(f"expected a number as the parameter of {fn}, got {_describe(self.peek())}")
        return sign * v

    def access(self, tok: _Token, source: Tensor | Scope) -> Access:
        what = source.name if isinstance(source, Tensor) else "the nested scope"
        self.expect("[", f"after {what} to index it")
        indices = []
        if not self.at("]"):
            indices.append(self.index())
            while self.accept(","):
                indices.append(self.index())
        self.expect("]", "after indices")
        return self.build(tok, Access, source, tuple(indices))

    # -- indices ---------------------------------------------------------

    def index(self) -> IndexExpr:
        e = self.iterm()
        while True:
            tok = self.peek()
            if tok[0] != "op" or tok[1] not in ("+", "-"):
                return e
            self.next()
            e = (IAdd if tok[1] == "+" else ISub)(e, self.iterm())

    def iterm(self) -> IndexExpr:
        e = self.ifactor()
        while True:
            tok = self.peek()
            if tok[0] != "op":
                return e
            s = tok[1]
            if s == "*":
                self.next()
                e = IMul(e, self.ifactor())
            elif s in ("//", "%"):
                self.next()
                k = self.peek()
                if not _is_int(k):
                    raise self.error(f"'{s}' needs a positive integer constant, got {_describe(k)}", k)
                self.next()
                e = self.build(k, IFloorDiv if s == "//" else IMod, e, int(k[1]))
            elif s == "/":
                raise self.error("'/' is not allowed in indices: use '//' for floor division")
            else:
                return e

    def ifactor(self) -> IndexExpr:
        self.deeper()
        e = self._ifactor()
        self.depth -= 1
        return e

    def _ifactor(self) -> IndexExpr:
        tok = self.next()
        kind, s = tok[0], tok[1]
        if kind == "op" and s == "-":
            if _is_int(self.peek()):
                return IConst(-int(self.next()[1]))
            return IMul(IConst(-1), self.ifactor())
        if kind == "op" and s == "(":
            e = self.index()
            self.expect(")", "to close '('")
            return e
        if kind == "num":
            if not s.isdigit():
                raise self.error(f"index constants must be integers, got {s}", tok)
            return IConst(int(s))
        if kind == "name":
            it = self.env[-1].get(s) if self.env else None
            if it is not None:
                return it
            raise self.error(self.unbound(s), tok)
        raise self.error(f"expected an index (an iterator, an integer or '('), got {_describe(tok)}", tok)

    def unbound(self, s: str) -> str:
        if any(s in env for env in self.env[:-1]):
            return (
                f"iterator {s} is not bound in this scope: scopes are closed, so a nested "
                "{L[...] ...} sees only its own iterators (pass values in through its indices)"
            )
        if s in RESERVED:
            return f"expected an index, got reserved word '{s}'"
        known = ", ".join(self.env[-1]) if self.env else ""
        if s in self.declared or s in self.shapes or s in self.bindings:
            return (
                f"{s} is a tensor, not an iterator: indices are built from iterators ({known}) and integers"
            )
        return f"unknown iterator {s} (this scope binds {known})"
