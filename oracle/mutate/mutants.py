"""Mutants of the kernels an implementation launched: where each operator applies in each kernel
function (and in the host code of the kernels' files), as a text edit of the file that leaves every
other character as it was, so that a mutant's diff is one line and the other lines keep their numbers."""

from __future__ import annotations

import ast
import difflib
from dataclasses import asdict, dataclass
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


def _edited(text: str, start: tuple[int, int], end: tuple[int, int], replacement: str) -> str:
    lines = text.splitlines(keepends=True)
    a, b = _offset(lines, *start), _offset(lines, *end)
    return text[:a] + replacement + text[b:]


def _is_jit(function: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in function.decorator_list)


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


def mutants_of(file: str, module: str, kernels: set[str], first: int = 0) -> list[Mutant]:
    """Every mutant of the named kernel functions of one file, and of the file's host code (the
    operators marked ``host``), numbered from ``first``."""
    text = Path(file).read_text(encoding="utf-8")
    tree = ast.parse(text)
    found: list[Mutant] = []
    seen: set[tuple] = set()
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        jit = _is_jit(function)
        if jit and function.name not in kernels:
            continue
        parents = {child: node for node in ast.walk(function) for child in ast.iter_child_nodes(node)}
        for operator, node, _, replacement in _sites(function, jit):
            original = ast.get_source_segment(text, node)
            new = replacement if isinstance(replacement, str) else ast.unparse(replacement)
            start, end = (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)
            key = (start, end, new)
            if original is None or new == original or new == ast.unparse(node) or key in seen:
                continue
            seen.add(key)
            mutant = Mutant(first + len(found), operator.name, file, module, function.name, function.lineno, node.lineno,
                            _statement_of(node, parents).lineno, jit, start, end, original, new)
            try:
                ast.parse(mutant.source())
            except SyntaxError:
                continue
            found.append(mutant)
    return found


def mutants_of_kernels(kernels: list[dict]) -> list[Mutant]:
    """The mutants of every kernel recorded by kernel coverage (``Recorder.to_json()`` records),
    file by file, numbered in order."""
    by_file: dict[tuple[str, str], set[str]] = {}
    for record in kernels:
        by_file.setdefault((record["file"], record["module"]), set()).add(record["name"])
    mutants: list[Mutant] = []
    for (file, module), names in sorted(by_file.items()):
        mutants += mutants_of(file, module, names, first=len(mutants))
    return mutants
