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
NAMES_OPS_ON_PURPOSE = {"kernels/__init__.py", "peers/unsloth/adapter.py", "peers/liger/builtin.py",
                        "tests/broken_impls.py", "tests/test_runner.py"}


def _literals_naming_several_ops(path: Path, root: Path = ORACLE.parent) -> list[str]:
    import ast

    from oracle.declare.registry import SPECS

    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        items = node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else \
            node.keys if isinstance(node, ast.Dict) else ()
        named = {item.value for item in items if isinstance(item, ast.Constant) and item.value in SPECS}
        if len(named) >= 2:
            hits.append(f"{path.relative_to(root)}:{node.lineno}: {sorted(named)}")
    return hits


def test_nothing_but_the_declarations_lists_ops():
    """docs/design.md §6: tests, adapters and checks that need every op enumerate the registry, so a
    new op touches its kernel file, its declaration and the export line. A literal naming two or
    more ops elsewhere is such a list (and fails silently when an op is added)."""
    root = ORACLE.parent
    files = [p for folder in ("oracle", "tests", "kernels", "scripts", "peers") for p in (root / folder).rglob("*.py")
             if p.parent != root / "oracle" / "ops"]  # the declarations themselves
    hits = [hit for p in files if str(p.relative_to(root)) not in NAMES_OPS_ON_PURPOSE
            for hit in _literals_naming_several_ops(p)]
    assert not hits, "\n".join(hits)


def test_a_list_of_ops_is_seen(tmp_path):
    """The check above sees a planted list (written outside the checkout: other tests scan tests/)."""
    planted = tmp_path / "planted_op_list.py"
    planted.write_text('ASKED = ("rms_norm", "rope")\nONE = ["swiglu"]\n')
    assert _literals_naming_several_ops(planted, tmp_path) == ["planted_op_list.py:1: ['rms_norm', 'rope']"]


# docs/design.md §8, the layers, by directory. From the bottom: the interpreter (Triton on the CPU,
# computing as a GPU does), which imports nothing of the harness; the core (declaring, cases, noise,
# the verdict, the checks, the engine), which imports neither the built-in declarations nor a tool;
# the public API (oracle/__init__.py, over the core); the built-in ops, declared as a user declares
# theirs (and their benchmark's workloads); the tools on top (the pytest plugin and suite, report and
# gate, repro, sanitize, the benchmark).
LAYERS = {
    "interpreter": ("oracle.interpreter",),
    "core": ("oracle.errors", "oracle.declare", "oracle.cases", "oracle.noise", "oracle.verdict", "oracle.checks",
             "oracle.engine", "oracle.kernel_coverage"),
    "declarations": ("oracle.ops",),
    "tools": ("oracle.environment", "oracle.pytest_plugin", "oracle.suite", "oracle.report", "oracle.repro",
              "oracle.sanitize", "oracle.bench", "oracle.mutate"),
}
# What each layer may import besides its own: only what lies below it.
MAY_IMPORT = {
    "interpreter": set(),
    "core": {"interpreter"},
    "api": {"interpreter", "core"},
    "declarations": {"interpreter", "core", "api", "bench workloads"},
    "tools": {"interpreter", "core", "api", "declarations", "bench workloads"},
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ORACLE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, package: str, modules=()) -> set[str]:
    """Every module name a file imports (anywhere in it, functions included), resolved: ``from p
    import a, b`` is p's submodules a and b where both are ``modules``, else p itself too."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            subs = {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules}
            found |= subs if subs and len(subs) == len(node.names) else {target, *subs}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def _import_graph() -> dict[str, set[str]]:
    """Every oracle module -> the oracle modules it imports."""
    modules = {_module(p): p for p in _sources()}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        graph[name] = {m for m in _imports(path, package, modules) if m in modules and m != name}
    return graph


def _layer(module: str) -> str | None:
    if module == "oracle.bench.workload":
        return "bench workloads"
    if module == "oracle":
        return "api"
    best = max(((layer, root) for layer, roots in LAYERS.items() for root in roots
                if module == root or module.startswith(root + ".")), key=lambda lr: len(lr[1]), default=None)
    return best[0] if best else None


def test_every_module_sits_in_a_layer_and_imports_only_below_it():
    graph = _import_graph()
    unplaced = sorted(m for m in graph if _layer(m) is None)
    assert not unplaced, f"in no layer (tests/test_structure.py, docs/design.md §8): {unplaced}"
    wrong = sorted(f"{m} ({_layer(m)}) imports {d} ({_layer(d)})" for m, deps in graph.items() for d in deps
                   if _layer(d) != _layer(m) and _layer(d) not in MAY_IMPORT.get(_layer(m), set())
                   and _layer(m) != "bench workloads")
    assert not wrong, "\n".join(wrong)


def test_the_interpreter_imports_nothing_of_the_harness():
    graph = _import_graph()
    assert all(d.startswith("oracle.interpreter") for m, deps in graph.items() if _layer(m) == "interpreter"
               for d in deps)


def test_the_kernels_import_nothing_of_the_harness():
    root = ORACLE.parent
    hits = [f"{p.relative_to(root)}" for p in (root / "kernels").rglob("*.py")
            if any(m == "oracle" or m.startswith("oracle.") for m in _imports(p, "kernels"))]
    assert not hits, hits


def test_the_core_imports_no_kernels_and_no_vendor():
    """The core finds the kernels by name, as any --impl module (oracle/declare/implementations.py);
    vendors' adapters live in peers/."""
    vendors = ("kernels", "liger_kernel", "unsloth", "unsloth_zoo", "peers", "flash_attn")
    hits = [f"{_module(p)} imports {m}" for p in _sources() if _layer(_module(p)) in ("core", "interpreter")
            for m in _imports(p, _module(p)) if m.split(".")[0] in vendors]
    assert not hits, "\n".join(hits)


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


# Functions over MAX_FUNCTION_LINES that are tables of data, each with why: rows read one by one,
# which splitting would only scatter.
LONG_ON_PURPOSE = {
    "oracle/ops/elementwise.py:elementwise_errors": "the gated ops' error inputs: a table of ErrorInput rows",
    "oracle/ops/elementwise.py:elementwise_errors.errors": "the same table, built per case's device",
    "oracle/ops/rope.py:_rope_errors": "RoPE's error inputs: a table of ErrorInput rows and the builders they share",
}
MAX_FUNCTION_LINES = 80


def _long_functions(path: Path, root: Path = ORACLE.parent) -> dict[str, int]:
    """``path:qualified.name`` -> lines from ``def`` to the function's end, for every function of
    ``path`` longer than MAX_FUNCTION_LINES (nested functions and methods named by where they sit)."""
    import ast

    found = {}

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, prefix)
                continue
            name = prefix + child.name
            lines = child.end_lineno - child.lineno + 1
            if not isinstance(child, ast.ClassDef) and lines > MAX_FUNCTION_LINES:
                found[f"{path.relative_to(root)}:{name}"] = lines
            visit(child, name + ".")

    visit(ast.parse(path.read_text()), "")
    return found


def test_no_function_in_the_oracle_is_over_80_lines():
    """A function reads whole or not at all: past 80 lines, split it into functions whose names say
    what each part does. Only tables of data stay long (LONG_ON_PURPOSE), and an entry that is no
    longer long leaves the list."""
    long = {name: lines for p in _sources() for name, lines in _long_functions(p).items()}
    over = [f"{name}: {lines} lines" for name, lines in sorted(long.items()) if name not in LONG_ON_PURPOSE]
    assert not over, "\n".join(over)
    stale = sorted(set(LONG_ON_PURPOSE) - set(long))
    assert not stale, f"no longer over {MAX_FUNCTION_LINES} lines, take them off LONG_ON_PURPOSE: {stale}"


def _planted_function(name: str, lines: int, indent: str = "") -> str:
    """The source of a function of exactly ``lines`` lines, ``def`` included."""
    return f"{indent}def {name}():\n" + "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))


def test_a_long_function_is_seen(tmp_path):
    """The check above counts from ``def`` to the end, in nested functions and methods too, and
    passes a function of exactly 80 lines (written outside the checkout: other tests scan tests/)."""
    planted = tmp_path / "planted_long.py"
    planted.write_text(_planted_function("fits", 80) + _planted_function("too_long", 81)
                       + "class C:\n" + _planted_function("method", 81, "    ")
                       + "def outer():\n" + _planted_function("inner", 10, "    ") + "    return inner\n"
                       + "def outer_of_a_long_one():\n" + _planted_function("inner", 81, "    ") + "    return inner\n")
    assert _long_functions(planted, tmp_path) == {
        "planted_long.py:too_long": 81, "planted_long.py:C.method": 81,
        "planted_long.py:outer_of_a_long_one": 83, "planted_long.py:outer_of_a_long_one.inner": 81}
