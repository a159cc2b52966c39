"""Comments and docstrings give reasons, not references: none in oracle/, kernels/, tests/ or peers/
cites a commit hash or an issue number in place of the reason (a number naming another project's bug
report, such as Liger-Kernel's #950 or Triton's issues, may stay); and a docstring that names a
function of the harness names one that exists."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
FOLDERS = ("oracle", "kernels", "tests", "peers")

# 7 to 40 hex digits with a digit and a letter among them: how a commit is cited
COMMIT = re.compile(r"(?<![\w.])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w])")
ISSUE = re.compile(r"(?i)\b(?:issues?|PR|pull request)\s*#?\d+|(?<![\w&])#\d{2,}\b")
# another project's bug reports, named as theirs
THEIRS = re.compile(r"(?i)\b(?:liger(?:-kernel)?|triton)(?:'s)?\s+(?:issues?\s+|PR\s+)?#?\d+(?:,\s*\d+)*")


def texts(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a module's source."""
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return found


def citations(text: str) -> list[str]:
    """The commit hashes and issue numbers ``text`` cites, other projects' bug reports left out."""
    text = THEIRS.sub("", text)
    return [m.group(0) for m in COMMIT.finditer(text)] + [m.group(0) for m in ISSUE.finditer(text)]


@pytest.mark.parametrize("text, cited", [
    ("# at 8afd716 the cast truncated", ["8afd716"]),
    ('"""A narrow case failed in the landing at ca702cf."""', ["ca702cf"]),
    ("# issue 35, point 3: every misuse is named", ["issue 35"]),
    ("# the fix of #123", ["#123"]),
    ("# its partial sums added in bf16 (Liger-Kernel #950's kind)", []),
    ("# upstream declined to change this (triton issues 4972, 11584, 11604)", []),
    ("# a casted bf16 value rounds to nearest even; 0xdeadbeef is a pointer; facade, 1e38, 2047", []),
])
def test_citations_are_told_from_reasons(text, cited):
    assert citations(text) == cited


def test_no_comment_or_docstring_cites_a_commit_or_an_issue():
    cited = [f"{path.relative_to(ROOT)}:{line}: {', '.join(found)}"
             for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
             for line, text in texts(path.read_text()) if (found := citations(text))]
    assert cited == [], "say the reason itself:\n" + "\n".join(cited)


def test_the_value_kinds_docstring_names_the_function_that_makes_them():
    from oracle.cases import value_kinds
    from oracle.declare import spec

    assert "oracle.declare.spec.fill" in value_kinds.__doc__ and callable(spec.fill)
