"""The mutation operators: each one a bug class a Triton kernel really has, applied to the syntax tree
of a kernel function (and, for the grid's block count, to the host code that launches it).

An operator looks at one node and returns the nodes (or source text) that could replace it; each is
one mutant. Operators see a ``KernelContext``: the function, its parameters, which of them are
constexprs and strides, and the storage dtype of the first tensor it loads (what a narrowed sum is
narrowed to).
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class KernelContext:
    function: ast.FunctionDef
    jit: bool  # a @triton.jit function; False: host code, where only the block count is mutated
    parameters: list[str] = field(default_factory=list)
    constexprs: set[str] = field(default_factory=set)
    strides: list[str] = field(default_factory=list)
    storage: str | None = None  # e.g. "X.dtype.element_ty": the first loaded pointer's element type
    parents: dict = field(default_factory=dict)

    @classmethod
    def of(cls, function: ast.FunctionDef, jit: bool) -> KernelContext:
        arguments = function.args.args + function.args.kwonlyargs
        parameters = [a.arg for a in arguments]
        constexprs = {a.arg for a in arguments if a.annotation is not None and "constexpr" in ast.unparse(a.annotation)}
        parents = {child: node for node in ast.walk(function) for child in ast.iter_child_nodes(node)}
        context = cls(function, jit, parameters, constexprs, [p for p in parameters if "stride" in p.lower()],
                      None, parents)
        context.storage = _storage_of_first_load(function, parameters)
        return context

    def inside_memory_access(self, node: ast.AST) -> bool:
        """Whether the node is address arithmetic: part of a load's or store's address or mask, of a
        comparison (a mask), or of ``tl.arange``/``tl.program_id``, which the address operators
        mutate, not the arithmetic ones. A stored value is arithmetic."""
        child, parent = node, self.parents.get(node)
        while parent is not None:
            if isinstance(parent, ast.Compare):
                return True
            kind = _tl_call(parent)
            if kind in MEMORY:
                return bool(parent.args) and child is parent.args[0] or \
                    any(k.value is child for k in parent.keywords if k.arg == "mask")
            if kind in ("arange", "program_id", "multiple_of", "max_contiguous"):
                return True
            child, parent = parent, self.parents.get(parent)
        return False


MEMORY = ("load", "store", "atomic_add", "atomic_max", "atomic_min", "atomic_xchg", "atomic_cas")


def _tl_call(node: ast.AST) -> str | None:
    """'load' for ``tl.load(...)`` (any module alias ending in ``tl`` or ``language``), else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
        if node.func.value.id in ("tl", "triton_language", "language"):
            return node.func.attr
    return None


def _leftmost_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.BinOp, ast.Attribute, ast.Subscript)):
        node = node.left if isinstance(node, ast.BinOp) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _storage_of_first_load(function: ast.FunctionDef, parameters: list[str]) -> str | None:
    loads = [n for n in ast.walk(function) if _tl_call(n) == "load" and n.args]
    for load in sorted(loads, key=lambda n: (n.lineno, n.col_offset)):
        name = _leftmost_name(load.args[0])
        if name in parameters:
            return f"{name}.dtype.element_ty"
    return None


def _keyword(call: ast.Call, name: str) -> ast.keyword | None:
    return next((k for k in call.keywords if k.arg == name), None)


def _with(call: ast.Call, **changes) -> ast.Call:
    new = copy.deepcopy(call)
    for name, value in changes.items():
        setattr(new, name, value)
    return new


def _parsed(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


# --- the operators ---------------------------------------------------------------------------------

def mask_dropped(node, ctx):
    if _tl_call(node) in ("load", "store") and _keyword(node, "mask") is not None:
        yield _with(node, keywords=[k for k in node.keywords if k.arg not in ("mask", "other")])


def mask_off_by_one(node, ctx):
    swaps = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in swaps:
        yield _with(node, ops=[swaps[type(node.ops[0])]()])


def other_changed(node, ctx):
    other = _keyword(node, "other") if _tl_call(node) == "load" else None
    if other is not None:
        value = 1.0 if isinstance(other.value, ast.Constant) and other.value.value == 0 else 0.0
        keywords = [k if k.arg != "other" else ast.keyword("other", ast.Constant(value)) for k in node.keywords]
        yield _with(node, keywords=keywords)


def last_block_skipped(node, ctx):
    if isinstance(node, ast.Call) and len(node.args) == 2 and ast.unparse(node.func) in ("tl.cdiv", "triton.cdiv", "cdiv"):
        yield ast.BinOp(copy.deepcopy(node.args[0]), ast.FloorDiv(), copy.deepcopy(node.args[1]))


def upcast_removed(node, ctx):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to" and len(node.args) == 1:
        target = node.args[0]
        if ast.unparse(target) in ("tl.float32", "tl.float64") or (isinstance(target, ast.Name) and target.id in ctx.constexprs):
            yield copy.deepcopy(node.func.value)


def sum_narrowed(node, ctx):
    if ctx.storage is None:
        return
    kind = _tl_call(node)
    if kind in ("sum", "cumsum", "dot") and node.args:
        count = 2 if kind == "dot" else 1
        narrowed = [_parsed(f"({ast.unparse(a)}).to({ctx.storage})") for a in node.args[:count]]
        yield _with(node, args=narrowed + node.args[count:])
    elif kind == "zeros" and _keyword(node, "dtype") is not None:
        keywords = [k if k.arg != "dtype" else ast.keyword("dtype", _parsed(ctx.storage)) for k in node.keywords]
        yield _with(node, keywords=keywords)


def stride_swapped(node, ctx):
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in ctx.strides and len(ctx.strides) > 1:
        other = ctx.strides[(ctx.strides.index(node.id) + 1) % len(ctx.strides)]
        yield ast.Name(other, ast.Load())


def offset_off_by_one(node, ctx):
    if _tl_call(node) in ("load", "store") and node.args:
        yield _with(node, args=[ast.BinOp(copy.deepcopy(node.args[0]), ast.Add(), ast.Constant(1))] + node.args[1:])


def store_dropped(node, ctx):
    if isinstance(node, ast.Expr) and _tl_call(node.value) == "store":
        yield "pass"


def sign_changed(node, ctx):
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)) and not ctx.inside_memory_access(node):
        yield _with(node, op=ast.Sub() if isinstance(node.op, ast.Add) else ast.Add())
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and not ctx.inside_memory_access(node):
        yield copy.deepcopy(node.operand)


def term_dropped(node, ctx):
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)) and not ctx.inside_memory_access(node):
        yield copy.deepcopy(node.left)


def _is_eps(node) -> bool:
    return isinstance(node, ast.Name) and "eps" in node.id.lower()


def eps_moved(node, ctx):
    """eps added outside the root it belongs under, and eps dropped."""
    if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in ("rsqrt", "sqrt", "sqrt_rn") and \
            len(node.args) == 1 and isinstance(node.args[0], ast.BinOp) and isinstance(node.args[0].op, ast.Add):
        summed = node.args[0]
        if _is_eps(summed.right) or _is_eps(summed.left):
            eps, rest = (summed.right, summed.left) if _is_eps(summed.right) else (summed.left, summed.right)
            yield ast.BinOp(_with(node, args=[copy.deepcopy(rest)]), ast.Add(), copy.deepcopy(eps))
    if _is_eps(node) and isinstance(node.ctx, ast.Load):
        yield ast.Constant(0.0)


def tail_missed(node, ctx):
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("range", "tl.range", "tl.static_range"):
        args = [copy.deepcopy(a) for a in node.args]
        if len(args) == 3:
            args[1] = ast.BinOp(ast.BinOp(args[1], ast.FloorDiv(), copy.deepcopy(args[2])), ast.Mult(), copy.deepcopy(args[2]))
        elif args:
            stop = 1 if len(args) == 2 else 0
            args[stop] = ast.BinOp(args[stop], ast.Sub(), ast.Constant(1))
        else:
            return
        yield _with(node, args=args)


def atomic_narrowed(node, ctx):
    if _tl_call(node) == "atomic_add" and len(node.args) >= 2:
        value = _parsed(f"({ast.unparse(node.args[1])}).to(tl.bfloat16).to(tl.float32)")
        yield _with(node, args=[copy.deepcopy(node.args[0]), value] + node.args[2:])


@dataclass(frozen=True)
class Operator:
    name: str
    bug: str  # the bug class, as a kernel author would name it
    apply: Callable[[ast.AST, KernelContext], Iterator]
    host: bool = False  # also applies to the host code that launches the kernel


OPERATORS = (
    Operator("mask_dropped", "a load's or store's mask dropped", mask_dropped),
    Operator("mask_off_by_one", "a bound compared with < where <= is meant, or the reverse", mask_off_by_one),
    Operator("other_changed", "a masked load's `other=` value changed", other_changed),
    Operator("last_block_skipped", "the last partial block skipped (cdiv -> //)", last_block_skipped, host=True),
    Operator("upcast_removed", "a `.to(float32)` upcast removed", upcast_removed),
    Operator("sum_narrowed", "an accumulator or a sum's operand narrowed to the storage dtype", sum_narrowed),
    Operator("stride_swapped", "one tensor's stride used for another's", stride_swapped),
    Operator("offset_off_by_one", "a load or store address off by one element", offset_off_by_one),
    Operator("store_dropped", "a store dropped", store_dropped),
    Operator("sign_changed", "a term's sign changed", sign_changed),
    Operator("term_dropped", "a term dropped from a sum", term_dropped),
    Operator("eps_moved", "eps moved out of the root, or dropped", eps_moved),
    Operator("tail_missed", "a loop that misses its last (partial) step", tail_missed),
    Operator("atomic_narrowed", "atomic_add partials rounded to 16 bits", atomic_narrowed),
)
BY_NAME = {op.name: op for op in OPERATORS}
