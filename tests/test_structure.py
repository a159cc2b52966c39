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


# docs/design.md §8, the package map: the engine and what it is made of, and the tools built on it.
# Imports go from tools to the engine, never back, and no module imports itself through others.
ENGINE = ("oracle.cases", "oracle.specs", "oracle.reference", "oracle.memory", "oracle.watchdog", "oracle.scale",
          "oracle.devices", "oracle.compare", "oracle.noise", "oracle.declare", "oracle.registry", "oracle.ops",
          "oracle.workload", "oracle.impls", "oracle.adapters", "oracle.engine", "oracle.aliasing",
          "oracle.compile_check", "oracle.interpreter", "oracle.interpreter_arith", "oracle.interpreter_launch",
          "oracle.interpreter_libdevice", "oracle.interpreter_refusal", "oracle.autotune")
TOOLS = ("oracle.report", "oracle.sanitize", "oracle.repro", "oracle.bench", "oracle.environment", "oracle.suite", "oracle.pytest_plugin")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ORACLE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Every oracle module -> the oracle modules it imports (anywhere in it, functions included)."""
    import ast

    modules = {_module(p): p for p in _sources()}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
                found = subs if subs and len(subs) == len(node.names) else [target, *subs]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            deps |= {m for m in found if m in modules and m != name}
        graph[name] = deps
    return graph


def _layer(module: str) -> str | None:
    for layer, roots in (("engine", ENGINE), ("tools", TOOLS)):
        if any(module == root or module.startswith(root + ".") for root in roots):
            return layer
    return None


def test_every_module_is_on_the_package_map_and_the_engine_imports_no_tool():
    graph = _import_graph()
    unplaced = sorted(m for m in graph if m != "oracle" and _layer(m) is None)
    assert not unplaced, f"not on the package map (tests/test_structure.py, docs/design.md §8): {unplaced}"
    upward = sorted(f"{m} imports {d}" for m, deps in graph.items() for d in deps
                    if _layer(m) == "engine" and _layer(d) == "tools")
    assert not upward, "\n".join(upward)


def test_no_module_imports_itself_through_others():
    graph = _import_graph()
    seen, cycles = set(), []

    def visit(node, path):
        if node in path:
            cycles.append(path[path.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        for dep in sorted(graph[node]):
            visit(dep, path + [node])

    for module in sorted(graph):
        visit(module, [])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)
