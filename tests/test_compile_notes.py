"""The compile check's notes (a graph break of an op that does not declare COMPILES:
oracle/checks/compile.py, Note [Notes]) are no warning per case: a pytest session lists each once in
its summary, counted over its cases and workers, and says nothing of them when there are none."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oracle.declare import registry

ROOT = Path(__file__).parent.parent

NOTING = textwrap.dedent('''
    import pytest

    from oracle.checks import compile as compile_check
    from oracle.engine import Finding


    @pytest.mark.parametrize("case", range(3))
    def test_a_case_notes_a_graph_break(case):
        compile_check.note(Finding("compile", "swiglu", "compile", "graph break: planted for the summary"))
''')
QUIET = "def test_a_case_notes_nothing():\n    pass\n"
SAYS = "[compile] swiglu during compile: graph break: planted for the summary"


def _session(tmp_path: Path, source: str, *workers: str) -> str:
    (tmp_path / "test_planted.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k not in (registry.ENVIRONMENT, "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "oracle.pytest_plugin",
                           "-q", "-rA", "--impl", "hf", "--ops", "swiglu", "test_planted.py", *workers],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one process", "xdist"])
def test_each_note_is_listed_once_in_the_summary_and_never_warned(tmp_path, workers):
    out = _session(tmp_path, NOTING, *workers)
    assert out.count("kernel-oracle: compile notes") == 1, out
    assert [line for line in out.splitlines() if SAYS in line] == [f"{SAYS} (noted 3 times)"], out
    assert "CompileNote" not in out and "warnings summary" not in out, out


def test_a_session_without_notes_says_nothing_of_them(tmp_path):
    out = _session(tmp_path, QUIET)
    assert "compile notes" not in out and "1 passed" in out, out
