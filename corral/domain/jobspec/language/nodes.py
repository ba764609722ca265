"""The syntax tree of HCL's native syntax (HashiCorp's hclsyntax): a body of
attributes and blocks, and the expressions and templates inside them.

Every node keeps the offsets of its source text (`start`, `end`) so an error
can name its line and a variable Nomad leaves for the client can be passed on
as the text the user wrote."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class Node:
    start: int
    end: int


# --------------------------------------------------------------- expressions


@dataclass(eq=False)
class Literal(Node):
    value: object  # str, int, float, bool or None


@dataclass(eq=False)
class TemplateLiteral(Node):
    text: str


@dataclass(eq=False)
class TemplateInterp(Node):
    expr: Expr


@dataclass(eq=False)
class TemplateIf(Node):
    cond: Expr
    then: list[TemplatePart]
    otherwise: list[TemplatePart]


@dataclass(eq=False)
class TemplateFor(Node):
    key_var: str | None
    value_var: str
    collection: Expr
    body: list[TemplatePart]


TemplatePart = TemplateLiteral | TemplateInterp | TemplateIf | TemplateFor


@dataclass(eq=False)
class Template(Node):
    """A quoted string or heredoc. A template that is exactly one
    interpolation yields the interpolated value itself (not a string)."""

    parts: list[TemplatePart]


@dataclass(eq=False)
class Traversal(Node):
    """`root.attr[0]["key"]`: a variable and the static steps after it
    (str = attribute, int/str in `keys` = index), as hclsyntax's
    ScopeTraversalExpr."""

    root: str
    steps: list[tuple[str, object]]  # ("attr", name) or ("index", literal key)


@dataclass(eq=False)
class GetAttr(Node):
    source: Expr
    name: str


@dataclass(eq=False)
class Index(Node):
    source: Expr
    key: Expr


@dataclass(eq=False)
class SplatItem(Node):
    """The element a splat's traversal is applied to."""


@dataclass(eq=False)
class Splat(Node):
    source: Expr
    each: Expr  # built over SplatItem
    item: SplatItem


@dataclass(eq=False)
class Call(Node):
    name: str
    args: list[Expr]
    expand_final: bool  # f(list...)


@dataclass(eq=False)
class TupleCons(Node):
    items: list[Expr]


@dataclass(eq=False)
class ObjectCons(Node):
    items: list[tuple[Expr, Expr]]


@dataclass(eq=False)
class ObjectKey(Node):
    """A bare identifier as an object key is the key's name, not a variable."""

    name: str


@dataclass(eq=False)
class ForExpr(Node):
    key_var: str | None
    value_var: str
    collection: Expr
    key: Expr | None  # None: a tuple ([for ...]); else an object ({for ... => ...})
    value: Expr
    cond: Expr | None
    group: bool  # `...` after the value: group values by key


@dataclass(eq=False)
class Unary(Node):
    op: str
    operand: Expr


@dataclass(eq=False)
class Binary(Node):
    op: str
    left: Expr
    right: Expr


@dataclass(eq=False)
class Conditional(Node):
    cond: Expr
    then: Expr
    otherwise: Expr


@dataclass(eq=False)
class Parens(Node):
    expr: Expr


Expr = (
    Literal
    | Template
    | Traversal
    | GetAttr
    | Index
    | SplatItem
    | Splat
    | Call
    | TupleCons
    | ObjectCons
    | ObjectKey
    | ForExpr
    | Unary
    | Binary
    | Conditional
    | Parens
)


# --------------------------------------------------------------- structure


@dataclass(eq=False)
class Attribute(Node):
    name: str
    expr: Expr


@dataclass(eq=False)
class Block(Node):
    type: str
    labels: list[str]
    body: Body


@dataclass(eq=False)
class Body(Node):
    attributes: list[Attribute] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    # attributes and blocks in source order
    items: list[Attribute | Block] = field(default_factory=list)
