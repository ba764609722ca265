"""The parse tree of a template, with Go's node names and `String()` forms
(an execution error quotes the node it failed at: `at <.Foo.Bar>`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Node:
    pos: int
    tree: Tree | None = field(default=None, repr=False, kw_only=True)


@dataclass(eq=False)
class TextNode(Node):
    text: str = ""

    def __str__(self) -> str:
        from corral.domain.template.gofmt import quote

        return quote(self.text)


@dataclass(eq=False)
class CommentNode(Node):
    text: str = ""

    def __str__(self) -> str:
        return "{{" + self.text + "}}"


@dataclass(eq=False)
class ListNode(Node):
    nodes: list[Node] = field(default_factory=list)

    def __str__(self) -> str:
        return "".join(str(n) for n in self.nodes)


@dataclass(eq=False)
class DotNode(Node):
    def __str__(self) -> str:
        return "."


@dataclass(eq=False)
class NilNode(Node):
    def __str__(self) -> str:
        return "nil"


@dataclass(eq=False)
class BoolNode(Node):
    value: bool = False

    def __str__(self) -> str:
        return "true" if self.value else "false"


@dataclass(eq=False)
class NumberNode(Node):
    text: str = ""
    is_int: bool = False
    is_uint: bool = False
    is_float: bool = False
    is_complex: bool = False
    int_value: int = 0
    float_value: float = 0.0
    complex_value: complex = 0j

    def __str__(self) -> str:
        return self.text


@dataclass(eq=False)
class StringNode(Node):
    quoted: str = ""
    text: str = ""

    def __str__(self) -> str:
        return self.quoted


@dataclass(eq=False)
class IdentifierNode(Node):
    ident: str = ""

    def __str__(self) -> str:
        return self.ident


@dataclass(eq=False)
class FieldNode(Node):
    ident: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "".join("." + i for i in self.ident)


@dataclass(eq=False)
class VariableNode(Node):
    ident: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return ".".join(self.ident)


@dataclass(eq=False)
class ChainNode(Node):
    node: Node | None = None
    fields: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        inner = str(self.node)
        if isinstance(self.node, PipeNode):
            inner = "(" + inner + ")"
        return inner + "".join("." + f for f in self.fields)


@dataclass(eq=False)
class CommandNode(Node):
    args: list[Node] = field(default_factory=list)

    def __str__(self) -> str:
        parts = []
        for a in self.args:
            parts.append("(" + str(a) + ")" if isinstance(a, PipeNode) else str(a))
        return " ".join(parts)


@dataclass(eq=False)
class PipeNode(Node):
    line: int = 0
    is_assign: bool = False
    decl: list[VariableNode] = field(default_factory=list)
    cmds: list[CommandNode] = field(default_factory=list)

    def __str__(self) -> str:
        out = ""
        if self.decl:
            out = ", ".join(str(v) for v in self.decl)
            out += " = " if self.is_assign else " := "
        return out + " | ".join(str(c) for c in self.cmds)


@dataclass(eq=False)
class ActionNode(Node):
    line: int = 0
    pipe: PipeNode | None = None

    def __str__(self) -> str:
        return "{{" + str(self.pipe) + "}}"


@dataclass(eq=False)
class BranchNode(Node):
    line: int = 0
    pipe: PipeNode | None = None
    list: ListNode | None = None
    else_list: ListNode | None = None
    keyword: str = ""

    def __str__(self) -> str:
        out = "{{" + self.keyword + " " + str(self.pipe) + "}}" + str(self.list)
        if self.else_list is not None:
            out += "{{else}}" + str(self.else_list)
        return out + "{{end}}"


class IfNode(BranchNode):
    pass


class RangeNode(BranchNode):
    pass


class WithNode(BranchNode):
    pass


@dataclass(eq=False)
class BreakNode(Node):
    line: int = 0

    def __str__(self) -> str:
        return "{{break}}"


@dataclass(eq=False)
class ContinueNode(Node):
    line: int = 0

    def __str__(self) -> str:
        return "{{continue}}"


@dataclass(eq=False)
class TemplateNode(Node):
    line: int = 0
    name: str = ""
    pipe: PipeNode | None = None

    def __str__(self) -> str:
        from corral.domain.template.gofmt import quote

        if self.pipe is None:
            return "{{template " + quote(self.name) + "}}"
        return "{{template " + quote(self.name) + " " + str(self.pipe) + "}}"


# Markers the parser uses for {{end}} and {{else}}; never in a finished tree.
@dataclass(eq=False)
class EndNode(Node):
    def __str__(self) -> str:
        return "{{end}}"


@dataclass(eq=False)
class ElseNode(Node):
    line: int = 0

    def __str__(self) -> str:
        return "{{else}}"


@dataclass(eq=False)
class Tree:
    """One named template: its root list, the name of the text it was
    parsed from (for error locations) and that text."""

    name: str
    parse_name: str
    text: str
    root: ListNode | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def error_context(self, node: Node) -> tuple[str, str]:
        """Go's ErrorContext: "name:line:col" (col in bytes from 0) and the
        node's text cut to 20 bytes."""
        tree = node.tree or self
        text = tree.text[: node.pos]
        nl = text.rfind("\n")
        col = len(text[nl + 1 :].encode()) if nl >= 0 else len(text.encode())
        line = 1 + text.count("\n")
        context = str(node)
        if len(context.encode()) > 20:
            context = context.encode()[:20].decode("utf-8", "ignore") + "..."
        return f"{tree.parse_name}:{line}:{col}", context


def is_empty_tree(node: Node | None) -> bool:
    if node is None:
        return True
    if isinstance(node, ListNode):
        return all(is_empty_tree(n) for n in node.nodes)
    if isinstance(node, TextNode):
        return node.text.strip() == ""
    return isinstance(node, CommentNode)
