"""Fixtures shared by the report's tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="session")
def small_report(tmp_path_factory) -> dict:
    """A real ``python -m oracle.report`` run on a slice of the grid (RMSNorm, fp32, Llama)."""
    out = tmp_path_factory.mktemp("report")
    paths = {"json": out / "drift.json", "html": out / "drift.html", "baseline": out / "baseline.json"}
    proc = subprocess.run([sys.executable, "-m", "oracle.report", "--ops", "rms_norm", "--dtypes", "float32",
                           "--variants", "llama", "--workers", "2", "--json", str(paths["json"]),
                           "--html", str(paths["html"]), "--update-baseline", "--baseline", str(paths["baseline"])],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {name: str(path) for name, path in paths.items()} | {"stdout": proc.stdout}
