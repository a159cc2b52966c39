"""Fixtures shared by the report's tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
# The slice the small report sweeps (RMSNorm, fp32, Llama, with the aliasing checks).
SMALL_SLICE = ("--ops", "rms_norm", "--dtypes", "float32", "--variants", "llama", "--workers", "2")


@pytest.fixture(scope="session")
def small_report(tmp_path_factory) -> dict:
    """A real ``python -m oracle.report`` run on a slice of the grid, stored with --update-baseline;
    ``slice`` is its arguments, for a test that repeats the run."""
    out = tmp_path_factory.mktemp("report")
    paths = {"json": out / "drift.json", "html": out / "drift.html", "baseline": out / "baseline.json"}
    proc = subprocess.run([sys.executable, "-m", "oracle.report", *SMALL_SLICE, "--json", str(paths["json"]),
                           "--html", str(paths["html"]), "--update-baseline", "--baseline", str(paths["baseline"])],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {name: str(path) for name, path in paths.items()} | {"stdout": proc.stdout, "slice": list(SMALL_SLICE)}
