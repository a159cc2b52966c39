"""Fixtures shared by the report's tests."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

ROOT = Path(__file__).parent.parent
# The slice the small report sweeps (RMSNorm, fp32, Llama, with the aliasing checks).
SMALL_SLICE = ("--ops", "rms_norm", "--dtypes", "float32", "--variants", "llama", "--workers", "2")
# A benchmark that is not there: the dashboard without its performance section (see report_main).
NO_BENCH = ROOT / "tests" / "no-such-bench.json"


def once_per_session(tmp_path_factory, name: str, make) -> dict:
    """``make(folder)``'s JSON-able result, made once for the whole session: under pytest-xdist a
    session fixture runs once per worker that uses it (each report run a fixture makes cost up to
    16 copies on the GPU machine), so the first worker makes it under a lock in the session's
    shared temporary folder and the others read what it stored."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder, stored = root / f"once-{name}", root / f"once-{name}.json"
    with FileLock(str(root / f"once-{name}.lock")):
        if not stored.exists():
            folder.mkdir(exist_ok=True)
            stored.write_text(json.dumps(make(folder)))
    return json.loads(stored.read_text())


def report_in_process(*args, bench: bool = True) -> subprocess.CompletedProcess:
    """``python -m oracle.report ARGS`` as its ``main`` in this process, for a session fixture (which
    cannot use report_main): its workers are processes as always, and the command's start-up (torch,
    the harness) is saved. ``bench=False``: no performance section (report_main says why)."""
    from oracle.report import __main__ as command

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # main points it into the run's folder: restored
        # the command's default is relative to the checkout, where its process would start
        patch.setattr(command, "DEFAULT_BENCH", ROOT / command.DEFAULT_BENCH if bench else NO_BENCH)
        try:
            code = command.main([str(arg) for arg in args])
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
    return subprocess.CompletedProcess(["python", "-m", "oracle.report", *map(str, args)], code, out.getvalue(),
                                       err.getvalue())


def report_runs(runs: dict[str, list], timeout: int = 900) -> dict[str, subprocess.CompletedProcess]:
    """Several ``python -m oracle.report`` runs at once (name -> arguments), each in its own process."""
    return module_runs("oracle.report", runs, timeout)


def module_runs(module: str, runs: dict[str, list], timeout: int = 900,
                env: dict | None = None) -> dict[str, subprocess.CompletedProcess]:
    """Several ``python -m MODULE`` runs at once (name -> arguments), each in its own process."""
    started = {name: subprocess.Popen([sys.executable, "-m", module, *map(str, args)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
               for name, args in runs.items()}
    done = {}
    for name, proc in started.items():
        out, err = proc.communicate(timeout=timeout)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


@pytest.fixture(scope="session")
def small_report(tmp_path_factory) -> dict:
    """A real report run (its main in-process) on a slice of the grid, stored with --update-baseline;
    ``slice`` is its arguments, for a test that repeats the run. Its dashboard is whole (the browser
    test loads it)."""
    def make(out: Path) -> dict:
        paths = {"json": out / "drift.json", "html": out / "drift.html", "baseline": out / "baseline.json"}
        proc = report_in_process(*SMALL_SLICE, "--json", paths["json"], "--html", paths["html"],
                                 "--update-baseline", "--baseline", paths["baseline"])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return {name: str(path) for name, path in paths.items()} | {"stdout": proc.stdout}

    return once_per_session(tmp_path_factory, "small-report", make) | {"slice": list(SMALL_SLICE)}


@pytest.fixture(scope="session")
def small_rerun(tmp_path_factory, small_report) -> dict:
    """The small report's slice swept again by the unchanged kernels, gated against a copy of the
    small report's baseline (``--gate``) and replacing that copy (``--update-baseline``): one run
    for the tests that need a second real sweep (the gate passes unchanged kernels; updating a
    baseline twice gives the same bytes; the current kernels pass the committed baseline)."""
    def make(out: Path) -> dict:
        paths = {"json": out / "run.json", "html": out / "run.html", "baseline": out / "baseline.json"}
        shutil.copy(small_report["baseline"], paths["baseline"])
        proc = report_in_process(*SMALL_SLICE, "--gate", "--update-baseline", "--baseline", paths["baseline"],
                                 "--json", paths["json"], "--html", paths["html"], bench=False)
        return {name: str(path) for name, path in paths.items()} | \
            {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}

    return once_per_session(tmp_path_factory, "small-rerun", make)


@pytest.fixture
def report_main(monkeypatch, capsys):
    """``python -m oracle.report``'s ``main`` in-process: ``run(*args)`` gives its exit status (argparse's
    usage errors too), stdout and stderr. ``main`` points Inductor's cache into the run's folder
    through the environment; the fixture restores the environment after the test."""
    from oracle.report import __main__ as command

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    # Run from the checkout, every dashboard would draw the committed H200 benchmark (about half of a
    # render, 1-2 s, and nothing of the run in it); no test of the command reads that section, which
    # tests/test_report.py checks on html.render and tests/test_browser.py in the small report's page.
    monkeypatch.setattr(command, "DEFAULT_BENCH", NO_BENCH)

    def run(*args) -> tuple[int, str, str]:
        capsys.readouterr()  # what the test printed before is not the command's
        try:
            code = command.main([str(arg) for arg in args])
        except SystemExit as exit_:
            code = exit_.code
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def refuse_the_sweep(monkeypatch) -> None:
    """Patch the report's sweep to fail, so that a command that should end before it cannot pass by
    sweeping."""
    from oracle.report import __main__ as command

    def sweep_started(*args, **kwargs):
        raise AssertionError("the sweep started")

    monkeypatch.setattr(command, "sweep_now", sweep_started)


@pytest.fixture
def report_main_before_sweep(monkeypatch, report_main):
    """``report_main`` with the sweep patched to fail: a usage error or an unusable baseline must end
    the command before its sweep starts."""
    refuse_the_sweep(monkeypatch)
    return report_main
