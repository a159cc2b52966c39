"""The verdict's measured power: every bug of the catalogue (tests/broken_impls.py) fails the same
differential test that `pytest -n auto` runs on an implementation, under the active hypothesis
profile (CI's in CI), in every dtype where it is a bug; and where it is not a bug (the
low-precision ones in float32) the same run passes, so the catch is not a false alarm.

A catch counts only as a failing verdict on the tensor the bug breaks (``BREAKS``), or a failed
check naming it: an exception (an import error, a wrong signature, a crash) is not a catch, nor is
a failure of some other tensor."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
from hypothesis import Phase, settings

import oracle.suite.test_contract as suite
from oracle.cases import FLOAT_DTYPES
from oracle.declare.implementations import load
from oracle.declare.registry import SPECS
from oracle.ops import MODULES
from oracle.ops import rms_norm as norm_ops
from oracle.suite.test_contract import _differential_test
from tests.broken_impls import CATALOGUE, Bug

# The tensors each bug breaks (a dtype: where it differs there): one of them must fail its verdict.
BREAKS: dict[str, tuple[str, ...] | dict[str, tuple[str, ...]]] = {
    "rms_norm_no_upcast": ("Y",),
    "rms_norm_bf16_backward_sum": ("dX",),
    "rms_norm_eps_outside": ("Y",),
    "rms_norm_dx_missing_projection": ("dX",),
    "rms_norm_dw_drops_tail_row": ("dW",),
    "rms_norm_divides_by_block": ("Y",),
    "rms_norm_gemma_without_offset": ("Y",),
    "rms_norm_state_per_program": ("Y",),
    "rms_norm_rounds_fp32_weight": ("Y",),
    "rms_norm_scales_before_rounding": ("Y",),
    "rope_wrong_position_past_48": ("Q_out", "K_out"),
    "rope_first_row_positions": ("Q_out", "K_out"),
    "rope_interleaved_pairs": ("Q_out", "K_out"),
    "rope_skips_partial_head_group": ("Q_out",),
    "rope_low_precision_table": ("Q_out", "K_out"),
    "rope_rounds_once": ("Q_out", "K_out"),
    "swiglu_flushes_small": ("h",),
    "swiglu_sigmoid_low_precision_backward": ("de",),
    # in float32 only its autograd shows: de is NaN at e = -inf (tests/broken_impls.py)
    "swiglu_silu_low_precision_forward": {"float32": ("de",), "float16": ("h",), "bfloat16": ("h",)},
    "swiglu_keeps_silu_in_fp32": ("h",),
    "swiglu_de_sign_flipped": ("de",),
    "swiglu_fg_tail_block": ("h",),
    "swiglu_fg_naive_sigmoid": ("h",),
    "swiglu_raw_backward_low_precision_sigmoid": ("de",),
    "swiglu_backward_swapped": ("df", "de"),
    "geglu_wrong_approximation": ("h",),
    "geglu_no_upcast": ("h",),
}


def breaks(bug: Bug, dtype: str) -> tuple[str, ...]:
    named = BREAKS[bug.name]
    return named[dtype] if isinstance(named, dict) else named


def _failures_named(result, tensors: tuple[str, ...]) -> list[str]:
    """The failing verdicts and findings of a failed case that name one of ``tensors``."""
    if result.status != "fail":  # an error or a crash is no verdict
        return []
    return [v.name for v in result.verdicts if not v.passed and v.name in tensors] + \
        [f"{f.check}: {f.tensor}" for f in result.findings if f.tensor in tensors]


@contextlib.contextmanager
def _recording_results():
    """Every CaseResult the generic test judges, in order (the suite's run_case, recorded)."""
    seen, run_case = [], suite.run_case

    def recorded(*args, **kwargs):
        seen.append(run_case(*args, **kwargs))
        return seen[-1]

    suite.run_case = recorded
    try:
        yield seen
    finally:
        suite.run_case = run_case


def _run_suite_test(impl, op: str, dtype: str, device, first_failure: bool = False) -> tuple[BaseException | None, list]:
    """The generic differential test of ``op`` in ``dtype`` against ``impl``: what it raised (None if it
    passed) and every case result it judged. ``first_failure``: it stops at its first failing case
    (hypothesis's report_multiple_bugs off), where it would otherwise run every explicit example."""
    test = _differential_test(SPECS[op], dtype)
    # Shrinking only shortens the report; the catch is what is measured here.
    test = settings(settings(), phases=[Phase.explicit, Phase.reuse, Phase.generate],
                    report_multiple_bugs=not first_failure)(test)
    with _recording_results() as results:
        try:
            test(impl=impl, device=device, asked_ops=[op])
        except Exception as exc:  # noqa: BLE001 - a CaseFailed, or a group of failures from hypothesis
            return exc, results
    return None, results


def catches(impl, op: str, dtype: str, tensors: tuple[str, ...], device) -> tuple[list[str], str]:
    """What of ``tensors`` the test's failures name (empty: not caught), and its failure text.

    The run stops at its first failing case (nearly every bug fails its first or second case, and the
    rest cost most of the catalogue's time on a GPU, each a compile); where that failure names none of
    ``tensors``, the whole run is made, as pytest makes it, so that a later case may still name one."""
    raised, results = _run_suite_test(impl, op, dtype, device, first_failure=True)
    if raised is not None and not _named(results, tensors):
        raised, results = _run_suite_test(impl, op, dtype, device)
    if raised is None:
        return [], ""
    return _named(results, tensors), _text(raised)


def _named(results: list, tensors: tuple[str, ...]) -> list[str]:
    return sorted({name for result in results for name in _failures_named(result, tensors)})


def _text(exc: BaseException) -> str:
    """A failure's text; a group's (hypothesis's distinct failures), each of its members'."""
    if isinstance(exc, BaseExceptionGroup):
        return "\n".join(_text(member) for member in exc.exceptions)
    return str(exc)


def _bug(bug: Bug):
    return load(f"tests.broken_impls:{bug.name}")  # outside the test: an import error is an error here


CAUGHT = [pytest.param(bug, dtype, id=f"{bug.name}-{dtype}") for bug in CATALOGUE for dtype in bug.dtypes]
HARMLESS = [pytest.param(bug, dtype, id=f"{bug.name}-{dtype}") for bug in CATALOGUE
            for dtype in FLOAT_DTYPES if dtype not in bug.dtypes + bug.borderline]


def test_the_catalogue_is_large_and_distinct():
    assert len(CATALOGUE) >= 15
    assert len({bug.name for bug in CATALOGUE}) == len(CATALOGUE)
    family = {spec.name: module.__name__ for module in MODULES for spec in module.SPECS}
    assert {family[bug.op] for bug in CATALOGUE} == set(family.values()), "every op module has bugs in the catalogue"


def test_every_bug_says_what_it_breaks():
    assert set(BREAKS) == {bug.name for bug in CATALOGUE}
    for bug in CATALOGUE:
        for dtype in bug.dtypes:
            assert set(breaks(bug, dtype)) <= set(SPECS[bug.op].compared()), (bug.name, dtype)


@pytest.mark.parametrize("bug, dtype", CAUGHT)
def test_each_bug_is_caught(bug, dtype, device):
    named, report = catches(_bug(bug), bug.op, dtype, breaks(bug, dtype), device)
    assert named, (f"{bug.name} ({bug.models}) is not caught in {dtype}: no failing verdict names "
                   f"{' or '.join(breaks(bug, dtype))}" + (f"; the suite failed with:\n{report}" if report else ""))


@pytest.mark.parametrize("bug, dtype", HARMLESS)
def test_where_it_is_no_bug_it_passes(bug, dtype, device):
    raised, _ = _run_suite_test(_bug(bug), bug.op, dtype, device)
    assert raised is None, f"{bug.name} is declared harmless in {dtype}, yet:\n{_text(raised)}"


# --- what is not a catch ------------------------------------------------------------------------

# A "bug" whose rms_norm cannot even be called as the contract calls it.
wrong_signature = SimpleNamespace(rms_norm=lambda X, W: norm_ops.rms_norm(X, W, 1e-6))


def test_an_exception_is_no_catch(device):
    named, report = catches(load("tests.test_catalogue:wrong_signature"), "rms_norm", "float32", ("Y", "dX", "dW"),
                            device)
    assert not named and "ERROR" in report and "TypeError" in report, report


def test_a_failure_of_another_tensor_is_no_catch(device):
    """dX without its projection term fails dX, not Y: named against Y alone it is not caught."""
    bug = load("tests.broken_impls:rms_norm_dx_missing_projection")
    assert catches(bug, "rms_norm", "float32", ("dX",), device)[0] == ["dX"]
    named, report = catches(bug, "rms_norm", "float32", ("Y",), device)
    assert not named and "FAIL dX" in report, report


def test_an_import_error_is_no_catch():
    with pytest.raises(Exception, match="cannot import"):
        load("tests.no_such_module:rms_norm_bug")
