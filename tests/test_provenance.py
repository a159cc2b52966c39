"""Where a run came from, as the report, the dashboard, the baseline and the benchmark record it: a
repository by its name, the path of the relevant module inside it and its commit, never an absolute
path; the harness by its version too, the one thing an installed wheel has. Baselines recorded
before (an absolute ``root``, no ``harness``) are still read by the gate and shown by the dashboard."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from rich.console import Console

from oracle import environment
from oracle.report import gate, results, terminal

ROOT = Path(__file__).parent.parent
BASELINES = sorted(ROOT.glob("reports/baseline-*.json"))


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=CI", "-c", "user.email=ci@example.invalid", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def user_repository(tmp_path) -> Path:
    """A git repository with a module of declarations under src/, committed."""
    root = tmp_path / "my-kernels"
    (root / "src").mkdir(parents=True)
    (root / "src" / "my_declarations.py").write_text("X = 1\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "ops")
    return root


def test_a_repository_is_recorded_by_name_path_and_commit(user_repository):
    module = user_repository / "src" / "my_declarations.py"
    assert environment.repository(module) == {"name": "my-kernels", "path": "src/my_declarations.py",
                                              "commit": _git(user_repository, "rev-parse", "--short=12", "HEAD")}
    assert environment.repository(user_repository.parent) is None  # no repository there


def test_the_users_project_names_the_module_of_declarations_inside_it(user_repository, monkeypatch):
    module = types.ModuleType("my_declarations")
    module.__file__ = str(user_repository / "src" / "my_declarations.py")
    monkeypatch.setitem(sys.modules, "my_declarations", module)
    monkeypatch.chdir(user_repository)
    project = results.project(["my_declarations"])
    assert project == {"name": "my-kernels", "path": "src/my_declarations.py",
                       "commit": _git(user_repository, "rev-parse", "--short=12", "HEAD"),
                       "from": "the working directory"}
    assert str(user_repository.parent) not in json.dumps(project)
    monkeypatch.chdir(ROOT)  # the harness's own checkout is no user's project
    assert results.project([]) is None


def test_the_harness_is_recorded_by_its_checkout_and_version():
    found = environment.harness()
    assert (found["name"], found["path"]) == (ROOT.name, "oracle") and found["commit"] == environment.git_commit()
    assert "version" in found and str(ROOT) not in json.dumps(found)


def test_an_installed_harness_has_no_commit_and_is_named_by_its_version(monkeypatch):
    monkeypatch.setattr(environment, "git_repository", lambda folder: None)  # site-packages: no repository
    monkeypatch.setattr(environment, "_version", lambda package: "1.2.3" if package == "kernel-oracle" else None)
    assert environment.harness() == {"version": "1.2.3", "name": None, "path": None, "commit": None}


@pytest.mark.parametrize("path", BASELINES, ids=[p.name for p in BASELINES])
def test_the_gate_reads_the_committed_baselines_and_those_with_an_absolute_root(path, tmp_path):
    committed = json.loads(path.read_text())
    platform, model = committed["environment"]["platform"], committed["environment"].get("noise_model")
    assert "harness" not in committed["environment"]  # recorded before it
    assert gate.load_baseline(path, platform, model) == committed
    old = tmp_path / path.name
    old.write_text(json.dumps({**committed, "project": {"root": "/home/someone/my-kernels", "commit": "0" * 12,
                                                        "from": "the working directory"}}))
    baseline = gate.load_baseline(old, platform, model)
    assert gate.compare(committed, baseline)["regressions"] == []


def test_the_dashboard_shows_a_repository_by_name_whatever_the_document_recorded():
    from oracle.report import html

    document = json.loads((ROOT / "reports" / "baseline-cpu-interpreter.json").read_text())
    document = {**document, "cells": [cell for cell in document["cells"] if cell["op"] == "swiglu"]}  # fewer plots
    old = {**document, "project": {"root": "/home/someone/my-kernels", "commit": "abc", "from": "the working directory"}}
    page = html.render(old, None, None)
    assert "/home/someone" not in page and "my-kernels at abc" in page
    new = {**document, "project": {"name": "my-kernels", "path": "src/ops.py", "commit": "abc", "from": "x"},
           "environment": {**document["environment"], "harness": {"version": "1.2.3", "name": None, "path": None,
                                                                  "commit": None}}}
    page = html.render(new, None, None)
    assert "my-kernels: src/ops.py at abc" in page and "kernel-oracle 1.2.3" in page


# --- the terminal table ---------------------------------------------------------------------------


def _row(op: str) -> dict:
    return {"op": op, "variant": "default", "dtype": "bfloat16", "tensor": "Y", "passed": 3, "cells": 3,
            "worst_ratio": 1.0, "worst_element": 0.5, "worst_typical": 0.1, "min_bit_identical": 0.99,
            "max_ulp": 2.0, "findings": 0}


@pytest.mark.parametrize("width", [100, 140])
def test_the_terminal_table_never_cuts_an_op_name(width):
    ops = ["rms_norm_gated_residual_a", "rms_norm_gated_residual_b"]  # two names differing only at the end
    document = {"impl": "mine", "environment": {"platform": "cpu-interpreter"}, "sweep": "quick",
                "summary": [_row(op) for op in ops], "cells": [], "aliasing": [], "failures": []}
    out = io.StringIO()
    terminal.print_summary(document, None, Console(file=out, width=width))
    assert all(op in out.getvalue() for op in ops), out.getvalue()
