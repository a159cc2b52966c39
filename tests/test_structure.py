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


# Where naming several ops in one literal is the point: the kernels' export line, the Unsloth
# adapter's map from Unsloth's kernels to the contract's names (its LACKING enumerates the registry,
# tests/test_unsloth.py), the bug catalogue (bugs of named ops) and a test of choosing a subset.
NAMES_OPS_ON_PURPOSE = {"kernels/__init__.py", "oracle/adapters/unsloth.py", "tests/broken_impls.py",
                        "tests/test_runner.py"}


def _literals_naming_several_ops(path: Path) -> list[str]:
    import ast

    from oracle.ops import SPECS

    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        items = node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else \
            node.keys if isinstance(node, ast.Dict) else ()
        named = {item.value for item in items if isinstance(item, ast.Constant) and item.value in SPECS}
        if len(named) >= 2:
            hits.append(f"{path.relative_to(ORACLE.parent)}:{node.lineno}: {sorted(named)}")
    return hits


def test_nothing_but_the_declarations_lists_ops():
    """docs/design.md §6: tests, adapters and checks that need every op enumerate the registry, so a
    new op touches its kernel file, its declaration and the export line. A literal naming two or
    more ops elsewhere is such a list (and fails silently when an op is added)."""
    root = ORACLE.parent
    files = [p for folder in ("oracle", "tests", "kernels", "scripts") for p in (root / folder).rglob("*.py")
             if p.parent != root / "oracle" / "ops"]  # the declarations themselves
    hits = [hit for p in files if str(p.relative_to(root)) not in NAMES_OPS_ON_PURPOSE
            for hit in _literals_naming_several_ops(p)]
    assert not hits, "\n".join(hits)


def test_a_list_of_ops_is_seen():
    planted = ORACLE.parent / "tests" / "_planted_op_list.py"
    try:
        planted.write_text('ASKED = ("rms_norm", "rope")\nONE = ["swiglu"]\n')
        assert _literals_naming_several_ops(planted) == ["tests/_planted_op_list.py:1: ['rms_norm', 'rope']"]
    finally:
        planted.unlink()
