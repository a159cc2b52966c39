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

    @property
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


@functools.lru_cache(maxsize=256)
def branch_conditions(file: str, first_line: int) -> tuple[tuple[int, int, str], ...]:
    """(first line, last line, test) of each ``if`` and ``while`` in the function defined at
    ``first_line`` of ``file``: what a run must make true (or false) to reach the lines inside."""
    try:
        with open(file, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        return ()
    function = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.lineno == first_line), None)
    if function is None:
        return ()
    found = [(node.lineno, node.end_lineno, ast.unparse(node.test))
             for node in ast.walk(function) if isinstance(node, (ast.If, ast.While))]
    return tuple(sorted(found))


def conditions_over(file: str, first_line: int, line: int) -> list[str]:
    """The tests of the branches enclosing ``line`` of the function at ``first_line``, outermost first."""
    return [test for first, last, test in branch_conditions(file, first_line) if first < line <= last]
