"""The verdict's measured power: every bug of the catalogue (tests/broken_impls.py) fails the same
differential test that `pytest -n auto` runs on an implementation, under the active hypothesis
profile (CI's in CI), in every dtype where it is a bug; and where it is not a bug (the
low-precision ones in float32) the same run passes, so the catch is not a false alarm."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings

from oracle.impls import load
from oracle.cases import FLOAT_DTYPES
from oracle.ops import MODULES, SPECS
from oracle.suite.test_contract import _differential_test
from tests.broken_impls import CATALOGUE, Bug


def _run_suite_test(bug: Bug, dtype: str, device, module: str = "tests.broken_impls") -> str | None:
    """The generic differential test of bug.op in ``dtype`` against the bug: its failure report, or None."""
    test = _differential_test(SPECS[bug.op], dtype)
    # Shrinking only shortens the report; the catch is what is measured here.
    test = settings(settings(), phases=[Phase.explicit, Phase.reuse, Phase.generate])(test)
    try:
        test(impl=load(f"{module}:{bug.name}"), device=device, asked_ops=[bug.op])
    except Exception as exc:  # noqa: BLE001 - an AssertionError, or a group of them from hypothesis
        return str(exc)
    return None


CAUGHT = [pytest.param(bug, dtype, id=f"{bug.name}-{dtype}") for bug in CATALOGUE for dtype in bug.dtypes]
HARMLESS = [pytest.param(bug, dtype, id=f"{bug.name}-{dtype}") for bug in CATALOGUE
            for dtype in FLOAT_DTYPES if dtype not in bug.dtypes + bug.borderline]


def test_the_catalogue_is_large_and_distinct():
    assert len(CATALOGUE) >= 15
    assert len({bug.name for bug in CATALOGUE}) == len(CATALOGUE)
    family = {spec.name: module.__name__ for module in MODULES for spec in module.SPECS}
    assert {family[bug.op] for bug in CATALOGUE} == set(family.values()), "every op module has bugs in the catalogue"


@pytest.mark.parametrize("bug, dtype", CAUGHT)
def test_each_bug_is_caught(bug, dtype, device):
    report = _run_suite_test(bug, dtype, device)
    assert report is not None, f"{bug.name} ({bug.models}) passed the {bug.op} suite in {dtype}"


@pytest.mark.parametrize("bug, dtype", HARMLESS)
def test_where_it_is_no_bug_it_passes(bug, dtype, device):
    report = _run_suite_test(bug, dtype, device)
    assert report is None, f"{bug.name} is declared harmless in {dtype}, yet:\n{report}"
