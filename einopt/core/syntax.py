"""The text syntax of expressions and programs: printed and parsed back exactly.

    >>> s = parse("L[i:4, j:4] Sum[k:8] X[i, k] * Y[k, j] where X: [4, 8], Y: [8, 4]")
    >>> parse(format_node(s)) is s
    True

Grammar (whitespace and newlines are free; ``#`` comments to end of line)::

    expr     := scope ["where" decls]
    program  := (NAME "=" scope [";"])+ "return" NAME ("," NAME)* ["where" decls]
    scope    := "L" "[" iterdecl ("," iterdecl)* ["|" "pad" INT ":" INT ("," INT ":" INT)*] "]"
                [("Sum" | "Max") "[" iterdecl ("," iterdecl)* "]"] value
    iterdecl := NAME ":" INT | NAME "=" INT ":" INT          (INT may be negative here)
    value    := term (("+" | "-") term)*
    term     := factor (("*" | "/") factor)*
    factor   := "-" NUMBER | "-" factor | NUMBER
              | NAME "[" index ("," index)* "]" | "{" scope "}" "[" index ("," index)* "]"
              | FUNC "(" value ["," NUMBER] ")" | OP "(" value "," value ")" | "(" value ")"
    index    := iterm (("+" | "-") iterm)*
    iterm    := ifactor ("*" ifactor | "//" INT | "%" INT)*
    ifactor  := "-" INT | "-" ifactor | INT | NAME | "(" index ")"
    decls    := decl ("," decl)*
    decl     := NAME ":" [DTYPE] "[" INT ("," INT)* "]"

``FUNC`` is an element-wise function of ``einopt.core.ops.UNARY`` (``relu``, ``sigmoid``, ...;
the ``NUMBER`` is the parameter of those with one: ``leaky_relu(x, 0.1)``) and ``OP`` a binary
operator of ``einopt.core.ops.BINARY`` written as a call (``max``, ``min``).

``Sum`` adds the body over its iterators, ``Max`` takes the maximum (``REDUCTIONS`` of
``einopt.core.ir``).

``-2`` is the constant -2 while ``-x`` is ``(-1)*x`` (``neg(x)`` for values),
so every node has exactly one printed form and ``parse(format_node(e)) is e``.
A rank-0 tensor is declared ``A: []`` and read ``A[]``. Parsing lives in
``einopt.core.parser``; this module prints and re-exports ``parse``. Importing it
makes ``str(node)`` print in this syntax (:func:`einopt.core.ir.set_formatter`:
the IR does not import its syntax; ``import einopt`` imports this module).
"""

from __future__ import annotations

from collections.abc import Mapping

from einopt.core.ir import (
    REDUCTIONS,
    Access,
    Binary,
    Const,
    IAdd,
    IConst,
    IFloorDiv,
    IMod,
    IMul,
    IndexExpr,
    ISub,
    Iter,
    Node,
    Program,
    Scope,
    Tensor,
    Unary,
    ValueExpr,
    set_formatter,
    tensors_in,
)
from einopt.core.parser import RESERVED, ParseError, parse

__all__ = ["format_node", "format_expr", "brief", "parse", "ParseError", "RESERVED"]

# Precedence levels shared by values and indices: sums < products < factors.
_ADD, _MUL, _ATOM = 1, 2, 3
_VALUE_PREC = {"+": _ADD, "-": _ADD, "*": _MUL, "/": _MUL}


# ==========================================================================
# Printing
# ==========================================================================


def format_node(node: Node) -> str:
    """The text of any node; a scope or program includes its ``where`` clause.

    Index and value expressions print as expressions (nested scopes inline),
    a ``Tensor`` as its declaration ``A: [2, 3]`` and a lone ``Iter`` as its
    range ``h:56`` or ``t=-1:57``.
    """
    return format_expr(node, declare=True)


def format_expr(node: Node, declare: bool = True) -> str:
    """Like ``format_node``; ``declare=False`` omits the ``where`` clause."""
    if isinstance(node, Program):
        return _format_program(node, declare)
    if isinstance(node, Scope):
        text = _Printer({}).scope(node)
        if declare:
            tensors = tensors_in(node)
            if tensors:
                text += " where " + ", ".join(_decl(t) for t in tensors)
        return text
    if isinstance(node, Iter):
        return _iterdecl(node)
    if isinstance(node, IndexExpr):
        return _Printer({}).index(node)[0]
    if isinstance(node, ValueExpr):
        return _Printer({}).value(node)[0]
    if isinstance(node, Tensor):
        return _decl(node)
    raise TypeError(f"cannot format {type(node).__name__}")


def _format_program(p: Program, declare: bool) -> str:
    names: dict[Scope, str] = {}
    lines = []
    for name, s in p.bindings:
        # A binding prints in full; earlier bindings it reads print by name.
        lines.append(f"{name} = {_Printer(names).scope(s)}")
        names.setdefault(s, name)
    lines.append("return " + ", ".join(p.outputs))
    if declare and p.inputs:
        lines.append("where " + ", ".join(_decl(t) for t in p.inputs))
    return "\n".join(lines)


def brief(node: Node) -> str:
    """``node``'s text with every nested scope it reads written ``{..}``: the size of the node's
    own body, for messages. A program's scopes can share nested scopes, so their full text can
    grow exponentially with depth (a residual stream read twice per layer)."""
    if isinstance(node, Scope):
        return _BriefPrinter({}).scope(node)
    if isinstance(node, ValueExpr):
        return _BriefPrinter({}).value(node)[0]
    return format_node(node)


def _decl(t: Tensor) -> str:
    dtype = "" if t.dtype == "float32" else t.dtype
    return f"{t.name}: {dtype}[{', '.join(map(str, t.shape))}]"


def _iterdecl(it: Iter) -> str:
    return f"{it.name}:{it.hi}" if it.lo == 0 else f"{it.name}={it.lo}:{it.hi}"


def _paren(text: str) -> str:
    return f"({text})"


class _Printer:
    """Prints with precedence; ``names`` maps program-bound scopes to their names."""

    __slots__ = ("names",)

    def __init__(self, names: Mapping[Scope, str]) -> None:
        self.names = names

    def scope(self, s: Scope) -> str:
        head = ", ".join(_iterdecl(it) for it in s.traversal)
        if s.pad:
            head += " | pad " + ", ".join(f"{a}:{b}" for a, b in s.pad)
        text = f"L[{head}] "
        if s.summation:
            text += f"{REDUCTIONS[s.reduce]}[{', '.join(_iterdecl(it) for it in s.summation)}] "
        return text + self.value(s.body)[0]

    # -- values ----------------------------------------------------------

    def value(self, e: ValueExpr) -> tuple[str, int]:
        """``(text, precedence)``; left-nested chains are walked without recursion."""
        if isinstance(e, Binary) and e.op in _VALUE_PREC:
            prec = _VALUE_PREC[e.op]
            spine = []
            while isinstance(e, Binary) and _VALUE_PREC.get(e.op) == prec:
                spine.append(e)
                e = e.a
            text, p = self.value(e)
            if p < prec:
                text = _paren(text)
            for node in reversed(spine):
                right, p = self.value(node.b)
                if p <= prec:
                    right = _paren(right)
                text = f"{text} {node.op} {right}"
            return text, prec
        if isinstance(e, Access):
            return self.access(e), _ATOM
        if isinstance(e, Const):
            return repr(e.value), _ATOM
        if isinstance(e, Unary):
            arg, p = self.value(e.x)
            if e.fn == "neg":
                # -(1.0) is neg(Const(1.0)), while -1.0 is Const(-1.0).
                if p < _ATOM or isinstance(e.x, Const) or arg.startswith("-"):
                    arg = _paren(arg)
                return "-" + arg, _ATOM
            if e.param is not None:
                return f"{e.fn}({arg}, {e.param!r})", _ATOM
            return f"{e.fn}({arg})", _ATOM
        if isinstance(e, Binary):  # max, min
            return f"{e.op}({self.value(e.a)[0]}, {self.value(e.b)[0]})", _ATOM
        raise TypeError(f"not a value expression: {type(e).__name__}")

    def access(self, a: Access) -> str:
        src = a.source
        if isinstance(src, Tensor):
            head = src.name
        else:
            head = self.names.get(src) or "{" + self.scope(src) + "}"
        return f"{head}[{', '.join(self.index(ix)[0] for ix in a.indices)}]"

    # -- indices ---------------------------------------------------------

    def index(self, e: IndexExpr) -> tuple[str, int]:
        """``(text, precedence)``, compact: ``h+r-1``, ``2*x+y``, ``(x+1)//2``."""
        if isinstance(e, Iter):
            return e.name, _ATOM
        if isinstance(e, IConst):
            return str(e.value), _ATOM
        if _is_ineg(e):
            # -x is (-1)*x; -(3) keeps (-1)*3 apart from the constant -3.
            arg, p = self.index(e.b)
            if p < _ATOM or isinstance(e.b, IConst) or arg.startswith("-"):
                arg = _paren(arg)
            return "-" + arg, _ATOM
        if isinstance(e, (IAdd, ISub)):
            spine = []
            while isinstance(e, (IAdd, ISub)):
                spine.append(e)
                e = e.a
            text = self.index(e)[0]
            for node in reversed(spine):
                right, p = self.index(node.b)
                if p <= _ADD or right.startswith("-"):
                    right = _paren(right)
                text += ("+" if isinstance(node, IAdd) else "-") + right
            return text, _ADD
        if isinstance(e, (IMul, IFloorDiv, IMod)):
            spine = []
            while isinstance(e, (IMul, IFloorDiv, IMod)) and not _is_ineg(e):
                spine.append(e)
                e = e.a
            text, p = self.index(e)
            if p < _MUL:
                text = _paren(text)
            for node in reversed(spine):
                if isinstance(node, IMul):
                    right, p = self.index(node.b)
                    if p <= _MUL or right.startswith("-"):
                        right = _paren(right)
                    text += "*" + right
                else:
                    text += ("//" if isinstance(node, IFloorDiv) else "%") + str(node.k)
            return text, _MUL
        raise TypeError(f"not an index expression: {type(e).__name__}")


def _is_ineg(e: IndexExpr) -> bool:
    return isinstance(e, IMul) and e.a is IConst(-1)


# Nodes print in this syntax (the IR does not import its syntax; see ``ir.set_formatter``).
set_formatter(format_node)


class _BriefPrinter(_Printer):
    """A printer that writes nested scopes as ``{..}`` (see :func:`brief`)."""

    __slots__ = ()

    def access(self, a: Access) -> str:
        src = a.source
        head = src.name if isinstance(src, Tensor) else self.names.get(src) or "{..}"
        return f"{head}[{', '.join(self.index(ix)[0] for ix in a.indices)}]"
