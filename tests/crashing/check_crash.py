"""Not collected by the suite (no test_ prefix): tests/test_crash.py runs it in a child pytest to
show that a crash under xdist loses only its case, which the report then names with its repro."""

from oracle.cases import Case
from oracle.engine import run_case
from oracle.declare.implementations import load
from tests.crashing.warm_up import NARROW, warmed_up  # noqa: F401 (autouse: compiled before the limit applies)


# ``device`` is the pytest plugin's fixture: the GPU where kernels are compiled for one, else the CPU.
def test_crashes(device):
    case = Case("rms_norm", "llama", "float32", {"lead": [2], "cols": 1500}, "contiguous", "normal",
                {"eps": 1e-6, "weight": "same"}, seed=1)
    run_case("rms_norm", case, load("tests.broken_impls:crashes_on_wide_rows"), device)


def test_survives(device):
    assert run_case("rms_norm", NARROW, load("tests.broken_impls:crashes_on_wide_rows"), device).passed
