"""A job file, evaluated: Nomad's jobspec2 `decode` (types.config.go).

The file's top level holds `variable`/`variables`, `locals` and one `job`
block. Variables get their values, locals are evaluated, then the job block
is expanded (`dynamic` blocks) and every argument in it evaluated with
`var.*`, `local.*` and Nomad's functions in scope. The result is plain data
in the shape the jobspec readers walk: a block list is a list of dicts
marked with BLOCK (a labeled block nests as `{label: {...}}`), an argument
is its value; `lines` holds the line of every block and argument by path
(a block is (type, ordinal), an argument its name)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corral.domain.jobspec.language import functions
from corral.domain.jobspec.language import nodes as n
from corral.domain.jobspec.language.errors import HclError, Source
from corral.domain.jobspec.language.evaluate import Evaluator, Scope
from corral.domain.jobspec.language.parser import parse_config
from corral.domain.jobspec.language.variables import (
    Declarations,
    VarInputs,
    evaluate_locals,
)

BLOCK = "__is_block__"
Path = tuple[Any, ...]

#: the blocks a job file's top level may hold
TOP_LEVEL = ("variable", "variables", "locals", "job")


@dataclass
class Decoded:
    """One job file after evaluation."""

    #: the top level as data: {"job": [{label: {...}}], ...}
    data: dict[str, Any]
    lines: dict[Path, int]
    #: declared variables → their final values (for the job submission)
    variables: dict[str, Any] = field(default_factory=dict)
    #: declared variables' types: True where the type is a string, number,
    #: bool or undeclared (Nomad's VariableFlags), False for structured types
    simple: dict[str, bool] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def decode(
    text: str,
    filename: str,
    inputs: VarInputs | None = None,
    *,
    basedir: str = ".",
    allow_fs: bool = True,
) -> Decoded:
    """Parse and evaluate a job file; raises HclError."""
    inputs = inputs or VarInputs()
    src = Source(text, filename)
    body = parse_config(text, filename)
    ev = Evaluator(src)
    funcs = functions.library(basedir, allow_fs)
    empty = Scope({}, funcs, passthrough=False, lazy=functions.LAZY)
    decls = Declarations(src, ev, empty)
    local_blocks: list[n.Block] = []
    for attr in body.attributes:
        raise src.error(
            attr.start,
            f"{attr.name}: unexpected argument at the top level (expected variable, locals "
            f"and job blocks)",
        )
    for block in body.blocks:
        if block.type == "variable":
            decls.declare_block(block)
        elif block.type == "variables":
            decls.declare_short(block)
        elif block.type == "locals":
            local_blocks.append(block)
        elif block.type != "job":
            raise src.error(
                block.start,
                f"{block.type}: unexpected block at the top level (expected variable, "
                f"locals and job blocks)",
            )
    decls.assign(inputs)
    var_values = decls.values()
    scope = Scope({"var": var_values}, funcs, passthrough=True, lazy=functions.LAZY)
    evaluate_locals(local_blocks, ev, scope, src)

    lines: dict[Path, int] = {}
    writer = _Writer(src, ev, lines)
    data: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for block in body.blocks:
        if block.type != "job":
            continue
        ordinal = counts.get("job", 0)
        counts["job"] = ordinal + 1
        path: Path = (("job", ordinal),)
        lines[path] = src.line(block.start)
        display = _display("job", block.labels, "")
        data.setdefault("job", []).append(
            _labeled(block.labels, writer.body(block.body, scope, path, display))
        )
    simple = {name: v.type is None or v.type.primitive for name, v in decls.vars.items()}
    return Decoded(data, lines, var_values, simple, decls.warnings)


def _display(btype: str, labels: list[str], parent: str) -> str:
    here = " ".join([btype, *(f'"{label}"' for label in labels)])
    return f"{parent} > {here}" if parent else here


def _labeled(labels: list[str], inner: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = inner
    for label in reversed(labels):
        out = {label: out}
    return out


class _Writer:
    """Evaluates a body into data, expanding dynamic blocks."""

    def __init__(self, src: Source, ev: Evaluator, lines: dict[Path, int]) -> None:
        self.src = src
        self.ev = ev
        self.lines = lines

    def body(self, body: n.Body, scope: Scope, path: Path, display: str) -> dict[str, Any]:
        out: dict[str, Any] = {BLOCK: True}
        counts: dict[str, int] = {}
        for item in body.items:
            if isinstance(item, n.Attribute):
                if item.name in out:
                    raise self.src.error(
                        item.start, f"{item.name}: given both as an argument and as a block"
                    )
                try:
                    out[item.name] = self.ev.eval(item.expr, scope)
                except HclError as exc:
                    exc.field = exc.field or f"{display} > {item.name}"
                    raise
                self.lines[(*path, item.name)] = self.src.line(item.start)
                continue
            try:
                expanded = self.expand(item, scope)
            except HclError as exc:
                exc.field = exc.field or _display(item.type, item.labels, display)
                raise
            for btype, labels, inner_body, inner_scope, start in expanded:
                existing = out.get(btype)
                if existing is not None and not (isinstance(existing, list) and counts.get(btype)):
                    raise self.src.error(
                        start, f"{btype}: given both as an argument and as a block"
                    )
                ordinal = counts.get(btype, 0)
                counts[btype] = ordinal + 1
                here = (*path, (btype, ordinal))
                self.lines[here] = self.src.line(start)
                inner = self.body(inner_body, inner_scope, here, _display(btype, labels, display))
                out.setdefault(btype, []).append(_labeled(labels, inner))
        return out

    def expand(
        self, block: n.Block, scope: Scope
    ) -> list[tuple[str, list[str], n.Body, Scope, int]]:
        """A block as itself, or a `dynamic` block as the blocks it generates."""
        if block.type != "dynamic":
            return [(block.type, block.labels, block.body, scope, block.start)]
        if len(block.labels) != 1:
            raise self.src.error(
                block.start,
                "a dynamic block takes one label, the type of block to generate: "
                'dynamic "port" { ... }',
            )
        btype = block.labels[0]
        where = f'dynamic "{btype}"'
        attrs = {a.name: a for a in block.body.attributes}
        for a in block.body.attributes:
            if a.name not in ("for_each", "iterator", "labels"):
                raise self.src.error(
                    a.start,
                    f"{where} > {a.name}: unknown argument (for_each, iterator, labels and "
                    f"a content block)",
                )
        contents = [b for b in block.body.blocks if b.type == "content"]
        for b in block.body.blocks:
            if b.type != "content":
                raise self.src.error(
                    b.start, f"{where} > {b.type}: unknown block (only one content block)"
                )
        if len(contents) != 1:
            raise self.src.error(block.start, f"{where}: needs exactly one content block")
        if contents[0].labels:
            raise self.src.error(contents[0].start, f"{where} > content: takes no label")
        if "for_each" not in attrs:
            raise self.src.error(block.start, f"{where}: for_each is required")
        iterator = btype
        if "iterator" in attrs:
            it = attrs["iterator"].expr
            if not (isinstance(it, n.Traversal) and not it.steps):
                raise self.src.error(it.start, f"{where} > iterator: must be a bare name")
            iterator = it.root
        coll = self.ev.eval(attrs["for_each"].expr, scope)
        if coll is None:
            raise self.src.error(attrs["for_each"].start, f"{where} > for_each: must not be null")
        out: list[tuple[str, list[str], n.Body, Scope, int]] = []
        for key, value in self.ev.iterate(attrs["for_each"].expr, coll):
            inner = scope.child({iterator: {"key": key, "value": value}})
            labels: list[str] = []
            if "labels" in attrs:
                raw = self.ev.eval(attrs["labels"].expr, inner)
                if not isinstance(raw, list):
                    raise self.src.error(
                        attrs["labels"].start, f"{where} > labels: must be a list of strings"
                    )
                for label in raw:
                    if label is None or isinstance(label, list | dict):
                        raise self.src.error(
                            attrs["labels"].start, f"{where} > labels: must be a list of strings"
                        )
                    labels.append(self.ev.key_string(attrs["labels"].expr, label))
            # a nested dynamic block expands inside the content, in this scope
            out.append((btype, labels, contents[0].body, inner, block.start))
        return out
