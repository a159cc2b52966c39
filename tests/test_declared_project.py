"""Ops declared from outside the harness (tests/declared_project/: LayerNorm, fused add + RMSNorm,
cross-entropy with ignored tokens over a large vocabulary, softmax, and a KernelBench-style Gemm +
GeLU), installed as a package beside the wheel in a fresh virtual environment: the harness finds
them through the project's entry point, through --op-module and through the ini option, judges
torch.compile of each reference (it must pass) and a planted bug in each (it must fail), and the
report sweeps them. Nothing of this repository is imported there but the wheel."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.test_packaging import _run, author, fresh_venv, needs_pypi, wheel  # noqa: F401  (fixtures)

PROJECT = Path(__file__).parent / "declared_project"
OPS = ("layer_norm", "fused_add_rms_norm", "cross_entropy", "softmax", "gemm_gelu")


@pytest.fixture(scope="module")
def project(author, tmp_path_factory):  # noqa: F811
    """The project copied out of the checkout and installed (with its entry point) into the venv."""
    home = tmp_path_factory.mktemp("declared") / "project"
    shutil.copytree(PROJECT, home)
    installed = _run([author.python, "-m", "pip", "install", "-q", "--no-deps", home], home, author.env, 600)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return home


def _suite(author, cwd, *args):  # noqa: F811
    return _run([author.pytest, "-p", "no:cacheprovider", "--pyargs", "oracle.suite", *args], cwd, author.env, 900)


@needs_pypi
@pytest.mark.parametrize("checks", [
    pytest.param("matches_hf and float32", id="float32"),
    pytest.param("", id="every-check-and-dtype", marks=pytest.mark.slow),
])
def test_compile_of_every_reference_passes_found_by_the_entry_point(author, project, tmp_path, checks):  # noqa: F811
    """From a directory with no configuration: the entry point alone brings the ops. The default run
    judges float32 (Inductor compiles a graph per shape and dtype: minutes on 2 cores for them all);
    ``-m slow`` runs every test of the suite (reports/logs/declared-ops-cpu.log)."""
    proc = _suite(author, tmp_path, "--impl", "impls:compiled", "--ops", ",".join(OPS), "-n", "2",
                  *(("-k", checks) if checks else ()))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    for op in OPS:
        assert f"\n{op} " in proc.stdout, f"{op} did not run"


@needs_pypi
def test_a_planted_bug_in_each_fails(author, project):  # noqa: F811
    """One implementation with a bug in each of the four ops: every op's suite fails, each with a repro."""
    proc = _suite(author, project, "--op-module", "declared_ops", "--impl", "impls:bugs", "--ops", ",".join(OPS[:4]),
                  "-k", "matches_hf and float32")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    for op in OPS[:4]:
        assert f"FAILED test_contract.py::test_matches_hf__{op}__float32" in proc.stdout, op
    assert "rerun: python -m oracle.repro --impl impls:bugs --op-module declared_ops" in proc.stdout


@needs_pypi
def test_the_ini_option_and_the_report(author, project, tmp_path):  # noqa: F811
    """oracle_op_modules in the project's pytest configuration; the report sweeps a declared op."""
    (tmp_path / "pytest.ini").write_text("[pytest]\noracle_op_modules =\n    declared_ops\n")
    proc = _suite(author, tmp_path, "--impl", "hf", "--ops", "softmax", "-k", "matches_hf and float32")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = _run([author.python, "-m", "oracle.report", "--impl", "hf", "--op-module", "declared_ops", "--ops",
                   "softmax", "--dtypes", "float32", "--no-checks", "--json", tmp_path / "run.json",
                   "--html", tmp_path / "run.html"], project, author.env, 600)
    assert report.returncode == 0, report.stdout + report.stderr
    cells = json.loads((tmp_path / "run.json").read_text())["cells"]
    assert cells and {c["op"] for c in cells} == {"softmax"} and all(c["status"] == "pass" for c in cells)
