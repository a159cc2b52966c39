"""A Triton kernel's source as coverage reads it: its file, name, lines, the statements that can run,
and the conditions a line sits under (what a run must reach to execute it)."""

from __future__ import annotations

import ast
import functools
import inspect
import os
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelSource:
    name: str
    file: str
    first_line: int  # the ``def`` line's number in the file
    lines: tuple[str, ...]  # the function's source, decorators excluded, first_line onwards
    statements: frozenset[int]  # file line numbers of the statements that can run (docstring excluded)
    module: str = ""  # the module that defines it (mutation testing imports a mutant under this name)

    @functools.cached_property  # a relative path per call is what a probe must not cost
    def key(self) -> str:
        return f"{display_path(self.file)}:{self.name}:{self.first_line}"


def display_path(file: str) -> str:
    """A kernel file relative to the working directory when it lies under it, else as it is."""
    try:
        relative = os.path.relpath(file)
    except ValueError:  # another drive
        return file
    return file if relative.startswith("..") else relative


def python_function(kernel) -> object | None:
    """The plain function under a Triton kernel object (JITFunction, the interpreter's function, an
    autotuner or heuristics wrapping either), or None for anything else."""
    seen = 0
    while kernel is not None and seen < 8:
        if inspect.isfunction(kernel):
            return kernel
        kernel = getattr(kernel, "fn", None)
        seen += 1
    return None


@functools.lru_cache(maxsize=None)
def _read(fn) -> KernelSource | None:
    try:
        lines, start = inspect.getsourcelines(fn)
        file = inspect.getsourcefile(fn)
    except (OSError, TypeError):  # no source: a function made at run time
        return None
    offset = next((i for i, line in enumerate(lines) if line.lstrip().startswith("def ")), 0)
    body = lines[offset:]
    first = start + offset
    tree = ast.parse(textwrap.dedent("".join(body)))
    ast.increment_lineno(tree, first - 1)
    function = tree.body[0]
    statements = {node.lineno for node in ast.walk(function)
                  if isinstance(node, ast.stmt) and node is not function and not _is_docstring(function, node)}
    return KernelSource(fn.__name__, file, first, tuple(line.rstrip("\n") for line in body), frozenset(statements),
                        getattr(fn, "__module__", "") or "")


def _is_docstring(function: ast.FunctionDef, node: ast.stmt) -> bool:
    return (node is function.body[0] and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def kernel_source(kernel) -> KernelSource | None:
    """The source of a Triton kernel object or of its plain function, or None without one."""
    fn = python_function(kernel)
    return _read(fn) if fn is not None else None


def constexpr_names(fn) -> list[str]:
    """The parameters annotated ``tl.constexpr``, in signature order (as Triton finds them)."""
    names = []
    for name, parameter in inspect.signature(fn).parameters.items():
        annotation = parameter.annotation
        text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
        if "constexpr" in str(text):
            names.append(name)
    return names


@functools.lru_cache(maxsize=64)
def _parsed(file: str) -> tuple[ast.Module, list[str]] | None:
    """A kernel file's tree and lines, read once; None where it cannot be read (moved, not Python)."""
    try:
        with open(file, encoding="utf-8") as f:
            text = f.read()
        return ast.parse(text), text.splitlines()
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _function_at(file: str, first_line: int) -> ast.FunctionDef | None:
    parsed = _parsed(file)
    if parsed is None:
        return None
    return next((n for n in ast.walk(parsed[0]) if isinstance(n, ast.FunctionDef) and n.lineno == first_line), None)


def function_lines(file: str, first_line: int) -> list[str]:
    """The lines of the function defined at ``first_line`` of ``file`` (its ``def`` to its last line),
    as the file holds them now; [] where the file or the function is not there."""
    function = _function_at(file, first_line)
    return _parsed(file)[1][first_line - 1:function.end_lineno] if function is not None else []


def _negated(test: ast.expr) -> str:
    text = ast.unparse(test)
    return f"not {text}" if isinstance(test, (ast.Name, ast.Attribute, ast.Call)) else f"not ({text})"


@functools.lru_cache(maxsize=256)
def branch_conditions(file: str, first_line: int) -> tuple[tuple[int, int, str], ...]:
    """(first line, last line, condition) of each branch body of the function defined at
    ``first_line`` of ``file``: an ``if``'s body needs its test, its ``else`` (or ``elif``) the test
    false, a ``while``'s body its test; what a run must make true to reach the lines inside."""
    function = _function_at(file, first_line)
    if function is None:
        return ()
    found = []
    for node in ast.walk(function):
        if isinstance(node, (ast.If, ast.While)):
            found.append((node.body[0].lineno, node.body[-1].end_lineno, ast.unparse(node.test)))
        if isinstance(node, ast.If) and node.orelse:
            found.append((node.orelse[0].lineno, node.orelse[-1].end_lineno, _negated(node.test)))
    return tuple(sorted(found, key=lambda span: (span[0], -span[1])))  # outermost first


def conditions_over(file: str, first_line: int, line: int) -> list[str]:
    """The conditions of the branches enclosing ``line`` of the function at ``first_line``, outermost first."""
    return [test for first, last, test in branch_conditions(file, first_line) if first <= line <= last]
