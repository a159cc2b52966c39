"""The generic differential suite: every spec x every float dtype, hypothesis-drawn, for --impl.

One test per property, expanded over the registry (oracle/ops/, see Note [Specs]); nothing here
names an op. A failure prints the case, per-tensor metrics, aliasing findings, and the command that
reruns exactly that case. Ops the implementation lacks are skipped with the reason. The fixtures
(``impl``, ``device``, ``asked_ops``) come from the harness's pytest plugin (oracle/pytest_plugin.py).

Run it on any implementation with ``pytest --pyargs oracle.suite --impl package.module:attr``; this
repository's tests/test_ops.py imports the tests (``__all__``) so that its own run holds them too.
"""

from __future__ import annotations

import warnings

import pytest
from hypothesis import example, given, settings
from hypothesis.vendor import pretty

from oracle.checks import aliasing
from oracle.cases import FLOAT_DTYPES
from oracle.engine.devices import case_budget
from oracle.engine import CaseError, CaseFailed, check_float64, repro_command, run_case
from oracle.declare.registry import SPECS
from oracle.declare.spec import OpSpec

BUDGET = case_budget()


class DeclarationNote(UserWarning):
    """A case passed, but its declaration has a problem (HF's reference overflows where the truth is
    a number: compare.py, Note [A reference that overflows]), with the statement of the reference to
    change (oracle/checks/overflow.py); shown in pytest's warnings summary."""


# Hypothesis prints a failing example's arguments, the fixtures too: an implementation and a case by
# their names, not their reprs (an implementation's holds every op it declares lacking).
pretty.for_type_by_name("oracle.declare.implementations", "Implementation", lambda obj, p, cycle: p.text(f"Implementation({obj.name!r})"))
pretty.for_type_by_name("oracle.cases", "Case", lambda obj, p, cycle: p.text(f"Case({obj.summary()!r})"))


def judged(result) -> None:
    """The verdict as the tests assert it: its text only (the case, the metrics per tensor, the
    findings, the repro command), raised as CaseFailed, or CaseError for an exception or a crash."""
    if result.status in ("error", "crash"):
        raise CaseError(result)
    if not result.passed:
        raise CaseFailed(result)
    problems = result.declaration_problems
    if problems:  # one warning a case: the counts per tensor, then the statement to change
        warnings.warn(DeclarationNote("\n".join([f"{result.case.summary()}: {problems[0]}", *problems[1:],
                                                 f"rerun: {result.repro}"])), stacklevel=2)


def _require_op(impl, spec: OpSpec, asked_ops: list[str]):
    """Skip an op the run does not ask for: the plugin has made sure every op asked is there, so
    what is left are ops excluded by --ops or declared LACKING by the implementation."""
    if spec.name not in asked_ops:
        why = impl.declared_lacking().get(spec.name) or "not in --ops"
        pytest.skip(f"{spec.name} not asked of {impl.name}: {why}")


def _differential_test(spec: OpSpec, dtype: str):
    @given(case=spec.cases(BUDGET, (dtype,)))
    def test(case, impl, device, asked_ops):
        _require_op(impl, spec, asked_ops)
        judged(run_case(spec, case, impl, device))

    # Pinned regressions and the stratified cases (every variant, layout, gradient layout, kind of
    # values, short and long) run in every profile before hypothesis draws its own.
    for pinned in [c for c in spec.regressions if c.dtype == dtype] + spec.stratified(dtype, BUDGET):
        test = example(case=pinned)(test)
    test.__doc__ = f"{spec.name} in {dtype}: forward and every gradient judged against HF and the fp64 truth."
    test.oracle_op = spec.name  # the plugin skips ops not asked before hypothesis runs any example
    return test


def _aliasing_test(spec: OpSpec, check: str):
    @settings(max_examples=max(2, settings().max_examples // 3))
    @given(case=spec.cases(BUDGET))
    def test(case, impl, device, asked_ops):
        _require_op(impl, spec, asked_ops)
        findings = aliasing.run_check(check, spec, case, impl, device)
        if findings:
            raise AssertionError("\n".join([f"FAIL: {check} on {case.summary()}  [impl {impl.name}]"]
                                           + ["  " + f.describe() for f in findings]
                                           + [f"  rerun: {repro_command(case, impl.name, check)}"]))

    for pinned in aliasing_examples(spec):
        test = example(case=pinned)(test)
    test.__doc__ = f"{spec.name}: aliasing check {check!r} (see oracle/checks/aliasing.py)."
    test.oracle_op = spec.name
    return test


def aliasing_examples(spec: OpSpec) -> list:
    """One short stratified case per variant and dtype, so that every check runs on each."""
    out = []
    for dtype in FLOAT_DTYPES:
        short = [c for c in spec.stratified(dtype, BUDGET) if not spec.long(c)]
        out += [next(c for c in short if c.variant == variant) for variant in spec.variants]
    return out


for _spec in SPECS.values():
    for _dtype in FLOAT_DTYPES:
        globals()[f"test_matches_hf__{_spec.name}__{_dtype}"] = _differential_test(_spec, _dtype)
    for _check in aliasing.applicable(_spec):
        globals()[f"test_aliasing__{_spec.name}__{_check.replace('-', '_')}"] = _aliasing_test(_spec, _check)


def _float64_id(spec, case) -> str:
    """op-variant; a later float64 case of the same variant adds its values (rms_norm-llama-tiny)."""
    first = next(c for c in spec.float64_cases if c.variant == case.variant)
    return f"{case.op}-{case.variant}" + (f"-{case.values}" if first != case else "")


FLOAT64_CASES = [pytest.param(case, id=_float64_id(spec, case)) for spec in SPECS.values() for case in spec.float64_cases]


@pytest.mark.parametrize("case", FLOAT64_CASES)
def test_float64(case, impl, device, asked_ops):
    """In float64: the forward outputs against the float64 truth and torch.autograd.gradcheck of a
    hand-written backward against finite differences; for a kernel outside autograd (the raw SwiGLU
    ones), its outputs against HF's formula; to within float64 rounding (a float32 intermediate is
    1e-7 off; 1e-10 is allowed: oracle/engine/__init__.py, Note [The float64 forward]). Skipped only
    for an op the implementation declares in NO_FLOAT64."""
    spec = SPECS[case.op]
    _require_op(impl, spec, asked_ops)
    if not impl.takes_float64(spec.name):
        pytest.skip(f"{impl.name} declares no float64 path for {spec.name} (NO_FLOAT64)")
    check_float64(spec, case, impl, device)  # a failure carries the case, its repro and the NO_FLOAT64 hint


SCALE_CASES = [pytest.param(case, id=case.label, marks=pytest.mark.scale)
               for spec in SPECS.values() for case in spec.scale()]


@pytest.mark.parametrize("case", SCALE_CASES)
def test_at_scale(case, impl, device, asked_ops):
    """The scale grid: the sizes people train at, up to 2^31 elements, judged against HF and the
    truth on a slice of each case's programs (oracle/cases/scale.py). Opt in with --scale, on a GPU."""
    _require_op(impl, SPECS[case.op], asked_ops)
    if device.type != "cuda":
        pytest.skip("the scale grid needs a CUDA GPU: up to 2^31 elements per case")
    judged(run_case(case.op, case, impl, device))


# The tests, and only they: what tests/test_ops.py's star import takes.
__all__ = [name for name in list(globals()) if name.startswith("test_")]
