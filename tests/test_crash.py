"""A crash in one case (a segfault under the interpreter) must not lose the rest of a pytest run:
xdist replaces the worker, and conftest.py names the case that was running and how to rerun it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.mark.skipif(sys.platform != "linux", reason="the crash is a SIGSEGV the test sends itself")
def test_a_crashing_case_is_named_and_the_rest_run():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-o", "python_files=check_*.py",
                           "tests/crashing/check_crash.py", "-q"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 1 passed" in out, out
    assert "crashed while running" in out and "crashed in case: rms_norm[llama] float32" in out, out
    assert "rerun: python -m oracle.repro --impl tests.broken_impls:crashes_on_wide_rows" in out, out
