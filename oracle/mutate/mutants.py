"""Mutants of the kernels an implementation launched: where each operator applies in each kernel
function (and in the host code of the kernels' files), as a text edit of the file that leaves every
other character as it was, so that a mutant's diff is one line and the other lines keep their numbers."""

from __future__ import annotations

import ast
import copy
import difflib
import functools
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from oracle.kernel_coverage.source import display_path
from oracle.mutate.operators import OPERATORS, KernelContext


@dataclass(frozen=True)
class Mutant:
    number: int
    operator: str
    file: str
    module: str
    function: str
    function_line: int  # its ``def`` line: with the file, kernel coverage's key of the function
    line: int  # where the edit starts
    statement: int  # the line of the statement it is in: kernel coverage's unit (Note [Probes, not a tracer])
    jit: bool  # in a kernel (coverage says which cases reach it); False: host code, reached by every launch
    start: tuple[int, int]  # (line, column in characters) of the edit, end exclusive
    end: tuple[int, int]
    original: str
    replacement: str

    def source(self) -> str:
        """The whole file with this mutant's edit."""
        return _edited(Path(self.file).read_text(encoding="utf-8"), self.start, self.end, self.replacement)

    def diff(self) -> str:
        before = Path(self.file).read_text(encoding="utf-8").splitlines(keepends=True)
        after = self.source().splitlines(keepends=True)
        lines = difflib.unified_diff(before, after, f"a/{self.file}", f"b/{self.file}", n=0)
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines)

    @property
    def kernel_key(self) -> str:
        """Kernel coverage's key of the function it is in (KernelSource.key)."""
        return f"{display_path(self.file)}:{self.function}:{self.function_line}"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Mutant:
        return cls(**{**data, "start": tuple(data["start"]), "end": tuple(data["end"])})


def _offset(lines: list[str], line: int, column_bytes: int) -> int:
    """Character offset in the text of (1-based line, UTF-8 byte column), as ast gives positions."""
    before = sum(len(text) for text in lines[:line - 1])
    return before + len(lines[line - 1].encode("utf-8")[:column_bytes].decode("utf-8", errors="ignore"))


def _source_lines(text: str) -> list[str]:
    """The text's lines with their ends, split where Python's parser splits them (\\r\\n, \\n, \\r)."""
    lines, start = [], 0
    for end in re.finditer(r"\r\n|\n|\r", text):
        lines.append(text[start:end.end()])
        start = end.end()
    if start < len(text):
        lines.append(text[start:])
    return lines


def _segment(lines: list[str], node: ast.AST) -> str | None:
    """``ast.get_source_segment(text, node)`` given the text's ``_source_lines``, split once rather
    than for every node (ast splits the whole file on each call). Columns are UTF-8 byte offsets."""
    if getattr(node, "end_lineno", None) is None or getattr(node, "end_col_offset", None) is None:
        return None
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset:node.end_col_offset].decode()
    head = lines[first].encode()[node.col_offset:].decode()
    tail = lines[last].encode()[:node.end_col_offset].decode()
    return "".join([head, *lines[first + 1:last], tail])


def _parsed(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def _edited(text: str, start: tuple[int, int], end: tuple[int, int], replacement: str) -> str:
    lines = text.splitlines(keepends=True)
    a, b = _offset(lines, *start), _offset(lines, *end)
    return text[:a] + replacement + text[b:]


def _is_jit(function: ast.FunctionDef, known: frozenset[str]) -> bool:
    """A @triton.jit function: decorated so, or one the run launched as a kernel (``known``: a
    library may wrap its functions with ``triton.jit`` after defining them)."""
    return function.name in known or any("jit" in ast.unparse(d) for d in function.decorator_list)


def _statement_of(node: ast.AST, parents: dict) -> ast.stmt:
    while not isinstance(node, ast.stmt):
        node = parents[node]
    return node


def _sites(function: ast.FunctionDef, jit: bool):
    """(operator, node, replacement) for every place an operator applies in one function's body."""
    context = KernelContext.of(function, jit)
    skipped = {id(n) for part in (function.args, *function.decorator_list) for n in ast.walk(part)}
    if function.returns is not None:
        skipped |= {id(n) for n in ast.walk(function.returns)}
    for node in ast.walk(function):
        if node is function or id(node) in skipped:
            continue
        for operator in OPERATORS:
            if not jit and not operator.host:
                continue
            for replacement in operator.apply(node, context):
                yield operator, node, context, replacement


@functools.lru_cache(maxsize=64)
def jit_callers(file: str, known: frozenset[str] = frozenset()) -> dict[str, frozenset[str]]:
    """@triton.jit function -> the @triton.jit functions of the file that call it, at any depth: on a
    GPU a helper is compiled into its callers, and only their launches are seen."""
    tree = ast.parse(Path(file).read_text(encoding="utf-8"))
    jitted = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and _is_jit(n, known)}
    calls = {name: {c.func.id for c in ast.walk(f) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                    and c.func.id in jitted} for name, f in jitted.items()}
    callers = {}
    for name in jitted:
        found, todo = set(), [name]
        while todo:
            callee = todo.pop()
            for caller, called in calls.items():
                if callee in called and caller not in found:
                    found.add(caller)
                    todo.append(caller)
        callers[name] = frozenset(found)
    return callers


def launch_sites(file: str, kernel: str, known: frozenset[str] = frozenset()) -> list[tuple[str, int, int]]:
    """(host function, its def line, the line) of each place in ``file`` that names ``kernel`` outside
    a kernel: a launch (``kernel[grid](...)``, ``launch(kernel, ...)``) or a choice between kernels."""
    tree = ast.parse(Path(file).read_text(encoding="utf-8"))
    sites = []
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and not _is_jit(n, known)):
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and node.id == kernel and isinstance(node.ctx, ast.Load):
                sites.append((function.name, function.lineno, node.lineno))
    return sites


def mutants_of(file: str, module: str, kernels: set[str] | None = None, first: int = 0,
               known: frozenset[str] = frozenset()) -> list[Mutant]:
    """Every mutant of one file's @triton.jit functions (only those named in ``kernels``, when
    given) and of its host code (the operators marked ``host``), numbered from ``first``."""
    text = Path(file).read_text(encoding="utf-8")
    tree, lines = ast.parse(text), _source_lines(text)
    found: list[Mutant] = []
    seen: set[tuple] = set()
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        jit = _is_jit(function, known)
        if jit and kernels is not None and function.name not in kernels:
            continue
        parents = {child: node for node in ast.walk(function) for child in ast.iter_child_nodes(node)}
        for operator, node, _, replacement in _sites(function, jit):
            original = _segment(lines, node)
            new = replacement if isinstance(replacement, str) else ast.unparse(replacement)
            start, end = (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)
            key = (start, end, new)
            if original is None or new == original or new == ast.unparse(node) or key in seen:
                continue
            seen.add(key)
            statement = _statement_of(node, parents)
            mutant = Mutant(first + len(found), operator.name, file, module, function.name, function.lineno, node.lineno,
                            statement.lineno, jit, start, end, original, new)
            edited = _parsed(_edited(text, start, end, new))  # once a mutant: parsing the file is most of the time
            if not isinstance(replacement, str) and not _reads_as_meant(edited, statement, node, replacement):
                mutant = replace(mutant, replacement=f"({new})")  # `(a * b).to(t).to(c)` less its first .to
                edited = _parsed(_edited(text, start, end, mutant.replacement))
            if edited is None:  # a syntax error
                continue
            found.append(mutant)
    return found


def _reads_as_meant(edited: ast.Module | None, statement: ast.stmt, node: ast.AST, replacement: ast.AST) -> bool:
    """Whether the mutant's text (``edited``, parsed) parses as its statement with ``node`` replaced:
    an expression put where its neighbours bind tighter (``.to(c)`` after ``a * b``) needs parentheses."""
    if edited is None:
        return True  # a syntax error: refused by the caller
    meant = copy.deepcopy(statement)
    position = next(i for i, n in enumerate(ast.walk(statement)) if n is node)
    target = list(ast.walk(meant))[position]
    for parent in ast.walk(meant):
        for field, value in ast.iter_fields(parent):
            if value is target:
                setattr(parent, field, replacement)
            elif isinstance(value, list):
                value[:] = [replacement if item is target else item for item in value]
    now = next((n for n in ast.walk(edited) if isinstance(n, ast.stmt) and n.lineno == statement.lineno
                and type(n) is type(statement)), None)
    return now is not None and ast.dump(now) == ast.dump(meant)


def mutants_of_kernels(kernels: list[dict]) -> list[Mutant]:
    """The mutants of every file holding a kernel that kernel coverage recorded
    (``Recorder.to_json()`` records): all its @triton.jit functions, launched or not (a kernel the
    cases never launch is a coverage gap too), and its host code; file by file, numbered in order."""
    files = sorted({(record["file"], record["module"]) for record in kernels})
    mutants: list[Mutant] = []
    for file, module in files:
        mutants += mutants_of(file, module, first=len(mutants), known=launched_in(kernels, file))
    return mutants


def launched_in(kernels: list[dict], file: str) -> frozenset[str]:
    """The functions of ``file`` that kernel coverage saw launched as kernels."""
    return frozenset(r["name"] for r in kernels if r["file"] == file and r["launched"])
