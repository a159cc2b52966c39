"""The harness's structure, held by tests: it never reaches into an implementation's internals,
and no module of it switches on an op's name (differences between ops are fields of their specs)."""

from __future__ import annotations

import re
from pathlib import Path

ORACLE = Path(__file__).parent.parent / "oracle"


def _sources():
    return sorted(ORACLE.rglob("*.py"))


def test_the_oracle_imports_no_private_module_of_the_kernels():
    private = re.compile(r"from kernels(\.\w+)* import _|import kernels\._|kernels\._\w+|from kernels\._")
    hits = [f"{p.relative_to(ORACLE.parent)}:{n}: {line.strip()}" for p in _sources()
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if private.search(line) and 'sys.modules.get("kernels._runtime")' not in line]
    assert not hits, "\n".join(hits)


def test_no_op_name_switches_in_the_oracle():
    switch = re.compile(r"\bop\s*[!=]=\s*[\"']|[\"']\s*[!=]=\s*(case\.|spec\.)?op\b|\.name\s*[!=]=\s*[\"']")
    hits = [f"{p.relative_to(ORACLE.parent)}:{n}: {line.strip()}" for p in _sources()
            for n, line in enumerate(p.read_text().splitlines(), 1) if switch.search(line)]
    assert not hits, "\n".join(hits)


def test_docstrings_cite_the_repositorys_own_design_note():
    root = ORACLE.parent
    assert (root / "docs" / "design.md").is_file()
    cited = re.compile(r"(?<!docs/)design\.md §")  # a section of a note outside the repository
    stray = [f"{p.relative_to(root)}:{n}" for folder in ("oracle", "kernels", "tests") for p in (root / folder).rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if cited.search(line)]
    assert not stray, stray
