"""Not collected by the suite (no test_ prefix): tests/test_crash.py runs it in a child pytest with a
short ORACLE_CASE_TIMEOUT, to show that a hang becomes a verdict and the run goes on."""

from oracle.cases import Case
from oracle.engine import run_case
from oracle.declare.implementations import load
from tests.crashing.warm_up import NARROW, warmed_up  # noqa: F401 (autouse: compiled before the limit applies)

WIDE = Case("rms_norm", "llama", "float32", {"lead": [2], "cols": 1500}, "contiguous", "normal",
            {"eps": 1e-6, "weight": "same"}, seed=1)


def test_hangs_in_python(device):
    result = run_case("rms_norm", WIDE, load("tests.broken_impls:hangs_on_wide_rows"), device)
    assert result.passed, result.explain()


def test_stuck_deaf_to_signals(device):
    run_case("rms_norm", WIDE, load("tests.broken_impls:stuck_on_wide_rows"), device)


def test_survives(device):
    assert run_case("rms_norm", NARROW, load("tests.broken_impls:stuck_on_wide_rows"), device).passed
