"""An ``--impl`` module that raises while it is imported is a usage error of every tool, said in one
line that names the module and the exception: pytest exits 4 and the report 2, with no
INTERNALERROR and no traceback. A module that imports cleanly gets past the same step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from oracle.declare import registry

ROOT = Path(__file__).parent.parent

CRASHING = 'raise RuntimeError("boom")\n'
WORKING = ("import torch.nn.functional as F\n"
           "from oracle.declare.implementations import implementation\n"
           "impl = implementation(swiglu=lambda e, g: F.silu(e) * g)\n")
SAYS = "importing 'crashing_mod' raised RuntimeError: boom"


def _child(tmp_path: Path, *args: str) -> tuple[int, str]:
    """Run ``python -m ARGS`` in tmp_path, where the implementations' modules are; (exit status, output)."""
    (tmp_path / "crashing_mod.py").write_text(CRASHING)
    (tmp_path / "working_mod.py").write_text(WORKING)
    env = {k: v for k, v in os.environ.items() if k not in (registry.ENVIRONMENT, "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    proc = subprocess.run([sys.executable, "-m", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def _pytest(tmp_path: Path, impl: str, *workers: str) -> tuple[int, str]:
    # -p: the plugin, as an installed harness registers it; --collect-only: loading is all that is judged
    return _child(tmp_path, "pytest", "-p", "no:cacheprovider", "-p", "oracle.pytest_plugin", "-q",
                  "--pyargs", "oracle.suite", "--impl", impl, "--ops", "swiglu", "--collect-only", *workers)


def _lines_naming(output: str, text: str) -> list[str]:
    return [line for line in output.splitlines() if text in line]


# under xdist the controller loads the implementation in a thread while its workers start
@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one process", "xdist"])
def test_pytest_says_in_one_line_which_module_raised_what(tmp_path, workers):
    status, out = _pytest(tmp_path, "crashing_mod:impl", *workers)
    assert status == pytest.ExitCode.USAGE_ERROR, out
    assert _lines_naming(out, SAYS) == [f"ERROR: --impl crashing_mod:impl: {SAYS}"], out
    assert "INTERNALERROR" not in out and "Traceback" not in out, out


def test_pytest_collects_with_a_module_that_imports(tmp_path):
    status, out = _pytest(tmp_path, "working_mod:impl")
    assert status == pytest.ExitCode.OK, out
    assert "swiglu" in out and "ERROR" not in out, out


def test_the_report_says_in_one_line_which_module_raised_what(tmp_path):
    status, out = _child(tmp_path, "oracle.report", "--impl", "crashing_mod:impl")
    assert status == 2, out
    assert out.strip().splitlines() == [f"error: {SAYS}"], out


def test_the_report_gets_past_loading_a_module_that_imports(tmp_path):
    """The next step's own usage error (no baseline to gate on) shows the module was loaded, with no sweep run."""
    status, out = _child(tmp_path, "oracle.report", "--impl", "working_mod:impl", "--ops", "swiglu", "--gate",
                         "--baseline", str(tmp_path / "absent.json"))
    assert status == 2, out
    assert out.strip().splitlines() == [f"error: no baseline at {tmp_path / 'absent.json'}; create one with "
                                        "--update-baseline"], out
