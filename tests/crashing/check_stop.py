"""Not collected by the suite (no test_ prefix): tests/test_crash.py runs it in a child pytest with
-x, to show that the first failure stops the other worker at its next case. The slow test notes
each case it starts in ORACLE_STOP_LOG, so the parent counts cases, not seconds: a count does not
depend on how loaded the machine is."""

import os
import time
from types import SimpleNamespace

from oracle.cases import Case
from oracle.engine import run_case
from oracle.declare.implementations import Implementation
from oracle.ops import rms_norm as norm_ops

CASE = Case("rms_norm", "llama", "float32", {"lead": [2], "cols": 15}, "contiguous", "normal",
            {"eps": 1e-6, "weight": "same"}, seed=1)
CASES = 120  # a minute of cases, were it not stopped


def _slow(X, W, eps, gemma=False):
    time.sleep(0.5)
    return norm_ops.rms_norm(X, W, eps, gemma)


SLOW = Implementation("slow but right", SimpleNamespace(rms_norm=_slow))


def _note(line: str) -> None:
    with open(os.environ["ORACLE_STOP_LOG"], "a") as log:
        log.write(f"{line} {time.time()}\n")


def test_fails_after_two_seconds():
    time.sleep(2)
    _note("failed")
    raise AssertionError("the first failure")


def test_many_slow_cases(device):
    for _ in range(CASES):
        _note("case")
        assert run_case("rms_norm", CASE, SLOW, device).passed
