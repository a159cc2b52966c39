"""A crash in one case (a segfault under the interpreter) must not lose the rest of a pytest run:
xdist replaces the worker, and the pytest plugin (oracle/pytest_plugin.py) names the case that was running and how to rerun it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import once_per_session

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def crashing_run(tmp_path_factory) -> dict:
    """One child pytest under xdist over the crashing and the hanging cases (tests/crashing/), with
    a short case time limit: each kind of death ends the one worker, which xdist replaces, so one
    worker (-n 1) is replaced twice and still runs every other test. Its output and wall time."""
    def make(folder) -> dict:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "1", "-rA", "-p", "no:cacheprovider", "-o",
                               "python_files=check_*.py", "tests/crashing/check_crash.py",
                               "tests/crashing/check_hang.py", "-q"], capture_output=True, text=True, cwd=ROOT,
                              timeout=300, env={**os.environ, "ORACLE_CASE_TIMEOUT": "3"})
        return {"returncode": proc.returncode, "out": proc.stdout + proc.stderr, "seconds": time.monotonic() - start}

    return once_per_session(tmp_path_factory, "crashing-run", make)


def crash_notice(out: str, test: str) -> str:
    """What the plugin printed for the worker that died in ``test``: the line naming the test, the
    case and the repro command."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.endswith(f"crashed while running 'tests/crashing/{test}'"))
    return "\n".join(lines[at:at + 3])


@pytest.mark.skipif(sys.platform != "linux", reason="the crash is a SIGSEGV the test sends itself")
def test_a_crashing_case_is_named_and_the_rest_run(crashing_run):
    out = crashing_run["out"]
    assert crashing_run["returncode"] == 1, out
    assert "3 failed, 2 passed" in out, out  # with check_hang.py's two failures and one pass
    assert "FAILED tests/crashing/check_crash.py::test_crashes" in out, out
    assert "PASSED tests/crashing/check_crash.py::test_survives" in out, out
    notice = crash_notice(out, "check_crash.py::test_crashes")
    assert "\ncrashed in case: rms_norm[llama] float32" in notice, out
    assert "\nrerun: python -m oracle.repro --impl tests.broken_impls:crashes_on_wide_rows" in notice, out


@pytest.mark.skipif(sys.platform != "linux", reason="the time limit uses SIGALRM")
def test_hung_cases_become_verdicts_and_the_run_ends_in_bounded_time(crashing_run):
    """A Python-level hang fails its case with the time limit's message; one deaf to signals (as a
    wait on a spinning GPU kernel) ends its worker, which is named with its repro; the rest run."""
    out = crashing_run["out"]
    assert crashing_run["returncode"] == 1, out
    assert "3 failed, 2 passed" in out, out  # with check_crash.py's one failure and one pass
    for outcome, test in (("FAILED", "test_hangs_in_python"), ("FAILED", "test_stuck_deaf_to_signals"),
                          ("PASSED", "test_survives")):
        assert f"{outcome} tests/crashing/check_hang.py::{test}" in out, out
    assert "ran past the time limit of 3 s" in out, out
    notice = crash_notice(out, "check_hang.py::test_stuck_deaf_to_signals")
    assert "\ncrashed in case: rms_norm[llama] float32 lead=[2] cols=1500" in notice, out
    assert "\nrerun: python -m oracle.repro --impl tests.broken_impls:stuck_on_wide_rows" in notice, out
    assert crashing_run["seconds"] < 120


def test_the_first_failure_stops_the_other_workers_under_x(tmp_path):
    """-x: the worker still in a long test skips its next case, saying why, instead of running on.
    Judged by the cases it started (the child notes each), not by wall time: on a loaded machine
    pytest's start alone can take longer than the slow test would. Unstopped it starts all 120
    (a minute's worth); stopped, it starts those of the seconds before the failure reached it."""
    log = tmp_path / "stop.log"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-x", "-rs", "-p", "no:cacheprovider", "-o",
                           "python_files=check_*.py", "tests/crashing/check_stop.py", "-q"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "ORACLE_STOP_LOG": str(log)})
    out = proc.stdout + proc.stderr
    assert proc.returncode in (1, 2) and "1 failed, 1 skipped" in out, out  # 2: xdist reports -x as interrupted
    assert "stopped: a test failed and -x (--maxfail) ends the session" in out, out
    notes = [line.split() for line in log.read_text().splitlines()]
    failed_at = next(float(t) for what, t in notes if what == "failed")
    cases = [float(t) for what, t in notes if what == "case"]
    assert 0 < len(cases) < 60, f"{len(cases)} of 120 cases started"
    # after the failure, only cases started before the stop reached the worker: a few seconds' worth
    assert sum(t > failed_at for t in cases) <= 10, f"{sum(t > failed_at for t in cases)} cases after the failure"
