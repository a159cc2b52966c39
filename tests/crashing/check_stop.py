"""Not collected by the suite (no test_ prefix): tests/test_crash.py runs it in a child pytest with
-x, to show that the first failure stops the other worker at its next case."""

import time
from types import SimpleNamespace

from oracle.cases import Case
from oracle.engine import run_case
from oracle.impls import Implementation
from oracle.ops import rms_norm as norm_ops

CASE = Case("rms_norm", "llama", "float32", {"lead": [2], "cols": 15}, "contiguous", "normal",
            {"eps": 1e-6, "weight": "same"}, seed=1)


def _slow(X, W, eps, gemma=False):
    time.sleep(0.5)
    return norm_ops.rms_norm(X, W, eps, gemma)


SLOW = Implementation("slow but right", SimpleNamespace(rms_norm=_slow))


def test_fails_after_two_seconds():
    time.sleep(2)
    raise AssertionError("the first failure")


def test_many_slow_cases(device):
    for _ in range(120):  # a minute of cases, were it not stopped
        assert run_case("rms_norm", CASE, SLOW, device).passed
